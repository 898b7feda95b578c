//! Kairon's structured `spec.cloudInit`: what kairon-node hands FluxVM, which renders it into
//! the guest's NoCloud seed at the VM's first creation (editing it later changes nothing).
//!
//! Field names and JSON types follow Kairon's `internal/model/types.go` (`CloudInitSpec`,
//! `CloudInitFile`) and its CRD (`charts/kairon/crds/machines.yaml`): every field is optional
//! and Go's `omitempty` makes an empty value the same as an absent one, so empty values are
//! not serialized; `writeFiles[].path` and `writeFiles[].content` are required.
//!
//! There is no raw user-data: CAPI's bootstrap data reaches this shape through
//! [`translate_cloud_config`]. File contents and commands carry the
//! cluster's secrets (CA keys, join tokens), so `Debug` shows neither.

use std::fmt;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

mod translate;

pub use translate::{
    DEFAULT_MAX_DECODED_BYTES, GuestFacts, RUNCMD_SCRIPT, STAGING_DIR, TranslateError, translate_cloud_config,
    translate_off_runtime,
};

/// Guest customization applied when the VM is first created.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CloudInit {
    /// The guest's hostname; FluxVM also gives it as the NoCloud `instance-id` and
    /// `local-hostname` (default `fluxvm-vm`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hostname: String,
    /// A user FluxVM creates with passwordless sudo and `/bin/bash` (default `cloud`), beside
    /// the image's default user.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// SSH keys of `user`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_authorized_keys: Vec<String>,
    /// Packages installed at first boot (after a package index update).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    /// Commands run once at first boot, in order, each by `bash -lc`, after the files are
    /// written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub run_cmd: Vec<String>,
    /// Files written before the commands run, in order, owned by root.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write_files: Vec<CloudInitFile>,
}

/// One file of [`CloudInit::write_files`].
#[derive(KubeSchema, Serialize, Deserialize, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitFile {
    pub path: String,
    /// Text only: FluxVM writes the UTF-8 bytes of this string.
    pub content: String,
    /// Octal mode (`"0640"`); cloud-init's `0644` when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub permissions: String,
}

impl fmt::Debug for CloudInitFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudInitFile")
            .field("path", &self.path)
            .field("permissions", &self.permissions)
            .field("content", &format_args!("<redacted, {} bytes>", self.content.len()))
            .finish()
    }
}

impl fmt::Debug for CloudInit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudInit")
            .field("hostname", &self.hostname)
            .field("user", &self.user)
            .field(
                "ssh_authorized_keys",
                &format_args!("<{} keys>", self.ssh_authorized_keys.len()),
            )
            .field("packages", &self.packages)
            .field("run_cmd", &format_args!("<redacted, {} commands>", self.run_cmd.len()))
            .field("write_files", &self.write_files)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn serializes_with_kairons_field_names_and_omits_empty_values() {
        let ci = CloudInit {
            hostname: "m1".into(),
            run_cmd: vec!["kubeadm join".into()],
            write_files: vec![CloudInitFile {
                path: "/etc/a".into(),
                content: "x".into(),
                permissions: String::new(),
            }],
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&ci).unwrap(),
            json!({"hostname": "m1", "runCmd": ["kubeadm join"],
                   "writeFiles": [{"path": "/etc/a", "content": "x"}]})
        );
        let back: CloudInit = serde_json::from_value(json!({
            "user": "ops", "sshAuthorizedKeys": ["ssh-ed25519 AAAA"], "packages": ["jq"],
            "writeFiles": [{"path": "/p", "content": "", "permissions": "0600"}]}))
        .unwrap();
        assert_eq!(back.user, "ops");
        assert_eq!(back.ssh_authorized_keys, ["ssh-ed25519 AAAA"]);
        assert_eq!(back.write_files[0].permissions, "0600");
        assert!(
            serde_json::from_value::<CloudInitFile>(json!({"path": "/p"})).is_err(),
            "content is required"
        );
    }

    #[test]
    fn schema_matches_kairons_crd() {
        let schema = serde_json::to_value(schemars::schema_for!(CloudInit)).unwrap();
        let text = schema.to_string();
        for field in [
            "hostname",
            "user",
            "sshAuthorizedKeys",
            "packages",
            "runCmd",
            "writeFiles",
        ] {
            assert!(schema["properties"].get(field).is_some(), "{field}: {text}");
        }
        assert!(schema.get("required").is_none(), "every field is optional: {text}");
        let file = serde_json::to_value(schemars::schema_for!(CloudInitFile)).unwrap();
        assert_eq!(file["required"], json!(["path", "content"]), "{file}");
    }

    #[test]
    fn debug_never_shows_contents_or_commands() {
        let ci = CloudInit {
            run_cmd: vec!["kubeadm join --token TOPSECRET".into()],
            write_files: vec![CloudInitFile {
                path: "/etc/kubernetes/pki/ca.key".into(),
                content: "TOPSECRET KEY".into(),
                permissions: "0600".into(),
            }],
            ..Default::default()
        };
        let shown = format!("{ci:?}");
        assert!(!shown.contains("TOPSECRET"), "{shown}");
        assert!(shown.contains("/etc/kubernetes/pki/ca.key"), "{shown}");
    }
}
