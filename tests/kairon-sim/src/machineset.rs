//! Kairon's MachineSet policy, as pure functions: given a set and its members (the Machines
//! of its namespace labelled with its name), the one next thing Kairon does. Everything is
//! derived from the objects (the members' labels and annotations, the set's scale-in records),
//! so a restarted simulator makes the same decision again and never counts a scale-in twice.

use std::collections::{BTreeMap, BTreeSet};

use capkr::kairon::machineset::{
    MACHINESET_FINALIZER, MACHINESET_LABEL, MachineSet, MachineSetStatus, REMOVED_BY_ANNOTATION, REMOVED_BY_MACHINESET,
    SCALED_IN_ANNOTATION_PREFIX, TEMPLATE_HASH_LABEL,
};
use capkr::kairon::{Machine, phase};
use kube::ResourceExt;
use serde_json::json;

use crate::sim::phase_of;

/// What Kairon does next with a set.
#[derive(Clone, Debug, PartialEq)]
pub enum SetStep {
    Wait,
    AddFinalizer,
    /// Members deleted by someone else (their uids): `spec.replicas` becomes `replicas`, one
    /// less per member, and each is recorded so that it counts once.
    ScaleIn {
        uids: Vec<String>,
        replicas: i32,
    },
    /// Scale-in records of members that are gone: removed.
    ForgetScaledIn {
        uids: Vec<String>,
    },
    /// New members from the current template.
    Create {
        count: usize,
    },
    /// Members Kairon deletes itself (names): marked `removed-by: machineset`, then deleted.
    Remove {
        names: Vec<String>,
    },
    RemoveFinalizer,
    Status(MachineSetStatus),
}

/// The hash of a set's template that members are labelled with: template labels and spec,
/// without `cloudInit` and `legacyUserData` (new user-data, such as a rotated bootstrap token, must not roll a
/// set). FNV-1a over the JSON form, so it is the same in every process and version.
pub fn template_hash(set: &MachineSet) -> String {
    let template = &set.spec.template;
    let mut spec = template.spec.clone();
    spec.cloud_init = None;
    spec.legacy_user_data = None;
    let labels = template.metadata.as_ref().and_then(|m| m.labels.clone());
    let canonical = json!({"labels": labels, "spec": spec}).to_string();
    let hash = canonical.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")[..10].to_string()
}

/// A new member of `set`, named `name`: the template's labels and spec (user-data included)
/// as they are now, with the set's name and the template hash as labels. No ownerReferences:
/// Kairon's model has none.
pub fn member(set: &MachineSet, name: &str) -> Machine {
    let template = &set.spec.template;
    let mut m = Machine::new(name, template.spec.clone());
    m.metadata.namespace = set.namespace();
    let mut labels = template
        .metadata
        .as_ref()
        .and_then(|t| t.labels.clone())
        .unwrap_or_default();
    labels.insert(MACHINESET_LABEL.into(), set.name_any());
    labels.insert(TEMPLATE_HASH_LABEL.into(), template_hash(set));
    m.metadata.labels = Some(labels);
    m
}

/// Whether `m` is a member of `set`.
pub fn is_member(set: &MachineSet, m: &Machine) -> bool {
    m.namespace() == set.namespace() && m.labels().get(MACHINESET_LABEL) == Some(&set.name_any())
}

fn deleting(m: &Machine) -> bool {
    m.metadata.deletion_timestamp.is_some()
}

fn removed_by_kairon(m: &Machine) -> bool {
    m.annotations().get(REMOVED_BY_ANNOTATION).map(String::as_str) == Some(REMOVED_BY_MACHINESET)
}

fn running(m: &Machine) -> bool {
    phase_of(m) == Some(phase::RUNNING)
}

/// The uids whose scale-in the set has recorded.
fn scaled_in(set: &MachineSet) -> BTreeSet<String> {
    set.annotations()
        .keys()
        .filter_map(|k| k.strip_prefix(SCALED_IN_ANNOTATION_PREFIX))
        .map(str::to_string)
        .collect()
}

pub fn scaled_in_annotation(uid: &str) -> String {
    format!("{SCALED_IN_ANNOTATION_PREFIX}{uid}")
}

