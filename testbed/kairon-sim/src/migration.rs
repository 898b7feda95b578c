//! MachineMigrations as kairon-controller runs them, as pure functions: given a migration, its
//! Machine and the hosts (Kairon's nodes), what to do next. Derived from the objects only (the
//! transfer's delay from the engine's own clock), so a finished migration is never acted on
//! again and a restart picks up where the objects say.
//!
//! - **live** (`spec.strategy: live`): `Starting` (source and target chosen) → `Running` (the
//!   memory transfer, `--migration-delay`) → `Cutover` → `Adopting`: the Machine's
//!   `spec.nodeName` moves to the target with the adopt annotations and the target's agent
//!   reports the VM there (`status.nodeName`, a new `runtimeID`; phase, address and what runs
//!   in it unchanged) → `Succeeded`. A VM that is not `Running`, or cannot move live (the
//!   annotation [`NOT_MIGRATABLE_ANNOTATION`]: another backend than qemu), is `Blocked`.
//! - **cold** (`cold`, `auto`, empty): `Stopping` (`spec.powerState: Stopped`; the runtime is
//!   deleted) → once `Stopped`, `Restarting` (`spec.nodeName` the target, `powerState:
//!   Running`, whatever it was) → once `Running` on the target, `Succeeded`.
//! - No node to go to (none named and none chosen, or the named one unknown, cordoned or
//!   full): `Blocked`. A Machine deleted or stopped under a live transfer: `Failed`. `Blocked`,
//!   `Failed`, `Succeeded` and `Cancelled` are final.

use capkr::kairon::maintenance::{
    ADOPT_ONLY_ANNOTATION, ASSIGNED_NODE_LABEL, MIGRATION_ANNOTATION, MachineMigration, MachineMigrationStatus,
    migration_phase, migration_strategy,
};
use capkr::kairon::{Machine, MachineStatus, phase, power_state};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::placement::{Placement, node_selector};
use crate::sim::{CONDITION_SCHEDULED, phase_of, set_condition};

/// On a Kairon Machine: the VM cannot move live (host devices, another backend). Any value but
/// `"false"`.
pub const NOT_MIGRATABLE_ANNOTATION: &str = "sim.kairon.zyvor.dev/not-migratable";

/// What to do with a MachineMigration now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigrationStep {
    Wait,
    /// Write `phase: Pending`: another migration of the same Machine is under way.
    Queue,
    /// Write the first phase of `strategy` (`Starting` or `Stopping`) with these nodes.
    Start {
        strategy: &'static str,
        source: String,
        target: String,
    },
    /// Write this phase (the live transfer's steps, a cold migration's restart).
    Advance(&'static str),
    /// Write the Machine as kairon-controller does at this point (then decide again).
    Machine(MachineChange),
    /// `Succeeded`, the runtime on the target recorded.
    Complete {
        runtime_id: Option<String>,
    },
    /// A final phase (`Blocked` or `Failed`) with why.
    End {
        phase: &'static str,
        message: String,
    },
}

/// A write to the migrated Machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MachineChange {
    /// `spec.powerState: Stopped` (a cold migration's first step).
    Stop,
    /// `spec.nodeName` the target and `powerState: Running` (a cold migration's restart).
    Restart { target: String },
    /// A live migration's adoption: `spec.nodeName` the target with the adopt annotations,
    /// and the target's agent reporting the VM there.
    Adopt { target: String },
}

pub fn migration_phase_of(mig: &MachineMigration) -> Option<&str> {
    mig.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .filter(|p| !p.is_empty())
}

/// A final phase: never acted on again.
pub fn is_finished(mig: &MachineMigration) -> bool {
    migration_phase::is_final(migration_phase_of(mig))
}

/// Not finished: the Machine is (to be) moving.
pub fn is_under_way(mig: &MachineMigration) -> bool {
    !is_finished(mig) && mig.metadata.deletion_timestamp.is_none()
}

/// Past `Pending`: source and target chosen.
pub fn is_started(mig: &MachineMigration) -> bool {
    is_under_way(mig) && migration_phase_of(mig).is_some_and(|p| p != migration_phase::PENDING)
}

