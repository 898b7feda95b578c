use super::*;
use crate::api::conditions::PAUSED;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// The status from every observation, as one table.
mod observations;

fn at(s: i64) -> Time {
    Time(Timestamp::from_second(s).unwrap())
}

fn vm(phase: &str) -> Box<kairon::Machine> {
    Box::new(kairon::fixtures::vm(Some(phase)))
}

/// `m` as the provider reads it.
fn seen(m: Box<kairon::Machine>) -> Box<kairon::Vm> {
    Box::new(kairon::Vm::read(*m))
}

/// A running VM in user mode, as Kairon reports it: no address.
fn unaddressed() -> Box<kairon::Machine> {
    let mut m = vm("Running");
    if let Some(status) = m.status.as_mut() {
        status.guest_ip = None;
        status.guest_ips = None;
    }
    m
}

#[test]
fn a_running_vm_without_an_address_names_its_mode_and_the_fix() {
    let s = next_status(
        None,
        StatusInput::Live(&Observed::InstanceWithoutNode(seen(unaddressed()))),
        None,
        &at(10),
    );
    let c = cond(&s, READY);
    assert!(
        c.message.contains("no address") && c.message.contains("network mode user") && c.message.contains("learnIP"),
        "{}",
        c.message
    );
    assert!(
        s.addresses
            .as_ref()
            .is_some_and(|a| a.iter().all(|a| a.type_ != "InternalIP"))
    );
}

fn cond<'a>(s: &'a KaironMachineStatus, t: &str) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    conditions::get(s.conditions.as_deref().unwrap(), t).unwrap_or_else(|| panic!("no {t} condition"))
}

fn waiting(r: &'static str) -> Observed {
    Observed::Waiting(Decided::new(INSTANCE_PROVISIONED, Status::False, r, "waiting"))
}

struct Case {
    name: &'static str,
    observed: Observed,
    ready: (&'static str, &'static str),
    instance: (&'static str, &'static str),
    provisioned: bool,
    failure_reason: Option<&'static str>,
}

#[test]
fn running_instance_fills_contract_fields() {
    let s = next_status(
        None,
        StatusInput::Live(&Observed::Instance(seen(vm("Running")))),
        None,
        &at(1),
    );
    assert_eq!(
        s.initialization,
        Some(Initialization {
            provisioned: Some(true)
        })
    );
    assert_eq!(s.addresses.as_ref().unwrap()[0].address, "10.42.0.17");
    assert_eq!(s.failure_domain.as_deref(), Some("zone-a"));
    let i = s.instance.as_ref().unwrap();
    assert_eq!(
        (i.name.as_str(), i.phase.as_deref(), i.host.as_deref()),
        ("m1", Some("Running"), Some("kairon-node-7"))
    );
}

/// Gone keeps who the instance was: the uid is what tells a Kairon Machine made later
/// under the same name (a restore) from the VM this KaironMachine provisioned.
#[test]
fn a_gone_instance_stays_recorded_by_uid_without_phase_or_host() {
    let running = next_status(
        None,
        StatusInput::Live(&Observed::Instance(seen(vm("Running")))),
        None,
        &at(1),
    );
    let recorded = running.instance.clone().expect("recorded");
    assert!(recorded.uid.is_some(), "the fixture VM has a uid");
    let gone = next_status(Some(&running), StatusInput::Live(&Observed::Gone), None, &at(2));
    assert_eq!(cond(&gone, INSTANCE_PROVISIONED).reason, reason::INSTANCE_NOT_FOUND);
    let i = gone.instance.expect("still recorded");
    assert_eq!((i.name, i.uid), (recorded.name, recorded.uid));
    assert_eq!(
        (i.phase, i.host),
        (None, None),
        "no phase or host of a VM that is not there"
    );
}

#[test]
fn same_observation_twice_gives_the_same_status() {
    // Steady state writes nothing: recomputing from an unchanged world must be equal.
    for observed in [
        Observed::Instance(seen(vm("Running"))),
        waiting(reason::WAITING_FOR_BOOTSTRAP_DATA),
        Observed::Gone,
    ] {
        let first = next_status(None, StatusInput::Live(&observed), Some(1), &at(10));
        let second = next_status(Some(&first), StatusInput::Live(&observed), Some(1), &at(20));
        assert_eq!(first, second, "{observed:?}");
    }
}

#[test]
fn pending_and_provisioning_are_one_status() {
    // Whether a reconcile sees Kairon's Pending, its Provisioning (with the host chosen),
    // or both, depends on how fast reconciles follow the watch: the status must not, or
    // the writes per machine grow when the client limit is lifted.
    let just_created = {
        let mut v = vm("Pending");
        v.status = None;
        Box::new(*v)
    };
    let mut provisioning = vm("Starting");
    provisioning.status.as_mut().unwrap().node_name = Some("kairon-node-7".into());
    let first = next_status(
        None,
        StatusInput::Live(&Observed::Instance(seen(just_created))),
        Some(1),
        &at(10),
    );
    for later in [vm("Pending"), provisioning] {
        let next = next_status(
            Some(&first),
            StatusInput::Live(&Observed::Instance(seen(later))),
            Some(1),
            &at(20),
        );
        assert_eq!(next, first);
    }
    let i = first.instance.as_ref().unwrap();
    assert_eq!((i.phase.as_deref(), i.host.as_deref()), (Some("Provisioning"), None));
    assert_eq!(cond(&first, READY).reason, reason::INSTANCE_PROVISIONING);
}

