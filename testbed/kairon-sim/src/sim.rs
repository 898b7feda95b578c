//! The phase machine of a simulated kairon-controller, as pure functions: given a Machine and
//! whether the timer of its current phase has run out, what to do next; and the statuses each
//! transition writes. No I/O here; the engine feeds objects in and carries steps out.

use std::fmt;
use std::time::Duration;

use capkr::kairon::{Machine, MachineStatus, phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::network::{Reported, SLIRP_GUEST_ADDRESS, reports_address};

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
    /// Finish booting: `Running` (with the guest's address where Kairon reports one), or
    /// `Error` (forced or random), which is tried again after another boot delay, as
    /// kairon-node retries a failed reconcile.
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
    let wanted = desired_power(m);
    // As kairon-controller: a Machine never scheduled and asked to be Stopped or Halted is
    // left alone (no node, so no kairon-node adds its finalizer or writes a status) until it
    // is asked to run.
    if never_scheduled(m) && matches!(wanted, power::STOPPED | power::HALTED) {
        return Step::Wait;
    }
    if !has_finalizer(m) {
        return Step::AddFinalizer;
    }
    match phase_of(m) {
        None => Step::Accept,
        Some(phase::PENDING) if due => Step::Place,
        Some(phase::STARTING | phase::ERROR) if due => Step::Boot,
        Some(phase::RUNNING) if forced_failure(m).is_some() => Step::Fail,
        // The old model's host maintenance stops a VM at its evacuation deadline for good
        // (`crate::evacuation`); it is not powered on again.
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

/// No host chosen yet: no phase, or `Pending` without a node.
fn never_scheduled(m: &Machine) -> bool {
    match phase_of(m) {
        None => true,
        Some(phase::PENDING) => m.status.as_ref().and_then(|s| s.node_name.as_deref()).is_none(),
        Some(_) => false,
    }
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

/// The runtime a status names, if any.
pub fn status_runtime(status: Option<&MachineStatus>) -> Option<&str> {
    status.and_then(|s| s.runtime_id.as_deref()).filter(|r| !r.is_empty())
}

/// Whether `step` makes `m` a new runtime, which FluxVM seeds from `spec.cloudInit` as it is
/// then: placing it, or running it again after Stopped deleted its runtime and disk (and so
/// after a cold migration). Resuming a Paused one and starting a Halted one keep the runtime,
/// its disk and the seed it was made with.
pub fn creates_runtime(step: &Step, m: &Machine) -> bool {
    match step {
        Step::Place => true,
        Step::PowerOn => phase_of(m) != Some(phase::PAUSED) && status_runtime(m.status.as_ref()).is_none(),
        _ => false,
    }
}

/// Placed on `host`: the VM's runtime is created there (`runtime_id`, new for every runtime).
/// The merge patch with which kairon-controller binds a Machine to `node`.
pub fn binding(node: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"labels": {capkr::kairon::maintenance::ASSIGNED_NODE_LABEL: node}},
        "spec": {"nodeName": node},
    })
}

pub fn starting_status(m: &Machine, host: &str, runtime_id: String) -> MachineStatus {
    let mut status = base_status(m);
    status.phase = Some(phase::STARTING.to_string());
    status.node_name = Some(host.to_string());
    status.runtime_id = Some(runtime_id);
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

/// Booted, with `address` its own (the pool's). `guestIP`/`guestIPs` say only what Kairon
/// would know of it ([`reports_address`]): the address itself, slirp's for a user-mode guest
/// with the guest agent, or nothing.
pub fn running_status(m: &Machine, address: &str, now: Timestamp) -> MachineStatus {
    let mut status = base_status(m);
    status.phase = Some(phase::RUNNING.to_string());
    let reported = match reports_address(&m.spec) {
        Reported::Own => Some(address),
        Reported::SlirpAddress => Some(SLIRP_GUEST_ADDRESS),
        Reported::None => None,
    };
    status.guest_ip = reported.map(str::to_string);
    status.guest_ips = reported.map(|a| vec![a.to_string()]);
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
#[path = "sim_tests.rs"]
mod tests;
