//! Partial view of `cluster.x-k8s.io/v1beta2` Machine.

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

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bootstrap {
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
}
