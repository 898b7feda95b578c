//! From an identity to a client of its Kairon API: the Secret read (directly, or through a
//! KaironClusterIdentity), the kubeconfig checked ([`super::trust`]), and the Kairon versions
//! the API serves.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

use kube::Client;
use tracing::{info, warn};

use super::error::EndpointError;
use super::health::MAX_PROBLEM;
use super::trust::{ServerRefusal, refusal};
use super::{Endpoints, IdentityKey, trust};
use crate::api::{IDENTITY_KIND_CLUSTER_IDENTITY, IDENTITY_KIND_SECRET, KaironClusterIdentity};
use crate::kairon::{self, Instances};
use crate::text::bounded;

impl Endpoints {
    /// The Secret (namespace, name) that holds the credentials of `key`: for a
    /// KaironClusterIdentity, after checking that it allows the namespace.
    pub(super) async fn secret_of(&self, key: &IdentityKey) -> Result<(String, String), EndpointError> {
        let r = &key.identity;
        match r.kind.as_str() {
            IDENTITY_KIND_SECRET => Ok((key.namespace.clone(), r.name.clone())),
            IDENTITY_KIND_CLUSTER_IDENTITY => {
                let identity = Api::<KaironClusterIdentity>::all(self.management.clone())
                    .get_opt(&r.name)
                    .await
                    .map_err(|e| EndpointError::ReadIdentity(r.name.clone(), e.to_string()))?
                    .ok_or_else(|| EndpointError::IdentityNotFound(r.name.clone()))?;
                let labels = if identity.needs_labels(&key.namespace) {
                    let ns = Api::<Namespace>::all(self.management.clone())
                        .get_metadata_opt(&key.namespace)
                        .await
                        .map_err(|e| EndpointError::ReadIdentity(r.name.clone(), e.to_string()))?;
                    Some(ns.and_then(|n| n.metadata.labels).unwrap_or_default())
                } else {
                    None
                };
                match identity.allows(&key.namespace, labels.as_ref()) {
                    Ok(true) => Ok((self.identity_namespace.clone(), identity.spec.secret_name)),
                    Ok(false) => Err(EndpointError::NotAllowed(r.name.clone(), key.namespace.clone())),
                    Err(why) => Err(EndpointError::BadIdentity(r.name.clone(), why)),
                }
            }
            other => Err(EndpointError::UnknownKind(other.to_string())),
        }
    }

    /// A client from kubeconfig `bytes`; refuses what would make the manager run a command or
    /// read its own files (exec plugins, auth providers, file paths), what would send the
    /// cluster's bootstrap data unverified, and servers the operator does not allow: the Secret
    /// is written by the cluster's owner, not by the provider's operator.
    pub(super) async fn client_from(&self, what: &str, bytes: &[u8]) -> Result<(Client, String), EndpointError> {
        let bad = |why: &str| EndpointError::BadKubeconfig(what.to_string(), why.to_string());
        let text = std::str::from_utf8(bytes).map_err(|_| bad("the kubeconfig is not UTF-8"))?;
        let kubeconfig = Kubeconfig::from_yaml(text).map_err(|_| bad("the kubeconfig cannot be parsed"))?;
        if let Some(why) = refusal(&kubeconfig) {
            return Err(bad(why));
        }
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|_| bad("the kubeconfig has no usable context"))?;
        let config = trust::checked(config, &self.allowed).map_err(|refused| match refused {
            ServerRefusal::Unsafe(why) => bad(why),
            ServerRefusal::NotAllowed(host) => EndpointError::ServerNotAllowed(what.to_string(), host),
        })?;
        let fingerprint = kairon::endpoint_fingerprint(&config);
        let client = (self.factory)(config).map_err(|_| bad("no client can be built from the kubeconfig"))?;
        Ok((client, fingerprint))
    }

    /// Asks the endpoint's Kairon API which versions of Kairon's kinds it serves until it answers;
    /// meanwhile its machines say why they wait (`problem`), in words of the provider's only.
    pub(super) async fn discover_versions(
        instances: Instances,
        identity: String,
        problem: Arc<Mutex<Option<String>>>,
        metrics: Arc<crate::metrics::Metrics>,
    ) {
        let mut delay = Duration::from_secs(1);
        loop {
            match instances.discover().await {
                Ok(served) => {
                    info!(identity = %identity, versions = %served.summary(),
                    schema_checked = served.knows_machine_schema(), "Kairon API versions spoken");
                    metrics.kairon_versions(&identity, served.versions());
                    return;
                }
                Err(e) => {
                    let why = match &e {
                        kube::Error::Api(s) => format!("it answered HTTP {}", s.code),
                        _ => "it did not answer".to_string(),
                    };
                    warn!(identity = %identity, error = %bounded(&e.to_string(), MAX_PROBLEM),
                    "the Kairon API cannot tell which versions it serves; asking again");
                    *problem.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!(
                        "the Kairon API cannot tell which versions of Kairon's kinds it serves: {why}"
                    ));
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(60));
                }
            }
        }
    }
}
