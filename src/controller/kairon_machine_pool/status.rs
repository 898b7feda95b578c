//! What a KaironMachinePool reports. Pure: no I/O.
//!
//! CAPI v1.14.2 reads `status.ready` (the v1beta1 field) and re-copies it into the
//! MachinePool every reconcile; it copies `spec.providerIDList` and `status.replicas` only
//! while it is true. Both `ready` and `initialization.provisioned` are written together and
//! never go back to false: a pool whose set goes away later says so in its conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::conditions::{self, Decided, READY, Status, reason};
use crate::api::{INFRASTRUCTURE_MACHINE_KIND, Initialization, KaironMachinePoolStatus, MachineSetRef};

/// Whether the pool's Kairon MachineSet exists and Kairon acts on its current spec.
pub const MACHINE_SET_PROVISIONED: &str = "MachineSetProvisioned";

/// One KaironMachine of the pool, as the status counts it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counted {
    /// Its `spec.providerID` (set from creation for a pool's instances).
    pub provider_id: Option<String>,
    /// Its VM runs (the KaironMachine is provisioned).
    pub running: bool,
}

/// What the status is made from.
#[derive(Clone, Debug, Default)]
pub struct Observed<'a> {
    pub previous: Option<&'a KaironMachinePoolStatus>,
    /// The set, once it exists; with whether Kairon has acted on its current spec.
    pub set: Option<(MachineSetRef, bool)>,
    /// Why the pool cannot go on, if it cannot (no bootstrap data yet, the set is another
    /// pool's, …): it becomes the reason of `MachineSetProvisioned` while no set exists, and
    /// of `Ready`.
    pub waiting: Option<Decided>,
    /// Why the pool is paused, if it is.
    pub paused: Option<&'a str>,
    /// The pool's KaironMachines, those being deleted included.
    pub instances: &'a [Counted],
    pub generation: Option<i64>,
}

/// `spec.providerIDList`: the providerIDs of every KaironMachine of the pool, sorted, those
/// being deleted included: CAPI deletes the Node of a providerID that leaves the list, without
/// a drain, so a VM's stays until its KaironMachine is gone (its Machine drained it first).
/// The pool's Ready condition while it waits for something (why, and what).
pub(super) fn waiting(why: &'static str, message: impl Into<String>) -> Decided {
    Decided::new(READY, Status::False, why, message)
}

pub fn provider_id_list(instances: &[Counted]) -> Vec<String> {
    let mut ids: Vec<String> = instances.iter().filter_map(|i| i.provider_id.clone()).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The status the pool should have.
pub fn pool_status(o: &Observed<'_>, now: &Time) -> KaironMachinePoolStatus {
    let previous = o.previous.cloned().unwrap_or_default();
    let observed = o.set.as_ref().is_some_and(|(_, observed)| *observed);
    let provisioned = previous.is_provisioned() || observed;
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
    let set_condition = match (&o.set, &o.waiting) {
        (Some((_, true)), _) => Decided::new(MACHINE_SET_PROVISIONED, Status::True, reason::PROVISIONED, ""),
        (Some((s, false)), _) => Decided::new(
            MACHINE_SET_PROVISIONED,
            Status::False,
            reason::MACHINE_SET_NOT_OBSERVED,
            format!("Kairon has not acted on MachineSet {} yet", s.name),
        ),
        (None, Some(w)) => Decided {
            type_: MACHINE_SET_PROVISIONED,
            ..w.clone()
        },
        (None, None) => Decided::new(
            MACHINE_SET_PROVISIONED,
            Status::False,
            reason::MACHINE_SET_NOT_FOUND,
            "the Kairon MachineSet does not exist yet",
        ),
    };
    let ready = match &o.waiting {
        Some(w) if observed => Decided {
            type_: READY,
            ..w.clone()
        },
        _ => Decided {
            type_: READY,
            ..set_condition.clone()
        },
    };
    set(&mut conds, set_condition);
    set(
        &mut conds,
        Decided {
            reason: if ready.status == Status::True {
                reason::READY
            } else {
                ready.reason
            },
            ..ready
        },
    );

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
        machine_set: o.set.as_ref().map(|(s, _)| s.clone()).or(previous.machine_set),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("time"))
    }

    fn set_ref() -> MachineSetRef {
        MachineSetRef {
            name: "pool".into(),
            uid: Some("set-uid".into()),
            ..Default::default()
        }
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
    fn ready_and_provisioned_together_once_kairon_acts_on_the_set_and_never_back() {
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
        assert_eq!(
            cond(&before, MACHINE_SET_PROVISIONED),
            ("False", reason::WAITING_FOR_BOOTSTRAP_DATA)
        );
        assert_eq!(cond(&before, READY), ("False", reason::WAITING_FOR_BOOTSTRAP_DATA));
        assert_eq!(before.infrastructure_machine_kind.as_deref(), Some("KaironMachine"));
        assert_eq!(before.replicas, Some(0), "both fall to 0 together with the list");

        let created = pool_status(
            &Observed {
                previous: Some(&before),
                set: Some((set_ref(), false)),
                ..Default::default()
            },
            &at(2),
        );
        assert_eq!(created.ready, None, "not before Kairon acts on the set");
        assert_eq!(
            cond(&created, MACHINE_SET_PROVISIONED),
            ("False", reason::MACHINE_SET_NOT_OBSERVED)
        );

        let up = [counted("b", true), counted("a", false)];
        let ready = pool_status(
            &Observed {
                previous: Some(&created),
                set: Some((set_ref(), true)),
                instances: &up,
                ..Default::default()
            },
            &at(3),
        );
        assert_eq!(ready.ready, Some(true));
        assert_eq!(ready.initialization.as_ref().and_then(|i| i.provisioned), Some(true));
        assert_eq!((ready.replicas, ready.ready_replicas), (Some(2), Some(1)));
        assert_eq!(cond(&ready, READY), ("True", reason::READY));
        assert_eq!(ready.machine_set, Some(set_ref()));

        // The set gone later (or a new bootstrap Secret awaited): conditions say it, the
        // contract fields stay true.
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
        assert_eq!(later.machine_set, Some(set_ref()), "the set it had is remembered");
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
            set: Some((set_ref(), true)),
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
