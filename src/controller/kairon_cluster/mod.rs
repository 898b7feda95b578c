//! The KaironCluster reconciler.
//!
//! Kairon has no load balancer to create, so provisioning means: the control-plane endpoint is
//! known (on the KaironCluster, or set on the Cluster by someone else) and the failure domains
//! are published. Deletion waits until no KaironMachine of the cluster is left, so that CAPI,
//! which deletes the infrastructure cluster last, really finds everything gone.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use tracing::{debug, info};

use super::budgets;
use super::endpoints::Endpoints;
use super::endpoints::protection;
use super::error::Error;
use super::runtime::Synced;
use super::runtime::{owning_cluster, pause_step};
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
    /// A context for the request-sequence tests: every request goes to `client`, no
    /// identities and no budgets, every cache empty and synced, events off. Its fields are
    /// public: a test fills the caches it needs.
    #[doc(hidden)]
    pub fn for_request_tests(client: Client) -> Self {
        Context {
            client,
            endpoints: None,
            settings: Settings::default(),
            clusters: kube::runtime::reflector::store().0,
            members: kube::runtime::reflector::store().0,
            synced: vec![Synced::ready()],
            events: Events::disabled(),
            kairon: None,
            shares: TenantShares::new(10),
        }
    }

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
                protection::release(&ctx.client, &kc, r, all, secrets).await?;
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
                protection::protect(&ctx.client, &ns, r, endpoints.identity_namespace()).await?;
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

mod external;
mod watches;

use external::keep_budgets_of_external;
pub(crate) use watches::{Remote, controller};

#[cfg(test)]
mod tests;
