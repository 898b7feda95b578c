//! Our model of a Kairon Machine.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Kairon virtual machine. Namespaced; reconciled by kairon-controller (or the simulator).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kairon.zyvor.dev",
    version = "v1alpha1",
    kind = "Machine",
    namespaced,
    status = "MachineStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Machine is a Kairon virtual machine (development CRD; production clusters get it from Kairon).",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Host", type_ = "string", json_path = ".status.hostName"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    #[x_kube(validation = Rule::new("self >= 1").message("cpus must be at least 1"))]
    pub cpus: i32,
    pub memory: Quantity,
    pub image: String,
    pub disk_size: Quantity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init: Option<CloudInit>,
    /// What Kairon does with the VM when its host goes into maintenance (KubeVirt's names):
    /// `LiveMigrateIfPossible` (Kairon's default when absent: migrate live when the VM can be,
    /// else as `External`), `LiveMigrate` (only live; the maintenance waits), `External` (never
    /// moved: `status.evacuation` asks the owner to replace the VM before the deadline) or
    /// `None` (stopped when the maintenance starts, without asking). See [`eviction`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['LiveMigrateIfPossible', 'LiveMigrate', 'External', 'None']").message("evictionStrategy must be one of LiveMigrateIfPossible, LiveMigrate, External, None"))]
    pub eviction_strategy: Option<String>,
}

/// Kairon's eviction strategies (`spec.evictionStrategy`).
pub mod eviction {
    pub const LIVE_MIGRATE_IF_POSSIBLE: &str = "LiveMigrateIfPossible";
    pub const LIVE_MIGRATE: &str = "LiveMigrate";
    pub const EXTERNAL: &str = "External";
    pub const NONE: &str = "None";
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Network {
    pub name: String,
}

/// Forwarded verbatim into the NoCloud seed the VM boots with.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CloudInit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<UserData>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_config: Option<String>,
}

/// Cloud-init user-data: CAPI bootstrap data, which holds cluster secrets. Its `Debug` never
/// shows the content, so it cannot reach a log line by accident.
#[derive(Serialize, Deserialize, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct UserData(pub String);

impl fmt::Debug for UserData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserData(<redacted, {} bytes>)", self.0.len())
    }
}

impl UserData {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for UserData {
    fn from(text: String) -> Self {
        UserData(text)
    }
}

/// What kairon-controller reports.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Pending, Provisioning, Running, Stopped, Failed or Terminating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Equals `metadata.uid`; the guest's NoCloud instance-id.
    #[serde(default, rename = "instanceID", skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// The Kairon host the VM runs on; changes in place when the VM is migrated live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_name: Option<String>,
    /// The labels of the host in `hostName` (its zone among them), as placed or migrated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<Address>>,
    /// Present while Kairon wants the VM off its host and will not move it itself: the VM's
    /// owner should replace it before `deadline`, when Kairon stops it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evacuation: Option<Evacuation>,
    /// Machine-readable reason when Failed (e.g. ImageNotFound, Unschedulable) or Stopped by
    /// Kairon (EvacuationDeadlineExceeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// Kairon's request that the VM's owner take it off its host (`status.evacuation`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Evacuation {
    /// The host being evacuated.
    pub host_name: String,
    /// Why: `HostMaintenance`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<String>,
    /// RFC 3339: when Kairon stops the VM if it still runs on `hostName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Address {
    #[serde(rename = "type")]
    pub type_: String,
    pub address: String,
}

/// Kairon's phases.
///
/// Kairon's own (kairon-node and kairon-controller set them as plain strings; none is terminal,
/// Kairon keeps reconciling): Pending, Starting, Running, Paused, Halted, Stopped, Error,
/// Unknown, Blocked. Provisioning, Failed and Terminating are the simulator's until it plays
/// Kairon's phases.
pub mod phase {
    pub const PENDING: &str = "Pending";
    /// Kairon: FluxVM is creating or starting the VM.
    pub const STARTING: &str = "Starting";
    /// Kairon: `spec.powerState: Paused` took effect.
    pub const PAUSED: &str = "Paused";
    /// Kairon: `spec.powerState: Halted`: the VMM is stopped, the VM and its disk are kept.
    pub const HALTED: &str = "Halted";
    /// Kairon: a reconcile of the Machine failed (`status.message` says why); Kairon retries.
    pub const ERROR: &str = "Error";
    /// Kairon: FluxVM reported a status Kairon does not know.
    pub const UNKNOWN: &str = "Unknown";
    /// Kairon: adopt-only (an incoming migration) and no runtime yet.
    pub const BLOCKED: &str = "Blocked";
    pub const PROVISIONING: &str = "Provisioning";
    pub const RUNNING: &str = "Running";
    pub const STOPPED: &str = "Stopped";
    pub const FAILED: &str = "Failed";
    pub const TERMINATING: &str = "Terminating";
    /// `status.reason` of a VM Kairon stopped because its owner did not replace it before the
    /// evacuation deadline.
    pub const EVACUATION_DEADLINE_EXCEEDED: &str = "EvacuationDeadlineExceeded";
    /// Ours, in memory only, never Kairon's: the object could not be read as a Kairon Machine
    /// (`status.message` says why; see [`super::super::machine_from_value`]).
    pub(crate) const UNREADABLE: &str = "capkr.Unreadable";
}
