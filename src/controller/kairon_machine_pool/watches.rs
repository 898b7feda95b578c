//! What a KaironMachinePool reconcile is triggered by: its own changes, its MachinePool's
//! (replicas, bootstrap data, version), its Cluster's (pause, provisioning), and its members'
//! KaironMachines and the Machines CAPI made for them; and the caches those watches fill.

use std::sync::Arc;

use futures::{Future, Stream, StreamExt, TryStreamExt};
use kube::runtime::controller::Config as ControllerConfig;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use super::context::Context;
use super::reconcile::reconcile;
use crate::api::{self, KaironMachine, KaironMachinePool};
use crate::capi::{self, MachinePool, POOL_NAME_LABEL, format_label_value};
use crate::controller::caches::Caches;
use crate::controller::runtime::{
    Backoff, Synced, Telemetry, error_policy, instrumented, keep_read_annotations, log_outcome, watch_error,
};
use crate::controller::settings::Settings;

/// The pool whose MachinePool an object labelled `cluster.x-k8s.io/pool-name` (a member's
/// KaironMachine, its Machine) belongs to: the one that MachinePool names now.
fn pool_of_member<K: Resource>(machine_pools: &Store<MachinePool>, obj: &K) -> Option<ObjectRef<KaironMachinePool>> {
    let meta = obj.meta();
    let value = meta.labels.as_ref()?.get(POOL_NAME_LABEL)?;
    let ns = meta.namespace.as_deref()?;
    let cluster = capi::label(meta, capi::CLUSTER_NAME_LABEL);
    machine_pools
        .state()
        .into_iter()
        .find(|mp| {
            mp.namespace().as_deref() == Some(ns)
                && Some(mp.spec.cluster_name.as_str()) == cluster
                && format_label_value(&mp.name_any()) == *value
        })
        .and_then(|mp| pool_of_machine_pool(&mp))
}

/// What of a Cluster a pool reacts to: pause, provisioning, deletion.
fn cluster_trigger(c: &capi::Cluster) -> Option<u64> {
    Some(crate::hashing::hash_of(&(
        c.spec.paused,
        c.infrastructure_provisioned(),
        c.metadata.deletion_timestamp.is_some(),
    )))
}

/// The pool a MachinePool's `infrastructureRef` names.
fn pool_of_machine_pool(mp: &MachinePool) -> Option<ObjectRef<KaironMachinePool>> {
    let r = mp
        .spec
        .template
        .spec
        .infrastructure_ref
        .as_ref()
        .filter(|r| r.is(api::GROUP, "KaironMachinePool"))?;
    Some(ObjectRef::new(&r.name).within(&mp.namespace()?))
}

/// What the pool's caches keep of a CAPI Machine: the pool label, CAPI's mark, deletion and
/// the conditions the plan reads.
fn keep_what_is_read_of_pool_machine(m: &mut capi::Machine) {
    let meta = &mut m.metadata;
    meta.managed_fields = None;
    meta.finalizers = None;
    meta.owner_references = None;
    capi::retain_keys(&mut meta.labels, &[POOL_NAME_LABEL, capi::CLUSTER_NAME_LABEL]);
    capi::retain_keys(&mut meta.annotations, &[capi::DELETE_MACHINE_ANNOTATION]);
    if let Some(conds) = m.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        conds.retain(|c| [super::gather::AVAILABLE, capi::OWNER_REMEDIATED].contains(&c.type_.as_str()));
    }
}

fn reflect<K, S>(
    stream: S,
    resource: &'static str,
    telemetry: &Telemetry,
) -> (
    Store<K>,
    Synced,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + std::fmt::Debug + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let (store, w) = reflector::store();
    let synced = Synced::of(&store);
    let s = stream
        .inspect_err(watch_error(resource, telemetry))
        .default_backoff()
        .reflect(w)
        .touched_objects();
    (store, synced, s)
}

