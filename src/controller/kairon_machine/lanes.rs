//! The create lane: at most `--kaironmachine-concurrency` KaironMachines on their way to a
//! Kairon Machine at once, while every other reconcile starts at once.
//!
//! kube-runtime's queue is first in, first out, and its concurrency limit counts every
//! reconcile alike. During a burst of new machines, a machine whose Kairon Machine just turned
//! Running (one status write away from being provisioned) would wait behind every first
//! reconcile queued before it: minutes, under the client's rate limit. So the controller runs
//! without a limit of its own, and only the create path waits here, in order of arrival, for one
//! of `concurrency` permits. A reconcile of a machine whose Kairon Machine is already recorded
//! (`spec.providerID`) or that is being deleted does not wait: at most `concurrency` creates are
//! ahead of it at the client's token bucket. kube-runtime still never runs two reconciles of the
//! same object at once.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::api::KaironMachine;

/// Whether a reconcile of `km` may create its Kairon Machine: not deleted, and no Kairon
/// Machine recorded yet. These reconciles add the finalizer, read the bootstrap data and create;
/// they are the ones that wait for a permit.
pub(crate) fn on_create_path(km: &KaironMachine) -> bool {
    km.metadata.deletion_timestamp.is_none() && km.spec.provider_id.is_none()
}

/// The permits of the create path, handed out in order of arrival.
#[derive(Clone)]
pub(crate) struct CreateGate(Arc<Semaphore>);

impl CreateGate {
    pub(crate) fn new(permits: u16) -> Self {
        CreateGate(Arc::new(Semaphore::new(usize::from(permits.max(1)))))
    }

    /// Runs the reconcile `start` makes: on the create path after a permit (held until it
    /// ends), otherwise at once. The reconcile is only made once it may run, so that a
    /// thousand waiting reconciles cost a thousand small waits, not a thousand reconciles.
    pub(crate) async fn run<F, Fut>(&self, km: &KaironMachine, start: F) -> Fut::Output
    where
        F: FnOnce() -> Fut,
        Fut: Future,
    {
        let _permit = if on_create_path(km) {
            // Never closed: the semaphore lives as long as the gate.
            self.0.acquire().await.ok()
        } else {
            None
        };
        Box::pin(start()).await
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
    fn only_machines_without_a_kairon_machine_take_the_create_path() {
        assert!(on_create_path(&km(None, false)), "first reconcile");
        assert!(!on_create_path(&km(Some("kairon://u1"), false)), "status mapping");
        assert!(!on_create_path(&km(None, true)), "deletion");
        assert!(!on_create_path(&km(Some("kairon://u1"), true)), "deletion");
    }

    #[tokio::test]
    async fn a_status_reconcile_is_not_held_by_waiting_creates() {
        let gate = CreateGate::new(2);
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let released = released.shared();
        let new = km(None, false);
        // Two creates hold the permits until released, a hundred more wait in line.
        let mut creates: Vec<_> = (0..102)
            .map(|_| {
                let (gate, new, released) = (gate.clone(), new.clone(), released.clone());
                tokio::spawn(async move {
                    gate.run(&new, || async move {
                        let _ = released.await;
                    })
                    .await
                })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.0.available_permits(), 0, "the creates hold every permit");

        // A reconcile of a provisioned machine and a deletion run at once.
        let provisioned = km(Some("kairon://u1"), false);
        let ran = gate.run(&provisioned, || async { "status" }).now_or_never();
        assert_eq!(ran, Some("status"), "a status reconcile does not wait");
        let ran = gate.run(&km(None, true), || async { "delete" }).now_or_never();
        assert_eq!(ran, Some("delete"), "a deletion does not wait");

        // Another create waits: nothing of it runs before a permit is free.
        let started = std::sync::atomic::AtomicBool::new(false);
        let waiting = gate.run(&new, || async {
            started.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        assert!(waiting.now_or_never().is_none(), "a create waits for a permit");
        assert!(!started.load(std::sync::atomic::Ordering::SeqCst));

        release.send(()).unwrap();
        for c in creates.drain(..) {
            c.await.unwrap();
        }
        assert_eq!(gate.0.available_permits(), 2, "every permit returned");
    }
}
