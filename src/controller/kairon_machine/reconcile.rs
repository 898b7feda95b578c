//! The reconcile workflow: what a KaironMachine reconcile reads, decides and writes, in the
//! contract's order (see the module docs of [`super`]).

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tracing::{debug, info, warn};

use super::context::{Context, Scope, Step, Target, retry_elsewhere, write_status, write_status_with};
use super::create::create_instance;
use super::delete::reconcile_delete;
use super::evacuate;
use super::ownership::{Verdict, whose};
use super::status::{Observed, StatusInput};
use crate::api::conditions::{self, Decided, INSTANCE_PROVISIONED, Status, reason};
use crate::api::{KaironMachine, KaironMachineStatus, MACHINE_FINALIZER};
use crate::capi;
use crate::controller::error::Error;
use crate::controller::runtime::Synced;
use crate::controller::runtime::pause_step_with;
use crate::controller::write::has_finalizer;
use crate::events::reason as event;
use crate::kairon::bootstrap_runtime::BootstrapRuntime;
use crate::kairon::{self, KaironError, provider_id};

/// Reconciles one KaironMachine.
pub async fn reconcile(km: Arc<KaironMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    Synced::all(&ctx.synced).await?;
    let scope = ctx.dereference(km)?;
    let km = scope.km.as_ref();

    let why = capi::paused_reason(scope.cluster.as_deref(), &km.metadata);
    let current = km.status.as_ref().and_then(|s| s.conditions.as_deref());
    let c = ctx.as_ref();
    // An evacuation waits for the unpause, and says so (the pause also holds CAPI's
    // MachineHealthCheck and the Machine's owner).
    let waiting: Vec<Decided> = why
        .filter(|_| km.metadata.deletion_timestamp.is_none())
        .and_then(|why| evacuate::while_paused(&scope, c, why))
        .into_iter()
        .collect();
    let waiting = waiting.as_slice();
    if let Some(action) = pause_step_with(why, current, waiting, |why| async move {
        write_status_with(c, km, StatusInput::Paused(why), None, waiting)
            .await
            .map(|_| ())
    })
    .await?
    {
        return Ok(action);
    }
    if km.metadata.deletion_timestamp.is_some() {
        ctx.evacuating
            .record(&scope.ns, &scope.cluster_name, &km.name_any(), false);
        return reconcile_delete(&scope, &ctx).await;
    }
    // The contract: until CAPI has made a Machine the owner, nothing is done, not even the
    // finalizer.
    let Some(machine) = scope.machine.as_deref() else {
        debug!("waiting for an owner Machine");
        return Ok(Action::await_change());
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
        write_status(&ctx, km, StatusInput::Live(&observed), None).await?;
        return Ok(Action::await_change());
    }
    if !has_finalizer(km, MACHINE_FINALIZER) {
        ctx.writer(&scope.ns).add_finalizer(km, MACHINE_FINALIZER).await?;
    }
    let target = match ctx.target(&scope).await? {
        Step::Continue(t) => t,
        Step::Stop(observed, action) => {
            write_status(&ctx, km, StatusInput::Live(&observed), None).await?;
            return Ok(action);
        }
    };
    let (observed, action, maintenance) = match reconcile_instance(&scope, machine, &ctx, &target).await {
        Ok(Step::Continue(vm)) => {
            let m = evacuate::follow(&scope, machine, &vm, &target, &ctx).await?;
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
            report_create_failure(km, &e, &ctx).await?;
            // An error, so that the object backs off and the failure is counted.
            return Err(e.into());
        }
        Err(e) => return Err(e),
    };
    // The status goes against the KaironMachine as this reconcile's own writes left it: the
    // providerID patch raised the generation, and conditions naming the old one would be
    // written again, with nothing else changed, by the next reconcile.
    let km = ctx.fresh.after_our_writes(scope.km.clone());
    if let Some(next) = write_status_with(&ctx, &km, StatusInput::Live(&observed), Some(&target), &maintenance).await? {
        report_transitions(&km, &next, &ctx).await;
        evacuate::report(&km, &next, &ctx).await;
    }
    Ok(action)
}

