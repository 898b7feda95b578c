//! A hostile Kairon API: what a tenant can point its cluster's identity at. An HTTPS server
//! with a CA of its own (so the identity's kubeconfig verifies it, as the manager requires)
//! that speaks just enough of the Kubernetes API for a manager's Kairon endpoint — lists,
//! watches, reads and writes of Kairon Machines — and misbehaves in one of a few ways
//! ([`Hostility`]), switchable while it runs.
//!
//! Three of the ways are capped so that a client without bounds cannot take the test machine
//! down with it: the 50 MiB error bodies are sent for the first [`FLOOD_BODIES`] requests (then
//! the errors are short), an endless watch line stops growing after [`ENDLESS_CAP`] bytes
//! (the connection stays open, the line unfinished), and endless watch events stop after
//! [`ENDLESS_EVENTS_CAP`]. Endless list pages are not capped: each page is asked for.
//!
//! One way is not endless but as much as the manager holds for one identity: a watch sends
//! the same [`ManyEvents`] Kairon Machines each time (just under an endpoint's budget), so that
//! many identities together, each within its own budget, are what a tenant can cost.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::certs::Ca;

type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Size of each flooding error body.
pub const FLOOD_BODY: usize = 50 * 1024 * 1024;
/// How many requests get a flooding error body.
pub const FLOOD_BODIES: u64 = 24;
/// Where an endless watch line stops growing.
pub const ENDLESS_CAP: usize = 128 * 1024 * 1024;
/// Where an endless stream of watch events stops.
pub const ENDLESS_EVENTS_CAP: u64 = 2_000_000;

/// How the server misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Hostility {
    /// Lists (empty) and reads (not found) are answered; a write (create, patch, delete) is
    /// never answered.
    HangWrites = 0,
    /// Connections and TLS are accepted; no request is ever answered.
    NeverAnswers = 1,
    /// Every request is answered 500 with 50 MiB of text (newlines and terminal escapes in it).
    ErrorFlood = 2,
    /// Lists are answered; a watch streams one line that never ends; a create is refused
    /// (403), reads find nothing.
    EndlessWatchLine = 3,
    /// A well-behaved empty Kairon API: lists are empty, watches quiet, reads find nothing, a
    /// create is refused (403), a delete finds nothing.
    Empty = 4,
    /// Lists answer page after page of new Kairon Machines (as many as asked for, labelled as
    /// the manager's), each with a `continue` token: a list that never ends. Otherwise as
    /// [`Hostility::Empty`].
    EndlessPages = 5,
    /// Lists are empty; a watch sends ADDED events of new Kairon Machines without end (up to
    /// [`ENDLESS_EVENTS_CAP`], then nothing more, the connection open). Otherwise as
    /// [`Hostility::Empty`].
    EndlessEvents = 6,
    /// Lists are empty; a watch sends ADDED events of the same Kairon Machines each time, as
    /// many and as big as the server's [`ManyEvents`] says, then is quiet until its timeout.
    /// Otherwise as [`Hostility::Empty`].
    ManyEvents = 7,
    /// A list of MachineDisruptionBudgets is answered 200, then one byte of its body every
    /// [`TRICKLE_EVERY`], without end. Otherwise as [`Hostility::Empty`].
    TrickleBudgetLists = 8,
    /// Every request about MachineDisruptionBudgets is refused (403), as an identity whose RBAC
    /// lacks them would be. Otherwise as [`Hostility::Empty`].
    ForbidBudgets = 9,
}

/// What a watch of [`Hostility::ManyEvents`] sends: Kairon Machines `hostile-0` to
/// `hostile-<machines - 1>`, each with a status message of `message_bytes` bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManyEvents {
    pub machines: u64,
    pub message_bytes: usize,
}

/// How often a trickled answer sends its next byte.
pub const TRICKLE_EVERY: Duration = Duration::from_secs(50);

