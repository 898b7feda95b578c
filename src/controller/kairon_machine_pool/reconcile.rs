//! The reconcile workflow of a KaironMachinePool, in the contract's order:
//! 1. dereference (owner MachinePool, Cluster) from the caches;
//! 2. pause, before deletion;
//! 3. deletion ([`super::delete`]);
//! 4. no owner MachinePool yet: nothing, not even the finalizer;
//! 5. finalizer; wait for cluster infrastructure and bootstrap data (read with one GET and
//!    checked as a Machine's is);
//! 6. the current revision's Kairon MachineSet ([`super::sets`]): created once (`replicas: 0`, the plan raises
//!    it), adopted with the pool's other sets after a move; a set's template is never changed;
//! 7. the plan ([`super::plan`]) carried out: the current set raised, a KaironMachine per
//!    member, members started with their own bootstrap data (read once, only then), Machines
//!    deleted (CAPI drains them), release records of gone members forgotten, and sets of older
//!    revisions deleted once empty;
//! 8. `spec.providerIDList` and the status, each written only when it differs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use tracing::info;

use super::context::{Context, Scope};
use super::gather;
use super::instances::{kaironmachine_for_member, stands_for};
use super::plan::{PlanInput, PoolPlan, Why, plan_pool};
use super::publish::write_status;
use super::sets::{PoolSets, ensure_sets, release_excess, tidy_sets};
use super::status::waiting;
use crate::api::conditions::{Decided, reason};
use crate::api::{FIELD_MANAGER, KaironMachine, KaironMachinePool, MACHINE_POOL_FINALIZER};
use crate::capi::{self, MachinePool, bootstrap};
use crate::controller::error::Error;
use crate::controller::runtime::{Synced, pause_step};
use crate::controller::write::has_finalizer;
use crate::events::reason as event;
use crate::kairon::cloud_init::{GuestFacts, translate_cloud_config};
use crate::kairon::set_desired::{SetInputs, bootstrap_data_hash};
use crate::kairon::{SetError, UserData};

/// How soon a pool that changed something looks again (its watches usually come first).
const BUSY_REQUEUE: Duration = Duration::from_secs(5);
/// How soon after a set write that lost a race.
const STALE_REQUEUE: Duration = Duration::from_secs(1);
/// How soon a missing bootstrap Secret is looked for again.
const SECRET_RETRY: Duration = Duration::from_secs(10);

