//! A fault-injecting proxy in front of the management API server: what a client sees from a
//! loaded or flaky control plane. A share of requests gets a transient fault instead of (or
//! before) its answer — 429 with `Retry-After`, 500, 503, a connection reset, or a slow answer
//! — the rest pass through unchanged (watches stream through). None of them is ever a 404:
//! telling "not found" apart from "could not ask" is the client's job, and what the tests of
//! this tier check.
//!
//! The proxy speaks plain HTTP on a loopback port and forwards as the environment's admin;
//! [`FaultProxy::kubeconfig`] points a process at it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::Client;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

type ProxyBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A transient fault, as an overloaded or restarting API server (or the network) produces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// 429 Too Many Requests with `Retry-After: 1` (API priority and fairness).
    TooManyRequests,
    /// 500 Internal Server Error.
    InternalError,
    /// 503 Service Unavailable.
    Unavailable,
    /// The connection is closed before any answer.
    Reset,
    /// The request is forwarded after 1–2 s.
    Slow,
}

impl Fault {
    pub const ALL: [Fault; 5] = [
        Fault::TooManyRequests,
        Fault::InternalError,
        Fault::Unavailable,
        Fault::Reset,
        Fault::Slow,
    ];
}

/// What the proxy did, for the test's own checks (a fault run that injected nothing proves
/// nothing).
#[derive(Debug, Default)]
pub struct FaultStats {
    requests: AtomicU64,
    injected: Mutex<BTreeMap<Fault, u64>>,
}

impl FaultStats {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn injected(&self) -> BTreeMap<Fault, u64> {
        self.injected.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    pub kubeconfig: PathBuf,
    pub stats: Arc<FaultStats>,
    task: JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A small deterministic generator (xorshift): reproducible runs from a seed, no dependency.
struct Dice(Mutex<u64>);

impl Dice {
    fn next(&self) -> u64 {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut x = *s;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *s = x;
        x
    }

    /// A fault for `share` (0.0–1.0) of the calls.
    fn pick(&self, share: f64) -> Option<Fault> {
        let roll = (self.next() % 10_000) as f64 / 10_000.0;
        (roll < share).then(|| Fault::ALL[(self.next() % Fault::ALL.len() as u64) as usize])
    }
}

impl FaultProxy {
    /// Starts a proxy to the API server `upstream` talks to, faulting `share` of the requests
    /// (seeded by `seed`); writes its kubeconfig into `dir`.
    pub async fn start(upstream: Client, share: f64, seed: u64, dir: &Path) -> Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the fault proxy")?;
        let port = listener.local_addr()?.port();
        let kubeconfig = dir.join(format!("fault-proxy-{port}.kubeconfig"));
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: faulty\n  cluster:\n    server: http://127.0.0.1:{port}\n\
                 users:\n- name: anonymous\n  user: {{}}\ncontexts:\n- name: faulty\n  context:\n    cluster: faulty\n    user: anonymous\n\
                 current-context: faulty\n"
            ),
        )?;
        let stats = Arc::new(FaultStats::default());
        let dice = Arc::new(Dice(Mutex::new(seed.max(1))));
        let st = stats.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (upstream, stats, dice) = (upstream.clone(), st.clone(), dice.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let (upstream, stats, dice) = (upstream.clone(), stats.clone(), dice.clone());
                        async move { handle(req, upstream, stats, dice, share).await }
                    });
                    // A connection the client or a Reset closes ends here.
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        Ok(FaultProxy {
            kubeconfig,
            stats,
            task,
        })
    }
}

#[derive(Debug)]
struct ResetConnection;

impl std::fmt::Display for ResetConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection reset by the fault proxy")
    }
}

impl std::error::Error for ResetConnection {}

async fn handle(
    req: Request<Incoming>,
    upstream: Client,
    stats: Arc<FaultStats>,
    dice: Arc<Dice>,
    share: f64,
) -> Result<Response<ProxyBody>, ResetConnection> {
    stats.requests.fetch_add(1, Ordering::Relaxed);
    let fault = dice.pick(share);
    if let Some(f) = fault {
        *stats
            .injected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(f)
            .or_default() += 1;
    }
    let status = |code: StatusCode, reason: &str| {
        let body = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("injected by the fault proxy: {reason}"), "reason": reason,
            "code": code.as_u16(),
        });
        let mut r = Response::new(full(Bytes::from(body.to_string())));
        *r.status_mut() = code;
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        r
    };
    match fault {
        Some(Fault::TooManyRequests) => {
            let mut r = status(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests");
            r.headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
            return Ok(r);
        }
        Some(Fault::InternalError) => return Ok(status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError")),
        Some(Fault::Unavailable) => return Ok(status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable")),
        Some(Fault::Reset) => return Err(ResetConnection),
        Some(Fault::Slow) => tokio::time::sleep(Duration::from_millis(1000 + dice.next() % 1000)).await,
        None => {}
    }
    Ok(forward(req, &upstream).await.unwrap_or_else(|e| {
        let mut r = Response::new(full(Bytes::from(format!("fault proxy: upstream failed: {e}"))));
        *r.status_mut() = StatusCode::BAD_GATEWAY;
        r
    }))
}

fn full(b: Bytes) -> ProxyBody {
    Full::new(b).map_err(|never: Infallible| match never {}).boxed_unsync()
}

/// Sends `req` upstream as the environment's admin and streams the answer back.
async fn forward(req: Request<Incoming>, upstream: &Client) -> Result<Response<ProxyBody>> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let mut out = http::Request::builder().method(parts.method).uri(parts.uri);
    for (k, v) in &parts.headers {
        if k != http::header::HOST && k != http::header::CONNECTION {
            out = out.header(k, v);
        }
    }
    let res = upstream.send(out.body(kube::client::Body::from(body))?).await?;
    let (parts, body) = res.into_parts();
    Ok(Response::from_parts(
        parts,
        body.map_err(|e| Box::new(e) as _).boxed_unsync(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dice_fault_about_the_share_asked_and_every_kind() {
        let dice = Dice(Mutex::new(42));
        let mut kinds = BTreeMap::new();
        let n = 20_000;
        for _ in 0..n {
            if let Some(f) = dice.pick(0.2) {
                *kinds.entry(f).or_insert(0u32) += 1;
            }
        }
        let total: u32 = kinds.values().sum();
        assert!((3_600..4_400).contains(&total), "{total} of {n}");
        assert_eq!(kinds.len(), Fault::ALL.len(), "{kinds:?}");
        assert!(Dice(Mutex::new(7)).pick(0.0).is_none());
    }
}
