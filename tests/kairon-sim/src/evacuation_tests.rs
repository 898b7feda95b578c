//! Table tests of [`super`]: the plan per VM by strategy, the deadline, one migration at a
//! time per host, the Host's status and cancellation.

use super::*;
use crate::migration::NOT_MIGRATABLE_ANNOTATION;
use capkr::kairon::maintenance::{HostMaintenance, HostSpec, MachineMigrationStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

const HOST: &str = "h1";

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + s).unwrap()
}

struct Vm {
    name: &'static str,
    phase: &'static str,
    strategy: Option<&'static str>,
    migratable: bool,
    evacuation_deadline: Option<i64>,
}

const fn vm_(name: &'static str, strategy: Option<&'static str>, migratable: bool) -> Vm {
    Vm {
        name,
        phase: phase::RUNNING,
        strategy,
        migratable,
        evacuation_deadline: None,
    }
}

fn machine(v: &Vm) -> Machine {
    Machine {
        metadata: ObjectMeta {
            name: Some(v.name.into()),
            namespace: Some("ns".into()),
            annotations: Some(
                (!v.migratable)
                    .then(|| (NOT_MIGRATABLE_ANNOTATION.to_string(), "true".to_string()))
                    .into_iter()
                    .chain(
                        v.strategy
                            .map(|s| (EVICTION_STRATEGY_ANNOTATION.to_string(), s.to_string())),
                    )
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Default::default(),
        status: Some(MachineStatus {
            phase: Some(v.phase.into()),
            node_name: Some(HOST.into()),
            runtime_id: Some("rt-1".into()),
            evacuation: v.evacuation_deadline.map(|d| Evacuation {
                host_name: HOST.into(),
                reason: Some(HOST_MAINTENANCE.into()),
                requested_at: Some(rfc3339(t(0))),
                deadline: Some(rfc3339(t(d))),
            }),
            ..Default::default()
        }),
    }
}

/// `_completed`: when it ended (Kairon records no time; retries count from `created`).
fn migration(vm: &str, phase: Option<&str>, created: i64, _completed: Option<i64>) -> MachineMigration {
    let mut m = evacuation_migration(
        &Key {
            namespace: "ns".into(),
            name: vm.into(),
        },
        HOST,
    );
    m.metadata.creation_timestamp = Some(Time(t(created)));
    m.status = phase.map(|p| MachineMigrationStatus {
        phase: Some(p.into()),
        message: Some("no target node".into()),
        ..Default::default()
    });
    m
}

fn host(grace: Option<i64>, started: Option<i64>, maintenance: bool) -> Host {
    let mut h = Host::new(
        HOST,
        HostSpec {
            unschedulable: None,
            maintenance: maintenance.then(|| HostMaintenance {
                reason: Some("firmware".into()),
                evacuation_grace_period_seconds: grace,
            }),
        },
    );
    h.status = started.map(|s| HostStatus {
        phase: Some(host_phase::EVACUATING.into()),
        maintenance_started_at: Some(rfc3339(t(s))),
        ..Default::default()
    });
    h
}

type Check = Box<dyn Fn(&VmPlan) -> bool>;

#[test]
fn each_vm_is_evacuated_as_its_strategy_says() {
    use eviction::*;
    let deadline = |d: i64| Vm {
        evacuation_deadline: Some(d),
        ..vm_("m", Some(EXTERNAL), true)
    };
    let stop_deadline =
        |p: &VmPlan| matches!(p, VmPlan::Stop { reason, .. } if reason == phase::EVACUATION_DEADLINE_EXCEEDED);
    #[rustfmt::skip]
    let cases: Vec<(&str, Vm, Option<MachineMigration>, Check)> = vec![
        ("absent: Kairon's default, migrated", vm_("m", None, true), None, Box::new(|p| *p == VmPlan::Migrate)),
        ("LiveMigrateIfPossible, migratable", vm_("m", Some(LIVE_MIGRATE_IF_POSSIBLE), true), None, Box::new(|p| *p == VmPlan::Migrate)),
        ("LiveMigrateIfPossible, not migratable: as External", vm_("m", Some(LIVE_MIGRATE_IF_POSSIBLE), false), None, Box::new(|p| *p == VmPlan::RequestEvacuation)),
        ("LiveMigrate, migratable", vm_("m", Some(LIVE_MIGRATE), true), None, Box::new(|p| *p == VmPlan::Migrate)),
        ("LiveMigrate, not migratable: waits", vm_("m", Some(LIVE_MIGRATE), false), None, Box::new(|p| matches!(p, VmPlan::Blocked(_)))),
        ("External: the owner is asked", vm_("m", Some(EXTERNAL), true), None, Box::new(|p| *p == VmPlan::RequestEvacuation)),
        ("None: stopped at once", vm_("m", Some(NONE), true), None, Box::new(|p| matches!(p, VmPlan::Stop { reason, .. } if reason == HOST_MAINTENANCE))),
        ("asked, before the deadline", deadline(21), None, Box::new(|p| matches!(p, VmPlan::AwaitOwner { .. }))),
        ("asked, at the deadline: stopped", deadline(20), None, Box::new(stop_deadline)),
        ("asked, past the deadline: stopped", deadline(5), None, Box::new(stop_deadline)),
        ("booting: later", Vm { phase: phase::STARTING, ..vm_("m", Some(NONE), true) }, None, Box::new(|p| *p == VmPlan::Wait)),
        ("migration under way", vm_("m", None, true), Some(migration("m", Some(migration_phase::RUNNING), 0, None)), Box::new(|p| *p == VmPlan::Migrating)),
        ("migration not started yet", vm_("m", None, true), Some(migration("m", None, 0, None)), Box::new(|p| *p == VmPlan::Migrating)),
        ("LiveMigrateIfPossible, migration failed: as External", vm_("m", None, true), Some(migration("m", Some(migration_phase::FAILED), 0, Some(1))), Box::new(|p| *p == VmPlan::RequestEvacuation)),
        ("LiveMigrate, migration failed: waits", vm_("m", Some(LIVE_MIGRATE), true), Some(migration("m", Some(migration_phase::FAILED), 0, Some(1))), Box::new(|p| matches!(p, VmPlan::Blocked(_)))),
        ("migrated but back on the host: again", vm_("m", None, true), Some(migration("m", Some(migration_phase::SUCCEEDED), 0, Some(1))), Box::new(|p| *p == VmPlan::Migrate)),
    ];
    for (name, v, mig, check) in cases {
        let got = vm_plan(&machine(&v), HOST, mig.as_ref(), t(20));
        assert!(check(&got), "{name}: {got:?}");
    }
}

#[test]
fn the_strategy_is_the_annotation_and_absent_or_empty_is_kairons_default() {
    let mut m = machine(&vm_("m", Some(eviction::EXTERNAL), true));
    assert_eq!(eviction_strategy(&m), eviction::EXTERNAL);
    m.annotations_mut()
        .insert(EVICTION_STRATEGY_ANNOTATION.into(), " None ".into());
    assert_eq!(eviction_strategy(&m), eviction::NONE);
    m.annotations_mut()
        .insert(EVICTION_STRATEGY_ANNOTATION.into(), String::new());
    assert_eq!(eviction_strategy(&m), eviction::LIVE_MIGRATE_IF_POSSIBLE);
    m.annotations_mut().remove(EVICTION_STRATEGY_ANNOTATION);
    assert_eq!(eviction_strategy(&m), eviction::LIVE_MIGRATE_IF_POSSIBLE);
}

#[test]
fn an_evacuation_request_for_another_host_is_not_this_hosts() {
    let mut m = machine(&Vm {
        evacuation_deadline: Some(0),
        ..vm_("m", None, true)
    });
    if let Some(e) = m.status.as_mut().and_then(|s| s.evacuation.as_mut()) {
        e.host_name = "h9".into();
    }
    assert_eq!(vm_plan(&m, HOST, None, t(20)), VmPlan::Migrate);
}

fn plan(h: &Host, vms: &[Vm], migrations: &[MachineMigration], now: i64) -> HostPlan {
    let machines: Vec<Machine> = vms.iter().map(machine).collect();
    let refs: Vec<&Machine> = machines.iter().collect();
    let migs: Vec<&MachineMigration> = migrations.iter().collect();
    plan_host(h, &refs, &migs, &BTreeSet::new(), t(now), &mut |_| Ok(()))
}

fn key(name: &str) -> Key {
    Key {
        namespace: "ns".into(),
        name: name.into(),
    }
}

#[test]
fn maintenance_is_first_recorded_on_the_host() {
    let p = plan(&host(Some(20), None, true), &[vm_("a", None, true)], &[], 3);
    assert_eq!(p.status.phase.as_deref(), Some(host_phase::EVACUATING));
    assert_eq!(p.status.maintenance_started_at, Some(rfc3339(t(3))));
    assert_eq!((p.migrate, p.vm_actions.len()), (None, 0));
}

#[test]
fn one_migration_at_a_time_per_host() {
    let h = host(Some(20), Some(0), true);
    let vms = [vm_("a", None, true), vm_("b", None, true), vm_("c", None, true)];
    assert_eq!(plan(&h, &vms, &[], 1).migrate, Some(key("a")));
    let a_running = migration("a", Some(migration_phase::RUNNING), 1, None);
    assert_eq!(plan(&h, &vms, &[a_running], 2).migrate, None);
    let a_done = migration("a", Some(migration_phase::SUCCEEDED), 1, Some(3));
    assert_eq!(
        plan(&h, &vms[1..], std::slice::from_ref(&a_done), 4).migrate,
        Some(key("b"))
    );
    // Someone else's migration of a VM on the host counts too.
    let machines: Vec<Machine> = vms[1..].iter().map(machine).collect();
    let refs: Vec<&Machine> = machines.iter().collect();
    let moving: BTreeSet<Key> = [key("c")].into();
    assert_eq!(
        plan_host(&h, &refs, &[&a_done], &moving, t(4), &mut |_| Ok(())).migrate,
        None
    );
}

#[test]
fn evacuation_requests_carry_the_grace_period() {
    let cases = [(Some(20), 25), (None, 5 + DEFAULT_GRACE_SECONDS), (Some(0), 5)];
    for (grace, deadline) in cases {
        let p = plan(
            &host(grace, Some(0), true),
            &[vm_("a", Some(eviction::EXTERNAL), true)],
            &[],
            5,
        );
        let want = Evacuation {
            host_name: HOST.into(),
            reason: Some(HOST_MAINTENANCE.into()),
            requested_at: Some(rfc3339(t(5))),
            deadline: Some(rfc3339(t(deadline))),
        };
        assert_eq!(
            p.vm_actions,
            vec![(key("a"), VmAction::RequestEvacuation(want))],
            "{grace:?}"
        );
    }
}

#[test]
fn host_status_follows_the_evacuation() {
    let h = host(Some(20), Some(0), true);
    let busy = plan(&h, &[vm_("a", Some(eviction::LIVE_MIGRATE), false)], &[], 5);
    assert_eq!(busy.status.phase.as_deref(), Some(host_phase::EVACUATING));
    assert_eq!(busy.status.machines, Some(1));
    let message = busy.status.message.unwrap_or_default();
    assert!(
        message.contains("a (LiveMigrate but cannot be migrated live"),
        "{message}"
    );

    let empty = plan(&h, &[], &[], 7);
    assert_eq!(empty.status.phase.as_deref(), Some(host_phase::IN_MAINTENANCE));
    assert_eq!(empty.status.emptied_at, Some(rfc3339(t(7))));
    assert_eq!(empty.status.maintenance_started_at, Some(rfc3339(t(0))));
    assert_eq!(empty.status.machines, Some(0));
    // Emptied once: the time stays.
    let mut h2 = h.clone();
    h2.status = Some(empty.status);
    assert_eq!(plan(&h2, &[], &[], 9).status.emptied_at, Some(rfc3339(t(7))));
}

#[test]
fn cancelling_clears_requests_and_unstarted_migrations() {
    let h = host(None, Some(0), false);
    let vms = [
        Vm {
            evacuation_deadline: Some(30),
            ..vm_("a", Some(eviction::EXTERNAL), true)
        },
        vm_("b", None, true),
        vm_("c", None, true),
    ];
    let migs = [
        migration("b", None, 1, None),
        migration("c", Some(migration_phase::RUNNING), 1, None),
    ];
    let p = plan(&h, &vms, &migs, 5);
    assert_eq!(p.vm_actions, vec![(key("a"), VmAction::ClearEvacuation)]);
    assert_eq!(p.delete_migrations, vec![key("evacuate-b")]);
    assert_eq!(p.status.phase.as_deref(), Some(host_phase::SCHEDULABLE));
    assert_eq!(p.status.maintenance_started_at, None);
    assert_eq!(p.migrate, None);
}

#[test]
fn records_of_an_earlier_maintenance_are_removed_and_do_not_count() {
    let h = host(Some(20), Some(100), true);
    let old = migration("a", Some(migration_phase::FAILED), 10, Some(11));
    let p = plan(&h, &[vm_("a", None, true)], &[old], 101);
    assert_eq!(p.delete_migrations, vec![key("evacuate-a")]);
    assert_eq!(p.migrate, Some(key("a")));
}

#[test]
fn a_live_migrate_vm_gets_another_migration_after_a_while() {
    let h = host(Some(20), Some(0), true);
    let failed = migration("a", Some(migration_phase::FAILED), 1, Some(2));
    let vms = [vm_("a", Some(eviction::LIVE_MIGRATE), true)];
    assert!(
        plan(&h, &vms, std::slice::from_ref(&failed), 5)
            .delete_migrations
            .is_empty()
    );
    assert_eq!(plan(&h, &vms, &[failed], 12).delete_migrations, vec![key("evacuate-a")]);
}

#[test]
fn a_pending_migration_whose_vm_left_is_removed() {
    let h = host(Some(20), Some(0), true);
    let p = plan(&h, &[], &[migration("gone", None, 1, None)], 5);
    assert_eq!(p.delete_migrations, vec![key("evacuate-gone")]);
}

#[test]
fn a_stopped_vm_leaves_its_host_but_keeps_its_address() {
    let mut m = machine(&Vm {
        evacuation_deadline: Some(0),
        ..vm_("a", None, true)
    });
    if let Some(s) = m.status.as_mut() {
        s.guest_ip = Some("10.0.0.2".into());
        s.guest_ips = Some(vec!["10.0.0.2".into()]);
        s.host_labels = Some([("zone".to_string(), "a".to_string())].into());
    }
    let s = stopped_status(&m, phase::EVACUATION_DEADLINE_EXCEEDED, DEADLINE_MESSAGE, t(30));
    assert_eq!(s.phase.as_deref(), Some(phase::STOPPED));
    let booted = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == crate::sim::CONDITION_READY);
    assert_eq!(booted.map(|c| c.status.as_str()), Some("False"));
    assert_eq!((s.node_name, s.host_labels, s.evacuation), (None, None, None));
    assert_eq!(s.runtime_id, None, "the runtime is gone");
    assert_eq!(s.guest_ip.as_deref(), Some("10.0.0.2"));
    assert!(s.guest_ips.is_some());
}

#[test]
fn migration_names_are_valid_object_names() {
    assert_eq!(evacuation_migration_name("vm-1"), "evacuate-vm-1");
    assert!(evacuation_migration_name(&"x".repeat(300)).len() <= 253);
}
