//! The plan's members from what the caches hold: the KaironMachines of the pool's MachinePool
//! and its Machines, joined by name (CAPI names the Machine after the KaironMachine), and the
//! KaironMachines the pool created that the cache does not show yet. Pure: the reconciler
//! passes what it read.
//!
//! A pool reconciles on its members' events, so a pool of N members gathers N members about N
//! times while it scales: the join walks the sorted lists once, comparing names in place,
//! rather than building a map of owned names.

use std::cmp::Ordering;
use std::iter::Peekable;

use super::plan::{Instance, Km, PoolMachine};
use super::revision::REVISION_LABEL;
use crate::api::KaironMachine;
use crate::api::conditions::{self, READY, reason};
use crate::capi::{self, DELETE_MACHINE_ANNOTATION, OWNER_REMEDIATED};

/// Joins `kms` and `machines` (the MachinePool's, as selected by the caller, each sorted by
/// name) and `pending` (the names of KaironMachines created but not yet cached, in any order)
/// into members, sorted by name. A KaironMachine of another revision than `revision` is
/// outdated.
pub fn instances(
    revision: &str,
    kms: &[&KaironMachine],
    machines: &[&capi::Machine],
    pending: &[String],
) -> Vec<Instance> {
    debug_assert!(kms.is_sorted_by_key(|km| name(&km.metadata)));
    debug_assert!(machines.is_sorted_by_key(|m| name(&m.metadata)));
    let mut pending: Vec<&str> = pending
        .iter()
        .map(String::as_str)
        .filter(|p| kms.binary_search_by(|km| name(&km.metadata).cmp(p)).is_err())
        .collect();
    pending.sort_unstable();
    pending.dedup();
    let cached = kms.iter().map(|km| (name(&km.metadata), km_of(revision, km)));
    let created = pending.into_iter().map(|p| (p, ()));
    // The cache's, when it has the name; a KaironMachine just created is current and well.
    let km_side = merge(cached, created).map(|(name, (cached, _))| (name, cached.unwrap_or_default()));
    let machine_side = machines.iter().map(|m| (name(&m.metadata), machine_of(m)));
    merge(km_side, machine_side)
        .map(|(name, (km, machine))| Instance {
            name: name.to_string(),
            km,
            machine,
        })
        .collect()
}

