//! Kairon's MachineSet policy, as pure functions: given a set and the Machines of its
//! namespace, what kairon-controller does with it on one reconcile tick. Kairon lists
//! everything afresh each tick and keeps no books of its own; neither does this: every
//! decision comes from the objects alone, so a restarted simulator decides as before.
//!
//! A tick, for a set not being deleted: its finalizer if missing; then the members are the
//! Machines labelled with the set's name and not being deleted, in list order (by name);
//! those labelled with the current template's hash are current, every other one outdated; and
//! exactly one of these happens:
//!
//! 1. fewer members than `spec.replicas`: the missing ones are created from the template;
//! 2. `Recreate`: every outdated member deleted, or else the first current ones above
//!    `spec.replicas`;
//! 3. `RollingUpdate`: outdated members deleted from the front of the list while at least
//!    `replicas - maxUnavailable` stay available (Running current ones plus all outdated);
//!    with none outdated, the first current ones above `spec.replicas` deleted.
//!
//! The status (`replicas`, `readyReplicas`, `updatedReplicas`, and `message` when the step
//! failed) is the count before the step. Kairon never changes `spec.replicas` and never marks
//! a member: one deleted by anyone else is simply no longer a member, and is replaced.

use capkr::kairon::machineset::{
    MACHINESET_FINALIZER, MACHINESET_LABEL, MachineSet, MachineSetStatus, TEMPLATE_HASH_LABEL, strategy,
};
use capkr::kairon::{Machine, phase};
use kube::ResourceExt;

use crate::sim::phase_of;

/// The one change Kairon makes to a set's members on a tick.
#[derive(Clone, Debug, PartialEq)]
pub enum SetStep {
    Wait,
    /// New members from the current template.
    Create {
        count: usize,
    },
    /// Members deleted (names, in list order).
    Delete {
        names: Vec<String>,
    },
    /// The set is being deleted and no Machine carries its label any more.
    RemoveFinalizer,
}

/// What Kairon does with a set on one tick.
#[derive(Clone, Debug, PartialEq)]
pub struct SetPlan {
    /// The set's finalizer is missing: added first.
    pub add_finalizer: bool,
    pub step: SetStep,
    /// The status Kairon writes after the step: the count before it, with `message` when the
    /// spec cannot be followed (a failed write of the step adds its own). `None` for a set
    /// being deleted.
    pub status: Option<MachineSetStatus>,
}

impl SetPlan {
    fn wait() -> Self {
        Self {
            add_finalizer: false,
            step: SetStep::Wait,
            status: None,
        }
    }

    /// Nothing to write to `set`, the set it was planned for.
    pub fn is_idle(&self, set: &MachineSet) -> bool {
        !self.add_finalizer
            && self.step == SetStep::Wait
            && self.status.as_ref().is_none_or(|s| set.status.as_ref() == Some(s))
    }
}

/// The hash of a set's template that its members are labelled with: the whole template,
/// labels and spec (cloudInit and every other field included), so any change to it makes the
/// existing members outdated. FNV-1a over the template's JSON, the first 12 hex digits: the
/// same in every process and version.
pub fn template_hash(set: &MachineSet) -> String {
    let json = serde_json::to_string(&set.spec.template).unwrap_or_default();
    let hash = json.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")[..12].to_string()
}

/// A new member of `set`, named `name`: the template's labels plus the set's name and the
/// template hash, and the template's spec as it is (cloudInit included). No ownerReferences:
/// Kairon sets none.
pub fn member(set: &MachineSet, name: &str) -> Machine {
    let template = &set.spec.template;
    let mut m = Machine::new(name, template.spec.clone());
    m.metadata.namespace = set.namespace();
    let mut labels = template.labels.clone().unwrap_or_default();
    labels.insert(MACHINESET_LABEL.into(), set.name_any());
    labels.insert(TEMPLATE_HASH_LABEL.into(), template_hash(set));
    m.metadata.labels = Some(labels);
    m
}

/// Whether `m` carries `set`'s label in its namespace (being deleted or not).
pub fn is_member(set: &MachineSet, m: &Machine) -> bool {
    m.namespace() == set.namespace() && m.labels().get(MACHINESET_LABEL) == Some(&set.name_any())
}

