//! The API client of the manager: a User-Agent naming the replica, a client-side token bucket
//! (`--kube-api-qps`, `--kube-api-burst`, as client-go's) with a lane for urgent requests,
//! request metrics by verb and code, and (for the Kairon APIs of identities) bounds on what a
//! server sends back ([`BodyLimits`]).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use http::{Method, Request, Response};
use tokio::sync::oneshot;
use tower::{Layer, Service};

use crate::metrics::{Metrics, RequestLabels};

/// A delete of exactly the object with this UID: the API server refuses it rather than delete
/// another object made since under the same name.
pub(crate) fn delete_exactly(uid: Option<String>) -> kube::api::DeleteParams {
    kube::api::DeleteParams {
        preconditions: uid.map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    }
}

mod bounded;
pub(crate) use bounded::BodyLimits;

tokio::task_local! {
    /// Set while a future runs through [`urgent`]: its requests take the bucket's next tokens.
    static URGENT: ();
}

/// Runs `fut` with its requests in the urgent lane of every [`TokenBucket`]: they take the next
/// free token before any request of the normal lane waiting longer. For the reconciles one
/// write away from what a user waits for (a VM that is running, a deletion), so that they do
/// not queue behind a burst of first-time creates.
pub(crate) async fn urgent<F: Future>(fut: F) -> F::Output {
    URGENT.scope((), fut).await
}

pub(crate) fn is_urgent() -> bool {
    URGENT.try_with(|_| ()).is_ok()
}

/// A token bucket shared by every request of one client. Once the `burst` tokens are spent,
/// requests wait in two lanes, each in arrival order, and a token refilled at `qps` goes to the
/// urgent lane's first request if there is one, else the normal lane's.
#[derive(Clone)]
pub struct TokenBucket {
    inner: Arc<Mutex<Bucket>>,
    qps: f64,
    burst: f64,
}

struct Bucket {
    tokens: f64,
    at: Instant,
    /// Waiting requests: `[urgent, normal]`.
    lanes: [VecDeque<oneshot::Sender<()>>; 2],
    /// A task hands out tokens to the waiting requests while there are any.
    dispatching: bool,
}

impl Bucket {
    fn refill(&mut self, now: Instant, qps: f64, burst: f64) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * qps).min(burst);
        self.at = now;
    }

    fn waiting(&self) -> bool {
        self.lanes.iter().any(|l| !l.is_empty())
    }
}

impl TokenBucket {
    /// `qps <= 0` means no limit.
    pub fn new(qps: f32, burst: u32) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            inner: Arc::new(Mutex::new(Bucket {
                tokens: burst,
                at: Instant::now(),
                lanes: [VecDeque::new(), VecDeque::new()],
                dispatching: false,
            })),
            qps: f64::from(qps),
            burst,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resolves when the caller may send its request (the token is then spent).
    pub(crate) async fn acquire(&self, urgent: bool) {
        if self.qps <= 0.0 {
            return;
        }
        let turn = {
            let mut b = self.lock();
            b.refill(Instant::now(), self.qps, self.burst);
            if !b.waiting() && b.tokens >= 1.0 {
                b.tokens -= 1.0;
                return;
            }
            let (tx, rx) = oneshot::channel();
            b.lanes[usize::from(!urgent)].push_back(tx);
            if !b.dispatching {
                b.dispatching = true;
                tokio::spawn(self.clone().dispatch());
            }
            rx
        };
        // Only an error if the dispatcher is gone, i.e. the runtime shuts down.
        let _ = turn.await;
    }

    /// Hands each refilled token to the first waiting request, urgent lane first, until none
    /// waits.
    async fn dispatch(self) {
        loop {
            let wait = {
                let mut b = self.lock();
                b.refill(Instant::now(), self.qps, self.burst);
                while b.tokens >= 1.0 {
                    let next = match b.lanes[0].pop_front() {
                        Some(tx) => tx,
                        None => match b.lanes[1].pop_front() {
                            Some(tx) => tx,
                            None => {
                                b.dispatching = false;
                                return;
                            }
                        },
                    };
                    // A request given up on (its caller dropped it) spends nothing.
                    if next.send(()).is_ok() {
                        b.tokens -= 1.0;
                    }
                }
                if !b.waiting() {
                    b.dispatching = false;
                    return;
                }
                Duration::from_secs_f64((1.0 - b.tokens) / self.qps)
            };
            tokio::time::sleep(wait).await;
        }
    }
}

