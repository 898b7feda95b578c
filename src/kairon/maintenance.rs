//! Our model of Kairon's MachineMigration (`docs/kairon-api.md`). The provider never reads or
//! writes one: it sees a migration's effect on a Machine (`status.nodeName`). It is here so
//! that the development CRD, the simulator and the tests share one model.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Kairon's request to move one Machine to another node (`kmm`). Namespaced: the Machine's
/// namespace. `live` moves the running VM (the same runtime state on a new node); `cold`
/// (what `auto` and an empty strategy become) stops it, moves it and starts it there with a new
/// runtime. Made by operators, `kaironctl evacuate` and cordon evacuation; never by the
/// provider.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kairon.zyvor.dev",
    version = "v1",
    kind = "MachineMigration",
    namespaced,
    shortname = "kmm",
    status = "MachineMigrationStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "MachineMigration moves a Kairon Machine to another node (development CRD; production clusters get it from Kairon).",
    printcolumn(name = "Machine", type_ = "string", json_path = ".spec.machineName"),
    printcolumn(name = "Strategy", type_ = "string", json_path = ".status.effectiveStrategy"),
    printcolumn(name = "Source", type_ = "string", json_path = ".status.sourceNode"),
    printcolumn(name = "Target", type_ = "string", json_path = ".status.targetNode"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase")
)]
#[serde(rename_all = "camelCase")]
pub struct MachineMigrationSpec {
    /// The Kairon Machine to move (same namespace).
    #[x_kube(validation = Rule::new("size(self) > 0").message("machineName must not be empty"))]
    pub machine_name: String,
    /// `auto` (the default), `live` or `cold`; Kairon takes `auto` as `cold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['auto', 'live', 'cold']").message("strategy must be auto, live or cold"))]
    pub strategy: Option<String>,
    /// The node to move to; Kairon chooses one when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineMigrationStatus {
    /// See [`migration_phase`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node: Option<String>,
    /// `live` or `cold`: what the migration does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_strategy: Option<String>,
    /// The runtime on the target, once there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_id: Option<String>,
}

/// A MachineMigration's phases, as kairon-controller writes them. A live one goes
/// `Starting`, `Running`, `Cutover`, `Adopting`, `Succeeded`; a cold one `Stopping`,
/// `Restarting`, `Succeeded`. `Blocked` (it cannot run: no target, an unsupported strategy),
/// `Failed` and `Cancelled` are final too; finished migrations are kept.
pub mod migration_phase {
    pub const PENDING: &str = "Pending";
    pub const STARTING: &str = "Starting";
    pub const RUNNING: &str = "Running";
    pub const CUTOVER: &str = "Cutover";
    pub const ADOPTING: &str = "Adopting";
    pub const STOPPING: &str = "Stopping";
    pub const RESTARTING: &str = "Restarting";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const FAILED: &str = "Failed";
    pub const BLOCKED: &str = "Blocked";
    pub const CANCELLED: &str = "Cancelled";

    /// Never acted on again (the empty phase is not: a migration not yet looked at).
    pub fn is_final(phase: Option<&str>) -> bool {
        matches!(phase, Some(SUCCEEDED | FAILED | BLOCKED | CANCELLED))
    }
}

/// `spec.strategy` values, and what Kairon makes of them.
pub mod migration_strategy {
    pub const AUTO: &str = "auto";
    pub const LIVE: &str = "live";
    pub const COLD: &str = "cold";

    /// `live` stays live; `auto`, `cold`, an empty or unknown strategy is cold.
    pub fn effective(spec: Option<&str>) -> &'static str {
        if spec == Some(LIVE) { LIVE } else { COLD }
    }
}

/// The label kairon-controller puts on a Machine beside `spec.nodeName` when it binds it to a
/// node.
pub const ASSIGNED_NODE_LABEL: &str = "kairon.zyvor.dev/assigned-node";

/// Annotations kairon-controller puts on a Machine while a live migration adopts it on its
/// new node.
pub const ADOPT_ONLY_ANNOTATION: &str = "kairon.zyvor.dev/adopt-only";
pub const MIGRATION_ANNOTATION: &str = "kairon.zyvor.dev/migration";