/// A create Kairon rejected: the condition says so with the answer's code and reason (the
/// error never carries the request, which held bootstrap data), and a Warning event when it
/// first happens.
async fn report_create_failure(km: &KaironMachine, e: &KaironError, ctx: &Context) -> Result<(), Error> {
    let observed = Observed::Waiting(Decided::new(
        INSTANCE_PROVISIONED,
        Status::False,
        reason::INSTANCE_CREATE_FAILED,
        e.to_string(),
    ));
    if write_status(ctx, km, StatusInput::Live(&observed), None)
        .await?
        .is_some()
    {
        ctx.events
            .warning(km, event::INSTANCE_CREATE_FAILED, "Create", e.to_string())
            .await;
    }
    Ok(())
}

/// Events and the provisioning-time metric for what a status write just changed.
async fn report_transitions(km: &KaironMachine, next: &KaironMachineStatus, ctx: &Context) {
    let before = km.status.as_ref();
    if next.is_provisioned() && !before.is_some_and(KaironMachineStatus::is_provisioned) {
        if let Some(created) = &km.metadata.creation_timestamp {
            let secs = k8s_openapi::jiff::Timestamp::now()
                .duration_since(created.0)
                .as_secs_f64();
            ctx.metrics.provision_duration.observe(secs.max(0.0));
        }
        let host = next.instance.as_ref().and_then(|i| i.host.clone()).unwrap_or_default();
        ctx.events
            .normal(
                km,
                event::INSTANCE_PROVISIONED,
                "Provision",
                format!("Kairon Machine {} is running on host {host}", km.name_any()),
            )
            .await;
    }
    if let Some((reason, why)) = lost_node(before, next) {
        ctx.events.warning(km, reason, "Observe", why).await;
    } else if let Some(why) = stopped_running(before, next) {
        ctx.events
            .warning(km, event::INSTANCE_NOT_RUNNING, "Observe", why)
            .await;
    }
    if let Some(r) = next.failure_reason()
        && before.and_then(KaironMachineStatus::failure_reason).is_none()
    {
        let message = next
            .deprecated
            .as_ref()
            .and_then(|d| d.v1beta1.as_ref())
            .and_then(|v| v.failure_message.clone())
            .unwrap_or_default();
        ctx.events
            .warning(km, event::INSTANCE_FAILED, "Provision", format!("{r}: {message}"))
            .await;
    }
}

