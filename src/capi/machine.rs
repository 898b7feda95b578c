//! Partial view of `cluster.x-k8s.io/v1beta2` Machine.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{CONTROL_PLANE_LABEL, ContractVersionedObjectReference};

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
/// How long a Machine may be without its Node before it counts as never getting one: the
/// node startup timeout a MachineHealthCheck has by default in CAPI (10 minutes).
pub const NODE_STARTUP: std::time::Duration = std::time::Duration::from_secs(600);

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bootstrap {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_ref: Option<ContractVersionedObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
}

impl Machine {
    /// Whether the Machine is being deleted.
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
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
}

/// A Machine as the KaironMachine controller's cache keeps it: what the provider reads of a
/// Machine and nothing else (see [`MachineView::cached`]). At thousands of Machines a cached
/// [`Machine`] weighs its label and annotation maps (a map node is about half a KiB however
/// few its entries), its owner references and conditions; this keeps the labels as one
/// boxed slice and the rest as plain values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachineView {
    /// Name, namespace, uid, creation and deletion; no labels, annotations, finalizers,
    /// owner references, managedFields or resourceVersion (never written from the cache).
    pub metadata: ObjectMeta,
    pub spec: MachineSpec,
    /// Every label, sorted by key: MachineHealthChecks select by any of them.
    labels: Box<[(Box<str>, Box<str>)]>,
    /// The values of [`READ_MACHINE_ANNOTATIONS`] it has.
    annotations: Box<[(&'static str, Box<str>)]>,
    /// The kind of its controller owner.
    controller_kind: Option<Box<str>>,
    /// The name and uid of its controller owner when that is a MachinePool (a pool member's
    /// bootstrap data is named by its pool).
    pool: Option<(Box<str>, Box<str>)>,
    /// `status.nodeRef` is set.
    has_node: bool,
    /// `status.phase` is `Failed`.
    failed: bool,
}

impl MachineView {
    /// `m` as the cache keeps it.
    pub fn cached(m: Machine) -> MachineView {
        let Machine { metadata, spec, status } = m;
        let ObjectMeta {
            name,
            namespace,
            uid,
            creation_timestamp,
            deletion_timestamp,
            labels,
            annotations,
            owner_references,
            ..
        } = metadata;
        let mut labels: Box<[(Box<str>, Box<str>)]> = labels
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
            .collect();
        labels.sort_unstable();
        let mut annotations = annotations.unwrap_or_default();
        let annotations = READ_MACHINE_ANNOTATIONS
            .iter()
            .filter_map(|k| annotations.remove(*k).map(|v| (*k, v.into_boxed_str())))
            .collect();
        let controller = owner_references
            .unwrap_or_default()
            .into_iter()
            .find(|r| r.controller == Some(true));
        let pool = controller
            .as_ref()
            .filter(|r| r.kind == "MachinePool" && super::group_of(&r.api_version) == super::GROUP)
            .map(|r| (r.name.clone().into_boxed_str(), r.uid.clone().into_boxed_str()));
        let status = status.unwrap_or_default();
        MachineView {
            metadata: ObjectMeta {
                name,
                namespace,
                uid,
                creation_timestamp,
                deletion_timestamp,
                ..Default::default()
            },
            spec,
            labels,
            annotations,
            controller_kind: controller.map(|r| r.kind.into_boxed_str()),
            pool,
            has_node: status.node_ref.is_some(),
            failed: status.phase.as_deref() == Some("Failed"),
        }
    }

    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.labels[i].1)
    }

    /// Every label, as a map (for label selectors).
    pub fn labels(&self) -> std::collections::BTreeMap<String, String> {
        self.labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Whether it has annotation `key`, one of [`READ_MACHINE_ANNOTATIONS`].
    pub fn has_annotation(&self, key: &str) -> bool {
        debug_assert!(READ_MACHINE_ANNOTATIONS.contains(&key), "annotation {key} is not kept");
        self.annotations.iter().any(|(k, _)| *k == key)
    }

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
        self.label(CONTROL_PLANE_LABEL).is_some()
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
        self.has_node
    }

    /// Whether the Machine will never get a Node: it has none and is being deleted, has failed,
    /// or has been without one for longer than [`NODE_STARTUP`] (a MachineHealthCheck would
    /// have replaced it by then; without one, nothing will). `now`: the time to judge by.
    pub fn never_gets_a_node(&self, now: k8s_openapi::jiff::Timestamp) -> bool {
        if self.has_node {
            return false;
        }
        let old = self.metadata.creation_timestamp.as_ref().is_some_and(|t| {
            std::time::Duration::try_from(now.duration_since(t.0)).is_ok_and(|age| age > NODE_STARTUP)
        });
        self.is_deleting() || self.failed || old
    }

    /// Whether the Machine is marked for remediation (`cluster.x-k8s.io/remediate-machine`).
    pub fn is_marked_for_remediation(&self) -> bool {
        self.has_annotation(REMEDIATE_MACHINE_ANNOTATION)
    }

    /// Whether MachineHealthChecks are told to leave the Machine alone.
    pub fn skips_remediation(&self) -> bool {
        self.has_annotation(SKIP_REMEDIATION_ANNOTATION)
    }

    /// The kind of the Machine's controller owner (MachineSet, KubeadmControlPlane, ...).
    pub fn controller_kind(&self) -> Option<&str> {
        self.controller_kind.as_deref()
    }

    /// The name and uid of the MachinePool that controls the Machine, if one does.
    pub fn pool(&self) -> Option<(&str, &str)> {
        self.pool.as_ref().map(|(name, uid)| (&**name, &**uid))
    }
}

