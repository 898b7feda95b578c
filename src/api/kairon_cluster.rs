//! `KaironCluster` and `KaironClusterTemplate`: the infrastructure cluster of the CAPI
//! v1beta2 contract.
//!
//! Kairon has no load balancer of its own, so the control-plane endpoint is given by the user
//! (typically a kube-vip VIP) either here or on the Cluster. Failure domains are sets of Kairon
//! hosts, chosen by a host label selector.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::TemplateObjectMeta;
use super::kairon_machine::Initialization;

/// Desired state of a Kairon cluster's infrastructure.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KaironCluster",
    namespaced,
    status = "KaironClusterStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "kc",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "KaironCluster is the Cluster API infrastructure cluster for clusters of Kairon virtual machines.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name", description = "Cluster this KaironCluster belongs to"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".spec.controlPlaneEndpoint.host", description = "Control plane endpoint host"),
    printcolumn(name = "Provisioned", type_ = "boolean", json_path = ".status.initialization.provisioned"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status", description = "Ready condition"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("!has(oldSelf.spec.controlPlaneEndpoint) || !has(oldSelf.spec.controlPlaneEndpoint.host) || (has(self.spec.controlPlaneEndpoint) && has(self.spec.controlPlaneEndpoint.host) && self.spec.controlPlaneEndpoint.host == oldSelf.spec.controlPlaneEndpoint.host)").message("spec.controlPlaneEndpoint.host is immutable once set").field_path(".spec.controlPlaneEndpoint"),
    validation = Rule::new("has(self.spec.identityRef) == has(oldSelf.spec.identityRef) && (!has(self.spec.identityRef) || self.spec.identityRef == oldSelf.spec.identityRef)").message("spec.identityRef is immutable: the cluster's VMs live on the Kairon API it names").field_path(".spec.identityRef"),
    validation = Rule::new("!has(oldSelf.spec.controlPlaneEndpoint) || !has(oldSelf.spec.controlPlaneEndpoint.port) || (has(self.spec.controlPlaneEndpoint) && has(self.spec.controlPlaneEndpoint.port) && self.spec.controlPlaneEndpoint.port == oldSelf.spec.controlPlaneEndpoint.port)").message("spec.controlPlaneEndpoint.port is immutable once set").field_path(".spec.controlPlaneEndpoint"),
)]
#[serde(rename_all = "camelCase")]
pub struct KaironClusterSpec {
    /// Endpoint of the workload cluster's API server. When absent, the endpoint must be set on
    /// the Cluster by someone else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<APIEndpoint>,

    /// Failure domains: named sets of Kairon hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[x_kube(validation = Rule::new("self.all(x, self.exists_one(y, y.name == x.name))").message("failureDomains names must be unique"))]
    #[schemars(length(min = 1, max = 100))]
    pub failure_domains: Option<Vec<FailureDomainSpec>>,

    /// The Kairon API server this cluster's VMs are created on, and the credentials to use:
    /// a Secret in the cluster's namespace whose key `kubeconfig` holds a kubeconfig, or a
    /// KaironClusterIdentity that allows this namespace. When absent, the manager's own
    /// Kairon API (the management cluster, or `--kairon-kubeconfig`). Immutable.
    #[serde(default, rename = "identityRef", skip_serializing_if = "Option::is_none")]
    pub identity_ref: Option<KaironIdentityReference>,
}

/// A reference to the credentials of a Kairon API server (CAPV's `identityRef` shape).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KaironIdentityReference {
    /// Kind of the referenced object: `Secret` (in the cluster's namespace, key `kubeconfig`)
    /// or `KaironClusterIdentity` (cluster-scoped, shared by an operator with the namespaces it
    /// allows).
    #[x_kube(validation = Rule::new("self == 'Secret' || self == 'KaironClusterIdentity'").message("identityRef.kind must be Secret or KaironClusterIdentity"))]
    pub kind: String,
    /// Name of the referenced object.
    #[x_kube(validation = Rule::new("self.size() >= 1 && self.size() <= 253 && self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("identityRef.name must be an object name (lowercase DNS subdomain, at most 253 characters)"))]
    pub name: String,
}

/// `identityRef.kind` of a Secret in the cluster's namespace.
pub const IDENTITY_KIND_SECRET: &str = "Secret";
/// `identityRef.kind` of a [`super::KaironClusterIdentity`].
pub const IDENTITY_KIND_CLUSTER_IDENTITY: &str = "KaironClusterIdentity";

/// The key of an identity Secret that holds the kubeconfig.
pub const IDENTITY_KUBECONFIG_KEY: &str = "kubeconfig";

/// Host and port of an API server: our `spec.controlPlaneEndpoint` and, read from CAPI, the
/// Cluster's.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[x_kube(validation = Rule::new("has(self.host) || has(self.port)").message("controlPlaneEndpoint must set host or port"))]
pub struct APIEndpoint {
    /// DNS name or IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub host: Option<String>,
    /// TCP port, 1-65535.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 65535").message("port must be between 1 and 65535"))]
    pub port: Option<i32>,
}

impl APIEndpoint {
    /// CAPI's `APIEndpoint.IsValid`: a host and a non-zero port.
    pub fn is_valid(&self) -> bool {
        self.host.as_deref().is_some_and(|h| !h.is_empty()) && self.port.is_some_and(|p| p != 0)
    }
}

/// A failure domain: Kairon hosts matching `nodeSelector`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomainSpec {
    /// Unique name, used in `Machine.spec.failureDomain`.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Whether control-plane machines may be placed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Labels of the Kairon hosts that make up the domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
}

/// Observed state of a KaironCluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KaironClusterStatus {
    /// Contract field: `provisioned` is true once the endpoint and failure domains are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Failure domains in the v1beta2 list form, copied by CAPI into the Cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(min = 1, max = 100))]
    pub failure_domains: Option<Vec<FailureDomainStatus>>,
    /// Conditions: Ready, Paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[schemars(length(max = 32))]
    pub conditions: Option<Vec<Condition>>,
}

/// A failure domain as the v1beta2 contract reports it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomainStatus {
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<BTreeMap<String, String>>,
}

impl KaironClusterStatus {
    pub fn is_provisioned(&self) -> bool {
        self.initialization
            .as_ref()
            .and_then(|i| i.provisioned)
            .unwrap_or(false)
    }
}

/// Template for KaironClusters, required for ClusterClass.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KaironClusterTemplate",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    shortname = "kct",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "KaironClusterTemplate is the template KaironClusters of a ClusterClass are created from.",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct KaironClusterTemplateSpec {
    pub template: KaironClusterTemplateResource,
}

/// The object created for each Cluster of a ClusterClass.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct KaironClusterTemplateResource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateObjectMeta>,
    pub spec: KaironClusterSpec,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_validity_follows_capi() {
        let endpoint = |host: Option<&str>, port: Option<i32>| APIEndpoint {
            host: host.map(str::to_string),
            port,
        };
        assert!(!APIEndpoint::default().is_valid());
        assert!(!endpoint(Some("h"), Some(0)).is_valid());
        assert!(!endpoint(Some(""), Some(6443)).is_valid());
        assert!(!endpoint(Some("h"), None).is_valid());
        assert!(endpoint(Some("h"), Some(6443)).is_valid());
    }
}
