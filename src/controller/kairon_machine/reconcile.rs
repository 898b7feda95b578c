//! The reconcile workflow: what a KaironMachine reconcile reads, decides and writes, in the
//! contract's order (see the module docs of [`super`]).

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tracing::{debug, info, warn};

use super::context::{Context, Scope, Step, Target, retry_elsewhere};
use super::create::create_instance;
use super::delete::reconcile_delete;
use super::evacuate;
use super::finish::{Outcome, Report, Seen, Then, finish};
use super::ownership::{Verdict, whose};
use super::status::Observed;
use crate::api::conditions::{Decided, INSTANCE_PROVISIONED, Status, reason};
use crate::api::{KaironMachine, MACHINE_FINALIZER};
use crate::capi;
use crate::controller::error::Error;
use crate::controller::runtime::Synced;
use crate::controller::runtime::paused_said;
use crate::controller::write::has_finalizer;
use crate::events::reason as event;
use crate::kairon::bootstrap_runtime::BootstrapRuntime;
use crate::kairon::{self, KaironError, provider_id};

/// Reconciles one KaironMachine: what it observes ([`decide`]), then its status written
/// ([`finish`]).
pub async fn reconcile(km: Arc<KaironMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let outcome = decide(km, &ctx).await?;
    finish(&ctx, outcome).await
}

/// Everything a reconcile reads and does, in the contract's order, up to the status.
async fn decide(km: Arc<KaironMachine>, ctx: &Arc<Context>) -> Result<Outcome, Error> {
    Synced::all(&ctx.synced).await?;
    let scope = ctx.dereference(km)?;
    let km = scope.km.as_ref();

    if let Some(why) = capi::paused_reason(scope.cluster.as_deref(), &km.metadata) {
        // An evacuation waits for the unpause, and says so (the pause also holds CAPI's
        // MachineHealthCheck and the Machine's owner).
        let waiting: Vec<Decided> = match km.metadata.deletion_timestamp {
            None => evacuate::while_paused(&scope, ctx, why).into_iter().collect(),
            Some(_) => vec![],
        };
        let current = km.status.as_ref().and_then(|s| s.conditions.as_deref());
        if paused_said(why, current, &waiting) {
            return Ok(Outcome::done(Action::await_change()));
        }
        let report = Report::new(scope.km.clone(), Seen::Paused(why)).with(waiting);
        return Ok(Outcome::report(report, Action::await_change()));
    }
    if km.metadata.deletion_timestamp.is_some() {
        ctx.evacuating
            .record(&scope.ns, &scope.cluster_name, &km.name_any(), false);
        return reconcile_delete(&scope, ctx).await;
    }
    // The contract: until CAPI has made a Machine the owner, nothing is done, not even the
    // finalizer.
    let Some(machine) = scope.machine.as_deref() else {
        debug!("waiting for an owner Machine");
        return Ok(Outcome::done(Action::await_change()));
    };
    // An ownerReference anyone could have written is not enough: the Machine must be that
    // very one (UID) and must name this KaironMachine. Otherwise nothing is created.
    if let Some(why) = capi::owner(&km.metadata, "Machine").and_then(|o| machine.not_owner_of(o, &km.name_any())) {
        let observed = Observed::Waiting(Decided::new(
            INSTANCE_PROVISIONED,
            Status::False,
            reason::OWNER_MACHINE_MISMATCH,
            why,
        ));
        let report = Report::new(scope.km.clone(), Seen::Live(observed));
        return Ok(Outcome::report(report, Action::await_change()));
    }
    if !has_finalizer(km, MACHINE_FINALIZER) {
        ctx.writer(&scope.ns).add_finalizer(km, MACHINE_FINALIZER).await?;
    }
    let target = match ctx.target(&scope).await? {
        Step::Continue(t) => t,
        Step::Stop(observed, action) => {
            return Ok(Outcome::report(
                Report::new(scope.km.clone(), Seen::Live(observed)),
                action,
            ));
        }
    };
    let (observed, action, maintenance) = match reconcile_instance(&scope, machine, ctx, &target).await {
        Ok(Step::Continue(vm)) => {
            let m = evacuate::follow(&scope, machine, &vm, &target, ctx).await?;
            let action = match m.requeue {
                Some(after) if after < ctx.settings.sync_period => Action::requeue(after),
                _ => ctx.resync(),
            };
            let observed = match machine.has_node() {
                true => Observed::Instance(Box::new(vm)),
                false => Observed::InstanceWithoutNode(Box::new(vm)),
            };
            (observed, action, m.conditions)
        }
        Ok(Step::Stop(observed, action)) => (observed, action, vec![]),
        Err(Error::Kairon(e @ KaironError::Create { .. })) => {
            // A create Kairon rejected: the condition says so with the answer's code and
            // reason (the error never carries the request, which held bootstrap data), a
            // Warning when it first happens, and an error, so that the object backs off and
            // the failure is counted.
            let observed = Observed::Waiting(Decided::new(
                INSTANCE_PROVISIONED,
                Status::False,
                reason::INSTANCE_CREATE_FAILED,
                e.to_string(),
            ));
            let report = Report::new(scope.km.clone(), Seen::Live(observed)).then(Then::CreateFailed(e.to_string()));
            return Ok(Outcome {
                report: Some(report),
                result: Err(e.into()),
            });
        }
        Err(e) => return Err(e),
    };
    // The status goes against the KaironMachine as this reconcile's own writes left it: the
    // providerID patch raised the generation, and conditions naming the old one would be
    // written again, with nothing else changed, by the next reconcile.
    let km = ctx.fresh.after_our_writes(scope.km.clone());
    let report = Report::new(km, Seen::Live(observed))
        .on(target)
        .with(maintenance)
        .then(Then::Transitions);
    Ok(Outcome::report(report, action))
}