impl Hostility {
    fn from_u8(v: u8) -> Hostility {
        match v {
            0 => Hostility::HangWrites,
            1 => Hostility::NeverAnswers,
            2 => Hostility::ErrorFlood,
            3 => Hostility::EndlessWatchLine,
            5 => Hostility::EndlessPages,
            6 => Hostility::EndlessEvents,
            7 => Hostility::ManyEvents,
            8 => Hostility::TrickleBudgetLists,
            9 => Hostility::ForbidBudgets,
            _ => Hostility::Empty,
        }
    }
}

/// What the server saw and did.
#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    lists: AtomicU64,
    watches: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    flood_bodies: AtomicU64,
    /// Kairon Machines sent in list pages and watch events.
    objects: AtomicU64,
}

/// A snapshot of [`HostileServer::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostileStats {
    pub connections: u64,
    pub lists: u64,
    pub watches: u64,
    pub reads: u64,
    pub writes: u64,
    /// Error answers sent with a [`FLOOD_BODY`]-sized body.
    pub flood_bodies: u64,
    /// Kairon Machines sent in list pages and watch events.
    pub objects: u64,
}

/// A running hostile Kairon API on a loopback port; stopped on drop.
pub struct HostileServer {
    pub port: u16,
    ca_pem: String,
    mode: Arc<AtomicU8>,
    counters: Arc<Counters>,
    task: JoinHandle<()>,
}

/// What the server answers with, besides its mode.
#[derive(Clone, Copy, Debug, Default)]
struct Shape {
    many: ManyEvents,
}

impl Drop for HostileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HostileServer {
    pub async fn start(mode: Hostility) -> Result<HostileServer> {
        Self::start_shaped(mode, Shape::default()).await
    }

    /// A server in mode [`Hostility::ManyEvents`], whose watches send `many`.
    pub async fn start_many_events(many: ManyEvents) -> Result<HostileServer> {
        Self::start_shaped(Hostility::ManyEvents, Shape { many }).await
    }

    async fn start_shaped(mode: Hostility, shape: Shape) -> Result<HostileServer> {
        let ca = Ca::new("hostile-kairon-ca")?;
        let serving = ca.serving_cert("hostile-kairon", &[])?;
        let tls = tls_config(&serving.cert_pem, &serving.key_pem)?;
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.context("binding")?;
        let port = listener.local_addr()?.port();
        let mode = Arc::new(AtomicU8::new(mode as u8));
        let counters = Arc::new(Counters::default());
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let (m, c) = (mode.clone(), counters.clone());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                c.connections.fetch_add(1, Ordering::Relaxed);
                let (acceptor, m, c) = (acceptor.clone(), m.clone(), c.clone());
                conns.spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else { return };
                    let svc = service_fn(move |req| answer(req, m.clone(), c.clone(), shape));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(tls), svc).await;
                });
                // Finished connections are forgotten as they go.
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(HostileServer {
            port,
            ca_pem: ca.pair.cert_pem.clone(),
            mode,
            counters,
            task,
        })
    }

    /// Changes how the server behaves, also for requests it is holding unanswered.
    pub fn set(&self, mode: Hostility) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    pub fn stats(&self) -> HostileStats {
        let c = &self.counters;
        HostileStats {
            connections: c.connections.load(Ordering::Relaxed),
            lists: c.lists.load(Ordering::Relaxed),
            watches: c.watches.load(Ordering::Relaxed),
            reads: c.reads.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            flood_bodies: c.flood_bodies.load(Ordering::Relaxed),
            objects: c.objects.load(Ordering::Relaxed),
        }
    }

    /// A kubeconfig for this server (JSON, which is YAML): its CA embedded, a bearer token.
    pub fn kubeconfig(&self) -> String {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "hostile", "cluster": {
                "server": format!("https://127.0.0.1:{}", self.port),
                "certificate-authority-data": ca}}],
            "users": [{"name": "tenant", "user": {"token": "tenant-token"}}],
            "contexts": [{"name": "hostile", "context": {"cluster": "hostile", "user": "tenant"}}],
            "current-context": "hostile",
        })
        .to_string()
    }
}

