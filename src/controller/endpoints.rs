//! The Kairon APIs named by identities (`KaironCluster.spec.identityRef`): one client and one
//! Kairon Machine watch per identity in use and namespace using it, started by the first
//! reconcile that needs it and stopped by [`Endpoints::sweep`] once no KaironCluster or
//! KaironMachine names it.
//!
//! An identity is a Secret in the cluster's namespace, or a cluster-scoped
//! KaironClusterIdentity whose Secret lives in the manager's namespace and which allows the
//! cluster's namespace. The identity (and the Secret) are read with one GET each when an
//! endpoint starts and again every [`RECHECK`]: new content (rotated credentials, another
//! server) restarts the endpoint's client and watch, without a restart of the manager; an
//! identity that no longer allows the namespace stops it. A watch that fails (the API server is
//! down, the credentials are refused) is recorded as the endpoint's problem, which the
//! reconcilers report as a condition on the clusters and machines using it, and only there.
//!
//! Secret content never reaches a log line, an event or a condition: messages say which Secret
//! and what is wrong with it, and the watch's own error (an HTTP status, a connection failure),
//! cleaned and bounded (the server is the tenant's). What a kubeconfig may name, and the bounds
//! of its client, are in [`trust`].
//!
//! What each endpoint may make the manager hold is bounded ([`budget`]), and so
//! is what all of them may together ([`ledger`]): a namespace opens at most
//! `--identity-endpoints-per-namespace` endpoints (a KaironCluster naming one more identity
//! waits, saying so, until one is no longer used), and an endpoint that takes its namespace's,
//! or all endpoints', keeping over budget is cut off. The KaironClusters naming an endpoint cut
//! off are told at once ([`Endpoints::with_cut_off_trigger`]).

pub(crate) mod budget;
mod connect;
pub(crate) mod error;
pub(crate) mod health;
pub(crate) mod ledger;
pub(crate) mod protection;
pub(crate) mod trust;
mod watch;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};

use kube::{Client, ResourceExt};
use ledger::{EndpointCaps, Ledger};
use tracing::{info, warn};

use super::runtime::Telemetry;
use crate::api::{
    IDENTITY_KIND_SECRET, IDENTITY_KUBECONFIG_KEY, KaironCluster, KaironIdentityReference, KaironMachine,
};
use crate::hashing::hash_of;
use crate::kairon::{self, Owner};
pub(crate) use error::EndpointError;
pub(crate) use health::Endpoint;
use trust::AllowedServers;

/// How often the Secret of an endpoint in use is read again (credential rotation).
pub(crate) const RECHECK: Duration = Duration::from_secs(30);
/// An endpoint: the identity named, and the namespace of the KaironClusters naming it (on the
/// Kairon API, the namespace of their VMs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct IdentityKey {
    pub namespace: String,
    pub identity: KaironIdentityReference,
}

impl std::fmt::Display for IdentityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.identity.kind.as_str() {
            IDENTITY_KIND_SECRET => write!(f, "Secret {}/{}", self.namespace, self.identity.name),
            kind => write!(f, "{kind} {} (namespace {})", self.identity.name, self.namespace),
        }
    }
}

/// Builds a client from a kubeconfig's configuration (user agent, rate limits, metrics).
pub(crate) type ClientFactory = Arc<dyn Fn(kube::Config) -> Result<Client, kube::Error> + Send + Sync>;

struct Running {
    endpoint: Endpoint,
    content: u64,
    checked: Instant,
    task: tokio::task::AbortHandle,
}

/// The endpoints of identities, by Secret.
pub struct Endpoints {
    management: Client,
    factory: ClientFactory,
    owner: Owner,
    /// Where the Secrets of KaironClusterIdentities are: the manager's namespace.
    identity_namespace: String,
    trigger: futures::channel::mpsc::UnboundedSender<ObjectRef<KaironMachine>>,
    telemetry: Telemetry,
    /// The servers identities may name.
    allowed: AllowedServers,
    /// What the endpoints keep, held against the budgets over all of them.
    ledger: Arc<Ledger>,
    /// Where the identity of an endpoint cut off is sent: its KaironClusters say so at once.
    cut_offs: Option<futures::channel::mpsc::UnboundedSender<IdentityKey>>,
    running: Mutex<HashMap<IdentityKey, Running>>,
}

impl Endpoints {
    /// Endpoints whose watches trigger KaironMachine reconciles through `trigger`.
    pub(crate) fn new(
        management: Client,
        factory: ClientFactory,
        owner: Owner,
        identity_namespace: String,
        trigger: futures::channel::mpsc::UnboundedSender<ObjectRef<KaironMachine>>,
        telemetry: Telemetry,
    ) -> Self {
        Endpoints {
            management,
            factory,
            owner,
            identity_namespace,
            trigger,
            telemetry,
            allowed: AllowedServers::default(),
            ledger: Ledger::new(EndpointCaps::default()),
            cut_offs: None,
            running: Mutex::new(HashMap::new()),
        }
    }

