//! Live migration as kairon-controller plays it, as pure functions: given a MachineMigration,
//! its VM and the hosts, what to do next; and the statuses each step writes. A migration goes
//! `Pending` → `Running` (source and target chosen) → after `--migration-delay` the VM's
//! `nodeName`/`hostLabels` change and the migration is `Succeeded`; or it is `Failed` with a
//! reason. Nothing else of the VM changes (UID, runtime, address, phase, what runs in it). Derived
//! from the objects only, so a finished migration is never acted on again, and a restart
//! picks up where the statuses say.

use std::collections::BTreeMap;
use std::time::Duration;

use capkr::kairon::maintenance::{MachineMigration, MachineMigrationStatus, migration_phase};
use capkr::kairon::{Machine, MachineStatus, phase};
use k8s_openapi::jiff::{RoundMode, SignedDuration, Timestamp, TimestampRound, Unit};
use kube::ResourceExt;

use crate::placement::{Placement, node_selector};
use crate::sim::{CONDITION_SCHEDULED, phase_of, set_condition};

/// On a Kairon Machine: the VM cannot move live (host devices, say). Any value but `"false"`.
pub const NOT_MIGRATABLE_ANNOTATION: &str = "sim.kairon.zyvor.dev/not-migratable";

pub const REASON_MACHINE_NOT_RUNNING: &str = "MachineNotRunning";
pub const REASON_NO_TARGET_HOST: &str = "NoTargetHost";
pub const REASON_NOT_MIGRATABLE: &str = "NotMigratable";

/// What to do with a MachineMigration now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigrationStep {
    Wait,
    /// Write `phase: Pending`: another migration of the same VM is under way.
    Queue,
    /// Write `phase: Running` with these hosts.
    Start {
        source: String,
        target: String,
    },
    /// The copy is done: the VM's status names `target` (then the migration succeeds).
    Move {
        target: String,
    },
    /// The VM already runs on the target (the migration's own write was lost): `Succeeded`.
    Complete,
    Fail {
        reason: &'static str,
        message: String,
    },
}

pub fn migration_phase_of(mig: &MachineMigration) -> Option<&str> {
    mig.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .filter(|p| !p.is_empty())
}

/// Succeeded or Failed: never acted on again.
pub fn is_finished(mig: &MachineMigration) -> bool {
    matches!(
        migration_phase_of(mig),
        Some(migration_phase::SUCCEEDED | migration_phase::FAILED)
    )
}

/// Not finished: the VM is (to be) moving.
pub fn is_under_way(mig: &MachineMigration) -> bool {
    !is_finished(mig) && mig.metadata.deletion_timestamp.is_none()
}

pub fn is_migratable(m: &Machine) -> bool {
    m.annotations()
        .get(NOT_MIGRATABLE_ANNOTATION)
        .is_none_or(|v| v.trim() == "false")
}

fn is_running(m: &Machine) -> bool {
    phase_of(m) == Some(phase::RUNNING) && m.metadata.deletion_timestamp.is_none()
}

fn node_name(m: &Machine) -> Option<&str> {
    m.status.as_ref().and_then(|s| s.node_name.as_deref())
}

