//! The control-plane endpoint as kube-vip serves it: a listener on the cluster's virtual
//! address that reaches a live API server of that cluster. kube-vip moves the address to
//! another control-plane VM when its holder goes away; here each new connection goes to the
//! first backend that accepts, and a backend is dropped when its VM stops.
//!
//! The listener stands for the VIP as the outside sees it (the management cluster, KWOK): a
//! VIP announced by ARP from a VM in a NAT or a netns is seen by nobody outside
//! ([`outside_reaches_vip`]), so only backends whose VM sits on a bridge or a macvtap parent
//! are forwarded to, and with none of them a connection is closed at once.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::network::{Attachment, describe, outside_reaches_vip};

struct Backend {
    uid: String,
    address: SocketAddr,
    /// Whether its VM's network carries the VIP to the outside.
    carries_vip: bool,
}

/// A listening endpoint; dropping it closes the port.
pub struct Endpoint {
    pub address: SocketAddr,
    backends: Arc<Mutex<Vec<Backend>>>,
    task: JoinHandle<()>,
}

impl Endpoint {
    pub async fn listen(address: SocketAddr) -> std::io::Result<Endpoint> {
        let listener = TcpListener::bind(address).await?;
        let backends: Arc<Mutex<Vec<Backend>>> = Arc::default();
        let shared = backends.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let candidates: Vec<SocketAddr> = shared
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .filter(|b| b.carries_vip)
                    .map(|b| b.address)
                    .collect();
                tokio::spawn(forward(client, candidates));
            }
        });
        tracing::info!(endpoint = %address, "control-plane endpoint listening (kube-vip)");
        Ok(Endpoint {
            address,
            backends,
            task,
        })
    }

    /// Adds (or keeps) the API server of the VM `uid`, whose NIC is on `attachment`.
    pub fn add_backend(&self, uid: &str, backend: SocketAddr, attachment: &Attachment) {
        let mut b = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        if b.iter().any(|x| x.uid == uid) {
            return;
        }
        let carries_vip = outside_reaches_vip(std::slice::from_ref(attachment));
        b.push(Backend {
            uid: uid.to_string(),
            address: backend,
            carries_vip,
        });
        if carries_vip {
            tracing::info!(endpoint = %self.address, backend = %backend, "endpoint backend added");
        } else {
            tracing::info!(
                endpoint = %self.address, backend = %backend,
                "endpoint backend added, but the VIP it announces from {} is not reachable from outside: not forwarded to",
                describe(attachment)
            );
        }
    }

    /// Removes the VM's API server; returns how many backends are left.
    pub fn remove_backend(&self, uid: &str) -> usize {
        let mut b = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        b.retain(|x| x.uid != uid);
        b.len()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
        tracing::info!(endpoint = %self.address, "control-plane endpoint closed");
    }
}

async fn forward(mut client: TcpStream, candidates: Vec<SocketAddr>) {
    for backend in candidates {
        if let Ok(mut upstream) = TcpStream::connect(backend).await {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            return;
        }
    }
    // No live API server the outside reaches: the connection is closed, as an unheld (or
    // unseen) VIP would not answer.
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo_server(tag: u8) -> (SocketAddr, JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1];
                    if s.read_exact(&mut buf).await.is_ok() {
                        let _ = s.write_all(&[tag]).await;
                    }
                });
            }
        });
        (addr, task)
    }

    async fn ask(addr: SocketAddr) -> Option<u8> {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(b"?").await.ok()?;
        let mut buf = [0u8; 1];
        s.read_exact(&mut buf).await.ok()?;
        Some(buf[0])
    }

    #[tokio::test]
    async fn moves_to_a_live_backend_when_one_goes_away() {
        let (a, task_a) = echo_server(b'a').await;
        let (b, _task_b) = echo_server(b'b').await;
        let free = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let ep = Endpoint::listen(free).await.unwrap();
        assert_eq!(ask(free).await, None, "no backend: nothing answers");
        let br0 = Attachment::Bridge("br0".into());
        ep.add_backend("vm-a", a, &br0);
        ep.add_backend("vm-b", b, &br0);
        assert_eq!(ask(free).await, Some(b'a'));
        // The first VM's API server dies before the simulator notices: the next one answers.
        task_a.abort();
        let _ = task_a.await;
        assert_eq!(ask(free).await, Some(b'b'));
        assert_eq!(ep.remove_backend("vm-a"), 1);
        assert_eq!(ask(free).await, Some(b'b'));
        drop(ep);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(TcpListener::bind(free).await.is_ok(), "port freed");
    }

    #[tokio::test]
    async fn a_backend_whose_vip_the_outside_cannot_see_is_not_forwarded_to() {
        let (user, _task_user) = echo_server(b'u').await;
        let (netns, _task_netns) = echo_server(b'n').await;
        let (macvtap, _task_macvtap) = echo_server(b'm').await;
        let free = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let ep = Endpoint::listen(free).await.unwrap();
        ep.add_backend("vm-user", user, &Attachment::User);
        ep.add_backend("vm-netns", netns, &Attachment::Netns);
        assert_eq!(ask(free).await, None, "a VIP in a NAT or a netns: closed at once");
        let private = Attachment::Macvtap {
            parent: "eth1".into(),
            private: true,
        };
        ep.add_backend("vm-macvtap", macvtap, &private);
        assert_eq!(ask(free).await, Some(b'm'), "on the parent's L2: reached");
        assert_eq!(ep.remove_backend("vm-macvtap"), 2);
        assert_eq!(ask(free).await, None);
    }
}
