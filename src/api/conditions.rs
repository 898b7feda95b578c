//! Condition vocabulary and the one rule for changing conditions.
//!
//! Conditions are `metav1.Condition`s in `status.conditions` (v1beta2 contract). CAPI mirrors
//! `Ready` into the owner's `InfrastructureReady`, so messages are deterministic, and
//! `lastTransitionTime` moves only when a condition's status changes: anything else would
//! rewrite objects at steady state.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Summary condition, mirrored by CAPI into `InfrastructureReady`.
pub const READY: &str = "Ready";
/// Whether reconciliation is paused (Cluster `spec.paused` or the paused annotation).
pub const PAUSED: &str = "Paused";
/// Whether the Kairon Machine backing a KaironMachine exists and runs.
pub const INSTANCE_PROVISIONED: &str = "InstanceProvisioned";
/// Whether the VM's current Kairon host satisfies the host selector of the Machine's failure
/// domain (a live migration can move it out). Absent without a failure domain or host labels.
pub const INSTANCE_IN_FAILURE_DOMAIN: &str = "InstanceInFailureDomain";
/// Kairon asked for the VM to be taken off a host in maintenance: True while that is under
/// way (the reason says where it stands), False once over. Absent until Kairon first asks.
pub const EVACUATION: &str = "Evacuation";
/// KaironCluster: whether the MachineDisruptionBudgets that keep Kairon's evacuation from
/// cold-migrating the cluster's VMs are in place on its Kairon API. Absent until first kept.
pub const DISRUPTION_BUDGETS_READY: &str = "DisruptionBudgetsReady";

/// Reasons. Shared with CAPI's vocabulary where CAPI has a word for it.
pub mod reason {
    pub const READY: &str = "Ready";
    pub const PAUSED: &str = "Paused";
    pub const NOT_PAUSED: &str = "NotPaused";
    pub const DELETING: &str = "Deleting";
    pub const PROVISIONED: &str = "Provisioned";

    // KaironCluster
    pub const WAITING_FOR_CONTROL_PLANE_ENDPOINT: &str = "WaitingForControlPlaneEndpoint";
    pub const WAITING_FOR_MACHINES_DELETION: &str = "WaitingForMachinesDeletion";

    // KaironMachine: waiting
    pub const WAITING_FOR_CLUSTER_INFRASTRUCTURE: &str = "WaitingForClusterInfrastructureReady";
    pub const WAITING_FOR_CONTROL_PLANE_INITIALIZED: &str = "WaitingForControlPlaneInitialized";
    pub const WAITING_FOR_BOOTSTRAP_DATA: &str = "WaitingForBootstrapData";
    pub const FAILURE_DOMAIN_NOT_FOUND: &str = "FailureDomainNotFound";

    // KaironMachinePool
    /// The MachinePool that owns the KaironMachinePool names another infrastructure object in
    /// `spec.template.spec.infrastructureRef`: the pool acts for no MachinePool.
    pub const MACHINE_POOL_NAMES_ANOTHER: &str = "MachinePoolNamesAnotherPool";

    // KaironMachine: bootstrap data problems
    pub const BOOTSTRAP_SECRET_NOT_FOUND: &str = "BootstrapDataSecretNotFound";
    pub const BOOTSTRAP_DATA_MISSING: &str = "BootstrapDataMissing";
    pub const BOOTSTRAP_DATA_TOO_LARGE: &str = "BootstrapDataTooLarge";
    pub const BOOTSTRAP_DATA_INVALID: &str = "BootstrapDataInvalid";
    pub const UNSUPPORTED_BOOTSTRAP_FORMAT: &str = "UnsupportedBootstrapFormat";
    /// The bootstrap data uses what Kairon's structured cloudInit cannot carry (a cloud-config
    /// key, a second user, a jinja statement, binary file content): nothing is created.
    pub const UNSUPPORTED_BOOTSTRAP_DATA: &str = "UnsupportedBootstrapData";
    /// The Kairon Machine would need a field (or value) the installed Kairon's Machine schema
    /// does not have, which the API server would drop: terminal, no VM is created.
    pub const KAIRON_FIELD_UNSUPPORTED: &str = "KaironFieldUnsupported";
    /// The Secret is not the Machine's bootstrap data: not made by its bootstrap config, or
    /// one of CAPI's own (kubeconfig, CAs, service-account keys).
    pub const BOOTSTRAP_DATA_SECRET_NOT_TRUSTED: &str = "BootstrapDataSecretNotTrusted";
    /// The Machine our ownerReference names is another one (other UID) or does not reference
    /// this KaironMachine.
    pub const OWNER_MACHINE_MISMATCH: &str = "OwnerMachineMismatch";

