//! Whether a Kairon API answers its writes, as far as this manager has seen: for the Kairon
//! APIs named by tenants' identities, which may answer every read and never a write.
//!
//! A write that gets no answer holds a place of the KaironMachine controller's create lane,
//! which every endpoint shares, until the reconcile's deadline. So each endpoint's writes
//! pass a [`WriteGate`]:
//!
//! - **new** (no write answered yet): one write at a time; the others are turned away
//!   ([`Refusal::Busy`]) until it is answered. A working API answers the first create in
//!   milliseconds; a silent one holds one place, not all of them.
//! - **answering** (a write got an answer, an error answer included): writes go.
//! - **silent** (a write got no answer: it timed out, its connection failed, or its reconcile
//!   ran out of time and dropped it): writes are refused at once ([`Refusal::Silent`]) for a
//!   pause of 30 s, doubling with each silent try up to 5 minutes; after the pause one write
//!   is tried, as for a new endpoint.
//!
//! Reads are not gated: deleting a KaironMachine whose VM never came needs only a read.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const FIRST_PAUSE: Duration = Duration::from_secs(30);
const MAX_PAUSE: Duration = Duration::from_secs(300);
/// How soon a write turned away while another is tried is tried again.
const BUSY_RETRY: Duration = Duration::from_secs(5);

/// The writes of one Kairon API; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct WriteGate {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// A write was answered since the API was last silent.
    answering: bool,
    silent: Option<Silence>,
    /// A write of a new or silent API is being tried.
    trying: bool,
}

#[derive(Debug, Clone, Copy)]
struct Silence {
    until: Instant,
    misses: u32,
}

/// Why a write is not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("waiting for the API to answer a first write")]
    Busy,
    #[error("the API did not answer a write; no write is sent until a new try after a pause")]
    Silent { retry_in: Duration },
}

impl Refusal {
    /// When the refused write should be tried again.
    pub(crate) fn retry_in(&self) -> Duration {
        match self {
            Refusal::Busy => BUSY_RETRY,
            Refusal::Silent { retry_in } => *retry_in,
        }
    }
}

fn pause(misses: u32) -> Duration {
    FIRST_PAUSE
        .saturating_mul(2u32.saturating_pow(misses.saturating_sub(1).min(16)))
        .min(MAX_PAUSE)
}

impl State {
    /// Whether a write may go now, and whether it is a try.
    fn admit(&mut self, now: Instant) -> Result<bool, Refusal> {
        match self.silent {
            Some(s) if now < s.until => {
                return Err(Refusal::Silent {
                    retry_in: s.until - now,
                });
            }
            None if self.answering => return Ok(false),
            _ => {}
        }
        if self.trying {
            return Err(Refusal::Busy);
        }
        self.trying = true;
        Ok(true)
    }

    fn settle(&mut self, trial: bool, answered: bool, now: Instant) {
        if trial {
            self.trying = false;
        }
        if answered {
            self.answering = true;
            self.silent = None;
            return;
        }
        self.answering = false;
        // Writes that were under way together make one silence, not one each.
        if self.silent.is_some_and(|s| now < s.until) {
            return;
        }
        let misses = self.silent.map_or(0, |s| s.misses) + 1;
        self.silent = Some(Silence {
            until: now + pause(misses),
            misses,
        });
    }
}

/// Leave to send one write; dropped without [`Permit::settle`] (its future was dropped, as a
/// reconcile past its deadline is), the write counts as unanswered.
#[derive(Debug)]
pub(crate) struct Permit {
    gate: Arc<WriteGate>,
    trial: bool,
    settled: bool,
}

impl WriteGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn admit(self: &Arc<Self>) -> Result<Permit, Refusal> {
        let trial = self.lock().admit(Instant::now())?;
        Ok(Permit {
            gate: self.clone(),
            trial,
            settled: false,
        })
    }
}

impl Permit {
    /// Records whether the write got an answer (any answer of the API, an error included).
    pub(crate) fn settle(mut self, answered: bool) {
        self.settled = true;
        self.gate.lock().settle(self.trial, answered, Instant::now());
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.settled {
            self.gate.lock().settle(self.trial, false, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_try_at_a_time_until_answered_then_a_pause_after_silence() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut st = State::default();
        // New: one try, the others wait for it.
        assert_eq!(st.admit(t0), Ok(true), "first write is a try");
        assert_eq!(st.admit(t0), Err(Refusal::Busy));
        st.settle(true, true, t0);
        assert_eq!(st.admit(t0), Ok(false), "answered: writes go");
        assert_eq!(st.admit(t0), Ok(false), "also at once");

        // A write gets no answer: refused for the first pause; the writes under way with it
        // make the same silence.
        st.settle(false, false, t0 + s(1));
        st.settle(false, false, t0 + s(2));
        assert_eq!(st.admit(t0 + s(10)), Err(Refusal::Silent { retry_in: s(21) }));
        // Then one try; it is silent too: the pause doubles.
        assert_eq!(st.admit(t0 + s(31)), Ok(true));
        assert_eq!(st.admit(t0 + s(31)), Err(Refusal::Busy));
        st.settle(true, false, t0 + s(61));
        assert_eq!(st.admit(t0 + s(62)), Err(Refusal::Silent { retry_in: s(59) }));
        assert_eq!(st.admit(t0 + s(121)), Ok(true));
        // An answer (even an error answer) ends the silence.
        st.settle(true, true, t0 + s(122));
        assert_eq!(st.admit(t0 + s(122)), Ok(false));
        assert!(st.silent.is_none());
    }

    #[test]
    fn pauses_double_up_to_five_minutes() {
        let got: Vec<u64> = (1..=6).map(|m| pause(m).as_secs()).collect();
        assert_eq!(got, [30, 60, 120, 240, 300, 300]);
        assert_eq!(pause(u32::MAX), MAX_PAUSE);
    }

    #[test]
    fn a_dropped_write_counts_as_unanswered() {
        let gate = Arc::new(WriteGate::default());
        let permit = gate.admit().expect("first try");
        assert!(matches!(gate.admit(), Err(Refusal::Busy)));
        // The reconcile holding it ran out of time.
        drop(permit);
        assert!(matches!(gate.admit(), Err(Refusal::Silent { .. })));

        let gate = Arc::new(WriteGate::default());
        gate.admit().expect("first try").settle(true);
        let a = gate.admit().expect("open");
        let b = gate.admit().expect("open");
        a.settle(true);
        b.settle(false);
        assert!(
            matches!(gate.admit(), Err(Refusal::Silent { .. })),
            "a write without answer"
        );
    }
}
