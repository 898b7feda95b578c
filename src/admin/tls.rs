//! The TLS server of `/metrics`. Anyone who can reach the port can open connections, so it
//! closes a connection that does not finish its handshake within [`HANDSHAKE_TIMEOUT`] or
//! sends no complete request headers within [`IDLE_TIMEOUT`] (after the handshake and
//! between requests), and serves at most [`MAX_CONNECTIONS`] at once: at the limit a new
//! connection closes the one idle longest, so that idle connections never keep a scraper out.
//!
//! The certificate is `tls.crt`/`tls.key` from `--metrics-cert-dir`, or a self-signed one made
//! at start (as controller-runtime does when given none); versions, suites and groups are what
//! `--tls-min-version`, `--tls-cipher-suites` and `--tls-curve-preferences` allow
//! ([`super::tls_options`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use tokio::sync::Notify;
use tracing::{debug, warn};

use super::tls_options::TlsOptions;

/// Longest a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection may take to send a request's headers, after the handshake and between
/// requests (Prometheus scrapes every 15 to 60 s and reconnects when it must).
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections at once.
const MAX_CONNECTIONS: usize = 64;

/// The server's TLS configuration: the given certificate, or a self-signed one, with what the
/// TLS flags allow.
pub(crate) fn tls_config(cert_dir: Option<&Path>, options: &TlsOptions) -> anyhow::Result<rustls::ServerConfig> {
    use anyhow::Context as _;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let (certs, key) = match cert_dir {
        Some(dir) => {
            let certs = CertificateDer::pem_file_iter(dir.join("tls.crt"))
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .with_context(|| format!("reading {}", dir.join("tls.crt").display()))?;
            let key = PrivateKeyDer::from_pem_file(dir.join("tls.key"))
                .with_context(|| format!("reading {}", dir.join("tls.key").display()))?;
            (certs, key)
        }
        None => {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default();
            let names: Vec<String> = ["localhost".to_string(), host]
                .into_iter()
                .filter(|h| !h.is_empty())
                .collect();
            let cert = rcgen::generate_simple_self_signed(names).context("making a self-signed certificate")?;
            let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der())
                .map_err(|e| anyhow::anyhow!("self-signed key: {e}"))?;
            (vec![cert.cert.der().clone()], key)
        }
    };
    let (provider, versions) = options.provider();
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .context("TLS versions and cipher suites")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the metrics certificate and key do not match")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The connections being served; at [`MAX_CONNECTIONS`], a new one closes the one idle longest.
#[derive(Clone, Default)]
struct Connections(Arc<Mutex<ConnectionTable>>);

#[derive(Default)]
struct ConnectionTable {
    open: HashMap<u64, Open>,
    next_id: u64,
}

struct Open {
    /// Since when it has waited for a handshake or a request; `None` while serving one.
    idle_since: Option<Instant>,
    close: Arc<Notify>,
}

/// One connection's place in [`Connections`], given up when dropped.
struct Slot {
    id: u64,
    close: Arc<Notify>,
    connections: Connections,
}

impl Connections {
    fn table(&self) -> std::sync::MutexGuard<'_, ConnectionTable> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a new connection: at the limit, the connection idle longest is told to
    /// close (a connection serving a request is never); `None` when every one is busy.
    fn admit(&self) -> Option<Slot> {
        let mut table = self.table();
        if table.open.len() >= MAX_CONNECTIONS {
            let (longest, _) = table
                .open
                .iter()
                .filter_map(|(id, o)| Some((*id, o.idle_since?)))
                .min_by_key(|(_, since)| *since)?;
            if let Some(evicted) = table.open.remove(&longest) {
                evicted.close.notify_one();
            }
        }
        let id = table.next_id;
        table.next_id += 1;
        let close = Arc::new(Notify::new());
        table.open.insert(
            id,
            Open {
                idle_since: Some(Instant::now()),
                close: close.clone(),
            },
        );
        Some(Slot {
            id,
            close,
            connections: self.clone(),
        })
    }

    fn set_idle(&self, id: u64, idle: bool) {
        if let Some(o) = self.table().open.get_mut(&id) {
            o.idle_since = idle.then(Instant::now);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.table().open.remove(&self.id);
    }
}

/// Serves `app` over TLS on `listener` until the process ends.
pub(crate) async fn serve_tls(listener: tokio::net::TcpListener, app: Router, tls: rustls::ServerConfig) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let connections = Connections::default();
    loop {
        let (stream, peer): (_, SocketAddr) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = connections.admit() else {
            debug!(%peer, "metrics: every connection is serving a request; closing the new one");
            continue;
        };
        tokio::spawn(serve_connection(stream, peer, slot, acceptor.clone(), app.clone()));
    }
}

/// One connection: the handshake, then requests until the client closes, a request's headers
/// do not come within [`IDLE_TIMEOUT`], or the slot is wanted for a new connection.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    slot: Slot,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
) {
    let slot = Arc::new(slot);
    let close = slot.close.clone();
    let serve = async {
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                debug!(%peer, error = %e, "metrics: TLS handshake failed");
                return;
            }
            Err(_) => return,
        };
        let in_use = slot.clone();
        let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let (app, slot) = (app.clone(), in_use.clone());
            async move {
                slot.connections.set_idle(slot.id, false);
                let res = tower::ServiceExt::oneshot(app, req.map(axum::body::Body::new)).await;
                slot.connections.set_idle(slot.id, true);
                res
            }
        });
        if let Err(e) = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(IDLE_TIMEOUT)
            .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
            .await
        {
            debug!(%peer, error = %e, "metrics: connection ended");
        }
    };
    tokio::select! {
        _ = serve => {}
        _ = close.notified() => debug!(%peer, "metrics: idle connection closed for a new one"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn at_the_limit_a_new_connection_closes_the_one_idle_longest_never_a_busy_one() {
        let connections = Connections::default();
        let mut slots: Vec<Slot> = (0..MAX_CONNECTIONS)
            .map(|_| connections.admit().expect("room"))
            .collect();
        // The oldest is serving a request: the second oldest is the one idle longest.
        connections.set_idle(slots[0].id, false);
        let newcomer = connections.admit().expect("room made");
        let closed = |s: &Slot| s.close.notified().now_or_never().is_some();
        assert!(!closed(&slots[0]), "busy: kept");
        assert!(closed(&slots[1]), "idle longest: told to close");
        assert!(slots[2..].iter().all(|s| !closed(s)), "the others: kept");
        assert_eq!(connections.table().open.len(), MAX_CONNECTIONS);
        slots.push(newcomer);

        // Every one busy: the new connection is refused.
        for s in &slots {
            connections.set_idle(s.id, false);
        }
        assert!(connections.admit().is_none(), "no idle connection to close");
        // One that ends frees its place.
        slots.pop();
        assert!(connections.admit().is_some());
    }
}
