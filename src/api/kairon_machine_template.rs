//! `KaironMachineTemplate`: what MachineDeployments, MachineSets and KCP clone KaironMachines
//! from. Its status carries capacity and node info so cluster-autoscaler can scale from zero.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{KaironMachineSpec, TemplateObjectMeta};

/// Template for KaironMachines.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KaironMachineTemplate",
    namespaced,
    status = "KaironMachineTemplateStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "kmt",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "KaironMachineTemplate is the template KaironMachines are cloned from.",
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.template.spec.image.imageRef"),
    printcolumn(name = "CPU", type_ = "string", json_path = ".spec.template.spec.resources.cpu"),
    printcolumn(
        name = "Memory",
        type_ = "string",
        json_path = ".spec.template.spec.resources.memory"
    ),
    printcolumn(
        name = "InstanceType",
        type_ = "string",
        json_path = ".spec.template.spec.instanceTypeName",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct KaironMachineTemplateSpec {
    pub template: KaironMachineTemplateResource,
}

/// The object cloned for each Machine.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.spec.providerID)").message("spec.template.spec.providerID must not be set: the controller writes it on each KaironMachine").field_path(".spec.providerID"))]
#[x_kube(validation = Rule::new("!has(self.spec.network) || !has(self.spec.network.mac)").message("spec.template.spec.network.mac must not be set: every KaironMachine made from the template would have the same MAC address").field_path(".spec.network.mac"))]
pub struct KaironMachineTemplateResource {
    /// Labels and annotations for the cloned KaironMachines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateObjectMeta>,
    pub spec: KaironMachineSpec,
}

/// Observed state of a KaironMachineTemplate: what a machine cloned from it offers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KaironMachineTemplateStatus {
    /// Resources of a node made from this template: cpu, memory, ephemeral-storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<BTreeMap<String, Quantity>>,
    /// Architecture and operating system of a node made from this template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,
}

/// Node architecture and OS, for scale from zero.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_system: Option<String>,
}
