//! The status a KaironMachine should have, from what a reconcile observed of its instance.
//! Pure: no I/O; a table of cases in the tests.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::conditions::{self, Decided, INSTANCE_PROVISIONED, READY, Status, reason};
use crate::api::{Initialization, KaironMachineStatus};
use crate::kairon::{self, observe};

/// What one reconcile learned about the KaironMachine's instance; the status follows from it.
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    /// No instance yet, and a reason why not (waiting, or a bootstrap data problem).
    Waiting(Decided),
    /// No instance, and none will be created: a terminal failure (v1beta1 reason, message).
    Terminal {
        condition: Decided,
        failure_reason: &'static str,
    },
    /// The instance, as Kairon reports it.
    Instance(Box<kairon::Vm>),
    /// The instance, as Kairon reports it, of a Machine that has no Node yet: a VM running
    /// without an address then says what its network needs.
    InstanceWithoutNode(Box<kairon::Vm>),
    /// The instance existed (our providerID names it) and is gone.
    Gone,
    /// A Kairon Machine with our name belongs to someone else.
    Conflict { name: String, why: String },
}

/// What a status is computed from.
#[derive(Clone, Copy, Debug)]
pub enum StatusInput<'a> {
    /// Paused, for this reason: only the Paused condition changes.
    Paused(&'a str),
    /// Not paused, the KaironMachine not deleted: the instance as observed.
    Live(&'a Observed),
    /// Not paused, the KaironMachine being deleted: Ready turns False with reason Deleting.
    Deleting(&'a Observed),
}

/// The status a KaironMachine should have. Pure: a table of cases in the tests.
pub fn next_status(
    current: Option<&KaironMachineStatus>,
    input: StatusInput<'_>,
    generation: Option<i64>,
    now: &Time,
) -> KaironMachineStatus {
    let mut status = current.cloned().unwrap_or_default();
    let mut conds = status.conditions.take().unwrap_or_default();
    let (paused, observed, deleting) = match input {
        StatusInput::Paused(why) => (Some(why), None, false),
        StatusInput::Live(observed) => (None, Some(observed), false),
        StatusInput::Deleting(observed) => (None, Some(observed), true),
    };
    conditions::set(&mut conds, conditions::paused(paused), generation, now);

    if let Some(observed) = observed {
        let instance = match observed {
            Observed::Waiting(d) => d.clone(),
            Observed::Terminal {
                condition,
                failure_reason,
            } => {
                status.set_failure(failure_reason, &condition.message);
                condition.clone()
            }
            Observed::Gone => {
                // What the instance was stays recorded (its uid above all): a Kairon Machine
                // made later under the same name (a restore, a re-create by hand) is another
                // instance, and with no uid recorded it would be taken for ours by its name.
                if let Some(gone) = status.instance.as_mut() {
                    gone.phase = None;
                    gone.host = None;
                }
                Decided::new(
                    INSTANCE_PROVISIONED,
                    Status::False,
                    reason::INSTANCE_NOT_FOUND,
                    "the Kairon Machine of this KaironMachine no longer exists; it is not re-created",
                )
            }
            Observed::Conflict { name, why } => Decided::new(
                INSTANCE_PROVISIONED,
                Status::False,
                reason::INSTANCE_CONFLICT,
                format!(
                    "Kairon Machine {name} exists but does not belong to this KaironMachine ({why}); it is left alone"
                ),
            ),
            Observed::Instance(vm) | Observed::InstanceWithoutNode(vm) => {
                status.instance = Some(observe::instance_ref(vm));
                let addresses = observe::addresses(vm);
                // A recreated VM is no longer this machine, address or not.
                let unaddressed = observe::is_running(vm)
                    && !addresses.iter().any(|a| a.type_ == "InternalIP")
                    && !kairon::bootstrap_runtime::is_recreated(vm);
                let joined = matches!(observed, Observed::Instance(_));
                if !addresses.is_empty() {
                    status.addresses = Some(addresses);
                }
                if let Some(fd) = observe::failure_domain(vm) {
                    status.failure_domain = Some(fd);
                }
                if observe::is_running(vm) {
                    status.initialization = Some(Initialization {
                        provisioned: Some(true),
                    });
                }
                if unaddressed && observe::node_lost(vm).is_none() {
                    // Provisioned all the same (the VM runs, and a Node may still come from a
                    // control plane it reaches). Without a Node not Ready: a cluster on a
                    // network that cannot carry it says so here rather than time out in
                    // kubeadm. With one, Ready, and the missing address still said.
                    observe::unaddressed_condition(vm, joined)
                } else {
                    observe::instance_condition(vm)
                }
            }
        };
        let ready = if deleting && instance.reason == reason::INSTANCE_DELETION_STUCK {
            // CAPI shows the Machine's InfrastructureReady from this: the user sees why.
            Decided::new(READY, Status::False, reason::DELETING, instance.message.clone())
        } else if deleting {
            Decided::new(READY, Status::False, reason::DELETING, "KaironMachine is being deleted")
        } else if instance.status == Status::True {
            // No message: CAPI summarises the Machine's Ready from InfrastructureReady and
            // shows any message there, also a True one ("* InfrastructureReady: ..."); a
            // ready Machine's Ready says nothing (CAPI's e2e VerifyMachinesReady checks it).
            Decided::new(READY, Status::True, reason::READY, "")
        } else {
            Decided::new(READY, instance.status, instance.reason, instance.message.clone())
        };
        conditions::set(&mut conds, instance, generation, now);
        conditions::set(&mut conds, ready, generation, now);
    }
    status.conditions = Some(conds);
    status
}

#[cfg(test)]
mod tests;
