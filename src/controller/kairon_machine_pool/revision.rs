//! A pool's revision: what its members are made of. A member made for an older revision is
//! replaced (through CAPI, drained) within the pool's rollout strategy.
//!
//! The revision is a digest of the VM template, the Kubernetes version and the bootstrap
//! Secret's name (a new bootstrap config), of their JSON: the same in every process and every
//! release that reads the same spec, and unchanged by `clusterctl move` (no UID in it). New
//! content in the same Secret (CABPK rotates a pool's join token in place) reaches the members
//! made after it and rolls none.

use ring::digest::{SHA256, digest};

use crate::api::KaironMachineSpec;

/// Label on each KaironMachine of a pool: the revision it was made for.
pub const REVISION_LABEL: &str = "infrastructure.cluster.x-k8s.io/kaironmachinepool-revision";

/// Longest value a label can hold.
const MAX_LABEL_VALUE: usize = 63;

/// The revision of a pool's members: 16 hex digits of a SHA-256.
pub fn revision(template: &KaironMachineSpec, version: Option<&str>, bootstrap_secret: &str) -> String {
    let json = serde_json::to_vec(&(template, version, bootstrap_secret)).unwrap_or_default();
    let d = digest(&SHA256, &json);
    d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// A name as a label value: itself when it fits, a digest of it otherwise.
pub(crate) fn label_value(value: &str) -> String {
    if value.len() <= MAX_LABEL_VALUE {
        return value.to_string();
    }
    let d = digest(&SHA256, value.as_bytes());
    let hex: String = d.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MachineImage, MachineResources};

    fn spec(image: &str) -> KaironMachineSpec {
        KaironMachineSpec {
            resources: Some(MachineResources::new(2, "4Gi")),
            image: MachineImage::from_image_ref(image, Some("20Gi")),
            ..Default::default()
        }
    }

    #[test]
    fn a_revision_changes_with_the_template_the_version_and_the_secret_only() {
        let r = revision(&spec("a"), Some("v1.37.2"), "s");
        assert_eq!(r.len(), 16);
        assert_eq!(r, revision(&spec("a"), Some("v1.37.2"), "s"), "stable");
        assert_ne!(r, revision(&spec("b"), Some("v1.37.2"), "s"));
        assert_ne!(r, revision(&spec("a"), Some("v1.37.3"), "s"));
        assert_ne!(r, revision(&spec("a"), Some("v1.37.2"), "t"));
    }

    #[test]
    fn a_long_name_is_a_digest_as_a_label() {
        assert_eq!(label_value("pool"), "pool");
        let long = "p".repeat(64);
        let v = label_value(&long);
        assert!(v.starts_with("sha256_") && v.len() <= MAX_LABEL_VALUE, "{v}");
    }
}
