//! What a KaironMachinePool does next with its Kairon MachineSets and its instances. Pure: no
//! I/O; the reconciler gathers the input from its caches and carries the plan out.
//!
//! The rules, from CAPI's MachinePool Machines contract and Kairon's MachineSet as it is (it
//! replaces any member deleted by someone else, and deletes members of its own choice when
//! `spec.replicas` drops below them):
//! - the pool has one set per revision and only ever **raises** the current revision's
//!   `spec.replicas`, by what the sum of all its sets' `spec.replicas` lacks of the target;
//! - it never deletes a VM or a KaironMachine to scale in, replace or roll: it deletes the
//!   instance's **Machine**, CAPI drains its Node and deletes the KaironMachine, whose
//!   finalizer releases the VM from its set (the VM labelled released, then the set lowered by
//!   one with a record of it) and deletes it;
//! - a member Kairon made is Stopped without cloudInit: the pool starts it once its
//!   KaironMachine exists, with its own bootstrap data;
//! - an instance CAPI has not made a Machine for yet is never chosen (CAPI catches up).

/// One VM of the pool, with the KaironMachine and the Machine that stand for it, by name (all
/// three share the VM's name).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Instance {
    pub name: String,
    /// The member VM; `None`: no VM by that name is a member of the set (gone, or not yet seen).
    pub vm: Option<Vm>,
    /// The KaironMachine; `None`: none yet.
    pub km: Option<Km>,
    /// The Machine CAPI made for the KaironMachine; `None`: none yet.
    pub machine: Option<PoolMachine>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Vm {
    /// Being deleted (by anyone), or released from its set by the pool.
    pub deleting: bool,
    /// Its runtime failed (Kairon's `Unknown`): Kairon does not heal it; it is replaced.
    pub broken: bool,
    /// A member of an older revision's set.
    pub outdated: bool,
    /// Made by Kairon and not started yet.
    pub awaits_start: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Km {
    /// The KaironMachine found its VM gone (it never makes another).
    pub vm_gone: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolMachine {
    pub deleting: bool,
    /// Carries `cluster.x-k8s.io/delete-machine`: the one to remove first.
    pub delete_annotation: bool,
    /// A MachineHealthCheck asked its owner to remediate it (`OwnerRemediated=False`).
    pub remediate: bool,
    /// Its Node is ready and available.
    pub available: bool,
    /// Creation time, for the delete policy (seconds; only the order matters).
    pub created: i64,
}

/// What the plan is made from.
#[derive(Clone, Debug, Default)]
pub struct PlanInput<'a> {
    /// `MachinePool.spec.replicas`.
    pub desired: i32,
    pub max_surge: i32,
    pub max_unavailable: i32,
    /// `deletePolicy: Newest`.
    pub newest_first: bool,
    /// The current revision's set's `spec.replicas`.
    pub set_replicas: i32,
    /// The sum of `spec.replicas` over all the pool's sets, the current one included.
    pub all_replicas: i32,
    pub instances: &'a [Instance],
    /// Broken VMs are not replaced now: replacing them backs off.
    pub hold_broken: bool,
}

/// Why a Machine is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// Its VM failed or stopped.
    Broken,
    /// A MachineHealthCheck asked for it.
    Remediation,
    /// Its VM (or its KaironMachine) is gone: CAPI would only mark it failed.
    Vanished,
    /// More instances than wanted.
    ScaleIn,
    /// Made from an older template.
    Rollout,
}

/// What to do, all of it at once: the writes do not depend on one another.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolPlan {
    /// Raise the current set's `spec.replicas` to this (against the version the input was read
    /// from).
    pub set_replicas: Option<i32>,
    /// Create a KaironMachine for each of these members.
    pub create_kaironmachines: Vec<String>,
    /// Start these members (they have their KaironMachine).
    pub start: Vec<String>,
    /// Delete these Machines.
    pub delete_machines: Vec<(String, Why)>,
    /// Instances not yet at the current template and not being deleted: the pool is rolling.
    pub outdated: usize,
    /// Broken VMs left for later: replacing them backs off.
    pub broken_held: usize,
    /// As many instances as wanted, every one available, none broken.
    pub whole: bool,
}

