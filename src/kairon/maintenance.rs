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

/// A request to move one running VM to another host, live: the same VM (UID, addresses,
/// disks) on a new host. Namespaced (the VM's namespace); whatever the VM's
/// `evictionStrategy` says, as KubeVirt's VirtualMachineInstanceMigration.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kairon.zyvor.dev",
    version = "v1alpha1",
    kind = "MachineMigration",
    namespaced,
    status = "MachineMigrationStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "MachineMigration moves a Kairon Machine to another host (development CRD; production clusters get it from Kairon).",
    printcolumn(name = "Machine", type_ = "string", json_path = ".spec.machineName"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "From", type_ = "string", json_path = ".status.sourceHost"),
    printcolumn(name = "To", type_ = "string", json_path = ".status.targetHost"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("spec is immutable: create another MachineMigration"))]
pub struct MachineMigrationSpec {
    /// The Kairon Machine to move (same namespace).
    #[x_kube(validation = Rule::new("size(self) > 0").message("machineName must not be empty"))]
    pub machine_name: String,
    /// The host to move to. Without it Kairon chooses a schedulable host that matches the
    /// Machine's `nodeSelector`; with it the selector is not checked (an operator's override).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_host: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineMigrationStatus {
    /// Pending, Running, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_host: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_timestamp: Option<String>,
    /// Machine-readable reason when Failed (MachineNotRunning, NoTargetHost, NotMigratable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A MachineMigration's phases.
pub mod migration_phase {
    pub const PENDING: &str = "Pending";
    pub const RUNNING: &str = "Running";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const FAILED: &str = "Failed";
}

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