/// Reconciles one KaironMachinePool.
pub async fn reconcile(pool: Arc<KaironMachinePool>, ctx: Arc<Context>) -> Result<Action, Error> {
    Synced::all(&ctx.synced).await?;
    let scope = ctx.dereference(pool)?;
    let pool = scope.pool.as_ref();
    let why = capi::paused_reason(scope.cluster.as_deref(), &pool.metadata);
    let current = pool.status.as_ref().and_then(|s| s.conditions.as_deref());
    let c = ctx.as_ref();
    let s = &scope;
    if let Some(action) = pause_step(why, current, |why| async move {
        write_status(c, s, None, None, Some(why)).await.map(|_| ())
    })
    .await?
    {
        return Ok(action);
    }
    if pool.metadata.deletion_timestamp.is_some() {
        return super::delete::reconcile_delete(&scope, &ctx).await;
    }
    let Some(mp) = scope.machine_pool.clone() else {
        return Ok(Action::await_change());
    };
    // The MachinePool that owns the pool must also name it: after a repoint (or a copy that
    // kept the ownerReference) two pools would otherwise serve one MachinePool, each deleting
    // the other's Machines as vanished. Only the one it names acts; this one touches nothing.
    if let Some(other) = names_another(&mp, pool) {
        let d = waiting(
            reason::MACHINE_POOL_NAMES_ANOTHER,
            format!(
                "MachinePool {} names {other} in spec.template.spec.infrastructureRef, not this KaironMachinePool: nothing is done for it here",
                mp.name_any()
            ),
        );
        write_status(&ctx, &scope, None, Some(d), None).await?;
        return Ok(Action::await_change());
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
        write_status(&ctx, &scope, None, Some(d), None).await?;
        return Ok(Action::await_change());
    }
    if ctx.uses_an_identity(&scope) {
        let d = waiting(
            reason::IDENTITY_NOT_SUPPORTED,
            "the KaironCluster names a Kairon API by spec.identityRef: MachinePools are made on the manager's own Kairon API only",
        );
        write_status(&ctx, &scope, None, Some(d), None).await?;
        return Ok(Action::await_change());
    }
    let Some(secret_name) = mp.data_secret_name().map(str::to_string) else {
        let d = waiting(
            reason::WAITING_FOR_BOOTSTRAP_DATA,
            "the MachinePool has no bootstrap data Secret yet",
        );
        write_status(&ctx, &scope, None, Some(d), None).await?;
        return Ok(Action::await_change());
    };
    let template_spec = pool.spec.template.clone();
    let inputs = SetInputs {
        pool: &scope.link,
        cluster_name: &scope.cluster_name,
        template: &template_spec,
        bootstrap_secret: &secret_name,
        version: mp.spec.template.spec.version.as_deref(),
    };
    let data = BootstrapData {
        scope: &scope,
        mp: &mp,
        secret_name: &secret_name,
        ctx: &ctx,
    };
    let sets = match ensure_sets(&scope, &ctx, &inputs).await {
        Ok(Ok(Some(sets))) => sets,
        // A set was written (created, adopted): decide on what Kairon makes of it.
        Ok(Ok(None)) => return Ok(Action::requeue(STALE_REQUEUE)),
        Ok(Err(d)) => {
            write_status(&ctx, &scope, None, Some(d), None).await?;
            return Ok(Action::requeue(SECRET_RETRY));
        }
        Err(Error::MachineSet(SetError::Stale { .. })) => return Ok(Action::requeue(STALE_REQUEUE)),
        Err(e) => return Err(e),
    };
    let mut machines = ctx.machines_of(&scope, &mp.name_any());
    let backoff_key = format!("{}/{}/{}", scope.link.namespace, scope.link.name, scope.link.uid);
    let backing_off = ctx.broken_backoff.wait(&backoff_key, Instant::now());
    let mut plan = plan_for(&scope, &mp, &sets, &machines, &ctx, backing_off.is_some());
    if plan.delete_machines.iter().any(|(_, why)| *why == Why::ScaleIn) {
        // Whoever scales a pool in marks its choice (`delete-machine`) just before lowering the
        // MachinePool; the cache of Machines may not show the mark yet when the MachinePool's
        // change arrives. The victims are chosen from the Machines as the API server has them.
        machines = ctx.list_machines_of(&scope, &mp.name_any()).await?;
        plan = plan_for(&scope, &mp, &sets, &machines, &ctx, backing_off.is_some());
    }
    let broken_now = plan
        .delete_machines
        .iter()
        .filter(|(_, why)| *why == Why::Broken)
        .count();
    if broken_now > 0 {
        let (in_a_row, next) = ctx.broken_backoff.replaced(&backoff_key, broken_now, Instant::now());
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
        ctx.broken_backoff.whole(&backoff_key);
    }
    let busy = match carry_out_plan(&scope, &mp, &sets, &plan, &machines, &data, &ctx).await? {
        Ok(busy) => busy,
        Err(d) => {
            write_status(&ctx, &scope, Some(&sets.current), Some(d), None).await?;
            return Ok(Action::requeue(SECRET_RETRY));
        }
    };
    let changed = write_status(&ctx, &scope, Some(&sets.current), None, None).await?;
    Ok(match backing_off.filter(|_| plan.broken_held > 0) {
        // A broken VM waits for its turn: looked at again when the wait is over.
        Some(wait) if !busy && !changed => Action::requeue(wait.max(STALE_REQUEUE)),
        Some(wait) => Action::requeue(wait.clamp(STALE_REQUEUE, BUSY_REQUEUE)),
        None if busy || changed => Action::requeue(BUSY_REQUEUE),
        None => Action::requeue(ctx.settings.sync_period),
    })
}

