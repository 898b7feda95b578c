//! What a KaironMachinePool reports. Pure: no I/O.
//!
//! CAPI v1.14.2 reads `status.ready` (the v1beta1 field) and re-copies it into the
//! MachinePool every reconcile; it copies `spec.providerIDList` and `status.replicas` only
//! while it is true. Both `ready` and `initialization.provisioned` are written together, once
//! the pool first has what it needs to make members, and never go back to false: a pool that
//! waits for something later says so in its conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::conditions::{self, Decided, READY, Status, reason};
use crate::api::{INFRASTRUCTURE_MACHINE_KIND, Initialization, KaironMachinePoolStatus};

/// One KaironMachine of the pool, as the status counts it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counted {
    /// Its `spec.providerID` (set once its VM exists).
    pub provider_id: Option<String>,
    /// Its VM runs (the KaironMachine is provisioned).
    pub running: bool,
}

/// What the status is made from.
#[derive(Clone, Debug, Default)]
pub struct Observed<'a> {
    pub previous: Option<&'a KaironMachinePoolStatus>,
    /// Why the pool cannot go on, if it cannot (no bootstrap data yet, another pool is named,
    /// …): the reason of `Ready`. `None`: it makes its members.
    pub waiting: Option<Decided>,
    /// Why the pool is paused, if it is.
    pub paused: Option<&'a str>,
    /// The members' KaironMachines, those being deleted included.
    pub instances: &'a [Counted],
    pub generation: Option<i64>,
}

/// The pool's Ready condition while it waits for something (why, and what).
pub(super) fn waiting(why: &'static str, message: impl Into<String>) -> Decided {
    Decided::new(READY, Status::False, why, message)
}

/// `spec.providerIDList`: the providerIDs of every KaironMachine of the pool, sorted, those
/// being deleted included: CAPI deletes the Node of a providerID that leaves the list, without
/// a drain, so a VM's stays until its KaironMachine is gone (its Machine drained it first).
pub fn provider_id_list(instances: &[Counted]) -> Vec<String> {
    let mut ids: Vec<String> = instances.iter().filter_map(|i| i.provider_id.clone()).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The status the pool should have.
pub fn pool_status(o: &Observed<'_>, now: &Time) -> KaironMachinePoolStatus {
    let previous = o.previous.cloned().unwrap_or_default();
    let provisioned = previous.is_provisioned() || (o.waiting.is_none() && o.paused.is_none());
    let mut conds = previous.conditions.clone().unwrap_or_default();
    let set = |conds: &mut Vec<_>, d: Decided| conditions::set(conds, d, o.generation, now);

    set(&mut conds, conditions::paused(o.paused));
    if o.paused.is_some() {
        // Paused: only the Paused condition is written; the rest stays as it was.
        return KaironMachinePoolStatus {
            conditions: Some(conds),
            ..previous
        };
    }
    let ready = match &o.waiting {
        Some(w) => Decided {
            type_: READY,
            ..w.clone()
        },
        None => Decided::new(READY, Status::True, reason::READY, ""),
    };
    set(&mut conds, ready);

    let replicas = i32::try_from(provider_id_list(o.instances).len()).unwrap_or(i32::MAX);
    let running = o.instances.iter().filter(|i| i.running).count();
    KaironMachinePoolStatus {
        ready: provisioned.then_some(true),
        initialization: provisioned.then_some(Initialization {
            provisioned: Some(true),
        }),
        replicas: Some(replicas),
        ready_replicas: Some(i32::try_from(running).unwrap_or(i32::MAX)),
        infrastructure_machine_kind: Some(INFRASTRUCTURE_MACHINE_KIND.into()),
        conditions: Some(conds),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("time"))
    }

    fn counted(id: &str, running: bool) -> Counted {
        Counted {
            provider_id: Some(format!("kairon://{id}")),
            running,
        }
    }

    fn cond<'a>(s: &'a KaironMachinePoolStatus, t: &str) -> (&'a str, &'a str) {
        let c = conditions::get(s.conditions.as_deref().unwrap_or_default(), t).expect(t);
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn ready_and_provisioned_together_once_the_pool_can_make_members_and_never_back() {
        let waiting = Decided::new(
            READY,
            Status::False,
            reason::WAITING_FOR_BOOTSTRAP_DATA,
            "no dataSecretName yet",
        );
        let before = pool_status(
            &Observed {
                waiting: Some(waiting.clone()),
                ..Default::default()
            },
            &at(1),
        );
        assert_eq!((before.ready, before.initialization.clone()), (None, None));
        assert_eq!(cond(&before, READY), ("False", reason::WAITING_FOR_BOOTSTRAP_DATA));
        assert_eq!(before.infrastructure_machine_kind.as_deref(), Some("KaironMachine"));
        assert_eq!(before.replicas, Some(0), "both fall to 0 together with the list");

        let up = [counted("b", true), counted("a", false), Counted::default()];
        let ready = pool_status(
            &Observed {
                previous: Some(&before),
                instances: &up,
                ..Default::default()
            },
            &at(3),
        );
        assert_eq!(ready.ready, Some(true));
        assert_eq!(ready.initialization.as_ref().and_then(|i| i.provisioned), Some(true));
        assert_eq!(
            (ready.replicas, ready.ready_replicas),
            (Some(2), Some(1)),
            "a member without a VM yet is not counted"
        );
        assert_eq!(cond(&ready, READY), ("True", reason::READY));

        let later = pool_status(
            &Observed {
                previous: Some(&ready),
                waiting: Some(waiting),
                ..Default::default()
            },
            &at(4),
        );
        assert_eq!(later.ready, Some(true), "never flips back");
        assert_eq!(later.initialization.as_ref().and_then(|i| i.provisioned), Some(true));
        assert_eq!(cond(&later, READY).0, "False");
    }

    #[test]
    fn the_provider_id_list_is_sorted_and_keeps_deleting_instances() {
        let list = provider_id_list(&[
            counted("c", true),
            counted("a", false),
            Counted::default(),
            counted("a", true),
        ]);
        assert_eq!(list, ["kairon://a", "kairon://c"]);
    }

    #[test]
    fn steady_state_status_is_equal_so_nothing_is_written() {
        let up = [counted("a", true)];
        let o = |previous| Observed {
            previous,
            instances: &up,
            generation: Some(3),
            ..Default::default()
        };
        let first = pool_status(&o(None), &at(1));
        let second = pool_status(&o(Some(&first)), &at(99));
        assert_eq!(first, second, "transition times kept, nothing new");
        let paused = pool_status(
            &Observed {
                paused: Some("Cluster spec.paused is set to true"),
                ..o(Some(&first))
            },
            &at(100),
        );
        assert_eq!(cond(&paused, conditions::PAUSED).0, "True");
        let paused_status = KaironMachinePoolStatus {
            conditions: None,
            ..paused.clone()
        };
        let first_status = KaironMachinePoolStatus {
            conditions: None,
            ..first.clone()
        };
        assert_eq!(paused_status, first_status, "paused: nothing else changes");
        assert_eq!(cond(&paused, READY), cond(&first, READY), "paused: the conditions stay");
    }
}
