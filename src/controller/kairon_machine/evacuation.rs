//! What a KaironMachine does when Kairon asks for its VM to be taken off a host in
//! maintenance. Pure: no I/O; a table of cases in the tests. The I/O is in [`super::evacuate`].
//!
//! The VM is not moved by us and its Node is not drained by us: CAPI replaces the Machine, the
//! way it replaces an unhealthy one. The Machine is marked with
//! `cluster.x-k8s.io/remediate-machine`; the MachineHealthCheck that selects it marks it
//! unhealthy and its owner remediates it (a MachineSet deletes it, KubeadmControlPlane removes
//! its etcd member first, checking quorum); CAPI drains the Node (PodDisruptionBudgets,
//! `nodeDrainTimeout`) before the KaironMachine, and so the VM, is deleted. Without a
//! MachineHealthCheck a worker of a MachineSet is deleted by us (CAPI still drains it and the
//! MachineSet replaces it); a control-plane Machine never is: only its owner knows quorum.
//!
//! One Machine per cluster at a time: the evacuating Machine with the earliest deadline (then
//! the first name) goes, and only when no other Machine of the cluster is being deleted, is
//! marked and not yet acted on, or has no Node yet (a replacement still coming up), and the
//! Cluster counts as many available Machines as it wants (a replacement not yet created). Every
//! reconcile computes the same answer from the same caches, so no lock is needed; a moment of
//! stale cache may let two go, which the owners' own guards (KCP one at a time, MachineSet
//! `maxInFlight`) still hold.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::{Decided, EVACUATION, Status, reason};
use crate::capi;
use crate::kairon::evacuation::Request;

/// What the machine's own side looks like.
#[derive(Clone, Copy, Debug)]
pub(super) struct Own<'a> {
    pub machine: &'a capi::Machine,
    /// Kairon's request, if it asks now.
    pub request: Option<&'a Request>,
    /// Kairon stopped the VM at the deadline.
    pub stopped_at_deadline: bool,
    /// The host the VM runs on now.
    pub host: Option<&'a str>,
    /// The KaironMachine's Evacuation condition as it is.
    pub previous: Option<&'a Condition>,
    /// Why the machine's Cluster is not whole (a replacement still coming up, as the Cluster
    /// counts its Machines), if it is not.
    pub cluster_short: Option<&'a str>,
}

/// A Machine of the same cluster (the machine's own among them), and when its VM must be off
/// its host, if Kairon asks (`Some(None)`: asked, without a deadline).
#[derive(Clone, Copy, Debug)]
pub(super) struct Peer<'a> {
    pub machine: &'a capi::Machine,
    pub evacuating: Option<Option<Timestamp>>,
}

/// What to do to the Machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Act {
    Nothing,
    /// Add `remediate-machine` (and our annotation saying why).
    Mark,
    /// Delete the Machine (a MachineSet's worker that no MachineHealthCheck selects).
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Decision {
    pub act: Act,
    /// The Evacuation condition (`None`: leave it as it is).
    pub condition: Option<Decided>,
    /// When to look again, if not for a watch.
    pub requeue: Option<Duration>,
}

impl Decision {
    fn none() -> Self {
        Decision {
            act: Act::Nothing,
            condition: None,
            requeue: None,
        }
    }
}

/// Whether the provider can get the Machine replaced: a MachineHealthCheck selects it, or it
/// is a worker of a MachineSet (deleted by us when none does).
fn can_be_replaced(m: &capi::Machine) -> bool {
    !m.skips_remediation() && (m.has_health_check() || deleted_without_health_check(m))
}

/// Without a MachineHealthCheck, only a MachineSet's worker is deleted by the provider.
fn deleted_without_health_check(m: &capi::Machine) -> bool {
    !m.is_control_plane() && m.controller_kind() == Some("MachineSet")
}

fn name(m: &capi::Machine) -> &str {
    m.metadata.name.as_deref().unwrap_or_default()
}

/// Why another Machine of the cluster holds the turn: being deleted, marked and not yet
/// acted on, or still coming up.
fn holds_the_turn(m: &capi::Machine) -> Option<&'static str> {
    if m.is_deleting() {
        Some("is being deleted")
    } else if m.is_marked_for_remediation() {
        Some("is marked for remediation")
    } else if !m.has_node() {
        Some("has no Node yet")
    } else {
        None
    }
}

