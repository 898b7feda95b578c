//! `KaironMachinePool`: the infrastructure machine pool of the CAPI v1beta2 contract
//! (InfraMachinePool): a pool of KaironMachines made from one template, each of which makes
//! its own plain Kairon Machine.
//!
//! CAPI's MachinePool owns it (controller reference) and reads, as v1.14.2's code does:
//! `status.ready` (not only `status.initialization.provisioned`: v1.14.2 copies the
//! providerIDs and replicas only once `status.ready` is true), `spec.providerIDList`,
//! `status.replicas`, and `status.infrastructureMachineKind` (MachinePool Machines: one
//! KaironMachine per VM of the pool, for which CAPI creates a Machine). Unlike a
//! KaironMachine's, the spec's template is mutable: a change rolls the pool (ClusterClass
//! topology patches it in place).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::KaironMachineSpec;
use super::kairon_machine::Initialization;

/// Desired state of a pool of Kairon virtual machines.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KaironMachinePool",
    namespaced,
    status = "KaironMachinePoolStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "kmp",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "KaironMachinePool is the Cluster API infrastructure machine pool: KaironMachines made from one template, each with its own Kairon Machine.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name",
        description = "Cluster this pool belongs to"
    ),
    printcolumn(
        name = "MachinePool",
        type_ = "string",
        json_path = ".metadata.ownerReferences[?(@.kind==\"MachinePool\")].name",
        description = "MachinePool that owns this KaironMachinePool"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.template.image.imageRef"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct KaironMachinePoolSpec {
    /// Provider IDs of the pool's VMs (`kairon://<name>`), written by the controller; CAPI
    /// matches them with Nodes. A VM's stays until its KaironMachine is gone, so that CAPI
    /// never deletes a Node that was not drained.
    #[serde(default, rename = "providerIDList", skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 10000), inner(length(min = 1, max = 512)))]
    pub provider_id_list: Option<Vec<String>>,

    /// What each VM of the pool is: the fields of a KaironMachine's spec. A change rolls the
    /// pool (every VM replaced, by `strategy`).
    #[x_kube(validation = Rule::new("!has(self.providerID)").message("spec.template.providerID must not be set: the controller writes it on each KaironMachine of the pool"))]
    #[x_kube(validation = Rule::new("!has(self.network) || !has(self.network.mac)").message("spec.template.network.mac must not be set: every VM of the pool would have the same MAC address"))]
    pub template: KaironMachineSpec,

    /// How VMs are replaced when the template changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<PoolStrategy>,
}

/// How a template change reaches the pool's VMs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.maxSurge) ? self.maxSurge : 1) + (has(self.maxUnavailable) ? self.maxUnavailable : 0) > 0").message("strategy.maxSurge and strategy.maxUnavailable must not both be 0: the pool could never roll"))]
pub struct PoolStrategy {
    /// VMs above the desired number while rolling (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 1000").message("strategy.maxSurge must be between 0 and 1000"))]
    pub max_surge: Option<i32>,
    /// Available VMs below the desired number while rolling (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 1000").message("strategy.maxUnavailable must be between 0 and 1000"))]
    pub max_unavailable: Option<i32>,
    /// Which VMs go first on a scale-in, after those CAPI marked
    /// (`cluster.x-k8s.io/delete-machine`) and those not available: `Oldest` (the default)
    /// or `Newest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['Oldest', 'Newest']").message("strategy.deletePolicy must be Oldest or Newest"))]
    pub delete_policy: Option<String>,
}

/// Delete policies (`spec.strategy.deletePolicy`).
pub mod delete_policy {
    pub const OLDEST: &str = "Oldest";
    pub const NEWEST: &str = "Newest";
}

impl KaironMachinePoolSpec {
    /// (maxSurge, maxUnavailable) with their defaults, 1 and 0.
    pub fn surge_and_unavailable(&self) -> (i32, i32) {
        let s = self.strategy.as_ref();
        (
            s.and_then(|s| s.max_surge).unwrap_or(1).max(0),
            s.and_then(|s| s.max_unavailable).unwrap_or(0).max(0),
        )
    }

    /// Whether the newest VMs go first on a scale-in.
    pub fn newest_first(&self) -> bool {
        self.strategy.as_ref().and_then(|s| s.delete_policy.as_deref()) == Some(delete_policy::NEWEST)
    }
}

/// Observed state of a KaironMachinePool.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KaironMachinePoolStatus {
    /// True once the pool has what it needs to make members (its MachinePool's bootstrap data,
    /// the cluster's infrastructure); never goes back to false. What CAPI v1.14.2 reads (with
    /// `initialization.provisioned`, written alike).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,

    /// Contract field: `provisioned` as `ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,

    /// Members of the pool whose KaironMachine has a VM (those in `spec.providerIDList`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("status.replicas must not be negative"))]
    pub replicas: Option<i32>,

    /// Of those, the ones whose VM runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("status.readyReplicas must not be negative"))]
    pub ready_replicas: Option<i32>,

    /// `KaironMachine`: CAPI makes a Machine for each KaironMachine of the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub infrastructure_machine_kind: Option<String>,

    /// Conditions: Ready, Paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[schemars(length(max = 32))]
    pub conditions: Option<Vec<Condition>>,
}

/// The machine kind CAPI makes Machines for (`status.infrastructureMachineKind`).
pub const INFRASTRUCTURE_MACHINE_KIND: &str = "KaironMachine";

impl KaironMachinePoolStatus {
    /// Whether the pool was provisioned (either field: both are written together and never
    /// go back).
    pub fn is_provisioned(&self) -> bool {
        self.ready == Some(true) || self.initialization.as_ref().and_then(|i| i.provisioned) == Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_defaults_and_provisioning() {
        let mut spec = KaironMachinePoolSpec::default();
        assert_eq!(spec.surge_and_unavailable(), (1, 0), "surge first when absent");
        assert!(!spec.newest_first());
        spec.strategy = Some(PoolStrategy {
            max_surge: Some(0),
            max_unavailable: Some(2),
            delete_policy: Some(delete_policy::NEWEST.into()),
        });
        assert_eq!(spec.surge_and_unavailable(), (0, 2));
        assert!(spec.newest_first());

        let mut st = KaironMachinePoolStatus::default();
        assert!(!st.is_provisioned());
        st.ready = Some(true);
        assert!(st.is_provisioned(), "what CAPI v1.14.2 reads");
        st.ready = None;
        st.initialization = Some(Initialization {
            provisioned: Some(true),
        });
        assert!(st.is_provisioned());
    }
}
