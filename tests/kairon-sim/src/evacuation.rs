//! Host maintenance as kairon-controller plays it, as pure functions: for a Host with
//! `spec.maintenance`, what happens to each VM on it by its eviction strategy (the annotation
//! [`EVICTION_STRATEGY_ANNOTATION`]), which
//! migration Kairon makes next (one at a time per host), when a VM is stopped, and the Host's
//! status. Everything is derived from the objects (the Host's `maintenanceStartedAt`, the
//! Machines' `status.evacuation`, the migrations Kairon made, labelled with the host), so a
//! restart picks up where they say.

use std::collections::BTreeSet;
use std::time::Duration;

use capkr::kairon::maintenance::{
    EVACUATION_LABEL, HOST_MAINTENANCE, Host, HostStatus, MachineMigration, MachineMigrationSpec, host_phase,
    migration_phase,
};
use capkr::kairon::{EVICTION_STRATEGY_ANNOTATION, Evacuation, Machine, MachineStatus, eviction, phase};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::migration::{after, is_finished, is_migratable, migration_phase_of, parse_time, rfc3339};
use crate::sim::{CONDITION_READY, Key, phase_of, set_condition};

/// `spec.maintenance.evacuationGracePeriodSeconds` when absent.
pub const DEFAULT_GRACE_SECONDS: i64 = 3600;
/// A `LiveMigrate` VM whose migration failed gets another one after this long.
pub const MIGRATION_RETRY: Duration = Duration::from_secs(10);
/// `status.message` of a Machine Kairon stopped at the deadline.
pub const DEADLINE_MESSAGE: &str = "stopped by Kairon: not replaced before the evacuation deadline";

/// What becomes of one VM on a host in maintenance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmPlan {
    /// Not (yet, or no longer) Running: booting VMs are dealt with once up, deleted ones go.
    Wait,
    /// Kairon migrates it: a migration is to be made.
    Migrate,
    /// Kairon's migration of it is under way.
    Migrating,
    /// `LiveMigrate` but it cannot move: the maintenance waits (why).
    Blocked(String),
    /// Ask its owner to replace it: write `status.evacuation`.
    RequestEvacuation,
    /// Asked; waiting for the owner until the deadline.
    AwaitOwner { deadline: String },
    /// Powered off now.
    Stop { reason: String, message: String },
}

/// The plan for one VM on `host`: by its strategy, its migratability, Kairon's current
/// migration of it (made for this maintenance) and its evacuation request.
pub fn vm_plan(vm: &Machine, host: &str, migration: Option<&MachineMigration>, now: Timestamp) -> VmPlan {
    if vm.metadata.deletion_timestamp.is_some() || phase_of(vm) != Some(phase::RUNNING) {
        return VmPlan::Wait;
    }
    if let Some(evacuation) = evacuation_of(vm, host) {
        let deadline = evacuation.deadline.as_deref().and_then(parse_time);
        return match deadline {
            Some(d) if d > now => VmPlan::AwaitOwner { deadline: rfc3339(d) },
            _ => VmPlan::Stop {
                reason: phase::EVACUATION_DEADLINE_EXCEEDED.to_string(),
                message: format!(
                    "{DEADLINE_MESSAGE} ({}) of host {host}",
                    evacuation.deadline.as_deref().unwrap_or("none")
                ),
            },
        };
    }
    let strategy = eviction_strategy(vm);
    let live_only = match strategy {
        eviction::NONE => {
            return VmPlan::Stop {
                reason: HOST_MAINTENANCE.to_string(),
                message: format!("stopped by Kairon: host {host} went into maintenance (eviction strategy None)"),
            };
        }
        eviction::EXTERNAL => return VmPlan::RequestEvacuation,
        eviction::LIVE_MIGRATE => true,
        // LiveMigrateIfPossible, and whatever Kairon does not know, is Kairon's default.
        _ => false,
    };
    if !is_migratable(vm) {
        return if live_only {
            VmPlan::Blocked("LiveMigrate but cannot be migrated live".to_string())
        } else {
            VmPlan::RequestEvacuation
        };
    }
    let Some(migration) = migration else {
        return VmPlan::Migrate;
    };
    match migration_phase_of(migration) {
        Some(migration_phase::FAILED | migration_phase::BLOCKED) if live_only => {
            let reason = migration
                .status
                .as_ref()
                .and_then(|s| s.message.as_deref())
                .unwrap_or("unknown");
            VmPlan::Blocked(format!("LiveMigrate and its migration failed ({reason}); retrying"))
        }
        // It could not move live after all: as External.
        Some(migration_phase::FAILED | migration_phase::BLOCKED) => VmPlan::RequestEvacuation,
        // It came back (or the record is of a VM that moved and returned): migrate again.
        Some(migration_phase::SUCCEEDED) => VmPlan::Migrate,
        _ => VmPlan::Migrating,
    }
}

