//! The simulated kubelet of each guest: when to register the Node, post a Ready change, and
//! when it stops. Heartbeats (the Node's Lease, its periodic status) and Pods are KWOK's (see
//! [`crate::kwok`]), which manages the Nodes registered here while their kubelet runs. State per
//! Machine and a pure decision function.

use std::time::{Duration, Instant};

use capkr::kairon::{Machine, phase};
use k8s_openapi::jiff::Timestamp;

use crate::sim::{node_should_be_ready, phase_of};
use crate::workload::SharedFacts;

/// The registered Node of a guest.
#[derive(Clone, Debug)]
pub struct RegisteredNode {
    pub cluster: String,
    pub facts: SharedFacts,
}

impl RegisteredNode {
    pub fn name(&self) -> &str {
        &self.facts.identity.node_name
    }

    pub fn provider_id(&self) -> Option<&str> {
        self.facts.identity.provider_id.as_deref()
    }
}

/// What the simulator knows of one guest (keyed by Machine; reset when the uid changes).
#[derive(Clone, Debug)]
pub struct Guest {
    pub uid: String,
    pub node: Option<RegisteredNode>,
    /// What the Node's Ready condition says now.
    pub ready: bool,
    pub ready_since: Timestamp,
    /// Do nothing before this (after an error, or while the kubeconfig Secret is missing).
    pub retry_at: Option<Instant>,
    /// The user-data cannot boot a kubelet; nothing to register (logged once).
    pub unbootable: bool,
    /// The VM failed or went away: its kubelet no longer runs.
    pub stopped: bool,
    /// What its `kubeadm join` does not reach, while it does not (logged once).
    pub join_blocked: Option<String>,
}

impl Guest {
    pub fn new(uid: String) -> Self {
        Self {
            uid,
            node: None,
            ready: false,
            ready_since: Timestamp::now(),
            retry_at: None,
            unbootable: false,
            stopped: false,
            join_blocked: None,
        }
    }

    /// Records how an operation on the guest ended.
    pub fn apply(&mut self, outcome: GuestOutcome) {
        let now = Instant::now();
        self.retry_at = None;
        match outcome {
            GuestOutcome::Registered(node, ready) => {
                self.node = Some(node);
                self.ready = ready;
                self.ready_since = Timestamp::now();
            }
            GuestOutcome::StatusPosted(ready) => {
                if self.ready != ready {
                    self.ready = ready;
                    self.ready_since = Timestamp::now();
                }
            }
            GuestOutcome::NodeMissing => self.node = None,
            GuestOutcome::Stopped => self.stopped = true,
            GuestOutcome::Unbootable => self.unbootable = true,
            GuestOutcome::RetryAfter(after) => self.retry_at = Some(now + after),
        }
    }
}

