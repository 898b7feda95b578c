//! The bootstrap data contract, infrastructure side: the Secret named by
//! `Machine.spec.bootstrap.dataSecretName` holds the payload in `value` and, as CABPK writes
//! it, its `format` (`cloud-config` when absent, or `ignition`).
//!
//! Errors here describe the Secret, never its content: they end up in conditions. The payload
//! is returned as plain text; whoever forwards it (the Kairon client) wraps it so that it
//! cannot be printed.

use k8s_openapi::api::core::v1::Secret;

use super::{ContractVersionedObjectReference, GROUP};
use crate::api::conditions::reason;

/// CAPI's control-plane providers' group: Secrets they own (CAs, kubeconfig, service-account
/// keys) are never bootstrap data.
const CONTROL_PLANE_GROUP: &str = "controlplane.cluster.x-k8s.io";

/// Largest payload accepted by default. Kairon forwards it inside the Kairon Machine object,
/// and objects must stay well below the API server's 1.5 MiB storage limit.
pub const DEFAULT_MAX_BOOTSTRAP_DATA_BYTES: usize = 512 * 1024;

/// The one format Kairon can deliver (NoCloud user-data).
pub(crate) const FORMAT_CLOUD_CONFIG: &str = "cloud-config";

/// What is wrong with a bootstrap data Secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapDataError {
    #[error("bootstrap data Secret {secret} has no 'value' key")]
    Missing { secret: String },
    #[error("bootstrap data in Secret {secret} is {size} bytes, more than the limit of {limit} bytes")]
    TooLarge { secret: String, size: usize, limit: usize },
    #[error("bootstrap data in Secret {secret} is not valid UTF-8 text")]
    NotText { secret: String },
    #[error("bootstrap data in Secret {secret} has format {format:?}; Kairon only delivers cloud-config user-data")]
    UnsupportedFormat { secret: String, format: String },
    #[error(
        "Secret {secret} is not controlled by the Machine's bootstrap config {config}; it is not used as bootstrap data"
    )]
    NotFromBootstrapConfig { secret: String, config: String },
    #[error("Secret {secret} belongs to {owner}, not to a bootstrap provider; it is not used as bootstrap data")]
    BelongsToCapi { secret: String, owner: String },
}

impl BootstrapDataError {
    /// The condition reason for this problem.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing { .. } => reason::BOOTSTRAP_DATA_MISSING,
            Self::TooLarge { .. } => reason::BOOTSTRAP_DATA_TOO_LARGE,
            Self::NotText { .. } => reason::BOOTSTRAP_DATA_INVALID,
            Self::UnsupportedFormat { .. } => reason::UNSUPPORTED_BOOTSTRAP_FORMAT,
            Self::NotFromBootstrapConfig { .. } | Self::BelongsToCapi { .. } => {
                reason::BOOTSTRAP_DATA_SECRET_NOT_TRUSTED
            }
        }
    }

    /// Whether waiting cannot help: the bootstrap provider was asked for a format we cannot
    /// deliver, so the machine must be replaced.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::UnsupportedFormat { .. })
    }
}

/// Whether `secret` may be read as the bootstrap data of a Machine whose bootstrap config is
/// `config` (`spec.bootstrap.configRef`).
///
/// Anyone who can create a Machine names the Secret, and its content is copied into the VM
/// where whoever may read Kairon Machines can read it. So with a bootstrap config, only a
/// Secret that config controls (bootstrap providers set a controller ownerReference) is used;
/// without one (data given directly, as the contract allows), any Secret of the namespace but
/// CAPI's own: those a Cluster or a control plane owns (kubeconfig, CAs, service-account keys).
pub fn check_source(
    secret: &Secret,
    config: Option<&ContractVersionedObjectReference>,
) -> Result<(), BootstrapDataError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let owners = secret.metadata.owner_references.as_deref().unwrap_or_default();
    match config {
        Some(config) => {
            let controlled = owners.iter().any(|o| {
                o.controller == Some(true)
                    && o.kind == config.kind
                    && o.name == config.name
                    && super::group_of(&o.api_version) == config.api_group
            });
            if controlled {
                Ok(())
            } else {
                Err(BootstrapDataError::NotFromBootstrapConfig {
                    secret: name,
                    config: format!("{} {}", config.kind, config.name),
                })
            }
        }
        None => match owners.iter().find(|o| {
            let group = super::group_of(&o.api_version);
            (group == GROUP && o.kind == "Cluster") || group == CONTROL_PLANE_GROUP
        }) {
            Some(o) => Err(BootstrapDataError::BelongsToCapi {
                secret: name,
                owner: format!("{} {}", o.kind, o.name),
            }),
            None => Ok(()),
        },
    }
}

