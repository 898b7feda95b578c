//! Deletion: the Kairon Machine goes first, then the finalizer — for a Kairon Machine that is
//! provably this KaironMachine's ([`super::ownership`]); any other is kept.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use tracing::{info, warn};

use super::context::{Context, ENDPOINT_RETRY, Scope, Step, write_status};
use super::ownership::{Verdict, whose};
use super::status::{Observed, StatusInput};
use crate::api::MACHINE_FINALIZER;
use crate::api::conditions::{self, INSTANCE_PROVISIONED, reason};
use crate::capi;
use crate::controller::error::Error;
use crate::controller::write::has_finalizer;
use crate::events::reason as event;
use crate::kairon::set_observe::{is_released, set_of};
use crate::kairon::{self, Deletion, provider_id};

/// How often to look again while a Kairon Machine is being deleted, on top of its watch.
const DELETE_RETRY: Duration = Duration::from_secs(30);

/// Deletion: the Kairon Machine goes first, then the finalizer.
pub(super) async fn reconcile_delete(scope: &Scope, ctx: &Context) -> Result<Action, Error> {
    let km = scope.km.as_ref();
    let ns = scope.ns.as_str();
    if !has_finalizer(km, MACHINE_FINALIZER) {
        return Ok(Action::await_change());
    }
    let release = || async {
        ctx.writer(ns).remove_finalizer(km, MACHINE_FINALIZER).await?;
        Ok::<_, Error>(Action::await_change())
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
            write_status(ctx, km, StatusInput::Deleting(&observed), None).await?;
            return Ok(action);
        }
    };
    // Authoritative read: the finalizer must not go while the VM exists. When the identity
    // names another Kairon API than the one the VM was recorded on, and the VM (the one our
    // providerID names) is not there, it lives on where it was: the deletion waits.
    let vm = target.instances.get(ns, &name).await?;
    let recorded = |vm: &kairon::Machine| {
        km.spec.provider_id.is_none() || vm.metadata.uid.as_deref().map(provider_id) == km.spec.provider_id
    };
    if !vm.as_ref().is_some_and(recorded)
        && let Some(elsewhere) = target.elsewhere(&name)
    {
        warn!(instance = %name, "the identity names another Kairon API than the one that holds the Kairon Machine; the deletion waits");
        write_status(ctx, km, StatusInput::Deleting(&elsewhere), None).await?;
        return Ok(Action::requeue(ENDPOINT_RETRY));
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
    // A member of a pool's set is released from it first, or Kairon would replace it; also
    // when Kairon already deletes it (a released member is outdated) before the release was
    // counted.
    let deleting = vm.metadata.deletion_timestamp.is_some();
    if (!deleting || is_released(&vm))
        && let Some(action) = release_member(&vm, &target.instances).await?
    {
        return Ok(action);
    }
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
    write_status(ctx, km, StatusInput::Deleting(&observed), Some(&target)).await?;
    Ok(Action::requeue(retry))
}

/// Releases are made one at a time in this process: two at once on one set would only make
/// each other's write stale, and every retry widens the gap between a member's label and its
/// set's count.
static RELEASES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Releases `vm` from its Kairon MachineSet, if it is a member of one: Kairon replaces any
/// member deleted by someone else, and deletes members of its own choice when `spec.replicas`
/// drops below them. So the member is labelled released (no template has that hash: it is
/// outdated, and whatever Kairon does next removes it rather than another), and its set is
/// lowered by one together with a record of it, right after, on the set's resourceVersion:
/// exactly once. Kairon acts on sets every few seconds; between the two writes there is one
/// request. `Some(action)`: not done yet, look again.
async fn release_member(vm: &kairon::Machine, instances: &kairon::Instances) -> Result<Option<Action>, Error> {
    let Some(set_name) = set_of(vm) else {
        return Ok(None);
    };
    let Some(uid) = vm.metadata.uid.as_deref() else {
        return Ok(None);
    };
    let _one_at_a_time = RELEASES.lock().await;
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let sets = instances.machine_sets();
    // Kairon writes the set's status every tick: a write that lost to it is tried again at
    // once, on a fresh read (each try only if the release is not recorded yet).
    let mut marked = false;
    for _ in 0..3 {
        let Some(set) = sets.get(&ns, set_name).await? else {
            return Ok(None);
        };
        if kairon::released_members(&set).iter().any(|u| u == uid) {
            return Ok(None);
        }
        // No record: the member is read again, after the set. `vm` was read before this
        // release's turn came; meanwhile the member may have been released, deleted, and its
        // record forgotten once it was gone (records are kept while the member exists). Only
        // a member still there, the same one, is released.
        let Some(now) = instances
            .get(&ns, &name)
            .await?
            .filter(|now| now.metadata.uid.as_deref() == Some(uid))
        else {
            // Labelled released (by this release, now or in an earlier try) and gone before its
            // set was lowered: Kairon deleted it as outdated. Its set still counts it, and
            // Kairon would make another member in its place: lowered now. No record means it
            // was never lowered: a record is kept while the member's KaironMachine exists.
            if marked || is_released(vm) {
                match sets.release(&set, uid, &name).await {
                    Ok(()) => {
                        info!(instance = %name, set = %set_name, "released the Kairon Machine from its MachineSet (Kairon deleted it first)");
                        return Ok(None);
                    }
                    Err(kairon::SetError::Stale { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            info!(instance = %name, set = %set_name, "the Kairon Machine went while its release waited; nothing to release");
            return Ok(Some(Action::requeue(Duration::from_secs(1))));
        };
        if !marked && !is_released(&now) {
            instances.mark_released(&now).await?;
        }
        marked = true;
        match sets.release(&set, uid, &name).await {
            Ok(()) => {
                info!(instance = %name, set = %set_name, "released the Kairon Machine from its MachineSet");
                return Ok(None);
            }
            Err(kairon::SetError::Stale { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(Action::requeue(Duration::from_secs(1))))
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
