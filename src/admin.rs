//! The admin endpoints: `/healthz` and `/readyz` on `--health-addr`, `/metrics` (Prometheus
//! text) on `--metrics-bind-address` (CAPI's `--diagnostics-address`): over HTTPS for
//! authorized callers ([`secure`]), with the TLS flags' versions and suites ([`tls_options`]),
//! or plain HTTP to anyone with `--insecure-diagnostics`. `/metrics` is the manager's only TLS
//! listener: health is plain HTTP, as in CAPI's managers, and there is no webhook server.
//!
//! `/readyz` of the leader (or of a manager without leader election) means: every cache has
//! done its first list, and the API server answers. A standby that is not leader runs no
//! controllers and so has no caches; it is ready when the API server answers, as client-go and
//! controller-runtime standbys are, so that a rolling update is not blocked by standbys.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tracing::{info, warn};

mod secure;
mod tls;
pub mod tls_options;

use crate::controller::CacheReadiness;
use crate::metrics::Metrics;

#[derive(Clone)]
pub(crate) struct Health {
    /// Used only for the reachability check (no rate limit).
    pub client: kube::Client,
    pub caches: CacheReadiness,
    /// True while this replica runs the controllers.
    pub leading: Arc<AtomicBool>,
    pub reachability: Reachability,
}

/// How long an answer of the API server counts for `/readyz`: probes (and anything else that
/// polls `/readyz`) cost at most one request per this period.
const REACHABILITY_TTL: Duration = Duration::from_secs(2);

/// The last reachability check and when it was made; probes arriving together wait for one
/// check rather than each sending a request.
#[derive(Clone, Default)]
pub(crate) struct Reachability(Arc<tokio::sync::Mutex<Option<(Instant, bool)>>>);

impl Health {
    async fn api_reachable(&self) -> bool {
        let mut last = self.reachability.0.lock().await;
        if let Some((at, ok)) = *last
            && at.elapsed() < REACHABILITY_TTL
        {
            return ok;
        }
        let ok = matches!(
            tokio::time::timeout(Duration::from_secs(2), self.client.apiserver_version()).await,
            Ok(Ok(_))
        );
        *last = Some((Instant::now(), ok));
        ok
    }

    /// What `/readyz` answers, with the failing check named.
    pub(crate) async fn ready(&self) -> Result<(), &'static str> {
        if self.leading.load(Ordering::SeqCst) && !self.caches.synced() {
            return Err("caches not synced");
        }
        if !self.api_reachable().await {
            return Err("API server not reachable");
        }
        Ok(())
    }
}

/// `:9440` means all interfaces, as in Go.
pub(crate) fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    full.parse().map_err(|e| format!("invalid address {s:?}: {e}"))
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    match h.ready().await {
        Ok(()) => (StatusCode::OK, "ok".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}")),
    }
}

async fn metrics(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        m.encode(),
    )
}

async fn serve(listener: tokio::net::TcpListener, app: Router, what: &'static str) {
    if let Err(e) = axum::serve(listener, app).await {
        warn!(error = %e, "{what} server stopped");
    }
}

/// Binds and serves the health endpoints in the background.
pub(crate) async fn spawn_health(addr: SocketAddr, health: Health) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    info!(addr = %listener.local_addr()?, "serving /healthz and /readyz");
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(health);
    tokio::spawn(serve(listener, app, "health"));
    Ok(())
}

/// How `/metrics` is served.
pub(crate) enum MetricsAccess {
    /// HTTPS; only callers whose token may `get /metrics` (the default).
    Secure {
        gate: secure::Gate,
        tls: Box<rustls::ServerConfig>,
    },
    /// Plain HTTP, anyone (`--insecure-diagnostics`).
    Insecure,
}

pub(crate) use secure::{Gate, REVIEW_BURST, REVIEW_QPS};
pub(crate) use tls::tls_config;

/// Binds and serves `/metrics` in the background.
pub(crate) async fn spawn_metrics(addr: SocketAddr, m: Arc<Metrics>, access: MetricsAccess) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = Router::new().route("/metrics", get(metrics)).with_state(m);
    match access {
        MetricsAccess::Insecure => {
            info!(addr = %listener.local_addr()?, "serving /metrics over plain HTTP to anyone");
            tokio::spawn(serve(listener, app, "metrics"));
        }
        MetricsAccess::Secure { gate, tls } => {
            info!(addr = %listener.local_addr()?, "serving /metrics over HTTPS to authorized callers");
            tokio::spawn(tls::serve_tls(listener, secure::guarded(app, gate), *tls));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_addresses() {
        assert_eq!(parse_addr(":9440").unwrap(), "0.0.0.0:9440".parse().unwrap());
        assert_eq!(parse_addr("127.0.0.1:8443").unwrap(), "127.0.0.1:8443".parse().unwrap());
        assert!(parse_addr("nope").is_err());
    }
}
