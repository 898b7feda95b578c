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
    /// Only type and status are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<ClusterCondition>>,
}

/// A condition of the Cluster, as far as this provider reads it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ClusterCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
}

/// The Cluster condition CAPI sets once the first control-plane Machine has a Node, also for
/// a cluster without a control-plane provider (where `status.initialization` stays unset).
const CONTROL_PLANE_INITIALIZED: &str = "ControlPlaneInitialized";

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

    /// `status.initialization.controlPlaneInitialized`, or the `ControlPlaneInitialized`
    /// condition true (as CABPK reads it): CAPI sets only the condition for a cluster whose
    /// control plane is plain Machines.
    pub fn control_plane_initialized(&self) -> bool {
        self.init().and_then(|i| i.control_plane_initialized).unwrap_or(false)
            || self
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == CONTROL_PLANE_INITIALIZED && c.status == "True")
                })
    }

    /// Name of the infrastructure cluster when it is of `kind` in our group.
    pub(crate) fn infrastructure_name(&self, group: &str, kind: &str) -> Option<&str> {
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
