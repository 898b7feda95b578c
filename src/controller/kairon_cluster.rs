//! The KaironCluster reconciler.
//!
//! Kairon has no load balancer to create, so provisioning means: the control-plane endpoint is
//! known (on the KaironCluster, or set on the Cluster by someone else) and the failure domains
//! are published. Deletion waits until no KaironMachine of the cluster is left, so that CAPI,
//! which deletes the infrastructure cluster last, really finds everything gone.

use std::sync::Arc;
use std::time::Duration;

use futures::{Future, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, PredicateConfig, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tracing::{debug, info};

use super::write::{self, has_finalizer};
use super::{Error, Settings, Synced, keep_only_labels, strip_managed_fields};
use crate::api::conditions::{self, Decided, READY, Status, reason};
use crate::api::{
    CLUSTER_FINALIZER, FailureDomainStatus, Initialization, KaironCluster, KaironClusterStatus, KaironMachine,
};
use crate::capi;
use crate::events::{Events, reason as event};
use crate::telemetry::{Telemetry, instrumented};

/// How often to look again while waiting for KaironMachines to go, on top of their watch.
const DELETE_RETRY: Duration = Duration::from_secs(30);

pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub clusters: Store<capi::Cluster>,
    /// Metadata of all KaironMachines: enough to know which clusters still have machines.
    pub members: Store<PartialObjectMeta<KaironMachine>>,
    /// First lists of `clusters` and `members`.
    pub synced: Vec<Synced>,
    /// Events on KaironClusters (disabled in mock tests).
    pub events: Events,
}

impl Context {
    async fn wait_for_caches(&self) -> Result<(), Error> {
        Synced::all(&self.synced).await
    }

    /// KaironMachines of `cluster` in `ns`.
    fn member_count(&self, ns: &str, cluster: &str) -> usize {
        self.members
            .state()
            .iter()
            .filter(|m| {
                m.namespace().as_deref() == Some(ns)
                    && capi::label(&m.metadata, capi::CLUSTER_NAME_LABEL) == Some(cluster)
            })
            .count()
    }
}

/// What this reconcile decided about the KaironCluster.
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    /// Endpoint known: provisioned.
    Provisioned,
    /// Waiting for a control-plane endpoint.
    WaitingForEndpoint,
    /// Being deleted while `n` KaironMachines remain.
    Deleting { machines: usize },
}

/// The status a KaironCluster should have. Pure.
pub fn next_status(
    kc: &KaironCluster,
    observed: Option<&Observed>,
    paused: Option<&str>,
    now: &Time,
) -> KaironClusterStatus {
    let generation = kc.metadata.generation;
    let mut status = kc.status.clone().unwrap_or_default();
    let mut conds = status.conditions.take().unwrap_or_default();
    conditions::set(&mut conds, conditions::paused(paused), generation, now);

    let ready = match observed {
        None => None,
        Some(Observed::Provisioned) => {
            // Failure domains go out together with provisioned=true, as the contract asks.
            status.failure_domains = failure_domains(kc);
            status.initialization = Some(Initialization {
                provisioned: Some(true),
            });
            Some(Decided::new(READY, Status::True, reason::READY, ""))
        }
        Some(Observed::WaitingForEndpoint) => Some(Decided::new(
            READY,
            Status::False,
            reason::WAITING_FOR_CONTROL_PLANE_ENDPOINT,
            "waiting for a control plane endpoint: set spec.controlPlaneEndpoint here or on the Cluster",
        )),
        Some(Observed::Deleting { machines }) => Some(Decided::new(
            READY,
            Status::False,
            if *machines > 0 {
                reason::WAITING_FOR_MACHINES_DELETION
            } else {
                reason::DELETING
            },
            format!("KaironCluster is being deleted; {machines} KaironMachine(s) of the cluster remain"),
        )),
    };
    if let Some(ready) = ready {
        conditions::set(&mut conds, ready, generation, now);
    }
    status.conditions = Some(conds);
    status
}

/// Failure domains in the v1beta2 list form, sorted by name.
pub fn failure_domains(kc: &KaironCluster) -> Option<Vec<FailureDomainStatus>> {
    let mut fds: Vec<_> = kc
        .spec
        .failure_domains
        .iter()
        .flatten()
        .map(|fd| FailureDomainStatus {
            name: fd.name.clone(),
            control_plane: fd.control_plane,
            attributes: fd.node_selector.clone().filter(|s| !s.is_empty()),
        })
        .collect();
    fds.sort_by(|a, b| a.name.cmp(&b.name));
    (!fds.is_empty()).then_some(fds)
}