/// The new `InstanceProvisioned` message when a status write turns a running instance into one
/// that does not run (Kairon paused, halted or stopped it, its runtime failed, an error): the
/// Warning a user looks for when a Node goes away. Not when it is deleted or found gone, which
/// have events of their own.
fn stopped_running(before: Option<&KaironMachineStatus>, next: &KaironMachineStatus) -> Option<String> {
    let instance = |s: &KaironMachineStatus| {
        conditions::get(s.conditions.as_deref().unwrap_or_default(), INSTANCE_PROVISIONED)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let (was, _, _) = instance(before?)?;
    let (now, reason, message) = instance(next)?;
    let elsewhere = [
        reason::INSTANCE_TERMINATING,
        reason::INSTANCE_NOT_FOUND,
        reason::INSTANCE_ENDPOINT_CHANGED,
        reason::INSTANCE_UNREADABLE,
    ];
    (was == "True" && now != "True" && !elsewhere.contains(&reason.as_str())).then(|| format!("{reason}: {message}"))
}

/// The Warning for a transition to Kairon losing the VM's node (`NodeUnreachable`) or an
/// operator fencing it off (`Fenced`): its event reason and note, once per transition.
fn lost_node(before: Option<&KaironMachineStatus>, next: &KaironMachineStatus) -> Option<(&'static str, String)> {
    let instance = |s: &KaironMachineStatus| {
        conditions::get(s.conditions.as_deref().unwrap_or_default(), INSTANCE_PROVISIONED)
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let (now, message) = instance(next)?;
    let event = match now.as_str() {
        reason::INSTANCE_HOST_UNREACHABLE => event::INSTANCE_HOST_UNREACHABLE,
        reason::INSTANCE_FENCED => event::INSTANCE_FENCED,
        _ => return None,
    };
    let was = before.and_then(instance).map(|(r, _)| r);
    (was.as_deref() != Some(now.as_str())).then_some((event, message))
}

/// Ensures the Kairon Machine exists (when it may), is ours, and is named by our providerID.
async fn reconcile_instance(
    scope: &Scope,
    machine: &capi::Machine,
    ctx: &Context,
    target: &Target,
) -> Result<Step<kairon::Machine>, Error> {
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
    }

    if km.spec.provider_id.is_none() && vm.metadata.uid.is_some() {
        let body = json!({"spec": {"providerID": provider_id(&vm.name_any())}});
        ctx.writer(ns).merge_patch(km, "spec.providerID", body).await?;
    }
    Ok(Step::Continue(vm))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::kairon_machine::status::next_status;
    use crate::kairon::fixtures::vm;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn inst(phase: &str) -> Observed {
        Observed::Instance(Box::new(vm(Some(phase))))
    }

    fn status_of(before: Option<&KaironMachineStatus>, observed: Observed) -> KaironMachineStatus {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        next_status(before, StatusInput::Live(&observed), None, &now)
    }

    #[test]
    fn a_warning_when_a_running_instance_stops_running_and_only_then() {
        let running = status_of(None, inst("Running"));
        for phase in ["Paused", "Halted", "Stopped", "Unknown", "Error"] {
            let next = status_of(Some(&running), inst(phase));
            let why = stopped_running(Some(&running), &next).unwrap_or_else(|| panic!("{phase}: a warning"));
            assert!(why.contains("Kairon Machine m1"), "{phase}: {why}");
        }
        let starting = status_of(None, inst("Starting"));
        assert_eq!(stopped_running(None, &starting), None, "nothing before");
        assert_eq!(
            stopped_running(Some(&starting), &running),
            None,
            "starting to run is no warning"
        );
        assert_eq!(stopped_running(Some(&running), &running), None, "still running");
        let paused = status_of(Some(&running), inst("Paused"));
        assert_eq!(
            stopped_running(Some(&paused), &status_of(Some(&paused), inst("Halted"))),
            None,
            "once, when it stops running"
        );
        let gone = status_of(Some(&running), Observed::Gone);
        assert_eq!(
            stopped_running(Some(&running), &gone),
            None,
            "gone has an event of its own"
        );
    }

    /// A VM whose Kairon node Kairon reports unreachable, then fenced: one Warning of its own
    /// per transition, and none while it stays so.
    #[test]
    fn a_warning_of_its_own_when_kairon_loses_the_node_or_fences_the_machine() {
        let cond = |type_: &str, at: i64| k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: type_.into(),
            status: "True".into(),
            reason: "R".into(),
            message: "m".into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::from_second(at).unwrap()),
            observed_generation: None,
        };
        let running = status_of(None, inst("Running"));
        let mut lost = vm(Some("Running"));
        lost.status.as_mut().unwrap().conditions = Some(vec![cond("NodeUnreachable", 10)]);
        let unreachable = status_of(Some(&running), Observed::Instance(Box::new(lost.clone())));
        let (r, note) = lost_node(Some(&running), &unreachable).expect("a warning");
        assert_eq!(r, event::INSTANCE_HOST_UNREACHABLE);
        assert!(note.contains("kairon-node-7"), "{note}");
        assert_eq!(lost_node(Some(&unreachable), &unreachable), None, "once");

        let mut fenced = vm(Some("Pending"));
        fenced.status.as_mut().unwrap().conditions = Some(vec![cond("NodeUnreachable", 10), cond("Fenced", 20)]);
        let next = status_of(Some(&unreachable), Observed::Instance(Box::new(fenced)));
        assert_eq!(
            lost_node(Some(&unreachable), &next).map(|(r, _)| r),
            Some(event::INSTANCE_FENCED)
        );
        assert_eq!(lost_node(Some(&running), &running), None);
    }
}