/// What `mp`'s infrastructure reference names instead of `pool`, if it does not name `pool`.
fn names_another(mp: &MachinePool, pool: &KaironMachinePool) -> Option<String> {
    let named = mp.spec.template.spec.infrastructure_ref.as_ref();
    match named {
        Some(r) if r.is(crate::api::GROUP, "KaironMachinePool") && r.name == pool.name_any() => None,
        Some(r) if r.name.is_empty() => Some("nothing".to_string()),
        Some(r) => Some(format!("{} {}", r.kind, r.name)),
        None => Some("nothing".to_string()),
    }
}

/// The pool's bootstrap data, read only when it is needed (one GET of the Secret, checked as a
/// Machine's is): when members are to be started.
struct BootstrapData<'a> {
    scope: &'a Scope,
    mp: &'a MachinePool,
    secret_name: &'a str,
    ctx: &'a Context,
}

impl BootstrapData<'_> {
    /// The bootstrap data, or why it cannot be used (as a condition).
    async fn read(&self) -> Result<Result<UserData, Decided>, Error> {
        let (ns, secret_name, ctx, mp) = (self.scope.ns.as_str(), self.secret_name, self.ctx, self.mp);
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
        let Some(secret) = secrets
            .get_opt(secret_name)
            .await
            .map_err(Error::read(format!("bootstrap data Secret {ns}/{secret_name}")))?
        else {
            return Ok(Err(waiting(
                reason::BOOTSTRAP_SECRET_NOT_FOUND,
                format!("bootstrap data Secret {secret_name} not found"),
            )));
        };
        let trusted = match bootstrap::check_source(&secret, mp.into()) {
            Ok(bootstrap::Source::Given) => Ok(()),
            Ok(bootstrap::Source::Config(made_by)) => {
                let config = read_config_metadata(ns, made_by, ctx).await?;
                bootstrap::check_config(&secret, made_by, config.as_ref(), mp.into())
            }
            Err(e) => Err(e),
        };
        Ok(trusted
            .and_then(|()| bootstrap::bootstrap_data(&secret, ctx.settings.max_bootstrap_data_bytes))
            .map(UserData)
            .map_err(|e| waiting(e.reason(), e.to_string())))
    }
}

/// The metadata of the bootstrap config that made the Secret (any bootstrap provider's kind).
async fn read_config_metadata(
    ns: &str,
    made_by: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ctx: &Context,
) -> Result<Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>, Error> {
    let (group, version) = made_by
        .api_version
        .split_once('/')
        .unwrap_or(("", &made_by.api_version));
    let ar = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(group, version, &made_by.kind));
    Api::<kube::api::DynamicObject>::namespaced_with(ctx.client.clone(), ns, &ar)
        .get_metadata_opt(&made_by.name)
        .await
        .map(|config| config.map(|c| c.metadata))
        .map_err(Error::read(format!(
            "bootstrap config {} {ns}/{}",
            made_by.kind, made_by.name
        )))
}

/// The plan for the pool, from the caches.
fn plan_for(
    s: &Scope,
    mp: &MachinePool,
    sets: &PoolSets,
    machines: &[Arc<capi::Machine>],
    ctx: &Context,
    hold_broken: bool,
) -> PoolPlan {
    let pool = s.pool.as_ref();
    let members: Vec<_> = sets.all().flat_map(|set| ctx.members_of(set)).collect();
    let kms = ctx.kaironmachines_of(s);
    let instances = gather::instances(
        &sets.all().collect::<Vec<_>>(),
        &sets.current.name_any(),
        &members.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
        &kms.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
        &machines.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
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
        set_replicas: sets.current.spec.replicas,
        all_replicas: sets.all().map(|set| set.spec.replicas.max(0)).sum(),
        instances: &instances,
        hold_broken,
    })
}

