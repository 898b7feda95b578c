//! The phase machine of a simulated kairon-controller, as pure functions: given a Machine and
//! whether the timer of its current phase has run out, what to do next; and the statuses each
//! transition writes. No I/O here; the engine feeds objects in and carries steps out.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use capkr::kairon::{Machine, MachineStatus, phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// kairon-node's finalizer (`internal/agent/agent.go`): the VM is torn down before the
/// Machine goes away.
pub const FINALIZER: &str = "kairon.zyvor.dev/runtime-cleanup";
/// Makes the VM fail as FluxVM reports a failed runtime: a running Machine goes to Kairon's
/// `Unknown` (its guest dies, and Kairon does not restart it); a booting one goes to `Error`
/// with the annotation's value in `status.message`, retried as Kairon retries a failed
/// reconcile, for as long as the annotation is there.
pub const FAIL_ANNOTATION: &str = "sim.kairon.zyvor.dev/fail";
/// `"false"` makes the guest's Node NotReady; absent or `"true"` keeps it Ready.
pub const NODE_READY_ANNOTATION: &str = "sim.kairon.zyvor.dev/node-ready";
/// Field manager of every write the simulator makes.
pub const FIELD_MANAGER: &str = "kairon-sim";

pub const REASON_UNSCHEDULABLE: &str = "Unschedulable";

pub const CONDITION_SCHEDULED: &str = "Scheduled";
/// kairon-node's condition on every Machine it reconciles (`internal/agent/agent.go`): True
/// only while the phase is Running; reason `FluxVMReconciled` after a clean reconcile,
/// `ReconcileFailed` (with the error as message) after a failed one, `PoweredOff`, `Paused` or
/// `Halted` for the power states short of Running.
pub const CONDITION_READY: &str = "Ready";
pub const REASON_RECONCILED: &str = "FluxVMReconciled";
pub const REASON_RECONCILE_FAILED: &str = "ReconcileFailed";

/// `spec.powerState` as the simulator reads it: absent is the schema's default, Running.
pub mod power {
    pub const RUNNING: &str = "Running";
    pub const PAUSED: &str = "Paused";
    pub const HALTED: &str = "Halted";
    pub const STOPPED: &str = "Stopped";
}