/// Decides the next step of a pool.
pub fn plan_pool(input: &PlanInput<'_>) -> PoolPlan {
    let desired = input.desired.max(0);
    let mut plan = PoolPlan::default();

    for i in input.instances {
        match (&i.vm, &i.km) {
            (Some(vm), None) if !vm.deleting => plan.create_kaironmachines.push(i.name.clone()),
            (Some(vm), Some(_)) if !vm.deleting && vm.awaits_start => plan.start.push(i.name.clone()),
            _ => {}
        }
    }

    // Replace: broken VMs, remediation, vanished VMs. Only through a Machine not yet deleting.
    // A VM still there is replaced at most `maxUnavailable` (at least one) at a time, Machines
    // already being deleted included: a bad image or a mass failure is not all torn down at
    // once. A vanished VM's Machine goes at once (there is nothing left to keep).
    let deletable = |i: &Instance| i.machine.as_ref().is_some_and(|m| !m.deleting);
    let mut replacing = input
        .instances
        .iter()
        .filter(|i| i.machine.as_ref().is_some_and(|m| m.deleting))
        .count();
    let replace_cap = usize::try_from(input.max_unavailable.max(1)).unwrap_or(1);
    for i in input.instances.iter().filter(|i| deletable(i)) {
        let m = i.machine.as_ref().expect("deletable");
        let why = match (&i.vm, &i.km) {
            (_, Some(km)) if km.vm_gone => Some(Why::Vanished),
            (None, None) => Some(Why::Vanished),
            (Some(vm), _) if vm.broken && !vm.deleting => Some(Why::Broken),
            (Some(vm), _) if !vm.deleting && m.remediate => Some(Why::Remediation),
            _ => None,
        };
        match why {
            Some(Why::Vanished) => plan.delete_machines.push((i.name.clone(), Why::Vanished)),
            Some(Why::Broken) if input.hold_broken => plan.broken_held += 1,
            Some(why) if replacing < replace_cap => {
                replacing += 1;
                plan.delete_machines.push((i.name.clone(), why));
            }
            _ => {}
        }
    }
    let replaced = |i: &Instance, plan: &PoolPlan| plan.delete_machines.iter().any(|(n, _)| *n == i.name);

    // Live: members that stay, as far as this plan knows.
    let live: Vec<&Instance> = input
        .instances
        .iter()
        .filter(|i| i.vm.as_ref().is_some_and(|v| !v.deleting))
        .filter(|i| !i.machine.as_ref().is_some_and(|m| m.deleting))
        .filter(|i| !replaced(i, &plan))
        .collect();
    let outdated_live = live
        .iter()
        .filter(|i| i.vm.as_ref().is_some_and(|v| v.outdated))
        .count();
    plan.outdated = outdated_live;
    plan.whole = live.len() >= usize::try_from(desired).unwrap_or(0)
        && live
            .iter()
            .all(|i| i.machine.as_ref().is_some_and(|m| m.available) && !i.vm.as_ref().is_some_and(|v| v.broken));
    let surge = usize::try_from(input.max_surge.max(0)).unwrap_or(0).min(outdated_live);
    let target = usize::try_from(desired).unwrap_or(0) + surge;

    // Scale-in: the Machines CAPI marked, then those not available, then outdated, then by age.
    // Not while CAPI has yet to make a Machine for one of them: that one may be the one to go.
    let mut chosen: Vec<&Instance> = vec![];
    if live.len() > target && live.iter().all(|i| i.machine.is_some()) {
        let mut candidates: Vec<&Instance> = live.iter().copied().filter(|i| deletable(i)).collect();
        candidates.sort_by_key(|i| victim_order(i, input.newest_first));
        chosen.extend(candidates.into_iter().take(live.len() - target));
        for i in &chosen {
            plan.delete_machines.push((i.name.clone(), Why::ScaleIn));
        }
    }

    // Rollout: outdated instances go while enough stay available.
    let staying: Vec<&Instance> = live
        .iter()
        .copied()
        .filter(|i| !chosen.iter().any(|c| c.name == i.name))
        .collect();
    let available = staying
        .iter()
        .filter(|i| i.machine.as_ref().is_some_and(|m| m.available))
        .count();
    let floor = usize::try_from((desired - input.max_unavailable.max(0)).max(0)).unwrap_or(0);
    if available > floor {
        let mut outdated: Vec<&Instance> = staying
            .iter()
            .copied()
            .filter(|i| deletable(i) && i.vm.as_ref().is_some_and(|v| v.outdated))
            .collect();
        outdated.sort_by_key(|i| victim_order(i, input.newest_first));
        for i in outdated.into_iter().take(available - floor) {
            plan.delete_machines.push((i.name.clone(), Why::Rollout));
        }
    }

    // The current set is raised by what all sets lack of the target; never lowered (only a
    // release lowers a set, by the member it releases).
    let target = i32::try_from(target).unwrap_or(i32::MAX);
    if input.all_replicas < target {
        plan.set_replicas = Some(input.set_replicas.saturating_add(target - input.all_replicas));
    }
    plan
}

/// CAPI's annotation on a MachinePool whose replicas an external autoscaler manages.
pub const REPLICAS_MANAGED_BY_ANNOTATION: &str = "cluster.x-k8s.io/replicas-managed-by";

/// Whether an external autoscaler manages the MachinePool's replicas: the annotation present
/// with any value but `"false"`, as CAPI reads it.
pub fn replicas_managed_externally(annotations: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    annotations
        .and_then(|a| a.get(REPLICAS_MANAGED_BY_ANNOTATION))
        .is_some_and(|v| v != "false")
}

/// The order in which instances are removed: CAPI's mark first, then not available, then
/// outdated, then oldest (or newest) first; the name breaks ties.
fn victim_order(i: &Instance, newest_first: bool) -> (bool, bool, bool, i64, String) {
    let m = i.machine.as_ref();
    let created = m.map_or(0, |m| m.created);
    (
        !m.is_some_and(|m| m.delete_annotation),
        m.is_some_and(|m| m.available),
        !i.vm.as_ref().is_some_and(|v| v.outdated),
        if newest_first {
            created.saturating_neg()
        } else {
            created
        },
        i.name.clone(),
    )
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
