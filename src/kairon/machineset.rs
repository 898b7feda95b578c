//! Our model of Kairon's MachineSet (`docs/kairon-api.md`): a number of Kairon Machines kept
//! from a template, each labelled with its set and its template's hash. Kairon copies the
//! template onto a Machine when it creates it and never rewrites a member; a member deleted by
//! anyone but Kairon lowers `spec.replicas` (scale-in of a chosen VM). It backs a
//! KaironMachinePool (`set_desired`, `set_observe`, `MachineSets`); the development CRDs, the
//! simulator and the tests share this one model.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::MachineSpec;

/// Kairon Machines from a template. Namespaced (its members are in its namespace).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kairon.zyvor.dev",
    version = "v1alpha1",
    kind = "MachineSet",
    namespaced,
    status = "MachineSetStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "MachineSet keeps a number of Kairon Machines from a template (development CRD; production clusters get it from Kairon).",
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Updated", type_ = "integer", json_path = ".status.updatedReplicas"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetSpec {
    /// Members kept, not counting those being deleted. Kairon lowers it by one for each member
    /// deleted by someone else.
    #[x_kube(validation = Rule::new("self >= 0").message("replicas must not be negative"))]
    pub replicas: i32,
    pub template: MachineTemplate,
    /// How a template change reaches existing members; Kairon's default is RollingUpdate with
    /// maxSurge 1, maxUnavailable 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
}

/// What each member is created from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MachineTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    pub spec: MachineSpec,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TemplateMetadata {
    /// Copied onto each member when it is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStrategy {
    /// `RollingUpdate` (Kairon replaces outdated members) or `OnDelete` (outdated members stay
    /// until their owner deletes them; replacements get the new template).
    #[serde(rename = "type")]
    #[x_kube(validation = Rule::new("self in ['RollingUpdate', 'OnDelete']").message("type must be RollingUpdate or OnDelete"))]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    /// Members above `replicas` while rolling (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("maxSurge must not be negative"))]
    pub max_surge: Option<i32>,
    /// Running members below `replicas` while rolling (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("maxUnavailable must not be negative"))]
    pub max_unavailable: Option<i32>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Members not being deleted, whatever their phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Of those, the Running ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Of those, the ones with the current template hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    /// The hash of the current template: what new members are labelled with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
}

/// Update strategies (`spec.updateStrategy.type`).
pub mod update_strategy {
    pub const ROLLING_UPDATE: &str = "RollingUpdate";
    pub const ON_DELETE: &str = "OnDelete";
}

/// Label on each member: its set's name.
pub const MACHINESET_LABEL: &str = "kairon.zyvor.dev/machineset";
/// Label on each member: the hash of the template it was created from (labels and spec
/// without `cloudInit`, so new user-data never rolls a set).
pub const TEMPLATE_HASH_LABEL: &str = "kairon.zyvor.dev/template-hash";
/// Annotation Kairon puts on a member it deletes itself (scale-down, rollout, set deleted),
/// value [`REMOVED_BY_MACHINESET`]: such a deletion does not lower `spec.replicas`.
pub const REMOVED_BY_ANNOTATION: &str = "kairon.zyvor.dev/removed-by";
pub const REMOVED_BY_MACHINESET: &str = "machineset";
/// Prefix of the annotation on a set, `scaled-in.kairon.zyvor.dev/<member uid>`, that records
/// that the deletion of that member lowered `spec.replicas` (so it is counted once).
pub const SCALED_IN_ANNOTATION_PREFIX: &str = "scaled-in.kairon.zyvor.dev/";
/// Kairon's finalizer on a set: its members are deleted first.
pub const MACHINESET_FINALIZER: &str = "kairon.zyvor.dev/machineset-cleanup";

impl MachineSet {
    /// `spec.updateStrategy` with Kairon's defaults: (is it RollingUpdate, maxSurge,
    /// maxUnavailable).
    pub fn rolling_update(&self) -> Option<(i32, i32)> {
        match &self.spec.update_strategy {
            Some(s) if s.type_ == update_strategy::ON_DELETE => None,
            s => {
                let r = s.as_ref().and_then(|s| s.rolling_update.as_ref());
                Some((
                    r.and_then(|r| r.max_surge).unwrap_or(1),
                    r.and_then(|r| r.max_unavailable).unwrap_or(0),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_machineset_reads_kairons_shape_with_its_default_strategy() {
        let set: MachineSet = serde_json::from_value(json!({
            "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineSet",
            "metadata": {"name": "pool", "namespace": "ns"},
            "spec": {"replicas": 3, "template": {
                "metadata": {"labels": {"role": "worker"}},
                "spec": {"resources": {"cpu": "2", "memory": "4Gi"}, "image": {"imageRef": "img"},
                         "legacyUserData": "#cloud-config"}}}}))
        .expect("reads");
        assert_eq!(set.spec.replicas, 3);
        assert_eq!(
            set.spec.template.spec.resources.as_ref().and_then(|r| r.cpu.as_deref()),
            Some("2")
        );
        assert_eq!(set.rolling_update(), Some((1, 0)), "RollingUpdate 1/0 when absent");

        let mut on_delete = set.clone();
        on_delete.spec.update_strategy = Some(UpdateStrategy {
            type_: update_strategy::ON_DELETE.into(),
            rolling_update: None,
        });
        assert_eq!(on_delete.rolling_update(), None);

        let mut surge0 = set;
        surge0.spec.update_strategy = Some(UpdateStrategy {
            type_: update_strategy::ROLLING_UPDATE.into(),
            rolling_update: Some(RollingUpdate {
                max_surge: Some(0),
                max_unavailable: Some(1),
            }),
        });
        assert_eq!(surge0.rolling_update(), Some((0, 1)));
    }
}