    // KaironMachine: the instance
    pub const INSTANCE_PENDING: &str = "InstancePending";
    pub const INSTANCE_PROVISIONING: &str = "InstanceProvisioning";
    /// Kairon could not place the VM yet (its `Scheduled=False`: no node fits, a quota, CPU
    /// pinning); Kairon keeps trying, and its reason and message say why.
    pub const INSTANCE_NOT_SCHEDULED: &str = "InstanceNotScheduled";
    pub const INSTANCE_STOPPED: &str = "InstanceStopped";
    /// Kairon reports the VM's Kairon node unreachable (`NodeUnreachable=True`: the node is not
    /// Ready or gone) while the phase stays Running: Kairon moves nothing by itself. The
    /// message names the node, Kairon's reason, and what the operator can do (`kaironctl
    /// fence` once the node is confirmed gone; a MachineHealthCheck replaces the Machine).
    pub const INSTANCE_HOST_UNREACHABLE: &str = "InstanceHostUnreachable";
    /// An operator fenced the VM off its Kairon node (`Fenced=True`, `kaironctl fence`):
    /// Kairon places the Machine anew and starts a new VM from the same cloudInit.
    pub const INSTANCE_FENCED: &str = "InstanceFenced";
    /// The Kairon Machine's deletion waits on Kairon's finalizers (kairon-node's
    /// `kairon.zyvor.dev/runtime-cleanup`) longer than `--kairon-deletion-grace-period`: the
    /// message names them, the node, and what the operator can do.
    pub const INSTANCE_DELETION_STUCK: &str = "InstanceDeletionStuck";
    /// Kairon holds the Machine in Pending and says why in its `status.message`, with no
    /// `Scheduled=False` (a MachineImage it waits for, of the wrong kind, or invalid): Kairon's
    /// message, waited on.
    pub const INSTANCE_WAITING_ON_KAIRON: &str = "InstanceWaitingOnKairon";
    /// The VM runs and Kairon reports no address for it: on its network Kairon learns none
    /// (user mode; a bridged tap without `learnIP`, `netns` or the guest agent), or has not
    /// learnt it yet. The message names the mode and the fix. `InstanceProvisioned` False (and
    /// so Ready) while the Machine has no Node, True once one joined.
    pub const INSTANCE_ADDRESS_UNKNOWN: &str = "InstanceAddressUnknown";
    /// A control-plane machine on a network no other VM can reach (Kairon's user mode, a NAT
    /// of the VM's own): no VM is made; the template must be fixed and rolled out.
    pub const CONTROL_PLANE_NETWORK_UNREACHABLE: &str = "ControlPlaneNetworkUnreachable";
    /// Kairon reports phase Unknown: FluxVM says the runtime is in a state Kairon does not know
    /// (it failed, among others) and Kairon does not restart it. The VM does not run; not
    /// terminal.
    pub const INSTANCE_STATE_UNKNOWN: &str = "InstanceStateUnknown";
    /// Kairon reports phase Error (a reconcile of the VM failed; Kairon retries it): not
    /// terminal, Kairon's message says why.
    pub const INSTANCE_ERROR: &str = "InstanceError";
    pub const INSTANCE_TERMINATING: &str = "InstanceTerminating";
    /// Kairon runs the VM on a new runtime on a fresh disk (after `Stopped` or a cold
    /// migration), not the one its bootstrap data ran in: a new machine under the old name,
    /// not this one. Not Ready, so that a MachineHealthCheck replaces it; never provisioned
    /// again as the same instance.
    pub const INSTANCE_RECREATED: &str = "InstanceRecreated";
    pub const INSTANCE_NOT_FOUND: &str = "InstanceNotFound";
    pub const INSTANCE_CONFLICT: &str = "InstanceNameConflict";
    /// The identity names another Kairon API than the one that holds the VM, and the VM is not
    /// there: the last known status is kept and a deletion waits (never "the VM is gone").
    pub const INSTANCE_ENDPOINT_CHANGED: &str = "InstanceEndpointChanged";
    /// The Kairon Machine could not be read (its schema is not what we know).
    pub const INSTANCE_UNREADABLE: &str = "InstanceUnreadable";
    /// Kairon rejected the create (quota, admission, ...): retried with backoff.
    pub const INSTANCE_CREATE_FAILED: &str = "InstanceCreateFailed";
    /// The Kairon API named by the cluster's identity cannot be used: its Secret is missing or
    /// invalid, or the API cannot be reached or refuses the credentials.
    pub const KAIRON_API_UNAVAILABLE: &str = "KaironAPIUnavailable";
    /// The Kairon API named by the cluster's identity answered no write (or a reconcile ran out
    /// of time waiting for it): writes to it wait for a new try after a pause.
    pub const KAIRON_API_NOT_ANSWERING: &str = "KaironAPINotAnswering";
    /// The identity's kubeconfig names a server the operator does not allow
    /// (`--identity-allowed-servers`).
    pub const KAIRON_API_SERVER_NOT_ALLOWED: &str = "KaironAPIServerNotAllowed";