pub fn is_migratable(m: &Machine) -> bool {
    m.annotations()
        .get(NOT_MIGRATABLE_ANNOTATION)
        .is_none_or(|v| v.trim() == "false")
}

fn deleting(m: &Machine) -> bool {
    m.metadata.deletion_timestamp.is_some()
}

fn status_node(m: &Machine) -> Option<&str> {
    m.status
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn spec_node(m: &Machine) -> Option<&str> {
    m.spec.node_name.as_deref().filter(|n| !n.is_empty())
}

/// The node the Machine is bound to: `spec.nodeName`, else the node its status reports.
pub fn bound_node(m: &Machine) -> Option<&str> {
    spec_node(m).or_else(|| status_node(m))
}

fn runtime_id(m: &Machine) -> Option<String> {
    m.status.as_ref().and_then(|s| s.runtime_id.clone())
}

/// The migration's next step. `vm` is its Machine (same namespace, `spec.machineName`) if it
/// exists; `other_started` says whether another migration of that Machine is past `Pending`;
/// `transfer_done` whether a live transfer under way has run its `--migration-delay`.
pub fn next_migration_step(
    mig: &MachineMigration,
    vm: Option<&Machine>,
    placement: &Placement,
    other_started: bool,
    transfer_done: bool,
) -> MigrationStep {
    use migration_phase::*;
    let name = &mig.spec.machine_name;
    let status = mig.status.as_ref();
    let target = status.and_then(|s| s.target_node.clone()).unwrap_or_default();
    let end = |phase: &'static str, message: String| MigrationStep::End { phase, message };
    let Some(vm) = vm.filter(|m| !deleting(m)) else {
        return match migration_phase_of(mig) {
            None | Some(PENDING) => end(BLOCKED, format!("Machine {name} not found")),
            _ => end(FAILED, format!("Machine {name} was deleted during the migration")),
        };
    };
    match migration_phase_of(mig) {
        None | Some(PENDING) => {
            if other_started {
                return match migration_phase_of(mig) {
                    None => MigrationStep::Queue,
                    Some(_) => MigrationStep::Wait,
                };
            }
            let strategy = migration_strategy::effective(mig.spec.strategy.as_deref());
            let Some(source) = bound_node(vm) else {
                return end(BLOCKED, format!("Machine {name} is not on a node"));
            };
            if strategy == migration_strategy::LIVE {
                if phase_of(vm) != Some(phase::RUNNING) {
                    return end(
                        BLOCKED,
                        format!(
                            "live migration needs a Running Machine; {name} is {}",
                            phase_of(vm).unwrap_or("not started")
                        ),
                    );
                }
                if !is_migratable(vm) {
                    return end(
                        BLOCKED,
                        format!("Machine {name} cannot be migrated live by its backend"),
                    );
                }
            }
            let target = match mig.spec.target_node.as_deref().filter(|t| !t.is_empty()) {
                Some(target) => placement.check_target(target, source).map(|()| target.to_string()),
                None => placement.choose_target(node_selector(&vm.spec), source),
            };
            match target {
                Ok(target) => MigrationStep::Start {
                    strategy,
                    source: source.to_string(),
                    target,
                },
                Err(why) => end(BLOCKED, format!("no target node: {}", why.0)),
            }
        }
        Some(STARTING) => MigrationStep::Advance(RUNNING),
        Some(RUNNING | CUTOVER) if phase_of(vm) != Some(phase::RUNNING) => end(
            FAILED,
            format!(
                "Machine {name} stopped running during the live transfer ({})",
                phase_of(vm).unwrap_or("no phase")
            ),
        ),
        Some(RUNNING) if transfer_done => MigrationStep::Advance(CUTOVER),
        Some(RUNNING) => MigrationStep::Wait,
        Some(CUTOVER) => MigrationStep::Advance(ADOPTING),
        Some(ADOPTING) => {
            if spec_node(vm) != Some(target.as_str()) || status_node(vm) != Some(target.as_str()) {
                MigrationStep::Machine(MachineChange::Adopt { target })
            } else {
                MigrationStep::Complete {
                    runtime_id: runtime_id(vm),
                }
            }
        }
        Some(STOPPING) => {
            if vm.spec.power_state.as_deref() != Some(power_state::STOPPED) {
                MigrationStep::Machine(MachineChange::Stop)
            } else if phase_of(vm) == Some(phase::STOPPED) {
                MigrationStep::Advance(RESTARTING)
            } else {
                MigrationStep::Wait
            }
        }
        Some(RESTARTING) => {
            if spec_node(vm) != Some(target.as_str()) || vm.spec.power_state.as_deref() != Some(power_state::RUNNING) {
                MigrationStep::Machine(MachineChange::Restart { target })
            } else if phase_of(vm) == Some(phase::RUNNING) && status_node(vm) == Some(target.as_str()) {
                MigrationStep::Complete {
                    runtime_id: runtime_id(vm),
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

pub fn started_status(mig: &MachineMigration, strategy: &str, source: &str, target: &str) -> MachineMigrationStatus {
    let phase = if strategy == migration_strategy::LIVE {
        migration_phase::STARTING
    } else {
        migration_phase::STOPPING
    };
    MachineMigrationStatus {
        phase: Some(phase.to_string()),
        message: None,
        source_node: Some(source.to_string()),
        target_node: Some(target.to_string()),
        effective_strategy: Some(strategy.to_string()),
        ..mig.status.clone().unwrap_or_default()
    }
}

pub fn phase_status(mig: &MachineMigration, phase: &str) -> MachineMigrationStatus {
    MachineMigrationStatus {
        phase: Some(phase.to_string()),
        ..mig.status.clone().unwrap_or_default()
    }
}

pub fn succeeded_status(mig: &MachineMigration, runtime_id: Option<String>) -> MachineMigrationStatus {
    MachineMigrationStatus {
        phase: Some(migration_phase::SUCCEEDED.to_string()),
        runtime_id,
        ..mig.status.clone().unwrap_or_default()
    }
}

pub fn ended_status(mig: &MachineMigration, phase: &str, message: &str) -> MachineMigrationStatus {
    MachineMigrationStatus {
        phase: Some(phase.to_string()),
        message: Some(message.to_string()),
        ..mig.status.clone().unwrap_or_default()
    }
}

/// The merge patch of the Machine's metadata and spec that `change` makes (kairon-controller's
/// writes; the status part of an adoption is [`adopted_status`]).
pub fn machine_patch(mig: &MachineMigration, change: &MachineChange) -> Value {
    match change {
        MachineChange::Stop => json!({"spec": {"powerState": power_state::STOPPED}}),
        MachineChange::Restart { target } => json!({
            "metadata": {"labels": {ASSIGNED_NODE_LABEL: target}},
            "spec": {"nodeName": target, "powerState": power_state::RUNNING},
        }),
        MachineChange::Adopt { target } => json!({
            "metadata": {
                "labels": {ASSIGNED_NODE_LABEL: target},
                "annotations": {ADOPT_ONLY_ANNOTATION: "true", MIGRATION_ANNOTATION: mig.name_any()},
            },
            "spec": {"nodeName": target},
        }),
    }
}

/// The VM as the target's agent reports it once adopted: the same VM, running on `target` with
/// a new runtime id; phase, address and what runs in it unchanged.
pub fn adopted_status(m: &Machine, target: &str, now: Timestamp) -> MachineStatus {
    let from = status_node(m).unwrap_or("-");
    let mut status = MachineStatus {
        node_name: Some(target.to_string()),
        runtime_id: Some(crate::sim::new_runtime_id()),
        ..m.status.clone().unwrap_or_default()
    };
    let message = format!("migrated live from node {from} to node {target}");
    set_condition(&mut status, CONDITION_SCHEDULED, true, "Migrated", &message, now);
    status
}

// --- time -------------------------------------------------------------------------------

/// `t + d`, saturating.
pub fn after(t: Timestamp, d: std::time::Duration) -> Timestamp {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
#[path = "migration_tests.rs"]
mod tests;
