//! What a KaironMachine does when its VM's Kairon node is cordoned (the operator is emptying
//! it). Pure: no I/O; a table of cases in the tests. The I/O is in [`super::evacuate`].
//!
//! Kairon would move the VM by a cold migration, which recreates it from its image on a fresh
//! disk and runs its bootstrap data again: no Node survives that, and a first control plane
//! would run `kubeadm init` again. So the provider's MachineDisruptionBudgets hold every VM of
//! its clusters back from Kairon's evacuation, and the provider has CAPI replace the Machines
//! on a cordoned node instead, the way it replaces an unhealthy one; a live migration (an
//! operator's MachineMigration) is only followed. The VM is not moved by us and its Node is
//! not drained by us: the Machine is marked with `cluster.x-k8s.io/remediate-machine`; the
//! MachineHealthCheck that selects it marks it unhealthy and its owner remediates it (a
//! MachineSet deletes it, KubeadmControlPlane removes its etcd member first, checking
//! quorum); CAPI drains the Node (PodDisruptionBudgets, `nodeDrainTimeout`) before the
//! KaironMachine, and so the VM, is deleted. Without a MachineHealthCheck a worker of a
//! MachineSet or a MachinePool is deleted by us (CAPI still drains it and its owner replaces
//! it); a control-plane Machine never is: only its owner knows quorum.
//!
//! First a grace period (`--evacuation-grace-period`, counted from when the Evacuation
//! condition turned True): an operator emptying a node by live migrations cordons it first, and
//! a VM migrated off meanwhile is only followed. Then one Machine per cluster at a time: the
//! first by name of those on cordoned nodes goes, and only when no other Machine of the cluster
//! is being deleted, is marked and not yet acted on, or has no Node yet (a replacement still
//! coming up), and the Cluster counts as many available Machines as it wants (a replacement
//! not yet created). A Machine that will never get a Node (failed, deleted before it had one,
//! without one for longer than a Node takes to start) holds no turn, and a shortfall such
//! Machines explain does not either. "A MachineHealthCheck selects it" is read from the
//! MachineHealthChecks (a cache of them), never from the Machine's `HealthCheckSucceeded`
//! condition, which CAPI leaves behind when the check goes. Every reconcile computes the same answer from the same caches, so no lock
//! is needed; a moment of stale cache may let two go, which the owners' own guards (KCP one at
//! a time, MachineSet `maxInFlight`) still hold.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::api::conditions::{Decided, EVACUATION, Status, reason};
use crate::capi;
use crate::kairon::evacuation::Request;

/// What the machine's own side looks like.
#[derive(Clone, Copy, Debug)]
pub(super) struct Own<'a> {
    pub machine: &'a capi::MachineView,
    /// The VM's node is cordoned.
    pub request: Option<&'a Request>,
    /// The node the VM runs on now.
    pub host: Option<&'a str>,
    /// What is left of the grace period the operator has to migrate the VM live, if any.
    pub grace_left: Option<Duration>,
    /// The grace period as configured (for the message).
    pub grace: Duration,
    /// The KaironMachine's Evacuation condition as it is.
    pub previous: Option<&'a Condition>,
    /// Why the machine's Cluster is not whole (a replacement still coming up, as the Cluster
    /// counts its Machines), if it is not, and how many Machines it misses.
    pub cluster_short: Option<(&'a str, u32)>,
    /// A MachineHealthCheck selects the Machine now.
    pub health_checked: bool,
    /// The time to judge a peer's wait for its Node by.
    pub now: k8s_openapi::jiff::Timestamp,
}

/// A Machine of the same cluster (the machine's own among them), and whether its VM's node is
/// cordoned.
#[derive(Clone, Copy, Debug)]
pub(super) struct Peer<'a> {
    pub machine: &'a capi::MachineView,
    pub evacuating: bool,
    /// A MachineHealthCheck selects it now.
    pub health_checked: bool,
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

