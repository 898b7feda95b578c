//! The bootstrap data contract, infrastructure side: the Secret named by
//! `Machine.spec.bootstrap.dataSecretName` holds the payload in `value` and, as CABPK writes
//! it, its `format` (`cloud-config` when absent, or `ignition`).
//!
//! Errors here describe the Secret, never its content: they end up in conditions. The payload
//! is returned as plain text; whoever forwards it (the Kairon client) wraps it so that it
//! cannot be printed. Which Secret may be read as a Machine's bootstrap data at all is
//! decided in [`source`].

use k8s_openapi::api::core::v1::Secret;

use crate::api::conditions::reason;

mod source;

pub(crate) use source::{ConfigOwner, Source, check_config, check_source};

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
    #[error(
        "Secret {secret} was made by bootstrap config {config} for its own Machine; a Machine without a bootstrap config may not use it"
    )]
    MadeForAnotherMachine { secret: String, config: String },
    #[error(
        "Secret {secret} was made by {config}, which belongs to {controller}, not to this {owner_kind}; it is not used as bootstrap data"
    )]
    ConfigOfAnotherMachine {
        secret: String,
        config: String,
        controller: String,
        /// `Machine`, or `MachinePool` for a pool's bootstrap data.
        owner_kind: &'static str,
    },
    #[error("Secret {secret} was made by {config}, which does not exist; it is not used as bootstrap data")]
    ConfigNotFound { secret: String, config: String },
    #[error(
        "Secret {secret} belongs to Cluster {cluster}, not to this {owner_kind}'s Cluster {machine_cluster}; it is not used as bootstrap data"
    )]
    OtherCluster {
        owner_kind: &'static str,
        secret: String,
        cluster: String,
        machine_cluster: String,
    },
}

impl BootstrapDataError {
    /// The condition reason for this problem.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing { .. } => reason::BOOTSTRAP_DATA_MISSING,
            Self::TooLarge { .. } => reason::BOOTSTRAP_DATA_TOO_LARGE,
            Self::NotText { .. } => reason::BOOTSTRAP_DATA_INVALID,
            Self::UnsupportedFormat { .. } => reason::UNSUPPORTED_BOOTSTRAP_FORMAT,
            Self::NotFromBootstrapConfig { .. }
            | Self::BelongsToCapi { .. }
            | Self::MadeForAnotherMachine { .. }
            | Self::ConfigOfAnotherMachine { .. }
            | Self::ConfigNotFound { .. }
            | Self::OtherCluster { .. } => reason::BOOTSTRAP_DATA_SECRET_NOT_TRUSTED,
        }
    }

    /// Whether waiting cannot help: the bootstrap provider was asked for a format we cannot
    /// deliver, so the machine must be replaced.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::UnsupportedFormat { .. })
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

    /// A Secret `m1-bootstrap` with `entries` (also the cases of `source`).
    pub(super) fn secret(entries: &[(&str, &[u8])]) -> Secret {
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
