use super::*;
use crate::kairon::Machine;
use crate::kairon::fixtures::vm;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

#[test]
fn instance_condition_for_every_phase() {
    let cases = [
        (None, Status::False, reason::INSTANCE_PROVISIONING),
        (Some("Pending"), Status::False, reason::INSTANCE_PROVISIONING),
        // Ours, never Kairon's: read as any phase we do not know.
        (Some("Provisioning"), Status::Unknown, reason::INSTANCE_PENDING),
        (Some("Running"), Status::True, reason::PROVISIONED),
        (Some("Stopped"), Status::False, reason::INSTANCE_STOPPED),
        (Some("Failed"), Status::Unknown, reason::INSTANCE_PENDING),
        (Some("Terminating"), Status::False, reason::INSTANCE_TERMINATING),
        (Some("Hibernating"), Status::Unknown, reason::INSTANCE_PENDING),
        // Kairon's own phases (kairon-node, kairon-controller).
        (Some("Starting"), Status::False, reason::INSTANCE_PROVISIONING),
        (Some("Blocked"), Status::False, reason::INSTANCE_PROVISIONING),
        (Some("Paused"), Status::False, reason::INSTANCE_STOPPED),
        (Some("Halted"), Status::False, reason::INSTANCE_STOPPED),
        (Some("Error"), Status::False, reason::INSTANCE_ERROR),
        (Some("Unknown"), Status::False, reason::INSTANCE_STATE_UNKNOWN),
    ];
    for (phase, status, r) in cases {
        let d = instance_condition(&Vm::from(vm(phase).clone()));
        assert_eq!((d.status, d.reason), (status, r), "phase {phase:?}");
        assert_eq!(d.type_, INSTANCE_PROVISIONED);
        assert!(d.message.contains("m1"), "{phase:?}: {}", d.message);
    }
}

/// A Pending Machine Kairon holds before scheduling it says why in `status.message` alone
/// (`internal/controller/machineimage.go`); the KaironMachine shows those words. A
/// `Scheduled=False` says more and wins; a Pending without either is being provisioned.
#[test]
fn a_pending_machine_shows_what_kairon_waits_for() {
    #[rustfmt::skip]
    let cases = [
        ("waiting for MachineImage \"ubuntu-2404-kube-v1.36.33\"", reason::INSTANCE_WAITING_ON_KAIRON),
        ("MachineImage \"win\" is kind iso, need disk", reason::INSTANCE_WAITING_ON_KAIRON),
        ("   ", reason::INSTANCE_PROVISIONING),
    ];
    for (message, want) in cases {
        let mut m = vm(Some("Pending"));
        m.status.as_mut().unwrap().message = Some(message.into());
        let d = instance_condition(&Vm::from(m.clone()));
        assert_eq!((d.status, d.reason), (Status::False, want), "{message:?}");
        if want == reason::INSTANCE_WAITING_ON_KAIRON {
            assert!(d.message.ends_with(message), "{}", d.message);
        }
    }
    let mut unplaced = vm(Some("Pending"));
    let status = unplaced.status.as_mut().unwrap();
    status.message = Some("waiting for MachineImage \"x\"".into());
    status.conditions = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: super::super::KAIRON_SCHEDULED.into(),
        status: "False".into(),
        reason: "QuotaBlocked".into(),
        message: "over quota".into(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }]);
    assert_eq!(
        instance_condition(&Vm::from(unplaced.clone())).reason,
        reason::INSTANCE_NOT_SCHEDULED
    );
}