/// Whether the provider can get the Machine replaced: a MachineHealthCheck selects it now, or
/// it is a worker of a MachineSet (deleted by us when none does).
fn can_be_replaced(m: &capi::MachineView, health_checked: bool) -> bool {
    !m.skips_remediation() && (health_checked || deleted_without_health_check(m))
}

/// Without a MachineHealthCheck, the provider deletes only a worker whose owner makes another
/// in its place: a MachineSet's, or a MachinePool's (its KaironMachinePool releases the VM from
/// its Kairon MachineSet and raises the set again).
fn deleted_without_health_check(m: &capi::MachineView) -> bool {
    !m.is_control_plane() && matches!(m.controller_kind(), Some("MachineSet" | "MachinePool"))
}

fn name(m: &capi::MachineView) -> &str {
    m.metadata.name.as_deref().unwrap_or_default()
}

/// Why another Machine of the cluster holds the turn: being deleted with its Node (drained),
/// marked and not yet acted on by the MachineHealthCheck that selects it, or still coming up.
/// A Machine that will never get a Node (failed, deleted before it had one, or without one for
/// longer than a Node takes to start) holds nothing: waiting for it would wait for ever, and
/// with the cluster's budgets forbidding Kairon's own evacuation, the node would never empty.
fn holds_the_turn(p: &Peer<'_>, now: k8s_openapi::jiff::Timestamp) -> Option<&'static str> {
    let m = p.machine;
    if m.never_gets_a_node(now) {
        None
    } else if m.is_deleting() {
        Some("is being deleted")
    } else if m.is_marked_for_remediation() && p.health_checked {
        Some("is marked for remediation")
    } else if !m.has_node() {
        Some("has no Node yet")
    } else {
        None
    }
}

/// The first words of every in-progress message: the node, which is how [`decide`] tells a
/// migration from a cancellation once the node is no longer cordoned.
fn about(host: &str) -> String {
    format!("Kairon node {host} is cordoned")
}

/// The message of a marked Machine, the same before and after the cache shows the mark (or
/// the status would be written twice).
fn marked(me: &str) -> String {
    format!(
        "Machine {me} is marked for remediation ({}): its MachineHealthCheck and owner replace it",
        capi::REMEDIATE_MACHINE_ANNOTATION
    )
}

/// What is left of `grace` for a VM on a cordoned node: counted from when the Evacuation
/// condition turned True (`previous`), or from now when it is not True yet. `None`: over.
pub(super) fn grace_left(
    previous: Option<&Condition>,
    grace: Duration,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<Duration> {
    let since = previous
        .filter(|c| c.status == Status::True.as_str())
        .map_or(now, |c| c.last_transition_time.0);
    let elapsed = Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO);
    grace.checked_sub(elapsed).filter(|left| !left.is_zero())
}

/// How long to wait before looking again for a turn, and once the Machine is on its way.
const SOON: Duration = Duration::from_secs(30);
const LATER: Duration = Duration::from_secs(300);

/// The Evacuation condition of a paused machine: nothing is marked or deleted while paused
/// (the pause also holds the MachineHealthCheck and the owners). `None`: the node is not
/// cordoned.
pub(super) fn while_paused(own: &Own<'_>, why: &str) -> Option<Decided> {
    let head = about(&own.request?.host);
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
pub(super) fn decide(own: &Own<'_>, peers: &[Peer<'_>]) -> Decision {
    let m = own.machine;
    let me = name(m);
    let Some(request) = own.request else {
        return after_request(own);
    };
    let head = about(&request.host);
    let in_progress = |r: &'static str, message: String, act: Act, requeue: Option<Duration>| Decision {
        act,
        condition: Some(Decided::new(EVACUATION, Status::True, r, format!("{head}: {message}"))),
        requeue,
    };
    let (soon, later) = (SOON, LATER);

    if m.is_deleting() {
        return in_progress(
            reason::REPLACING,
            format!("Machine {me} is being deleted: CAPI drains its Node, then the VM is deleted"),
            Act::Nothing,
            None,
        );
    }
    // Marked, and a MachineHealthCheck selects it: that one acts. Marked without one (it was
    // deleted since, or stopped selecting the Machine), nobody acts on the mark: decided again
    // below, as if unmarked.
    if m.is_marked_for_remediation() && own.health_checked {
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
    if !can_be_replaced(m, own.health_checked) {
        return in_progress(
            reason::NO_MACHINE_HEALTH_CHECK,
            format!(
                "no MachineHealthCheck selects Machine {me} (of cluster {}), and only its owner may replace a \
                 control-plane Machine: create a MachineHealthCheck for it",
                m.spec.cluster_name
            ),
            Act::Nothing,
            Some(later),
        );
    }
    if let Some(left) = own.grace_left {
        return in_progress(
            reason::WAITING_FOR_MIGRATION,
            format!(
                "Machine {me} is replaced through CAPI once its VM has been on the cordoned node for {}s, unless it is \
                 migrated off first",
                own.grace.as_secs()
            ),
            Act::Nothing,
            Some(left.max(Duration::from_secs(1))),
        );
    }
    let others = || peers.iter().filter(|p| name(p.machine) != me);
    let mut holders: Vec<(&str, &str)> = others()
        .filter_map(|p| holds_the_turn(p, own.now).map(|why| (name(p.machine), why)))
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
    // Machines that will never get a Node are missing for good: a shortfall they explain
    // holds nothing.
    let stuck = u32::try_from(others().filter(|p| p.machine.never_gets_a_node(own.now)).count()).unwrap_or(u32::MAX);
    if let Some((why, missing)) = own.cluster_short
        && (stuck == 0 || missing > stuck)
    {
        return in_progress(
            reason::WAITING_FOR_TURN,
            format!("the Cluster is not whole: {why}; Machine {me} is replaced once it is (one at a time)"),
            Act::Nothing,
            Some(soon),
        );
    }
    let first = others()
        .filter(|p| p.evacuating && can_be_replaced(p.machine, p.health_checked) && !p.machine.is_deleting())
        .map(|p| name(p.machine))
        .filter(|other| *other < me)
        .min();
    if let Some(other) = first {
        return in_progress(
            reason::WAITING_FOR_TURN,
            format!("Machine {other} goes first (by name); Machine {me} is replaced after it"),
            Act::Nothing,
            Some(soon),
        );
    }
    if own.health_checked {
        in_progress(reason::REPLACEMENT_REQUESTED, marked(me), Act::Mark, Some(later))
    } else {
        in_progress(
            reason::REPLACEMENT_REQUESTED,
            format!(
                "no MachineHealthCheck selects Machine {me}: it is deleted, and its {} replaces it",
                m.controller_kind().unwrap_or("owner")
            ),
            Act::Delete,
            Some(later),
        )
    }
}

/// The node is no longer cordoned (or the VM is on another one): an evacuation under way is
/// over, or goes on if the Machine is already being replaced.
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
    if m.is_deleting() || m.has_annotation(capi::EVACUATION_ANNOTATION) {
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
                format!("the VM's Kairon node is no longer cordoned, but Machine {me} {what} and is replaced"),
            )),
            requeue: None,
        };
    }
    let still_there = own
        .host
        .is_some_and(|h| previous.message.starts_with(&format!("{}:", about(h))));
    match (still_there, own.host) {
        (false, Some(h)) => over(
            reason::MIGRATED,
            format!("the VM was migrated off the cordoned node: it runs on Kairon node {h} now"),
        ),
        _ => over(
            reason::CANCELED,
            "the VM's Kairon node is no longer cordoned; nothing was replaced".into(),
        ),
    }
}

#[cfg(test)]
#[path = "evacuation_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "evacuation_peer_tests.rs"]
mod peer_tests;
