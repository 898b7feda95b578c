//! What a Kairon Machine means for its KaironMachine. Pure: no I/O.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use super::{FAILURE_DOMAIN_ANNOTATION, Owner, Vm, labels, phase};
use crate::api::conditions::{Decided, INSTANCE_PROVISIONED, Status, reason};
use crate::api::{InstanceRef, KaironMachine, MachineAddress};
use crate::text::bounded;

pub use super::ownership::{Holder, Ownership};

/// Bounds for what Kairon reports in free text, before it reaches our status (whose CRD limits
/// a write must respect, or every status write fails) and our events (events.k8s.io rejects
/// notes over 1 KiB, and the event is then lost).
const MAX_KAIRON_REASON: usize = 64;
const MAX_KAIRON_MESSAGE: usize = 512;
/// `status.addresses` holds at most this many (CRD `maxItems`), each at most 256 characters.
const MAX_ADDRESSES: usize = 256;
const MAX_ADDRESS: usize = 256;
/// `status.failureDomain` is at most this long (CRD `maxLength`).
const MAX_FAILURE_DOMAIN: usize = 256;
/// What `status.instance` repeats of a Kairon Machine: its name, namespace and UID (an object
/// name is at most 253 characters; a tenant's API server may send anything), its phase and its
/// host (a DNS name, at most 253).
const MAX_NAME: usize = 253;
const MAX_PHASE: usize = 64;

/// Decides whether `vm` belongs to `km`, for the manager speaking for management cluster
/// `owner`.
///
/// `spec.providerID` can be set by whoever creates a KaironMachine, so it alone proves
/// nothing: a VM it names is this KaironMachine's only when this management cluster (or one it
/// adopts from) labelled it as its own. A plain Kairon VM, or another installation's, is never
/// adopted and never deleted through a providerID.
///
/// A member of a Kairon MachineSet is that set's: Kairon replaces it, or deletes it undrained
/// when the set's template changes (or its hash does, on a Kairon upgrade), so no KaironMachine
/// claims it.
pub(crate) fn ownership(vm: &Vm, km: &KaironMachine, owner: &Owner) -> Ownership {
    if let Some(set) = vm.label(labels::KAIRON_MACHINESET) {
        return Ownership::Foreign(format!(
            "it is a member of Kairon MachineSet {}, which Kairon replaces and deletes by itself",
            crate::text::bounded(set, 63)
        ));
    }
    let uid_label = vm.label(labels::KAIRONMACHINE_UID);
    if uid_label.is_some() && uid_label == km.metadata.uid.as_deref() {
        return Ownership::Ours;
    }
    let named = match (km.spec.provider_id.as_deref(), vm.metadata.uid.as_deref()) {
        (Some(pid), Some(_)) => super::names_instance(pid, vm),
        _ => false,
    };
    if !named {
        return Ownership::Foreign(match uid_label {
            Some(_) => "its labels name another KaironMachine".into(),
            None => "no label names this KaironMachine and spec.providerID does not name it".into(),
        });
    }
    if let Err(why) = owner.may_adopt(vm.label(labels::MANAGEMENT_CLUSTER)) {
        return Ownership::Foreign(why);
    }
    Ownership::OursBeforeMove { holder: holder(vm) }
}

/// The KaironMachine `vm`'s labels name, if they name one by UID: the inverse of the labels
/// [`super::desired_kairon_machine`] writes.
pub(crate) fn holder(vm: &Vm) -> Option<Holder> {
    let uid = vm.label(labels::KAIRONMACHINE_UID)?;
    Some(Holder {
        namespace: vm
            .label(labels::KAIRONMACHINE_NAMESPACE)
            .map(str::to_string)
            .or_else(|| vm.namespace())
            .unwrap_or_default(),
        name: vm
            .label(labels::KAIRONMACHINE_NAME)
            .map_or_else(|| vm.name_any(), str::to_string),
        uid: uid.to_string(),
    })
}

