//! The reconcile workflow of a KaironMachinePool, in the contract's order:
//! 1. dereference (owner MachinePool, Cluster) from the caches;
//! 2. pause, before deletion;
//! 3. deletion ([`super::delete`]);
//! 4. no owner MachinePool yet: nothing, not even the finalizer;
//! 5. finalizer; wait for cluster infrastructure and bootstrap data (read with one GET and
//!    checked as a Machine's is);
//! 6. the Kairon MachineSet: created once (`replicas: 0`, the plan raises it), adopted after a
//!    move, its template rewritten when what rolls changed, its user-data when only the
//!    content of the bootstrap Secret changed (a token rotation: nothing rolls);
//! 7. the plan ([`super::plan`]) carried out: the set's replicas, a KaironMachine per member,
//!    Machines deleted (CAPI drains them);
//! 8. `spec.providerIDList` and the status, each written only when it differs.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use serde_json::json;
use tracing::info;

use super::context::{Context, Scope};
use super::gather;
use super::instances::{kaironmachine_for_member, stands_for};
use super::plan::{PlanInput, PoolPlan, plan_pool, replicas_managed_externally};
use super::publish::write_status;
use crate::api::conditions::{Decided, READY, Status, reason};
use crate::api::{FIELD_MANAGER, KaironMachine, KaironMachinePool, MACHINE_POOL_FINALIZER};
use crate::capi::{self, MachinePool, bootstrap};
use crate::controller::error::Error;
use crate::controller::runtime::{Synced, pause_step};
use crate::controller::write::{Writer, has_finalizer};
use crate::events::reason as event;
use crate::kairon::machineset::MachineSet;
use crate::kairon::set_desired::{
    SetInputs, desired_machine_set, desired_template, machine_set_provider_id, template_drifted, user_data_drifted,
};
use crate::kairon::set_observe::set_ownership;
use crate::kairon::{Ownership, SetCreated, SetError, UserData};

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
    let set = match ensure_set(&scope, &ctx, &inputs, &data).await {
        Ok(Ok(set)) => set,
        Ok(Err(d)) => {
            write_status(&ctx, &scope, None, Some(d), None).await?;
            return Ok(Action::requeue(SECRET_RETRY));
        }
        Err(Error::MachineSet(SetError::Stale { .. })) => return Ok(Action::requeue(STALE_REQUEUE)),
        Err(e) => return Err(e),
    };
    let Some(set) = set else {
        // The set was written (created, adopted or given a new template): decide on what
        // Kairon makes of it.
        return Ok(Action::requeue(STALE_REQUEUE));
    };
    let plan = plan_for(&scope, &mp, &set, &ctx);
    // New members boot with the template's user-data: before the set is raised, it is brought
    // up to date with the Secret (CABPK rotates a pool's join token in place). Otherwise the
    // Secret is not read: steady state makes no request.
    if plan.set_replicas.is_some_and(|r| r > set.spec.replicas) {
        let user_data = match data.read().await? {
            Ok(d) => d,
            Err(d) => {
                write_status(&ctx, &scope, Some(&set), Some(d), None).await?;
                return Ok(Action::requeue(SECRET_RETRY));
            }
        };
        if user_data_drifted(&set, &user_data) {
            return match ctx.sets().patch_user_data(&set, user_data).await {
                Ok(()) | Err(SetError::Stale { .. }) => Ok(Action::requeue(STALE_REQUEUE)),
                Err(e) => Err(e.into()),
            };
        }
    }
    let busy = carry_out_plan(&scope, &mp, &set, &plan, &ctx).await?;
    report_autoscaled_replicas(&scope, &mp, &set, &ctx).await?;
    let changed = write_status(&ctx, &scope, Some(&set), None, None).await?;
    Ok(if busy || changed {
        Action::requeue(BUSY_REQUEUE)
    } else {
        Action::requeue(ctx.settings.sync_period)
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

fn waiting(why: &'static str, message: impl Into<String>) -> Decided {
    Decided::new(READY, Status::False, why, message)
}

/// The pool's bootstrap data, read only when it is needed (one GET of the Secret, checked as a
/// Machine's is): to create the set, to give it a new template, and before it is raised.
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

/// The pool's set, as Kairon has it: created, adopted, or with its template brought up to
/// date. `Ok(None)`: it was just written, look again. `Err(condition)`: it cannot be used.
async fn ensure_set(
    s: &Scope,
    ctx: &Context,
    inputs: &SetInputs<'_>,
    data: &BootstrapData<'_>,
) -> Result<Result<Option<MachineSet>, Decided>, Error> {
    let pool = s.pool.as_ref();
    let sets = ctx.sets();
    let found = match ctx.cached_set(s) {
        Some(set) => Some((*set).clone()),
        None => sets.get(&s.ns, &s.link.name).await?,
    };
    let set = match found {
        Some(set) => set,
        None if pool.spec.provider_id.is_some() => {
            return Ok(Err(waiting(
                reason::MACHINE_SET_NOT_FOUND,
                "the Kairon MachineSet spec.providerID names no longer exists",
            )));
        }
        None => {
            let user_data = match data.read().await? {
                Ok(d) => d,
                Err(d) => return Ok(Err(d)),
            };
            let desired = desired_machine_set(inputs, user_data, 0);
            match sets.create(desired).await? {
                SetCreated::New(set) => {
                    info!(set = %set.name_any(), "created Kairon MachineSet");
                    ctx.events
                        .normal(
                            pool,
                            event::MACHINE_SET_CREATED,
                            "Create",
                            format!("Kairon MachineSet {}/{} created", s.ns, s.link.name),
                        )
                        .await;
                    record_provider_id(s, ctx, &set).await?;
                    return Ok(Ok(None));
                }
                SetCreated::Existing(set) => set,
            }
        }
    };
    match set_ownership(&set, &s.link, pool.spec.provider_id.as_deref(), ctx.kairon.owner()) {
        Ownership::Ours => {}
        Ownership::OursBeforeMove { .. } => {
            sets.adopt(&set, &s.link.uid, &s.ns).await?;
            ctx.events
                .normal(
                    pool,
                    event::MACHINE_SET_ADOPTED,
                    "Adopt",
                    format!("Kairon MachineSet {}/{} adopted", s.ns, s.link.name),
                )
                .await;
            return Ok(Ok(None));
        }
        Ownership::Foreign(why) => {
            return Ok(Err(waiting(
                reason::INSTANCE_CONFLICT,
                format!("Kairon MachineSet {}/{} is not this pool's: {why}", s.ns, s.link.name),
            )));
        }
    }
    if pool.spec.provider_id.is_none() {
        record_provider_id(s, ctx, &set).await?;
    }
    let want = desired_template(inputs);
    if template_drifted(&set, &want) {
        let user_data = match data.read().await? {
            Ok(d) => d,
            Err(d) => return Ok(Err(d)),
        };
        sets.patch_template(&set, want, user_data).await?;
        ctx.events
            .normal(
                pool,
                event::ROLLING_OUT,
                "Update",
                format!(
                    "the template of Kairon MachineSet {}/{} changed: the pool rolls",
                    s.ns, s.link.name
                ),
            )
            .await;
        return Ok(Ok(None));
    }
    Ok(Ok(Some(set)))
}

async fn record_provider_id(s: &Scope, ctx: &Context, set: &MachineSet) -> Result<(), Error> {
    let Some(uid) = set.metadata.uid.as_deref() else {
        return Ok(());
    };
    ctx.writer(&s.ns)
        .merge_patch(
            s.pool.as_ref(),
            "spec.providerID",
            json!({"spec": {"providerID": machine_set_provider_id(uid)}}),
        )
        .await
}

/// An external autoscaler owns the set's size: CAPI's contract makes the provider copy it to
/// `MachinePool.spec.replicas` (its phase says `Scaling` until they match).
async fn report_autoscaled_replicas(s: &Scope, mp: &MachinePool, set: &MachineSet, ctx: &Context) -> Result<(), Error> {
    if !replicas_managed_externally(mp.metadata.annotations.as_ref()) || mp.spec.replicas == Some(set.spec.replicas) {
        return Ok(());
    }
    info!(
        replicas = set.spec.replicas,
        "the autoscaler's size of the Kairon MachineSet copied to the MachinePool"
    );
    Writer::<MachinePool>::new(Api::namespaced(ctx.client.clone(), &s.ns), None)
        .merge_patch(mp, "spec.replicas", json!({"spec": {"replicas": set.spec.replicas}}))
        .await
}

/// The plan for the pool, from the caches.
fn plan_for(s: &Scope, mp: &MachinePool, set: &MachineSet, ctx: &Context) -> PoolPlan {
    let pool = s.pool.as_ref();
    let members = ctx.members_of(set);
    let kms = ctx.kaironmachines_of(s);
    let machines = ctx.machines_of(s, &mp.name_any());
    let instances = gather::instances(
        set,
        &members.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
        &kms.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
        &machines.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
    );
    let (max_surge, max_unavailable) = pool.spec.surge_and_unavailable();
    let external = replicas_managed_externally(mp.metadata.annotations.as_ref());
    plan_pool(&PlanInput {
        desired: if external {
            set.spec.replicas
        } else {
            mp.desired_replicas()
        },
        replicas_managed_externally: external,
        max_surge,
        max_unavailable,
        newest_first: pool.spec.newest_first(),
        set_replicas: set.spec.replicas,
        set_status_replicas: set.status.as_ref().and_then(|st| st.replicas),
        instances: &instances,
    })
}

/// Carries out the plan; returns whether it did anything.
async fn carry_out_plan(
    s: &Scope,
    mp: &MachinePool,
    set: &MachineSet,
    plan: &PoolPlan,
    ctx: &Context,
) -> Result<bool, Error> {
    let pool = s.pool.as_ref();
    let members = ctx.members_of(set);
    let machines = ctx.machines_of(s, &mp.name_any());
    let mut busy = false;
    if let Some(r) = plan.set_replicas {
        match ctx.sets().patch_replicas(set, r).await {
            Ok(()) => info!(replicas = r, "scaled Kairon MachineSet"),
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
    Ok(busy)
}
