//! The API client of the manager: a User-Agent naming the replica, a client-side token bucket
//! (`--kube-api-qps`, `--kube-api-burst`, as client-go's), and request metrics by verb and code.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Method, Request, Response};
use tower::{Layer, Service};

use crate::metrics::{Metrics, RequestLabels};

/// A token bucket shared by every request of one client. Requests reserve a token in arrival
/// order and wait until it is theirs, so a burst of work is spread out at `qps` once the
/// `burst` tokens are spent.
#[derive(Clone)]
pub struct TokenBucket {
    inner: Arc<Mutex<Bucket>>,
    qps: f64,
    burst: f64,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// `qps <= 0` means no limit.
    pub fn new(qps: f32, burst: u32) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            inner: Arc::new(Mutex::new(Bucket {
                tokens: burst,
                at: Instant::now(),
            })),
            qps: f64::from(qps),
            burst,
        }
    }

    /// How long the caller must wait for its token (the token is taken now).
    pub(crate) fn reserve(&self, now: Instant) -> Duration {
        if self.qps <= 0.0 {
            return Duration::ZERO;
        }
        let mut b = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.qps).min(self.burst);
        b.at = now;
        b.tokens -= 1.0;
        if b.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-b.tokens / self.qps)
        }
    }
}

impl<S> Layer<S> for TokenBucket {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: self.clone(),
            wait: None,
            has_token: false,
        }
    }
}

pub struct RateLimited<S> {
    inner: S,
    bucket: TokenBucket,
    /// The wait for the token of the next request, once reserved.
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The next request's token is ours.
    has_token: bool,
}

type BoxFut<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

// kube's client drives its service from one buffer worker, in request order: waiting in
// `poll_ready` spaces requests out in the order they were made.
impl<S, B> Service<Request<B>> for RateLimited<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.has_token {
            if self.wait.is_none() {
                let d = self.bucket.reserve(Instant::now());
                if d.is_zero() {
                    self.has_token = true;
                } else {
                    self.wait = Some(Box::pin(tokio::time::sleep(d)));
                }
            }
            if let Some(w) = self.wait.as_mut() {
                if w.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.wait = None;
                self.has_token = true;
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.has_token = false;
        self.inner.call(req)
    }
}

/// Counts requests by verb and response code into [`Metrics::api_requests`].
#[derive(Clone)]
pub(crate) struct RequestMetrics(pub Arc<Metrics>);

impl<S> Layer<S> for RequestMetrics {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            metrics: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Counted<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

/// The Kubernetes verb of a request, from its method and query (`get` also covers `list`).
pub(crate) fn verb<B>(req: &Request<B>) -> &'static str {
    let watch = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    match *req.method() {
        Method::GET if watch => "watch",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

impl<S, B, RB> Service<Request<B>> for Counted<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFut<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let verb = verb(&req);
        let metrics = self.metrics.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            let code = match &res {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "error".to_string(),
            };
            metrics.api_requests.get_or_create(&RequestLabels { verb, code }).inc();
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_spends_burst_then_spaces_at_qps() {
        let b = TokenBucket::new(5.0, 3);
        let t0 = Instant::now();
        let waits: Vec<_> = (0..6).map(|_| b.reserve(t0)).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        for (i, w) in waits[3..].iter().enumerate() {
            let want = 0.2 * (i + 1) as f64;
            assert!((w.as_secs_f64() - want).abs() < 1e-6, "{i}: {w:?}");
        }
        // After a quiet second, tokens are back (capped at burst).
        let later = t0 + Duration::from_secs(10);
        assert_eq!(b.reserve(later), Duration::ZERO);
    }

    #[test]
    fn zero_qps_is_unlimited() {
        let b = TokenBucket::new(0.0, 1);
        let t0 = Instant::now();
        assert!((0..100).all(|_| b.reserve(t0).is_zero()));
    }

    #[test]
    fn verbs() {
        let r = |m: Method, uri: &str| Request::builder().method(m).uri(uri).body(()).unwrap();
        assert_eq!(verb(&r(Method::GET, "/api/v1/pods?watch=true&x=1")), "watch");
        assert_eq!(verb(&r(Method::GET, "/api/v1/pods")), "get");
        assert_eq!(verb(&r(Method::PATCH, "/api/v1/pods/a")), "patch");
        assert_eq!(verb(&r(Method::POST, "/api/v1/pods")), "create");
    }
}
