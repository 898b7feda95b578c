//! What one identity's Kairon API may make the manager hold. Each answer is bounded by the
//! client, but not how many there are: a server that lists page after page without end, or
//! sends watch events of ever new Kairon Machines, would grow the cache (during a list, the
//! reflector's buffer) until the manager is killed — and, crash-looping, every tenant with it.
//! An endpoint that goes over its budget is cut off: its watch stops, what it buffered is
//! dropped, and its clusters say why until its identity changes. What it keeps also counts
//! against the budgets over all endpoints ([`crate::controller::endpoints::ledger`]): over one of those, it is
//! cut off as well.

use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use tracing::warn;

use crate::controller::endpoints::ledger::Claim;
use crate::kairon::Vm;

/// At most this many Kairon Machines of one namespace from one identity's Kairon API.
pub(crate) const MAX_MACHINES: usize = 2_000;
/// At most this many bytes of them, as kept (roughly: the object's size in memory and what it
/// holds beyond that, measured as its serialized size).
pub(crate) const MAX_BYTES: usize = 8 * 1024 * 1024;
/// The cache is measured again after this many changes (a modification replaces an object: only
/// new ones make it grow, and they cannot be told apart once applied).
const MEASURE_EVERY: usize = 64;

/// How much an endpoint's watch holds, as its events go by.
#[derive(Debug)]
pub(crate) struct Budget {
    /// Objects and bytes of the list under way (buffered until it is done).
    listing: (usize, usize),
    /// Changes since the cache was last measured.
    changes: usize,
    /// Bytes of the cache when it was last measured.
    cached: usize,
    /// What the endpoint keeps, as held against the budgets over all endpoints: the cache, and
    /// beside it the list under way.
    claim: Claim,
}

/// The bytes `vm` takes as kept, roughly: the object itself and its serialized size for what
/// it holds on the heap.
pub(crate) fn kept_bytes(vm: &Vm) -> usize {
    std::mem::size_of::<Vm>() + serde_json::to_vec(vm).map_or(0, |b| b.len())
}

fn over(objects: usize, bytes: usize) -> Option<String> {
    (objects > MAX_MACHINES || bytes > MAX_BYTES).then(|| {
        format!(
            "the Kairon API sent more than the manager holds for one identity ({MAX_MACHINES} Kairon \
             Machines, {} MiB): it is cut off, and its clusters are not served until the identity \
             changes",
            MAX_BYTES / (1024 * 1024)
        )
    })
}

impl Budget {
    /// The budget of a new endpoint, whose keeping is held as `claim`.
    pub(crate) fn new(claim: Claim) -> Budget {
        Budget {
            listing: (0, 0),
            changes: 0,
            cached: 0,
            claim,
        }
    }

    /// Takes in `event` (already applied to the cache); `Err` with why once the endpoint is
    /// over its budget, or would take all endpoints over theirs (then it holds nothing there
    /// any more). `cached` measures the cache: its objects and their bytes.
    pub(crate) fn admit(&mut self, event: &Event<Vm>, cached: impl FnOnce() -> (usize, usize)) -> Result<(), String> {
        let admitted = self.admit_here(event, cached);
        if admitted.is_err() {
            self.claim.release();
        }
        admitted
    }

    fn admit_here(&mut self, event: &Event<Vm>, cached: impl FnOnce() -> (usize, usize)) -> Result<(), String> {
        let measured = |budget: &mut Budget| {
            let (objects, bytes) = cached();
            budget.cached = bytes;
            over(objects, bytes).map_or(Ok(()), Err)
        };
        match event {
            Event::Init => self.listing = (0, 0),
            Event::InitApply(vm) => {
                self.listing.0 += 1;
                self.listing.1 += kept_bytes(vm);
                if let Some(why) = over(self.listing.0, self.listing.1) {
                    return Err(why);
                }
            }
            Event::InitDone => {
                self.listing = (0, 0);
                self.changes = 0;
                measured(self)?;
            }
            Event::Apply(vm) if vm.meta().name.is_some() => {
                self.changes += 1;
                if self.changes < MEASURE_EVERY {
                    return Ok(());
                }
                self.changes = 0;
                measured(self)?;
            }
            Event::Apply(_) | Event::Delete(_) => return Ok(()),
        }
        self.claim.hold(self.cached + self.listing.1)
    }
}

