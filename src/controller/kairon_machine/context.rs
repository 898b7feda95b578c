//! What a KaironMachine reconcile works with, read in one place: the [`Context`] (clients,
//! settings, caches), the [`Scope`] it dereferences first (the KaironMachine as fresh as we
//! know it, its owner Machine and Cluster from the caches), the [`Target`] Kairon API its VM
//! lives on. The create and delete paths and the reconcile's entry build on it; the status is
//! written on the way out ([`super::finish`]).

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};

pub use super::evacuate::Evacuating;
use super::status::Observed;
use crate::api::conditions::{Decided, INSTANCE_PROVISIONED, Status, reason};
use crate::api::{self, KaironCluster, KaironIdentityReference, KaironMachine};
use crate::capi;
use crate::controller::endpoints::Endpoints;
use crate::controller::error::Error;
use crate::controller::fresh::Fresher;
use crate::controller::runtime::Synced;
use crate::controller::runtime::owning_cluster;
use crate::controller::settings::Settings;
use crate::controller::write::Writer;
use crate::events::Events;
use crate::kairon::{self, Instances};
use crate::metrics::Metrics;

/// How often to look again at a Kairon API that cannot be used (identity Secret, reachability).
pub(super) const ENDPOINT_RETRY: Duration = Duration::from_secs(15);

/// What the reconciler needs: clients, settings and the caches its watches fill.
pub struct Context {
    /// The management cluster.
    pub client: Client,
    /// Where Kairon Machines live for clusters without an identity (the management cluster
    /// unless configured otherwise).
    pub kairon: Instances,
    /// The Kairon APIs of identities (`KaironCluster.spec.identityRef`); `None`: identities
    /// are not looked at and every VM is on `kairon` (request-sequence tests).
    pub endpoints: Option<Arc<Endpoints>>,
    /// KaironClusters, for the identity of a machine whose VM is not created yet.
    pub kaironclusters: Store<KaironCluster>,
    pub settings: Settings,
    pub machines: Store<capi::MachineView>,
    /// MachineHealthChecks: which of them selects a Machine now (host maintenance).
    pub health_checks: Store<capi::MachineHealthCheck>,
    pub clusters: Store<capi::Cluster>,
    pub instances: Store<kairon::Vm>,
    /// First lists of `machines`, `clusters`, `instances` and `kaironclusters`.
    pub synced: Vec<Synced>,
    /// Events on KaironMachines (disabled in mock tests).
    pub events: Events,
    pub metrics: Arc<Metrics>,
    /// Our last writes to KaironMachines the cache has not shown yet.
    pub fresh: Fresher<KaironMachine>,
    /// The KaironMachines whose evacuation is under way, by cluster (watch mapping).
    pub evacuating: Evacuating,
    /// Kairon's nodes on `kairon` (`None`: not readable there, or not watched).
    pub nodes: Option<Store<k8s_openapi::api::core::v1::Node>>,
    /// The workers each tenant's machines may hold ([`crate::controller::tenant_share`]).
    pub shares: crate::controller::tenant_share::TenantShares,
    /// MachinePools: a pool member's bootstrap data is named by its MachinePool.
    pub machine_pools: Store<capi::MachinePool>,
    /// The bootstrap configs already found to be a MachinePool's.
    pub checked_configs: super::checked_configs::CheckedConfigs,
    /// The metadata of bootstrap configs, watched once a kind is met.
    pub bootstrap_configs: super::bootstrap_configs::BootstrapConfigs,
}

impl Context {
    /// A context for the request-sequence tests: every request goes to `client` (Kairon's
    /// too, at `v1alpha1`), no identities, every cache empty and synced, events off. Its
    /// fields are public: a test fills the caches it needs.
    #[doc(hidden)]
    pub fn for_request_tests(client: Client) -> Self {
        Context {
            kairon: Instances::new(client.clone(), kairon::served::Served::assumed("v1alpha1")),
            client,
            endpoints: None,
            kaironclusters: kube::runtime::reflector::store().0,
            settings: Settings::default(),
            machines: kube::runtime::reflector::store().0,
            health_checks: kube::runtime::reflector::store().0,
            clusters: kube::runtime::reflector::store().0,
            instances: kube::runtime::reflector::store().0,
            synced: vec![Synced::ready()],
            events: Events::disabled(),
            metrics: Metrics::new(),
            fresh: Default::default(),
            evacuating: Default::default(),
            nodes: None,
            shares: crate::controller::tenant_share::TenantShares::new(10),
            machine_pools: kube::runtime::reflector::store().0,
            checked_configs: Default::default(),
            bootstrap_configs: super::bootstrap_configs::BootstrapConfigs::not_watched(),
        }
    }

