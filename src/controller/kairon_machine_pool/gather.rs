//! The plan's instances from what the caches hold: the members of the pool's sets, the pool's
//! KaironMachines and the pool's Machines, joined by name (all three share the VM's name).
//! Pure: the reconciler passes what it read.

use std::collections::BTreeMap;

use kube::ResourceExt;

use super::plan::{Instance, Km, PoolMachine, Vm};
use crate::api::KaironMachine;
use crate::api::conditions::{self, READY, reason};
use crate::capi::{self, DELETE_MACHINE_ANNOTATION, OWNER_REMEDIATED};
use crate::kairon::machineset::MachineSet;
use crate::kairon::set_observe::{awaits_start, is_member_of, is_released, set_of};
use crate::kairon::{Machine, observe, phase};

/// Joins `vms` (any Kairon Machines; only members of `sets`, the pool's, count), `kms` and
/// `machines` (the pool's, as selected by the caller) into instances, sorted by name. Members
/// of any set but the one named `current` are outdated.
pub fn instances(
    sets: &[&MachineSet],
    current: &str,
    vms: &[&Machine],
    kms: &[&KaironMachine],
    machines: &[&capi::Machine],
) -> Vec<Instance> {
    let mut by_name: BTreeMap<String, Instance> = BTreeMap::new();
    for vm in vms.iter().filter(|vm| sets.iter().any(|set| is_member_of(vm, set))) {
        let phase = observe::effective_phase(vm);
        upsert(&mut by_name, vm.name_any()).vm = Some(Vm {
            deleting: vm.metadata.deletion_timestamp.is_some() || is_released(vm),
            // Unknown: a failed runtime Kairon leaves as it is. A Stopped, Halted or Paused VM
            // is someone's decision: a MachineHealthCheck decides from its Node.
            broken: phase == phase::UNKNOWN,
            outdated: set_of(vm) != Some(current),
            awaits_start: awaits_start(vm),
        });
    }
    for km in kms {
        upsert(&mut by_name, km.name_any()).km = Some(Km { vm_gone: vm_gone(km) });
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

/// Whether the KaironMachine found its VM gone (it never makes another one).
fn vm_gone(km: &KaironMachine) -> bool {
    let conds = km
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    conditions::get(conds, READY).is_some_and(|c| c.status == "False" && c.reason == reason::INSTANCE_NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::{Decided, Status};
    use crate::kairon::machineset::{MACHINESET_LABEL, TEMPLATE_HASH_LABEL};
    use crate::kairon::set_observe::RELEASED;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn set(name: &str) -> MachineSet {
        let mut s = MachineSet::new(name, Default::default());
        s.metadata.namespace = Some("ns".into());
        s
    }

    fn vm(name: &str, set: &str, hash: &str, phase: &str, deleting: bool) -> Machine {
        let mut vm = Machine::new(name, Default::default());
        vm.metadata.namespace = Some("ns".into());
        vm.metadata.labels = Some(
            [(MACHINESET_LABEL, set), (TEMPLATE_HASH_LABEL, hash)]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
        );
        vm.status = Some(crate::kairon::MachineStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        if deleting {
            vm.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        }
        vm
    }

    fn km(name: &str, gone: bool) -> KaironMachine {
        let mut km = KaironMachine::new(name, Default::default());
        km.metadata.namespace = Some("ns".into());
        if gone {
            let mut conds = vec![];
            conditions::set(
                &mut conds,
                Decided::new(READY, Status::False, reason::INSTANCE_NOT_FOUND, "gone"),
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
        let mut m = capi::Machine::new(name, Default::default());
        m.metadata.namespace = Some("ns".into());
        m.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).expect("time")));
        if marked {
            m.metadata.annotations = Some([(DELETE_MACHINE_ANNOTATION.to_string(), "yes".to_string())].into());
        }
        m.status = Some(capi::MachineStatus {
            conditions: Some(
                conds
                    .iter()
                    .map(|(t, s)| capi::ClusterCondition {
                        type_: t.to_string(),
                        status: s.to_string(),
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        m
    }

    #[test]
    fn members_kaironmachines_and_machines_are_joined_by_name() {
        let mut fresh = vm("f", "pool-new", "h9", "", false);
        fresh.status = None;
        fresh.spec.power_state = Some("Stopped".into());
        let vms = [
            vm("a", "pool-new", "h2", "Running", false),
            vm("b", "pool-old", "h1", "Unknown", false),
            vm("c", "pool-new", "h2", "Running", true),
            vm("d", "pool-new", RELEASED, "Running", false),
            vm("e", "pool-new", "h2", "Stopped", false),
            fresh,
            vm("x", "other", "h2", "Running", false),
        ];
        let kms = [km("a", false), km("b", false), km("g", true)];
        let machines = [
            machine("a", 10, true, &[(AVAILABLE, "True")]),
            machine("b", 5, false, &[(AVAILABLE, "False"), (OWNER_REMEDIATED, "False")]),
            machine("g", 1, false, &[]),
        ];
        let (new, old) = (set("pool-new"), set("pool-old"));
        let got = instances(
            &[&new, &old],
            "pool-new",
            &vms.iter().collect::<Vec<_>>(),
            &kms.iter().collect::<Vec<_>>(),
            &machines.iter().collect::<Vec<_>>(),
        );
        let names: Vec<&str> = got.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            ["a", "b", "c", "d", "e", "f", "g"],
            "another set's VM is no instance"
        );
        let a = &got[0];
        assert_eq!(
            a.vm,
            Some(Vm {
                deleting: false,
                broken: false,
                outdated: false,
                awaits_start: false,
            })
        );
        assert_eq!(a.km, Some(Km { vm_gone: false }));
        let am = a.machine.as_ref().expect("machine");
        assert!(am.delete_annotation && am.available && !am.remediate && !am.deleting);
        assert_eq!(am.created, 10);
        let b = &got[1];
        assert_eq!(
            b.vm,
            Some(Vm {
                deleting: false,
                broken: true,
                outdated: true,
                awaits_start: false,
            }),
            "a member of the older set is outdated"
        );
        let bm = b.machine.as_ref().expect("machine");
        assert!(bm.remediate && !bm.available);
        let c = &got[2];
        assert!(
            c.vm.as_ref().is_some_and(|v| v.deleting && !v.broken),
            "deleting reads as Terminating, not broken"
        );
        assert!(c.km.is_none() && c.machine.is_none());
        assert!(
            got[3].vm.as_ref().is_some_and(|v| v.deleting),
            "released: on its way out"
        );
        assert!(
            got[4].vm.as_ref().is_some_and(|v| !v.broken && !v.awaits_start),
            "stopped after it ran: not broken, not the pool's to start"
        );
        assert!(got[5].vm.as_ref().is_some_and(|v| v.awaits_start && !v.broken));
        let g = &got[6];
        assert!(g.vm.is_none());
        assert_eq!(g.km, Some(Km { vm_gone: true }));
    }
}