/// How a guest operation ended.
#[derive(Debug)]
pub enum GuestOutcome {
    Registered(RegisteredNode, bool),
    StatusPosted(bool),
    /// The Node is gone (deleted by someone): register again, as kubelet would.
    NodeMissing,
    /// The kubelet stopped; the Node stays until the Machine is deleted.
    Stopped,
    Unbootable,
    RetryAfter(Duration),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeletStep {
    Idle,
    /// Create the Node and post its status.
    Register,
    /// Post status with this Ready value (a change asked for by annotation).
    SetReady(bool),
    /// The VM failed or was stopped: its kubelet (and a control plane's processes) stop, so
    /// its Node's heartbeat stops and the workload cluster's node lifecycle controller takes
    /// over.
    Stop,
    /// The VM runs again after a power state short of Running: its kubelet starts again and
    /// registers (the Node it had is still there; cloud-init does not run again on a kept
    /// disk).
    PowerOn,
}

/// Node removal on delete belongs to the finalizer step (before the finalizer goes), so a
/// Terminating Machine is left alone here.
pub fn next_kubelet_step(m: &Machine, guest: &Guest, now: Instant) -> KubeletStep {
    if guest.retry_at.is_some_and(|t| t > now) {
        return KubeletStep::Idle;
    }
    if m.metadata.deletion_timestamp.is_some() {
        return KubeletStep::Idle;
    }
    match phase_of(m) {
        Some(phase::RUNNING) => {
            if guest.stopped {
                KubeletStep::PowerOn
            } else if guest.unbootable {
                KubeletStep::Idle
            } else if guest.node.is_none() {
                KubeletStep::Register
            } else if node_should_be_ready(m) != guest.ready {
                KubeletStep::SetReady(node_should_be_ready(m))
            } else {
                KubeletStep::Idle
            }
        }
        // The runtime failed (Kairon's Unknown), or it was paused, halted or stopped: what ran
        // in the VM no longer runs.
        Some(phase::UNKNOWN | phase::PAUSED | phase::HALTED | phase::STOPPED) if !guest.stopped => KubeletStep::Stop,
        _ => KubeletStep::Idle,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::GuestIdentity;
    use crate::sim::NODE_READY_ANNOTATION;
    use crate::workload::NodeFacts;
    use capkr::kairon::MachineStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use std::sync::Arc;

    fn machine(phase: &str, deleting: bool, not_ready: bool) -> Machine {
        Machine {
            metadata: ObjectMeta {
                name: Some("m".into()),
                deletion_timestamp: deleting.then_some(Time(Timestamp::UNIX_EPOCH)),
                annotations: not_ready.then(|| [(NODE_READY_ANNOTATION.to_string(), "false".to_string())].into()),
                ..Default::default()
            },
            spec: Default::default(),
            status: Some(MachineStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    fn registered() -> RegisteredNode {
        RegisteredNode {
            cluster: "demo".into(),
            facts: Arc::new(NodeFacts {
                identity: GuestIdentity {
                    node_name: "m".into(),
                    provider_id: None,
                    kubernetes_version: None,
                    labels: Default::default(),
                    taints: vec![],
                    control_plane: false,
                },
                machine_uid: "u".into(),
                internal_ip: None,
                attachment: crate::network::Attachment::User,
                hostname: "m".into(),
                kubelet_version: "v1.36.3".into(),
                cpus: 1,
                memory: Quantity("1Gi".into()),
                disk: Quantity("1Gi".into()),
            }),
        }
    }

    #[test]
    fn kubelet_steps() {
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        let fresh = Guest::new("u".into());
        let running = Guest {
            node: Some(registered()),
            ready: true,
            ..fresh.clone()
        };
        let cases: Vec<(&str, Machine, Guest, KubeletStep)> = vec![
            (
                "running registers",
                machine(phase::RUNNING, false, false),
                fresh.clone(),
                KubeletStep::Register,
            ),
            (
                "waits out a retry",
                machine(phase::RUNNING, false, false),
                Guest {
                    retry_at: Some(later),
                    ..fresh.clone()
                },
                KubeletStep::Idle,
            ),
            (
                "unbootable stays quiet",
                machine(phase::RUNNING, false, false),
                Guest {
                    unbootable: true,
                    ..fresh.clone()
                },
                KubeletStep::Idle,
            ),
            (
                "steady",
                machine(phase::RUNNING, false, false),
                running.clone(),
                KubeletStep::Idle,
            ),
            (
                "told NotReady",
                machine(phase::RUNNING, false, true),
                running.clone(),
                KubeletStep::SetReady(false),
            ),
            (
                "ready again",
                machine(phase::RUNNING, false, false),
                Guest {
                    ready: false,
                    ..running.clone()
                },
                KubeletStep::SetReady(true),
            ),
            (
                "not booted yet",
                machine(phase::STARTING, false, false),
                fresh.clone(),
                KubeletStep::Idle,
            ),
            (
                "a failed runtime (Unknown) stops the kubelet",
                machine(phase::UNKNOWN, false, false),
                running.clone(),
                KubeletStep::Stop,
            ),
            (
                "paused stops the kubelet",
                machine(phase::PAUSED, false, false),
                running.clone(),
                KubeletStep::Stop,
            ),
            (
                "halted stops the kubelet",
                machine(phase::HALTED, false, false),
                running.clone(),
                KubeletStep::Stop,
            ),
            (
                "running again after a power state: the kubelet starts again",
                machine(phase::RUNNING, false, false),
                Guest {
                    stopped: true,
                    ..running.clone()
                },
                KubeletStep::PowerOn,
            ),
            (
                "an error while booting leaves the guest alone",
                machine(phase::ERROR, false, false),
                fresh.clone(),
                KubeletStep::Idle,
            ),
            (
                "failed, stopped",
                machine(phase::UNKNOWN, false, false),
                Guest {
                    stopped: true,
                    ..running.clone()
                },
                KubeletStep::Idle,
            ),
            (
                "stopped by Kairon stops the kubelet",
                machine(phase::STOPPED, false, false),
                running.clone(),
                KubeletStep::Stop,
            ),
            (
                "stopped, kubelet stopped",
                machine(phase::STOPPED, false, false),
                Guest {
                    stopped: true,
                    ..running.clone()
                },
                KubeletStep::Idle,
            ),
            (
                "deleting is the finalizer's job",
                machine(phase::RUNNING, true, false),
                running,
                KubeletStep::Idle,
            ),
        ];
        for (name, m, guest, want) in cases {
            assert_eq!(next_kubelet_step(&m, &guest, now), want, "{name}");
        }
    }
}
