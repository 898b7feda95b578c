//! What a KaironMachinePool reconcile is triggered by: its own changes, its MachinePool's
//! (replicas, bootstrap data, version), its Cluster's (pause, provisioning), its Kairon
//! MachineSet's and members', its KaironMachines' and the Machines CAPI made for them; and
//! the caches those watches fill.

use std::sync::Arc;

use futures::{Future, Stream, StreamExt, TryStreamExt};
use kube::runtime::controller::Config as ControllerConfig;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use super::context::Context;
use super::reconcile::reconcile;
use crate::api::{self, KaironMachine, KaironMachinePool};
use crate::capi::{self, MachinePool, POOL_NAME_LABEL};
use crate::controller::caches::Caches;
use crate::controller::runtime::{
    Backoff, Synced, Telemetry, error_policy, instrumented, keep_read_annotations, log_outcome, strip_managed_fields,
    watch_error,
};
use crate::controller::settings::{Settings, initial_lists};
use crate::kairon::labels::{KAIRONMACHINEPOOL_NAME, KAIRONMACHINEPOOL_NAMESPACE};
use crate::kairon::machineset::{MACHINESET_LABEL, MachineSet};
use crate::kairon::{self, Instances, keep_set_what_is_read, labels, read_set};

/// The pool a KaironMachinePool-labelled object (a set, a member) names.
fn pool_of_labels<K: Resource>(obj: &K) -> Option<ObjectRef<KaironMachinePool>> {
    let l = obj.meta().labels.as_ref()?;
    let name = l.get(KAIRONMACHINEPOOL_NAME)?;
    let ns = l
        .get(KAIRONMACHINEPOOL_NAMESPACE)
        .cloned()
        .or_else(|| obj.meta().namespace.clone())?;
    Some(ObjectRef::new(name).within(&ns))
}

/// A watch event of untyped Kairon MachineSets, read as [`read_set`] does.
fn read_set_event(e: watcher::Event<kube::api::DynamicObject>) -> watcher::Event<MachineSet> {
    use watcher::Event;
    match e {
        Event::Apply(o) => Event::Apply(read_set(o)),
        Event::Delete(o) => Event::Delete(read_set(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(read_set(o)),
        Event::InitDone => Event::InitDone,
    }
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

/// Builds the controller. It reads Clusters from the shared cache and watches the rest itself.
pub(crate) fn controller(
    client: Client,
    kairon: Instances,
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

    let (machine_pools, mp_synced, mp_events) = reflect(
        watcher(settings.api::<MachinePool>(&client), wc.clone()).map_ok(|e| e.modify(strip_managed_fields)),
        "machinepools.cluster.x-k8s.io",
        &telemetry,
    );
    let (kaironmachines, km_synced, km_events) = reflect(
        watcher(
            settings.api::<KaironMachine>(&client),
            wc.clone().labels(KAIRONMACHINEPOOL_NAME),
        )
        .map_ok(|e| e.modify(keep_read_annotations)),
        "kaironmachines.infrastructure.cluster.x-k8s.io",
        &telemetry,
    );
    let (machines, m_synced, m_events) = reflect(
        watcher(
            settings.api::<capi::Machine>(&client),
            wc.clone().labels(POOL_NAME_LABEL),
        )
        .map_ok(|e| e.modify(keep_what_is_read_of_pool_machine)),
        "machines.cluster.x-k8s.io",
        &telemetry,
    );
    let kairon_wc = initial_lists(settings.kairon_streaming_lists);
    let sets_api = kairon.machine_sets().api(settings.namespace.as_deref());
    let (sets, sets_synced, set_events) = reflect(
        watcher(sets_api, kairon_wc.clone().labels(&labels::managed_selector()))
            .map_ok(|e| read_set_event(e).modify(keep_set_what_is_read)),
        "machinesets.kairon.zyvor.dev",
        &telemetry,
    );
    let (members, members_synced, member_events) = reflect(
        watcher(
            kairon.api(settings.namespace.as_deref()),
            kairon_wc.labels(MACHINESET_LABEL),
        )
        .map_ok(|e| kairon::read_event(e).modify(kairon::keep_what_is_read)),
        "machines.kairon.zyvor.dev",
        &telemetry,
    );

    let clusters = caches.clusters.store();
    let ctx = Arc::new(Context {
        client,
        kairon,
        machine_pools,
        clusters,
        kaironclusters: caches.kaironclusters.store(),
        sets,
        members,
        kaironmachines: kaironmachines.clone(),
        machines,
        synced: vec![
            caches.clusters.synced(),
            caches.kaironclusters.synced(),
            mp_synced,
            km_synced,
            m_synced,
            sets_synced,
            members_synced,
        ],
        settings: settings.clone(),
        events: telemetry.recorder("kaironmachinepool"),
        metrics: telemetry.metrics.clone(),
        broken_backoff: Default::default(),
    });
    for s in &ctx.synced {
        telemetry.caches.register(s);
    }
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
    let kms_for_machines = kaironmachines;
    let by_machine = move |m: capi::Machine| {
        let ns = m.namespace()?;
        let km = kms_for_machines.get(&ObjectRef::new(&m.name_any()).within(&ns))?;
        pool_of_labels(km.as_ref())
    };
    let backoff = Backoff::new(pools.clone());
    Controller::for_stream(pool_events, pools)
        .with_config(ControllerConfig::default().concurrency(settings.pool_concurrency))
        .watches_stream(mp_events, |mp| pool_of_machine_pool(&mp))
        .watches_stream(km_events, |km| pool_of_labels(&km))
        .watches_stream(m_events, by_machine)
        .watches_stream(set_events, |set: MachineSet| pool_of_labels(&set))
        .watches_stream(member_events, |vm: kairon::Machine| pool_of_labels(&vm))
        .watches_shared_stream(caches.clusters.touched_when(cluster_trigger), by_cluster)
        .graceful_shutdown_on(shutdown)
        .run(
            instrumented("kaironmachinepool", telemetry.metrics, backoff.clone(), reconcile),
            error_policy(backoff),
            ctx,
        )
        .for_each(log_outcome)
}
