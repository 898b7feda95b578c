//! Partial view of `cluster.x-k8s.io/v1beta2` MachinePool, and the labels CAPI puts on (and
//! looks for on) the infrastructure machines of a pool ("MachinePool Machines").

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Bootstrap, ContractVersionedObjectReference};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "MachinePool",
    namespaced,
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct MachinePoolSpec {
    #[serde(default)]
    pub cluster_name: String,
    /// Desired VMs; CAPI's webhook defaults it to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default)]
    pub template: MachinePoolTemplate,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domains: Option<Vec<String>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct MachinePoolTemplate {
    #[serde(default)]
    pub spec: MachinePoolMachineSpec,
}

/// The Machine spec of a pool's template: bootstrap (CAPI copies the config's Secret name into
/// `dataSecretName`), version, infrastructure reference.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachinePoolMachineSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<Bootstrap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractVersionedObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl MachinePool {
    /// `spec.replicas`, 1 when absent (CAPI's default).
    pub fn desired_replicas(&self) -> i32 {
        self.spec.replicas.unwrap_or(1).max(0)
    }

    /// `spec.template.spec.bootstrap.dataSecretName`, when set and non-empty.
    pub fn data_secret_name(&self) -> Option<&str> {
        self.spec
            .template
            .spec
            .bootstrap
            .as_ref()?
            .data_secret_name
            .as_deref()
            .filter(|s| !s.is_empty())
    }
}

/// Label CAPI selects a pool's infrastructure machines by (with the cluster-name label); its
/// value is the pool's name as [`format_label_value`] makes it.
pub const POOL_NAME_LABEL: &str = "cluster.x-k8s.io/pool-name";
/// Annotation by which CAPI (or a user, or an autoscaler) marks the Machine to remove first.
pub const DELETE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/delete-machine";

/// CAPI's `format.MustFormatValue`: `value` if it is a valid label value, else
/// `hash_<base64url(fnv32a(value))>_z`. CAPI compares a pool's name with the pool-name label
/// of its infrastructure machines through it, so it must be bit for bit the same.
pub fn format_label_value(value: &str) -> String {
    if is_valid_label_value(value) {
        return value.to_string();
    }
    let mut h: u32 = 0x811c_9dc5;
    for b in value.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("hash_{}_z", base64_url_no_pad(&h.to_be_bytes()))
}

/// Kubernetes' `IsValidLabelValue`: at most 63 characters, empty or alphanumerics, `-`, `_`
/// and `.` starting and ending with an alphanumeric.
fn is_valid_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    if b.is_empty() {
        return true;
    }
    b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn base64_url_no_pad(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors of CAPI v1.14.2's `util/labels/format/helpers_test.go`, and the edges of a
    /// valid label value.
    #[test]
    fn label_values_are_formatted_as_capi_formats_them() {
        let long = "machineSetName".repeat(12);
        #[rustfmt::skip]
        let cases = [
            ("a valid name stays", "demo-mp-0", "demo-mp-0"),
            ("empty stays", "", ""),
            ("dots and underscores stay", "a.b_c", "a.b_c"),
            ("63 characters stay", &"a".repeat(63)[..], &"a".repeat(63)[..]),
            ("CAPI's long MachineSet name", &long[..], "hash_FR_ghQ_z"),
        ];
        for (name, input, want) in cases {
            assert_eq!(format_label_value(input), want, "{name}");
        }
        for invalid in ["a".repeat(64), "-a".into(), "a-".into(), "a/b".into()] {
            let got = format_label_value(&invalid);
            assert!(
                got.starts_with("hash_") && got.ends_with("_z") && got.len() == 13,
                "{invalid}: {got}"
            );
        }
        assert_eq!(base64_url_no_pad(b"Man"), "TWFu");
        assert_eq!(base64_url_no_pad(b"Ma"), "TWE");
        assert_eq!(base64_url_no_pad(&[0xfb, 0xff]), "-_8");
    }

    #[test]
    fn a_pool_reads_its_replicas_and_bootstrap_secret() {
        let mp: MachinePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
            "metadata": {"name": "mp", "namespace": "ns"},
            "spec": {"clusterName": "demo", "template": {"spec": {"clusterName": "demo", "version": "v1.36.1",
                "bootstrap": {"dataSecretName": "mp-boot"},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironMachinePool", "name": "mp"}}}}
        }))
        .expect("reads");
        assert_eq!(mp.desired_replicas(), 1, "CAPI's default");
        assert_eq!(mp.data_secret_name(), Some("mp-boot"));
        assert_eq!(mp.spec.template.spec.version.as_deref(), Some("v1.36.1"));
        let mut none = mp.clone();
        none.spec.template.spec.bootstrap = Some(Bootstrap {
            config_ref: None,
            data_secret_name: Some(String::new()),
        });
        assert_eq!(none.data_secret_name(), None);
    }
}