/// Fills the cache behind `store` through `writer` from `events`, each event checked against
/// the endpoint's budget once applied. Over it, the stream ends: the cache is emptied (what
/// the reflector buffered goes with the stream), `cut_off` says why (for good), and `on_cut`
/// gets the Kairon Machines the cache held, so that their KaironMachines say so at once.
pub(crate) fn within_budget<S>(
    events: S,
    writer: Writer<Vm>,
    store: Store<Vm>,
    cut_off: Arc<Mutex<Option<String>>>,
    identity: String,
    claim: Claim,
    on_cut: impl Fn(Vec<Arc<Vm>>) + Send + 'static,
) -> impl Stream<Item = watcher::Result<Event<Vm>>> + Send
where
    S: Stream<Item = watcher::Result<Event<Vm>>> + Send,
{
    events.scan((writer, Budget::new(claim)), move |(writer, budget), event| {
        let Ok(ev) = &event else {
            return futures::future::ready(Some(event));
        };
        writer.apply_watcher_event(ev);
        let admitted = budget.admit(ev, || {
            let vms = store.state();
            (vms.len(), vms.iter().map(|vm| kept_bytes(vm)).sum())
        });
        let Err(why) = admitted else {
            return futures::future::ready(Some(event));
        };
        warn!(identity = %identity, "{why}");
        *cut_off.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        let held = store.state();
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        on_cut(held);
        futures::future::ready(None)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::endpoints::ledger::{EndpointCaps, Ledger};
    use crate::kairon::Machine;

    /// The budget of an endpoint of namespace `t`, with the default budgets over all endpoints.
    fn budget() -> Budget {
        Budget::new(Ledger::new(EndpointCaps::default()).claim("t"))
    }

    fn vm(i: usize, message_bytes: usize) -> Vm {
        let mut m = Machine::new(&format!("vm-{i}"), Default::default());
        m.metadata.namespace = Some("t".into());
        m.status = Some(crate::kairon::MachineStatus {
            message: Some("x".repeat(message_bytes)),
            ..Default::default()
        });
        Vm::cached(m)
    }

    #[test]
    fn a_list_without_end_is_cut_off_once_over_the_count() {
        let mut b = budget();
        b.admit(&Event::Init, || (0, 0)).unwrap();
        for i in 0..MAX_MACHINES {
            b.admit(&Event::InitApply(vm(i, 0)), || unreachable!()).unwrap();
        }
        let why = b.admit(&Event::InitApply(vm(MAX_MACHINES, 0)), || unreachable!());
        assert!(why.unwrap_err().contains("cut off"));
    }

    #[test]
    fn a_list_of_big_objects_is_cut_off_once_over_the_bytes() {
        let mut b = budget();
        b.admit(&Event::Init, || (0, 0)).unwrap();
        let big = 1024 * 1024;
        let mut admitted = 0;
        while b.admit(&Event::InitApply(vm(admitted, big)), || unreachable!()).is_ok() {
            admitted += 1;
            assert!(admitted <= MAX_BYTES / big, "cut off by bytes");
        }
        assert_eq!(
            admitted,
            MAX_BYTES / big - 1,
            "7 objects of just over 1 MiB pass, the 8th not"
        );
    }

    #[test]
    fn a_relist_starts_counting_again_and_a_finished_list_is_measured_in_the_cache() {
        let mut b = budget();
        for round in 0..3 {
            b.admit(&Event::Init, || (0, 0)).unwrap();
            for i in 0..MAX_MACHINES {
                b.admit(&Event::InitApply(vm(i, 0)), || unreachable!()).unwrap();
            }
            b.admit(&Event::InitDone, || (MAX_MACHINES, 1000))
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        assert!(b.admit(&Event::InitDone, || (MAX_MACHINES + 1, 0)).is_err());
    }

    #[test]
    fn watch_events_are_measured_in_the_cache_every_so_often() {
        let mut b = budget();
        let mut measured = 0;
        for i in 0..(10 * MEASURE_EVERY) {
            b.admit(&Event::Apply(vm(i, 0)), || {
                measured += 1;
                (10, 10)
            })
            .unwrap();
        }
        assert_eq!(measured, 10);
        let mut result = Ok(());
        for i in 0..MEASURE_EVERY {
            result = b.admit(&Event::Apply(vm(i, 0)), || (MAX_MACHINES + 1, 0));
        }
        assert!(
            result.is_err(),
            "a cache grown past the count by watch events is cut off"
        );
        b.admit(&Event::Delete(vm(0, 0)), || unreachable!()).unwrap();
    }

    #[test]
    fn endpoints_are_cut_off_once_together_over_their_namespaces_budget_and_release_it() {
        let per_namespace = MAX_BYTES + MAX_BYTES / 2;
        let ledger = Ledger::new(EndpointCaps {
            bytes_per_namespace: per_namespace,
            ..EndpointCaps::default()
        });
        let (mut first, mut second) = (Budget::new(ledger.claim("t")), Budget::new(ledger.claim("t")));
        let mut other = Budget::new(ledger.claim("u"));
        let listed = |b: &mut Budget, bytes: usize| {
            b.admit(&Event::Init, || (0, 0))?;
            b.admit(&Event::InitDone, || (1, bytes))
        };
        listed(&mut first, MAX_BYTES - 1).unwrap();
        listed(&mut other, MAX_BYTES - 1).unwrap();
        let why = listed(&mut second, MAX_BYTES - 1).unwrap_err();
        assert!(why.contains("--identity-cache-bytes-per-namespace"), "{why}");
        // A list under way counts beside the cache it replaces.
        first.admit(&Event::Init, || (0, 0)).unwrap();
        let mut refused = None;
        for i in 0..MAX_MACHINES {
            if let Err(why) = first.admit(&Event::InitApply(vm(i, 4096)), || unreachable!()) {
                refused = Some(why);
                break;
            }
        }
        let why = refused.expect("the relist of the first is cut off too");
        assert!(why.contains("namespace t"), "{why}");
        // Both cut off: the namespace's budget is free again.
        listed(&mut Budget::new(ledger.claim("t")), MAX_BYTES).unwrap();
    }

    #[tokio::test]
    async fn over_budget_the_watch_ends_and_the_cache_is_emptied() {
        let (store, writer) = kube::runtime::reflector::store::<Vm>();
        let cut_off: Arc<Mutex<Option<String>>> = Arc::default();
        let held = Arc::new(Mutex::new(0usize));
        let first_list = std::iter::once(Event::Init)
            .chain((0..10).map(|i| Event::InitApply(vm(i, 0))))
            .chain(std::iter::once(Event::InitDone));
        let endless = (10..).map(|i| Event::Apply(vm(i, 0)));
        let events = futures::stream::iter(first_list.chain(endless).map(Ok));
        let seen = held.clone();
        let passed: Vec<_> = within_budget(
            events,
            writer,
            store.clone(),
            cut_off.clone(),
            "t/id".into(),
            Ledger::new(EndpointCaps::default()).claim("t"),
            move |vms| {
                *seen.lock().unwrap() = vms.len();
            },
        )
        .collect()
        .await;
        assert!(
            passed.len() > MAX_MACHINES,
            "the events up to the budget went by: {}",
            passed.len()
        );
        assert!(
            passed.len() < MAX_MACHINES + 2 * MEASURE_EVERY,
            "and few after it: {}",
            passed.len()
        );
        assert!(
            cut_off
                .lock()
                .unwrap()
                .as_deref()
                .is_some_and(|w| w.contains("cut off"))
        );
        assert!(
            *held.lock().unwrap() > MAX_MACHINES,
            "the machines it held were handed on"
        );
        assert!(store.state().is_empty(), "the cache is emptied");
    }
}
