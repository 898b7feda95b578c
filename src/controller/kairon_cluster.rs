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
use kube::api::Api;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tracing::{debug, info};

use super::budgets;
use super::caches::Caches;
use super::endpoints::Endpoints;
use super::error::Error;
use super::identity_protection;
use super::runtime::Synced;
use super::runtime::{Backoff, Telemetry, error_policy, instrumented, log_outcome, owning_cluster, pause_step};
use super::settings::Settings;
use super::tenant_share::{TURNED_AWAY_RETRY, TenantShares};
use super::write::{Writer, has_finalizer};
use crate::api::conditions::{self, Decided, READY, Status, reason};
use crate::api::{
    CLUSTER_FINALIZER, FailureDomainStatus, Initialization, KaironCluster, KaironClusterStatus,
    KaironIdentityReference, KaironMachine,
};
use crate::capi;
use crate::events::{Events, reason as event};
use crate::hashing::hash_of;
use crate::kairon::{Budgets, Instances};

/// How often to look again while waiting for KaironMachines to go, on top of their watch.
const DELETE_RETRY: Duration = Duration::from_secs(30);
/// How often to look again at a Kairon API that cannot be used.
const ENDPOINT_RETRY: Duration = Duration::from_secs(15);

pub struct Context {
    pub client: Client,
    /// The Kairon APIs of identities; `None`: identities are not looked at (request-sequence
    /// tests).
    pub endpoints: Option<Arc<Endpoints>>,
    pub settings: Settings,
    pub clusters: Store<capi::Cluster>,
    /// All KaironMachines (the cache the KaironMachine controller reconciles from): which
    /// clusters still have machines.
    pub members: Store<KaironMachine>,
    /// First lists of `clusters` and `members`.
    pub synced: Vec<Synced>,
    /// Events on KaironClusters (disabled in mock tests).
    pub events: Events,
    /// The manager's Kairon API, where the disruption budgets of clusters without an identity
    /// are kept; `None`: no budgets are kept (request-sequence tests).
    pub kairon: Option<Instances>,
    /// The workers each tenant's clusters may hold ([`super::tenant_share`]).
    pub shares: TenantShares,
}

impl Context {
    /// The budgets client of the Kairon API the cluster's VMs are on; `None`: none is known
    /// (no Kairon client, or the identity's API cannot be used now).
    async fn budgets(&self, kc: &KaironCluster, ns: &str) -> Option<Budgets> {
        match (&kc.spec.identity_ref, &self.endpoints) {
            (Some(r), Some(endpoints)) => endpoints.endpoint(ns, r).await.ok().map(|e| e.instances.budgets()),
            (Some(_), None) => None,
            (None, _) => self.kairon.as_ref().map(Instances::budgets),
        }
    }

    /// KaironMachines of `cluster` in `ns` that CAPI will delete: those a Machine owns. One
    /// without an owner Machine is never deleted by CAPI, and must not hold the cluster's
    /// deletion up for ever (it has no VM: nothing is created before the owner is set).
    fn member_count(&self, ns: &str, cluster: &str) -> usize {
        self.members
            .state()
            .iter()
            .filter(|m| {
                m.namespace().as_deref() == Some(ns)
                    && capi::label(&m.metadata, capi::CLUSTER_NAME_LABEL) == Some(cluster)
                    && capi::owner(&m.metadata, "Machine").is_some()
            })
            .count()
    }
}

