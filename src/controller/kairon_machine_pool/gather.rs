//! The plan's members from what the caches hold: the KaironMachines of the pool's MachinePool
//! and its Machines, joined by name (CAPI names the Machine after the KaironMachine), and the
//! KaironMachines the pool created that the cache does not show yet. Pure: the reconciler
//! passes what it read.

use std::collections::BTreeMap;

use kube::ResourceExt;

use super::plan::{Instance, Km, PoolMachine};
use super::revision::REVISION_LABEL;
use crate::api::KaironMachine;
use crate::api::conditions::{self, READY, reason};
use crate::capi::{self, DELETE_MACHINE_ANNOTATION, OWNER_REMEDIATED};

/// Joins `kms` and `machines` (the MachinePool's, as selected by the caller) and `pending` (the
/// names of KaironMachines created but not yet cached) into members, sorted by name. A
/// KaironMachine of another revision than `revision` is outdated.
pub fn instances(
    revision: &str,
    kms: &[&KaironMachine],
    machines: &[&capi::Machine],
    pending: &[String],
) -> Vec<Instance> {
    let mut by_name: BTreeMap<String, Instance> = BTreeMap::new();
    for km in kms {
        let ready = km
            .status
            .as_ref()
            .and_then(|s| conditions::get(s.conditions.as_deref().unwrap_or_default(), READY))
            .filter(|c| c.status == "False");
        let why = ready.map(|c| c.reason.as_str());
        upsert(&mut by_name, km.name_any()).km = Some(Km {
            deleting: km.metadata.deletion_timestamp.is_some(),
            vm_gone: why == Some(reason::INSTANCE_NOT_FOUND),
            // Unknown: a failed runtime Kairon leaves as it is. A Stopped, Halted or Paused VM
            // is someone's decision: a MachineHealthCheck decides from its Node.
            broken: why == Some(reason::INSTANCE_STATE_UNKNOWN),
            outdated: km.labels().get(REVISION_LABEL).map(String::as_str) != Some(revision),
        });
    }
    for name in pending {
        by_name.entry(name.clone()).or_insert_with(|| Instance {
            name: name.clone(),
            km: Some(Km::default()),
            machine: None,
        });
    }
    for m in machines {
        upsert(&mut by_name, m.name_any()).machine = Some(PoolMachine {
            deleting: m.is_deleting(),
            delete_annotation: capi::has_annotation(&m.metadata, DELETE_MACHINE_ANNOTATION),
            remediate: m.condition(OWNER_REMEDIATED) == Some("False"),
            available: m.condition(AVAILABLE) == Some("True"),
            created: m.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
        });
    }
    by_name.into_values().collect()
}

/// The Machine condition that says its Node is ready and has been for `minReadySeconds`.
pub const AVAILABLE: &str = "Available";

fn upsert(by_name: &mut BTreeMap<String, Instance>, name: String) -> &mut Instance {
    by_name.entry(name.clone()).or_insert_with(|| Instance {
        name,
        ..Default::default()
    })
}

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
