//! How many of a controller's workers the clusters of one tenant may hold at once.
//!
//! A tenant names its own Kairon API (an identity), and a reconcile waits on that API's
//! answers: a slow or hostile one holds the worker until the request's deadline
//! ([`crate::client::BodyLimits::IDENTITY`]). With nothing more, enough of a tenant's clusters
//! or machines would take every worker of a controller, each for that long, again and again,
//! and no other tenant's cluster would be provisioned or deleted meanwhile.
//!
//! So a reconcile of an object whose Kairon API is an identity's takes a place of its
//! namespace (the tenant: every identity of a namespace counts as one) first; a namespace has
//! at most half of the controller's workers ([`TenantShares::new`]). A reconcile that finds no
//! place does not wait for one (it would hold a worker meanwhile): it ends at once and is
//! tried again shortly. Objects on the manager's own Kairon API are not counted: that API is
//! the operator's, not a tenant's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How soon a reconcile turned away for want of a place is tried again.
pub(crate) const TURNED_AWAY_RETRY: Duration = Duration::from_secs(2);

/// The places each namespace holds in one controller.
#[derive(Clone, Debug)]
pub struct TenantShares {
    share: usize,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

/// A place held by a reconcile; given back when dropped.
#[derive(Debug)]
pub(crate) struct Place {
    namespace: String,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

impl TenantShares {
    /// Shares of a controller with `workers` workers: half of them (at least one) per namespace.
    pub fn new(workers: u16) -> Self {
        TenantShares {
            share: (usize::from(workers) / 2).max(1),
            held: Arc::default(),
        }
    }

    /// How many places one namespace may hold.
    pub fn share(&self) -> usize {
        self.share
    }

    /// A place for a reconcile in `namespace`, if it holds fewer than its share.
    pub(crate) fn enter(&self, namespace: &str) -> Option<Place> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(namespace.to_string()).or_default();
        if *n >= self.share {
            return None;
        }
        *n += 1;
        Some(Place {
            namespace: namespace.to_string(),
            held: self.held.clone(),
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.namespace) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.namespace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_holds_at_most_its_share_and_gives_places_back() {
        // (workers, share)
        for (workers, share) in [(10, 5), (3, 1), (1, 1), (0, 1)] {
            assert_eq!(TenantShares::new(workers).share(), share, "{workers} workers");
        }
        let shares = TenantShares::new(4);
        let a1 = shares.enter("a").expect("first place of a");
        let a2 = shares.enter("a").expect("second place of a");
        assert!(shares.enter("a").is_none(), "a holds its share");
        let b = shares.enter("b").expect("b is not held up by a");
        drop(a1);
        let a3 = shares.enter("a").expect("a place given back is taken again");
        drop((a2, a3, b));
        assert!(
            shares.held.lock().unwrap().is_empty(),
            "nothing is kept of namespaces holding no place"
        );
    }
}
