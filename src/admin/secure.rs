//! `/metrics` over HTTPS with authentication and authorization, as controller-runtime's secure
//! metrics server (and so every CAPI manager) serves it by default: the caller's bearer token
//! is checked with a TokenReview, then the user is asked for with a SubjectAccessReview of
//! `get` on the non-resource URL `/metrics`. 401 without a valid token, 403 without the grant.
//! Answers are kept for a minute per token, so a scrape costs the API server nothing most of
//! the time.
//!
//! The certificate is `tls.crt`/`tls.key` from `--metrics-cert-dir`, or a self-signed one made
//! at start (as controller-runtime does when given none).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};
use tokio::sync::Mutex;
use tracing::{debug, warn};

/// How long a review's answer is reused for the same token.
const REVIEW_TTL: Duration = Duration::from_secs(60);
/// Tokens remembered at most (older answers are dropped first when full).
const MAX_REMEMBERED: usize = 256;

/// Who may read `/metrics`: asks the API server, remembers its answers briefly.
#[derive(Clone)]
pub(crate) struct Gate {
    client: kube::Client,
    answers: Arc<Mutex<HashMap<u64, (Instant, StatusCode)>>>,
}

impl Gate {
    pub(crate) fn new(client: kube::Client) -> Gate {
        Gate {
            client,
            answers: Arc::default(),
        }
    }

    /// 200 when the token's user may `get /metrics`, 401 for no or an invalid token, 403
    /// otherwise; 500 (not remembered) when the API server could not be asked.
    async fn decide(&self, token: Option<&str>) -> StatusCode {
        let Some(token) = token.filter(|t| !t.is_empty()) else {
            return StatusCode::UNAUTHORIZED;
        };
        let key = crate::hashing::hash_of(&token);
        if let Some((at, code)) = self.answers.lock().await.get(&key).copied()
            && at.elapsed() < REVIEW_TTL
        {
            return code;
        }
        let code = match self.review(token).await {
            Ok(code) => code,
            Err(e) => {
                warn!(error = %e, "could not review a /metrics caller");
                return StatusCode::INTERNAL_SERVER_ERROR;
            }
        };
        let mut answers = self.answers.lock().await;
        if answers.len() >= MAX_REMEMBERED {
            answers.retain(|_, (at, _)| at.elapsed() < REVIEW_TTL);
            if answers.len() >= MAX_REMEMBERED {
                answers.clear();
            }
        }
        answers.insert(key, (Instant::now(), code));
        code
    }

    async fn review(&self, token: &str) -> Result<StatusCode, kube::Error> {
        let tr = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let tr = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &tr)
            .await?;
        let status = tr.status.unwrap_or_default();
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
            return Ok(StatusCode::UNAUTHORIZED);
        };
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let sar = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &sar)
            .await?;
        let allowed = sar.status.is_some_and(|s| s.allowed);
        debug!(user = ?user.username, allowed, "reviewed a /metrics caller");
        Ok(if allowed { StatusCode::OK } else { StatusCode::FORBIDDEN })
    }
}

/// The middleware in front of `/metrics`.
async fn authorize(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match gate.decide(token).await {
        StatusCode::OK => next.run(req).await,
        code => (code, code.canonical_reason().unwrap_or_default().to_string()).into_response(),
    }
}

/// `app` behind the gate.
pub(crate) fn guarded(app: Router, gate: Gate) -> Router {
    app.layer(middleware::from_fn_with_state(gate, authorize))
}

/// The server's TLS configuration: the given certificate, or a self-signed one.
pub(crate) fn tls_config(cert_dir: Option<&Path>) -> anyhow::Result<rustls::ServerConfig> {
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
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the metrics certificate and key do not match")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves `app` over TLS on `listener` until the process ends.
pub(crate) async fn serve_tls(listener: tokio::net::TcpListener, app: Router, tls: rustls::ServerConfig) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    loop {
        let (stream, peer): (_, SocketAddr) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    debug!(%peer, error = %e, "metrics: TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let svc = hyper_util::service::TowerToHyperService::new(app);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                .await
            {
                debug!(%peer, error = %e, "metrics: connection ended");
            }
        });
    }
}
