//! The provider's API: `infrastructure.cluster.x-k8s.io/v1alpha1`.
//!
//! Seven kinds, each carrying the CAPI v1beta2 contract label
//! (`cluster.x-k8s.io/v1beta2: v1alpha1`), plus the condition vocabulary shared by the
//! reconcilers. Validation lives in the schemas (OpenAPI + CEL) because the provider runs no
//! webhook server.

pub mod conditions;
pub mod kairon_cluster;
pub mod kairon_cluster_identity;
pub mod kairon_machine;
pub mod kairon_machine_pool;
pub mod kairon_machine_pool_template;
pub mod kairon_machine_template;

pub use kairon_cluster::{
    APIEndpoint, FailureDomainSpec, FailureDomainStatus, IDENTITY_KIND_CLUSTER_IDENTITY, IDENTITY_KIND_SECRET,
    IDENTITY_KUBECONFIG_KEY, KaironCluster, KaironClusterSpec, KaironClusterStatus, KaironClusterTemplate,
    KaironClusterTemplateResource, KaironClusterTemplateSpec, KaironIdentityReference,
};
pub use kairon_cluster_identity::{AllowedNamespaces, KaironClusterIdentity, KaironClusterIdentitySpec};
pub use kairon_machine::{
    DeprecatedStatus, GuestAgent, Initialization, InstanceRef, KaironMachine, KaironMachineSpec, KaironMachineStatus,
    MachineAddress, MachineImage, MachineNetwork, MachinePlacement, MachineResources, V1Beta1Status, anti_affinity,
    network_mode,
};
pub use kairon_machine_pool::{
    INFRASTRUCTURE_MACHINE_KIND, KaironMachinePool, KaironMachinePoolSpec, KaironMachinePoolStatus, PoolStrategy,
};
pub use kairon_machine_pool_template::{
    KaironMachinePoolTemplate, KaironMachinePoolTemplateResource, KaironMachinePoolTemplateSpec,
};
pub use kairon_machine_template::{
    KaironMachineTemplate, KaironMachineTemplateResource, KaironMachineTemplateSpec, KaironMachineTemplateStatus,
    NodeInfo,
};

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of all our kinds.
pub const GROUP: &str = "infrastructure.cluster.x-k8s.io";
/// The one API version we serve.
pub const VERSION: &str = "v1alpha1";

/// The field manager of every write the manager makes.
pub const FIELD_MANAGER: &str = "capkr-manager";

/// Finalizer on KaironCluster objects.
pub const CLUSTER_FINALIZER: &str = "kaironcluster.infrastructure.cluster.x-k8s.io";
/// Finalizer on KaironMachine objects.
pub const MACHINE_FINALIZER: &str = "kaironmachine.infrastructure.cluster.x-k8s.io";
/// Finalizer on KaironMachinePool objects.
pub const MACHINE_POOL_FINALIZER: &str = "kaironmachinepool.infrastructure.cluster.x-k8s.io";

/// The trimmed ObjectMeta CAPI uses inside templates: labels and annotations only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateObjectMeta {
    /// Labels copied to objects created from the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations copied to objects created from the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The labels every CRD we ship carries besides the contract label: clusterctl finds the kinds
/// it moves (`clusterctl move`) and the provider's objects only through them. `clusterctl init`
/// adds them, but a CRD installed by the Helm chart or from `config/` would lack them, and
/// `clusterctl move` would then leave our objects behind (and the source cluster, once its
/// Machines are gone, would garbage-collect them).
pub const CRD_LABELS: [(&str, &str); 2] = [
    ("clusterctl.cluster.x-k8s.io", ""),
    ("cluster.x-k8s.io/provider", "infrastructure-kairon"),
];

/// Our CRDs as they are installed: derived from the types, with `nullable` removed and
/// [`CRD_LABELS`] added.
///
/// Optional fields are omitted, never `null` (v1beta2 serialization hygiene); without
/// `nullable` the API server drops a `null` a client sends instead of storing it.
pub fn crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    use kube::CustomResourceExt;
    [
        KaironCluster::crd(),
        KaironClusterTemplate::crd(),
        KaironClusterIdentity::crd(),
        KaironMachine::crd(),
        KaironMachineTemplate::crd(),
        KaironMachinePool::crd(),
        KaironMachinePoolTemplate::crd(),
    ]
    .into_iter()
    .map(without_nullable)
    .map(|mut crd| {
        let labels = crd.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.extend(CRD_LABELS.map(|(k, v)| (k.to_string(), v.to_string())));
        crd
    })
    .collect()
}

/// Removes every `nullable: true` from a CRD's schemas.
pub fn without_nullable(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("nullable");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(&crd).expect("a CRD serializes");
    for version in value["spec"]["versions"].as_array_mut().into_iter().flatten() {
        strip(&mut version["schema"]);
    }
    serde_json::from_value(value).expect("a CRD without nullable deserializes")
}

#[cfg(test)]
mod crd_label_tests {
    use super::*;

    #[test]
    fn every_crd_carries_the_contract_clusterctl_and_provider_labels() {
        for crd in crds() {
            let labels = crd.metadata.labels.clone().unwrap_or_default();
            let name = crd.metadata.name.clone().unwrap_or_default();
            assert_eq!(
                labels.get("cluster.x-k8s.io/v1beta2").map(String::as_str),
                Some("v1alpha1"),
                "{name}"
            );
            assert_eq!(
                labels.get("clusterctl.cluster.x-k8s.io").map(String::as_str),
                Some(""),
                "{name}"
            );
            assert_eq!(
                labels.get("cluster.x-k8s.io/provider").map(String::as_str),
                Some("infrastructure-kairon"),
                "{name}"
            );
        }
    }
}