/// Reconciles one KaironCluster.
pub async fn reconcile(kc: Arc<KaironCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.wait_for_caches().await?;
    // Somebody else owns this infrastructure: neither spec nor status is ours to touch.
    if capi::is_externally_managed(&kc.metadata) {
        debug!("externally managed; skipping");
        return Ok(Action::await_change());
    }
    let ns = kc.namespace().ok_or(Error::MissingNamespace)?;
    let api: Api<KaironCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let owner = capi::owner(&kc.metadata, "Cluster").map(|o| o.name.clone());
    let cluster_name = owner
        .clone()
        .or_else(|| capi::label(&kc.metadata, capi::CLUSTER_NAME_LABEL).map(str::to_string));
    let cluster = cluster_name
        .as_ref()
        .and_then(|c| ctx.clusters.get(&ObjectRef::new(c).within(&ns)));

    if let Some(why) = capi::paused_reason(cluster.as_deref(), &kc.metadata) {
        // Written once; see the KaironMachine reconciler.
        if !conditions::says(
            kc.status.as_ref().and_then(|s| s.conditions.as_deref()),
            &conditions::paused(Some(why)),
        ) {
            write_status(&api, &kc, None, Some(why)).await?;
        }
        return Ok(Action::await_change());
    }
    if kc.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(kc.as_ref(), CLUSTER_FINALIZER) {
            return Ok(Action::await_change());
        }
        let machines = cluster_name.as_deref().map_or(0, |c| ctx.member_count(&ns, c));
        if machines == 0 {
            info!("no KaironMachine left; releasing the finalizer");
            write::remove_finalizer(&api, kc.as_ref(), CLUSTER_FINALIZER)
                .await
                .map_err(Error::write("finalizer"))?;
            return Ok(Action::await_change());
        }
        write_status(&api, &kc, Some(&Observed::Deleting { machines }), None).await?;
        return Ok(Action::requeue(DELETE_RETRY));
    }
    // Until CAPI sets the Cluster as owner, nothing is done.
    let Some(cluster) = owner.and(cluster) else {
        debug!("waiting for an owner Cluster");
        return Ok(Action::await_change());
    };
    if !has_finalizer(kc.as_ref(), CLUSTER_FINALIZER) {
        write::add_finalizer(&api, kc.as_ref(), CLUSTER_FINALIZER)
            .await
            .map_err(Error::write("finalizer"))?;
    }
    let endpoint_known = kc.spec.control_plane_endpoint.as_ref().is_some_and(|e| e.is_valid())
        || cluster
            .spec
            .control_plane_endpoint
            .as_ref()
            .is_some_and(|e| e.is_valid());
    let observed = if endpoint_known || kc.status.as_ref().is_some_and(|s| s.is_provisioned()) {
        Observed::Provisioned
    } else {
        Observed::WaitingForEndpoint
    };
    if let Some(next) = write_status(&api, &kc, Some(&observed), None).await?
        && next.is_provisioned()
        && !kc.status.as_ref().is_some_and(KaironClusterStatus::is_provisioned)
    {
        ctx.events
            .normal(
                kc.as_ref(),
                event::CLUSTER_PROVISIONED,
                "Provision",
                "control plane endpoint and failure domains published".into(),
            )
            .await;
    }
    Ok(Action::requeue(ctx.settings.sync_period))
}

async fn write_status(
    api: &Api<KaironCluster>,
    kc: &KaironCluster,
    observed: Option<&Observed>,
    paused: Option<&str>,
) -> Result<Option<KaironClusterStatus>, Error> {
    let next = next_status(kc, observed, paused, &conditions::now());
    if kc.status.as_ref() == Some(&next) {
        return Ok(None);
    }
    write::apply_status(api, &kc.name_any(), &next)
        .await
        .map_err(Error::write("status"))?;
    Ok(Some(next))
}

/// The KaironCluster of a Cluster: its `spec.infrastructureRef`.
pub fn kaironcluster_for_cluster(c: &capi::Cluster) -> Option<ObjectRef<KaironCluster>> {
    let name = c.infrastructure_name(crate::api::GROUP, "KaironCluster")?;
    Some(ObjectRef::new(name).within(&c.namespace()?))
}

/// What of a Cluster a KaironCluster reacts to: pause, the endpoint, the reference, deletion.
pub fn cluster_trigger(c: &capi::Cluster) -> Option<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    (
        c.spec.paused,
        &c.spec.control_plane_endpoint,
        &c.spec.infrastructure_ref,
        c.metadata.deletion_timestamp.is_some(),
    )
        .hash(&mut h);
    Some(h.finish())
}

