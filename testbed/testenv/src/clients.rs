//! Clients of an API server for whichever tokio runtime asks.
//!
//! A [`kube::Client`] runs its request buffer as a task of the runtime that built it, and
//! stops working when that runtime ends. Every `#[tokio::test]` has a runtime of its own, so an
//! environment shared by the tests of a binary ([`crate::Env::shared`]) cannot hand out the
//! client it was started with: it keeps the client *configuration* and builds one client per
//! runtime on first use, cached on the asking thread next to a task of that runtime which never
//! finishes on its own — finished means the runtime is gone, and so is the client.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use kube::Client;
use tokio::task::JoinHandle;

/// A client configuration and the clients made of it, one per runtime.
pub(crate) struct RuntimeClients {
    id: u64,
    config: kube::Config,
}

struct Cached {
    id: u64,
    /// A task of the runtime the client belongs to; finished once that runtime has shut down.
    runtime_alive: JoinHandle<()>,
    client: Client,
}

thread_local! {
    static CLIENTS: RefCell<Vec<Cached>> = const { RefCell::new(Vec::new()) };
}

impl RuntimeClients {
    pub(crate) fn new(config: kube::Config) -> RuntimeClients {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        RuntimeClients {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            config,
        }
    }

    /// A client for the current runtime (panics outside one, as building any client would).
    pub(crate) fn get(&self) -> Client {
        CLIENTS.with(|cache| {
            let mut cache = cache.borrow_mut();
            cache.retain(|c| !c.runtime_alive.is_finished());
            if let Some(c) = cache.iter().find(|c| c.id == self.id) {
                return c.client.clone();
            }
            let client = Client::try_from(self.config.clone())
                .unwrap_or_else(|e| panic!("a client of the environment's own kubeconfig: {e}"));
            cache.push(Cached {
                id: self.id,
                runtime_alive: tokio::spawn(std::future::pending::<()>()),
                client: client.clone(),
            });
            client
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The failure this module exists for: a client cached while one runtime ran is not handed
    /// to the next runtime on the same thread.
    #[test]
    fn a_new_runtime_on_the_same_thread_gets_a_new_client() {
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let clients = RuntimeClients::new(config);
        let first_alive = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let _a = clients.get();
                let _b = clients.get();
                CLIENTS.with(|c| c.borrow().len())
            });
        assert_eq!(first_alive, 1, "one client per runtime, reused within it");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let _c = clients.get();
            CLIENTS.with(|c| {
                let c = c.borrow();
                assert_eq!(c.len(), 1, "the dead runtime's client is dropped");
                assert!(!c[0].runtime_alive.is_finished());
            });
        });
    }
}