fn tls_config(cert_pem: &str, key_pem: &str) -> Result<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("serving certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).context("serving key")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// What a request asks, as far as the server cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Asked {
    List,
    Watch { timeout: Duration },
    Read,
    Write,
}

fn asked<B>(req: &Request<B>) -> Asked {
    let query = req.uri().query().unwrap_or_default();
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_string)
    };
    if req.method() != Method::GET {
        return Asked::Write;
    }
    if param("watch").is_some_and(|w| w == "true" || w == "1") {
        let secs = param("timeoutSeconds").and_then(|t| t.parse().ok()).unwrap_or(60);
        return Asked::Watch {
            timeout: Duration::from_secs(secs),
        };
    }
    if req.uri().path().ends_with("/machines") {
        Asked::List
    } else {
        Asked::Read
    }
}

async fn answer(
    req: Request<Incoming>,
    mode: Arc<AtomicU8>,
    counters: Arc<Counters>,
    shape: Shape,
) -> Result<Response<Body>, Infallible> {
    let asked = asked(&req);
    let budgets = req.uri().path().contains("/machinedisruptionbudgets");
    match Hostility::from_u8(mode.load(Ordering::SeqCst)) {
        Hostility::TrickleBudgetLists if budgets && asked == Asked::Read => {
            counters.lists.fetch_add(1, Ordering::Relaxed);
            return Ok(json_answer(StatusCode::OK, trickle()));
        }
        Hostility::ForbidBudgets if budgets => {
            counters.reads.fetch_add(1, Ordering::Relaxed);
            return Ok(status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                "machinedisruptionbudgets.kairon.zyvor.dev is forbidden",
            ));
        }
        _ => {}
    }
    let page = Page::of(&req);
    let counter = match asked {
        Asked::List => &counters.lists,
        Asked::Watch { .. } => &counters.watches,
        Asked::Read => &counters.reads,
        Asked::Write => &counters.writes,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    loop {
        let now = Hostility::from_u8(mode.load(Ordering::SeqCst));
        let hold = match now {
            Hostility::NeverAnswers => true,
            Hostility::HangWrites => asked == Asked::Write,
            _ => false,
        };
        if !hold {
            return Ok(respond(now, asked, &page, &counters, shape));
        }
        // Held until the client gives up (then hyper drops this future) or the mode changes.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a list or watch asks for: the namespace of the path and the page size.
struct Page {
    namespace: String,
    limit: u64,
}

impl Page {
    fn of<B>(req: &Request<B>) -> Page {
        let path = req.uri().path();
        let namespace = path
            .split('/')
            .skip_while(|p| *p != "namespaces")
            .nth(1)
            .unwrap_or("default")
            .to_string();
        let limit = req
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .find_map(|p| p.strip_prefix("limit="))
            .and_then(|l| l.parse().ok())
            .filter(|l| *l > 0)
            .unwrap_or(500)
            .min(500);
        Page { namespace, limit }
    }
}

/// A Kairon Machine as the manager's watch selects them, named by `n`.
fn machine(namespace: &str, n: u64) -> serde_json::Value {
    padded_machine(namespace, n, 0)
}

/// [`machine`] with a status message of `message_bytes` bytes (none when 0).
fn padded_machine(namespace: &str, n: u64, message_bytes: usize) -> serde_json::Value {
    let mut status = serde_json::json!({"phase": "Running"});
    if message_bytes > 0 {
        status["message"] = "m".repeat(message_bytes).into();
    }
    serde_json::json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "Machine",
        "metadata": {"name": format!("hostile-{n}"), "namespace": namespace, "uid": format!("uid-{n}"),
                     "resourceVersion": n.to_string(),
                     "labels": {"app.kubernetes.io/managed-by": "cluster-api-provider-kairon"}},
        "spec": {},
        "status": status
    })
}