/// Ensures the Kairon Machine exists (when it may), is ours, and is named by our providerID.
async fn reconcile_instance(
    scope: &Scope,
    machine: &capi::MachineView,
    ctx: &Context,
    target: &Target,
) -> Result<Step<kairon::Vm>, Error> {
    let km = scope.km.as_ref();
    let ns = scope.ns.as_str();
    let name = km.name_any();

    let mut vm = target
        .store
        .get(&ObjectRef::new(&name).within(ns))
        .map(|vm| (*vm).clone());
    if vm.is_none() && (km.spec.provider_id.is_some() || target.moved_from.is_some()) {
        // The cache may lag behind a create we just made: ask the API before concluding the
        // VM is gone. On a Kairon API other than the one it was recorded on, a VM not found
        // is elsewhere, not gone, and is not created again here.
        vm = target.instances.get(ns, &name).await?;
        if vm.is_none() {
            let observed = target.elsewhere(&name).unwrap_or(Observed::Gone);
            return Ok(Step::Stop(observed, retry_elsewhere(target, ctx)));
        }
    }
    let vm = match vm {
        Some(vm) => vm,
        None => match create_instance(scope, machine, ctx, target).await? {
            Step::Continue(vm) => vm,
            Step::Stop(observed, action) => return Ok(Step::Stop(observed, action)),
        },
    };
    // Our providerID names the VM we provisioned. A Kairon Machine under the same name with
    // another UID than the one recorded (a restore, a re-create by hand) is not that VM,
    // whatever its labels say: its addresses are not our node's. The instance is gone.
    let recorded_uid = km
        .status
        .as_ref()
        .and_then(|s| s.instance.as_ref())
        .and_then(|i| i.uid.as_deref());
    if let Some(pid) = km.spec.provider_id.as_deref()
        && !kairon::is_the_instance(pid, recorded_uid, &vm)
    {
        if let Some(elsewhere) = target.elsewhere(&name) {
            return Ok(Step::Stop(elsewhere, retry_elsewhere(target, ctx)));
        }
        warn!(instance = %name, "the Kairon Machine with this name is not the one spec.providerID names");
        return Ok(Step::Stop(Observed::Gone, ctx.resync()));
    }

    match whose(&vm, km, &ctx.client, target.instances.owner()).await? {
        Verdict::NotOurs(why) => {
            warn!(instance = %name, %why, "a Kairon Machine with this name is not this KaironMachine's");
            return Ok(Step::Stop(Observed::Conflict { name, why }, ctx.resync()));
        }
        Verdict::Adopt => {
            info!(instance = %name, "adopting the Kairon Machine named by spec.providerID");
            target.instances.adopt(&vm, km).await?;
            ctx.events
                .normal(
                    km,
                    event::INSTANCE_ADOPTED,
                    "Adopt",
                    format!("adopted Kairon Machine {ns}/{name} named by spec.providerID"),
                )
                .await;
        }
        Verdict::Ours => {}
    }

    // Bootstrap data, once: Kairon built the guest's seed when it created the runtime, so the
    // data leaves the Kairon Machine (readable there by whoever may read Machines, and run
    // again by any runtime Kairon makes anew), and the runtime it ran in is recorded.
    let runtime = kairon::bootstrap_runtime::bootstrap_runtime(&vm);
    debug!(instance = %name, ?runtime, "the runtime the bootstrap data ran in");
    if let Some(done) = match &runtime {
        BootstrapRuntime::Created { .. } => {
            Some("removed the bootstrap data from the Kairon Machine: Kairon created its runtime")
        }
        BootstrapRuntime::MovedLive { .. } => Some("recorded the runtime the Kairon Machine moved to live"),
        _ => None,
    } {
        target.instances.record_runtime(&vm, &runtime).await?;
        info!(instance = %name, "{done}");
    } else if runtime == BootstrapRuntime::Same {
        target.instances.saw_runtime_recorded(&vm);
    }

    if km.spec.provider_id.is_none() && vm.metadata.uid.is_some() {
        let body = json!({"spec": {"providerID": provider_id(&vm.name_any())}});
        ctx.writer(ns).merge_patch(km, "spec.providerID", body).await?;
    }
    Ok(Step::Continue(vm))
}
