//! `KaironMachinePoolTemplate`: what a ClusterClass's `machinePools` clone KaironMachinePools
//! from. Its spec is immutable (the admission policy), as every template's; the pool made
//! from it is not: topology patches the pool in place, which rolls it.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{KaironMachinePoolSpec, TemplateObjectMeta};

/// Template for KaironMachinePools.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KaironMachinePoolTemplate",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    shortname = "kmpt",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "KaironMachinePoolTemplate is the template KaironMachinePools are cloned from.",
    printcolumn(
        name = "Image",
        type_ = "string",
        json_path = ".spec.template.spec.template.image.imageRef"
    ),
    printcolumn(
        name = "CPU",
        type_ = "string",
        json_path = ".spec.template.spec.template.resources.cpu"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct KaironMachinePoolTemplateSpec {
    pub template: KaironMachinePoolTemplateResource,
}

/// The object cloned for each MachinePool.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.spec.providerIDList)").message("spec.template.spec.providerIDList must not be set: the controller writes it on each KaironMachinePool").field_path(".spec.providerIDList"))]
pub struct KaironMachinePoolTemplateResource {
    /// Labels and annotations for the cloned KaironMachinePools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateObjectMeta>,
    pub spec: KaironMachinePoolSpec,
}
