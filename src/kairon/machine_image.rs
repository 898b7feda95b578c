//! Kairon's MachineImage as Kairon has it (`docs/kairon-api.md`, "MachineImage"): a
//! cluster-scoped, named boot disk (kind `disk`, the default) or install medium (kind `iso`)
//! that a Machine names by `spec.image.imageRef`. kairon-controller pins its source and digest
//! into the Machine once and keeps a Machine whose image cannot be resolved `Pending`, saying
//! why in `status.message` only. The provider never writes MachineImages; this type is the
//! development CRD the simulator resolves against.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A named, versioned image. Cluster-scoped.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kairon.zyvor.dev",
    version = "v1",
    kind = "MachineImage",
    derive = "PartialEq",
    derive = "Default",
    shortname = "mimg",
    doc = "MachineImage is a named boot disk or install medium that Kairon Machines reference by name (development CRD; production clusters get it from Kairon).",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.kind"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version")
)]
#[serde(rename_all = "camelCase")]
pub struct MachineImageSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Groups versions of one image; not interpreted by Kairon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `disk` (when absent) or `iso`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == 'disk' || self == 'iso'").message("kind must be disk or iso"))]
    pub kind: Option<String>,
    /// A hint for clients; Kairon does not read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<bool>,
    /// `sha256:` and 64 lowercase hex digits.
    #[x_kube(validation = Rule::new("self.matches('^sha256:[0-9a-f]{64}$')").message("digest must be sha256: and 64 hex digits"))]
    pub digest: String,
    pub source: MachineImageSource,
    /// Fill an empty `spec.resources` / `spec.image.diskSize` of a Machine naming the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<MachineImageDefaults>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineImageSource {
    #[serde(default, rename = "httpURL", skip_serializing_if = "Option::is_none")]
    pub http_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<String>,
    /// `qcow2`, `raw`, `ova`, `vmdk`, `vhd` or `vhdx`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_tls_verify: Option<bool>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineImageDefaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<String>,
}

/// The kind a MachineImage is, `disk` when it names none.
pub fn effective_kind(spec: &MachineImageSpec) -> &str {
    spec.kind.as_deref().filter(|k| !k.is_empty()).unwrap_or("disk")
}
