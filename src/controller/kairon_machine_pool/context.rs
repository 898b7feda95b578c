//! What a KaironMachinePool reconcile reads: its caches, and the pool's owner MachinePool,
//! Cluster, and the KaironMachines and Machines of its members.

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};

use crate::api::{KaironMachine, KaironMachinePool};
use crate::capi::{self, MachinePool, POOL_NAME_LABEL, format_label_value};
use crate::controller::error::Error;
use crate::controller::runtime::{Synced, owning_cluster};
use crate::controller::settings::Settings;
use crate::controller::write::Writer;
use crate::events::Events;
use crate::metrics::Metrics;

/// Shared by every reconcile of the controller.
pub struct Context {
    pub client: Client,
    pub machine_pools: Store<MachinePool>,
    pub clusters: Store<capi::Cluster>,
    /// Every KaironMachine (the KaironMachine controller's cache); a pool's members carry its
    /// MachinePool's `cluster.x-k8s.io/pool-name` label.
    pub kaironmachines: Store<KaironMachine>,
    /// CAPI Machines of pools (label `cluster.x-k8s.io/pool-name`).
    pub machines: Store<capi::Machine>,
    pub synced: Vec<Synced>,
    pub settings: Settings,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    /// When each pool may next replace a broken VM.
    pub broken_backoff: super::broken_backoff::BrokenBackoff,
    /// The KaironMachines each pool created that the cache does not show yet.
    pub pending: super::pending::Pending,
    /// When each pool last published its list and status.
    pub published: super::published::Published,
}

impl Context {
    /// A context for the request-sequence tests: every request goes to `client`, every cache
    /// empty and synced, events off. Its fields are public: a test fills the caches it needs.
    #[doc(hidden)]
    pub fn for_request_tests(client: Client) -> Self {
        Context {
            client,
            machine_pools: kube::runtime::reflector::store().0,
            clusters: kube::runtime::reflector::store().0,
            kaironmachines: kube::runtime::reflector::store().0,
            machines: kube::runtime::reflector::store().0,
            synced: vec![Synced::ready()],
            settings: Settings::default(),
            events: Events::disabled(),
            metrics: Metrics::new(),
            broken_backoff: Default::default(),
            pending: Default::default(),
            published: Default::default(),
        }
    }
}

/// One pool and what it belongs to, from the caches.
pub(crate) struct Scope {
    pub pool: Arc<KaironMachinePool>,
    pub ns: String,
    /// The owner MachinePool, once CAPI set it (and it is that very one, by UID).
    pub machine_pool: Option<Arc<MachinePool>>,
    /// The owner MachinePool names this pool (`spec.template.spec.infrastructureRef`): only
    /// then does the pool act for it.
    pub named: bool,
    pub cluster_name: String,
    pub cluster: Option<Arc<capi::Cluster>>,
}

impl Scope {
    /// The key of the pool's in-memory records (its UID: a pool made again under the same
    /// name starts afresh).
    pub(crate) fn key(&self) -> String {
        format!(
            "{}/{}/{}",
            self.ns,
            self.pool.name_any(),
            self.pool.uid().unwrap_or_default()
        )
    }
}

impl Context {
    pub(crate) fn dereference(&self, pool: Arc<KaironMachinePool>) -> Result<Scope, Error> {
        let ns = pool.namespace().ok_or(Error::MissingNamespace)?;
        let machine_pool = capi::owner(&pool.metadata, "MachinePool").and_then(|o| {
            self.machine_pools
                .get(&ObjectRef::new(&o.name).within(&ns))
                .filter(|mp| mp.metadata.uid.as_deref() == Some(o.uid.as_str()))
        });
        let cluster_name = capi::label(&pool.metadata, capi::CLUSTER_NAME_LABEL)
            .map(str::to_string)
            .or_else(|| machine_pool.as_ref().map(|mp| mp.spec.cluster_name.clone()))
            .unwrap_or_default();
        let cluster = owning_cluster(
            &self.clusters,
            &ns,
            Some(cluster_name.as_str()).filter(|c| !c.is_empty()),
        );
        let named = machine_pool
            .as_deref()
            .is_some_and(|mp| names_another(mp, &pool).is_none());
        Ok(Scope {
            pool,
            ns,
            named,
            machine_pool,
            cluster_name,
            cluster,
        })
    }