    // KaironCluster: DisruptionBudgetsReady
    /// Every budget of the cluster is written as wanted.
    pub const DISRUPTION_BUDGETS_KEPT: &str = "DisruptionBudgetsKept";
    /// The Kairon API has no MachineDisruptionBudget kind: nothing keeps Kairon's evacuation
    /// from cold-migrating the cluster's VMs.
    pub const DISRUPTION_BUDGETS_NOT_SERVED: &str = "DisruptionBudgetsNotServed";
    /// The credentials may not list or write MachineDisruptionBudgets (403).
    pub const DISRUPTION_BUDGETS_FORBIDDEN: &str = "DisruptionBudgetsForbidden";
    /// A budget of a name the cluster's would have is another's (another management cluster's,
    /// or not the provider's): left alone, so those VMs are not covered.
    pub const DISRUPTION_BUDGET_NAME_TAKEN: &str = "DisruptionBudgetNameTaken";

    // KaironMachine: InstanceInFailureDomain
    pub const INSTANCE_IN_FAILURE_DOMAIN: &str = "InstanceInFailureDomain";
    pub const INSTANCE_OUTSIDE_FAILURE_DOMAIN: &str = "InstanceOutsideFailureDomain";

    // KaironMachine: Evacuation (True: under way; the VM's Kairon node is cordoned)
    /// The Cluster or the KaironMachine is paused: nothing is marked or deleted.
    pub const WAITING_FOR_UNPAUSE: &str = "WaitingForUnpause";
    /// The node was cordoned a moment ago: the operator may still migrate the VM live
    /// (`--evacuation-grace-period`) before its Machine is replaced.
    pub const WAITING_FOR_MIGRATION: &str = "WaitingForMigration";
    /// Another Machine of the cluster is being replaced (or goes first): one at a time.
    pub const WAITING_FOR_TURN: &str = "WaitingForTurn";
    /// No MachineHealthCheck selects the Machine and it is not one the provider may delete
    /// (a control-plane Machine): nothing happens until one does.
    pub const NO_MACHINE_HEALTH_CHECK: &str = "NoMachineHealthCheck";
    /// The Machine tells MachineHealthChecks to leave it alone (`skip-remediation`).
    pub const REPLACEMENT_BLOCKED: &str = "ReplacementBlocked";
    /// The Machine is marked for remediation (or, without a MachineHealthCheck, deleted) so
    /// that its owner replaces it.
    pub const REPLACEMENT_REQUESTED: &str = "ReplacementRequested";
    /// The Machine is being deleted: CAPI drains its Node, then the VM goes.
    pub const REPLACING: &str = "Replacing";
    // KaironMachine: Evacuation (False: over)
    /// The VM runs on another node now (an operator migrated it off the cordoned one).
    pub const MIGRATED: &str = "Migrated";
    /// The node is no longer cordoned and the VM still runs there: nothing was replaced.
    pub const CANCELED: &str = "Canceled";
}