/// The phase, with a missing one read as Pending and a deleted Machine as Terminating.
pub(crate) fn effective_phase(vm: &Vm) -> &str {
    if vm.metadata.deletion_timestamp.is_some() {
        return phase::TERMINATING;
    }
    vm.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or(phase::PENDING)
}

/// Whether the VM runs.
pub(crate) fn is_running(vm: &Vm) -> bool {
    effective_phase(vm) == phase::RUNNING
}

/// The `InstanceProvisioned` condition for the VM's current phase.
pub(crate) fn instance_condition(vm: &Vm) -> Decided {
    let name = bounded(&vm.name_any(), MAX_NAME);
    if effective_phase(vm) == phase::UNREADABLE {
        let why = vm
            .status
            .as_ref()
            .and_then(|s| s.message.as_deref())
            .unwrap_or_default();
        return Decided::new(
            INSTANCE_PROVISIONED,
            Status::Unknown,
            reason::INSTANCE_UNREADABLE,
            format!("Kairon Machine {name} could not be read: {why}"),
        );
    }
    if let Some(lost) = node_lost(vm) {
        return lost;
    }
    // A runtime Kairon made anew on a fresh disk, after the one the bootstrap data ran in was
    // deleted (Stopped, a cold migration): a new machine under the old name, never this one
    // again, whatever its phase. Not Ready, so that a MachineHealthCheck replaces it.
    if effective_phase(vm) != phase::TERMINATING && super::bootstrap_runtime::is_recreated(vm) {
        return Decided::new(
            INSTANCE_PROVISIONED,
            Status::False,
            reason::INSTANCE_RECREATED,
            format!(
                "Kairon Machine {name} runs on a new runtime on a fresh disk (Kairon made it after deleting the runtime the bootstrap data ran in: powerState Stopped, a cold migration, or a fence): it is not the machine that was bootstrapped, and is left for a MachineHealthCheck to replace"
            ),
        );
    }
    let not_scheduled = not_scheduled(vm);
    let (status, r, message) = match effective_phase(vm) {
        phase::RUNNING => (
            Status::True,
            reason::PROVISIONED,
            format!("Kairon Machine {name} is running"),
        ),
        // One state for the KaironMachine: Kairon is bringing the machine up (see
        // `status_phase`).
        // Kairon's Starting, and Blocked (an incoming migration not yet arrived), are steps of
        // the same bringing-up.
        // Kairon says why it cannot place a Pending Machine (a False it leaves behind on a
        // Machine scheduled later is not read once the phase moves on).
        phase::PENDING if let Some(why) = &not_scheduled => (
            Status::False,
            reason::INSTANCE_NOT_SCHEDULED,
            format!("Kairon Machine {name} is not scheduled yet: {why}"),
        ),
        // Pending with a message and no Scheduled=False: Kairon holds the Machine before it
        // schedules it and says why (`internal/controller/machineimage.go`: the MachineImage
        // an imageRef names is missing, of the wrong kind or invalid). A typo in the image
        // name waits here, with Kairon's words, not as "being provisioned".
        phase::PENDING if let Some(why) = kairon_message(vm) => (
            Status::False,
            reason::INSTANCE_WAITING_ON_KAIRON,
            format!("Kairon Machine {name} is pending: {why}"),
        ),
        phase::PENDING | phase::STARTING | phase::BLOCKED => (
            Status::False,
            reason::INSTANCE_PROVISIONING,
            format!("Kairon Machine {name} is being provisioned"),
        ),
        // Kairon's power states short of Stopped: the VM is there but does not run.
        phase::PAUSED | phase::HALTED => (
            Status::False,
            reason::INSTANCE_STOPPED,
            format!(
                "Kairon Machine {name} is {}",
                if effective_phase(vm) == phase::PAUSED {
                    "paused"
                } else {
                    "halted"
                }
            ),
        ),
        // Kairon's Error is not terminal: Kairon retries the VM, and so the KaironMachine waits,
        // saying why.
        phase::ERROR => (
            Status::False,
            reason::INSTANCE_ERROR,
            match kairon_message(vm) {
                Some(m) => format!("Kairon Machine {name} reports an error, which Kairon retries: {m}"),
                None => format!("Kairon Machine {name} reports an error, which Kairon retries"),
            },
        ),
        phase::STOPPED => (
            Status::False,
            reason::INSTANCE_STOPPED,
            format!("Kairon Machine {name} is stopped"),
        ),
        phase::TERMINATING => (
            Status::False,
            reason::INSTANCE_TERMINATING,
            format!("Kairon Machine {name} is being deleted"),
        ),
        // The runtime is in a state Kairon does not know (FluxVM's `failed` among them): the VM
        // does not run and Kairon leaves it so. Not terminal for the KaironMachine either: a
        // MachineHealthCheck decides, from this condition or the Node.
        phase::UNKNOWN => (
            Status::False,
            reason::INSTANCE_STATE_UNKNOWN,
            match kairon_message(vm) {
                Some(m) => format!(
                    "Kairon Machine {name} is in phase Unknown (its runtime is in a state Kairon does not know, a failed one among them): {m}"
                ),
                None => format!(
                    "Kairon Machine {name} is in phase Unknown (its runtime is in a state Kairon does not know, a failed one among them)"
                ),
            },
        ),
        other => (
            Status::Unknown,
            reason::INSTANCE_PENDING,
            format!(
                "Kairon Machine {name} is in unknown phase {}",
                bounded(other, MAX_KAIRON_REASON)
            ),
        ),
    };
    Decided::new(INSTANCE_PROVISIONED, status, r, message)
}

