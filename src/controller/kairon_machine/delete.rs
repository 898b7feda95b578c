//! Deletion: the Kairon Machine goes first, then the finalizer — for a Kairon Machine that is
//! provably this KaironMachine's ([`super::ownership`]); any other is kept.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use tracing::{info, warn};

use super::context::{Context, ENDPOINT_RETRY, Scope, Step};
use super::finish::{Outcome, Report, Seen};
use super::ownership::{Verdict, whose};
use super::status::Observed;
use crate::api::MACHINE_FINALIZER;
use crate::api::conditions::{self, INSTANCE_PROVISIONED, reason};
use crate::capi;
use crate::controller::error::Error;
use crate::controller::write::has_finalizer;
use crate::events::reason as event;
use crate::kairon::{self, Deletion, provider_id};

/// How often to look again while a Kairon Machine is being deleted, on top of its watch.
const DELETE_RETRY: Duration = Duration::from_secs(30);

/// Deletion: the Kairon Machine goes first, then the finalizer.
pub(super) async fn reconcile_delete(scope: &Scope, ctx: &Context) -> Result<Outcome, Error> {
    let km = scope.km.as_ref();
    let ns = scope.ns.as_str();
    if !has_finalizer(km, MACHINE_FINALIZER) {
        return Ok(Outcome::done(Action::await_change()));
    }
    let release = || async {
        ctx.writer(ns).remove_finalizer(km, MACHINE_FINALIZER).await?;
        Ok::<_, Error>(Outcome::done(Action::await_change()))
    };
    if capi::has_annotation(&km.metadata, capi::DELETE_FOR_MOVE_ANNOTATION) {
        // Moved to another management cluster: the VM lives on there.
        info!("deleted for clusterctl move; the Kairon Machine is kept");
        return release().await;
    }
    let name = km.name_any();
    if cluster_is_gone(scope, ctx).await? {
        // In CAPI's own flow the Cluster outlives its machines. A KaironMachine deleted after
        // its Cluster is gone was left behind (by a `clusterctl move` that did not know our
        // kinds, say) while the cluster lives on elsewhere: its VM is not ours to destroy.
        warn!(instance = %name, cluster = %scope.cluster_name, "the Cluster is gone; the Kairon Machine is kept");
        ctx.metrics.instances_kept.inc();
        ctx.events
            .warning(
                km,
                event::INSTANCE_KEPT,
                "Delete",
                format!(
                    "Cluster {} no longer exists: Kairon Machine {ns}/{name} is kept, not deleted",
                    scope.cluster_name
                ),
            )
            .await;
        return release().await;
    }
    let target = match ctx.target(scope).await? {
        Step::Continue(t) => t,
        Step::Stop(observed, action) => {
            return Ok(Outcome::report(
                Report::new(scope.km.clone(), Seen::Deleting(observed)),
                action,
            ));
        }
    };
    // Authoritative read: the finalizer must not go while the VM exists. When the identity
    // names another Kairon API than the one the VM was recorded on, and the VM (the one our
    // providerID names) is not there, it lives on where it was: the deletion waits.
    let vm = target.instances.get(ns, &name).await?;
    let recorded = |vm: &kairon::Vm| {
        km.spec.provider_id.is_none() || vm.metadata.uid.as_deref().map(provider_id) == km.spec.provider_id
    };
    if !vm.as_ref().is_some_and(recorded)
        && let Some(elsewhere) = target.elsewhere(&name)
    {
        warn!(instance = %name, "the identity names another Kairon API than the one that holds the Kairon Machine; the deletion waits");
        let report = Report::new(scope.km.clone(), Seen::Deleting(elsewhere));
        return Ok(Outcome::report(report, Action::requeue(ENDPOINT_RETRY)));
    }
    let Some(vm) = vm else {
        info!("Kairon Machine is gone; releasing the finalizer");
        ctx.events
            .normal(
                km,
                event::INSTANCE_DELETED,
                "Delete",
                format!("Kairon Machine {ns}/{name} is deleted"),
            )
            .await;
        return release().await;
    };
    // The same rule as adoption: `spec.providerID` can be set by whoever creates a
    // KaironMachine, and a VM it names that is not provably ours is not deleted. The finalizer
    // goes all the same, so that such a KaironMachine can be deleted without touching the VM.
    if let Verdict::NotOurs(why) = whose(&vm, km, &ctx.client, target.instances.owner()).await? {
        warn!(instance = %name, %why, "the Kairon Machine with this name is not this KaironMachine's; it is kept");
        ctx.events
            .warning(
                km,
                event::INSTANCE_KEPT,
                "Delete",
                format!("Kairon Machine {ns}/{name} is not this KaironMachine's ({why}): it is kept, not deleted"),
            )
            .await;
        return release().await;
    }
    let deleting = vm.metadata.deletion_timestamp.is_some();
    if !deleting {
        match target.instances.delete(&vm).await? {
            Deletion::Started => info!(instance = %name, "deleting Kairon Machine"),
            Deletion::Gone => return release().await,
        }
    }
    // Kairon's finalizer is kairon-node's to remove, on the VM's node: a node that is gone
    // never does. Past the grace period the KaironMachine says so, and what can be done.
    let grace = ctx.settings.kairon_deletion_grace_period;
    let now = Time(Timestamp::now());
    let (observed, retry) = match kairon::observe::deletion_stuck(&vm, &now, grace) {
        Some(stuck) => {
            let was_stuck = km
                .status
                .as_ref()
                .and_then(|s| conditions::get(s.conditions.as_deref().unwrap_or_default(), INSTANCE_PROVISIONED))
                .is_some_and(|c| c.reason == reason::INSTANCE_DELETION_STUCK);
            if !was_stuck {
                warn!(instance = %name, "the Kairon Machine's deletion waits on Kairon's finalizers past the grace period");
                ctx.events
                    .warning(km, event::INSTANCE_DELETION_STUCK, "Delete", stuck.message.clone())
                    .await;
            }
            (Observed::Waiting(stuck), DELETE_RETRY)
        }
        None => {
            let left = vm
                .metadata
                .deletion_timestamp
                .as_ref()
                .and_then(|t| Duration::try_from(now.0.duration_since(t.0)).ok())
                .and_then(|waited| grace.checked_sub(waited));
            let retry = left.map_or(DELETE_RETRY, |l| DELETE_RETRY.min(l + Duration::from_secs(1)));
            (Observed::Instance(Box::new(vm)), retry)
        }
    };
    let report = Report::new(scope.km.clone(), Seen::Deleting(observed)).on(target);
    Ok(Outcome::report(report, Action::requeue(retry)))
}

/// Whether the KaironMachine's Cluster no longer exists, asked of the API server when the cache
/// does not have it (it may lag behind a Cluster just created).
async fn cluster_is_gone(scope: &Scope, ctx: &Context) -> Result<bool, Error> {
    if scope.cluster.is_some() {
        return Ok(false);
    }
    if scope.cluster_name.is_empty() {
        return Ok(true);
    }
    let clusters: Api<capi::Cluster> = Api::namespaced(ctx.client.clone(), &scope.ns);
    let cluster = clusters
        .get_opt(&scope.cluster_name)
        .await
        .map_err(Error::read(format!("Cluster {}/{}", scope.ns, scope.cluster_name)))?;
    Ok(cluster.is_none())
}