/// The migration's next step. `vm` is its Machine (same namespace, `spec.machineName`) if it
/// exists; `other_running` says whether another migration of that VM is `Running`.
pub fn next_migration_step(
    mig: &MachineMigration,
    vm: Option<&Machine>,
    placement: &Placement,
    other_running: bool,
    now: Timestamp,
    delay: Duration,
) -> MigrationStep {
    let not_running = |why: String| MigrationStep::Fail {
        reason: REASON_MACHINE_NOT_RUNNING,
        message: why,
    };
    let name = &mig.spec.machine_name;
    let running_vm = match vm {
        None => Err(format!("Machine {name} does not exist")),
        Some(m) if !is_running(m) => Err(format!(
            "Machine {name} is {}",
            if m.metadata.deletion_timestamp.is_some() {
                "being deleted"
            } else {
                phase_of(m).unwrap_or("not started")
            }
        )),
        Some(m) => node_name(m)
            .map(|h| (m, h))
            .ok_or_else(|| format!("Machine {name} runs on no host")),
    };
    match migration_phase_of(mig) {
        None | Some(migration_phase::PENDING) => {
            let (vm, source) = match running_vm {
                Ok(found) => found,
                Err(why) => return not_running(why),
            };
            if !is_migratable(vm) {
                return MigrationStep::Fail {
                    reason: REASON_NOT_MIGRATABLE,
                    message: format!("Machine {name} cannot be migrated live"),
                };
            }
            if other_running {
                return match migration_phase_of(mig) {
                    None => MigrationStep::Queue,
                    Some(_) => MigrationStep::Wait,
                };
            }
            let target = match mig.spec.target_host.as_deref().filter(|t| !t.is_empty()) {
                Some(target) => placement.check_target(target, source).map(|()| target.to_string()),
                None => placement.choose_target(node_selector(&vm.spec), source),
            };
            match target {
                Ok(target) => MigrationStep::Start {
                    source: source.to_string(),
                    target,
                },
                Err(why) => MigrationStep::Fail {
                    reason: REASON_NO_TARGET_HOST,
                    message: why.0,
                },
            }
        }
        Some(migration_phase::RUNNING) => {
            let status = mig.status.as_ref();
            let (source, target) = (
                status.and_then(|s| s.source_host.as_deref()),
                status.and_then(|s| s.target_host.as_deref()),
            );
            let host = match running_vm {
                Ok((_, host)) => host,
                Err(why) => return not_running(format!("{why}: the migration stopped")),
            };
            let Some(target) = target else {
                return MigrationStep::Fail {
                    reason: REASON_NO_TARGET_HOST,
                    message: "the running migration names no target host".to_string(),
                };
            };
            if host == target {
                return MigrationStep::Complete;
            }
            if Some(host) != source {
                return not_running(format!("Machine {name} moved to host {host} meanwhile"));
            }
            let started = status.and_then(|s| s.start_timestamp.as_deref()).and_then(parse_time);
            if started.is_none_or(|t| after(t, delay) <= now) {
                MigrationStep::Move {
                    target: target.to_string(),
                }
            } else {
                MigrationStep::Wait
            }
        }
        Some(_) => MigrationStep::Wait,
    }
}

// --- statuses ---------------------------------------------------------------------------

pub fn queued_status(mig: &MachineMigration) -> MachineMigrationStatus {
    MachineMigrationStatus {
        phase: Some(migration_phase::PENDING.to_string()),
        ..mig.status.clone().unwrap_or_default()
    }
}

pub fn started_status(mig: &MachineMigration, source: &str, target: &str, now: Timestamp) -> MachineMigrationStatus {
    MachineMigrationStatus {
        phase: Some(migration_phase::RUNNING.to_string()),
        source_host: Some(source.to_string()),
        target_host: Some(target.to_string()),
        start_timestamp: Some(rfc3339(now)),
        ..mig.status.clone().unwrap_or_default()
    }
}

pub fn succeeded_status(mig: &MachineMigration, now: Timestamp) -> MachineMigrationStatus {
    MachineMigrationStatus {
        phase: Some(migration_phase::SUCCEEDED.to_string()),
        completion_timestamp: Some(rfc3339(now)),
        ..mig.status.clone().unwrap_or_default()
    }
}

pub fn failed_status(mig: &MachineMigration, reason: &str, message: &str, now: Timestamp) -> MachineMigrationStatus {
    MachineMigrationStatus {
        phase: Some(migration_phase::FAILED.to_string()),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        completion_timestamp: Some(rfc3339(now)),
        ..mig.status.clone().unwrap_or_default()
    }
}

/// The VM after a live migration: the same VM, the same runtime, on `target` (an evacuation
/// request is void: the VM left the host).
pub fn moved_status(
    m: &Machine,
    target: &str,
    labels: Option<&BTreeMap<String, String>>,
    now: Timestamp,
) -> MachineStatus {
    let from = node_name(m).unwrap_or("-");
    let mut status = MachineStatus {
        node_name: Some(target.to_string()),
        host_labels: labels.cloned(),
        evacuation: None,
        ..m.status.clone().unwrap_or_default()
    };
    let message = format!("migrated live from host {from} to host {target}");
    set_condition(&mut status, CONDITION_SCHEDULED, true, "Migrated", &message, now);
    status
}

// --- time -------------------------------------------------------------------------------

/// RFC 3339 to the second (truncated), as Kubernetes writes times.
pub fn rfc3339(t: Timestamp) -> String {
    t.round(TimestampRound::new().smallest(Unit::Second).mode(RoundMode::Trunc))
        .unwrap_or(t)
        .to_string()
}