/// Kairon's next step for `set` with `members` (see [`is_member`]).
pub fn plan(set: &MachineSet, members: &[&Machine]) -> SetStep {
    let has_finalizer = set.finalizers().iter().any(|f| f == MACHINESET_FINALIZER);
    if set.metadata.deletion_timestamp.is_some() {
        let left: Vec<String> = members.iter().filter(|m| !deleting(m)).map(|m| m.name_any()).collect();
        return match (members.is_empty(), has_finalizer) {
            (true, true) => SetStep::RemoveFinalizer,
            _ if !left.is_empty() => SetStep::Remove { names: left },
            _ => SetStep::Wait,
        };
    }
    if !has_finalizer {
        return SetStep::AddFinalizer;
    }
    let recorded = scaled_in(set);
    let mut external: Vec<String> = members
        .iter()
        .filter(|m| deleting(m) && !removed_by_kairon(m))
        .filter_map(|m| m.uid())
        .filter(|uid| !recorded.contains(uid))
        .collect();
    if !external.is_empty() {
        external.sort();
        let n = i32::try_from(external.len()).unwrap_or(i32::MAX);
        return SetStep::ScaleIn {
            replicas: set.spec.replicas.saturating_sub(n).max(0),
            uids: external,
        };
    }
    let uids: BTreeSet<String> = members.iter().filter_map(|m| m.uid()).collect();
    let gone: Vec<String> = recorded.difference(&uids).cloned().collect();
    if !gone.is_empty() {
        return SetStep::ForgetScaledIn { uids: gone };
    }
    // A removal interrupted between marking and deleting (a restart) is finished.
    let marked: Vec<String> = members
        .iter()
        .filter(|m| removed_by_kairon(m) && !deleting(m))
        .map(|m| m.name_any())
        .collect();
    if !marked.is_empty() {
        return SetStep::Remove { names: marked };
    }

    let hash = template_hash(set);
    let kept: Vec<&Machine> = members.iter().copied().filter(|m| !deleting(m)).collect();
    let (new, old): (Vec<&Machine>, Vec<&Machine>) = kept
        .iter()
        .partition(|m| m.labels().get(TEMPLATE_HASH_LABEL) == Some(&hash));
    let replicas = usize::try_from(set.spec.replicas).unwrap_or(0);
    let step = match set.rolling_update() {
        Some((surge, unavailable)) if !old.is_empty() => roll(&kept, &new, &old, &hash, replicas, (surge, unavailable)),
        _ => scale(&kept, replicas, &hash),
    };
    if step != SetStep::Wait {
        return step;
    }
    let status = set_status(set, &kept, new.len(), hash);
    if set.status.as_ref() == Some(&status) {
        SetStep::Wait
    } else {
        SetStep::Status(status)
    }
}

/// Members created or removed to match `replicas`; Kairon's pick to remove: not Running first,
/// then outdated, then the newest.
fn scale(kept: &[&Machine], replicas: usize, hash: &str) -> SetStep {
    if kept.len() < replicas {
        return SetStep::Create {
            count: replicas - kept.len(),
        };
    }
    if kept.len() > replicas {
        let mut pick = kept.to_vec();
        pick.sort_by_key(|m| {
            (
                running(m),
                m.labels().get(TEMPLATE_HASH_LABEL).map(String::as_str) == Some(hash),
                std::cmp::Reverse(m.creation_timestamp()),
                m.name_any(),
            )
        });
        return SetStep::Remove {
            names: pick[..kept.len() - replicas].iter().map(|m| m.name_any()).collect(),
        };
    }
    SetStep::Wait
}

/// A RollingUpdate with outdated members: new members first, up to `replicas + surge`;
/// outdated ones removed while at least `replicas - unavailable` members stay Running (one
/// that is not Running can always go). Both 0 would never move: unavailable counts as 1.
fn roll(
    kept: &[&Machine],
    new: &[&Machine],
    old: &[&Machine],
    hash: &str,
    replicas: usize,
    (surge, unavailable): (i32, i32),
) -> SetStep {
    let surge = usize::try_from(surge).unwrap_or(0);
    let unavailable = usize::try_from(unavailable).unwrap_or(0).max(usize::from(surge == 0));
    let max_total = replicas + surge;
    if kept.len() > max_total {
        return scale(kept, replicas, hash);
    }
    if new.len() < replicas && kept.len() < max_total {
        return SetStep::Create {
            count: (max_total - kept.len()).min(replicas - new.len()),
        };
    }
    let running_now = kept.iter().filter(|m| running(m)).count();
    let mut budget = running_now.saturating_sub(replicas.saturating_sub(unavailable));
    let mut old = old.to_vec();
    old.sort_by_key(|m| (running(m), std::cmp::Reverse(m.creation_timestamp()), m.name_any()));
    let mut names = Vec::new();
    for m in old {
        if running(m) {
            if budget == 0 {
                break;
            }
            budget -= 1;
        }
        names.push(m.name_any());
    }
    if names.is_empty() {
        SetStep::Wait
    } else {
        SetStep::Remove { names }
    }
}

fn set_status(set: &MachineSet, kept: &[&Machine], updated: usize, hash: String) -> MachineSetStatus {
    let count = |n: usize| Some(i32::try_from(n).unwrap_or(i32::MAX));
    MachineSetStatus {
        observed_generation: set.metadata.generation,
        replicas: count(kept.len()),
        ready_replicas: count(kept.iter().filter(|m| running(m)).count()),
        updated_replicas: count(updated),
        template_hash: Some(hash),
    }
}

/// The set's scale-in record for each uid in `uids` (value: the member's name, for a reader),
/// as annotations to merge.
pub fn scale_in_records(uids: &[String], members: &[&Machine]) -> BTreeMap<String, String> {
    uids.iter()
        .map(|uid| {
            let name = members
                .iter()
                .find(|m| m.uid().as_deref() == Some(uid.as_str()))
                .map(|m| m.name_any())
                .unwrap_or_default();
            (scaled_in_annotation(uid), name)
        })
        .collect()
}

#[cfg(test)]
#[path = "machineset_tests.rs"]
mod tests;
