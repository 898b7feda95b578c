//! Partial view of `cluster.x-k8s.io/v1beta2` Machine.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{CONTROL_PLANE_LABEL, ContractVersionedObjectReference, has_annotation};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Machine",
    namespaced,
    status = "MachineStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    #[serde(default)]
    pub cluster_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<Bootstrap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractVersionedObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// What of a Machine's status the provider reads: whether its Node is known, and the
/// remediation conditions (type and status only; the cache keeps nothing else).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<MachineNodeReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<super::ClusterCondition>>,
    /// `Failed` is the one phase read: such a Machine never gets a Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

/// `status.nodeRef` (v1beta2: the Node's name).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct MachineNodeReference {
    #[serde(default)]
    pub name: String,
}

/// Annotation asking the MachineHealthCheck that selects a Machine to mark it unhealthy, so
/// that its owner (MachineSet, KubeadmControlPlane) replaces it.
pub const REMEDIATE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/remediate-machine";
/// Annotation telling MachineHealthChecks to leave a Machine alone.
pub const SKIP_REMEDIATION_ANNOTATION: &str = "cluster.x-k8s.io/skip-remediation";
/// Our annotation beside [`REMEDIATE_MACHINE_ANNOTATION`]: why the Machine was marked (the
/// Kairon host in maintenance and Kairon's deadline).
pub const EVACUATION_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/kairon-evacuation";
/// The Machine condition a MachineHealthCheck sets on every Machine it selects. CAPI leaves it
/// in place when the MachineHealthCheck goes: whether one selects a Machine now is read from
/// the MachineHealthChecks themselves ([`super::MachineHealthCheck::selects`]).
pub const HEALTH_CHECK_SUCCEEDED: &str = "HealthCheckSucceeded";
/// The Machine condition its owner sets while it remediates the Machine.
pub const OWNER_REMEDIATED: &str = "OwnerRemediated";
/// The Machine annotations the cache keeps.
pub(crate) const READ_MACHINE_ANNOTATIONS: [&str; 3] = [
    REMEDIATE_MACHINE_ANNOTATION,
    SKIP_REMEDIATION_ANNOTATION,
    EVACUATION_ANNOTATION,
];
/// The Machine conditions the cache keeps.
const READ_MACHINE_CONDITIONS: [&str; 1] = [OWNER_REMEDIATED];
/// How long a Machine may be without its Node before it counts as never getting one: the
/// node startup timeout a MachineHealthCheck has by default in CAPI (10 minutes).
pub const NODE_STARTUP: std::time::Duration = std::time::Duration::from_secs(600);

