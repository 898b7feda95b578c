//! Kairon's hosts that stop answering, as kairon-controller and kairon-node play them (pure).
//!
//! kairon-controller (`internal/controller/fencing.go`) keeps a `NodeUnreachable` condition on
//! every Machine that is not being deleted and has a `spec.nodeName`: True (reason
//! `NodeNotReadyOrMissing`) while that Node is not `Ready` or does not exist, False (reason
//! `NodeReady`) once it is again; written only when it changes, and nothing else: the phase
//! stays as it was and the Machine is never moved. kairon-node on a dead host does nothing at
//! all, so a Machine there is neither booted, powered, failed nor released from its
//! `runtime-cleanup` finalizer: its deletion waits for the node. `kaironctl fence`
//! (`internal/kaironctl/fence.go`) clears `spec.nodeName` and the runtime's status and adds
//! `Fenced=True`; kairon-controller then places the Machine as a new one.

use std::collections::HashSet;

use capkr::kairon::{Machine, MachineStatus};
use k8s_openapi::jiff::Timestamp;

use crate::sim::set_condition;

pub const CONDITION_NODE_UNREACHABLE: &str = "NodeUnreachable";
pub const REASON_NODE_NOT_READY: &str = "NodeNotReadyOrMissing";
pub const REASON_NODE_READY: &str = "NodeReady";
pub const CONDITION_FENCED: &str = "Fenced";
pub const REASON_OPERATOR_ATTESTED: &str = "OperatorAttested";

/// The node a Machine is bound to (`spec.nodeName`), if any.
fn bound_node(m: &Machine) -> Option<&str> {
    m.spec.node_name.as_deref().filter(|n| !n.is_empty())
}

/// The status kairon-controller writes when the Machine's `NodeUnreachable` is not what
/// `ready` (the Nodes that exist and are Ready) says; `None` when it is, or when the Machine
/// is deleted or bound to no node.
pub fn reachability_status(m: &Machine, ready: &HashSet<String>, now: Timestamp) -> Option<MachineStatus> {
    if m.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let node = bound_node(m)?;
    let unreachable = !ready.contains(node);
    let current = m
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_NODE_UNREACHABLE))
        .map(|c| c.status == "True");
    if current.unwrap_or(false) == unreachable {
        return None;
    }
    let mut status = m.status.clone().unwrap_or_default();
    if unreachable {
        let message = format!(
            "node {node:?} is not Ready or no longer exists in the cluster; this Machine will NOT be automatically \
             rescheduled -- see \"kaironctl fence\" only once you've confirmed out-of-band that the node is truly gone"
        );
        set_condition(
            &mut status,
            CONDITION_NODE_UNREACHABLE,
            true,
            REASON_NODE_NOT_READY,
            &message,
            now,
        );
    } else {
        let message = format!("node {node:?} is Ready");
        set_condition(
            &mut status,
            CONDITION_NODE_UNREACHABLE,
            false,
            REASON_NODE_READY,
            &message,
            now,
        );
    }
    Some(status)
}

/// Whether the kairon-node that runs the Machine is gone (its Node is not Ready or does not
/// exist): nothing happens to the VM then, its deletion included.
pub fn on_a_dead_node(m: &Machine, ready: &HashSet<String>) -> bool {
    let node = m
        .status
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
        .or_else(|| bound_node(m));
    node.is_some_and(|n| !ready.contains(n))
}

