use super::*;

#[test]
fn status_from_every_observation() {
    let cases = vec![
        Case {
            name: "waiting for infra",
            observed: waiting(reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE),
            ready: ("False", reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE),
            instance: ("False", reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE),
            provisioned: false,
            failure_reason: None,
        },
        Case {
            name: "waiting for cp",
            observed: waiting(reason::WAITING_FOR_CONTROL_PLANE_INITIALIZED),
            ready: ("False", reason::WAITING_FOR_CONTROL_PLANE_INITIALIZED),
            instance: ("False", reason::WAITING_FOR_CONTROL_PLANE_INITIALIZED),
            provisioned: false,
            failure_reason: None,
        },
        Case {
            name: "pending",
            observed: Observed::Instance(seen(vm("Pending"))),
            ready: ("False", reason::INSTANCE_PROVISIONING),
            instance: ("False", reason::INSTANCE_PROVISIONING),
            provisioned: false,
            failure_reason: None,
        },
        Case {
            name: "provisioning",
            observed: Observed::Instance(seen(vm("Starting"))),
            ready: ("False", reason::INSTANCE_PROVISIONING),
            instance: ("False", reason::INSTANCE_PROVISIONING),
            provisioned: false,
            failure_reason: None,
        },
        Case {
            name: "running",
            observed: Observed::Instance(seen(vm("Running"))),
            ready: ("True", reason::READY),
            instance: ("True", reason::PROVISIONED),
            provisioned: true,
            failure_reason: None,
        },
        Case {
            name: "running with an address, no Node yet",
            observed: Observed::InstanceWithoutNode(seen(vm("Running"))),
            ready: ("True", reason::READY),
            instance: ("True", reason::PROVISIONED),
            provisioned: true,
            failure_reason: None,
        },
        Case {
            name: "running without an address, no Node yet: provisioned, not ready, says why",
            observed: Observed::InstanceWithoutNode(seen(unaddressed())),
            ready: ("False", reason::INSTANCE_ADDRESS_UNKNOWN),
            instance: ("False", reason::INSTANCE_ADDRESS_UNKNOWN),
            provisioned: true,
            failure_reason: None,
        },
        Case {
            name: "running without an address, with a Node: the cluster formed, the address still missing",
            observed: Observed::Instance(seen(unaddressed())),
            ready: ("True", reason::READY),
            instance: ("True", reason::INSTANCE_ADDRESS_UNKNOWN),
            provisioned: true,
            failure_reason: None,
        },
        Case {
            name: "starting without an address, no Node yet: still provisioning",
            observed: Observed::InstanceWithoutNode(seen(vm("Starting"))),
            ready: ("False", reason::INSTANCE_PROVISIONING),
            instance: ("False", reason::INSTANCE_PROVISIONING),
            provisioned: false,
            failure_reason: None,
        },
        Case {
            name: "stopped",
            observed: Observed::Instance(seen(vm("Stopped"))),
            ready: ("False", reason::INSTANCE_STOPPED),
            instance: ("False", reason::INSTANCE_STOPPED),
            provisioned: false,
            failure_reason: None,
        },
        // Kairon's Unknown (a failed runtime among others): the VM does not run, and that is
        // all; a MachineHealthCheck decides.
        Case {
            name: "kairon unknown",
            observed: Observed::Instance(seen(vm("Unknown"))),
            ready: ("False", reason::INSTANCE_STATE_UNKNOWN),
            instance: ("False", reason::INSTANCE_STATE_UNKNOWN),
            provisioned: false,
            failure_reason: None,
        },
        // Not a phase of Kairon's (earlier simulators wrote it): named, never a failure.
        Case {
            name: "failed is no phase of Kairon's",
            observed: Observed::Instance(seen(vm("Failed"))),
            ready: ("Unknown", reason::INSTANCE_PENDING),
            instance: ("Unknown", reason::INSTANCE_PENDING),
            provisioned: false,
            failure_reason: None,
        },
        // Kairon's Error is retried by Kairon: no failure reason, the Machine is not failed.
        Case {
            name: "kairon error",
            observed: Observed::Instance(seen(vm("Error"))),
            ready: ("False", reason::INSTANCE_ERROR),
            instance: ("False", reason::INSTANCE_ERROR),
            provisioned: false,
            failure_reason: None,
        },
        Case {
            name: "kairon halted",
            observed: Observed::Instance(seen(vm("Halted"))),
            ready: ("False", reason::INSTANCE_STOPPED),
            instance: ("False", reason::INSTANCE_STOPPED),
            provisioned: false,
            failure_reason: None,
        },
        Case {
            name: "terminating",
            observed: Observed::Instance(seen(vm("Terminating"))),
            ready: ("False", reason::INSTANCE_TERMINATING),
            instance: ("False", reason::INSTANCE_TERMINATING),
            provisioned: false,
            failure_reason: None,
        },
        Case {
            name: "gone",
            observed: Observed::Gone,
            ready: ("False", reason::INSTANCE_NOT_FOUND),
            instance: ("False", reason::INSTANCE_NOT_FOUND),
            provisioned: false,
            failure_reason: None,
        },
        Case {
            name: "conflict",
            observed: Observed::Conflict {
                name: "m1".into(),
                why: "its labels name another KaironMachine".into(),
            },
            ready: ("False", reason::INSTANCE_CONFLICT),
            instance: ("False", reason::INSTANCE_CONFLICT),
            provisioned: false,
            failure_reason: None,
        },
        Case {
            name: "ignition",
            observed: Observed::Terminal {
                condition: Decided::new(
                    INSTANCE_PROVISIONED,
                    Status::False,
                    reason::UNSUPPORTED_BOOTSTRAP_FORMAT,
                    "format ignition",
                ),
                failure_reason: "InvalidConfiguration",
            },
            ready: ("False", reason::UNSUPPORTED_BOOTSTRAP_FORMAT),
            instance: ("False", reason::UNSUPPORTED_BOOTSTRAP_FORMAT),
            provisioned: false,
            failure_reason: Some("InvalidConfiguration"),
        },
    ];
    for c in cases {
        let s = next_status(None, StatusInput::Live(&c.observed), Some(3), &at(100));
        let ready = cond(&s, READY);
        let inst = cond(&s, INSTANCE_PROVISIONED);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            c.ready,
            "{}: Ready",
            c.name
        );
        assert_eq!(
            (inst.status.as_str(), inst.reason.as_str()),
            c.instance,
            "{}: InstanceProvisioned",
            c.name
        );
        assert_eq!(s.is_provisioned(), c.provisioned, "{}: provisioned", c.name);
        assert_eq!(s.failure_reason(), c.failure_reason, "{}: failureReason", c.name);
        assert_eq!(cond(&s, PAUSED).status, "False", "{}", c.name);
        assert_eq!(ready.observed_generation, Some(3));
        if ready.status == "True" {
            // CAPI shows a True InfrastructureReady's message in the Machine's Ready.
            assert_eq!(ready.message, "", "{}: a True Ready has no message", c.name);
        } else {
            assert_eq!(
                ready.message, inst.message,
                "{}: a False Ready carries the instance message",
                c.name
            );
        }
    }
}