    /// Endpoints that read identities with `management`, build plain clients and trigger
    /// nothing: for the request-sequence tests of the reconcilers.
    pub fn for_request_tests(management: Client, identity_namespace: &str) -> Self {
        let telemetry = Telemetry {
            metrics: crate::metrics::Metrics::new(),
            caches: Default::default(),
            events: None,
        };
        let factory: ClientFactory = Arc::new(Client::try_from);
        let (trigger, _) = futures::channel::mpsc::unbounded();
        Self::new(
            management,
            factory,
            Owner::default(),
            identity_namespace.into(),
            trigger,
            telemetry,
        )
    }

    /// Identities may name only these servers (`--identity-allowed-servers`).
    pub(crate) fn with_allowed_servers(mut self, allowed: AllowedServers) -> Self {
        self.allowed = allowed;
        self
    }

    /// A namespace opens so many endpoints, and they keep so much (the
    /// `--identity-endpoints-per-namespace`, `--identity-cache-bytes-per-namespace` and
    /// `--identity-cache-bytes` flags).
    pub(crate) fn with_caps(mut self, caps: EndpointCaps) -> Self {
        self.ledger = Ledger::new(caps);
        self
    }

    /// The identity of an endpoint cut off (over a budget) is sent to `cut_offs`.
    pub(crate) fn with_cut_off_trigger(
        mut self,
        cut_offs: futures::channel::mpsc::UnboundedSender<IdentityKey>,
    ) -> Self {
        self.cut_offs = Some(cut_offs);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IdentityKey, Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many endpoints run (metrics, tests).
    pub fn running(&self) -> usize {
        self.lock().len()
    }

    /// The namespace of the Secrets of KaironClusterIdentities.
    pub(crate) fn identity_namespace(&self) -> &str {
        &self.identity_namespace
    }

    /// The endpoint of identity `r` of namespace `ns`, started if it is not running, restarted
    /// if its Secret changed since it was last read more than [`RECHECK`] ago.
    pub(crate) async fn endpoint(&self, ns: &str, r: &KaironIdentityReference) -> Result<Endpoint, EndpointError> {
        let key = IdentityKey {
            namespace: ns.to_string(),
            identity: r.clone(),
        };
        if let Some(run) = self.lock().get(&key)
            && run.checked.elapsed() < RECHECK
        {
            return Ok(run.endpoint.clone());
        }
        self.refresh(&key).await
    }

    /// The cache of the running endpoint of identity `r` of namespace `ns`, if it runs; reads
    /// nothing (for a paused reconcile, which makes no request).
    pub(crate) fn cached_store(&self, ns: &str, r: &KaironIdentityReference) -> Option<Store<kairon::Vm>> {
        let key = IdentityKey {
            namespace: ns.to_string(),
            identity: r.clone(),
        };
        self.lock().get(&key).map(|run| run.endpoint.store.clone())
    }

    /// Reads the identity and the Secret of `key`; starts or restarts its endpoint if the
    /// content is new, stops it if the identity no longer allows the namespace.
    async fn refresh(&self, key: &IdentityKey) -> Result<Endpoint, EndpointError> {
        let secret_ref = self.secret_of(key).await;
        let (ns, name) = match secret_ref {
            Ok(r) => r,
            Err(e @ EndpointError::NotAllowed(..)) => {
                if let Some(run) = self.lock().remove(key) {
                    run.task.abort();
                    warn!(identity = %key, "Kairon endpoint stopped: the identity does not allow the namespace");
                }
                return Err(e);
            }
            // Unreadable (or gone) while running: as for the Secret below.
            Err(e) => {
                let mut running = self.lock();
                return match running.get_mut(key) {
                    Some(run) => {
                        run.checked = Instant::now();
                        Ok(run.endpoint.clone())
                    }
                    None => Err(e),
                };
            }
        };
        let what = format!("{ns}/{name}");
        let secret = Api::<Secret>::namespaced(self.management.clone(), &ns)
            .get_opt(&name)
            .await
            .map_err(|e| EndpointError::Read(what.clone(), e.to_string()));
        let secret = match secret {
            Ok(Some(s)) => s,
            // Gone (or unreadable) while running: keep speaking to the endpoint with what we
            // have, so that VMs can still be deleted; the KaironCluster says what is wrong.
            Ok(None) | Err(_) if self.lock().contains_key(key) => {
                let mut running = self.lock();
                if let Some(run) = running.get_mut(key) {
                    run.checked = Instant::now();
                    return Ok(run.endpoint.clone());
                }
                return Err(EndpointError::SecretNotFound(what));
            }
            Ok(None) => return Err(EndpointError::SecretNotFound(what)),
            Err(e) => return Err(e),
        };
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(IDENTITY_KUBECONFIG_KEY))
            .map(|b| b.0.clone())
            .ok_or_else(|| EndpointError::NoKubeconfig(what.clone()))?;
        let content = hash_of(&bytes);
        {
            let mut running = self.lock();
            if let Some(run) = running.get_mut(key)
                && run.content == content
            {
                run.checked = Instant::now();
                return Ok(run.endpoint.clone());
            }
            // Refused before a client is built for it: it is asked for again and again.
            self.one_more(&running, key)?;
        }
        let (client, fingerprint) = self.client_from(&what, &bytes).await?;
        let mut running = self.lock();
        if let Some(old) = running.get(key)
            && old.content == content
        {
            // Another reconcile started the same endpoint meanwhile: keep the first.
            return Ok(old.endpoint.clone());
        }
        // Another reconcile may have opened one for the namespace meanwhile.
        self.one_more(&running, key)?;
        let endpoint = self.start(key, client, fingerprint);
        let restarted = running
            .insert(
                key.clone(),
                Running {
                    endpoint: endpoint.0.clone(),
                    content,
                    checked: Instant::now(),
                    task: endpoint.1,
                },
            )
            .map(|old| old.task.abort())
            .is_some();
        info!(identity = %key, secret = %what, restarted, endpoints = running.len(), "Kairon endpoint started");
        Ok(endpoint.0)
    }