/// None of Kairon's phases is terminal: Error is reported with Kairon's message and waited
/// on, an unknown phase is named; the steps of bringing a VM up are recorded as one.
#[test]
fn kairons_phases_are_never_a_failure() {
    let mut err = vm(Some("Error"));
    err.status.as_mut().unwrap().message = Some("image \"ubuntu\": download failed:\n 404".into());
    let d = instance_condition(&Vm::from(err.clone()));
    assert_eq!(d.reason, reason::INSTANCE_ERROR);
    assert!(d.message.contains("which Kairon retries: image"), "{}", d.message);
    assert!(!d.message.contains('\n'), "{}", d.message);
    err.status.as_mut().unwrap().message = Some("  ".into());
    assert!(
        instance_condition(&Vm::from(err.clone()))
            .message
            .ends_with("reports an error, which Kairon retries"),
        "{}",
        instance_condition(&Vm::from(err.clone())).message
    );
    assert!(
        instance_condition(&Vm::from(vm(Some("Hibernating")).clone()))
            .message
            .contains("unknown phase Hibernating")
    );
    let mut unknown = vm(Some("Unknown"));
    assert!(
        instance_condition(&Vm::from(unknown.clone()))
            .message
            .ends_with("is in phase Unknown (its runtime is in a state Kairon does not know, a failed one among them)"),
        "{}",
        instance_condition(&Vm::from(unknown.clone())).message
    );
    unknown.status.as_mut().unwrap().message = Some("fluxvm: status \"failed\"".into());
    assert!(
        instance_condition(&Vm::from(unknown.clone()))
            .message
            .ends_with("among them): fluxvm: status \"failed\""),
        "{}",
        instance_condition(&Vm::from(unknown.clone())).message
    );
    assert!(
        instance_condition(&Vm::from(vm(Some("Halted")).clone()))
            .message
            .ends_with("is halted")
    );
    assert!(
        instance_condition(&Vm::from(vm(Some("Paused")).clone()))
            .message
            .ends_with("is paused")
    );
    for p in ["Pending", "Starting", "Blocked"] {
        assert_eq!(status_phase(&Vm::from(vm(Some(p)).clone())), phase::PROVISIONING, "{p}");
    }
    assert_eq!(status_phase(&Vm::from(vm(Some("Error")).clone())), "Error");
}

#[test]
fn an_error_carries_kairons_message() {
    let d = instance_condition(&Vm::from(vm(Some("Error")).clone()));
    assert!(d.message.contains("image \"ubuntu\": download failed"), "{}", d.message);
}

#[test]
fn deletion_timestamp_means_terminating_whatever_the_phase() {
    let mut m = vm(Some("Running"));
    m.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    assert_eq!(effective_phase(&Vm::from(m.clone())), "Terminating");
    assert!(!is_running(&Vm::from(m.clone())));
}

#[test]
fn addresses_keep_only_capi_types() {
    let a = addresses(&Vm::from(vm(Some("Running")).clone()));
    assert_eq!(a.len(), 2);
    assert_eq!(a[0].type_, "InternalIP");
    assert_eq!(a[1].type_, "Hostname");
}

#[test]
fn kairons_free_text_is_bounded_and_cleaned_before_it_reaches_status_or_events() {
    for p in ["Error", "Unknown"] {
        let mut m = vm(Some(p));
        let st = m.status.as_mut().unwrap();
        st.message = Some(format!("cloud-init: \u{1b}[31m{}", "user-data line\n".repeat(1000)));
        let msg = kairon_message(&Vm::from(m.clone())).unwrap();
        assert!(msg.len() <= MAX_KAIRON_MESSAGE && !msg.contains('\n') && !msg.contains('\u{1b}'));
        let d = instance_condition(&Vm::from(m.clone()));
        assert!(d.message.len() < 1024, "{p}: fits an event note: {}", d.message.len());
        assert!(!d.message.contains('\n') && !d.message.contains('\u{1b}'), "{p}");
    }

    let many: Vec<String> = (0..300).map(|i| format!("10.0.{}.{}", i / 256, i % 256)).collect();
    let mut m = vm(Some("Running"));
    m.status.as_mut().unwrap().guest_ips = Some(many);
    let a = addresses(&Vm::from(m.clone()));
    assert_eq!(a.len(), MAX_ADDRESSES, "the CRD's maxItems");
    assert_eq!(
        a.last().map(|a| a.type_.as_str()),
        Some("Hostname"),
        "the hostname still fits"
    );

    m.metadata.annotations = Some([(FAILURE_DOMAIN_ANNOTATION.to_string(), "z".repeat(300))].into());
    assert_eq!(
        failure_domain(&Vm::from(m.clone())),
        None,
        "longer than the CRD allows: not reported"
    );
    m.metadata.annotations = Some([(FAILURE_DOMAIN_ANNOTATION.to_string(), "zone-a\nzone-b".into())].into());
    assert_eq!(
        failure_domain(&Vm::from(m.clone())),
        None,
        "a control character: not reported"
    );
}