/// Builds the controller; it runs until `shutdown` resolves and the future is driven.
pub fn controller(
    client: Client,
    settings: Settings,
    telemetry: Telemetry,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send {
    let wc = settings.watcher_config();
    let (clusters, w) = reflector::store();
    let cluster_events = watcher(settings.api::<capi::Cluster>(&client), wc.clone())
        .default_backoff()
        .modify(strip_managed_fields)
        .reflect(w)
        .touched_objects()
        .predicate_filter(cluster_trigger, PredicateConfig::default());
    let (members, w) = reflector::store();
    let member_events = watcher(settings.api::<PartialObjectMeta<KaironMachine>>(&client), wc.clone())
        .default_backoff()
        // Read: namespace, name and the cluster-name label.
        .modify(|m: &mut PartialObjectMeta<KaironMachine>| keep_only_labels(m, &[capi::CLUSTER_NAME_LABEL]))
        .reflect(w)
        .touched_objects();
    let (kcs, w) = reflector::store();
    let kc_events = watcher(settings.api::<KaironCluster>(&client), wc)
        .default_backoff()
        .modify(strip_managed_fields)
        .reflect(w)
        .applied_objects();

    let cluster_lookup = clusters.clone();
    let synced = vec![Synced::of(&clusters), Synced::of(&members)];
    synced.iter().for_each(|s| telemetry.caches.register(s));
    let ctx = Arc::new(Context {
        events: telemetry.events("capkr-kaironcluster-controller"),
        client,
        settings: settings.clone(),
        clusters,
        members,
        synced,
    });
    Controller::for_stream(kc_events, kcs)
        .watches_stream(cluster_events, |c| kaironcluster_for_cluster(&c))
        .watches_stream(member_events, move |m: PartialObjectMeta<KaironMachine>| {
            // A KaironMachine went or came: its cluster's KaironCluster may be waiting on it.
            let ns = m.namespace()?;
            let cluster = capi::label(&m.metadata, capi::CLUSTER_NAME_LABEL)?;
            let c = cluster_lookup.get(&ObjectRef::new(cluster).within(&ns))?;
            kaironcluster_for_cluster(&c)
        })
        .with_config(ControllerConfig::default().concurrency(settings.cluster_concurrency))
        .graceful_shutdown_on(shutdown)
        .run(
            instrumented("kaironcluster", telemetry.metrics, reconcile),
            super::error_policy,
            ctx,
        )
        .for_each(super::log_outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::PAUSED;
    use crate::api::{APIEndpoint, FailureDomainSpec, KaironClusterSpec};
    use k8s_openapi::jiff::Timestamp;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn kc() -> KaironCluster {
        KaironCluster::new(
            "c",
            KaironClusterSpec {
                control_plane_endpoint: Some(APIEndpoint {
                    host: Some("10.0.0.10".into()),
                    port: Some(6443),
                }),
                failure_domains: Some(vec![
                    FailureDomainSpec {
                        name: "zone-b".into(),
                        control_plane: None,
                        node_selector: Some([("zone".to_string(), "b".to_string())].into()),
                    },
                    FailureDomainSpec {
                        name: "zone-a".into(),
                        control_plane: Some(true),
                        node_selector: None,
                    },
                ]),
            },
        )
    }

    fn ready(s: &KaironClusterStatus) -> (String, String) {
        let c = conditions::get(s.conditions.as_deref().unwrap(), READY).unwrap();
        (c.status.clone(), c.reason.clone())
    }

    #[test]
    fn provisioned_publishes_failure_domains_with_it() {
        let s = next_status(&kc(), Some(&Observed::Provisioned), None, &at(1));
        assert!(s.is_provisioned());
        let fds = s.failure_domains.clone().unwrap();
        assert_eq!(
            fds.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            ["zone-a", "zone-b"],
            "sorted by name"
        );
        assert_eq!(fds[0].control_plane, Some(true));
        assert_eq!(fds[1].attributes.as_ref().unwrap()["zone"], "b");
        assert_eq!(ready(&s), ("True".into(), "Ready".into()));
    }

    #[test]
    fn cluster_status_table() {
        let cases = [
            (
                Observed::WaitingForEndpoint,
                ("False", reason::WAITING_FOR_CONTROL_PLANE_ENDPOINT),
                false,
            ),
            (Observed::Provisioned, ("True", reason::READY), true),
            (
                Observed::Deleting { machines: 2 },
                ("False", reason::WAITING_FOR_MACHINES_DELETION),
                false,
            ),
            (Observed::Deleting { machines: 0 }, ("False", reason::DELETING), false),
        ];
        for (observed, want, provisioned) in cases {
            let s = next_status(&kc(), Some(&observed), None, &at(1));
            assert_eq!(ready(&s), (want.0.to_string(), want.1.to_string()), "{observed:?}");
            assert_eq!(s.is_provisioned(), provisioned, "{observed:?}");
        }
    }

    #[test]
    fn steady_state_is_a_fixed_point() {
        let mut k = kc();
        k.status = Some(next_status(&k, Some(&Observed::Provisioned), None, &at(1)));
        assert_eq!(
            next_status(&k, Some(&Observed::Provisioned), None, &at(99)),
            k.status.clone().unwrap()
        );
    }

    #[test]
    fn paused_sets_only_paused() {
        let mut k = kc();
        k.status = Some(next_status(&k, Some(&Observed::Provisioned), None, &at(1)));
        let s = next_status(&k, None, Some("Cluster spec.paused is set to true"), &at(5));
        let p = conditions::get(s.conditions.as_deref().unwrap(), PAUSED).unwrap();
        assert_eq!((p.status.as_str(), p.reason.as_str()), ("True", "Paused"));
        assert_eq!(ready(&s), ("True".into(), "Ready".into()));
    }
}