/// What `kaironctl fence MACHINE --reason REASON` writes (`internal/kaironctl/fence.go`): the
/// merge patch that unbinds the Machine (`spec.nodeName` and the `assigned-node` label) and its
/// status with the runtime's fields cleared and `Fenced=True`. Refused unless Kairon reports
/// `NodeUnreachable=True`, and without a reason.
pub fn fence(m: &Machine, reason: &str, now: Timestamp) -> Result<(serde_json::Value, MachineStatus), String> {
    if reason.trim().is_empty() {
        return Err("--reason is required: state the out-of-band evidence you have that the node is truly gone".into());
    }
    let unreachable = m.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
        c.iter()
            .any(|c| c.type_ == CONDITION_NODE_UNREACHABLE && c.status == "True")
    });
    if !unreachable {
        return Err(format!(
            "machine {} does not currently have {CONDITION_NODE_UNREACHABLE}=True: nothing to fence",
            m.metadata.name.as_deref().unwrap_or_default()
        ));
    }
    let node = bound_node(m).unwrap_or_default().to_string();
    let patch = serde_json::json!({
        "metadata": {"labels": {capkr::kairon::maintenance::ASSIGNED_NODE_LABEL: null}},
        "spec": {"nodeName": ""},
    });
    let mut status = MachineStatus {
        conditions: m.status.as_ref().and_then(|s| s.conditions.clone()),
        message: m.status.as_ref().and_then(|s| s.message.clone()),
        ..Default::default()
    };
    let message = format!("fenced off node {node:?} by an operator: {reason}");
    set_condition(
        &mut status,
        CONDITION_FENCED,
        true,
        REASON_OPERATOR_ATTESTED,
        &message,
        now,
    );
    Ok((patch, status))
}

#[cfg(test)]
mod tests {
    use super::*;
    use capkr::kairon::phase;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn on(node: &str) -> Machine {
        let mut m = Machine::new("m1", Default::default());
        m.spec.node_name = Some(node.into());
        m.status = Some(MachineStatus {
            phase: Some(phase::RUNNING.into()),
            node_name: Some(node.into()),
            ..Default::default()
        });
        m
    }

    #[test]
    fn node_unreachable_follows_the_node_and_nothing_else_changes() {
        let only_h2_ready: HashSet<String> = ["h2".to_string()].into();
        let now = Timestamp::now();
        let m = on("h1");
        let status = reachability_status(&m, &only_h2_ready, now).expect("marked");
        assert_eq!(status.phase.as_deref(), Some(phase::RUNNING), "the phase stays");
        let c = &status.conditions.as_ref().unwrap()[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", REASON_NODE_NOT_READY));
        assert!(c.message.contains("\"h1\"") && c.message.contains("kaironctl fence"));
        let mut marked = m.clone();
        marked.status = Some(status);
        assert_eq!(reachability_status(&marked, &only_h2_ready, now), None, "written once");
        assert!(on_a_dead_node(&marked, &only_h2_ready));

        let up: HashSet<String> = ["h1".to_string(), "h2".to_string()].into();
        let back = reachability_status(&marked, &up, now).expect("cleared");
        let c = &back.conditions.as_ref().unwrap()[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", REASON_NODE_READY));
        assert_eq!(
            reachability_status(&on("h2"), &only_h2_ready, now),
            None,
            "never marked, never written"
        );

        let mut deleted = on("h1");
        deleted.metadata.deletion_timestamp = Some(Time(now));
        assert_eq!(reachability_status(&deleted, &only_h2_ready, now), None);
        assert!(
            on_a_dead_node(&deleted, &only_h2_ready),
            "its deletion waits for the node"
        );
        let mut unbound = on("h1");
        unbound.spec.node_name = Some(String::new());
        unbound.status = None;
        assert_eq!(reachability_status(&unbound, &only_h2_ready, now), None);
        assert!(!on_a_dead_node(&unbound, &only_h2_ready), "fenced: placed anew");
    }

    #[test]
    fn fencing_is_refused_unless_kairon_reports_the_node_unreachable_and_clears_the_runtime() {
        let now = Timestamp::now();
        let only_h2_ready: HashSet<String> = ["h2".to_string()].into();
        let mut m = on("h1");
        assert!(fence(&m, "powered off", now).is_err(), "not unreachable");
        m.status = reachability_status(&m, &only_h2_ready, now);
        m.status.as_mut().unwrap().runtime_id = Some("r1".into());
        assert!(fence(&m, " ", now).is_err(), "no reason");
        let (patch, status) = fence(&m, "powered off", now).expect("fenced");
        assert_eq!(patch["spec"]["nodeName"], "");
        assert_eq!((status.phase, status.node_name, status.runtime_id), (None, None, None));
        let fenced = status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == CONDITION_FENCED)
            .unwrap();
        assert_eq!(
            (fenced.status.as_str(), fenced.reason.as_str()),
            ("True", REASON_OPERATOR_ATTESTED)
        );
        assert_eq!(fenced.message, "fenced off node \"h1\" by an operator: powered off");
    }
}