/// The `InstanceProvisioned` condition of a running VM for which Kairon reports no address:
/// why, by its network, and the fix. False while its Machine has no Node (the cluster may
/// be unable to form on that network); True once a Node `joined` (the cluster formed, but
/// the Machine's addresses lack the VM's).
pub(crate) fn unaddressed_condition(vm: &Vm, joined: bool) -> Decided {
    let name = bounded(&vm.name_any(), MAX_NAME);
    let why = super::network::why_no_address(&vm.attachment);
    let (status, message) = match joined {
        false => (
            Status::False,
            format!(
                "Kairon Machine {name} is running but Kairon reports no address for it and no Node has joined: {why}"
            ),
        ),
        true => (
            Status::True,
            format!(
                "Kairon Machine {name} is running and its Node joined, but Kairon reports no address for it: {why}"
            ),
        ),
    };
    Decided::new(INSTANCE_PROVISIONED, status, reason::INSTANCE_ADDRESS_UNKNOWN, message)
}

/// Kairon's `Scheduled=False` as `reason: message` (bounded and cleaned as read), if any.
fn not_scheduled(vm: &Vm) -> Option<String> {
    let c = vm
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == super::KAIRON_SCHEDULED && c.status == "False")?;
    let reason = bounded(&c.reason, MAX_KAIRON_REASON);
    let message = bounded(&c.message, MAX_KAIRON_MESSAGE);
    Some(match (reason.trim().is_empty(), message.trim().is_empty()) {
        (false, false) => format!("{reason}: {message}"),
        (false, true) => reason,
        (true, false) => message,
        (true, true) => "Kairon reports Scheduled=False".into(),
    })
}

/// Kairon's `condition` on `vm` as read (only its shown status is kept, see
/// [`super::machine_from_value`]).
fn kairon_condition<'a>(vm: &'a Vm, type_: &str) -> Option<&'a Condition> {
    vm.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// `reason: message` of a condition of Kairon's, bounded and cleaned.
fn kairon_words(c: &Condition) -> String {
    let reason = bounded(&c.reason, MAX_KAIRON_REASON);
    let message = bounded(&c.message, MAX_KAIRON_MESSAGE);
    match (reason.trim().is_empty(), message.trim().is_empty()) {
        (false, false) => format!("{reason}: {message}"),
        (false, true) => reason,
        (true, _) => message,
    }
}