    pub(crate) fn writer(&self, ns: &str) -> Writer<'_, KaironMachinePool> {
        Writer::new(Api::namespaced(self.client.clone(), ns), None)
    }

    /// The members' KaironMachines of MachinePool `machine_pool` in the pool's cluster, as
    /// cached, by name: whichever KaironMachinePool made them (a repointed MachinePool's new
    /// pool takes over the old one's members).
    pub(crate) fn kaironmachines_of(&self, s: &Scope, machine_pool: &str) -> Vec<Arc<KaironMachine>> {
        let value = format_label_value(machine_pool);
        let mut kms: Vec<_> = self
            .kaironmachines
            .state()
            .into_iter()
            .filter(|km| km.metadata.namespace.as_deref() == Some(s.ns.as_str()))
            .filter(|km| km.labels().get(POOL_NAME_LABEL) == Some(&value))
            .filter(|km| capi::label(&km.metadata, capi::CLUSTER_NAME_LABEL) == Some(s.cluster_name.as_str()))
            .collect();
        // By name: the store's order changes between calls, what the pool does should not.
        // (Compared in place: a pool of thousands is sorted on every reconcile.)
        kms.sort_unstable_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        kms
    }

    /// The Machines CAPI made for the members of MachinePool `machine_pool`, as the API server
    /// has them now.
    pub(crate) async fn list_machines_of(
        &self,
        s: &Scope,
        machine_pool: &str,
    ) -> Result<Vec<Arc<capi::Machine>>, Error> {
        let lp =
            kube::api::ListParams::default().labels(&format!("{POOL_NAME_LABEL}={}", format_label_value(machine_pool)));
        let mut machines: Vec<_> = Api::<capi::Machine>::namespaced(self.client.clone(), &s.ns)
            .list(&lp)
            .await
            .map_err(Error::read(format!(
                "the Machines of MachinePool {}/{machine_pool}",
                s.ns
            )))?
            .items
            .into_iter()
            .filter(|m| m.spec.cluster_name == s.cluster_name)
            .map(Arc::new)
            .collect();
        machines.sort_by_key(|m| m.name_any());
        Ok(machines)
    }

    /// The Machines CAPI made for the members of MachinePool `machine_pool`, as cached.
    pub(crate) fn machines_of(&self, s: &Scope, machine_pool: &str) -> Vec<Arc<capi::Machine>> {
        let value = format_label_value(machine_pool);
        let mut machines: Vec<_> = self
            .machines
            .state()
            .into_iter()
            .filter(|m| m.metadata.namespace.as_deref() == Some(s.ns.as_str()))
            .filter(|m| m.labels().get(POOL_NAME_LABEL) == Some(&value))
            .filter(|m| capi::label(&m.metadata, capi::CLUSTER_NAME_LABEL) == Some(s.cluster_name.as_str()))
            .collect();
        machines.sort_unstable_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        machines
    }
}

/// What `mp`'s infrastructure reference names instead of `pool`, if it does not name `pool`.
pub(super) fn names_another(mp: &MachinePool, pool: &KaironMachinePool) -> Option<String> {
    let named = mp.spec.template.spec.infrastructure_ref.as_ref();
    match named {
        Some(r) if r.is(crate::api::GROUP, "KaironMachinePool") && r.name == pool.name_any() => None,
        Some(r) if r.name.is_empty() => Some("nothing".to_string()),
        Some(r) => Some(format!("{} {}", r.kind, r.name)),
        None => Some("nothing".to_string()),
    }
}
