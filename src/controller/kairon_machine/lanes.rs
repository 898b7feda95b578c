//! Two lanes of reconciles: first-time creates in one, everything else in the other.
//!
//! kube-runtime's queue is first in, first out. During a burst of new machines, a machine
//! whose Kairon Machine just turned Running (one status write away from being provisioned)
//! would wait behind every first reconcile queued before it: minutes, under the client's rate
//! limit. So every trigger is routed, when it arrives, by the KaironMachine it names:
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
//! lane, and [`ObjectLocks`] keeps the two lanes from doing so between them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::ObjectRef;
use tokio::sync::OwnedMutexGuard;

use crate::api::KaironMachine;

/// Whether a reconcile of `km` may create its Kairon Machine: not deleted, and no Kairon
/// Machine recorded yet. These go to the create lane.
pub(crate) fn on_create_path(km: &KaironMachine) -> bool {
    km.metadata.deletion_timestamp.is_none() && km.spec.provider_id.is_none()
}

/// The lanes, by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    Create = 0,
    Urgent = 1,
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

/// One lock per object being reconciled, so that the two lanes never reconcile one object at
/// once. An entry lives only while someone holds or waits for it.
#[derive(Clone, Default)]
pub(crate) struct ObjectLocks {
    locks: Arc<Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>>,
}

/// The lock of one object, released on drop.
pub(crate) struct Held {
    guard: Option<OwnedMutexGuard<()>>,
    key: Key,
    locks: ObjectLocks,
}

impl ObjectLocks {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<tokio::sync::Mutex<()>>>> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until no other reconcile of `key` runs, and holds it off until the returned value
    /// is dropped.
    pub(crate) async fn lock(&self, key: Key) -> Held {
        let lock = self.map().entry(key.clone()).or_default().clone();
        let guard = lock.lock_owned().await;
        Held {
            guard: Some(guard),
            key,
            locks: self.clone(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.map();
        // Only the map's own reference left: nobody holds or waits for it.
        if map.get(&self.key).is_some_and(|l| Arc::strong_count(l) == 1) {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::KaironMachineSpec;
    use futures::FutureExt;
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

    #[tokio::test]
    async fn one_reconcile_of_an_object_at_a_time_across_lanes() {
        let locks = ObjectLocks::default();
        let a = ObjectRef::<KaironMachine>::new("a").within("ns");
        let b = ObjectRef::<KaironMachine>::new("b").within("ns");
        let held_a = locks.lock(a.clone()).await;
        // Another object is not held up.
        let held_b = locks.lock(b.clone()).now_or_never().expect("b is free");
        // The same object waits until the first reconcile of it ends.
        let mut second = Box::pin(locks.lock(a.clone()));
        assert!((&mut second).now_or_never().is_none(), "a is held");
        assert_eq!(locks.len(), 2);
        drop(held_a);
        let held_a2 = second.await;
        drop(held_b);
        assert_eq!(locks.len(), 1, "b's entry is gone with its holder");
        drop(held_a2);
        assert_eq!(locks.len(), 0, "nothing is kept once nobody holds a lock");
    }
}