/// The instance when Kairon lost the VM's node: `NodeUnreachable=True` (kairon-controller
/// leaves the phase as it was and moves nothing, `internal/controller/fencing.go`), unless an
/// operator fenced the Machine since (`Fenced=True` as recent or newer: Kairon places it anew,
/// and the new VM is the instance once placed). A deleted Machine is left to the deletion.
pub(crate) fn node_lost(vm: &Vm) -> Option<Decided> {
    let phase = effective_phase(vm);
    if phase == phase::TERMINATING {
        return None;
    }
    let name = bounded(&vm.name_any(), MAX_NAME);
    let fenced = kairon_condition(vm, super::KAIRON_FENCED);
    let unreachable = kairon_condition(vm, super::KAIRON_NODE_UNREACHABLE)
        .filter(|u| fenced.is_none_or(|f| f.last_transition_time.0 < u.last_transition_time.0));
    if let Some(u) = unreachable {
        let node = vm
            .status
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .map(|n| bounded(n, MAX_NAME))
            .unwrap_or_else(|| "(unknown)".into());
        return Some(Decided::new(
            INSTANCE_PROVISIONED,
            Status::False,
            reason::INSTANCE_HOST_UNREACHABLE,
            format!(
                "Kairon node {node} of Kairon Machine {name} is unreachable ({}); Kairon does not move the VM by itself. \
                 If the node comes back nothing is to be done; a MachineHealthCheck replaces the Machine; once the node is \
                 confirmed gone out of band, `kaironctl fence {name} --reason ...` lets Kairon place it anew, and a deletion \
                 waits for the node to remove Kairon's finalizer",
                kairon_words(u)
            ),
        ));
    }
    // Until Kairon places it anew: once placed, the new VM's own phase says where it stands (a
    // Fenced condition stays on the Machine for good).
    let f = fenced.filter(|_| phase == phase::PENDING)?;
    Some(Decided::new(
        INSTANCE_PROVISIONED,
        Status::False,
        reason::INSTANCE_FENCED,
        format!(
            "Kairon Machine {name} was fenced off its Kairon node ({}); Kairon places it anew and starts a new VM from the same bootstrap data",
            kairon_words(f)
        ),
    ))
}

/// The instance when its deletion has waited on finalizers longer than `grace`: Kairon's
/// `runtime-cleanup` is removed by kairon-node on the VM's node once the VM and its disk are
/// gone (`internal/agent/agent.go`), so a node that is gone never removes it.
pub(crate) fn deletion_stuck(vm: &Vm, now: &Time, grace: std::time::Duration) -> Option<Decided> {
    let since = vm.metadata.deletion_timestamp.as_ref()?;
    let finalizers = vm.metadata.finalizers.as_deref().filter(|f| !f.is_empty())?;
    let waited = now.0.duration_since(since.0);
    if waited <= k8s_openapi::jiff::SignedDuration::try_from(grace).ok()? {
        return None;
    }
    let name = bounded(&vm.name_any(), MAX_NAME);
    let held_by: Vec<String> = finalizers.iter().take(8).map(|f| bounded(f, MAX_NAME)).collect();
    let node = vm
        .status
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .map(|n| bounded(n, MAX_NAME))
        .unwrap_or_else(|| "(none)".into());
    Some(Decided::new(
        INSTANCE_PROVISIONED,
        Status::False,
        reason::INSTANCE_DELETION_STUCK,
        format!(
            "the deletion of Kairon Machine {name} has waited more than {} on its finalizers {}: kairon-node on Kairon \
             node {node} removes kairon.zyvor.dev/runtime-cleanup once the VM and its disk are gone, and a node that is \
             unreachable or gone never does. Bring the node back; or, once the VM is confirmed gone out of band, remove \
             the finalizer from the Kairon Machine",
            go_duration(grace),
            held_by.join(", ")
        ),
    ))
}

