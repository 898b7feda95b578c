use super::*;
use crate::placement::Host;
use crate::sim::Key;
use capkr::kairon::maintenance::MachineMigrationSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use migration_phase::*;
use std::collections::BTreeMap;

fn vm(phase: &str, node: Option<&str>) -> Machine {
    Machine {
        metadata: ObjectMeta {
            name: Some("vm".into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        spec: capkr::kairon::MachineSpec {
            node_name: node.map(Into::into),
            power_state: Some(power_state::RUNNING.into()),
            ..Default::default()
        },
        status: Some(MachineStatus {
            phase: Some(phase.into()),
            node_name: node.map(Into::into),
            runtime_id: Some("rt-1".into()),
            ..Default::default()
        }),
    }
}

fn not_migratable(mut m: Machine) -> Machine {
    m.annotations_mut()
        .insert(NOT_MIGRATABLE_ANNOTATION.into(), "true".into());
    m
}

fn deleting(mut m: Machine) -> Machine {
    m.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    m
}

fn powered(mut m: Machine, power: &str) -> Machine {
    m.spec.power_state = Some(power.into());
    m
}

fn on(mut m: Machine, spec: Option<&str>, status: Option<&str>) -> Machine {
    m.spec.node_name = spec.map(Into::into);
    m.status.as_mut().unwrap().node_name = status.map(Into::into);
    m
}

fn mig(strategy: Option<&str>, target: Option<&str>, phase: Option<&str>) -> MachineMigration {
    let mut m = MachineMigration::new(
        "mig",
        MachineMigrationSpec {
            machine_name: "vm".into(),
            strategy: strategy.map(Into::into),
            target_node: target.map(Into::into),
        },
    );
    m.metadata.namespace = Some("ns".into());
    m.status = phase.map(|p| MachineMigrationStatus {
        phase: Some(p.into()),
        source_node: Some("h1".into()),
        target_node: Some("h2".into()),
        ..Default::default()
    });
    m
}

fn placement() -> Placement {
    let host = |name: &str| Host {
        name: name.into(),
        labels: BTreeMap::new(),
    };
    let mut p = Placement::new(vec![host("h1"), host("h2"), host("h3")], 1);
    let key = |n: &str| Key {
        namespace: "ns".into(),
        name: n.into(),
    };
    p.assign(&key("vm"), "h1");
    p.assign(&key("other"), "h3");
    p
}

fn start(strategy: &'static str) -> MigrationStep {
    MigrationStep::Start {
        strategy,
        source: "h1".into(),
        target: "h2".into(),
    }
}

fn ends(phase: &'static str) -> impl Fn(&MigrationStep) -> bool {
    move |s| matches!(s, MigrationStep::End { phase: p, .. } if *p == phase)
}

type Check = Box<dyn Fn(&MigrationStep) -> bool>;
/// Name, migration, its Machine, another one of it started, the transfer done, the check.
type Case = (&'static str, MachineMigration, Option<Machine>, bool, bool, Check);

fn is(step: MigrationStep) -> Check {
    Box::new(move |s| *s == step)
}

#[test]
fn migration_steps() {
    let running = vm(phase::RUNNING, Some("h1"));
    let live = Some(migration_strategy::LIVE);
    let h2 = || "h2".to_string();
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        // Accepted or not.
        ("auto is cold: stopping to the only node with room", mig(None, None, None), Some(running.clone()), false, false, is(start(migration_strategy::COLD))),
        ("cold named", mig(Some("cold"), None, None), Some(running.clone()), false, false, is(start(migration_strategy::COLD))),
        ("live", mig(live, None, None), Some(running.clone()), false, false, is(start(migration_strategy::LIVE))),
        ("pending starts too", mig(live, None, Some(PENDING)), Some(running.clone()), false, false, is(start(migration_strategy::LIVE))),
        ("named target", mig(live, Some("h2"), None), Some(running.clone()), false, false, is(start(migration_strategy::LIVE))),
        ("named target full", mig(live, Some("h3"), None), Some(running.clone()), false, false, Box::new(ends(BLOCKED))),
        ("named target unknown", mig(None, Some("hx"), None), Some(running.clone()), false, false, Box::new(ends(BLOCKED))),
        ("no machine", mig(None, None, None), None, false, false, Box::new(ends(BLOCKED))),
        ("machine being deleted", mig(None, None, None), Some(deleting(running.clone())), false, false, Box::new(ends(BLOCKED))),
        ("not on a node", mig(None, None, None), Some(on(running.clone(), None, None)), false, false, Box::new(ends(BLOCKED))),
        ("live needs Running", mig(live, None, None), Some(vm(phase::STOPPED, Some("h1"))), false, false, Box::new(ends(BLOCKED))),
        ("cold takes a stopped VM", mig(None, None, None), Some(vm(phase::STOPPED, Some("h1"))), false, false, is(start(migration_strategy::COLD))),
        ("live on another backend", mig(live, None, None), Some(not_migratable(running.clone())), false, false, Box::new(ends(BLOCKED))),
        ("cold on another backend", mig(None, None, None), Some(not_migratable(running.clone())), false, false, is(start(migration_strategy::COLD))),
        ("spec.nodeName is the source", mig(None, None, None), Some(on(running.clone(), Some("h1"), None)), false, false, is(start(migration_strategy::COLD))),
        ("another one started: queued", mig(None, None, None), Some(running.clone()), true, false, is(MigrationStep::Queue)),
        ("another one started: stays pending", mig(None, None, Some(PENDING)), Some(running.clone()), true, false, is(MigrationStep::Wait)),
        // Live.
        ("starting: transfer", mig(live, None, Some(STARTING)), Some(running.clone()), false, false, is(MigrationStep::Advance(RUNNING))),
        ("running: waits for the transfer", mig(live, None, Some(RUNNING)), Some(running.clone()), false, false, is(MigrationStep::Wait)),
        ("running: cutover when transferred", mig(live, None, Some(RUNNING)), Some(running.clone()), false, true, is(MigrationStep::Advance(CUTOVER))),
        ("running: VM stopped", mig(live, None, Some(RUNNING)), Some(vm(phase::STOPPED, Some("h1"))), false, true, Box::new(ends(FAILED))),
        ("running: VM deleted", mig(live, None, Some(RUNNING)), None, false, true, Box::new(ends(FAILED))),
        ("cutover: adopting", mig(live, None, Some(CUTOVER)), Some(running.clone()), false, true, is(MigrationStep::Advance(ADOPTING))),
        ("adopting: the Machine moves", mig(live, None, Some(ADOPTING)), Some(running.clone()), false, true, is(MigrationStep::Machine(MachineChange::Adopt { target: h2() }))),
        ("adopting: spec moved, status not yet", mig(live, None, Some(ADOPTING)), Some(on(running.clone(), Some("h2"), Some("h1"))), false, true, is(MigrationStep::Machine(MachineChange::Adopt { target: h2() }))),
        ("adopting: done", mig(live, None, Some(ADOPTING)), Some(on(running.clone(), Some("h2"), Some("h2"))), false, true, is(MigrationStep::Complete { runtime_id: Some("rt-1".into()) })),
        // Cold.
        ("stopping: stop it", mig(None, None, Some(STOPPING)), Some(running.clone()), false, false, is(MigrationStep::Machine(MachineChange::Stop))),
        ("stopping: asked, not stopped yet", mig(None, None, Some(STOPPING)), Some(powered(running.clone(), power_state::STOPPED)), false, false, is(MigrationStep::Wait)),
        ("stopping: stopped", mig(None, None, Some(STOPPING)), Some(powered(vm(phase::STOPPED, Some("h1")), power_state::STOPPED)), false, false, is(MigrationStep::Advance(RESTARTING))),
        ("restarting: bind and start", mig(None, None, Some(RESTARTING)), Some(powered(vm(phase::STOPPED, Some("h1")), power_state::STOPPED)), false, false, is(MigrationStep::Machine(MachineChange::Restart { target: h2() }))),
        ("restarting: booting there", mig(None, None, Some(RESTARTING)), Some(on(vm(phase::STARTING, None), Some("h2"), Some("h2"))), false, false, is(MigrationStep::Wait)),
        ("restarting: running there", mig(None, None, Some(RESTARTING)), Some(on(running.clone(), Some("h2"), Some("h2"))), false, false, is(MigrationStep::Complete { runtime_id: Some("rt-1".into()) })),
        ("restarting: deleted", mig(None, None, Some(RESTARTING)), None, false, false, Box::new(ends(FAILED))),
        // Final.
        ("succeeded is final", mig(None, None, Some(SUCCEEDED)), Some(running.clone()), false, true, is(MigrationStep::Wait)),
        ("blocked is final", mig(None, None, Some(BLOCKED)), Some(running.clone()), false, true, is(MigrationStep::Wait)),
        ("failed is final", mig(live, None, Some(FAILED)), Some(running.clone()), false, true, is(MigrationStep::Wait)),
    ];
    for (name, m, machine, other, done, check) in cases {
        // A final migration is never asked about (the engine steps those under way only).
        if is_finished(&m) {
            assert!(!is_under_way(&m), "{name}");
            continue;
        }
        let got = next_migration_step(&m, machine.as_ref(), &placement(), other, done);
        assert!(check(&got), "{name}: {got:?}");
    }
}

#[test]
fn statuses_keep_what_came_before() {
    let m = mig(None, None, None);
    let started = started_status(&m, migration_strategy::COLD, "h1", "h2");
    assert_eq!(started.phase.as_deref(), Some(STOPPING));
    assert_eq!(started.effective_strategy.as_deref(), Some("cold"));
    assert_eq!(
        started_status(&m, migration_strategy::LIVE, "h1", "h2")
            .phase
            .as_deref(),
        Some(STARTING)
    );
    let m = MachineMigration {
        status: Some(started),
        ..m
    };
    let done = succeeded_status(&m, Some("rt-2".into()));
    assert_eq!(done.phase.as_deref(), Some(SUCCEEDED));
    assert_eq!(
        (done.source_node.as_deref(), done.target_node.as_deref()),
        (Some("h1"), Some("h2"))
    );
    assert_eq!(done.runtime_id.as_deref(), Some("rt-2"));
    let blocked = ended_status(&m, BLOCKED, "no target node");
    assert_eq!(blocked.message.as_deref(), Some("no target node"));
}

#[test]
fn the_machine_writes_are_kairons() {
    let m = mig(Some("live"), None, Some(ADOPTING));
    assert_eq!(
        machine_patch(&m, &MachineChange::Stop),
        json!({"spec": {"powerState": "Stopped"}})
    );
    let restart = machine_patch(&m, &MachineChange::Restart { target: "h2".into() });
    assert_eq!(restart["spec"], json!({"nodeName": "h2", "powerState": "Running"}));
    assert_eq!(restart["metadata"]["labels"][ASSIGNED_NODE_LABEL], "h2");
    let adopt = machine_patch(&m, &MachineChange::Adopt { target: "h2".into() });
    assert_eq!(adopt["spec"], json!({"nodeName": "h2"}));
    assert_eq!(adopt["metadata"]["annotations"][MIGRATION_ANNOTATION], "mig");
    assert_eq!(adopt["metadata"]["annotations"][ADOPT_ONLY_ANNOTATION], "true");
}

#[test]
fn an_adopted_vm_names_its_new_node_with_a_new_runtime_and_nothing_else_changes() {
    let mut m = vm(phase::RUNNING, Some("h1"));
    m.status.as_mut().unwrap().guest_ip = Some("10.42.0.5".into());
    let moved = adopted_status(&m, "h2", Timestamp::UNIX_EPOCH);
    assert_eq!(moved.node_name.as_deref(), Some("h2"));
    assert_ne!(moved.runtime_id.as_deref(), Some("rt-1"), "the target's runtime");
    assert_eq!(moved.guest_ip.as_deref(), Some("10.42.0.5"));
    assert_eq!(moved.phase.as_deref(), Some(phase::RUNNING));
}

#[test]
fn after_adds_and_saturates() {
    let t = |s: i64| Timestamp::from_second(1_700_000_000 + s).unwrap();
    assert_eq!(after(t(0), std::time::Duration::from_secs(20)), t(20));
    assert_eq!(after(t(0), std::time::Duration::MAX), Timestamp::MAX);
}
