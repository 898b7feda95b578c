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
use crate::controller::changed::changed_objects;
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

/// What of a member's KaironMachine a pool reads (see `context::kaironmachines_of`,
/// `gather::instances`, `publish`): which pool and cluster it is of, its revision, its deletion,
/// why it is not Ready, its providerID and whether it is provisioned. Its other writes (each
/// member's status several times while it comes up) do not wake the pool, which reconciles
/// every member each time. A KaironMachine of no pool has none: nothing is kept of it, and
/// it wakes no pool.
pub(crate) fn member_trigger(km: &KaironMachine) -> Option<u64> {
    let meta = &km.metadata;
    capi::label(meta, POOL_NAME_LABEL)?;
    let not_ready = km.status.as_ref().and_then(|s| {
        crate::api::conditions::get(
            s.conditions.as_deref().unwrap_or_default(),
            crate::api::conditions::READY,
        )
        .filter(|c| c.status == "False")
        .map(|c| c.reason.as_str())
    });
    Some(crate::hashing::hash_of(&(
        capi::label(meta, POOL_NAME_LABEL),
        capi::label(meta, capi::CLUSTER_NAME_LABEL),
        capi::label(meta, super::revision::REVISION_LABEL),
        meta.deletion_timestamp.is_some(),
        not_ready,
        &km.spec.provider_id,
        km.status.as_ref().is_some_and(|s| s.is_provisioned()),
    )))
}

/// What of a member's Machine a pool reads (see `gather::instances`), of what its cache keeps:
/// its pool and cluster labels, CAPI's delete mark, its deletion and creation, and the status
/// of the conditions the plan reads. CAPI writes a Machine many times as it comes up; only
/// these changes wake the pool.
pub(crate) fn pool_machine_trigger(m: &capi::Machine) -> Option<u64> {
    let meta = &m.metadata;
    Some(crate::hashing::hash_of(&(
        capi::label(meta, POOL_NAME_LABEL),
        capi::label(meta, capi::CLUSTER_NAME_LABEL),
        capi::has_annotation(meta, capi::DELETE_MACHINE_ANNOTATION),
        m.is_deleting(),
        meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        m.condition(super::gather::AVAILABLE),
        m.condition(capi::OWNER_REMEDIATED),
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
    trigger: fn(&K) -> Option<u64>,
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
    let s = changed_objects(
        stream
            .inspect_err(watch_error(resource, telemetry))
            .default_backoff()
            .reflect(w),
        trigger,
    );
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
        pool_machine_trigger,
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
        .watches_shared_stream(
            caches.kaironmachines.touched_when(member_trigger),
            move |km: Arc<KaironMachine>| pool_of_member(&for_kms, km.as_ref()),
        )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::{self, Decided, READY, Status, reason};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn member() -> KaironMachine {
        let mut km = KaironMachine::new("m", Default::default());
        km.metadata.labels = Some(
            [
                (POOL_NAME_LABEL.to_string(), "mp".to_string()),
                (capi::CLUSTER_NAME_LABEL.to_string(), "c".to_string()),
                (super::super::revision::REVISION_LABEL.to_string(), "r1".to_string()),
            ]
            .into(),
        );
        km
    }

    fn with_ready(mut km: KaironMachine, status: Status, why: &'static str, at: i64) -> KaironMachine {
        let mut conds = km
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        conditions::set(
            &mut conds,
            Decided::new(READY, status, why, "message"),
            None,
            &Time(Timestamp::from_second(at).unwrap()),
        );
        km.status.get_or_insert_with(Default::default).conditions = Some(conds);
        km
    }

    #[test]
    fn a_member_wakes_its_pool_only_for_what_the_pool_reads() {
        let base = with_ready(member(), Status::False, reason::INSTANCE_PROVISIONING, 1);
        let t = |km: &KaironMachine| member_trigger(km).expect("a member has a trigger");
        let mut addresses = base.clone();
        addresses.status.as_mut().unwrap().addresses = Some(vec![]);
        let mut message = base.clone();
        message.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].message = "other".into();
        for (what, km) in [
            ("its addresses", addresses),
            ("a Ready message", message),
            ("a resourceVersion", {
                let mut k = base.clone();
                k.metadata.resource_version = Some("9".into());
                k
            }),
        ] {
            assert_eq!(t(&km), t(&base), "{what} does not wake the pool");
        }
        let mut provider_id = base.clone();
        provider_id.spec.provider_id = Some("kairon://u".into());
        let mut provisioned = base.clone();
        provisioned.status.as_mut().unwrap().initialization = Some(Default::default());
        provisioned
            .status
            .as_mut()
            .unwrap()
            .initialization
            .as_mut()
            .unwrap()
            .provisioned = Some(true);
        let mut deleting = base.clone();
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let mut revision = base.clone();
        revision
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(super::super::revision::REVISION_LABEL.into(), "r2".into());
        for (what, km) in [
            ("its providerID", provider_id),
            ("provisioned", provisioned),
            ("its deletion", deleting),
            ("its revision", revision),
            (
                "why it is not Ready",
                with_ready(base.clone(), Status::False, reason::INSTANCE_NOT_FOUND, 2),
            ),
            ("Ready", with_ready(base.clone(), Status::True, "Ready", 2)),
        ] {
            assert_ne!(t(&km), t(&base), "{what} wakes the pool");
        }
        assert_eq!(
            member_trigger(&KaironMachine::new("lone", Default::default())),
            None,
            "no pool"
        );
    }

    #[test]
    fn a_pool_machine_wakes_its_pool_only_for_what_the_plan_reads() {
        let machine = |available: &str, at: &str, extra: serde_json::Value| -> capi::Machine {
            let mut m: capi::Machine = serde_json::from_value(json!({
                "metadata": {"name": "m", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z",
                    "labels": {POOL_NAME_LABEL: "mp", capi::CLUSTER_NAME_LABEL: "c"}},
                "spec": {"clusterName": "c"},
                "status": {"conditions": [{"type": "Available", "status": available, "reason": "R",
                    "lastTransitionTime": at}]}
            }))
            .unwrap();
            if let Some(ann) = extra.as_object() {
                m.metadata.annotations = Some(
                    ann.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap().into()))
                        .collect(),
                );
            }
            m
        };
        let t = |m: &capi::Machine| pool_machine_trigger(m).unwrap();
        let base = machine("False", "2026-01-01T00:00:00Z", json!(null));
        assert_eq!(
            t(&machine("False", "2026-01-01T00:01:00Z", json!(null))),
            t(&base),
            "a transition time"
        );
        assert_ne!(
            t(&machine("True", "2026-01-01T00:00:00Z", json!(null))),
            t(&base),
            "Available"
        );
        assert_ne!(
            t(&machine(
                "False",
                "2026-01-01T00:00:00Z",
                json!({capi::DELETE_MACHINE_ANNOTATION: ""})
            )),
            t(&base),
            "CAPI's delete mark"
        );
    }
}
