//! Partial view of `cluster.x-k8s.io/v1beta2` Cluster.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{APIEndpoint, ContractVersionedObjectReference};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractVersionedObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<APIEndpoint>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitialization>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitialization {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

impl Cluster {
    /// `status.initialization.infrastructureProvisioned`; missing counts as false.
    pub fn infrastructure_provisioned(&self) -> bool {
        self.init().and_then(|i| i.infrastructure_provisioned).unwrap_or(false)
    }

    /// `status.initialization.controlPlaneInitialized`; missing counts as false.
    pub fn control_plane_initialized(&self) -> bool {
        self.init().and_then(|i| i.control_plane_initialized).unwrap_or(false)
    }

    /// Name of the infrastructure cluster when it is of `kind` in our group.
    pub fn infrastructure_name(&self, group: &str, kind: &str) -> Option<&str> {
        self.spec
            .infrastructure_ref
            .as_ref()
            .filter(|r| r.is(group, kind))
            .map(|r| r.name.as_str())
    }

    fn init(&self) -> Option<&ClusterInitialization> {
        self.status.as_ref()?.initialization.as_ref()
    }
}
