//! Read-only views of the CAPI core objects we read (`cluster.x-k8s.io/v1beta2` Cluster,
//! Machine and MachinePool) and the helpers every CAPI provider needs: owner lookup, pause, externally managed.
//!
//! The views model only the fields we read, all optional, so a newer CAPI with more fields
//! deserializes fine and the caches hold little.

pub mod bootstrap;
mod cluster;
mod health_check;
mod machine;
mod machine_pool;

/// The control-plane endpoint type is ours and CAPI's alike (`APIEndpoint`).
pub use crate::api::APIEndpoint;
pub use cluster::{Cluster, ClusterCondition, ClusterInitialization, ClusterSpec, ClusterStatus};
pub(crate) use health_check::keep_what_is_read as keep_what_is_read_of_health_check;
pub use health_check::{MachineHealthCheck, MachineHealthCheckSpec, selected as selected_by_health_check};
pub use machine::cached_event as cached_machine_event;
pub use machine::{
    Bootstrap, EVACUATION_ANNOTATION, HEALTH_CHECK_SUCCEEDED, Machine, MachineNodeReference, MachineSpec,
    MachineStatus, MachineView, OWNER_REMEDIATED, REMEDIATE_MACHINE_ANNOTATION, SKIP_REMEDIATION_ANNOTATION,
};
pub use machine_pool::{
    DELETE_MACHINE_ANNOTATION, MachinePool, MachinePoolMachineSpec, MachinePoolSpec, MachinePoolTemplate,
    POOL_NAME_LABEL, format_label_value,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// CAPI core API group.
pub(crate) const GROUP: &str = "cluster.x-k8s.io";

/// Label naming the Cluster an object belongs to.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Label naming the MachineDeployment of a Machine (and of its infrastructure machine).
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
/// Label marking control-plane Machines.
pub(crate) const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// Annotation pausing reconciliation of one object.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// Annotation marking an infrastructure cluster as managed by someone else (an annotation in
/// the code, although the contract document calls it a label).
pub(crate) const MANAGED_BY_ANNOTATION: &str = "cluster.x-k8s.io/managed-by";
/// Annotation clusterctl puts on objects it deletes after moving them elsewhere.
pub(crate) const DELETE_FOR_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";
/// Every annotation the provider reads of its own objects (KaironClusters, KaironMachines):
/// their caches keep these and no other.
pub(crate) const READ_ANNOTATIONS: [&str; 3] = [PAUSED_ANNOTATION, MANAGED_BY_ANNOTATION, DELETE_FOR_MOVE_ANNOTATION];
/// Label selecting which objects a provider instance reconciles (`--watch-filter`).
pub(crate) const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";

/// A v1beta2 contract reference: group, kind and name, no version.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContractVersionedObjectReference {
    #[serde(default)]
    pub api_group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
}

impl ContractVersionedObjectReference {
    /// Whether this reference points at `kind` in our infrastructure group.
    pub fn is(&self, group: &str, kind: &str) -> bool {
        self.api_group == group && self.kind == kind
    }
}

/// Finds the owner of `kind` in CAPI's group, whatever its version and controller flag
/// (`util.GetOwnerCluster` / `util.GetOwnerMachine`).
pub fn owner<'a>(meta: &'a ObjectMeta, kind: &str) -> Option<&'a OwnerReference> {
    meta.owner_references
        .as_deref()?
        .iter()
        .find(|r| r.kind == kind && group_of(&r.api_version) == GROUP)
}

/// The group of an `apiVersion` (`""` for the core group).
pub(crate) fn group_of(api_version: &str) -> &str {
    match api_version.split_once('/') {
        Some((group, _)) => group,
        None => "",
    }
}

/// The name of the Cluster an object belongs to: its owner Cluster (as CAPI sets on
/// infrastructure clusters and templates), else its `cluster.x-k8s.io/cluster-name` label (as
/// CAPI sets on infrastructure machines, which a Machine owns).
pub(crate) fn cluster_name(meta: &ObjectMeta) -> Option<&str> {
    owner(meta, "Cluster")
        .map(|o| o.name.as_str())
        .or_else(|| label(meta, CLUSTER_NAME_LABEL))
}