/// What a tenant's Kairon API says of a VM (its phase, host, name, addresses) reaches
/// `status.instance`, `status.addresses` and events cleaned and bounded.
#[test]
fn everything_a_kairon_api_sends_is_cleaned_and_bounded() {
    let long = |c: &str| format!("{c}\n\u{1b}[31m{}", c.repeat(100_000));
    let mut m = vm(Some("Running"));
    m.metadata.name = Some(long("n"));
    m.metadata.namespace = Some(long("s"));
    m.metadata.uid = Some(long("u"));
    let st = m.status.as_mut().unwrap();
    st.node_name = Some(long("h"));
    st.guest_ips = Some(vec!["10.0.0.1\n10.0.0.2".into(), "10.0.0.3".into()]);
    st.guest_ip = Some("10.0.0.1\n10.0.0.2".into());
    let r = instance_ref(&Vm::from(m.clone()));
    let fields = [Some(r.name), Some(r.namespace), r.uid, r.host];
    for f in fields {
        let f = f.expect("reported");
        assert!(f.len() <= MAX_NAME, "{}", f.len());
        assert!(!f.chars().any(char::is_control), "{f:?}");
    }
    let a = addresses(&Vm::from(m.clone()));
    assert_eq!(a.len(), 1, "an address with a newline is left out: {a:?}");
    assert_eq!(a[0].address, "10.0.0.3");
    let d = instance_condition(&Vm::from(m.clone()));
    assert!(d.message.len() < 1024, "{}", d.message.len());

    let mut odd = vm(Some("Running"));
    odd.status.as_mut().unwrap().phase = Some(long("p"));
    let r = instance_ref(&Vm::from(odd.clone()));
    let phase = r.phase.expect("a phase");
    assert!(
        phase.len() <= MAX_PHASE && !phase.chars().any(char::is_control),
        "{phase:?}"
    );
    assert!(instance_condition(&Vm::from(odd.clone())).message.len() < 1024);
}

/// A case: its name, the VM's labels, the KaironMachine's providerID, the manager's
/// management cluster, the answer.
type OwnershipCase<'a> = (&'a str, Vec<(&'a str, &'a str)>, Option<&'a str>, &'a Owner, Ownership);