/// The VM's eviction strategy: its [`EVICTION_STRATEGY_ANNOTATION`], `LiveMigrateIfPossible`
/// when absent or empty.
pub fn eviction_strategy(vm: &Machine) -> &str {
    vm.annotations()
        .get(EVICTION_STRATEGY_ANNOTATION)
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .unwrap_or(eviction::LIVE_MIGRATE_IF_POSSIBLE)
}

/// The VM's evacuation request for `host`, if any.
pub fn evacuation_of<'a>(vm: &'a Machine, host: &str) -> Option<&'a Evacuation> {
    vm.status
        .as_ref()
        .and_then(|s| s.evacuation.as_ref())
        .filter(|e| e.host_name == host)
}

/// A write to a VM the maintenance of its host asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum VmAction {
    RequestEvacuation(Evacuation),
    ClearEvacuation,
    Stop { reason: String, message: String },
}

/// Everything Kairon does about one host now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostPlan {
    pub vm_actions: Vec<(Key, VmAction)>,
    /// Make Kairon's migration of this VM ([`evacuation_migration`]).
    pub migrate: Option<Key>,
    /// Migrations of Kairon's to delete: not started when the maintenance was cancelled, left
    /// from an earlier maintenance, or failed and to be retried.
    pub delete_migrations: Vec<Key>,
    pub status: HostStatus,
}

/// The plan for a host: `vms` are the VMs that hold a slot on it (name order), `migrations`
/// the ones Kairon made for it (labelled [`EVACUATION_LABEL`]), `moving` the VMs with any
/// migration under way (someone else's too).
///
/// `admit` says whether a VM may be migrated now by the MachineDisruptionBudgets that select
/// it (and spends its disruption when it may): a VM held back waits, with Kairon's reason.
pub fn plan_host(
    host: &Host,
    vms: &[&Machine],
    migrations: &[&MachineMigration],
    moving: &BTreeSet<Key>,
    now: Timestamp,
    admit: &mut dyn FnMut(&Machine) -> Result<(), String>,
) -> HostPlan {
    let name = host.name_any();
    let previous = host.status.clone().unwrap_or_default();
    let mut plan = HostPlan::default();
    let Some(maintenance) = host.spec.maintenance.as_ref() else {
        for vm in vms {
            if evacuation_of(vm, &name).is_some() {
                plan.vm_actions.push((Key::of(vm), VmAction::ClearEvacuation));
            }
        }
        plan.delete_migrations = migrations
            .iter()
            .filter(|m| migration_phase_of(m).is_none_or(|p| p == migration_phase::PENDING))
            .map(|m| migration_key(m))
            .collect();
        let cordoned = host.spec.unschedulable == Some(true);
        plan.status = HostStatus {
            phase: Some(host_phase::SCHEDULABLE.to_string()),
            machines: Some(count(vms.len())),
            message: cordoned.then(|| "spec.unschedulable: no new VMs are placed here".to_string()),
            ..Default::default()
        };
        return plan;
    };
    let Some(started) = previous.maintenance_started_at.as_deref().and_then(parse_time) else {
        // First the Host says since when it is in maintenance; what Kairon does from then on
        // is measured against it.
        plan.status = HostStatus {
            phase: Some(host_phase::EVACUATING.to_string()),
            machines: Some(count(vms.len())),
            maintenance_started_at: Some(rfc3339(now)),
            message: Some("maintenance requested".to_string()),
            ..Default::default()
        };
        return plan;
    };
    let grace = maintenance
        .evacuation_grace_period_seconds
        .unwrap_or(DEFAULT_GRACE_SECONDS)
        .max(0);
    // Kairon's migrations made before this maintenance started are records of an earlier one.
    let (current, stale): (Vec<&MachineMigration>, Vec<&MachineMigration>) = migrations
        .iter()
        .partition(|m| m.creation_timestamp().is_none_or(|c| c.0 >= started));
    plan.delete_migrations
        .extend(stale.iter().filter(|m| is_finished(m)).map(|m| migration_key(m)));
    // Not started, and its VM left the host meanwhile (someone else's migration moved it).
    let on_host = |m: &MachineMigration| vms.iter().any(|vm| vm.name_any() == m.spec.machine_name);
    plan.delete_migrations.extend(
        current
            .iter()
            .filter(|m| migration_phase_of(m).is_none_or(|p| p == migration_phase::PENDING) && !on_host(m))
            .map(|m| migration_key(m)),
    );
    // One migration at a time per host: Kairon's own, or anyone's of a VM on the host.
    let mut under_way = current.iter().any(|m| !is_finished(m)) || vms.iter().any(|vm| moving.contains(&Key::of(vm)));
    let mut waiting: Vec<String> = Vec::new();
    for vm in vms {
        let key = Key::of(vm);
        let migration = current
            .iter()
            .filter(|m| m.spec.machine_name == key.name)
            .max_by_key(|m| m.creation_timestamp().map(|t| t.0));
        let vm_plan = match vm_plan(vm, &name, migration.copied(), now) {
            VmPlan::Migrate if moving.contains(&key) => VmPlan::Migrating,
            plan => plan,
        };
        match vm_plan {
            VmPlan::Wait if vm.metadata.deletion_timestamp.is_some() => {
                waiting.push(format!("{} (being deleted)", key.name));
            }
            VmPlan::Wait => waiting.push(format!("{} (not running yet)", key.name)),
            VmPlan::Migrate => {
                if let Some(done) = migration {
                    plan.delete_migrations.push(migration_key(done));
                } else if !under_way && plan.migrate.is_none() {
                    if let Err(why) = admit(vm) {
                        waiting.push(format!("{} (held: {why})", key.name));
                        continue;
                    }
                    plan.migrate = Some(key.clone());
                    under_way = true;
                }
                waiting.push(format!("{} (to be migrated)", key.name));
            }
            VmPlan::Migrating => waiting.push(format!("{} (migrating)", key.name)),
            VmPlan::Blocked(why) => {
                if let Some(failed) = migration.filter(|m| retry_due(m, now)) {
                    plan.delete_migrations.push(migration_key(failed));
                }
                waiting.push(format!("{} ({why}: blocks the maintenance)", key.name));
            }
            VmPlan::RequestEvacuation => {
                let requested = Evacuation {
                    host_name: name.clone(),
                    reason: Some(HOST_MAINTENANCE.to_string()),
                    requested_at: Some(rfc3339(now)),
                    deadline: Some(rfc3339(after(now, Duration::from_secs(grace.unsigned_abs())))),
                };
                plan.vm_actions
                    .push((key.clone(), VmAction::RequestEvacuation(requested)));
                waiting.push(format!("{} (evacuation requested)", key.name));
            }
            VmPlan::AwaitOwner { deadline } => {
                waiting.push(format!("{} (evacuation requested, deadline {deadline})", key.name));
            }
            VmPlan::Stop { reason, message } => {
                plan.vm_actions.push((key.clone(), VmAction::Stop { reason, message }));
                waiting.push(format!("{} (stopping)", key.name));
            }
        }
    }
    let empty = vms.is_empty();
    plan.status = HostStatus {
        phase: Some(
            if empty {
                host_phase::IN_MAINTENANCE
            } else {
                host_phase::EVACUATING
            }
            .to_string(),
        ),
        machines: Some(count(vms.len())),
        maintenance_started_at: Some(rfc3339(started)),
        emptied_at: empty.then(|| previous.emptied_at.clone().unwrap_or_else(|| rfc3339(now))),
        message: (!empty).then(|| format!("waiting for {} VM(s): {}", vms.len(), waiting.join(", "))),
    };
    plan
}