pub fn parse_time(s: &str) -> Option<Timestamp> {
    s.parse().ok()
}

/// `t + d`, saturating.
pub fn after(t: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Host;
    use crate::sim::Key;
    use capkr::kairon::maintenance::MachineMigrationSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn vm(phase: &str, host: Option<&str>, not_migratable: bool, deleting: bool) -> Machine {
        Machine {
            metadata: ObjectMeta {
                name: Some("vm".into()),
                namespace: Some("ns".into()),
                annotations: not_migratable
                    .then(|| [(NOT_MIGRATABLE_ANNOTATION.to_string(), "true".to_string())].into()),
                deletion_timestamp: deleting.then_some(Time(t(0))),
                ..Default::default()
            },
            spec: Default::default(),
            status: Some(MachineStatus {
                phase: Some(phase.into()),
                node_name: host.map(Into::into),
                ..Default::default()
            }),
        }
    }

    fn mig(target: Option<&str>, status: Option<(&str, &str, &str, i64)>) -> MachineMigration {
        let mut m = MachineMigration::new(
            "mig",
            MachineMigrationSpec {
                machine_name: "vm".into(),
                target_host: target.map(Into::into),
            },
        );
        m.status = status.map(|(phase, source, target, started)| MachineMigrationStatus {
            phase: Some(phase.into()),
            source_host: Some(source.into()).filter(|s: &String| !s.is_empty()),
            target_host: Some(target.into()).filter(|s: &String| !s.is_empty()),
            start_timestamp: Some(rfc3339(t(started))),
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

    fn fail(reason: &'static str) -> impl Fn(&MigrationStep) -> bool {
        move |s| matches!(s, MigrationStep::Fail { reason: r, .. } if *r == reason)
    }

    type Check = Box<dyn Fn(&MigrationStep) -> bool>;
    /// Name, migration, its VM, another migration of the VM runs, seconds now, the check.
    type Case = (&'static str, MachineMigration, Option<Machine>, bool, i64, Check);

    #[test]
    fn migration_steps() {
        use migration_phase::*;
        let delay = Duration::from_secs(5);
        let running = vm(phase::RUNNING, Some("h1"), false, false);
        let start = |target: &str| MigrationStep::Start {
            source: "h1".into(),
            target: target.into(),
        };
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("new: starts to the only host with room", mig(None, None), Some(running.clone()), false, 0, Box::new(move |s| *s == start("h2"))),
            ("pending: starts too", mig(None, Some((PENDING, "", "", 0))), Some(running.clone()), false, 0, Box::new(move |s| *s == start("h2"))),
            ("named target", mig(Some("h2"), None), Some(running.clone()), false, 0, Box::new(move |s| *s == start("h2"))),
            ("named target full", mig(Some("h3"), None), Some(running.clone()), false, 0, Box::new(fail(REASON_NO_TARGET_HOST))),
            ("named target unknown", mig(Some("hx"), None), Some(running.clone()), false, 0, Box::new(fail(REASON_NO_TARGET_HOST))),
            ("no machine", mig(None, None), None, false, 0, Box::new(fail(REASON_MACHINE_NOT_RUNNING))),
            ("machine provisioning", mig(None, None), Some(vm(phase::STARTING, Some("h1"), false, false)), false, 0, Box::new(fail(REASON_MACHINE_NOT_RUNNING))),
            ("machine deleting", mig(None, None), Some(vm(phase::RUNNING, Some("h1"), false, true)), false, 0, Box::new(fail(REASON_MACHINE_NOT_RUNNING))),
            ("not migratable", mig(None, None), Some(vm(phase::RUNNING, Some("h1"), true, false)), false, 0, Box::new(fail(REASON_NOT_MIGRATABLE))),
            ("another one runs: queued", mig(None, None), Some(running.clone()), true, 0, Box::new(|s| *s == MigrationStep::Queue)),
            ("another one runs: stays pending", mig(None, Some((PENDING, "", "", 0))), Some(running.clone()), true, 0, Box::new(|s| *s == MigrationStep::Wait)),
            ("running: waits for the delay", mig(None, Some((RUNNING, "h1", "h2", 0))), Some(running.clone()), false, 4, Box::new(|s| *s == MigrationStep::Wait)),
            ("running: moves when due", mig(None, Some((RUNNING, "h1", "h2", 0))), Some(running.clone()), false, 5, Box::new(|s| *s == MigrationStep::Move { target: "h2".into() })),
            ("running: VM already on target", mig(None, Some((RUNNING, "h1", "h2", 0))), Some(vm(phase::RUNNING, Some("h2"), false, false)), false, 1, Box::new(|s| *s == MigrationStep::Complete)),
            ("running: VM stopped", mig(None, Some((RUNNING, "h1", "h2", 0))), Some(vm(phase::STOPPED, None, false, false)), false, 9, Box::new(fail(REASON_MACHINE_NOT_RUNNING))),
            ("running: VM deleted", mig(None, Some((RUNNING, "h1", "h2", 0))), None, false, 9, Box::new(fail(REASON_MACHINE_NOT_RUNNING))),
            ("succeeded is final", mig(None, Some((SUCCEEDED, "h1", "h2", 0))), None, false, 9, Box::new(|s| *s == MigrationStep::Wait)),
            ("failed is final", mig(None, Some((FAILED, "", "", 0))), Some(running.clone()), false, 9, Box::new(|s| *s == MigrationStep::Wait)),
        ];
        for (name, m, machine, other, now, check) in cases {
            let got = next_migration_step(&m, machine.as_ref(), &placement(), other, t(now), delay);
            assert!(check(&got), "{name}: {got:?}");
        }
    }

    #[test]
    fn an_explicit_migration_ignores_the_eviction_strategy() {
        let mut m = vm(phase::RUNNING, Some("h1"), false, false);
        m.annotations_mut().insert(
            capkr::kairon::EVICTION_STRATEGY_ANNOTATION.into(),
            capkr::kairon::eviction::EXTERNAL.into(),
        );
        let step = next_migration_step(&mig(None, None), Some(&m), &placement(), false, t(0), Duration::ZERO);
        assert_eq!(
            step,
            MigrationStep::Start {
                source: "h1".into(),
                target: "h2".into()
            }
        );
    }

    #[test]
    fn statuses_keep_what_came_before() {
        let m = mig(None, None);
        let running = started_status(&m, "h1", "h2", t(0));
        let m = MachineMigration {
            status: Some(running),
            ..m
        };
        let done = succeeded_status(&m, t(3));
        assert_eq!(done.phase.as_deref(), Some(migration_phase::SUCCEEDED));
        assert_eq!(
            (done.source_host.as_deref(), done.target_host.as_deref()),
            (Some("h1"), Some("h2"))
        );
        assert_eq!(done.start_timestamp, Some(rfc3339(t(0))));
        assert_eq!(done.completion_timestamp, Some(rfc3339(t(3))));
        let failed = failed_status(&m, REASON_NO_TARGET_HOST, "none", t(3));
        assert_eq!(failed.reason.as_deref(), Some(REASON_NO_TARGET_HOST));
    }

    #[test]
    fn a_moved_vm_names_its_new_host_and_labels_and_nothing_else_changes() {
        let mut m = vm(phase::RUNNING, Some("h1"), false, false);
        if let Some(s) = m.status.as_mut() {
            s.runtime_id = Some("rt-1".into());
            s.guest_ip = Some("10.42.0.5".into());
            s.evacuation = Some(Default::default());
        }
        let labels: BTreeMap<String, String> = [("zone".to_string(), "b".to_string())].into();
        let moved = moved_status(&m, "h2", Some(&labels), t(0));
        assert_eq!(moved.node_name.as_deref(), Some("h2"));
        assert_eq!(moved.host_labels, Some(labels));
        assert_eq!(moved.evacuation, None);
        assert_eq!(moved.runtime_id.as_deref(), Some("rt-1"), "the same runtime, moved");
        assert_eq!(moved.guest_ip.as_deref(), Some("10.42.0.5"));
        assert_eq!(moved.phase.as_deref(), Some(phase::RUNNING));
    }

    #[test]
    fn times_are_written_to_the_second_and_read_back() {
        let s = rfc3339(Timestamp::from_millisecond(1_700_000_000_400).unwrap());
        assert_eq!(s, "2023-11-14T22:13:20Z");
        assert_eq!(parse_time(&s), Some(t(0)));
        assert_eq!(parse_time("yesterday"), None);
        assert_eq!(after(t(0), Duration::from_secs(20)), t(20));
    }
}
