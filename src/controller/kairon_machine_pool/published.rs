//! When each pool last published its `providerIDList` and status ([`super::publish`]): a pool
//! publishes at most once every [`PUBLISH_EVERY`]. In memory, per pool, only while its window
//! lasts.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest time between two publishes of one pool.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(2);

/// When each pool (by `Scope::key`) last published, while that is within [`PUBLISH_EVERY`].
#[derive(Debug, Default)]
pub struct Published(Mutex<HashMap<String, Instant>>);

impl Published {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long `pool` must wait before it publishes again; `None`: it may now.
    pub fn wait(&self, pool: &str, now: Instant) -> Option<Duration> {
        let last = *self.lock().get(pool)?;
        (last + PUBLISH_EVERY)
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
    }

    /// Records that `pool` published at `now`; forgets the pools whose window is over.
    pub fn published(&self, pool: &str, now: Instant) {
        let mut all = self.lock();
        all.retain(|_, last| now.saturating_duration_since(*last) < PUBLISH_EVERY);
        all.insert(pool.to_string(), now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_publishes_at_once_after_a_quiet_spell_then_once_a_window() {
        let p = Published::default();
        let t0 = Instant::now();
        assert_eq!(p.wait("ns/a/1", t0), None, "never published: at once");
        p.published("ns/a/1", t0);
        assert_eq!(
            p.wait("ns/a/1", t0 + Duration::from_millis(500)),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(p.wait("ns/b/2", t0), None, "another pool's window is its own");
        assert_eq!(p.wait("ns/a/1", t0 + PUBLISH_EVERY), None, "the window is over");
        p.published("ns/b/2", t0 + PUBLISH_EVERY);
        assert_eq!(p.lock().len(), 1, "a pool whose window is over is forgotten");
    }
}