/// What this reconcile decided about the KaironCluster; the status follows from it.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Paused, for this reason: only the Paused condition changes.
    Paused(&'static str),
    /// Endpoint known: provisioned.
    Provisioned,
    /// Waiting for a control-plane endpoint.
    WaitingForEndpoint,
    /// Being deleted while `n` KaironMachines remain.
    Deleting { machines: usize },
    /// The Kairon API of the cluster's identity cannot be used: the condition reason, and why.
    KaironUnavailable { reason: &'static str, why: String },
}

/// The status a KaironCluster should have. Pure.
pub fn next_status(kc: &KaironCluster, decision: &Decision, now: &Time) -> KaironClusterStatus {
    let generation = kc.metadata.generation;
    let mut status = kc.status.clone().unwrap_or_default();
    let mut conds = status.conditions.take().unwrap_or_default();
    let paused = match decision {
        Decision::Paused(why) => Some(*why),
        _ => None,
    };
    conditions::set(&mut conds, conditions::paused(paused), generation, now);

    let ready = match decision {
        Decision::Paused(_) => None,
        Decision::Provisioned => {
            // Failure domains go out together with provisioned=true, as the contract asks.
            status.failure_domains = failure_domains(kc);
            status.initialization = Some(Initialization {
                provisioned: Some(true),
            });
            Some(Decided::new(READY, Status::True, reason::READY, ""))
        }
        Decision::WaitingForEndpoint => Some(Decided::new(
            READY,
            Status::False,
            reason::WAITING_FOR_CONTROL_PLANE_ENDPOINT,
            "waiting for a control plane endpoint: set spec.controlPlaneEndpoint here or on the Cluster",
        )),
        Decision::KaironUnavailable { reason, why } => Some(Decided::new(READY, Status::False, reason, why.clone())),
        Decision::Deleting { machines } => Some(Decided::new(
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
pub(crate) fn failure_domains(kc: &KaironCluster) -> Option<Vec<FailureDomainStatus>> {
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
    Synced::all(&ctx.synced).await?;
    let ns = kc.namespace().ok_or(Error::MissingNamespace)?;
    // A cluster on a tenant's Kairon API waits on it: at most the tenant's share of workers.
    let _place = match kc.spec.identity_ref.is_some() && ctx.endpoints.is_some() {
        true => match ctx.shares.enter(&ns) {
            Some(place) => Some(place),
            None => {
                debug!("the namespace's clusters hold their share of workers; trying again shortly");
                return Ok(Action::requeue(TURNED_AWAY_RETRY));
            }
        },
        false => None,
    };
    let writer = Writer::new(Api::namespaced(ctx.client.clone(), &ns), None);
    // Somebody else owns this infrastructure: neither spec nor status is ours to touch. A
    // finalizer we added before it was marked so would block its deletion for ever: let go.
    if capi::is_externally_managed(&kc.metadata) {
        if has_finalizer(kc.as_ref(), CLUSTER_FINALIZER) {
            info!("externally managed now; releasing our finalizer");
            writer.remove_finalizer(kc.as_ref(), CLUSTER_FINALIZER).await?;
        }
        return keep_budgets_of_external(&kc, &ns, &ctx).await;
    }
    let cluster_name = capi::cluster_name(&kc.metadata);
    let cluster = owning_cluster(&ctx.clusters, &ns, cluster_name);

    let why = capi::paused_reason(cluster.as_deref(), &kc.metadata);
    let current = kc.status.as_ref().and_then(|s| s.conditions.as_deref());
    let (w, k) = (&writer, kc.as_ref());
    if let Some(action) = pause_step(why, current, |why| async move {
        write_status(w, k, &Decision::Paused(why)).await.map(|_| ())
    })
    .await?
    {
        return Ok(action);
    }
    if kc.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(kc.as_ref(), CLUSTER_FINALIZER) {
            return Ok(Action::await_change());
        }
        let machines = cluster_name.map_or(0, |c| ctx.member_count(&ns, c));
        if machines == 0 {
            if let Some(budgets) = ctx.budgets(&kc, &ns).await {
                budgets::remove(&kc, &budgets).await?;
            }
            if let Some(r) = &kc.spec.identity_ref {
                let all = ctx.settings.api::<KaironCluster>(&ctx.client);
                let secrets = ctx.endpoints.as_ref().map(|e| e.identity_namespace());
                identity_protection::release(&ctx.client, &kc, r, all, secrets).await?;
            }
            info!("no KaironMachine left; releasing the finalizer");
            writer.remove_finalizer(kc.as_ref(), CLUSTER_FINALIZER).await?;
            return Ok(Action::await_change());
        }
        write_status(&writer, &kc, &Decision::Deleting { machines }).await?;
        return Ok(Action::requeue(DELETE_RETRY));
    }
    // Until CAPI sets the Cluster as owner, nothing is done.
    let Some(cluster) = capi::owner(&kc.metadata, "Cluster").and(cluster) else {
        debug!("waiting for an owner Cluster");
        return Ok(Action::await_change());
    };
    if !has_finalizer(kc.as_ref(), CLUSTER_FINALIZER) {
        writer.add_finalizer(kc.as_ref(), CLUSTER_FINALIZER).await?;
    }
    let endpoint_known = kc.spec.control_plane_endpoint.as_ref().is_some_and(|e| e.is_valid())
        || cluster
            .spec
            .control_plane_endpoint
            .as_ref()
            .is_some_and(|e| e.is_valid());
    let unavailable = match (&kc.spec.identity_ref, &ctx.endpoints) {
        (Some(r), Some(endpoints)) => {
            let (problem, allowed) = identity_problem(endpoints, &ns, r).await;
            if allowed {
                identity_protection::protect(&ctx.client, &ns, r, endpoints.identity_namespace()).await?;
            }
            problem
        }
        _ => None,
    };
    let decision = if let Some(p) = unavailable {
        Decision::KaironUnavailable {
            reason: p.reason,
            why: p.why,
        }
    } else if endpoint_known || kc.status.as_ref().is_some_and(|s| s.is_provisioned()) {
        Decision::Provisioned
    } else {
        Decision::WaitingForEndpoint
    };
    // The budgets first, and their condition in the same write as `provisioned`: CAPI makes no
    // Machine (so no VM) before the infrastructure is provisioned, and then every VM of the
    // cluster is born under its budget.
    let kept = match &decision {
        Decision::KaironUnavailable { .. } => None,
        _ => match ctx.budgets(&kc, &ns).await {
            Some(budgets) => Some(budgets::keep(&kc, &cluster, &budgets).await?),
            None => None,
        },
    };
    let written = write_status_with(&writer, &kc, &decision, kept.as_ref().map(budgets::Kept::condition)).await?;
    if let Some(next) = &written
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
    if matches!(decision, Decision::KaironUnavailable { .. }) {
        return Ok(Action::requeue(ENDPOINT_RETRY));
    }
    if matches!(kept, Some(budgets::Kept::Taken(_) | budgets::Kept::Forbidden(_))) {
        return Ok(Action::requeue(ENDPOINT_RETRY));
    }
    Ok(Action::requeue(ctx.settings.sync_period))
}

/// An externally managed KaironCluster: nothing of it is ours to write, but its KaironMachines
/// still make their VMs here, so the cluster's budgets are kept all the same (said by Warning
/// events, not a condition), and deleted with it: here while someone else's finalizer holds it,
/// by [`forget_external`] once it is gone.
async fn keep_budgets_of_external(kc: &KaironCluster, ns: &str, ctx: &Context) -> Result<Action, Error> {
    let cluster = owning_cluster(&ctx.clusters, ns, capi::cluster_name(&kc.metadata));
    if capi::paused_reason(cluster.as_deref(), &kc.metadata).is_some() {
        debug!("externally managed and paused; budgets left as they are");
        return Ok(Action::await_change());
    }
    let Some(budgets) = ctx.budgets(kc, ns).await else {
        return Ok(Action::await_change());
    };
    if kc.metadata.deletion_timestamp.is_some() {
        budgets::remove(kc, &budgets).await?;
        return Ok(Action::await_change());
    }
    let Some(cluster) = capi::owner(&kc.metadata, "Cluster").and(cluster) else {
        debug!("externally managed, waiting for an owner Cluster");
        return Ok(Action::await_change());
    };
    let kept = budgets::keep(kc, &cluster, &budgets).await?;
    if let budgets::Kept::Taken(_) | budgets::Kept::Forbidden(_) = &kept {
        ctx.events
            .warning(
                kc,
                event::DISRUPTION_BUDGETS_NOT_KEPT,
                "KeepBudgets",
                kept.condition().message,
            )
            .await;
        return Ok(Action::requeue(ENDPOINT_RETRY));
    }
    Ok(Action::requeue(ctx.settings.sync_period))
}

/// The budgets of an externally managed KaironCluster that was deleted (it carries no
/// finalizer of ours): deleted after it. One deleted while the manager was not watching keeps
/// its budgets, which select no VM once the cluster's are gone.
async fn forget_external(kc: Arc<KaironCluster>, ctx: Arc<Context>) {
    if !capi::is_externally_managed(&kc.metadata) {
        return;
    }
    let ns = kc.namespace().unwrap_or_default();
    if let Some(budgets) = ctx.budgets(&kc, &ns).await
        && let Err(e) = budgets::remove(&kc, &budgets).await
    {
        tracing::warn!(kaironcluster = %kc.name_any(), namespace = %ns, error = %e,
            "the budgets of a deleted externally managed KaironCluster could not be deleted");
    }
}

/// Why the Kairon API of an identity cannot be used now.
struct IdentityProblem {
    reason: &'static str,
    why: String,
}

/// How much of what is wrong with an identity's Kairon API a condition repeats.
const MAX_PROBLEM_MESSAGE: usize = 1024;

/// Why the Kairon API of identity `r` cannot be used now, if it cannot; and whether the
/// identity was seen to allow the namespace. Only then is it protected: a namespace an identity
/// does not allow must not be able to hold it with a finalizer, and an identity that could not
/// be read (a transient error) has not said yes.
async fn identity_problem(
    endpoints: &Endpoints,
    ns: &str,
    r: &KaironIdentityReference,
) -> (Option<IdentityProblem>, bool) {
    let (problem, allowed) = match endpoints.endpoint(ns, r).await {
        Err(e) => (Some((e.reason(), e.to_string())), e.identity_allowed()),
        Ok(endpoint) => (
            endpoint
                .ready()
                .await
                .err()
                .map(|why| (reason::KAIRON_API_UNAVAILABLE, why)),
            true,
        ),
    };
    let problem = problem.map(|(reason, why)| IdentityProblem {
        reason,
        why: crate::text::bounded(
            &format!("the Kairon API of identity {} {}: {why}", r.kind, r.name),
            MAX_PROBLEM_MESSAGE,
        ),
    });
    (problem, allowed)
}

/// Writes the status that follows from `decision`, if it differs; returns what it wrote.
async fn write_status(
    writer: &Writer<'_, KaironCluster>,
    kc: &KaironCluster,
    decision: &Decision,
) -> Result<Option<KaironClusterStatus>, Error> {
    write_status_with(writer, kc, decision, None).await
}

/// [`write_status`], with the `DisruptionBudgetsReady` condition `budgets` set in the same
/// write.
async fn write_status_with(
    writer: &Writer<'_, KaironCluster>,
    kc: &KaironCluster,
    decision: &Decision,
    budgets: Option<Decided>,
) -> Result<Option<KaironClusterStatus>, Error> {
    let now = conditions::now();
    let mut next = next_status(kc, decision, &now);
    if let Some(condition) = budgets {
        let mut conds = next.conditions.take().unwrap_or_default();
        conditions::set(&mut conds, condition, kc.metadata.generation, &now);
        next.conditions = Some(conds);
    }
    let wrote = writer.apply_status(kc, kc.status.as_ref(), &next).await?;
    Ok(wrote.then_some(next))
}

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
                identity_ref: None,
            },
        )
    }

    fn ready(s: &KaironClusterStatus) -> (String, String) {
        let c = conditions::get(s.conditions.as_deref().unwrap(), READY).unwrap();
        (c.status.clone(), c.reason.clone())
    }

    #[test]
    fn provisioned_publishes_failure_domains_with_it() {
        let s = next_status(&kc(), &Decision::Provisioned, &at(1));
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
                Decision::WaitingForEndpoint,
                ("False", reason::WAITING_FOR_CONTROL_PLANE_ENDPOINT),
                false,
            ),
            (Decision::Provisioned, ("True", reason::READY), true),
            (
                Decision::Deleting { machines: 2 },
                ("False", reason::WAITING_FOR_MACHINES_DELETION),
                false,
            ),
            (Decision::Deleting { machines: 0 }, ("False", reason::DELETING), false),
            (
                Decision::KaironUnavailable {
                    reason: reason::KAIRON_API_UNAVAILABLE,
                    why: "down".into(),
                },
                ("False", reason::KAIRON_API_UNAVAILABLE),
                false,
            ),
            (
                Decision::KaironUnavailable {
                    reason: reason::KAIRON_API_SERVER_NOT_ALLOWED,
                    why: "server 10.9.9.9 is not allowed".into(),
                },
                ("False", reason::KAIRON_API_SERVER_NOT_ALLOWED),
                false,
            ),
        ];
        for (decision, want, provisioned) in cases {
            let s = next_status(&kc(), &decision, &at(1));
            assert_eq!(ready(&s), (want.0.to_string(), want.1.to_string()), "{decision:?}");
            assert_eq!(s.is_provisioned(), provisioned, "{decision:?}");
        }
    }

    #[test]
    fn steady_state_is_a_fixed_point() {
        let mut k = kc();
        k.status = Some(next_status(&k, &Decision::Provisioned, &at(1)));
        assert_eq!(
            next_status(&k, &Decision::Provisioned, &at(99)),
            k.status.clone().unwrap()
        );
    }

    #[test]
    fn paused_sets_only_paused() {
        let mut k = kc();
        k.status = Some(next_status(&k, &Decision::Provisioned, &at(1)));
        let s = next_status(&k, &Decision::Paused("Cluster spec.paused is set to true"), &at(5));
        let p = conditions::get(s.conditions.as_deref().unwrap(), PAUSED).unwrap();
        assert_eq!((p.status.as_str(), p.reason.as_str()), ("True", "Paused"));
        assert_eq!(ready(&s), ("True".into(), "Ready".into()));
    }
}
