//! Our model of Kairon's hosts and VM migrations (`docs/kairon-api.md`). The provider never
//! reads or writes these: it sees their effect on a Machine's status (`nodeName`,
//! `hostLabels`, `evacuation`). They are here so that the development CRDs, the simulator and
//! the tests share one model.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A Kairon host: a server that runs VMs. Cluster-scoped; reconciled by kairon-controller.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kairon.zyvor.dev",
    version = "v1alpha1",
    kind = "Host",
    status = "HostStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Host is a Kairon host (development CRD; production clusters get it from Kairon).",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Machines", type_ = "integer", json_path = ".status.machines"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct HostSpec {
    /// No new VM is placed on the host (set by Kairon while in maintenance, or by an operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unschedulable: Option<bool>,
    /// Present: maintenance is requested. Kairon evacuates the host's VMs, each as its
    /// `evictionStrategy` says; removing it cancels what is not done yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<HostMaintenance>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HostMaintenance {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How long the owner of a VM that is not migrated live has to replace it (default 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("evacuationGracePeriodSeconds must not be negative"))]
    pub evacuation_grace_period_seconds: Option<i64>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HostStatus {
    /// Schedulable, Evacuating or InMaintenance (maintenance requested and no VM left).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// VMs placed on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machines: Option<i32>,
    /// RFC 3339: when the maintenance was first seen, and when the host became empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emptied_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A Host's phases.
pub mod host_phase {
    pub const SCHEDULABLE: &str = "Schedulable";
    pub const EVACUATING: &str = "Evacuating";
    pub const IN_MAINTENANCE: &str = "InMaintenance";
}

/// Kairon's request to move one Machine to another node (`kmm`). Namespaced: the Machine's
/// namespace. `live` moves the running VM (the same runtime state on a new node); `cold`
/// (what `auto` and an empty strategy become) stops it, moves it and starts it there with a new
/// runtime. Made by operators, `kaironctl evacuate` and cordon evacuation; never by the
/// provider, which only reads them.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kairon.zyvor.dev",
    version = "v1alpha1",
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

/// Label on the MachineMigrations Kairon makes itself to evacuate a host: the host's name.
pub const EVACUATION_LABEL: &str = "kairon.zyvor.dev/evacuation";

/// `status.evacuation.reason` when a host is in maintenance.
pub const HOST_MAINTENANCE: &str = "HostMaintenance";

/// The label selector a Machine's `nodeSelector` expresses, against a host's labels.
pub fn host_matches(selector: Option<&BTreeMap<String, String>>, host_labels: &BTreeMap<String, String>) -> bool {
    selector.is_none_or(|s| s.iter().all(|(k, v)| host_labels.get(k) == Some(v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selector_matches_a_host_with_all_its_labels() {
        let host: BTreeMap<String, String> = [("zone", "a"), ("rack", "1")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        assert!(host_matches(None, &host));
        let sel: BTreeMap<String, String> = [("zone".to_string(), "a".to_string())].into();
        assert!(host_matches(Some(&sel), &host));
        let other: BTreeMap<String, String> = [("zone".to_string(), "b".to_string())].into();
        assert!(!host_matches(Some(&other), &host));
        assert!(!host_matches(Some(&sel), &BTreeMap::new()));
    }
}