#[test]
fn which_vms_are_this_kaironmachines() {
    let owner = Owner {
        id: "mc-a".into(),
        adopt_from: vec!["mc-old".into()],
    };
    let uid = labels::KAIRONMACHINE_UID;
    let mc = labels::MANAGEMENT_CLUSTER;
    let holder = |name: &str, uid: &str| {
        Some(Holder {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
        })
    };
    let foreign = |why: &str| Ownership::Foreign(why.into());
    let this_vm = Some("kairon://vm-uid");
    let no_id = Owner::default();
    #[rustfmt::skip]
    let cases: Vec<OwnershipCase> = vec![
        ("its UID label names us", vec![(uid, "km-uid")], None, &owner, Ownership::Ours),
        ("its UID label names us, whatever else", vec![(uid, "km-uid"), (mc, "mc-b")], Some("kairon://x"), &owner, Ownership::Ours),
        ("no label, no providerID", vec![], None, &owner, foreign("no label names this KaironMachine")),
        ("another KaironMachine's", vec![(uid, "other")], None, &owner, foreign("its labels name another KaironMachine")),
        ("providerID names another VM", vec![(mc, "mc-a")], Some("kairon://another-vm"), &owner, foreign("no label names this KaironMachine")),
        ("providerID names a plain Kairon VM", vec![], this_vm, &owner, foreign("no management-cluster label")),
        ("providerID names another installation's VM", vec![(mc, "mc-b"), (uid, "other")], this_vm, &owner, foreign("management cluster mc-b")),
        ("providerID names a VM of ours no KaironMachine claims", vec![(mc, "mc-a")], this_vm, &owner, Ownership::OursBeforeMove { holder: None }),
        ("providerID names a VM of ours another KaironMachine claims", vec![(mc, "mc-a"), (uid, "old-uid"), (labels::KAIRONMACHINE_NAME, "m0")], this_vm, &owner, Ownership::OursBeforeMove { holder: holder("m0", "old-uid") }),
        ("providerID names a VM of the cluster moved from", vec![(mc, "mc-old"), (uid, "old-uid")], this_vm, &owner, Ownership::OursBeforeMove { holder: holder("m1", "old-uid") }),
        ("a member of a Kairon MachineSet is no KaironMachine's, whatever its labels", vec![(uid, "km-uid"), (mc, "mc-a"), (labels::KAIRON_MACHINESET, "pool")], this_vm, &owner, foreign("member of Kairon MachineSet pool")),
        ("no management-cluster id (request-sequence tests)", vec![], this_vm, &no_id, Ownership::OursBeforeMove { holder: None }),
    ];
    for (name, vm_labels, pid, owner, want) in cases {
        let mut km = KaironMachine::new("m1", Default::default());
        km.metadata.uid = Some("km-uid".into());
        km.spec.provider_id = pid.map(Into::into);
        let mut m = vm(Some("Running"));
        m.metadata.labels = Some(vm_labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        let got = ownership(&Vm::from(m.clone()), &km, owner);
        match (&got, &want) {
            (Ownership::Foreign(why), Ownership::Foreign(part)) => {
                assert!(why.contains(part.as_str()), "{name}: {why}")
            }
            _ => assert_eq!(got, want, "{name}"),
        }
    }
}

#[test]
fn instance_ref_and_failure_domain() {
    let m = vm(Some("Running"));
    let r = instance_ref(&Vm::from(m.clone()));
    assert_eq!(r.name, "m1");
    assert_eq!(r.namespace, "ns");
    assert_eq!(r.uid.as_deref(), Some("vm-uid"));
    assert_eq!(r.phase.as_deref(), Some("Running"));
    assert_eq!(r.host.as_deref(), Some("kairon-node-7"));
    assert_eq!(failure_domain(&Vm::from(m.clone())).as_deref(), Some("zone-a"));
}

/// Kairon's `Scheduled=False` on a Pending Machine says why it waits; it is read through the
/// same lenient reader as every Kairon Machine, bounded, and ignored once the Machine moved on
/// (Kairon only ever writes it False, so one can stay behind).
#[test]
fn kairons_scheduled_false_explains_a_pending_machine() {
    let read = |phase: &str, conditions: serde_json::Value| {
        crate::kairon::machine_from_value(serde_json::json!({
            "metadata": {"name": "m1", "namespace": "ns"},
            "spec": {},
            "status": {"phase": phase, "conditions": conditions},
        }))
    };
    let quota = serde_json::json!([
        {"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-04T10:00:00Z"},
        {"type": "Scheduled", "status": "False", "reason": "QuotaBlocked",
         "message": "MachineQuota team-a: cpu 16 of 16 used", "lastTransitionTime": "2026-12-04T10:00:00Z"},
    ]);
    let pending = read("Pending", quota.clone());
    assert_ne!(
        effective_phase(&Vm::from(pending.clone())),
        phase::UNREADABLE,
        "conditions never make a Machine unreadable"
    );
    let kept = pending
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .expect("kept");
    assert_eq!(kept.len(), 1, "only Scheduled=False is kept: {kept:?}");
    let d = instance_condition(&Vm::from(pending.clone()));
    assert_eq!((d.status, d.reason), (Status::False, reason::INSTANCE_NOT_SCHEDULED));
    assert!(
        d.message
            .ends_with("not scheduled yet: QuotaBlocked: MachineQuota team-a: cpu 16 of 16 used"),
        "{}",
        d.message
    );
    assert_eq!(
        status_phase(&Vm::from(pending.clone())),
        phase::PROVISIONING,
        "recorded as any step of coming up"
    );

    // A False left behind once Kairon placed and started the Machine says nothing any more.
    let d = instance_condition(&Vm::from(read("Starting", quota).clone()));
    assert_eq!(d.reason, reason::INSTANCE_PROVISIONING);

    // Without reason or message, without a readable time, hostile: read all the same, bounded.
    let bare = read(
        "Pending",
        serde_json::json!([{"type": "Scheduled", "status": "False", "lastTransitionTime": "soon"}]),
    );
    assert!(
        instance_condition(&Vm::from(bare.clone()))
            .message
            .ends_with("Kairon reports Scheduled=False")
    );
    let flood = "x\u{1b}[2J".repeat(10_000);
    let hostile = read(
        "Pending",
        serde_json::json!([{"type": "Scheduled", "status": "False", "reason": flood, "message": flood}]),
    );
    let d = instance_condition(&Vm::from(hostile.clone()));
    assert!(d.message.len() < 1024, "{} bytes", d.message.len());
    assert!(!d.message.contains('\u{1b}'));

    // Scheduled=True (not Kairon's, but a tenant's API may say it) or none: as before.
    let d = instance_condition(&Vm::from(
        read("Pending", serde_json::json!([{"type": "Scheduled", "status": "True"}])).clone(),
    ));
    assert_eq!(d.reason, reason::INSTANCE_PROVISIONING);
}

/// A Kairon Machine read from the API server with Kairon's conditions as kairon-controller
/// (`internal/controller/fencing.go`) and `kaironctl fence` write them.
fn read_with_conditions(phase: &str, node: Option<&str>, conditions: serde_json::Value) -> Machine {
    let mut value = serde_json::to_value(vm(Some(phase))).expect("json");
    value["status"]["conditions"] = conditions;
    match node {
        Some(n) => value["status"]["nodeName"] = serde_json::json!(n),
        None => {
            value["status"].as_object_mut().expect("status").remove("nodeName");
        }
    }
    super::super::machine_from_value(value)
}

/// Kairon's `NodeUnreachable=True` leaves the phase Running (nobody updates it): the
/// KaironMachine's instance is not provisioned any more, names the node, Kairon's reason and
/// what the operator can do; False again (the node back) is running again. A Machine an
/// operator fenced is Pending anew with `Fenced=True`: said, with Kairon's words.
#[test]
fn an_unreachable_or_fenced_kairon_node_is_said() {
    let unreachable = serde_json::json!([{"type": "NodeUnreachable", "status": "True",
        "reason": "NodeNotReadyOrMissing", "lastTransitionTime": "2026-12-05T10:00:00Z",
        "message": "node \"kairon-node-7\" is not Ready or no longer exists in the cluster"}]);
    let m = read_with_conditions("Running", Some("kairon-node-7"), unreachable);
    let d = instance_condition(&Vm::from(m.clone()));
    assert_eq!((d.status, d.reason), (Status::False, reason::INSTANCE_HOST_UNREACHABLE));
    for said in ["kairon-node-7", "NodeNotReadyOrMissing", "kaironctl fence", "m1"] {
        assert!(d.message.contains(said), "{said}: {}", d.message);
    }

    let back = serde_json::json!([{"type": "NodeUnreachable", "status": "False", "reason": "NodeReady",
        "message": "node \"kairon-node-7\" is Ready", "lastTransitionTime": "2026-12-05T10:05:00Z"}]);
    let d = instance_condition(&Vm::from(
        read_with_conditions("Running", Some("kairon-node-7"), back).clone(),
    ));
    assert_eq!((d.status, d.reason), (Status::True, reason::PROVISIONED));

    let fenced = serde_json::json!([
        {"type": "NodeUnreachable", "status": "True", "reason": "NodeNotReadyOrMissing", "message": "gone",
         "lastTransitionTime": "2026-12-05T10:00:00Z"},
        {"type": "Fenced", "status": "True", "reason": "OperatorAttested", "lastTransitionTime": "2026-12-05T10:09:00Z",
         "message": "fenced off node \"kairon-node-7\" by an operator: powered off"}]);
    let d = instance_condition(&Vm::from(read_with_conditions("Pending", None, fenced.clone()).clone()));
    assert_eq!((d.status, d.reason), (Status::False, reason::INSTANCE_FENCED));
    assert!(d.message.contains("powered off"), "{}", d.message);
    // Placed anew: the new VM's phase is the instance's, also when it is stopped later.
    let d = instance_condition(&Vm::from(
        read_with_conditions("Stopped", Some("kairon-node-2"), fenced.clone()).clone(),
    ));
    assert_eq!(d.reason, reason::INSTANCE_STOPPED);
    let d = instance_condition(&Vm::from(
        read_with_conditions("Running", Some("kairon-node-2"), fenced).clone(),
    ));
    assert_eq!((d.status, d.reason), (Status::True, reason::PROVISIONED));
}

/// A deletion that waits on Kairon's finalizers longer than the grace period says so, naming
/// the finalizers, the node and what the operator can do; before that, or without one of
/// Kairon's finalizers left, it is a deletion like any other.
#[test]
fn a_deletion_stuck_on_kairons_finalizer_says_so_after_the_grace_period() {
    let deleted_at = k8s_openapi::jiff::Timestamp::from_second(1_000_000).expect("time");
    let mut m = vm(Some("Running"));
    m.metadata.deletion_timestamp = Some(Time(deleted_at));
    m.metadata.finalizers = Some(vec!["kairon.zyvor.dev/runtime-cleanup".into()]);
    let grace = std::time::Duration::from_secs(300);
    let at = |secs: i64| Time(deleted_at + k8s_openapi::jiff::SignedDuration::from_secs(secs));
    assert_eq!(deletion_stuck(&Vm::from(m.clone()), &at(299), grace), None);
    let d = deletion_stuck(&Vm::from(m.clone()), &at(301), grace).expect("stuck");
    assert_eq!((d.status, d.reason), (Status::False, reason::INSTANCE_DELETION_STUCK));
    for said in ["kairon.zyvor.dev/runtime-cleanup", "kairon-node-7", "m1", "5m"] {
        assert!(d.message.contains(said), "{said}: {}", d.message);
    }
    m.metadata.finalizers = None;
    assert_eq!(
        deletion_stuck(&Vm::from(m.clone()), &at(3600), grace),
        None,
        "nothing holds it"
    );
}

#[test]
fn a_runtime_made_anew_after_the_bootstrapped_one_is_a_new_machine_in_every_phase_until_deleted() {
    use crate::kairon::bootstrap_runtime::BOOTSTRAP_RUNTIME_ANNOTATION as REC;
    let with = |phase: &str, runtime: Option<&str>, recorded: Option<&str>| {
        let mut m = vm(Some(phase));
        m.status.as_mut().unwrap().runtime_id = runtime.map(Into::into);
        if let Some(r) = recorded {
            m.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(REC.into(), r.into());
        }
        m
    };
    for phase in ["Starting", "Running", "Paused", "Halted", "Error", "Unknown"] {
        let d = instance_condition(&Vm::from(with(phase, Some("r2"), Some("r1")).clone()));
        assert_eq!(
            (d.status, d.reason),
            (Status::False, reason::INSTANCE_RECREATED),
            "{phase}"
        );
        assert!(
            d.message.contains("m1") && d.message.contains("fresh disk"),
            "{}",
            d.message
        );
    }
    for (case, m, want) in [
        (
            "the bootstrapped runtime",
            with("Running", Some("r1"), Some("r1")),
            reason::PROVISIONED,
        ),
        (
            "the first runtime, not yet recorded",
            with("Running", Some("r1"), None),
            reason::PROVISIONED,
        ),
        (
            "stopped: no runtime",
            with("Stopped", None, Some("r1")),
            reason::INSTANCE_STOPPED,
        ),
    ] {
        assert_eq!(instance_condition(&Vm::from(m.clone())).reason, want, "{case}");
    }
    let mut deleting = with("Running", Some("r2"), Some("r1"));
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    assert_eq!(
        instance_condition(&Vm::from(deleting.clone())).reason,
        reason::INSTANCE_TERMINATING
    );
}