impl<S> Layer<S> for TokenBucket {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: self.clone(),
        }
    }
}

pub struct RateLimited<S> {
    inner: S,
    bucket: TokenBucket,
}

type BoxFut<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

// kube's client hands each request to its service from one buffer worker, and the caller
// awaits the returned future in its own task: the token is waited for there, so that the
// caller's lane (a task-local, see `urgent`) is known, and a waiting request holds up no other.
// The inner future is made at once but does nothing (no connection, no I/O) until polled.
impl<S, B> Service<Request<B>> for RateLimited<S>
where
    S: Service<Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFut<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let bucket = self.bucket.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            bucket.acquire(is_urgent()).await;
            fut.await
        })
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

    /// Seconds since `t0` at which each of `n` requests got its token.
    async fn grants(bucket: &TokenBucket, lanes: &[bool]) -> Vec<(usize, f64)> {
        let t0 = tokio::time::Instant::now();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for (i, urgent_lane) in lanes.iter().copied().enumerate() {
            let (bucket, tx) = (bucket.clone(), tx.clone());
            let request = async move {
                bucket.acquire(is_urgent()).await;
                let _ = tx.send((i, t0.elapsed().as_secs_f64()));
            };
            if urgent_lane {
                tokio::spawn(urgent(request));
            } else {
                tokio::spawn(request);
            }
            // In arrival order.
            tokio::task::yield_now().await;
        }
        drop(tx);
        let mut got = vec![];
        while let Some(g) = rx.recv().await {
            got.push(g);
        }
        got
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_spends_burst_then_spaces_at_qps() {
        let b = TokenBucket::new(5.0, 3);
        let got = grants(&b, &[false; 6]).await;
        let order: Vec<usize> = got.iter().map(|g| g.0).collect();
        assert_eq!(order, [0, 1, 2, 3, 4, 5], "first come, first served");
        for (i, (_, at)) in got.iter().enumerate() {
            let want = 0.2 * i.saturating_sub(2) as f64;
            assert!((at - want).abs() < 0.01, "{i}: {at}, want {want}");
        }
        // After a quiet while, the burst is back (and no more than it).
        tokio::time::sleep(Duration::from_secs(10)).await;
        let got = grants(&b, &[false; 4]).await;
        let at: Vec<f64> = got.iter().map(|g| g.1).collect();
        assert!(at[..3].iter().all(|t| *t < 0.01), "{at:?}");
        assert!((at[3] - 0.2).abs() < 0.01, "{at:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn urgent_requests_overtake_waiting_normal_ones() {
        let b = TokenBucket::new(10.0, 1);
        // One token at once, then nine normal requests queue; then two urgent ones arrive.
        let mut lanes = vec![false; 10];
        lanes.extend([true, true]);
        let got = grants(&b, &lanes).await;
        let order: Vec<usize> = got.iter().map(|g| g.0).collect();
        assert_eq!(order, [0, 10, 11, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        // The rate is the same for both lanes: 10/s after the first.
        let last = got.last().unwrap().1;
        assert!((last - 1.1).abs() < 0.01, "{last}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_given_up_on_spends_no_token() {
        let b = TokenBucket::new(1.0, 1);
        b.acquire(false).await;
        // Waits for the next token, and is dropped before it comes.
        let gave_up = tokio::time::timeout(Duration::from_millis(100), b.acquire(false)).await;
        assert!(gave_up.is_err());
        let t0 = tokio::time::Instant::now();
        b.acquire(false).await;
        assert!(t0.elapsed() <= Duration::from_millis(950), "{:?}", t0.elapsed());
    }

    #[tokio::test]
    async fn zero_qps_is_unlimited() {
        let b = TokenBucket::new(0.0, 1);
        for _ in 0..100 {
            assert!(futures::FutureExt::now_or_never(b.acquire(false)).is_some());
        }
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