    /// The cache of Kairon's nodes of the Kairon API `target` is on: the manager's own only
    /// (a tenant's Kairon API is not asked for its Nodes).
    pub(super) fn nodes_of(&self, target: &Target) -> Option<&Store<k8s_openapi::api::core::v1::Node>> {
        if target.identity.is_some() {
            None
        } else {
            self.nodes.as_ref()
        }
    }
}

/// What a reconcile has read before deciding anything: the KaironMachine (as fresh as we know
/// it), its owner Machine and its Cluster from the caches.
pub(super) struct Scope {
    pub(super) km: Arc<KaironMachine>,
    pub(super) ns: String,
    pub(super) machine: Option<Arc<capi::MachineView>>,
    pub(super) cluster: Option<Arc<capi::Cluster>>,
    /// From the cluster-name label, else the Machine's `spec.clusterName`; empty if neither.
    pub(super) cluster_name: String,
}

impl Scope {
    /// The KaironCluster the machine's Cluster names as its infrastructure, if any.
    pub(super) fn kaironcluster_name(&self) -> Option<&str> {
        self.cluster
            .as_deref()
            .and_then(|c| c.infrastructure_name(api::GROUP, "KaironCluster"))
    }
}

/// The Kairon API a KaironMachine's VM lives on, and the identity that names it (`None`:
/// the manager's own).
pub(super) struct Target {
    pub(super) instances: Instances,
    pub(super) store: Store<kairon::Vm>,
    pub(super) identity: Option<KaironIdentityReference>,
    /// Which Kairon API this is (`None`: the manager's own), recorded with the VM found there.
    pub(super) endpoint: Option<String>,
    /// The Kairon API the VM was recorded on, when the identity names another one now: a VM
    /// not found here is not gone, it is elsewhere ([`Target::elsewhere`]).
    pub(super) moved_from: Option<String>,
}

impl Target {
    /// What is observed of a VM that is not on this Kairon API when the identity has been
    /// pointed elsewhere since the VM was recorded: the VM lives on (as far as anyone here can
    /// tell) where it was, so the last known status is kept and nothing is created or released.
    /// `None` when the identity names the API the VM was recorded on.
    pub(super) fn elsewhere(&self, name: &str) -> Option<Observed> {
        let was = self.moved_from.as_deref()?;
        let identity = self
            .identity
            .as_ref()
            .map(|i| format!("identity {} {}", i.kind, i.name))
            .unwrap_or_else(|| "the identity".into());
        Some(Observed::Waiting(Decided::new(
            INSTANCE_PROVISIONED,
            Status::Unknown,
            reason::INSTANCE_ENDPOINT_CHANGED,
            format!(
                "Kairon Machine {name} was recorded on Kairon API {was}; {identity} now names another one ({}), \
                 where it is not: it is not taken as gone, and nothing is created or deleted until the identity \
                 names the Kairon API that holds it again",
                self.endpoint.as_deref().unwrap_or_default()
            ),
        )))
    }
}

/// How the reconcile goes on after a step: with what the step produced, or stopping with what
/// was observed (and when to look again).
pub(super) enum Step<T> {
    Continue(T),
    Stop(Observed, Action),
}

impl Context {
    /// Reads the owner Machine and the Cluster of `km` from the caches.
    pub(super) fn dereference(&self, km: Arc<KaironMachine>) -> Result<Scope, Error> {
        let km = self.fresh.freshest(km);
        let ns = km.namespace().ok_or(Error::MissingNamespace)?;
        let machine =
            capi::owner(&km.metadata, "Machine").and_then(|o| self.machines.get(&ObjectRef::new(&o.name).within(&ns)));
        let cluster_name = capi::cluster_name(&km.metadata)
            .map(str::to_string)
            .or_else(|| {
                machine
                    .as_ref()
                    .map(|m| m.spec.cluster_name.clone())
                    .filter(|c| !c.is_empty())
            })
            .unwrap_or_default();
        let cluster = owning_cluster(
            &self.clusters,
            &ns,
            Some(cluster_name.as_str()).filter(|c| !c.is_empty()),
        );
        Ok(Scope {
            km,
            ns,
            machine,
            cluster,
            cluster_name,
        })
    }