/// Condition status values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// A condition as the reconcilers decide it, before it gets a transition time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided {
    pub type_: &'static str,
    pub status: Status,
    pub reason: &'static str,
    pub message: String,
}

impl Decided {
    pub fn new(type_: &'static str, status: Status, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// Sets `decided` in `conditions`, keeping `lastTransitionTime` unless the status changes.
///
/// Leaves the list sorted by type, so that two equal sets compare equal.
pub fn set(conditions: &mut Vec<Condition>, decided: Decided, observed_generation: Option<i64>, now: &Time) {
    let status = decided.status.as_str();
    let transition = match conditions.iter().find(|c| c.type_ == decided.type_) {
        Some(old) if old.status == status => old.last_transition_time.clone(),
        _ => now.clone(),
    };
    conditions.retain(|c| c.type_ != decided.type_);
    conditions.push(Condition {
        type_: decided.type_.to_string(),
        status: status.to_string(),
        reason: decided.reason.to_string(),
        message: decided.message,
        observed_generation,
        last_transition_time: transition,
    });
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

/// Whether `conditions` already say what `decided` says (status, reason and message), whatever
/// the generation they were observed at.
pub fn says(conditions: Option<&[Condition]>, decided: &Decided) -> bool {
    conditions.and_then(|c| get(c, decided.type_)).is_some_and(|c| {
        c.status == decided.status.as_str() && c.reason == decided.reason && c.message == decided.message
    })
}

/// The Paused condition for a pause reason (`None`: not paused).
pub fn paused(why: Option<&str>) -> Decided {
    match why {
        Some(why) => Decided::new(PAUSED, Status::True, reason::PAUSED, why),
        None => Decided::new(PAUSED, Status::False, reason::NOT_PAUSED, ""),
    }
}

/// Finds a condition by type.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// The current time at the precision the API server stores (seconds), so that a freshly set
/// condition compares equal to what we read back.
pub fn now() -> Time {
    let ts = Timestamp::now();
    Time(Timestamp::from_second(ts.as_second()).unwrap_or(ts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn new_condition_gets_now() {
        let mut c = vec![];
        set(&mut c, Decided::new(READY, Status::False, "X", "m"), Some(1), &at(10));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, at(10));
        assert_eq!(c[0].observed_generation, Some(1));
    }

    #[test]
    fn same_status_keeps_transition_time_even_when_reason_changes() {
        let mut c = vec![];
        set(&mut c, Decided::new(READY, Status::False, "A", "a"), None, &at(10));
        set(&mut c, Decided::new(READY, Status::False, "B", "b"), None, &at(20));
        assert_eq!(c[0].last_transition_time, at(10));
        assert_eq!(c[0].reason, "B");
        assert_eq!(c[0].message, "b");
    }

    #[test]
    fn status_change_moves_transition_time() {
        let mut c = vec![];
        set(&mut c, Decided::new(READY, Status::False, "A", ""), None, &at(10));
        set(&mut c, Decided::new(READY, Status::True, "Ready", ""), None, &at(20));
        assert_eq!(c[0].last_transition_time, at(20));
        assert_eq!(c[0].status, "True");
    }

    #[test]
    fn conditions_are_kept_sorted_by_type() {
        let mut c = vec![];
        set(&mut c, Decided::new(READY, Status::True, "Ready", ""), None, &at(1));
        set(
            &mut c,
            Decided::new(PAUSED, Status::False, "NotPaused", ""),
            None,
            &at(1),
        );
        set(
            &mut c,
            Decided::new(INSTANCE_PROVISIONED, Status::True, "Provisioned", ""),
            None,
            &at(1),
        );
        let types: Vec<_> = c.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["InstanceProvisioned", "Paused", "Ready"]);
    }

    #[test]
    fn says_ignores_generation_and_time() {
        let mut c = vec![];
        set(&mut c, paused(Some("why")), Some(1), &at(1));
        assert!(says(Some(&c), &paused(Some("why"))));
        assert!(!says(Some(&c), &paused(Some("other reason"))));
        assert!(!says(Some(&c), &paused(None)));
        assert!(!says(None, &paused(Some("why"))));
    }

    #[test]
    fn now_has_whole_seconds() {
        assert_eq!(now().0.subsec_nanosecond(), 0);
    }
}
