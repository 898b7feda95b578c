//! What a KaironMachinePool does next with its members. Pure: no I/O; the reconciler gathers
//! the input from its caches and carries the plan out.
//!
//! A member is a KaironMachine the pool made from its template, which makes its own VM as every
//! KaironMachine does, and the Machine CAPI makes for it (CAPI's MachinePool Machines). The
//! rules:
//! - the pool **creates** KaironMachines up to what it wants (its MachinePool's replicas, plus
//!   `maxSurge` while it rolls);
//! - it never deletes a VM or a KaironMachine of a running member: to scale in, replace or roll
//!   it deletes the member's **Machine**, CAPI drains its Node and deletes the KaironMachine,
//!   whose finalizer deletes the VM;
//! - a member of an older revision (template, version, bootstrap Secret) goes only while enough
//!   stay available (`maxUnavailable`), and a member CAPI has not made a Machine for yet is
//!   never chosen (CAPI catches up).

/// One member of the pool, its KaironMachine and the Machine that stand for it, by name (the
/// Machine CAPI makes has the KaironMachine's name).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Instance {
    pub name: String,
    /// The KaironMachine; `None`: none (a Machine left without one).
    pub km: Option<Km>,
    /// The Machine CAPI made for the KaironMachine; `None`: none yet.
    pub machine: Option<PoolMachine>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Km {
    /// Being deleted.
    pub deleting: bool,
    /// It found its VM gone (it never makes another).
    pub vm_gone: bool,
    /// Its VM's runtime failed (Kairon's `Unknown`): Kairon does not heal it; it is replaced.
    pub broken: bool,
    /// Made for an older revision of the pool.
    pub outdated: bool,
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
    pub instances: &'a [Instance],
    /// Broken VMs are not replaced now: replacing them backs off.
    pub hold_broken: bool,
}

/// Why a Machine (or a KaironMachine without one) is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// Its VM failed.
    Broken,
    /// A MachineHealthCheck asked for it.
    Remediation,
    /// Its VM (or its KaironMachine) is gone: CAPI would only mark it failed.
    Vanished,
    /// More members than wanted.
    ScaleIn,
    /// Made for an older revision.
    Rollout,
}

/// What to do, all of it at once: the writes do not depend on one another.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolPlan {
    /// Create this many KaironMachines of the current revision.
    pub create: usize,
    /// Delete these Machines.
    pub delete_machines: Vec<(String, Why)>,
    /// Delete these KaironMachines, which have no Machine to delete (their VM is gone).
    pub delete_kaironmachines: Vec<String>,
    /// Members not yet of the current revision and not being deleted: the pool is rolling.
    pub outdated: usize,
    /// Broken VMs left for later: replacing them backs off.
    pub broken_held: usize,
    /// As many members as wanted, every one available, none broken.
    pub whole: bool,
}

/// Decides the next step of a pool.
pub fn plan_pool(input: &PlanInput<'_>) -> PoolPlan {
    let desired = usize::try_from(input.desired.max(0)).unwrap_or(0);
    let mut plan = PoolPlan::default();

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
    for i in input.instances {
        let Some(m) = i.machine.as_ref().filter(|m| !m.deleting) else {
            // No Machine yet: a KaironMachine whose VM is gone goes itself.
            if i.machine.is_none() && i.km.as_ref().is_some_and(|k| k.vm_gone && !k.deleting) {
                plan.delete_kaironmachines.push(i.name.clone());
            }
            continue;
        };
        let why = match &i.km {
            None => Some(Why::Vanished),
            Some(km) if km.vm_gone => Some(Why::Vanished),
            Some(km) if km.deleting => None,
            Some(km) if km.broken => Some(Why::Broken),
            Some(_) if m.remediate => Some(Why::Remediation),
            Some(_) => None,
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
    let going = |i: &Instance, plan: &PoolPlan| {
        plan.delete_machines.iter().any(|(n, _)| *n == i.name) || plan.delete_kaironmachines.contains(&i.name)
    };

    // Live: members that stay, as far as this plan knows.
    let live: Vec<&Instance> = input
        .instances
        .iter()
        .filter(|i| i.km.as_ref().is_some_and(|k| !k.deleting))
        .filter(|i| !i.machine.as_ref().is_some_and(|m| m.deleting))
        .filter(|i| !going(i, &plan))
        .collect();
    let outdated_live = live
        .iter()
        .filter(|i| i.km.as_ref().is_some_and(|k| k.outdated))
        .count();
    plan.outdated = outdated_live;
    plan.whole = live.len() >= desired
        && live
            .iter()
            .all(|i| i.machine.as_ref().is_some_and(|m| m.available) && !i.km.as_ref().is_some_and(|k| k.broken));
    let surge = usize::try_from(input.max_surge.max(0)).unwrap_or(0).min(outdated_live);
    let target = desired + surge;

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

    // Rollout: outdated members go while enough stay available.
    let staying: Vec<&Instance> = live
        .iter()
        .copied()
        .filter(|i| !chosen.iter().any(|c| c.name == i.name))
        .collect();
    let available = staying
        .iter()
        .filter(|i| i.machine.as_ref().is_some_and(|m| m.available))
        .count();
    let floor = desired.saturating_sub(usize::try_from(input.max_unavailable.max(0)).unwrap_or(0));
    if available > floor {
        let mut outdated: Vec<&Instance> = staying
            .iter()
            .copied()
            .filter(|i| deletable(i) && i.km.as_ref().is_some_and(|k| k.outdated))
            .collect();
        outdated.sort_by_key(|i| victim_order(i, input.newest_first));
        for i in outdated.into_iter().take(available - floor) {
            plan.delete_machines.push((i.name.clone(), Why::Rollout));
        }
    }

    // Create what the live members lack of the target; a broken VM held for later still counts
    // (it is replaced in its turn, not added to).
    plan.create = target.saturating_sub(live.len());
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

/// The order in which members are removed: CAPI's mark first, then not available, then
/// outdated, then oldest (or newest) first; the name breaks ties.
fn victim_order(i: &Instance, newest_first: bool) -> (bool, bool, bool, i64, String) {
    let m = i.machine.as_ref();
    let created = m.map_or(0, |m| m.created);
    (
        !m.is_some_and(|m| m.delete_annotation),
        m.is_some_and(|m| m.available),
        !i.km.as_ref().is_some_and(|k| k.outdated),
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