fn deleting(m: &Machine) -> bool {
    m.metadata.deletion_timestamp.is_some()
}

fn running(m: &Machine) -> bool {
    phase_of(m) == Some(phase::RUNNING)
}

fn names(ms: &[&Machine]) -> Vec<String> {
    ms.iter().map(|m| m.name_any()).collect()
}

/// Kairon's tick for `set`, over `machines` (any Machines; those of other sets or namespaces
/// are ignored).
pub fn plan(set: &MachineSet, machines: &[&Machine]) -> SetPlan {
    let mut labelled: Vec<&Machine> = machines.iter().copied().filter(|m| is_member(set, m)).collect();
    // The API server lists by name: Kairon's "first" members are the first names.
    labelled.sort_by_key(|m| m.name_any());
    let has_finalizer = set.finalizers().iter().any(|f| f == MACHINESET_FINALIZER);

    if set.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return SetPlan::wait();
        }
        let step = if labelled.is_empty() {
            SetStep::RemoveFinalizer
        } else {
            let left: Vec<&Machine> = labelled.iter().copied().filter(|m| !deleting(m)).collect();
            if left.is_empty() {
                SetStep::Wait
            } else {
                SetStep::Delete { names: names(&left) }
            }
        };
        return SetPlan {
            step,
            ..SetPlan::wait()
        };
    }

    let hash = template_hash(set);
    let owned: Vec<&Machine> = labelled.into_iter().filter(|m| !deleting(m)).collect();
    let (current, outdated): (Vec<&Machine>, Vec<&Machine>) = owned
        .iter()
        .partition(|m| m.labels().get(TEMPLATE_HASH_LABEL) == Some(&hash));
    let ready_current = current.iter().filter(|m| running(m)).count();
    let (step, message) = match step(set, &owned, &current, &outdated, ready_current) {
        Ok(step) => (step, None),
        Err(message) => (SetStep::Wait, Some(message)),
    };
    let count = |n: usize| Some(i32::try_from(n).unwrap_or(i32::MAX));
    let status = MachineSetStatus {
        replicas: count(owned.len()),
        ready_replicas: count(ready_current),
        updated_replicas: count(current.len()),
        message,
    };
    SetPlan {
        add_finalizer: !has_finalizer,
        step,
        status: Some(status),
    }
}

/// The one step, over the members in list order. `Err`: the spec cannot be followed (the
/// status message).
fn step(
    set: &MachineSet,
    owned: &[&Machine],
    current: &[&Machine],
    outdated: &[&Machine],
    ready_current: usize,
) -> Result<SetStep, String> {
    let desired = set.spec.replicas.max(0);
    let wanted = usize::try_from(desired).unwrap_or(0);
    if owned.len() < wanted {
        return Ok(SetStep::Create {
            count: wanted - owned.len(),
        });
    }
    let surplus = || {
        if current.len() > wanted {
            SetStep::Delete {
                names: names(&current[..current.len() - wanted]),
            }
        } else {
            SetStep::Wait
        }
    };
    if set.strategy() == strategy::RECREATE {
        return Ok(if outdated.is_empty() {
            surplus()
        } else {
            SetStep::Delete { names: names(outdated) }
        });
    }
    if outdated.is_empty() {
        return Ok(surplus());
    }
    let max_unavailable = set.max_unavailable(desired).ok_or_else(|| {
        format!(
            "spec.maxUnavailable: {:?} is neither a non-negative integer nor a percentage",
            set.spec.max_unavailable.as_deref().unwrap_or_default()
        )
    })?;
    let min_available = i64::from(desired) - i64::from(max_unavailable);
    let available = i64::try_from(ready_current + outdated.len()).unwrap_or(i64::MAX);
    let can_delete = usize::try_from(available - min_available).unwrap_or(0);
    Ok(if can_delete == 0 {
        SetStep::Wait
    } else {
        SetStep::Delete {
            names: names(&outdated[..can_delete.min(outdated.len())]),
        }
    })
}

#[cfg(test)]
#[path = "machineset_tests.rs"]
mod tests;