// A `MachineView` is kept in kube's reflector stores under the Machine's own kind.
crate::view_of!(MachineView, Machine);

/// A watch event of Machines as the cache keeps them.
pub fn cached_event(event: kube::runtime::watcher::Event<Machine>) -> kube::runtime::watcher::Event<MachineView> {
    crate::view::map_event(event, MachineView::cached)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    /// A cached Machine answers every question the provider asks of a Machine, and keeps
    /// nothing else.
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
        m.metadata.namespace = Some("ns".into());
        m.metadata.uid = Some("uid-1".into());
        m.spec.bootstrap = Some(Bootstrap {
            config_ref: None,
            data_secret_name: Some("m1-data".into()),
        });
        let cached = MachineView::cached(m.clone());
        assert!(cached.is_control_plane());
        assert_eq!(cached.controller_kind(), Some("KubeadmControlPlane"));
        assert_eq!(cached.pool(), None, "its controller is no MachinePool");
        assert!(cached.has_node() && cached.is_marked_for_remediation());
        assert!(!cached.skips_remediation());
        assert!(cached.has_annotation(EVACUATION_ANNOTATION));
        assert_eq!(cached.annotations.len(), 2, "the read annotations only");
        assert_eq!(
            cached.labels(),
            m.metadata.labels.clone().unwrap(),
            "every label: MachineHealthChecks select by them"
        );
        assert_eq!(cached.label("cluster.x-k8s.io/deployment-name"), Some("md"));
        assert_eq!(cached.label("cluster.x-k8s.io/cluster-name"), None);
        assert_eq!(cached.data_secret_name(), Some("m1-data"));
        assert_eq!(
            (
                cached.metadata.name.as_deref(),
                cached.metadata.namespace.as_deref(),
                cached.metadata.uid.as_deref()
            ),
            (Some("m1"), Some("ns"), Some("uid-1"))
        );
        let meta = &cached.metadata;
        assert!(meta.labels.is_none() && meta.annotations.is_none() && meta.owner_references.is_none());
        assert!(meta.finalizers.is_none() && meta.resource_version.is_none());
        let now = k8s_openapi::jiff::Timestamp::now();
        assert!(!cached.never_gets_a_node(now), "it has its Node");

        let mut failed = Machine::new("m2", MachineSpec::default());
        failed.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "MachinePool".into(),
            name: "mp".into(),
            uid: "mp-uid".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        failed.status = Some(MachineStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        });
        let failed = MachineView::cached(failed);
        assert_eq!(failed.pool(), Some(("mp", "mp-uid")));
        assert!(!failed.has_node() && failed.never_gets_a_node(now));
        assert!(!failed.is_control_plane() && !failed.is_marked_for_remediation());
    }
}