/// Carries out the plan; returns whether it did anything, or why members cannot be started.
async fn carry_out_plan(
    s: &Scope,
    mp: &MachinePool,
    sets: &PoolSets,
    plan: &PoolPlan,
    machines: &[Arc<capi::Machine>],
    data: &BootstrapData<'_>,
    ctx: &Context,
) -> Result<Result<bool, Decided>, Error> {
    let pool = s.pool.as_ref();
    let members: Vec<_> = sets.all().flat_map(|set| ctx.members_of(set)).collect();
    let mut busy = false;
    if let Some(r) = plan.set_replicas {
        match ctx.sets().patch_replicas(&sets.current, r).await {
            Ok(()) => info!(set = %sets.current.name_any(), replicas = r, "raised Kairon MachineSet"),
            Err(SetError::Stale { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        busy = true;
    }
    let kaironmachines: Api<KaironMachine> = Api::namespaced(ctx.client.clone(), &s.ns);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for name in &plan.create_kaironmachines {
        let Some(vm) = members.iter().find(|vm| vm.name_any() == *name) else {
            continue;
        };
        let Some(km) = kaironmachine_for_member(pool, &mp.name_any(), &s.cluster_name, vm) else {
            continue;
        };
        ctx.kairon.claim_member(vm).await?;
        match kaironmachines.create(&pp, &km).await {
            Ok(_) => info!(kaironmachine = %name, "created the KaironMachine of a pool member"),
            Err(kube::Error::Api(e)) if e.is_already_exists() => {
                let existing = kaironmachines
                    .get_opt(name)
                    .await
                    .map_err(Error::read(format!("KaironMachine {}/{name}", s.ns)))?;
                if !existing.is_some_and(|e| stands_for(&e, vm)) {
                    tracing::warn!(kaironmachine = %name, "a KaironMachine of that name stands for another VM");
                }
            }
            Err(e) => return Err(Error::write("kaironmachine")(e)),
        }
        busy = true;
    }
    // Members over their set's size (Kairon made one while a release was half done): Kairon
    // would remove members of its own choice; the never-started ones are released for it.
    let excess = release_excess(sets, ctx).await?;
    busy |= !excess.is_empty();
    let start: Vec<&String> = plan.start.iter().filter(|n| !excess.contains(*n)).collect();
    if !start.is_empty() {
        // Read once, only when a member is to start: steady state makes no request.
        let user_data = match data.read().await? {
            Ok(d) => d,
            Err(d) => return Ok(Err(d)),
        };
        let hash = bootstrap_data_hash(&user_data);
        for name in start {
            let Some(vm) = members.iter().find(|vm| vm.name_any() == *name) else {
                continue;
            };
            let facts = GuestFacts::kairon(name);
            let cloud_init =
                match translate_cloud_config(user_data.as_str(), &facts, 2 * ctx.settings.max_bootstrap_data_bytes) {
                    Ok(c) => c,
                    Err(e) => {
                        return Ok(Err(waiting(
                            reason::UNSUPPORTED_BOOTSTRAP_DATA,
                            format!("the pool's bootstrap data cannot be given to Kairon: {e}"),
                        )));
                    }
                };
            match ctx.kairon.start_member(vm, cloud_init, &hash).await {
                Ok(()) => info!(instance = %name, "started a pool member with its bootstrap data"),
                Err(crate::kairon::KaironError::StartStale { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            busy = true;
        }
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
        let dp = crate::client::delete_exactly(Some(uid));
        match capi_machines.delete(name, &dp).await {
            Ok(_) => {
                info!(machine = %name, ?why, "deleted the Machine of a pool instance");
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
    busy |= tidy_sets(s, sets, ctx).await?;
    Ok(Ok(busy))
}
