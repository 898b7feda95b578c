//! The KaironMachines a pool created that its cache does not show yet: they count as members,
//! or the next reconcile (woken by the pool's own status write, say) would create them again.
//! Forgotten once the cache shows them, or after [`PENDING_FOR`] (a create the watch never
//! showed: the member is made again, as any lost member is).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a created KaironMachine counts without the cache showing it.
pub const PENDING_FOR: Duration = Duration::from_secs(60);

/// Per pool (by UID): the names created and when.
#[derive(Debug, Default)]
pub struct Pending(Mutex<HashMap<String, Vec<(String, Instant)>>>);

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(String, Instant)>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `name` was created for pool `pool` at `now`.
    pub fn created(&self, pool: &str, name: String, now: Instant) {
        self.lock().entry(pool.to_string()).or_default().push((name, now));
    }

    /// The names of pool `pool` still pending at `now`: those `cached` does not know and not
    /// older than [`PENDING_FOR`]. The others are forgotten.
    pub fn still(&self, pool: &str, cached: impl Fn(&str) -> bool, now: Instant) -> Vec<String> {
        let mut all = self.lock();
        let Some(names) = all.get_mut(pool) else {
            return vec![];
        };
        names.retain(|(n, at)| !cached(n) && now.duration_since(*at) < PENDING_FOR);
        let left: Vec<String> = names.iter().map(|(n, _)| n.clone()).collect();
        if names.is_empty() {
            all.remove(pool);
        }
        left
    }

    /// Forgets pool `pool` (deleted).
    pub fn forget(&self, pool: &str) {
        self.lock().remove(pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_counts_until_the_cache_shows_it_or_it_is_too_old() {
        let p = Pending::default();
        let t0 = Instant::now();
        p.created("u", "a".into(), t0);
        p.created("u", "b".into(), t0 + Duration::from_secs(30));
        assert_eq!(p.still("u", |_| false, t0), ["a", "b"]);
        assert_eq!(p.still("u", |n| n == "a", t0), ["b"], "a is cached");
        assert!(
            p.still("u", |_| false, t0 + PENDING_FOR + Duration::from_secs(30))
                .is_empty()
        );
        assert!(p.still("other", |_| false, t0).is_empty());
        p.created("u", "c".into(), t0);
        p.forget("u");
        assert!(p.still("u", |_| false, t0).is_empty());
    }
}