/// Builds the controller. It reads Clusters, MachinePools and KaironMachines from the shared
/// caches and watches its pools and their Machines itself.
pub(crate) fn controller(
    client: Client,
    caches: &Caches,
    settings: Settings,
    telemetry: Telemetry,
    shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) -> impl Future<Output = ()> + Send {
    let wc = settings.watcher_config();
    let (pools, w) = reflector::store();
    let pool_events = watcher(settings.api::<KaironMachinePool>(&client), wc.clone())
        .inspect_err(watch_error(
            "kaironmachinepools.infrastructure.cluster.x-k8s.io",
            &telemetry,
        ))
        .default_backoff()
        .modify(keep_read_annotations)
        .reflect(w)
        .applied_objects();
    let (machines, m_synced, m_events) = reflect(
        watcher(
            settings.api::<capi::Machine>(&client),
            wc.clone().labels(POOL_NAME_LABEL),
        )
        .map_ok(|e| e.modify(keep_what_is_read_of_pool_machine)),
        "machines.cluster.x-k8s.io",
        &telemetry,
    );
    let machine_pools = caches.machine_pools.store();
    let ctx = Arc::new(Context {
        client,
        machine_pools: machine_pools.clone(),
        clusters: caches.clusters.store(),
        kaironmachines: caches.kaironmachines.store(),
        machines,
        synced: vec![
            caches.clusters.synced(),
            caches.machine_pools.synced(),
            caches.kaironmachines.synced(),
            m_synced,
        ],
        settings: settings.clone(),
        events: telemetry.recorder("kaironmachinepool"),
        metrics: telemetry.metrics.clone(),
        broken_backoff: Default::default(),
        pending: Default::default(),
        published: Default::default(),
    });
    telemetry.caches.register(&ctx.synced[3]);
    let pools_by_cluster = pools.clone();
    let by_cluster = move |c: Arc<capi::Cluster>| {
        let ns = c.namespace();
        let name = c.name_any();
        pools_by_cluster
            .state()
            .into_iter()
            .filter(|p| {
                p.namespace() == ns && capi::label(&p.metadata, capi::CLUSTER_NAME_LABEL) == Some(name.as_str())
            })
            .map(|p| ObjectRef::from(p.as_ref()))
            .collect::<Vec<_>>()
    };
    let (for_kms, for_machines) = (machine_pools.clone(), machine_pools);
    let owned = pools.clone();
    // A MachinePool's change reaches the pool it names and every pool it owns: one it was
    // repointed away from learns that it is no longer named.
    let by_machine_pool = move |mp: Arc<MachinePool>| {
        let uid = mp.metadata.uid.clone();
        let mut refs: Vec<ObjectRef<KaironMachinePool>> = owned
            .state()
            .into_iter()
            .filter(|p| p.namespace() == mp.namespace())
            .filter(|p| capi::owner(&p.metadata, "MachinePool").is_some_and(|o| Some(&o.uid) == uid.as_ref()))
            .map(|p| ObjectRef::from(p.as_ref()))
            .collect();
        refs.extend(pool_of_machine_pool(&mp));
        refs
    };
    let backoff = Backoff::new(pools.clone());
    Controller::for_stream(pool_events, pools)
        .with_config(ControllerConfig::default().concurrency(settings.pool_concurrency))
        .watches_shared_stream(caches.machine_pools.touched(), by_machine_pool)
        .watches_shared_stream(caches.kaironmachines.touched(), move |km: Arc<KaironMachine>| {
            pool_of_member(&for_kms, km.as_ref())
        })
        .watches_stream(m_events, move |m: capi::Machine| pool_of_member(&for_machines, &m))
        .watches_shared_stream(caches.clusters.touched_when(cluster_trigger), by_cluster)
        .graceful_shutdown_on(shutdown)
        .run(
            instrumented("kaironmachinepool", telemetry.metrics, backoff.clone(), reconcile),
            error_policy(backoff),
            ctx,
        )
        .for_each(log_outcome)
}
