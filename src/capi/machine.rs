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
}
