//! The reconcile workflow of a KaironMachinePool, in the contract's order:
//! 1. dereference (owner MachinePool, Cluster) from the caches;
//! 2. pause, before deletion;
//! 3. deletion ([`super::delete`]);
//! 4. no owner MachinePool yet, or one that names another pool: nothing, not even the
//!    finalizer;
//! 5. finalizer; wait for cluster infrastructure and the MachinePool's bootstrap data Secret
//!    (its name: each member's KaironMachine reads it and checks it as a Machine's);
//! 6. the plan ([`super::plan`]) carried out: KaironMachines created for new members (each
//!    makes its own VM), Machines deleted (CAPI drains them, then deletes the KaironMachine,
//!    which deletes its VM);
//! 7. `spec.providerIDList` and the status, each written only when it differs, on the way out
//!    ([`super::publish::finish`]).

use std::sync::Arc;
use std::time::Instant;

use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use tracing::info;

use super::context::{Context, Scope, names_another};
use super::gather;
use super::instances::{MemberOf, kaironmachine_for_member, member_name};
use super::plan::{PlanInput, PoolPlan, Why, plan_pool};
use super::publish::{Next, Outcome, finish};
use super::revision::revision;
use super::status::waiting;
use crate::api::conditions::{Decided, reason};
use crate::api::{FIELD_MANAGER, KaironMachine, KaironMachinePool, MACHINE_POOL_FINALIZER};
use crate::capi::{self, MachinePool};
use crate::client::delete_exactly;
use crate::controller::error::Error;
use crate::controller::runtime::{Synced, paused_said};
use crate::controller::write::has_finalizer;
use crate::events::reason as event;

/// Reconciles one KaironMachinePool: what it does ([`decide`]), then what it publishes
/// ([`finish`]).
pub async fn reconcile(pool: Arc<KaironMachinePool>, ctx: Arc<Context>) -> Result<Action, Error> {
    Synced::all(&ctx.synced).await?;
    let scope = ctx.dereference(pool)?;
    let outcome = decide(&scope, &ctx).await?;
    finish(&ctx, &scope, outcome).await
}

/// Publishes the members with why the pool waits, then looks again on a change.
fn wait_with(d: Decided) -> Outcome {
    Outcome::Publish {
        waiting: Some(d),
        paused: None,
        next: Next::Now(Action::await_change()),
        members: None,
    }
}

/// Everything a pool reconcile reads and does, in the contract's order, up to publishing.
async fn decide(scope: &Scope, ctx: &Arc<Context>) -> Result<Outcome, Error> {
    let pool = scope.pool.as_ref();
    if let Some(why) = capi::paused_reason(scope.cluster.as_deref(), &pool.metadata) {
        let current = pool.status.as_ref().and_then(|s| s.conditions.as_deref());
        if paused_said(why, current, &[]) {
            return Ok(Outcome::Done(Action::await_change()));
        }
        return Ok(Outcome::Publish {
            waiting: None,
            paused: Some(why),
            next: Next::Now(Action::await_change()),
            members: None,
        });
    }
    if pool.metadata.deletion_timestamp.is_some() {
        return super::delete::reconcile_delete(scope, ctx).await;
    }
    let Some(mp) = scope.machine_pool.clone() else {
        return Ok(Outcome::Done(Action::await_change()));
    };
    // The MachinePool that owns the pool must also name it: after a repoint (or a copy that
    // kept the ownerReference) two pools would otherwise serve one MachinePool. Only the one
    // it names acts (and takes over the other's members); this one touches nothing.
    if let Some(other) = names_another(&mp, pool) {
        let d = waiting(
            reason::MACHINE_POOL_NAMES_ANOTHER,
            format!(
                "MachinePool {} names {other} in spec.template.spec.infrastructureRef, not this KaironMachinePool: nothing is done for it here",
                mp.name_any()
            ),
        );
        return Ok(wait_with(d));
    }
    if !has_finalizer(pool, MACHINE_POOL_FINALIZER) {
        ctx.writer(&scope.ns)
            .add_finalizer(pool, MACHINE_POOL_FINALIZER)
            .await?;
    }
    if !scope.cluster.as_ref().is_some_and(|c| c.infrastructure_provisioned()) {
        let d = waiting(
            reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
            "the Cluster's infrastructure is not provisioned yet",
        );
        return Ok(wait_with(d));
    }
    let Some(secret_name) = mp.data_secret_name().map(str::to_string) else {
        let d = waiting(
            reason::WAITING_FOR_BOOTSTRAP_DATA,
            "the MachinePool has no bootstrap data Secret yet",
        );
        return Ok(wait_with(d));
    };
    let revision = revision(
        &pool.spec.template,
        mp.spec.template.spec.version.as_deref(),
        &secret_name,
    );
    let mp_name = mp.name_any();
    let mut machines = ctx.machines_of(scope, &mp_name);
    let key = scope.key();
    let backing_off = ctx.broken_backoff.wait(&key, Instant::now());
    let kms = ctx.kaironmachines_of(scope, &mp_name);
    let mut plan = plan_for(scope, &mp, &revision, &kms, &machines, ctx, backing_off.is_some());
    if plan.delete_machines.iter().any(|(_, why)| *why == Why::ScaleIn) {
        // Whoever scales a pool in marks its choice (`delete-machine`) just before lowering the
        // MachinePool; the cache of Machines may not show the mark yet when the MachinePool's
        // change arrives. The victims are chosen from the Machines as the API server has them.
        machines = ctx.list_machines_of(scope, &mp_name).await?;
        plan = plan_for(scope, &mp, &revision, &kms, &machines, ctx, backing_off.is_some());
    }
    let broken_now = plan
        .delete_machines
        .iter()
        .filter(|(_, why)| *why == Why::Broken)
        .count();
    if broken_now > 0 {
        let (in_a_row, next) = ctx.broken_backoff.replaced(&key, broken_now, Instant::now());
        if in_a_row > 1 {
            ctx.events
                .warning(
                    pool,
                    event::BROKEN_REPLACEMENTS_BACK_OFF,
                    "Replace",
                    format!(
                        "{in_a_row} failed VMs of the pool replaced since it was last whole: the next one is replaced \
                         after {}s at the earliest",
                        next.as_secs()
                    ),
                )
                .await;
        }
    } else if plan.whole {
        ctx.broken_backoff.whole(&key, Instant::now());
    } else {
        ctx.broken_backoff.not_whole(&key);
    }
    let of = MemberOf {
        machine_pool: &mp_name,
        cluster: &scope.cluster_name,
        revision: &revision,
        watch_filter: ctx.settings.watch_filter.as_deref(),
    };
    let busy = carry_out_plan(scope, &plan, &machines, of, ctx).await?;
    Ok(Outcome::Publish {
        waiting: None,
        paused: None,
        next: Next::AfterPlan {
            busy,
            broken_wait: backing_off.filter(|_| plan.broken_held > 0),
        },
        members: Some(kms),
    })
}