/// What the Machine cache keeps: the spec view, the labels (which MachineHealthCheck selects
/// it), deletion, the remediation annotations, the controller owner, whether the Node is known,
/// the `Failed` phase and the owner's remediation condition (type and status). Everything else
/// goes before the object is stored: at thousands of Machines their status and managedFields
/// are most of their weight.
pub(crate) fn keep_what_is_read(m: &mut Machine) {
    let meta = &mut m.metadata;
    meta.managed_fields = None;
    meta.finalizers = None;
    // Never written from the cache, so never conditional on it; the cache's key would hold it
    // once more.
    meta.resource_version = None;
    super::retain_keys(&mut meta.annotations, &READ_MACHINE_ANNOTATIONS);
    if let Some(refs) = meta.owner_references.as_mut() {
        refs.retain(|r| r.controller == Some(true));
        for r in refs.iter_mut().filter(|r| r.kind != "MachinePool") {
            // The kind is what is read; the rest of the reference is not (but a MachinePool's:
            // a pool member's bootstrap data is named by it).
            r.uid = String::new();
            r.name = String::new();
            r.block_owner_deletion = None;
        }
    }
    if meta.owner_references.as_ref().is_some_and(Vec::is_empty) {
        meta.owner_references = None;
    }
    if let Some(status) = m.status.as_mut() {
        if let Some(conds) = status.conditions.as_mut() {
            conds.retain(|c| READ_MACHINE_CONDITIONS.contains(&c.type_.as_str()));
        }
        if status.conditions.as_ref().is_some_and(Vec::is_empty) {
            status.conditions = None;
        }
        if let Some(n) = status.node_ref.as_mut() {
            n.name = String::new();
        }
        status.phase = status.phase.take().filter(|p| p == "Failed");
    }
    if m.status
        .as_ref()
        .is_some_and(|s| s.node_ref.is_none() && s.conditions.is_none() && s.phase.is_none())
    {
        m.status = None;
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bootstrap {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_ref: Option<ContractVersionedObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
}

impl Machine {
    /// `spec.bootstrap.dataSecretName`, when set and non-empty.
    pub fn data_secret_name(&self) -> Option<&str> {
        self.spec
            .bootstrap
            .as_ref()?
            .data_secret_name
            .as_deref()
            .filter(|s| !s.is_empty())
    }

    /// `spec.bootstrap.configRef`: the bootstrap config that makes the data Secret, if any.
    pub(crate) fn bootstrap_config(&self) -> Option<&ContractVersionedObjectReference> {
        self.spec.bootstrap.as_ref()?.config_ref.as_ref()
    }

    /// Why this Machine is not the owner that `owner` (an ownerReference of the KaironMachine
    /// `km_name`) names, if it is not: another incarnation (UID), or its `infrastructureRef`
    /// names another object.
    pub(crate) fn not_owner_of(
        &self,
        owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
        km_name: &str,
    ) -> Option<String> {
        let name = self.metadata.name.as_deref().unwrap_or_default();
        if self.metadata.uid.as_deref() != Some(owner.uid.as_str()) {
            return Some(format!(
                "Machine {name} is not the one the ownerReference names (uid {})",
                owner.uid
            ));
        }
        let names_us = self
            .spec
            .infrastructure_ref
            .as_ref()
            .is_some_and(|r| r.is(crate::api::GROUP, "KaironMachine") && r.name == km_name);
        (!names_us)
            .then(|| format!("Machine {name} does not reference KaironMachine {km_name} in spec.infrastructureRef"))
    }

    /// Whether the Machine belongs to the control plane.
    pub fn is_control_plane(&self) -> bool {
        self.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL))
    }

    /// `spec.failureDomain`, when set and non-empty.
    pub fn failure_domain(&self) -> Option<&str> {
        self.spec.failure_domain.as_deref().filter(|s| !s.is_empty())
    }

    /// Whether the Machine is being deleted.
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// Whether its Node is known (`status.nodeRef`): a Machine without one is still coming up.
    pub fn has_node(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.node_ref.is_some())
    }

    /// The status of condition `type_`, if the Machine has it.
    pub fn condition(&self, type_: &str) -> Option<&str> {
        self.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| c.status.as_str())
    }

    /// Whether the Machine will never get a Node: it has none and is being deleted, has failed,
    /// or has been without one for longer than [`NODE_STARTUP`] (a MachineHealthCheck would
    /// have replaced it by then; without one, nothing will). `now`: the time to judge by.
    pub fn never_gets_a_node(&self, now: k8s_openapi::jiff::Timestamp) -> bool {
        if self.has_node() {
            return false;
        }
        let failed = self.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed");
        let old = self.metadata.creation_timestamp.as_ref().is_some_and(|t| {
            std::time::Duration::try_from(now.duration_since(t.0)).is_ok_and(|age| age > NODE_STARTUP)
        });
        self.is_deleting() || failed || old
    }

    /// Whether the Machine is marked for remediation (`cluster.x-k8s.io/remediate-machine`).
    pub fn is_marked_for_remediation(&self) -> bool {
        has_annotation(&self.metadata, REMEDIATE_MACHINE_ANNOTATION)
    }

    /// Whether MachineHealthChecks are told to leave the Machine alone.
    pub fn skips_remediation(&self) -> bool {
        has_annotation(&self.metadata, SKIP_REMEDIATION_ANNOTATION)
    }

    /// The kind of the Machine's controller owner (MachineSet, KubeadmControlPlane, ...).
    pub fn controller_kind(&self) -> Option<&str> {
        self.metadata
            .owner_references
            .as_deref()?
            .iter()
            .find(|r| r.controller == Some(true))
            .map(|r| r.kind.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    /// A cached Machine answers every question the provider asks of a Machine as the Machine
    /// itself does, and keeps nothing else.
    #[test]
    fn a_cached_machine_keeps_what_is_read() {
        let mut m = Machine::new("m1", MachineSpec::default());
        m.metadata.labels = Some(
            [(CONTROL_PLANE_LABEL, ""), ("cluster.x-k8s.io/deployment-name", "md")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
        );
        m.metadata.annotations = Some(
            [
                (REMEDIATE_MACHINE_ANNOTATION, ""),
                (EVACUATION_ANNOTATION, "h1 2026-01-01T00:00:00Z"),
                ("controlplane.cluster.x-k8s.io/kubeadm-cluster-configuration", "big"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        );
        let owner = |kind: &str, controller| OwnerReference {
            api_version: "x/v1".into(),
            kind: kind.into(),
            name: "o".into(),
            uid: "u".into(),
            controller,
            ..Default::default()
        };
        m.metadata.owner_references = Some(vec![owner("Cluster", None), owner("KubeadmControlPlane", Some(true))]);
        m.metadata.finalizers = Some(vec!["machine.cluster.x-k8s.io".into()]);
        let cond = |t: &str| super::super::ClusterCondition {
            type_: t.into(),
            status: "True".into(),
        };
        m.status = Some(MachineStatus {
            node_ref: Some(MachineNodeReference { name: "n1".into() }),
            conditions: Some(vec![
                cond("Ready"),
                cond(HEALTH_CHECK_SUCCEEDED),
                cond(OWNER_REMEDIATED),
            ]),
            phase: Some("Running".into()),
        });
        m.metadata.resource_version = Some("7".into());
        let mut cached = m.clone();
        keep_what_is_read(&mut cached);
        assert_eq!(cached.is_control_plane(), m.is_control_plane());
        assert_eq!(cached.controller_kind(), Some("KubeadmControlPlane"));
        assert!(cached.has_node() && cached.is_marked_for_remediation());
        assert_eq!(cached.condition(OWNER_REMEDIATED), Some("True"));
        assert!(!cached.skips_remediation());
        assert_eq!(cached.metadata.annotations.as_ref().map(|a| a.len()), Some(2));
        assert_eq!(
            cached.metadata.labels, m.metadata.labels,
            "every label: MachineHealthChecks select by them"
        );
        assert_eq!(cached.metadata.owner_references.as_ref().map(|o| o.len()), Some(1));
        assert_eq!(
            cached.condition("Ready"),
            None,
            "only the owner's remediation condition"
        );
        assert_eq!(
            cached.condition(HEALTH_CHECK_SUCCEEDED),
            None,
            "stale once its check is gone"
        );
        assert_eq!(cached.status.as_ref().unwrap().phase, None, "only Failed is kept");
        assert!(cached.metadata.finalizers.is_none() && cached.metadata.resource_version.is_none());

        let mut bare = Machine::new("m2", MachineSpec::default());
        bare.status = Some(MachineStatus::default());
        keep_what_is_read(&mut bare);
        assert_eq!(bare.status, None, "no empty status is kept");
        assert!(!bare.has_node());
    }
}