    pub(super) fn writer(&self, ns: &str) -> Writer<'_, KaironMachine> {
        Writer::new(Api::namespaced(self.client.clone(), ns), Some(&self.fresh))
    }

    /// Nothing to wait for: the next reconcile comes from a change, or from the resync every
    /// `--sync-period` ([`crate::controller::resync`]), which holds no timer per object.
    pub(super) fn resync(&self) -> Action {
        Action::await_change()
    }

    fn default_target(&self) -> Target {
        Target {
            instances: self.kairon.clone(),
            store: self.instances.clone(),
            identity: None,
            endpoint: None,
            moved_from: None,
        }
    }

    /// The Kairon API of the KaironMachine: the one its VM was created on (recorded in
    /// status, so that deletion talks to it whatever happened since), else the one its
    /// KaironCluster names. Stops, saying why, when that API cannot be used now.
    pub(super) async fn target(&self, scope: &Scope) -> Result<Step<Target>, Error> {
        let Some(endpoints) = &self.endpoints else {
            return Ok(Step::Continue(self.default_target()));
        };
        let instance = scope.km.status.as_ref().and_then(|s| s.instance.as_ref());
        let recorded = instance.map(|i| i.identity_ref.clone());
        let recorded_endpoint = instance.and_then(|i| i.endpoint.clone());
        let identity = match recorded {
            Some(identity) => identity,
            // No Cluster: nothing will be created (that waits for the Cluster's
            // infrastructure), and a VM that exists anyway can only be on the default API —
            // it is looked at there, as without identities.
            None if scope.cluster.is_none() => None,
            None => match self.named_identity(scope).await? {
                Some(identity) => identity,
                None => {
                    let d = Decided::new(
                        INSTANCE_PROVISIONED,
                        Status::False,
                        reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
                        format!("waiting for the KaironCluster of Cluster {}", scope.cluster_name),
                    );
                    return Ok(Step::Stop(Observed::Waiting(d), Action::requeue(ENDPOINT_RETRY)));
                }
            },
        };
        let Some(identity) = identity else {
            return Ok(Step::Continue(self.default_target()));
        };
        let unavailable = |r: &'static str, why: String| {
            let why = format!("the Kairon API of identity {} {}: {why}", identity.kind, identity.name);
            let d = Decided::new(
                INSTANCE_PROVISIONED,
                Status::Unknown,
                r,
                crate::text::bounded(&why, 1024),
            );
            Ok(Step::Stop(Observed::Waiting(d), Action::requeue(ENDPOINT_RETRY)))
        };
        let endpoint = match endpoints.endpoint(&scope.ns, &identity).await {
            Ok(e) => e,
            Err(e) => return unavailable(e.reason(), e.to_string()),
        };
        if let Err(why) = endpoint.ready().await {
            return unavailable(reason::KAIRON_API_UNAVAILABLE, why);
        }
        let fingerprint = endpoint.fingerprint().to_string();
        Ok(Step::Continue(Target {
            moved_from: recorded_endpoint.filter(|e| *e != fingerprint),
            endpoint: Some(fingerprint),
            instances: endpoint.instances,
            store: endpoint.store,
            identity: Some(identity),
        }))
    }

    /// The identity the KaironCluster of the machine's Cluster names (`Some(None)`: none);
    /// `None` while that KaironCluster is not known.
    async fn named_identity(&self, scope: &Scope) -> Result<Option<Option<KaironIdentityReference>>, Error> {
        let Some(kc_name) = scope.kaironcluster_name() else {
            return Ok(None);
        };
        let ns = scope.ns.as_str();
        if let Some(kc) = self.kaironclusters.get(&ObjectRef::new(kc_name).within(ns)) {
            return Ok(Some(kc.spec.identity_ref.clone()));
        }
        // The cache may lag behind a KaironCluster just created: ask before deciding.
        let kc = Api::<KaironCluster>::namespaced(self.client.clone(), ns)
            .get_opt(kc_name)
            .await
            .map_err(Error::read(format!("KaironCluster {ns}/{kc_name}")))?;
        Ok(kc.map(|kc| kc.spec.identity_ref))
    }
}

/// When to look again: soon while the VM is elsewhere (the identity may be pointed back, and
/// nothing else triggers a reconcile then), at the resync otherwise.
pub(super) fn retry_elsewhere(target: &Target, ctx: &Context) -> Action {
    if target.moved_from.is_some() {
        Action::requeue(ENDPOINT_RETRY)
    } else {
        ctx.resync()
    }
}
