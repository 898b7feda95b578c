//! Two lanes of reconciles: first-time creates in one, everything else in the other.
//!
//! In one kube-runtime queue, a machine whose Kairon Machine just turned Running (one status
//! write away from being provisioned) waits among the first reconciles of a burst of new
//! machines: once all of the queue's places are taken, kube-runtime starts the waiting objects
//! in the order of a hash set, so behind an arbitrary share of them — minutes, under the
//! client's rate limit. So every trigger is routed, when it arrives, by the KaironMachine it
//! names:
//!
//! - **create lane**: no Kairon Machine recorded yet (`spec.providerID`) and not being deleted:
//!   the reconciles that add the finalizer, read the bootstrap data and create;
//! - **urgent lane**: everything else — status mapping, deletion, and the reconciles after a
//!   restart. Its reconciles' requests are also urgent at the client's token bucket
//!   ([`crate::client::urgent`]), so they do not queue behind the creates' requests either.
//!
//! Each lane is a kube-runtime applier of its own, with `--kaironmachine-concurrency`
//! reconciles at once: a waiting reconcile is an entry in its lane's queue, not a future, so
//! thousands of them cost little. An object can be queued in both lanes (routed to the create
//! lane, then changed); kube-runtime never runs two reconciles of one object at once within a
//! lane, and [`ObjectLocks`] keeps the two lanes from doing so between them (the second is
//! triggered again when the first ends). No reconcile waits in a queue for its periodic
//! resync: that comes from the resync wheel ([`crate::controller::resync`]), routed as any
//! trigger is.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex};

use futures::channel::mpsc::UnboundedSender;
use kube::runtime::reflector::ObjectRef;

use crate::api::KaironMachine;

/// Whether a reconcile of `km` may create its Kairon Machine: not deleted, and no Kairon
/// Machine recorded yet. These go to the create lane.
pub(crate) fn on_create_path(km: &KaironMachine) -> bool {
    km.metadata.deletion_timestamp.is_none() && km.spec.provider_id.is_none()
}

/// The two lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    Create,
    Urgent,
}

impl Lane {
    /// The lane of a trigger of `km` (as fresh as we know it); an object no longer in the
    /// cache goes to the urgent lane, whose applier drops it at once.
    pub(crate) fn of(km: Option<&KaironMachine>) -> Lane {
        match km {
            Some(km) if on_create_path(km) => Lane::Create,
            _ => Lane::Urgent,
        }
    }
}

type Key = ObjectRef<KaironMachine>;

/// The objects being reconciled, so that the two lanes never reconcile one object at once.
///
/// A reconcile of an object the other lane is reconciling does not wait (it would hold one of
/// its lane's places meanwhile, and a lane whose places all wait for the other lane's creates
/// stops serving): it marks the object and ends, and when the running reconcile ends, the object
/// is triggered again, through `requeue`, and routed anew.
#[derive(Clone)]
pub(crate) struct ObjectLocks {
    /// Objects being reconciled, and whether a reconcile of them was turned away meanwhile.
    running: Arc<Mutex<HashMap<Key, bool>>>,
    requeue: UnboundedSender<Key>,
}

/// One object being reconciled; its end (drop) triggers it again if that was asked for.
pub(crate) struct Held {
    key: Key,
    locks: ObjectLocks,
}

impl ObjectLocks {
    /// Turned-away objects are triggered again through `requeue`.
    pub(crate) fn new(requeue: UnboundedSender<Key>) -> Self {
        ObjectLocks {
            running: Arc::default(),
            requeue,
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Key, bool>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object, unless a reconcile of it runs already; then it is triggered again once
    /// that one ends.
    pub(crate) fn try_lock(&self, key: Key) -> Option<Held> {
        match self.map().entry(key.clone()) {
            Entry::Occupied(mut again) => {
                again.insert(true);
                None
            }
            Entry::Vacant(free) => {
                free.insert(false);
                Some(Held {
                    key,
                    locks: self.clone(),
                })
            }
        }
    }

    /// Whether a reconcile of the object runs; if so, it is triggered again once that one
    /// ends. A trigger of an object being reconciled waits for that end rather than a lane:
    /// routed now, by an object that reconcile is about to change (a VM that turned Running
    /// before the create wrote the providerID), it could land in the create lane behind a
    /// burst of creates.
    pub(crate) fn defer_if_running(&self, key: &Key) -> bool {
        match self.map().get_mut(key) {
            Some(again) => {
                *again = true;
                true
            }
            None => false,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let again = self.locks.map().remove(&self.key).unwrap_or(false);
        if again {
            // Only fails once the controller stopped.
            let _ = self.locks.requeue.unbounded_send(self.key.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::KaironMachineSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn km(provider_id: Option<&str>, deleting: bool) -> KaironMachine {
        let mut km = KaironMachine::new(
            "km",
            KaironMachineSpec {
                provider_id: provider_id.map(str::to_string),
                ..Default::default()
            },
        );
        if deleting {
            km.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
        km
    }

    #[test]
    fn only_machines_without_a_kairon_machine_take_the_create_lane() {
        assert_eq!(Lane::of(Some(&km(None, false))), Lane::Create, "first reconcile");
        assert_eq!(
            Lane::of(Some(&km(Some("kairon://u1"), false))),
            Lane::Urgent,
            "status mapping"
        );
        assert_eq!(Lane::of(Some(&km(None, true))), Lane::Urgent, "deletion");
        assert_eq!(Lane::of(Some(&km(Some("kairon://u1"), true))), Lane::Urgent, "deletion");
        assert_eq!(Lane::of(None), Lane::Urgent, "gone");
    }

    #[test]
    fn one_reconcile_of_an_object_at_a_time_across_lanes() {
        let (tx, mut requeued) = futures::channel::mpsc::unbounded();
        let locks = ObjectLocks::new(tx);
        let a = ObjectRef::<KaironMachine>::new("a").within("ns");
        let b = ObjectRef::<KaironMachine>::new("b").within("ns");
        let held_a = locks.try_lock(a.clone()).expect("a is free");
        // Another object is not held up.
        let held_b = locks.try_lock(b.clone()).expect("b is free");
        // The same object is turned away, and triggered again once the first reconcile ends.
        assert!(locks.try_lock(a.clone()).is_none(), "a is being reconciled");
        assert!(locks.try_lock(a.clone()).is_none(), "still");
        assert_eq!(locks.len(), 2);
        drop(held_b);
        assert!(requeued.try_recv().is_err(), "nothing asked for b again");
        drop(held_a);
        assert_eq!(requeued.try_recv().unwrap(), a.clone(), "a again, once");
        assert!(requeued.try_recv().is_err());
        assert_eq!(locks.len(), 0, "nothing is kept once no reconcile runs");
        // A trigger of an object being reconciled waits for the end of that reconcile.
        assert!(!locks.defer_if_running(&b), "b is not being reconciled: route it now");
        let held_b = locks.try_lock(b.clone()).expect("b is free");
        assert!(locks.defer_if_running(&b));
        assert!(requeued.try_recv().is_err());
        drop(held_b);
        assert_eq!(requeued.try_recv().unwrap(), b.clone(), "b again, once it ended");
        let again = locks.try_lock(a).expect("a is free again");
        drop(again);
        assert!(requeued.try_recv().is_err(), "a free reconcile asks for nothing");
    }
}