/// The plan for the pool, from the caches: `kms` are the members' KaironMachines, sorted by
/// name ([`Context::kaironmachines_of`]).
fn plan_for(
    s: &Scope,
    mp: &MachinePool,
    revision: &str,
    kms: &[Arc<KaironMachine>],
    machines: &[Arc<capi::Machine>],
    ctx: &Context,
    hold_broken: bool,
) -> PoolPlan {
    let pool = s.pool.as_ref();
    // `kms` is sorted by name.
    let pending = ctx.pending.still(
        &s.key(),
        |name| {
            kms.binary_search_by(|km| km.metadata.name.as_deref().unwrap_or_default().cmp(name))
                .is_ok()
        },
        Instant::now(),
    );
    let instances = gather::instances(
        revision,
        &kms.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
        &machines.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
        &pending,
    );
    let (max_surge, max_unavailable) = pool.spec.surge_and_unavailable();
    plan_pool(&PlanInput {
        // With `cluster.x-k8s.io/replicas-managed-by`, whoever manages the size writes it into
        // the MachinePool (CAPI's cluster-autoscaler does, through its scale subresource):
        // Kairon has no autoscaler of its own, so the pool follows the MachinePool either way.
        desired: mp.desired_replicas(),
        max_surge,
        max_unavailable,
        newest_first: pool.spec.newest_first(),
        instances: &instances,
        hold_broken,
    })
}

/// Carries out the plan; returns whether it did anything.
async fn carry_out_plan(
    s: &Scope,
    plan: &PoolPlan,
    machines: &[Arc<capi::Machine>],
    of: MemberOf<'_>,
    ctx: &Context,
) -> Result<bool, Error> {
    let pool = s.pool.as_ref();
    let mut busy = false;
    let kaironmachines: Api<KaironMachine> = Api::namespaced(ctx.client.clone(), &s.ns);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for _ in 0..plan.create {
        let name = member_name(&pool.name_any());
        let km = kaironmachine_for_member(pool, &name, of);
        match kaironmachines.create(&pp, &km).await {
            Ok(_) => {
                info!(kaironmachine = %name, "created the KaironMachine of a new pool member");
                ctx.pending.created(&s.key(), name, Instant::now());
            }
            // A random name taken: another is drawn next time.
            Err(kube::Error::Api(e)) if e.is_already_exists() => {}
            Err(e) => return Err(Error::write("kaironmachine")(e)),
        }
        busy = true;
    }
    let capi_machines: Api<capi::Machine> = Api::namespaced(ctx.client.clone(), &s.ns);
    for (name, why) in &plan.delete_machines {
        // Only a Machine of the pool as cached, and exactly it (UID precondition): a name
        // alone could stand for any Machine of the namespace.
        let Some(uid) = machines
            .iter()
            .find(|m| m.name_any() == *name)
            .and_then(|m| m.metadata.uid.clone())
        else {
            continue;
        };
        match capi_machines.delete(name, &delete_exactly(Some(uid))).await {
            Ok(_) => {
                info!(machine = %name, ?why, "deleted the Machine of a pool member");
                ctx.events
                    .normal(
                        pool,
                        event::MACHINE_DELETED,
                        "Delete",
                        format!("Machine {}/{name} deleted ({why:?})", s.ns),
                    )
                    .await;
            }
            Err(kube::Error::Api(e)) if e.is_not_found() || e.code == 409 => {}
            Err(e) => return Err(Error::write("machine")(e)),
        }
        busy = true;
    }
    // A member whose VM is gone before CAPI made its Machine: nothing to drain.
    let cached = if plan.delete_kaironmachines.is_empty() {
        vec![]
    } else {
        ctx.kaironmachines_of(s, of.machine_pool)
    };
    for name in &plan.delete_kaironmachines {
        let Some(uid) = cached
            .iter()
            .find(|km| km.name_any() == *name)
            .and_then(|km| km.metadata.uid.clone())
        else {
            continue;
        };
        match kaironmachines.delete(name, &delete_exactly(Some(uid))).await {
            Ok(_) => info!(kaironmachine = %name, "deleted the KaironMachine of a pool member whose VM is gone"),
            Err(kube::Error::Api(e)) if e.is_not_found() || e.code == 409 => {}
            Err(e) => return Err(Error::write("kaironmachine")(e)),
        }
        busy = true;
    }
    Ok(busy)
}