/// The first words of every in-progress message: the host, which is how [`decide`] tells a
/// migration from a cancellation once Kairon stops asking.
fn about(host: &str) -> String {
    format!("Kairon host {host} is in maintenance")
}

/// The message of a marked Machine, the same before and after the cache shows the mark (or
/// the status would be written twice).
fn marked(me: &str) -> String {
    format!(
        "Machine {me} is marked for remediation ({}): its MachineHealthCheck and owner replace it",
        capi::REMEDIATE_MACHINE_ANNOTATION
    )
}

/// How long to wait before looking again, with Kairon's deadline in view.
fn until_deadline(request: Option<&Request>, now: Timestamp, at_most: Duration) -> Duration {
    let left = request
        .and_then(|r| r.deadline)
        // A deadline already passed: soon (a negative span does not convert).
        .map(|d| d.duration_since(now).try_into().unwrap_or(Duration::ZERO))
        .unwrap_or(at_most);
    left.clamp(Duration::from_secs(5), at_most)
}

/// The Evacuation condition of a paused machine: nothing is marked or deleted while paused
/// (the pause also holds the MachineHealthCheck and the owners). `None`: Kairon does not ask.
pub(super) fn while_paused(own: &Own<'_>, why: &str) -> Option<Decided> {
    let head = match (own.request, own.stopped_at_deadline) {
        (Some(r), _) => format!("{} (deadline {})", about(&r.host), r.deadline_text()),
        (None, true) => "Kairon stopped the VM at the evacuation deadline".to_string(),
        (None, false) => return None,
    };
    Some(Decided::new(
        EVACUATION,
        Status::True,
        reason::WAITING_FOR_UNPAUSE,
        format!(
            "{head}: Machine {} is not replaced while paused ({why})",
            name(own.machine)
        ),
    ))
}

