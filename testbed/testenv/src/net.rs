//! Loopback networking for tests: free ports, and a plain-HTTP GET for health, readiness and
//! metrics endpoints (etcd, CAPI's managers, capkr-manager).

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where [`free_port`] picks: below the kernel's ephemeral range (32768–60999 by default),
/// which every outgoing connection takes its local port from. A port asked of the kernel
/// (bind to port 0) comes from that range too, and between the pick and the process that
/// binds it later, one of the machine's many connections could take it (a CAPI manager
/// failed to start with "address already in use" on its health port that way, with five
/// test binaries running). Above the fixed ports the guests listen on (2379, 6443,
/// 10250–10259).
const PICK_FROM: std::ops::Range<u16> = 20000..32768;

/// Where test processes reserve the ports [`free_port`] hands out: a file per port naming the
/// process. A port is picked long before its process binds it (a CAPI manager's, after the
/// CRDs are installed, seconds later on a loaded machine); in between, another test process
/// found it free and bound it first, and the manager failed with "address already in use"
/// (a CI-like run, e2e_move's target environment). A reservation holds for as long as the
/// process that made it lives.
fn reservations() -> std::path::PathBuf {
    std::env::temp_dir().join("capkr-test-ports")
}

/// Claims the file `path` for this process: made anew naming it, or taken over from a process
/// that has exited. False when it names this process already (a claim of an earlier call) or
/// a live one, or is empty (its maker has not written it yet). What test processes share
/// through claims: ports ([`free_port`]), guest subnets (`flavors::claim_octet`).
pub(crate) fn claim(path: &std::path::Path) -> bool {
    let me = std::process::id();
    let create = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, me.to_string().as_bytes()))
    };
    if create().is_ok() {
        return true;
    }
    let holder = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    match holder {
        Some(pid) if pid != me && !std::path::Path::new(&format!("/proc/{pid}")).exists() => {
            // Of two processes taking it over at once, the one whose create wins.
            let _ = std::fs::remove_file(path);
            create().is_ok()
        }
        _ => false,
    }
}

/// A free loopback port; never hands out the same one twice in a test process, nor one another
/// live test process reserved ([`reservations`]).
pub fn free_port() -> Result<u16> {
    static USED: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let used = USED.get_or_init(|| Mutex::new(HashSet::new()));
    let span = u64::from(PICK_FROM.end - PICK_FROM.start);
    let dir = reservations();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Random enough that test processes started together pick apart: the clock's nanoseconds,
    // the process, and a counter, mixed.
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
        ^ (u64::from(std::process::id()) << 32)
        | 1;
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = PICK_FROM.start + (x % span) as u16;
        // Webhook servers bind all interfaces: the port must be free there too.
        let free = std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::TcpListener::bind(("0.0.0.0", port)).is_ok();
        // A port once picked stays in `used`, reserved or not: tried once per process.
        if free && used.lock().unwrap_or_else(|e| e.into_inner()).insert(port) && claim(&dir.join(port.to_string())) {
            return Ok(port);
        }
    }
    bail!("no free port found in {PICK_FROM:?}")
}

/// What [`http_get`] got back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    /// Everything after the headers (bodies served with a length, as the endpoints probed here do).
    pub body: String,
}

/// How long [`http_get`] waits for the whole answer.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// `GET http://127.0.0.1:<port><path>`: the status and body, or an error if nothing answers
/// within 5 s or the answer is not HTTP.
pub async fn http_get(port: u16, path: &str) -> Result<HttpResponse> {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(HTTP_TIMEOUT, get)
        .await
        .map_err(|_| anyhow!("GET {path} on port {port}: no answer within {HTTP_TIMEOUT:?}"))?
        .with_context(|| format!("GET {path} on port {port}"))?;
    let text = String::from_utf8_lossy(&buf);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| {
            let head: String = text.chars().take(64).collect();
            anyhow!("GET {path} on port {port}: not an HTTP response: {head:?}")
        })?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok(HttpResponse { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_port_never_hands_out_a_port_twice() {
        let ports: Vec<u16> = (0..20).map(|_| free_port().unwrap()).collect();
        assert!(
            ports.iter().all(|p| PICK_FROM.contains(p)),
            "outside {PICK_FROM:?}: {ports:?}"
        );
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    }

    #[test]
    fn a_claim_of_a_live_process_is_refused_and_a_dead_ones_is_taken_over() {
        let dir = std::env::temp_dir().join(format!("capkr-test-ports-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::process::id().to_string();
        let held_by = |port: &str| std::fs::read_to_string(dir.join(port)).unwrap();
        // Free: claimed, naming this process.
        assert!(claim(&dir.join("20001")));
        assert_eq!(held_by("20001"), me);
        // Held by a live process (init): refused, left as it was.
        std::fs::write(dir.join("20002"), "1").unwrap();
        assert!(!claim(&dir.join("20002")));
        assert_eq!(held_by("20002"), "1");
        // Held by a process that no longer exists: taken over.
        std::fs::write(dir.join("20003"), "999999999").unwrap();
        assert!(claim(&dir.join("20003")));
        assert_eq!(held_by("20003"), me);
        // Being written by its maker (empty yet): refused.
        std::fs::write(dir.join("20004"), "").unwrap();
        assert!(!claim(&dir.join("20004")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn http_get_returns_status_and_body() {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = vec![0u8; 1024];
            let n = s.read(&mut req).await.unwrap();
            s.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 18\r\n\r\ncaches not synced\n")
                .await
                .unwrap();
            String::from_utf8_lossy(&req[..n]).into_owned()
        });
        let got = http_get(port, "/readyz").await.unwrap();
        assert_eq!(
            got,
            HttpResponse {
                status: 503,
                body: "caches not synced\n".into()
            }
        );
        let request = server.await.unwrap();
        assert!(request.starts_with("GET /readyz HTTP/1.1\r\n"), "{request:?}");
    }

    #[tokio::test]
    async fn http_get_is_an_error_when_nothing_listens() {
        let port = free_port().unwrap();
        assert!(http_get(port, "/healthz").await.is_err());
    }
}