/// A Machine's identity in the simulator's books.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn of(m: &Machine) -> Self {
        Self {
            namespace: m.namespace().unwrap_or_default(),
            name: m.name_any(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The phases that end after a (jittered) delay, and the delay that applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// Pending → Starting.
    Provision,
    /// Starting → Running, and Error → another try.
    Boot,
    /// Terminating → finalizer removed.
    Delete,
}

#[derive(Clone, Copy, Debug)]
pub struct Delays {
    pub provision: Duration,
    pub boot: Duration,
    pub delete: Duration,
    /// ± this fraction of each delay, drawn uniformly.
    pub jitter: f64,
}

impl Delays {
    pub fn of(&self, clock: Clock) -> Duration {
        match clock {
            Clock::Provision => self.provision,
            Clock::Boot => self.boot,
            Clock::Delete => self.delete,
        }
    }

    /// The delay for `clock` with jitter applied; `roll` is uniform in `[0, 1)`.
    pub fn jittered(&self, clock: Clock, roll: f64) -> Duration {
        jittered(self.of(clock), self.jitter, roll)
    }
}

/// `base` scaled by a factor in `[1 - fraction, 1 + fraction]`, chosen by `roll` in `[0, 1)`.
pub fn jittered(base: Duration, fraction: f64, roll: f64) -> Duration {
    let factor = 1.0 + fraction * (2.0 * roll - 1.0);
    base.mul_f64(factor.max(0.0))
}

/// Which timer runs for the Machine as it is now, if any.
pub fn clock_of(m: &Machine) -> Option<Clock> {
    if m.metadata.deletion_timestamp.is_some() {
        return has_finalizer(m).then_some(Clock::Delete);
    }
    match phase_of(m) {
        Some(phase::PENDING) => Some(Clock::Provision),
        Some(phase::STARTING | phase::ERROR) => Some(Clock::Boot),
        _ => None,
    }
}

/// What the simulated controller does next with a Machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing until the object changes or its timer runs out.
    Wait,
    /// Add the `runtime-cleanup` finalizer (before anything else, so no VM can leak).
    AddFinalizer,
    /// Accept the Machine: `Pending`.
    Accept,
    /// Choose a host: `Starting` with a new runtime there, or, as kairon-controller,
    /// stay `Pending` with `Scheduled=False` (`Unschedulable`) and try again later.
    Place,
    /// Finish booting: `Running` with the guest's address, or `Error` (forced or random), which
    /// is tried again after another boot delay, as kairon-node retries a failed reconcile.
    Boot,
    /// A running Machine was told to fail by annotation: FluxVM reports the runtime failed,
    /// which Kairon shows as phase `Unknown` and does not repair.
    Fail,
    /// `spec.powerState` asks for this state (Paused, Halted or Stopped) and the VM is not in
    /// it.
    PowerOff(&'static str),
    /// `spec.powerState` is Running again and the VM is Paused (resumed in place), Halted
    /// (started again on its kept disk) or Stopped (created again: a new runtime on a fresh
    /// disk).
    PowerOn,
    /// The VM is gone: remove the Node (if any) and then the finalizer.
    ReleaseFinalizer,
}

/// The phase machine. `due` says whether the timer of the Machine's current [`Clock`] has run
/// out. Derived only from the object, so it picks up where it was after a restart.
pub fn next_step(m: &Machine, due: bool) -> Step {
    if m.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(m) {
            return Step::Wait;
        }
        // As kairon-node: the Machine keeps its last phase while the VM is torn down.
        return if due { Step::ReleaseFinalizer } else { Step::Wait };
    }
    if !has_finalizer(m) {
        return Step::AddFinalizer;
    }
    let wanted = desired_power(m);
    match phase_of(m) {
        None => Step::Accept,
        Some(phase::PENDING) if due => Step::Place,
        Some(phase::STARTING | phase::ERROR) if due => Step::Boot,
        Some(phase::RUNNING) if forced_failure(m).is_some() => Step::Fail,
        // The old model's host maintenance stops a VM at its evacuation deadline for good
        // (`crate::evacuation`); it is not powered on again.
        Some(phase::STOPPED) if stopped_at_deadline(m) => Step::Wait,
        Some(p @ (phase::RUNNING | phase::PAUSED | phase::HALTED | phase::STOPPED)) => {
            if wanted == power::RUNNING {
                if p == phase::RUNNING { Step::Wait } else { Step::PowerOn }
            } else if p == wanted {
                Step::Wait
            } else {
                Step::PowerOff(wanted)
            }
        }
        _ => Step::Wait,
    }
}

fn stopped_at_deadline(m: &Machine) -> bool {
    m.status.as_ref().and_then(|s| s.reason.as_deref()) == Some(phase::EVACUATION_DEADLINE_EXCEEDED)
}

/// `spec.powerState`, with anything but Paused, Halted and Stopped read as Running.
pub fn desired_power(m: &Machine) -> &'static str {
    match m.spec.power_state.as_deref() {
        Some(power::PAUSED) => power::PAUSED,
        Some(power::HALTED) => power::HALTED,
        Some(power::STOPPED) => power::STOPPED,
        _ => power::RUNNING,
    }
}

/// How booting ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootOutcome {
    Running,
    /// kairon-node's reconcile failed with this error: phase `Error`, retried.
    Error(String),
}

/// A forced failure wins; otherwise the boot fails with probability `failure_rate` (`roll`
/// uniform in `[0, 1)`), and each retry rolls again.
pub fn boot_outcome(m: &Machine, failure_rate: f64, roll: f64) -> BootOutcome {
    if let Some(reason) = forced_failure(m) {
        return BootOutcome::Error(format!("create runtime: {reason} (forced by {FAIL_ANNOTATION})"));
    }
    if roll < failure_rate {
        return BootOutcome::Error("create runtime: simulated failure (--failure-rate)".to_string());
    }
    BootOutcome::Running
}

pub fn has_finalizer(m: &Machine) -> bool {
    m.finalizers().iter().any(|f| f == FINALIZER)
}

pub fn phase_of(m: &Machine) -> Option<&str> {
    m.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .filter(|p| !p.is_empty())
}