#[test]
fn transition_time_moves_only_with_status() {
    let pending = next_status(
        None,
        StatusInput::Live(&Observed::Instance(seen(vm("Pending")))),
        None,
        &at(10),
    );
    let provisioning = next_status(
        Some(&pending),
        StatusInput::Live(&Observed::Instance(seen(vm("Starting")))),
        None,
        &at(20),
    );
    assert_eq!(
        cond(&provisioning, READY).last_transition_time,
        at(10),
        "False -> False keeps the time"
    );
    assert_eq!(cond(&provisioning, READY).reason, reason::INSTANCE_PROVISIONING);
    let running = next_status(
        Some(&provisioning),
        StatusInput::Live(&Observed::Instance(seen(vm("Running")))),
        None,
        &at(30),
    );
    assert_eq!(
        cond(&running, READY).last_transition_time,
        at(30),
        "False -> True moves it"
    );
}

#[test]
fn provisioned_never_flips_back() {
    let running = next_status(
        None,
        StatusInput::Live(&Observed::Instance(seen(vm("Running")))),
        None,
        &at(10),
    );
    for later in [
        Observed::Instance(seen(vm("Stopped"))),
        Observed::Instance(seen(vm("Unknown"))),
        Observed::Gone,
    ] {
        let s = next_status(Some(&running), StatusInput::Live(&later), None, &at(20));
        assert!(s.is_provisioned(), "{later:?}");
        assert_eq!(cond(&s, READY).status, "False", "{later:?}");
    }
}

#[test]
fn paused_only_touches_the_paused_condition() {
    let running = next_status(
        None,
        StatusInput::Live(&Observed::Instance(seen(vm("Running")))),
        None,
        &at(10),
    );
    let paused = next_status(
        Some(&running),
        StatusInput::Paused("Cluster spec.paused is set to true"),
        None,
        &at(20),
    );
    assert_eq!(cond(&paused, PAUSED).status, "True");
    assert_eq!(cond(&paused, PAUSED).reason, reason::PAUSED);
    assert_eq!(cond(&paused, READY), cond(&running, READY));
    assert_eq!(paused.instance, running.instance);
    let resumed = next_status(
        Some(&paused),
        StatusInput::Live(&Observed::Instance(seen(vm("Running")))),
        None,
        &at(30),
    );
    assert_eq!(cond(&resumed, PAUSED).status, "False");
    assert_eq!(cond(&resumed, PAUSED).last_transition_time, at(30));
}

#[test]
fn deleting_sets_ready_false_deleting() {
    let s = next_status(
        None,
        StatusInput::Deleting(&Observed::Instance(seen(vm("Terminating")))),
        None,
        &at(10),
    );
    assert_eq!(cond(&s, READY).reason, reason::DELETING);
    assert_eq!(cond(&s, INSTANCE_PROVISIONED).reason, reason::INSTANCE_TERMINATING);
}

#[test]
fn first_failure_sticks() {
    let terminal = Observed::Terminal {
        condition: Decided::new(
            INSTANCE_PROVISIONED,
            Status::False,
            reason::UNSUPPORTED_BOOTSTRAP_DATA,
            "cloud-config key disk_setup",
        ),
        failure_reason: "InvalidConfiguration",
    };
    let failed = next_status(None, StatusInput::Live(&terminal), None, &at(10));
    let msg = failed
        .deprecated
        .as_ref()
        .unwrap()
        .v1beta1
        .as_ref()
        .unwrap()
        .failure_message
        .clone()
        .unwrap();
    assert!(msg.contains("disk_setup"), "{msg}");
    let gone = next_status(Some(&failed), StatusInput::Live(&Observed::Gone), None, &at(20));
    assert_eq!(gone.failure_reason(), Some("InvalidConfiguration"));
}

#[test]
fn a_recreated_vm_is_not_ready_with_or_without_an_address_and_stays_provisioned() {
    let recreated = |mut m: Box<kairon::Machine>| {
        m.status.as_mut().unwrap().runtime_id = Some("r2".into());
        m.metadata.annotations.get_or_insert_with(Default::default).insert(
            kairon::bootstrap_runtime::BOOTSTRAP_RUNTIME_ANNOTATION.into(),
            "r1".into(),
        );
        m
    };
    let before = next_status(
        None,
        StatusInput::Live(&Observed::Instance(seen(vm("Running")))),
        None,
        &at(10),
    );
    assert!(before.is_provisioned());
    for (case, m) in [("with an address", vm("Running")), ("without one", unaddressed())] {
        let s = next_status(
            Some(&before),
            StatusInput::Live(&Observed::Instance(seen(recreated(m)))),
            None,
            &at(20),
        );
        for type_ in [READY, INSTANCE_PROVISIONED] {
            let c = cond(&s, type_);
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("False", reason::INSTANCE_RECREATED),
                "{case}: {type_}"
            );
        }
        assert!(s.is_provisioned(), "{case}: provisioned never goes back");
    }
}
