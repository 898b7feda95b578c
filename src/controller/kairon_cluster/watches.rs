//! What a KaironCluster reconcile is triggered by: its own changes, its Cluster's, its
//! machines' deletions and Kairon API failures, its identity's endpoint cut off; and the sweep
//! of deleted externally managed KaironClusters' budgets.

use std::sync::Arc;

use futures::{Future, StreamExt};
use kube::runtime::Controller;
use kube::runtime::controller::Config as ControllerConfig;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};

use super::external::forget_external;
use super::{Context, reconcile};
use crate::api::conditions::{self, READY, reason};
use crate::api::{KaironCluster, KaironMachine};
use crate::capi;
use crate::controller::caches::Caches;
use crate::controller::endpoints::Endpoints;
use crate::controller::runtime::{Backoff, Telemetry, error_policy, instrumented, log_outcome};
use crate::controller::settings::Settings;
use crate::controller::tenant_share::TenantShares;
use crate::hashing::hash_of;
use crate::kairon::Instances;

/// The KaironCluster of a Cluster: its `spec.infrastructureRef`.
pub(crate) fn kaironcluster_for_cluster(c: &capi::Cluster) -> Option<ObjectRef<KaironCluster>> {
    let name = c.infrastructure_name(crate::api::GROUP, "KaironCluster")?;
    Some(ObjectRef::new(name).within(&c.namespace()?))
}

/// What of a Cluster a KaironCluster reacts to: pause, the endpoint, the reference, deletion.
pub(crate) fn cluster_trigger(c: &capi::Cluster) -> Option<u64> {
    Some(hash_of(&(
        c.spec.paused,
        &c.spec.control_plane_endpoint,
        &c.spec.infrastructure_ref,
        c.metadata.deletion_timestamp.is_some(),
        // What the cluster's disruption budgets follow: workers added or removed (a pool came
        // or went).
        c.status
            .as_ref()
            .map(|s| s.workers.as_ref().map(|w| w.desired_replicas)),
    )))
}

/// The KaironCluster of `m`'s cluster, through the Cluster in `clusters`.
fn kaironcluster_of(clusters: &Store<capi::Cluster>, m: &KaironMachine) -> Option<ObjectRef<KaironCluster>> {
    let ns = m.namespace()?;
    let cluster = capi::label(&m.metadata, capi::CLUSTER_NAME_LABEL)?;
    let c = clusters.get(&ObjectRef::new(cluster).within(&ns))?;
    kaironcluster_for_cluster(&c)
}

/// The Kairon APIs of identities, as the KaironCluster controller follows them.
pub(crate) struct Remote {
    pub endpoints: Arc<Endpoints>,
    /// KaironClusters whose identity's endpoint was cut off: they say so at once.
    pub cut_off: futures::stream::BoxStream<'static, ObjectRef<KaironCluster>>,
}

/// Whether a KaironMachine's change is one its KaironCluster reconciles on: it is being deleted
/// (the KaironCluster's deletion waits for its machines), or it says the Kairon API of its
/// identity cannot be used (the KaironCluster's Ready says so). Nothing else of a machine
/// changes what the KaironCluster decides, and a reconcile per machine event would cost a list
/// of the cluster's budgets each.
fn concerns_its_cluster(km: &KaironMachine) -> bool {
    let api_problem = km
        .status
        .as_ref()
        .and_then(|s| conditions::get(s.conditions.as_deref().unwrap_or_default(), READY))
        .is_some_and(|c| {
            [
                reason::KAIRON_API_UNAVAILABLE,
                reason::KAIRON_API_NOT_ANSWERING,
                reason::KAIRON_API_SERVER_NOT_ALLOWED,
            ]
            .contains(&c.reason.as_str())
        });
    km.metadata.deletion_timestamp.is_some() || api_problem
}

/// Builds the controller; it runs until `shutdown` resolves and the future is driven. It
/// reads Clusters, KaironClusters and KaironMachines from the shared `caches` (whose watches
/// are driven elsewhere).
pub(crate) fn controller(
    client: Client,
    kairon: Instances,
    remote: Option<Remote>,
    caches: &Caches,
    settings: Settings,
    telemetry: Telemetry,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send {
    let (endpoints, cut_off) = match remote {
        Some(r) => (Some(r.endpoints), r.cut_off),
        None => (None, futures::stream::empty().boxed()),
    };
    let clusters = caches.clusters.store();
    let cluster_lookup = clusters.clone();
    let synced = vec![caches.clusters.synced(), caches.kaironmachines.synced()];
    let ctx = Arc::new(Context {
        events: telemetry.recorder("capkr-kaironcluster-controller"),
        client,
        endpoints,
        settings: settings.clone(),
        clusters,
        members: caches.kaironmachines.store(),
        synced,
        kairon: Some(kairon),
        shares: TenantShares::new(settings.cluster_concurrency),
    });
    let backoff = Backoff::new(caches.kaironclusters.store());
    let sweeper = ctx.clone();
    let forgotten = caches
        .kaironclusters
        .deleted()
        .for_each_concurrent(4, move |kc| forget_external(kc, sweeper.clone()));
    let controller = Controller::for_shared_stream(caches.kaironclusters.applied(), caches.kaironclusters.store())
        .watches_shared_stream(caches.clusters.touched_when(cluster_trigger), |c| {
            kaironcluster_for_cluster(&c)
        })
        .watches_shared_stream(
            caches
                .kaironmachines
                .touched()
                .filter(|m| futures::future::ready(concerns_its_cluster(m))),
            move |m: Arc<KaironMachine>| kaironcluster_of(&cluster_lookup, &m),
        )
        .reconcile_on(cut_off)
        .with_config(ControllerConfig::default().concurrency(settings.cluster_concurrency))
        .graceful_shutdown_on(shutdown)
        .run(
            instrumented("kaironcluster", telemetry.metrics, backoff.clone(), reconcile),
            error_policy(backoff),
            ctx,
        )
        .for_each(log_outcome);
    // The sweep of deleted clusters' budgets ends with the controller.
    async move {
        futures::pin_mut!(controller, forgotten);
        futures::future::select(controller, forgotten).await;
    }
}