/// The reason asked for by [`FAIL_ANNOTATION`], if any.
pub fn forced_failure(m: &Machine) -> Option<String> {
    m.annotations()
        .get(FAIL_ANNOTATION)
        .map(|r| r.trim())
        .filter(|r| !r.is_empty())
        .map(str::to_string)
}

/// Whether the guest's Node should be Ready, per [`NODE_READY_ANNOTATION`].
pub fn node_should_be_ready(m: &Machine) -> bool {
    m.annotations().get(NODE_READY_ANNOTATION).map(|v| v.trim()) != Some("false")
}

// --- statuses ---------------------------------------------------------------------------

fn base_status(m: &Machine) -> MachineStatus {
    m.status.clone().unwrap_or_default()
}

pub fn accepted_status(m: &Machine) -> MachineStatus {
    MachineStatus {
        phase: Some(phase::PENDING.to_string()),
        ..base_status(m)
    }
}

/// A fresh FluxVM VM id, as `status.runtimeID` carries it: a random UUID (version 4). Every
/// runtime gets its own; it names no Machine.
pub fn new_runtime_id() -> String {
    let a = fastrand::u64(..);
    let b = fastrand::u64(..);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

/// Placed on `host`: the VM's runtime is created there (`runtime_id`, new for every runtime).
pub fn starting_status(
    m: &Machine,
    host: &str,
    host_labels: Option<BTreeMap<String, String>>,
    runtime_id: String,
) -> MachineStatus {
    let mut status = base_status(m);
    status.phase = Some(phase::STARTING.to_string());
    status.node_name = Some(host.to_string());
    status.runtime_id = Some(runtime_id);
    status.host_labels = host_labels;
    // kairon-controller only ever writes Scheduled=False: one from an earlier attempt stays.
    status
}

/// Not placed, as kairon-controller leaves a Machine no node fits: still `Pending`, with
/// `Scheduled=False`, reason `Unschedulable` and why; it tries again later.
pub fn unschedulable_status(m: &Machine, message: &str, now: Timestamp) -> MachineStatus {
    let mut status = base_status(m);
    status.phase = Some(phase::PENDING.to_string());
    set_condition(
        &mut status,
        CONDITION_SCHEDULED,
        false,
        REASON_UNSCHEDULABLE,
        message,
        now,
    );
    status
}

pub fn running_status(m: &Machine, internal_ip: &str, now: Timestamp) -> MachineStatus {
    let mut status = base_status(m);
    status.phase = Some(phase::RUNNING.to_string());
    status.guest_ip = Some(internal_ip.to_string());
    status.guest_ips = Some(vec![internal_ip.to_string()]);
    status.message = None;
    set_condition(&mut status, CONDITION_READY, true, REASON_RECONCILED, "", now);
    status
}

/// kairon-node's reconcile of the Machine failed: phase `Error`, the error in `message` and in
/// `Ready=False ReconcileFailed`. Kairon tries again.
pub fn error_status(m: &Machine, error: &str, now: Timestamp) -> MachineStatus {
    let mut status = base_status(m);
    status.phase = Some(phase::ERROR.to_string());
    status.message = Some(error.to_string());
    set_condition(&mut status, CONDITION_READY, false, REASON_RECONCILE_FAILED, error, now);
    status
}

/// FluxVM reports the runtime in a state Kairon does not know (its `failed` among them): phase
/// `Unknown`; the reconcile itself was clean, so no message.
pub fn runtime_failed_status(m: &Machine, now: Timestamp) -> MachineStatus {
    let mut status = base_status(m);
    status.phase = Some(phase::UNKNOWN.to_string());
    status.message = None;
    set_condition(&mut status, CONDITION_READY, false, REASON_RECONCILED, "", now);
    status
}

/// The power state `wanted` (Paused, Halted or Stopped) took effect, as kairon-node writes
/// it: Paused keeps the runtime and its address; Halted keeps the runtime but not the address;
/// Stopped deletes the runtime (and its disk), so neither is left.
pub fn powered_off_status(m: &Machine, wanted: &str, now: Timestamp) -> MachineStatus {
    let mut status = base_status(m);
    status.message = None;
    let reason = match wanted {
        power::PAUSED => "Paused",
        power::HALTED => {
            status.guest_ip = None;
            status.guest_ips = None;
            "Halted"
        }
        _ => {
            status.runtime_id = None;
            status.guest_ip = None;
            status.guest_ips = None;
            "PoweredOff"
        }
    };
    status.phase = Some(wanted.to_string());
    set_condition(&mut status, CONDITION_READY, false, reason, "", now);
    status
}

/// Back to Running: a Paused VM resumes in place (`Running` at once); a Halted one starts
/// again on its kept runtime, a Stopped one gets a new runtime on the node it is assigned to
/// (`Starting` either way, then booted as any VM).
pub fn powered_on_status(m: &Machine, now: Timestamp) -> MachineStatus {
    let mut status = base_status(m);
    if phase_of(m) == Some(phase::PAUSED) {
        status.phase = Some(phase::RUNNING.to_string());
        set_condition(&mut status, CONDITION_READY, true, REASON_RECONCILED, "", now);
        return status;
    }
    status.phase = Some(phase::STARTING.to_string());
    if status.runtime_id.is_none() {
        status.runtime_id = Some(new_runtime_id());
    }
    status
}

/// Sets a metav1 condition; `lastTransitionTime` moves only when the status changes.
pub fn set_condition(
    status: &mut MachineStatus,
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let value = if value { "True" } else { "False" };
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let previous = conditions
        .iter()
        .position(|c| c.type_ == type_)
        .map(|i| conditions.remove(i));
    let last_transition_time = match previous {
        Some(c) if c.status == value => c.last_transition_time,
        _ => Time(now),
    };
    conditions.push(Condition {
        type_: type_.to_string(),
        status: value.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time,
        observed_generation: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn machine(phase: Option<&str>, finalizer: bool, deleting: bool, annotations: &[(&str, &str)]) -> Machine {
        Machine {
            metadata: ObjectMeta {
                name: Some("m".into()),
                namespace: Some("default".into()),
                uid: Some("uid-1".into()),
                finalizers: finalizer.then(|| vec![FINALIZER.to_string()]),
                deletion_timestamp: deleting.then_some(Time(Timestamp::UNIX_EPOCH)),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Default::default(),
            status: phase.map(|p| MachineStatus {
                phase: Some(p.to_string()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn phase_transitions() {
        let fail = [(FAIL_ANNOTATION, "ImageNotFound")];
        let with_power = |p: Option<&str>, power: &str| {
            let mut m = machine(p, true, false, &[]);
            m.spec.power_state = Some(power.to_string());
            m
        };
        #[rustfmt::skip]
        let cases: Vec<(&str, Machine, bool, Step)> = vec![
            ("new machine gets the finalizer first", machine(None, false, false, &[]), false, Step::AddFinalizer),
            ("finalizer lost is re-added", machine(Some(phase::RUNNING), false, false, &[]), false, Step::AddFinalizer),
            ("then it is accepted", machine(None, true, false, &[]), false, Step::Accept),
            ("empty phase counts as none", machine(Some(""), true, false, &[]), false, Step::Accept),
            ("pending waits for its timer", machine(Some(phase::PENDING), true, false, &[]), false, Step::Wait),
            ("pending is placed when due", machine(Some(phase::PENDING), true, false, &[]), true, Step::Place),
            ("starting waits", machine(Some(phase::STARTING), true, false, &[]), false, Step::Wait),
            ("starting boots when due", machine(Some(phase::STARTING), true, false, &[]), true, Step::Boot),
            ("forced failure waits for boot", machine(Some(phase::STARTING), true, false, &fail), false, Step::Wait),
            ("an error waits for its timer", machine(Some(phase::ERROR), true, false, &fail), false, Step::Wait),
            ("an error is retried when due", machine(Some(phase::ERROR), true, false, &fail), true, Step::Boot),
            ("running is steady", machine(Some(phase::RUNNING), true, false, &[]), true, Step::Wait),
            ("running with fail annotation: the runtime fails now", machine(Some(phase::RUNNING), true, false, &fail), false, Step::Fail),
            ("a failed runtime (Unknown) is not repaired", machine(Some(phase::UNKNOWN), true, false, &fail), true, Step::Wait),
            ("stopped with Running wanted is created again", machine(Some(phase::STOPPED), true, false, &[]), true, Step::PowerOn),
            ("running, Paused wanted", with_power(Some(phase::RUNNING), "Paused"), false, Step::PowerOff(power::PAUSED)),
            ("running, Halted wanted", with_power(Some(phase::RUNNING), "Halted"), false, Step::PowerOff(power::HALTED)),
            ("running, Stopped wanted", with_power(Some(phase::RUNNING), "Stopped"), false, Step::PowerOff(power::STOPPED)),
            ("paused, Halted wanted", with_power(Some(phase::PAUSED), "Halted"), false, Step::PowerOff(power::HALTED)),
            ("paused stays paused", with_power(Some(phase::PAUSED), "Paused"), true, Step::Wait),
            ("halted stays halted", with_power(Some(phase::HALTED), "Halted"), true, Step::Wait),
            ("paused, Running wanted: resumed", with_power(Some(phase::PAUSED), "Running"), false, Step::PowerOn),
            ("halted, Running wanted: started", with_power(Some(phase::HALTED), "Running"), false, Step::PowerOn),
            ("an unknown power state reads as Running", with_power(Some(phase::RUNNING), "Hibernate"), true, Step::Wait),
            ("deleted keeps its phase and waits", machine(Some(phase::RUNNING), true, true, &[]), false, Step::Wait),
            ("deleted releases when due", machine(Some(phase::RUNNING), true, true, &[]), true, Step::ReleaseFinalizer),
            ("deleted while pending too", machine(Some(phase::PENDING), true, true, &[]), true, Step::ReleaseFinalizer),
            ("deleted before acceptance", machine(None, true, true, &[]), false, Step::Wait),
            ("deleted before acceptance, when due", machine(None, true, true, &[]), true, Step::ReleaseFinalizer),
            ("deleted without our finalizer is left alone", machine(Some(phase::RUNNING), false, true, &[]), true, Step::Wait),
        ];
        for (name, m, due, want) in cases {
            assert_eq!(next_step(&m, due), want, "{name}");
        }
        let mut evacuated = machine(Some(phase::STOPPED), true, false, &[]);
        evacuated.status.as_mut().unwrap().reason = Some(phase::EVACUATION_DEADLINE_EXCEEDED.into());
        assert_eq!(
            next_step(&evacuated, true),
            Step::Wait,
            "stopped at the deadline stays stopped"
        );
    }

    #[test]
    fn power_states_write_what_kairon_node_writes() {
        let now = Timestamp::UNIX_EPOCH;
        let mut m = machine(Some(phase::RUNNING), true, false, &[]);
        let running = running_status(&m, "10.0.0.5", now);
        let runtime = Some("rt-1".to_string());
        m.status = Some(MachineStatus {
            runtime_id: runtime.clone(),
            ..running
        });
        let ready = |s: &MachineStatus| {
            let c = s
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == CONDITION_READY)
                .unwrap();
            (c.status.clone(), c.reason.clone())
        };

        let paused = powered_off_status(&m, power::PAUSED, now);
        assert_eq!(paused.phase.as_deref(), Some(phase::PAUSED));
        assert_eq!(
            (paused.runtime_id.clone(), paused.guest_ip.as_deref()),
            (runtime.clone(), Some("10.0.0.5"))
        );
        assert_eq!(ready(&paused), ("False".into(), "Paused".into()));
        let resumed = powered_on_status(
            &Machine {
                status: Some(paused),
                ..m.clone()
            },
            now,
        );
        assert_eq!(resumed.phase.as_deref(), Some(phase::RUNNING), "resumed in place");
        assert_eq!(ready(&resumed), ("True".into(), REASON_RECONCILED.into()));

        let halted = powered_off_status(&m, power::HALTED, now);
        assert_eq!(
            (halted.runtime_id.clone(), halted.guest_ip.clone()),
            (runtime.clone(), None)
        );
        assert_eq!(ready(&halted), ("False".into(), "Halted".into()));
        let started = powered_on_status(
            &Machine {
                status: Some(halted),
                ..m.clone()
            },
            now,
        );
        assert_eq!(started.phase.as_deref(), Some(phase::STARTING));
        assert_eq!(started.runtime_id, runtime, "started again on its kept runtime");

        let stopped = powered_off_status(&m, power::STOPPED, now);
        assert_eq!(
            (
                stopped.runtime_id.clone(),
                stopped.guest_ip.clone(),
                stopped.guest_ips.clone()
            ),
            (None, None, None)
        );
        assert_eq!(ready(&stopped), ("False".into(), "PoweredOff".into()));
        let created = powered_on_status(
            &Machine {
                status: Some(stopped),
                ..m.clone()
            },
            now,
        );
        assert_eq!(created.phase.as_deref(), Some(phase::STARTING));
        assert!(
            created.runtime_id.is_some() && created.runtime_id != runtime,
            "a new runtime"
        );

        let failed = runtime_failed_status(&m, now);
        assert_eq!(failed.phase.as_deref(), Some(phase::UNKNOWN));
        assert_eq!(failed.message, None, "the reconcile itself was clean");
        let error = error_status(&m, "create runtime: disk full", now);
        assert_eq!(error.phase.as_deref(), Some(phase::ERROR));
        assert_eq!(error.message.as_deref(), Some("create runtime: disk full"));
        assert_eq!(ready(&error), ("False".into(), REASON_RECONCILE_FAILED.into()));
        let recovered = running_status(
            &Machine {
                status: Some(error),
                ..m.clone()
            },
            "10.0.0.5",
            now,
        );
        assert_eq!(recovered.message, None, "a clean reconcile clears the message");
    }

    #[test]
    fn clocks_follow_phase() {
        assert_eq!(
            clock_of(&machine(Some(phase::PENDING), true, false, &[])),
            Some(Clock::Provision)
        );
        assert_eq!(
            clock_of(&machine(Some(phase::STARTING), true, false, &[])),
            Some(Clock::Boot)
        );
        assert_eq!(clock_of(&machine(Some(phase::RUNNING), true, false, &[])), None);
        assert_eq!(
            clock_of(&machine(Some(phase::RUNNING), true, true, &[])),
            Some(Clock::Delete)
        );
        assert_eq!(clock_of(&machine(Some(phase::RUNNING), false, true, &[])), None);
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let base = Duration::from_secs(10);
        let cases = [
            (0.2, 0.0, Duration::from_secs(8)),
            (0.2, 0.5, Duration::from_secs(10)),
            (0.2, 0.999_999, Duration::from_secs(12)),
            (0.0, 0.9, Duration::from_secs(10)),
            (1.0, 0.0, Duration::ZERO),
        ];
        for (fraction, roll, want) in cases {
            let got = jittered(base, fraction, roll);
            assert!(
                got.abs_diff(want) < Duration::from_millis(1),
                "{fraction} {roll}: {got:?}"
            );
        }
        for _ in 0..1000 {
            let got = jittered(base, 0.2, fastrand::f64());
            assert!(
                (Duration::from_secs(8)..=Duration::from_secs(12)).contains(&got),
                "{got:?}"
            );
        }
        assert_eq!(jittered(Duration::ZERO, 0.5, 0.7), Duration::ZERO);
    }

    #[test]
    fn boot_outcomes() {
        let plain = machine(Some(phase::STARTING), true, false, &[]);
        let forced = machine(Some(phase::STARTING), true, false, &[(FAIL_ANNOTATION, "DiskFull")]);
        assert_eq!(boot_outcome(&plain, 0.0, 0.0), BootOutcome::Running);
        assert_eq!(boot_outcome(&plain, 0.5, 0.7), BootOutcome::Running);
        assert!(matches!(boot_outcome(&plain, 0.5, 0.3), BootOutcome::Error(e) if e.contains("--failure-rate")));
        assert!(matches!(boot_outcome(&forced, 0.0, 0.9), BootOutcome::Error(e) if e.contains("DiskFull")));
    }

    #[test]
    fn node_ready_annotation() {
        assert!(node_should_be_ready(&machine(None, true, false, &[])));
        assert!(node_should_be_ready(&machine(
            None,
            true,
            false,
            &[(NODE_READY_ANNOTATION, "true")]
        )));
        assert!(!node_should_be_ready(&machine(
            None,
            true,
            false,
            &[(NODE_READY_ANNOTATION, "false")]
        )));
    }

    #[test]
    fn statuses_carry_what_each_phase_promises() {
        let now = Timestamp::UNIX_EPOCH;
        let m = machine(None, true, false, &[]);
        let accepted = accepted_status(&m);
        assert_eq!(accepted.phase.as_deref(), Some(phase::PENDING));
        assert_eq!(accepted.runtime_id, None, "no runtime before the VM is placed");

        let m = Machine {
            status: Some(accepted),
            ..m
        };
        let labels: BTreeMap<String, String> = [("zone".to_string(), "b".to_string())].into();
        let provisioning = starting_status(&m, "kairon-node-2", Some(labels.clone()), "rt-1".into());
        assert_eq!(provisioning.node_name.as_deref(), Some("kairon-node-2"));
        assert_eq!(provisioning.host_labels, Some(labels));
        assert_eq!(provisioning.runtime_id.as_deref(), Some("rt-1"));

        let m = Machine {
            status: Some(provisioning),
            ..m
        };
        let running = running_status(&m, "10.42.0.7", now);
        assert_eq!(running.phase.as_deref(), Some(phase::RUNNING));
        assert_eq!(running.guest_ip.as_deref(), Some("10.42.0.7"));
        assert_eq!(running.guest_ips, Some(vec!["10.42.0.7".to_string()]));
        assert_eq!(running.runtime_id.as_deref(), Some("rt-1"), "the same runtime boots");
        let types: BTreeMap<String, String> = running
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect();
        assert_eq!(
            types.get(CONDITION_SCHEDULED),
            None,
            "Kairon never writes Scheduled=True"
        );
        assert_eq!(types.get(CONDITION_READY).map(String::as_str), Some("True"));
    }

    #[test]
    fn every_runtime_gets_a_fresh_id() {
        let ids: std::collections::BTreeSet<String> = (0..100).map(|_| new_runtime_id()).collect();
        assert_eq!(ids.len(), 100);
        for id in &ids {
            let groups: Vec<usize> = id.split('-').map(str::len).collect();
            assert_eq!(groups, [8, 4, 4, 4, 12], "{id}");
            assert!(id.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()), "{id}");
        }
    }

    #[test]
    fn condition_transition_time_moves_only_on_change() {
        let t0 = Timestamp::UNIX_EPOCH;
        let t1 = Timestamp::from_second(100).unwrap();
        let mut status = MachineStatus::default();
        set_condition(&mut status, CONDITION_READY, true, REASON_RECONCILED, "", t0);
        set_condition(&mut status, CONDITION_READY, true, REASON_RECONCILED, "again", t1);
        let c = &status.conditions.as_ref().unwrap()[0];
        assert_eq!((c.last_transition_time.0, c.message.as_str()), (t0, "again"));
        set_condition(&mut status, CONDITION_READY, false, REASON_RECONCILE_FAILED, "", t1);
        let c = &status.conditions.as_ref().unwrap()[0];
        assert_eq!(c.last_transition_time.0, t1);
        assert_eq!(status.conditions.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn an_unschedulable_machine_stays_pending_and_says_why_and_the_false_stays_once_placed() {
        let now = Timestamp::UNIX_EPOCH;
        let m = machine(Some(phase::PENDING), true, false, &[]);
        let waiting = unschedulable_status(&m, "no host matches nodeSelector {zone=z}", now);
        assert_eq!(waiting.phase.as_deref(), Some(phase::PENDING));
        assert_eq!(waiting.reason, None, "not a failure");
        let c = &waiting.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            (CONDITION_SCHEDULED, "False", REASON_UNSCHEDULABLE)
        );
        assert_eq!(c.message, "no host matches nodeSelector {zone=z}");
        assert_eq!(
            next_step(
                &Machine {
                    status: Some(waiting.clone()),
                    ..m.clone()
                },
                true
            ),
            Step::Place
        );
        let placed = starting_status(
            &Machine {
                status: Some(waiting),
                ..m
            },
            "h1",
            None,
            "rt".into(),
        );
        assert_eq!(placed.conditions.unwrap()[0].status, "False", "as Kairon leaves it");
    }
}
