//! Our model of Kairon's MachineSet as Kairon has it (`docs/kairon-api.md`, "MachineSet"): a
//! number of Kairon Machines made from one template, each labelled with its set's name and the
//! hash of the template it was made from.
//!
//! What Kairon does with it, each reconcile tick: the members are the Machines of the set's
//! namespace labelled with its name and not being deleted; below `spec.replicas`, new members
//! are made from the template (whatever else is going on); a member whose hash label is not the
//! current template's is outdated, and a `RollingUpdate` deletes outdated ones while enough stay
//! (`maxUnavailable`, default 1, at least 1), a `Recreate` all at once; above `spec.replicas`
//! with nothing outdated, Kairon deletes members in list order, its own choice. There is no
//! ownerReference, no surge and no scale subresource, and Kairon never lowers
//! `spec.replicas`: a member deleted by anyone else is replaced.
//!
//! It backs a KaironMachinePool (`set_desired`, `set_observe`, `MachineSets`); the development
//! CRD, the simulator and the tests share this one model.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::MachineSpec;

/// Kairon Machines from a template. Namespaced (its members are in its namespace).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kairon.zyvor.dev",
    version = "v1",
    kind = "MachineSet",
    namespaced,
    status = "MachineSetStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "ms",
    doc = "MachineSet keeps a number of Kairon Machines from a template (development CRD; production clusters get it from Kairon).",
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Updated", type_ = "integer", json_path = ".status.updatedReplicas"),
    printcolumn(name = "Strategy", type_ = "string", json_path = ".spec.strategy")
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetSpec {
    /// Members kept, not counting those being deleted. Only its writer changes it.
    #[schemars(range(min = 0))]
    pub replicas: i32,
    pub template: MachineTemplate,
    /// `RollingUpdate` (the default) or `Recreate`: how outdated members are replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["RollingUpdate", "Recreate"]))]
    pub strategy: Option<String>,
    /// How many members a RollingUpdate may take down at once: an integer or a percentage of
    /// `replicas` (default 1; 0 counts as 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<String>,
}

/// What each member is made from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MachineTemplate {
    /// Copied onto each member, besides the two labels Kairon adds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// A Machine's spec. Kairon's CRD keeps it without a schema (no pruning, no validation):
    /// a member is validated when it is made.
    #[schemars(schema_with = "unchecked_spec")]
    pub spec: MachineSpec,
}

fn unchecked_spec(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetStatus {
    /// Members not being deleted, whatever their phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Members of the current template that are Running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Members of the current template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    /// The error of Kairon's last step, if it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Strategies (`spec.strategy`).
pub mod strategy {
    pub const ROLLING_UPDATE: &str = "RollingUpdate";
    pub const RECREATE: &str = "Recreate";
}

/// Label on each member: its set's name.
pub const MACHINESET_LABEL: &str = "kairon.zyvor.dev/machineset";
/// Label on each member: the hash of the template it was made from (the whole template).
pub const TEMPLATE_HASH_LABEL: &str = "kairon.zyvor.dev/machineset-template-hash";

/// Kairon's finalizer on a set (newer kairon-controllers): on deletion, Kairon deletes every
/// member (undrained) before the set goes.
pub const MACHINESET_FINALIZER: &str = "kairon.zyvor.dev/machineset-cleanup";

impl MachineSet {
    /// `spec.strategy`, Kairon's default when absent.
    pub fn strategy(&self) -> &str {
        self.spec.strategy.as_deref().unwrap_or(strategy::ROLLING_UPDATE)
    }

    /// `spec.maxUnavailable` for `replicas` as Kairon reads it: an integer or a percentage
    /// (rounded down), default 1, at least 1. `None`: unreadable (Kairon reports it in
    /// `status.message` and does nothing).
    pub fn max_unavailable(&self, replicas: i32) -> Option<i32> {
        let raw = self.spec.max_unavailable.as_deref().unwrap_or("1").trim();
        let n = match raw.strip_suffix('%') {
            Some(p) => {
                let p: i64 = p.trim().parse().ok().filter(|p| *p >= 0)?;
                i32::try_from(i64::from(replicas.max(0)) * p / 100).ok()?
            }
            None => raw.parse::<i32>().ok().filter(|n| *n >= 0)?,
        };
        Some(n.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_machineset_reads_kairons_shape_with_its_defaults() {
        let set: MachineSet = serde_json::from_value(json!({
            "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineSet",
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"replicas": 3, "template": {
                "labels": {"app": "web"},
                "spec": {"resources": {"cpu": "2", "memory": "4Gi"}, "image": {"imageRef": "img"}}}}}))
        .expect("reads");
        assert_eq!(set.spec.replicas, 3);
        assert_eq!(
            set.spec
                .template
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .map(String::as_str),
            Some("web")
        );
        assert_eq!(set.strategy(), strategy::ROLLING_UPDATE);
        assert_eq!(set.max_unavailable(3), Some(1));
    }

    #[test]
    fn max_unavailable_is_an_integer_or_a_percentage_and_never_0() {
        let with = |v: &str| {
            let mut s = MachineSet::default();
            s.spec.max_unavailable = Some(v.into());
            s
        };
        assert_eq!(with("2").max_unavailable(5), Some(2));
        assert_eq!(with("0").max_unavailable(5), Some(1));
        assert_eq!(with("50%").max_unavailable(5), Some(2));
        assert_eq!(with("10%").max_unavailable(5), Some(1));
        assert_eq!(with("-1").max_unavailable(5), None);
        assert_eq!(with("x").max_unavailable(5), None);
    }
}
