//! What a KaironMachinePool reconcile reads: its caches, and the pool's owner MachinePool,
//! Cluster, Kairon MachineSet, members, KaironMachines and Machines in them.

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};

use crate::api::{KaironCluster, KaironMachine, KaironMachinePool};
use crate::capi::{self, MachinePool, POOL_NAME_LABEL, format_label_value};
use crate::controller::error::Error;
use crate::controller::runtime::{Synced, owning_cluster};
use crate::controller::settings::Settings;
use crate::controller::write::Writer;
use crate::events::Events;
use crate::kairon::labels::KAIRONMACHINEPOOL_NAME;
use crate::kairon::machineset::MachineSet;
use crate::kairon::set_desired::{PoolLink, label_value};
use crate::kairon::set_observe::is_member_of;
use crate::kairon::{self, Instances, MachineSets};
use crate::metrics::Metrics;

/// Shared by every reconcile of the controller.
pub struct Context {
    pub client: Client,
    /// The manager's Kairon API (pools on an identity's are not served yet).
    pub kairon: Instances,
    pub machine_pools: Store<MachinePool>,
    pub clusters: Store<capi::Cluster>,
    pub kaironclusters: Store<KaironCluster>,
    /// Kairon MachineSets this provider made (label `app.kubernetes.io/managed-by`), without
    /// user-data.
    pub sets: Store<MachineSet>,
    /// Kairon Machines that are members of a MachineSet.
    pub members: Store<kairon::Machine>,
    /// KaironMachines of pools (label `kaironmachinepool-name`).
    pub kaironmachines: Store<KaironMachine>,
    /// CAPI Machines of pools (label `cluster.x-k8s.io/pool-name`).
    pub machines: Store<capi::Machine>,
    pub synced: Vec<Synced>,
    pub settings: Settings,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    /// When each pool may next replace a broken VM.
    pub broken_backoff: super::broken_backoff::BrokenBackoff,
}

/// One pool and what it belongs to, from the caches.
pub(crate) struct Scope {
    pub pool: Arc<KaironMachinePool>,
    pub ns: String,
    pub link: PoolLink,
    /// The owner MachinePool, once CAPI set it (and it is that very one, by UID).
    pub machine_pool: Option<Arc<MachinePool>>,
    pub cluster_name: String,
    pub cluster: Option<Arc<capi::Cluster>>,
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
        let link = PoolLink {
            name: pool.name_any(),
            namespace: ns.clone(),
            uid: pool.uid().unwrap_or_default(),
        };
        Ok(Scope {
            pool,
            ns,
            link,
            machine_pool,
            cluster_name,
            cluster,
        })
    }

    /// Whether the pool's KaironCluster names a Kairon API of its own (`spec.identityRef`).
    pub(crate) fn uses_an_identity(&self, s: &Scope) -> bool {
        let Some(name) = s
            .cluster
            .as_ref()
            .and_then(|c| c.infrastructure_name(crate::api::GROUP, "KaironCluster"))
        else {
            return false;
        };
        self.kaironclusters
            .get(&ObjectRef::new(name).within(&s.ns))
            .is_some_and(|kc| kc.spec.identity_ref.is_some())
    }

    pub(crate) fn sets(&self) -> MachineSets {
        self.kairon.machine_sets()
    }

    pub(crate) fn writer(&self, ns: &str) -> Writer<'_, KaironMachinePool> {
        Writer::new(Api::namespaced(self.client.clone(), ns), None)
    }

    /// The sets labelled for the pool, as cached, by name (whose they are is for the caller to
    /// decide).
    pub(crate) fn sets_of(&self, s: &Scope) -> Vec<Arc<MachineSet>> {
        let value = label_value(&s.link.name);
        let mut sets: Vec<_> = self
            .sets
            .state()
            .into_iter()
            .filter(|set| set.namespace().as_deref() == Some(s.ns.as_str()))
            .filter(|set| set.labels().get(KAIRONMACHINEPOOL_NAME) == Some(&value))
            .collect();
        sets.sort_by_key(|set| set.name_any());
        sets
    }

    /// The members of `set`, as cached.
    pub(crate) fn members_of(&self, set: &MachineSet) -> Vec<Arc<kairon::Machine>> {
        self.members
            .state()
            .into_iter()
            .filter(|vm| is_member_of(vm, set))
            .collect()
    }

    /// The pool's KaironMachines, as cached.
    pub(crate) fn kaironmachines_of(&self, s: &Scope) -> Vec<Arc<KaironMachine>> {
        let value = label_value(&s.link.name);
        let mut kms: Vec<_> = self
            .kaironmachines
            .state()
            .into_iter()
            .filter(|km| km.namespace().as_deref() == Some(s.ns.as_str()))
            .filter(|km| km.labels().get(KAIRONMACHINEPOOL_NAME) == Some(&value))
            .collect();
        // By name: the store's order changes between calls, what the pool does should not.
        kms.sort_by_key(|km| km.name_any());
        kms
    }

    /// The Machines CAPI made for the pool's KaironMachines, as the API server has them now.
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
            .map(Arc::new)
            .collect();
        machines.sort_by_key(|m| m.name_any());
        Ok(machines)
    }

    /// The Machines CAPI made for the pool's KaironMachines, as cached.
    pub(crate) fn machines_of(&self, s: &Scope, machine_pool: &str) -> Vec<Arc<capi::Machine>> {
        let value = format_label_value(machine_pool);
        let mut machines: Vec<_> = self
            .machines
            .state()
            .into_iter()
            .filter(|m| m.namespace().as_deref() == Some(s.ns.as_str()))
            .filter(|m| m.labels().get(POOL_NAME_LABEL) == Some(&value))
            .collect();
        machines.sort_by_key(|m| m.name_any());
        machines
    }
}