/// Extracts the user-data from a bootstrap data Secret.
pub fn bootstrap_data(secret: &Secret, limit: usize) -> Result<String, BootstrapDataError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let data = secret.data.as_ref();
    if let Some(format) = data.and_then(|d| d.get("format")) {
        let format = String::from_utf8_lossy(&format.0);
        let format = format.trim();
        if !format.is_empty() && format != FORMAT_CLOUD_CONFIG {
            // The format is not secret, but bound what we echo.
            let format: String = format.chars().take(64).collect();
            return Err(BootstrapDataError::UnsupportedFormat { secret: name, format });
        }
    }
    let value = data.and_then(|d| d.get("value")).filter(|v| !v.0.is_empty());
    let Some(value) = value else {
        return Err(BootstrapDataError::Missing { secret: name });
    };
    if value.0.len() > limit {
        return Err(BootstrapDataError::TooLarge {
            secret: name,
            size: value.0.len(),
            limit,
        });
    }
    match String::from_utf8(value.0.clone()) {
        Ok(text) => Ok(text),
        Err(_) => Err(BootstrapDataError::NotText { secret: name }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(entries: &[(&str, &[u8])]) -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("m1-bootstrap".into()),
                ..Default::default()
            },
            data: Some(
                entries
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn bootstrap_data_table() {
        let big = vec![b'a'; 101];
        let cases: Vec<(&str, Secret, Result<&str, &str>)> = vec![
            (
                "value without format is cloud-config",
                secret(&[("value", b"#cloud-config\nSECRET")]),
                Ok("#cloud-config\nSECRET"),
            ),
            (
                "explicit cloud-config",
                secret(&[("value", b"x"), ("format", b"cloud-config")]),
                Ok("x"),
            ),
            (
                "ignition is unsupported",
                secret(&[("value", b"{}"), ("format", b"ignition")]),
                Err(reason::UNSUPPORTED_BOOTSTRAP_FORMAT),
            ),
            (
                "unknown format is unsupported",
                secret(&[("value", b"x"), ("format", b"talos")]),
                Err(reason::UNSUPPORTED_BOOTSTRAP_FORMAT),
            ),
            (
                "missing value",
                secret(&[("format", b"cloud-config")]),
                Err(reason::BOOTSTRAP_DATA_MISSING),
            ),
            (
                "empty value",
                secret(&[("value", b"")]),
                Err(reason::BOOTSTRAP_DATA_MISSING),
            ),
            ("no data at all", Secret::default(), Err(reason::BOOTSTRAP_DATA_MISSING)),
            (
                "oversized",
                secret(&[("value", &big)]),
                Err(reason::BOOTSTRAP_DATA_TOO_LARGE),
            ),
            (
                "not text",
                secret(&[("value", &[0xff, 0xfe, 0x00])]),
                Err(reason::BOOTSTRAP_DATA_INVALID),
            ),
        ];
        for (name, s, want) in cases {
            let got = bootstrap_data(&s, 100);
            match (got, want) {
                (Ok(d), Ok(w)) => assert_eq!(d, w, "{name}"),
                (Err(e), Err(r)) => {
                    assert_eq!(e.reason(), r, "{name}");
                    assert!(!e.to_string().contains("SECRET"), "{name}: {e}");
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    fn owned_by(s: &mut Secret, api_version: &str, kind: &str, name: &str, controller: bool) {
        s.metadata.owner_references.get_or_insert_with(Vec::new).push(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: name.into(),
                uid: format!("{name}-uid"),
                controller: Some(controller),
                ..Default::default()
            },
        );
    }

    #[test]
    fn which_secrets_may_be_bootstrap_data() {
        let config = ContractVersionedObjectReference {
            api_group: "bootstrap.cluster.x-k8s.io".into(),
            kind: "KubeadmConfig".into(),
            name: "m1-config".into(),
        };
        let plain = secret(&[("value", b"x")]);
        let mut from_config = plain.clone();
        owned_by(
            &mut from_config,
            "bootstrap.cluster.x-k8s.io/v1beta2",
            "KubeadmConfig",
            "m1-config",
            true,
        );
        let mut from_other_config = plain.clone();
        owned_by(
            &mut from_other_config,
            "bootstrap.cluster.x-k8s.io/v1beta2",
            "KubeadmConfig",
            "m2-config",
            true,
        );
        let mut config_not_controller = plain.clone();
        owned_by(
            &mut config_not_controller,
            "bootstrap.cluster.x-k8s.io/v1beta2",
            "KubeadmConfig",
            "m1-config",
            false,
        );
        let mut other_group = plain.clone();
        owned_by(&mut other_group, "example.com/v1", "KubeadmConfig", "m1-config", true);
        let mut kubeconfig = plain.clone();
        owned_by(&mut kubeconfig, "cluster.x-k8s.io/v1beta2", "Cluster", "demo", false);
        let mut ca = plain.clone();
        owned_by(
            &mut ca,
            "controlplane.cluster.x-k8s.io/v1beta2",
            "KubeadmControlPlane",
            "demo-cp",
            true,
        );
        let mut app = plain.clone();
        owned_by(&mut app, "apps/v1", "Deployment", "x", true);

        let cases: Vec<(&str, &Secret, Option<&ContractVersionedObjectReference>, bool)> = vec![
            ("made by the Machine's config", &from_config, Some(&config), true),
            ("no owner, but a config is named", &plain, Some(&config), false),
            ("made by another config", &from_other_config, Some(&config), false),
            (
                "owned by the config but not as controller",
                &config_not_controller,
                Some(&config),
                false,
            ),
            (
                "same kind and name in another group",
                &other_group,
                Some(&config),
                false,
            ),
            ("user-provided data, no owner", &plain, None, true),
            ("user-provided data owned by something else", &app, None, true),
            ("the cluster's kubeconfig", &kubeconfig, None, false),
            ("a control plane's CA", &ca, None, false),
            ("a control plane's CA named with a config", &ca, Some(&config), false),
        ];
        for (name, s, config, ok) in cases {
            let got = check_source(s, config);
            assert_eq!(got.is_ok(), ok, "{name}: {got:?}");
            if let Err(e) = got {
                assert_eq!(e.reason(), reason::BOOTSTRAP_DATA_SECRET_NOT_TRUSTED, "{name}");
                assert!(!e.is_terminal(), "{name}");
                assert!(e.to_string().contains("m1-bootstrap"), "{name}: names the Secret: {e}");
            }
        }
    }

    #[test]
    fn only_unsupported_format_is_terminal() {
        assert!(
            BootstrapDataError::UnsupportedFormat {
                secret: "s".into(),
                format: "ignition".into()
            }
            .is_terminal()
        );
        assert!(!BootstrapDataError::Missing { secret: "s".into() }.is_terminal());
        assert!(
            !BootstrapDataError::TooLarge {
                secret: "s".into(),
                size: 2,
                limit: 1
            }
            .is_terminal()
        );
    }

    #[test]
    fn errors_name_the_secret_not_the_content() {
        let e = bootstrap_data(&secret(&[("value", b"TOPSECRET-PAYLOAD")]), 4).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("m1-bootstrap"), "{msg}");
        assert!(!msg.contains("TOPSECRET"), "{msg}");
    }
}