/// Why an object is paused, if it is. Checked before deletion handling: `clusterctl move`
/// pauses, then deletes the source objects, and those deletions must not destroy VMs.
pub(crate) fn paused_reason(cluster: Option<&Cluster>, meta: &ObjectMeta) -> Option<&'static str> {
    if cluster.is_some_and(|c| c.spec.paused == Some(true)) {
        Some("Cluster spec.paused is set to true")
    } else if has_annotation(meta, PAUSED_ANNOTATION) {
        Some("the cluster.x-k8s.io/paused annotation is set")
    } else {
        None
    }
}

/// Whether an infrastructure cluster is managed by someone else and must be left alone.
pub(crate) fn is_externally_managed(meta: &ObjectMeta) -> bool {
    has_annotation(meta, MANAGED_BY_ANNOTATION)
}

/// Keeps the entries of a label or annotation map whose keys are in `keep`; an empty map goes
/// (a Rust `BTreeMap` costs a 0.5 KiB node however few entries it holds). For caches.
pub(crate) fn retain_keys(map: &mut Option<std::collections::BTreeMap<String, String>>, keep: &[&str]) {
    if let Some(m) = map.as_mut() {
        m.retain(|k, _| keep.contains(&k.as_str()));
    }
    if map.as_ref().is_some_and(|m| m.is_empty()) {
        *map = None;
    }
}

/// Whether `meta` has the annotation `key` (any value).
pub(crate) fn has_annotation(meta: &ObjectMeta, key: &str) -> bool {
    meta.annotations.as_ref().is_some_and(|a| a.contains_key(key))
}

/// The value of label `key`.
pub(crate) fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned_by(api_version: &str, kind: &str) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "x".into(),
                uid: "u".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn owner_is_found_by_kind_and_group_in_any_version() {
        for version in [
            "cluster.x-k8s.io/v1beta1",
            "cluster.x-k8s.io/v1beta2",
            "cluster.x-k8s.io/v1",
        ] {
            assert!(owner(&owned_by(version, "Machine"), "Machine").is_some(), "{version}");
        }
    }

    #[test]
    fn owner_of_another_group_or_kind_is_not_the_owner() {
        assert!(owner(&owned_by("example.com/v1", "Machine"), "Machine").is_none());
        assert!(owner(&owned_by("kairon.zyvor.dev/v1alpha1", "Machine"), "Machine").is_none());
        assert!(owner(&owned_by("cluster.x-k8s.io/v1beta2", "MachineSet"), "Machine").is_none());
        assert!(owner(&ObjectMeta::default(), "Machine").is_none());
    }

    #[test]
    fn cluster_name_from_owner_else_label() {
        let mut meta = owned_by("cluster.x-k8s.io/v1beta2", "Cluster");
        assert_eq!(cluster_name(&meta), Some("x"));
        meta.labels = Some([(CLUSTER_NAME_LABEL.to_string(), "by-label".to_string())].into());
        assert_eq!(cluster_name(&meta), Some("x"), "the owner wins");
        meta.owner_references = None;
        assert_eq!(cluster_name(&meta), Some("by-label"));
        assert_eq!(cluster_name(&ObjectMeta::default()), None);
    }

    #[test]
    fn paused_by_cluster_or_annotation() {
        let mut cluster = Cluster::new("c", ClusterSpec::default());
        let annotated = ObjectMeta {
            annotations: Some([(PAUSED_ANNOTATION.to_string(), String::new())].into()),
            ..Default::default()
        };
        assert_eq!(paused_reason(Some(&cluster), &ObjectMeta::default()), None);
        assert_eq!(paused_reason(None, &ObjectMeta::default()), None);
        assert!(paused_reason(None, &annotated).unwrap().contains("annotation"));
        cluster.spec.paused = Some(true);
        assert!(
            paused_reason(Some(&cluster), &ObjectMeta::default())
                .unwrap()
                .contains("spec.paused")
        );
        cluster.spec.paused = Some(false);
        assert_eq!(paused_reason(Some(&cluster), &ObjectMeta::default()), None);
    }
}
