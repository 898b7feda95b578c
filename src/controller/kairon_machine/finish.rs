//! How every KaironMachine reconcile ends: each path returns an [`Outcome`] (what it observed,
//! what to do next) and [`finish`] writes the status that follows, if it differs, then tells
//! what the write changed (events, the provisioning-time metric, host maintenance's reports).
//! The one place a KaironMachine's status is written, for the reconcile and for its deadline
//! ([`super::deadline`]), as CAPI's Machine controller patches once on the way out.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::context::{Context, Target};
use super::evacuate;
use super::status::{Observed, StatusInput, next_status};
use crate::api::conditions::{self, Decided, INSTANCE_PROVISIONED, reason};
use crate::api::{KaironMachine, KaironMachineStatus};
use crate::controller::error::Error;
use crate::events::reason as event;

/// How a reconcile ends: the status it observed, if any, and its result.
pub(super) struct Outcome {
    pub report: Option<Report>,
    pub result: Result<Action, Error>,
}

impl Outcome {
    /// Nothing to write.
    pub fn done(action: Action) -> Self {
        Outcome {
            report: None,
            result: Ok(action),
        }
    }

    /// `report` to write, then `action`.
    pub fn report(report: Report, action: Action) -> Self {
        Outcome {
            report: Some(report),
            result: Ok(action),
        }
    }
}

/// What a reconcile observed of its KaironMachine, for [`finish`] to write.
pub(super) struct Report {
    /// The KaironMachine as the reconcile last knew it (its own writes included).
    pub km: Arc<KaironMachine>,
    pub seen: Seen,
    /// The Kairon API its VM was seen on: recorded with the instance.
    pub target: Option<Target>,
    /// Conditions decided besides the instance's (host maintenance).
    pub extra: Vec<Decided>,
    pub then: Then,
}

impl Report {
    pub fn new(km: Arc<KaironMachine>, seen: Seen) -> Self {
        Report {
            km,
            seen,
            target: None,
            extra: vec![],
            then: Then::Nothing,
        }
    }

    pub fn on(mut self, target: Target) -> Self {
        self.target = Some(target);
        self
    }

    pub fn with(mut self, extra: Vec<Decided>) -> Self {
        self.extra = extra;
        self
    }

    pub fn then(mut self, then: Then) -> Self {
        self.then = then;
        self
    }
}

/// The state a status follows from ([`StatusInput`], owned).
pub(super) enum Seen {
    /// Paused, for this reason.
    Paused(&'static str),
    /// Not paused, not deleted: the instance as observed.
    Live(Observed),
    /// Being deleted.
    Deleting(Observed),
}

impl Seen {
    fn input(&self) -> StatusInput<'_> {
        match self {
            Seen::Paused(why) => StatusInput::Paused(why),
            Seen::Live(o) => StatusInput::Live(o),
            Seen::Deleting(o) => StatusInput::Deleting(o),
        }
    }
}

/// What to tell once the status is written, if the write changed it.
pub(super) enum Then {
    Nothing,
    /// Provisioned, lost node, stopped running, failed; host maintenance's reports.
    Transitions,
    /// A create Kairon rejected, in these words: a Warning when it first happens.
    CreateFailed(String),
}

/// Writes what the reconcile observed and returns its result.
pub(super) async fn finish(ctx: &Context, outcome: Outcome) -> Result<Action, Error> {
    if let Some(report) = outcome.report {
        record(ctx, report).await?;
    }
    outcome.result
}

/// Writes the status that follows from the report, if it differs; with the report's target,
/// the identity and endpoint holding the VM are recorded. Then what the write changed is told.
async fn record(ctx: &Context, report: Report) -> Result<(), Error> {
    let km = report.km.as_ref();
    let input = report.seen.input();
    let now = conditions::now();
    let mut next = next_status(km.status.as_ref(), input, km.metadata.generation, &now);
    if !report.extra.is_empty() {
        let conds = next.conditions.get_or_insert_with(Vec::new);
        for d in &report.extra {
            conditions::set(conds, d.clone(), km.metadata.generation, &now);
        }
    }
    // Only a VM seen on the target's Kairon API records it: a status kept while the VM is
    // elsewhere keeps the endpoint that holds it.
    let seen = matches!(
        input,
        StatusInput::Live(Observed::Instance(_) | Observed::InstanceWithoutNode(_))
            | StatusInput::Deleting(Observed::Instance(_) | Observed::InstanceWithoutNode(_))
    );
    if let (Some(target), Some(instance), true) = (report.target.as_ref(), next.instance.as_mut(), seen) {
        instance.identity_ref = target.identity.clone();
        instance.endpoint = target.endpoint.clone();
    }
    let ns = km.namespace().ok_or(Error::MissingNamespace)?;
    if !ctx.writer(&ns).apply_status(km, km.status.as_ref(), &next).await? {
        return Ok(());
    }
    match report.then {
        Then::Nothing => {}
        Then::Transitions => {
            report_transitions(km, &next, ctx).await;
            evacuate::report(km, &next, ctx).await;
        }
        Then::CreateFailed(why) => {
            ctx.events
                .warning(km, event::INSTANCE_CREATE_FAILED, "Create", why)
                .await;
        }
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
        // The one event of a happy path's bringing-up (the creation has none): it names the
        // Kairon Machine made, wherever it is (a tenant's namespace), and its host.
        let note = match next.instance.as_ref() {
            Some(i) => {
                let on = i.host.as_deref().map(|h| format!(" on host {h}")).unwrap_or_default();
                format!("Kairon Machine {}/{} is running{on}", i.namespace, i.name)
            }
            None => format!("Kairon Machine {} is running", km.name_any()),
        };
        ctx.events
            .normal(km, event::INSTANCE_PROVISIONED, "Provision", note)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kairon::fixtures::vm;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn inst(phase: &str) -> Observed {
        Observed::Instance(Box::new(crate::kairon::Vm::from(vm(Some(phase)))))
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
        let unreachable = status_of(
            Some(&running),
            Observed::Instance(Box::new(crate::kairon::Vm::from(lost.clone()))),
        );
        let (r, note) = lost_node(Some(&running), &unreachable).expect("a warning");
        assert_eq!(r, event::INSTANCE_HOST_UNREACHABLE);
        assert!(note.contains("kairon-node-7"), "{note}");
        assert_eq!(lost_node(Some(&unreachable), &unreachable), None, "once");

        let mut fenced = vm(Some("Pending"));
        fenced.status.as_mut().unwrap().conditions = Some(vec![cond("NodeUnreachable", 10), cond("Fenced", 20)]);
        let next = status_of(
            Some(&unreachable),
            Observed::Instance(Box::new(crate::kairon::Vm::from(fenced))),
        );
        assert_eq!(
            lost_node(Some(&unreachable), &next).map(|(r, _)| r),
            Some(event::INSTANCE_FENCED)
        );
        assert_eq!(lost_node(Some(&running), &running), None);
    }
}