    /// Whether the endpoint of `key` may be started, `running` being those running: a restart
    /// is no new endpoint, but one more for its namespace may be one too many.
    fn one_more(&self, running: &HashMap<IdentityKey, Running>, key: &IdentityKey) -> Result<(), EndpointError> {
        let caps = self.ledger.caps();
        let open = running.keys().filter(|k| k.namespace == key.namespace).count();
        if running.contains_key(key) || !caps.refuses_another(open) {
            return Ok(());
        }
        Err(EndpointError::TooManyEndpoints(
            key.namespace.clone(),
            caps.endpoints_per_namespace,
        ))
    }

    /// Stops the endpoints no KaironCluster and no KaironMachine names any more, and reads the
    /// Secrets of the others again (rotation is picked up even when nothing is reconciled).
    /// Returns the identities whose endpoints it stopped.
    pub(crate) async fn sweep(&self, in_use: &HashSet<IdentityKey>) -> Vec<KaironIdentityReference> {
        let mut stopped = vec![];
        let keys: Vec<IdentityKey> = {
            let mut running = self.lock();
            running.retain(|key, run| {
                let keep = in_use.contains(key);
                if !keep {
                    run.task.abort();
                    info!(identity = %key, "Kairon endpoint stopped: no cluster uses it");
                    stopped.push(key.identity.clone());
                }
                keep
            });
            running
                .iter()
                .filter(|(_, run)| run.checked.elapsed() >= RECHECK)
                .map(|(k, _)| k.clone())
                .collect()
        };
        for key in keys {
            if let Err(e) = self.refresh(&key).await {
                warn!(error = %e, "Kairon endpoint not refreshed");
            }
        }
        stopped
    }

    /// The management cluster's client (the identities' Secrets are read with it).
    pub(crate) fn management(&self) -> &Client {
        &self.management
    }
}

/// The KaironMachine that Kairon Machine `vm` links back to, if it is of `namespace`: the one
/// namespace whose KaironMachines an endpoint serves (an endpoint is one identity *and* one
/// namespace the identity allows; the namespace's own for a Secret), or, for the default Kairon
/// API, the Kairon Machine's own (the manager creates each in its KaironMachine's namespace).
/// The link-back labels are written by whoever writes the Kairon Machine — on a tenant's Kairon
/// API, the tenant: a Kairon Machine naming a KaironMachine of another namespace reconciles
/// nothing, or a tenant could spend the manager's reconciles (and the client's budget) on any
/// namespace's machines.
pub(crate) fn kaironmachine_in(vm: &kairon::Vm, namespace: &str) -> Option<ObjectRef<KaironMachine>> {
    kairon::kaironmachine_for_instance(vm).filter(|km| km.namespace.as_deref() == Some(namespace))
}

/// The KaironClusters that name the identity of endpoint `key`.
pub(crate) fn kaironclusters_naming(kcs: &Store<KaironCluster>, key: &IdentityKey) -> Vec<ObjectRef<KaironCluster>> {
    kcs.state()
        .iter()
        .filter(|kc| {
            kc.namespace().as_deref() == Some(key.namespace.as_str())
                && kc.spec.identity_ref.as_ref() == Some(&key.identity)
        })
        .map(|kc| ObjectRef::from_obj(kc.as_ref()))
        .collect()
}

/// The identities named by KaironClusters and recorded on KaironMachines.
pub(crate) fn identities_in_use(kcs: &Store<KaironCluster>, kms: &Store<KaironMachine>) -> HashSet<IdentityKey> {
    let of_clusters = kcs.state().into_iter().filter_map(|kc| {
        Some(IdentityKey {
            identity: kc.spec.identity_ref.clone()?,
            namespace: kc.namespace()?,
        })
    });
    let of_machines = kms.state().into_iter().filter_map(|km| {
        Some(IdentityKey {
            identity: km.status.as_ref()?.instance.as_ref()?.identity_ref.clone()?,
            namespace: km.namespace()?,
        })
    });
    of_clusters.chain(of_machines).collect()
}

#[cfg(test)]
mod tests;
