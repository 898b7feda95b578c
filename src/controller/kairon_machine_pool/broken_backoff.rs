//! Replacing a pool's broken VMs backs off (issue: a bad image or a host that kills every new
//! VM would otherwise mean create, fail, delete, without end). The first broken VM after the
//! pool was last whole is replaced at once; each one after it waits twice as long as the one
//! before (10 s, 20 s, 40 s, … at most 5 min) while VMs keep failing. A pool starts over once it
//! has stayed whole (every instance available, none broken) for as long as its last wait: a
//! replacement that runs for a moment and then fails, as a VM whose image crashes after boot
//! does, keeps the run going instead of ending it. In memory, per pool (by UID): a restarted
//! manager replaces the next broken VM at once and backs off from there.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The wait after the first replacement of a run of failures.
pub const BASE: Duration = Duration::from_secs(10);
/// The longest wait.
pub const CAP: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug)]
struct Step {
    /// Broken VMs replaced since the pool was last whole.
    replaced: u32,
    /// No broken VM is replaced before this.
    next: Instant,
    /// Since when the pool has been whole without a break, if it is.
    whole_since: Option<Instant>,
}

impl Step {
    /// Whether the pool has been whole long enough for the run of failures to be over.
    fn settled(&self, now: Instant) -> bool {
        self.whole_since
            .is_some_and(|since| now.saturating_duration_since(since) >= delay_after(self.replaced))
    }
}

/// The backoff of every pool, by UID.
#[derive(Debug, Default)]
pub struct BrokenBackoff(Mutex<HashMap<String, Step>>);

impl BrokenBackoff {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Step>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long the pool must wait before it replaces a broken VM; `None`: not at all.
    pub fn wait(&self, pool: &str, now: Instant) -> Option<Duration> {
        let step = *self.lock().get(pool)?;
        if step.settled(now) {
            return None;
        }
        step.next.checked_duration_since(now).filter(|d| !d.is_zero())
    }

    /// Records `n` broken VMs replaced now; returns how many were replaced in the run so far
    /// and how long the next must wait.
    pub fn replaced(&self, pool: &str, n: usize, now: Instant) -> (u32, Duration) {
        let mut all = self.lock();
        let step = all.entry(pool.to_string()).or_insert(Step {
            replaced: 0,
            next: now,
            whole_since: None,
        });
        if step.settled(now) {
            step.replaced = 0;
        }
        step.whole_since = None;
        step.replaced = step.replaced.saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
        let delay = delay_after(step.replaced);
        step.next = now + delay;
        (step.replaced, delay)
    }

    /// The pool is whole now: once it has been for as long as its last wait, the next broken
    /// VM is replaced at once.
    pub fn whole(&self, pool: &str, now: Instant) {
        let mut all = self.lock();
        let Some(step) = all.get_mut(pool) else {
            return;
        };
        if step.settled(now) {
            all.remove(pool);
        } else if step.whole_since.is_none() {
            step.whole_since = Some(now);
        }
    }

    /// The pool is not whole (a member on its way, none broken): a time it was whole before
    /// does not count towards starting over.
    pub fn not_whole(&self, pool: &str) {
        if let Some(step) = self.lock().get_mut(pool) {
            step.whole_since = None;
        }
    }
}

/// The wait after `replaced` broken VMs in a run: `BASE`, doubled for each one after the first.
fn delay_after(replaced: u32) -> Duration {
    let doublings = replaced.saturating_sub(1).min(16);
    BASE.saturating_mul(1 << doublings).min(CAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_doubles_the_wait_up_to_the_cap_and_a_whole_pool_starts_over() {
        let b = BrokenBackoff::default();
        let t0 = Instant::now();
        assert_eq!(b.wait("p", t0), None, "the first broken VM goes at once");
        assert_eq!(b.replaced("p", 1, t0), (1, Duration::from_secs(10)));
        assert_eq!(b.wait("p", t0 + Duration::from_secs(4)), Some(Duration::from_secs(6)));
        assert_eq!(b.wait("p", t0 + Duration::from_secs(10)), None);
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(b.replaced("p", 1, t1), (2, Duration::from_secs(20)));
        assert_eq!(b.replaced("p", 2, t1), (4, Duration::from_secs(80)));
        assert_eq!(b.replaced("p", 10, t1).1, CAP);
        assert_eq!(b.wait("other", t1), None, "per pool");
        // Whole for as long as the last wait (5 min, the cap): the run is over.
        b.whole("p", t1);
        let t2 = t1 + CAP;
        assert_eq!(b.wait("p", t2), None);
        b.whole("p", t2);
        assert_eq!(b.replaced("p", 1, t2), (1, BASE));
    }

    /// A CI run saw 11 VMs of a pool fail in 75 s, replaced 4 s apart: each replacement ran for
    /// a moment, the pool was whole, and that ended the run. Whole for a moment is not enough.
    #[test]
    fn a_pool_whole_for_a_moment_between_failures_keeps_backing_off() {
        let b = BrokenBackoff::default();
        let t0 = Instant::now();
        assert_eq!(b.replaced("p", 1, t0), (1, BASE));
        let ran = t0 + Duration::from_secs(12);
        b.whole("p", ran);
        let failed = ran + Duration::from_millis(300);
        assert_eq!(b.wait("p", failed), None, "its wait (10 s) is over");
        assert_eq!(b.replaced("p", 1, failed), (2, Duration::from_secs(20)));
        b.whole("p", failed + Duration::from_secs(4));
        assert_eq!(
            b.wait("p", failed + Duration::from_secs(5)),
            Some(Duration::from_secs(15)),
            "whole for 1 s of a 20 s wait"
        );
        // Whole, then a member on its way again: the time it was whole does not count.
        b.not_whole("p");
        b.whole("p", failed + Duration::from_secs(19));
        assert_eq!(b.wait("p", failed + Duration::from_secs(25)), None, "its wait is over");
        assert_eq!(
            b.replaced("p", 1, failed + Duration::from_secs(25)).0,
            3,
            "the run goes on"
        );
    }
}