/// A page of `page.limit` new Kairon Machines, with a `continue` token: there is always more.
fn endless_page(page: &Page, counters: &Counters) -> Response<Body> {
    let first = counters.objects.fetch_add(page.limit, Ordering::Relaxed);
    let items: Vec<serde_json::Value> = (first..first + page.limit)
        .map(|n| machine(&page.namespace, n))
        .collect();
    let text = serde_json::json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineList",
        "metadata": {"resourceVersion": "1", "continue": format!("more-{}", first + page.limit)},
        "items": items,
    })
    .to_string();
    json_answer(StatusCode::OK, full(Bytes::from(text)))
}

/// ADDED events of new Kairon Machines without end (up to [`ENDLESS_EVENTS_CAP`], then nothing
/// more, the connection open).
fn endless_events(namespace: String, counters: Arc<Counters>) -> Body {
    const BATCH: u64 = 100;
    let events = futures::stream::iter(0..ENDLESS_EVENTS_CAP / BATCH).map(move |_| {
        let first = counters.objects.fetch_add(BATCH, Ordering::Relaxed);
        let mut text = String::new();
        for n in first..first + BATCH {
            text.push_str(&serde_json::json!({"type": "ADDED", "object": machine(&namespace, n)}).to_string());
            text.push('\n');
        }
        Bytes::from(text)
    });
    stream_body(events.chain(futures::stream::pending::<Bytes>()))
}

/// ADDED events of the Kairon Machines of `many` (the same ones at every watch), then a quiet
/// watch until `timeout`, as an API server ends it.
fn many_events(namespace: String, many: ManyEvents, counters: Arc<Counters>, timeout: Duration) -> Body {
    const BATCH: u64 = 100;
    let events = futures::stream::iter((0..many.machines).step_by(BATCH as usize)).map(move |first| {
        let last = (first + BATCH).min(many.machines);
        counters.objects.fetch_add(last - first, Ordering::Relaxed);
        let mut text = String::new();
        for n in first..last {
            let object = padded_machine(&namespace, n, many.message_bytes);
            text.push_str(&serde_json::json!({"type": "ADDED", "object": object}).to_string());
            text.push('\n');
        }
        Bytes::from(text)
    });
    let quiet = futures::stream::once(tokio::time::sleep(timeout)).filter_map(|()| async { None::<Bytes> });
    stream_body(events.chain(quiet))
}

fn respond(mode: Hostility, asked: Asked, page: &Page, counters: &Arc<Counters>, shape: Shape) -> Response<Body> {
    match (mode, asked) {
        (Hostility::ErrorFlood, _) => {
            let huge = counters.flood_bodies.fetch_add(1, Ordering::Relaxed) < FLOOD_BODIES;
            if !huge {
                counters.flood_bodies.fetch_sub(1, Ordering::Relaxed);
            }
            let body = if huge {
                flood_body()
            } else {
                full(Bytes::from_static("<html>\n\u{1b}[31m500 hostile\n</html>".as_bytes()))
            };
            Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .header("content-type", "text/html")
                .body(body)
                .unwrap()
        }
        (Hostility::EndlessPages, Asked::List) => endless_page(page, counters),
        (Hostility::EndlessEvents, Asked::Watch { .. }) => {
            json_answer(StatusCode::OK, endless_events(page.namespace.clone(), counters.clone()))
        }
        (Hostility::ManyEvents, Asked::Watch { timeout }) => json_answer(
            StatusCode::OK,
            many_events(page.namespace.clone(), shape.many, counters.clone(), timeout),
        ),
        (_, Asked::List) => json(
            StatusCode::OK,
            r#"{"apiVersion":"kairon.zyvor.dev/v1alpha1","kind":"MachineList","metadata":{"resourceVersion":"1"},"items":[]}"#,
        ),
        (Hostility::EndlessWatchLine, Asked::Watch { .. }) => json_answer(StatusCode::OK, endless_line()),
        (_, Asked::Watch { timeout }) => json_answer(StatusCode::OK, quiet_for(timeout)),
        (_, Asked::Read) => status(StatusCode::NOT_FOUND, "NotFound", "machines.kairon.zyvor.dev not found"),
        (_, Asked::Write) => status(StatusCode::FORBIDDEN, "Forbidden", "this Kairon API creates nothing"),
    }
}

fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed_unsync()
}

/// An answer with a JSON `body` (whole or streamed).
fn json_answer(code: StatusCode, body: Body) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

fn json(code: StatusCode, text: &'static str) -> Response<Body> {
    json_answer(code, full(Bytes::from_static(text.as_bytes())))
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let text = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()})
    .to_string();
    json_answer(code, full(Bytes::from(text)))
}

fn stream_body(chunks: impl futures::Stream<Item = Bytes> + Send + 'static) -> Body {
    StreamBody::new(chunks.map(|b| Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Frame::data(b)))).boxed_unsync()
}

/// [`FLOOD_BODY`] bytes of text that is not JSON, with newlines and terminal escapes.
fn flood_body() -> Body {
    const CHUNK: usize = 64 * 1024;
    let unit = "<p>hostile\n\u{1b}[31mflood\u{1b}[0m\r\n";
    let pattern = unit.repeat(CHUNK / unit.len() + 1);
    let chunk = Bytes::from(pattern.into_bytes()).slice(..CHUNK);
    stream_body(futures::stream::iter(
        (0..FLOOD_BODY / CHUNK).map(move |_| chunk.clone()),
    ))
}

/// The start of a watch event, then `a` without end (up to [`ENDLESS_CAP`], then nothing
/// more, the connection open).
fn endless_line() -> Body {
    const CHUNK: usize = 64 * 1024;
    let start = Bytes::from_static(
        br#"{"type":"ADDED","object":{"apiVersion":"kairon.zyvor.dev/v1alpha1","kind":"Machine","metadata":{"name":""#,
    );
    let a = Bytes::from(vec![b'a'; CHUNK]);
    let line = futures::stream::iter(std::iter::once(start).chain((0..ENDLESS_CAP / CHUNK).map(move |_| a.clone())));
    let then_nothing = futures::stream::pending::<Bytes>();
    stream_body(line.chain(then_nothing))
}

/// The start of a list, one byte every [`TRICKLE_EVERY`], without end.
fn trickle() -> Body {
    let bytes = futures::stream::iter(std::iter::repeat(())).then(|()| async {
        tokio::time::sleep(TRICKLE_EVERY).await;
        Bytes::from_static(b" ")
    });
    stream_body(futures::stream::once(async { Bytes::from_static(b"{") }).chain(bytes))
}

/// A watch with no events, ended after `timeout` as an API server ends it.
fn quiet_for(timeout: Duration) -> Body {
    stream_body(futures::stream::once(tokio::time::sleep(timeout)).filter_map(|()| async { None::<Bytes> }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_told_apart_as_the_manager_sends_them() {
        let req = |m: Method, uri: &str| Request::builder().method(m).uri(uri).body(()).unwrap();
        let base = "/apis/kairon.zyvor.dev/v1alpha1/namespaces/t/machines";
        assert_eq!(
            asked(&req(Method::GET, &format!("{base}?labelSelector=a%3Db&limit=10"))),
            Asked::List
        );
        assert_eq!(
            asked(&req(
                Method::GET,
                &format!("{base}?watch=true&timeoutSeconds=50&resourceVersion=1")
            )),
            Asked::Watch {
                timeout: Duration::from_secs(50)
            }
        );
        assert_eq!(asked(&req(Method::GET, &format!("{base}/m1"))), Asked::Read);
        assert_eq!(asked(&req(Method::POST, base)), Asked::Write);
        assert_eq!(asked(&req(Method::DELETE, &format!("{base}/m1"))), Asked::Write);
    }
}