/// What to do, and what the Evacuation condition says, for a machine not paused and not being
/// deleted, given every Machine of its cluster.
pub(super) fn decide(own: &Own<'_>, peers: &[Peer<'_>], now: Timestamp) -> Decision {
    let m = own.machine;
    let me = name(m);
    if own.request.is_none() && !own.stopped_at_deadline {
        return after_request(own);
    }
    let head = match own.request {
        Some(r) => format!("{} (deadline {})", about(&r.host), r.deadline_text()),
        None => "Kairon stopped the VM at the evacuation deadline".to_string(),
    };
    let in_progress = |r: &'static str, message: String, act: Act, requeue: Option<Duration>| {
        // A VM Kairon already stopped still needs its Machine replaced: the act is the same,
        // the condition says loudly that the deadline was missed.
        let r = if own.stopped_at_deadline && r != reason::REPLACING {
            reason::DEADLINE_EXCEEDED
        } else {
            r
        };
        Decision {
            act,
            condition: Some(Decided::new(EVACUATION, Status::True, r, format!("{head}: {message}"))),
            requeue,
        }
    };
    let soon = until_deadline(own.request, now, Duration::from_secs(30));
    let later = until_deadline(own.request, now, Duration::from_secs(300));

    if m.is_deleting() {
        return in_progress(
            reason::REPLACING,
            format!("Machine {me} is being deleted: CAPI drains its Node, then the VM is deleted"),
            Act::Nothing,
            None,
        );
    }
    if m.is_marked_for_remediation() {
        return in_progress(reason::REPLACEMENT_REQUESTED, marked(me), Act::Nothing, Some(later));
    }
    if m.skips_remediation() {
        return in_progress(
            reason::REPLACEMENT_BLOCKED,
            format!(
                "Machine {me} has {}: it is not replaced",
                capi::SKIP_REMEDIATION_ANNOTATION
            ),
            Act::Nothing,
            Some(later),
        );
    }
    if !can_be_replaced(m) {
        return in_progress(
            reason::NO_MACHINE_HEALTH_CHECK,
            format!(
                "no MachineHealthCheck selects Machine {me} (it has no {} condition), and only its owner may \
                 replace a control-plane Machine: create a MachineHealthCheck for it",
                capi::HEALTH_CHECK_SUCCEEDED
            ),
            Act::Nothing,
            Some(later),
        );
    }
    let others = || peers.iter().filter(|p| name(p.machine) != me);
    let mut holders: Vec<(&str, &str)> = others()
        .filter_map(|p| holds_the_turn(p.machine).map(|why| (name(p.machine), why)))
        .collect();
    holders.sort();
    if let Some((other, why)) = holders.first() {
        return in_progress(
            reason::WAITING_FOR_TURN,
            format!("Machine {other} {why}; Machine {me} is replaced after it (one at a time)"),
            Act::Nothing,
            Some(soon),
        );
    }
    // Between a replaced Machine's going and its replacement's creation no Machine is deleting
    // or without a Node: the Cluster's own count of available Machines says it is not whole.
    // A VM Kairon already stopped is itself what the Cluster misses: it goes regardless.
    if let Some(why) = own.cluster_short.filter(|_| !own.stopped_at_deadline) {
        return in_progress(
            reason::WAITING_FOR_TURN,
            format!("the Cluster is not whole: {why}; Machine {me} is replaced once it is (one at a time)"),
            Act::Nothing,
            Some(soon),
        );
    }
    let mine = (own.request.and_then(|r| r.deadline).unwrap_or(Timestamp::MAX), me);
    let first = others()
        .filter(|p| can_be_replaced(p.machine) && !p.machine.is_deleting())
        .filter_map(|p| p.evacuating.map(|d| (d.unwrap_or(Timestamp::MAX), name(p.machine))))
        .filter(|k| *k < mine)
        .min();
    if let Some((_, other)) = first {
        return in_progress(
            reason::WAITING_FOR_TURN,
            format!("Machine {other} goes first (an earlier deadline); Machine {me} is replaced after it"),
            Act::Nothing,
            Some(soon),
        );
    }
    if m.has_health_check() {
        in_progress(reason::REPLACEMENT_REQUESTED, marked(me), Act::Mark, Some(later))
    } else {
        in_progress(
            reason::REPLACEMENT_REQUESTED,
            format!("no MachineHealthCheck selects Machine {me}: it is deleted, and its MachineSet replaces it"),
            Act::Delete,
            Some(later),
        )
    }
}

/// Kairon no longer asks (and the VM was not stopped): an evacuation under way is over, or
/// goes on if the Machine is already being replaced.
fn after_request(own: &Own<'_>) -> Decision {
    let Some(previous) = own.previous.filter(|c| c.status == Status::True.as_str()) else {
        return Decision::none();
    };
    let m = own.machine;
    let me = name(m);
    let over = |r: &'static str, message: String| Decision {
        act: Act::Nothing,
        condition: Some(Decided::new(EVACUATION, Status::False, r, message)),
        requeue: None,
    };
    if m.is_deleting() || capi::has_annotation(&m.metadata, capi::EVACUATION_ANNOTATION) {
        // Marked by us, or deleted: the replacement goes on whatever Kairon says now.
        let (r, what) = if m.is_deleting() {
            (reason::REPLACING, "is being deleted")
        } else {
            (reason::REPLACEMENT_REQUESTED, "is marked for remediation")
        };
        return Decision {
            act: Act::Nothing,
            condition: Some(Decided::new(
                EVACUATION,
                Status::True,
                r,
                format!("Kairon no longer asks for the evacuation, but Machine {me} {what} and is replaced"),
            )),
            requeue: None,
        };
    }
    let still_there = own
        .host
        .is_some_and(|h| previous.message.starts_with(&format!("{} ", about(h))));
    match (still_there, own.host) {
        (false, Some(h)) => over(
            reason::MIGRATED,
            format!("Kairon no longer asks for the evacuation: the VM runs on host {h} now"),
        ),
        _ => over(
            reason::CANCELED,
            "Kairon no longer asks for the evacuation (maintenance cancelled); nothing was replaced".into(),
        ),
    }
}

#[cfg(test)]
#[path = "evacuation_tests.rs"]
mod tests;