fn retry_due(migration: &MachineMigration, now: Timestamp) -> bool {
    // Kairon's migrations carry no completion time: counted from their creation.
    migration
        .metadata
        .creation_timestamp
        .as_ref()
        .is_none_or(|made| after(made.0, MIGRATION_RETRY) <= now)
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn migration_key(m: &MachineMigration) -> Key {
    Key {
        namespace: m.namespace().unwrap_or_default(),
        name: m.name_any(),
    }
}

/// The migration Kairon makes to move `vm` off `host`: named after the VM, labelled with the
/// host, no target (Kairon chooses).
pub fn evacuation_migration(vm: &Key, host: &str) -> MachineMigration {
    let mut mig = MachineMigration::new(
        &evacuation_migration_name(&vm.name),
        MachineMigrationSpec {
            machine_name: vm.name.clone(),
            strategy: Some(capkr::kairon::maintenance::migration_strategy::LIVE.to_string()),
            target_node: None,
        },
    );
    mig.metadata.namespace = Some(vm.namespace.clone());
    mig.metadata.labels = Some([(EVACUATION_LABEL.to_string(), host.to_string())].into());
    mig
}

/// `evacuate-<machine>`, cut to a valid object name.
pub fn evacuation_migration_name(machine: &str) -> String {
    let name = format!("evacuate-{machine}");
    match name.char_indices().nth(253) {
        Some((i, _)) => name[..i].trim_end_matches(['-', '.']).to_string(),
        None => name,
    }
}

/// The VM powered off by Kairon: `Stopped`, its runtime gone and off its host (no
/// `runtimeID`, `nodeName`, `hostLabels` or `evacuation`); its address stays with it until it
/// is deleted.
pub fn stopped_status(vm: &Machine, reason: &str, message: &str, now: Timestamp) -> MachineStatus {
    let mut status = MachineStatus {
        phase: Some(phase::STOPPED.to_string()),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        node_name: None,
        runtime_id: None,
        host_labels: None,
        evacuation: None,
        ..vm.status.clone().unwrap_or_default()
    };
    set_condition(&mut status, CONDITION_READY, false, reason, message, now);
    status
}

pub fn evacuation_status(vm: &Machine, evacuation: Option<Evacuation>) -> MachineStatus {
    MachineStatus {
        evacuation,
        ..vm.status.clone().unwrap_or_default()
    }
}

#[cfg(test)]
#[path = "evacuation_tests.rs"]
mod tests;