fn name(meta: &kube::api::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

fn km_of(revision: &str, km: &KaironMachine) -> Km {
    let ready = km
        .status
        .as_ref()
        .and_then(|s| conditions::get(s.conditions.as_deref().unwrap_or_default(), READY))
        .filter(|c| c.status == "False");
    let why = ready.map(|c| c.reason.as_str());
    Km {
        deleting: km.metadata.deletion_timestamp.is_some(),
        vm_gone: why == Some(reason::INSTANCE_NOT_FOUND),
        // Unknown: a failed runtime Kairon leaves as it is. A Stopped, Halted or Paused VM
        // is someone's decision: a MachineHealthCheck decides from its Node.
        broken: why == Some(reason::INSTANCE_STATE_UNKNOWN),
        outdated: capi::label(&km.metadata, REVISION_LABEL) != Some(revision),
    }
}

fn machine_of(m: &capi::Machine) -> PoolMachine {
    PoolMachine {
        deleting: m.is_deleting(),
        delete_annotation: capi::has_annotation(&m.metadata, DELETE_MACHINE_ANNOTATION),
        remediate: m.condition(OWNER_REMEDIATED) == Some("False"),
        available: m.condition(AVAILABLE) == Some("True"),
        created: m.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
    }
}

/// The full outer join of two sequences sorted by name (names unique within each): each name
/// once, in order, with what each side has of it.
fn merge<'a, A, B>(
    left: impl Iterator<Item = (&'a str, A)>,
    right: impl Iterator<Item = (&'a str, B)>,
) -> impl Iterator<Item = (&'a str, (Option<A>, Option<B>))> {
    Merge {
        left: left.peekable(),
        right: right.peekable(),
    }
}

struct Merge<L: Iterator, R: Iterator> {
    left: Peekable<L>,
    right: Peekable<R>,
}

impl<'a, A, B, L, R> Iterator for Merge<L, R>
where
    L: Iterator<Item = (&'a str, A)>,
    R: Iterator<Item = (&'a str, B)>,
{
    type Item = (&'a str, (Option<A>, Option<B>));

    fn next(&mut self) -> Option<Self::Item> {
        let order = match (self.left.peek(), self.right.peek()) {
            (None, None) => return None,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((l, _)), Some((r, _))) => l.cmp(r),
        };
        Some(match order {
            Ordering::Less => {
                let (name, a) = self.left.next()?;
                (name, (Some(a), None))
            }
            Ordering::Greater => {
                let (name, b) = self.right.next()?;
                (name, (None, Some(b)))
            }
            Ordering::Equal => {
                let (name, a) = self.left.next()?;
                let (_, b) = self.right.next()?;
                (name, (Some(a), Some(b)))
            }
        })
    }
}

/// The Machine condition that says its Node is ready and has been for `minReadySeconds`.
pub const AVAILABLE: &str = "Available";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::{Decided, Status};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn km(name: &str, revision: &str, ready: Option<&'static str>) -> KaironMachine {
        let mut km = KaironMachine::new(name, Default::default());
        km.metadata.namespace = Some("ns".into());
        km.metadata.labels = Some([(REVISION_LABEL.to_string(), revision.to_string())].into());
        if let Some(why) = ready {
            let mut conds = vec![];
            conditions::set(
                &mut conds,
                Decided::new(READY, Status::False, why, "x"),
                None,
                &Time(Timestamp::UNIX_EPOCH),
            );
            km.status = Some(crate::api::KaironMachineStatus {
                conditions: Some(conds),
                ..Default::default()
            });
        }
        km
    }

    fn machine(name: &str, created: i64, marked: bool, conds: &[(&str, &str)]) -> capi::Machine {
        let mut m: capi::Machine = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"clusterName": "c"},
            "status": {"conditions": conds.iter().map(|(t, s)| serde_json::json!({
                "type": t, "status": s, "reason": "R", "lastTransitionTime": "2026-01-01T00:00:00Z"
            })).collect::<Vec<_>>()}
        }))
        .unwrap();
        m.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        if marked {
            m.metadata.annotations = Some([(DELETE_MACHINE_ANNOTATION.to_string(), String::new())].into());
        }
        m
    }

    #[test]
    fn the_join_takes_each_name_once_in_order_from_either_side() {
        let left = [("a", 1), ("c", 3), ("e", 5)];
        let right = [("b", 'b'), ("c", 'c'), ("f", 'f')];
        let got: Vec<_> = merge(left.into_iter(), right.into_iter()).collect();
        assert_eq!(
            got,
            [
                ("a", (Some(1), None)),
                ("b", (None, Some('b'))),
                ("c", (Some(3), Some('c'))),
                ("e", (Some(5), None)),
                ("f", (None, Some('f'))),
            ]
        );
        let none: [(&str, ()); 0] = [];
        assert_eq!(merge(none.into_iter(), none.into_iter()).count(), 0);
    }

    #[test]
    fn pending_creates_in_any_order_fall_in_place_once() {
        let kms = [km("b", "r", None), km("d", "r", None)];
        let machines = [machine("c", 1, false, &[]), machine("e", 2, false, &[])];
        let pending = ["e", "a", "c", "a", "d"].map(String::from);
        let got = instances(
            "r",
            &kms.iter().collect::<Vec<_>>(),
            &machines.iter().collect::<Vec<_>>(),
            &pending,
        );
        let shape: Vec<(&str, bool, bool)> = got
            .iter()
            .map(|i| (i.name.as_str(), i.km.is_some(), i.machine.is_some()))
            .collect();
        assert_eq!(
            shape,
            [
                ("a", true, false),
                ("b", true, false),
                ("c", true, true),
                ("d", true, false),
                ("e", true, true),
            ]
        );
    }

    #[test]
    fn kaironmachines_machines_and_pending_creates_are_joined_by_name() {
        let kms = [
            km("a", "r2", None),
            km("b", "r1", None),
            km("c", "r2", Some(reason::INSTANCE_NOT_FOUND)),
            km("d", "r2", Some(reason::INSTANCE_STATE_UNKNOWN)),
        ];
        let machines = [
            machine("a", 5, true, &[(AVAILABLE, "True")]),
            machine("b", 3, false, &[(OWNER_REMEDIATED, "False")]),
            machine("z", 1, false, &[]),
        ];
        let got = instances(
            "r2",
            &kms.iter().collect::<Vec<_>>(),
            &machines.iter().collect::<Vec<_>>(),
            &["e".to_string(), "a".to_string()],
        );
        let names: Vec<&str> = got.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d", "e", "z"]);
        let a = &got[0];
        assert_eq!(
            a.km,
            Some(Km::default()),
            "current, and the cache's, not the pending one's"
        );
        let m = a.machine.as_ref().expect("a's Machine");
        assert!(m.delete_annotation && m.available && !m.remediate);
        assert_eq!(m.created, 5);
        assert!(got[1].km.as_ref().unwrap().outdated, "another revision");
        assert!(got[1].machine.as_ref().unwrap().remediate);
        assert!(got[2].km.as_ref().unwrap().vm_gone);
        assert!(got[3].km.as_ref().unwrap().broken);
        assert_eq!((got[4].km.clone(), got[4].machine.clone()), (Some(Km::default()), None));
        assert_eq!(got[5].km, None, "a Machine without a KaironMachine");
    }
}