/// A duration as its flag is written (`5m`, `90s`).
fn go_duration(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{}ms", d.as_millis()),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Kairon's `status.message`, bounded and cleaned, when it says anything.
fn kairon_message(vm: &Vm) -> Option<String> {
    vm.status
        .as_ref()
        .and_then(|s| s.message.as_deref())
        .map(|m| bounded(m, MAX_KAIRON_MESSAGE))
        .filter(|m| !m.trim().is_empty())
}

/// The VM's addresses in CAPI's vocabulary: each address Kairon learnt of the guest
/// (`status.guestIPs`, then `guestIP` if not among them) as an InternalIP, and, once the VM
/// runs, its hostname (the Machine's name, which the provider gives the guest). A value that
/// is not clean is left out.
pub(crate) fn addresses(vm: &Vm) -> Vec<MachineAddress> {
    let status = vm.status.as_ref();
    let listed = status.and_then(|s| s.guest_ips.as_deref()).unwrap_or_default();
    let single = status
        .and_then(|s| s.guest_ip.as_ref())
        .filter(|ip| !listed.contains(ip));
    let mut out: Vec<MachineAddress> = Vec::new();
    for ip in listed.iter().chain(single) {
        let ip = ip.trim();
        if is_clean(ip, MAX_ADDRESS) && !out.iter().any(|a| a.address == ip) && out.len() < MAX_ADDRESSES - 1 {
            out.push(MachineAddress {
                type_: "InternalIP".into(),
                address: ip.to_string(),
            });
        }
    }
    let name = vm.name_any();
    if is_running(vm) && is_clean(&name, MAX_ADDRESS) {
        out.push(MachineAddress {
            type_: "Hostname".into(),
            address: name,
        });
    }
    out
}

/// The failure domain the VM was placed in.
pub(crate) fn failure_domain(vm: &Vm) -> Option<String> {
    vm.annotation(FAILURE_DOMAIN_ANNOTATION)
        .filter(|f| is_clean(f, MAX_FAILURE_DOMAIN))
        .map(str::to_string)
}

/// Whether `value` (an address, a failure domain: a value others act on, which a cut or a
/// replaced character would make wrong) can be reported as it is: not empty, at most `max`
/// bytes, no control characters. Otherwise it is not reported at all.
fn is_clean(value: &str, max: usize) -> bool {
    !value.is_empty() && value.len() <= max && !value.chars().any(char::is_control)
}

/// `status.instance` of the KaironMachine.
///
/// A Kairon Machine that is being brought up (Kairon's Pending, then Provisioning with a host
/// chosen) is recorded as one state: phase `Provisioning`, no host. Nothing the contract reads
/// changes between the two, and without this the status written depended on how many of the
/// steps a reconcile happened to see (all of them without a client limit, none under it, as the
/// reconciles queue): one more status write per machine exactly when the API server is busiest.
///
/// Everything in it comes from the Kairon API, which a tenant's identity can name: each string
/// is cleaned of control characters and bounded, as Kairon's free text is.
pub(crate) fn instance_ref(vm: &Vm) -> InstanceRef {
    let phase = status_phase(vm);
    InstanceRef {
        name: bounded(&vm.name_any(), MAX_NAME),
        namespace: bounded(&vm.namespace().unwrap_or_default(), MAX_NAME),
        uid: vm.metadata.uid.as_deref().map(|u| bounded(u, MAX_NAME)),
        phase: Some(bounded(phase, MAX_PHASE)),
        host: vm
            .status
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|h| !h.is_empty() && phase != phase::PROVISIONING)
            .map(|h| bounded(h, MAX_NAME)),
        identity_ref: None,
        endpoint: None,
    }
}

/// The phase as the KaironMachine records it: [`effective_phase`], with Pending recorded as
/// Provisioning.
pub(crate) fn status_phase(vm: &Vm) -> &str {
    match effective_phase(vm) {
        phase::PENDING | phase::STARTING | phase::BLOCKED => phase::PROVISIONING,
        other => other,
    }
}

#[cfg(test)]
mod tests;
