use super::*;
use capkr::kairon::{GuestAgent, Network};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

fn machine(phase: Option<&str>, finalizer: bool, deleting: bool, annotations: &[(&str, &str)]) -> Machine {
    Machine {
        metadata: ObjectMeta {
            name: Some("m".into()),
            namespace: Some("default".into()),
            uid: Some("uid-1".into()),
            finalizers: finalizer.then(|| vec![FINALIZER.to_string()]),
            deletion_timestamp: deleting.then_some(Time(Timestamp::UNIX_EPOCH)),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Default::default(),
        status: phase.map(|p| MachineStatus {
            phase: Some(p.to_string()),
            ..Default::default()
        }),
    }
}

#[test]
fn phase_transitions() {
    let fail = [(FAIL_ANNOTATION, "ImageNotFound")];
    let with_power = |p: Option<&str>, power: &str| {
        let mut m = machine(p, true, false, &[]);
        m.spec.power_state = Some(power.to_string());
        m
    };
    #[rustfmt::skip]
    let cases: Vec<(&str, Machine, bool, Step)> = vec![
        ("new machine gets the finalizer first", machine(None, false, false, &[]), false, Step::AddFinalizer),
        ("finalizer lost is re-added", machine(Some(phase::RUNNING), false, false, &[]), false, Step::AddFinalizer),
        ("then it is accepted", machine(None, true, false, &[]), false, Step::Accept),
        ("empty phase counts as none", machine(Some(""), true, false, &[]), false, Step::Accept),
        ("pending waits for its timer", machine(Some(phase::PENDING), true, false, &[]), false, Step::Wait),
        ("pending is placed when due", machine(Some(phase::PENDING), true, false, &[]), true, Step::Place),
        ("starting waits", machine(Some(phase::STARTING), true, false, &[]), false, Step::Wait),
        ("starting boots when due", machine(Some(phase::STARTING), true, false, &[]), true, Step::Boot),
        ("forced failure waits for boot", machine(Some(phase::STARTING), true, false, &fail), false, Step::Wait),
        ("an error waits for its timer", machine(Some(phase::ERROR), true, false, &fail), false, Step::Wait),
        ("an error is retried when due", machine(Some(phase::ERROR), true, false, &fail), true, Step::Boot),
        ("running is steady", machine(Some(phase::RUNNING), true, false, &[]), true, Step::Wait),
        ("running with fail annotation: the runtime fails now", machine(Some(phase::RUNNING), true, false, &fail), false, Step::Fail),
        ("a failed runtime (Unknown) is not repaired", machine(Some(phase::UNKNOWN), true, false, &fail), true, Step::Wait),
        ("stopped with Running wanted is created again", machine(Some(phase::STOPPED), true, false, &[]), true, Step::PowerOn),
        ("running, Paused wanted", with_power(Some(phase::RUNNING), "Paused"), false, Step::PowerOff(power::PAUSED)),
        ("running, Halted wanted", with_power(Some(phase::RUNNING), "Halted"), false, Step::PowerOff(power::HALTED)),
        ("running, Stopped wanted", with_power(Some(phase::RUNNING), "Stopped"), false, Step::PowerOff(power::STOPPED)),
        ("paused, Halted wanted", with_power(Some(phase::PAUSED), "Halted"), false, Step::PowerOff(power::HALTED)),
        ("paused stays paused", with_power(Some(phase::PAUSED), "Paused"), true, Step::Wait),
        ("halted stays halted", with_power(Some(phase::HALTED), "Halted"), true, Step::Wait),
        ("paused, Running wanted: resumed", with_power(Some(phase::PAUSED), "Running"), false, Step::PowerOn),
        ("halted, Running wanted: started", with_power(Some(phase::HALTED), "Running"), false, Step::PowerOn),
        ("an unknown power state reads as Running", with_power(Some(phase::RUNNING), "Hibernate"), true, Step::Wait),
        ("deleted keeps its phase and waits", machine(Some(phase::RUNNING), true, true, &[]), false, Step::Wait),
        ("deleted releases when due", machine(Some(phase::RUNNING), true, true, &[]), true, Step::ReleaseFinalizer),
        ("deleted while pending too", machine(Some(phase::PENDING), true, true, &[]), true, Step::ReleaseFinalizer),
        ("deleted before acceptance", machine(None, true, true, &[]), false, Step::Wait),
        ("deleted before acceptance, when due", machine(None, true, true, &[]), true, Step::ReleaseFinalizer),
        ("deleted without our finalizer is left alone", machine(Some(phase::RUNNING), false, true, &[]), true, Step::Wait),
    ];
    for (name, m, due, want) in cases {
        assert_eq!(next_step(&m, due), want, "{name}");
    }
}

#[test]
fn a_machine_created_stopped_or_halted_is_left_alone_until_it_is_asked_to_run() {
    let new = |finalizer: bool, power: Option<&str>| {
        let mut m = machine(None, finalizer, false, &[]);
        m.spec.power_state = power.map(str::to_string);
        m
    };
    let mut pending_unplaced = machine(Some(phase::PENDING), true, false, &[]);
    pending_unplaced.spec.power_state = Some(power::STOPPED.into());
    let mut deleted = new(false, Some(power::STOPPED));
    deleted.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    #[rustfmt::skip]
    let cases: Vec<(&str, Machine, bool, Step)> = vec![
        ("Stopped: no finalizer, no status", new(false, Some(power::STOPPED)), true, Step::Wait),
        ("Halted: no finalizer, no status", new(false, Some(power::HALTED)), true, Step::Wait),
        ("Stopped with a finalizer someone added: still no status", new(true, Some(power::STOPPED)), true, Step::Wait),
        ("Paused is scheduled as usual", new(false, Some(power::PAUSED)), false, Step::AddFinalizer),
        ("asked to run: the finalizer, as any new Machine", new(false, Some(power::RUNNING)), false, Step::AddFinalizer),
        ("powerState removed: the same", new(false, None), false, Step::AddFinalizer),
        ("then accepted", new(true, Some(power::RUNNING)), false, Step::Accept),
        ("Pending without a host, Stopped asked: not placed", pending_unplaced.clone(), true, Step::Wait),
        ("deleted before it ever ran, no finalizer: left to go", deleted, true, Step::Wait),
    ];
    for (name, m, due, want) in cases {
        assert_eq!(next_step(&m, due), want, "{name}");
    }
    pending_unplaced.spec.power_state = Some(power::RUNNING.into());
    assert_eq!(
        next_step(&pending_unplaced, true),
        Step::Place,
        "placed once asked to run"
    );
}

#[test]
fn power_states_write_what_kairon_node_writes() {
    let now = Timestamp::UNIX_EPOCH;
    let mut m = machine(Some(phase::RUNNING), true, false, &[]);
    // A netns guest: Kairon reports its address, and shows when it is kept.
    m.spec.network = Some(Network {
        mode: Some("tap".into()),
        netns: Some(true),
        ..Default::default()
    });
    let running = running_status(&m, "10.0.0.5", now);
    let runtime = Some("rt-1".to_string());
    m.status = Some(MachineStatus {
        runtime_id: runtime.clone(),
        ..running
    });
    let ready = |s: &MachineStatus| {
        let c = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == CONDITION_READY)
            .unwrap();
        (c.status.clone(), c.reason.clone())
    };

    let paused = powered_off_status(&m, power::PAUSED, now);
    assert_eq!(paused.phase.as_deref(), Some(phase::PAUSED));
    assert_eq!(
        (paused.runtime_id.clone(), paused.guest_ip.as_deref()),
        (runtime.clone(), Some("10.0.0.5"))
    );
    assert_eq!(ready(&paused), ("False".into(), "Paused".into()));
    let resumed = powered_on_status(
        &Machine {
            status: Some(paused),
            ..m.clone()
        },
        now,
    );
    assert_eq!(resumed.phase.as_deref(), Some(phase::RUNNING), "resumed in place");
    assert_eq!(ready(&resumed), ("True".into(), REASON_RECONCILED.into()));

    let halted = powered_off_status(&m, power::HALTED, now);
    assert_eq!(
        (halted.runtime_id.clone(), halted.guest_ip.clone()),
        (runtime.clone(), None)
    );
    assert_eq!(ready(&halted), ("False".into(), "Halted".into()));
    let started = powered_on_status(
        &Machine {
            status: Some(halted),
            ..m.clone()
        },
        now,
    );
    assert_eq!(started.phase.as_deref(), Some(phase::STARTING));
    assert_eq!(started.runtime_id, runtime, "started again on its kept runtime");

    let stopped = powered_off_status(&m, power::STOPPED, now);
    assert_eq!(
        (
            stopped.runtime_id.clone(),
            stopped.guest_ip.clone(),
            stopped.guest_ips.clone()
        ),
        (None, None, None)
    );
    assert_eq!(ready(&stopped), ("False".into(), "PoweredOff".into()));
    let created = powered_on_status(
        &Machine {
            status: Some(stopped),
            ..m.clone()
        },
        now,
    );
    assert_eq!(created.phase.as_deref(), Some(phase::STARTING));
    assert!(
        created.runtime_id.is_some() && created.runtime_id != runtime,
        "a new runtime"
    );

    let failed = runtime_failed_status(&m, now);
    assert_eq!(failed.phase.as_deref(), Some(phase::UNKNOWN));
    assert_eq!(failed.message, None, "the reconcile itself was clean");
    let error = error_status(&m, "create runtime: disk full", now);
    assert_eq!(error.phase.as_deref(), Some(phase::ERROR));
    assert_eq!(error.message.as_deref(), Some("create runtime: disk full"));
    assert_eq!(ready(&error), ("False".into(), REASON_RECONCILE_FAILED.into()));
    let recovered = running_status(
        &Machine {
            status: Some(error),
            ..m.clone()
        },
        "10.0.0.5",
        now,
    );
    assert_eq!(recovered.message, None, "a clean reconcile clears the message");
}

#[test]
fn clocks_follow_phase() {
    assert_eq!(
        clock_of(&machine(Some(phase::PENDING), true, false, &[])),
        Some(Clock::Provision)
    );
    assert_eq!(
        clock_of(&machine(Some(phase::STARTING), true, false, &[])),
        Some(Clock::Boot)
    );
    assert_eq!(clock_of(&machine(Some(phase::RUNNING), true, false, &[])), None);
    assert_eq!(
        clock_of(&machine(Some(phase::RUNNING), true, true, &[])),
        Some(Clock::Delete)
    );
    assert_eq!(clock_of(&machine(Some(phase::RUNNING), false, true, &[])), None);
}

#[test]
fn jitter_stays_within_bounds() {
    let base = Duration::from_secs(10);
    let cases = [
        (0.2, 0.0, Duration::from_secs(8)),
        (0.2, 0.5, Duration::from_secs(10)),
        (0.2, 0.999_999, Duration::from_secs(12)),
        (0.0, 0.9, Duration::from_secs(10)),
        (1.0, 0.0, Duration::ZERO),
    ];
    for (fraction, roll, want) in cases {
        let got = jittered(base, fraction, roll);
        assert!(
            got.abs_diff(want) < Duration::from_millis(1),
            "{fraction} {roll}: {got:?}"
        );
    }
    for _ in 0..1000 {
        let got = jittered(base, 0.2, fastrand::f64());
        assert!(
            (Duration::from_secs(8)..=Duration::from_secs(12)).contains(&got),
            "{got:?}"
        );
    }
    assert_eq!(jittered(Duration::ZERO, 0.5, 0.7), Duration::ZERO);
}

#[test]
fn boot_outcomes() {
    let plain = machine(Some(phase::STARTING), true, false, &[]);
    let forced = machine(Some(phase::STARTING), true, false, &[(FAIL_ANNOTATION, "DiskFull")]);
    assert_eq!(boot_outcome(&plain, 0.0, 0.0), BootOutcome::Running);
    assert_eq!(boot_outcome(&plain, 0.5, 0.7), BootOutcome::Running);
    assert!(matches!(boot_outcome(&plain, 0.5, 0.3), BootOutcome::Error(e) if e.contains("--failure-rate")));
    assert!(matches!(boot_outcome(&forced, 0.0, 0.9), BootOutcome::Error(e) if e.contains("DiskFull")));
}

#[test]
fn node_ready_annotation() {
    assert!(node_should_be_ready(&machine(None, true, false, &[])));
    assert!(node_should_be_ready(&machine(
        None,
        true,
        false,
        &[(NODE_READY_ANNOTATION, "true")]
    )));
    assert!(!node_should_be_ready(&machine(
        None,
        true,
        false,
        &[(NODE_READY_ANNOTATION, "false")]
    )));
}

#[test]
fn statuses_carry_what_each_phase_promises() {
    let now = Timestamp::UNIX_EPOCH;
    let m = machine(None, true, false, &[]);
    let accepted = accepted_status(&m);
    assert_eq!(accepted.phase.as_deref(), Some(phase::PENDING));
    assert_eq!(accepted.runtime_id, None, "no runtime before the VM is placed");

    let m = Machine {
        status: Some(accepted),
        ..m
    };
    let provisioning = starting_status(&m, "kairon-node-2", "rt-1".into());
    assert_eq!(provisioning.node_name.as_deref(), Some("kairon-node-2"));
    assert_eq!(provisioning.runtime_id.as_deref(), Some("rt-1"));

    let m = Machine {
        status: Some(provisioning),
        ..m
    };
    let running = running_status(&m, "10.42.0.7", now);
    assert_eq!(running.phase.as_deref(), Some(phase::RUNNING));
    assert_eq!(
        (running.guest_ip.as_deref(), running.guest_ips.as_ref()),
        (None, None),
        "user mode (no spec.network): Kairon has no address to report"
    );
    assert_eq!(running.runtime_id.as_deref(), Some("rt-1"), "the same runtime boots");
    let types: BTreeMap<String, String> = running
        .conditions
        .iter()
        .flatten()
        .map(|c| (c.type_.clone(), c.status.clone()))
        .collect();
    assert_eq!(
        types.get(CONDITION_SCHEDULED),
        None,
        "Kairon never writes Scheduled=True"
    );
    assert_eq!(types.get(CONDITION_READY).map(String::as_str), Some("True"));
}

#[test]
fn a_running_status_reports_the_address_only_where_kairon_knows_it() {
    let now = Timestamp::UNIX_EPOCH;
    let tap = |learn_ip: Option<bool>| Network {
        mode: Some("tap".into()),
        bridge: Some("br0".into()),
        learn_ip,
        ..Default::default()
    };
    let netns = Network {
        mode: Some("tap".into()),
        netns: Some(true),
        ..Default::default()
    };
    let macvtap = Network {
        mode: Some("macvtap".into()),
        parent: Some("eth1".into()),
        learn_ip: Some(true),
        ..Default::default()
    };
    let agent = Some(GuestAgent { enabled: Some(true) });
    type Case = (&'static str, Option<Network>, Option<GuestAgent>, Option<&'static str>);
    let cases: Vec<Case> = vec![
        ("no network: user mode, no lease", None, None, None),
        (
            "user mode + guest agent: slirp's address",
            None,
            agent.clone(),
            Some("10.0.2.15"),
        ),
        (
            "user mode, agent disabled",
            None,
            Some(GuestAgent { enabled: Some(false) }),
            None,
        ),
        ("tap on a bridge: not learned", Some(tap(None)), None, None),
        ("tap on a bridge, learnIP false", Some(tap(Some(false))), None, None),
        ("tap + learnIP", Some(tap(Some(true))), None, Some("10.42.0.7")),
        ("tap + guest agent", Some(tap(None)), agent.clone(), Some("10.42.0.7")),
        ("tap + netns: always", Some(netns), None, Some("10.42.0.7")),
        // FluxVM's VM edge, which learns addresses, hooks taps only.
        ("macvtap + learnIP: nothing learned", Some(macvtap.clone()), None, None),
        ("macvtap + guest agent", Some(macvtap), agent.clone(), Some("10.42.0.7")),
    ];
    for (name, network, guest_agent, want) in cases {
        let mut m = machine(Some(phase::STARTING), true, false, &[]);
        m.spec.network = network;
        m.spec.guest_agent = guest_agent;
        let running = running_status(&m, "10.42.0.7", now);
        assert_eq!(running.guest_ip.as_deref(), want, "{name}");
        assert_eq!(running.guest_ips, want.map(|a| vec![a.to_string()]), "{name}");
    }
}

#[test]
fn every_runtime_gets_a_fresh_id() {
    let ids: std::collections::BTreeSet<String> = (0..100).map(|_| new_runtime_id()).collect();
    assert_eq!(ids.len(), 100);
    for id in &ids {
        let groups: Vec<usize> = id.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{id}");
        assert!(id.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()), "{id}");
    }
}

#[test]
fn condition_transition_time_moves_only_on_change() {
    let t0 = Timestamp::UNIX_EPOCH;
    let t1 = Timestamp::from_second(100).unwrap();
    let mut status = MachineStatus::default();
    set_condition(&mut status, CONDITION_READY, true, REASON_RECONCILED, "", t0);
    set_condition(&mut status, CONDITION_READY, true, REASON_RECONCILED, "again", t1);
    let c = &status.conditions.as_ref().unwrap()[0];
    assert_eq!((c.last_transition_time.0, c.message.as_str()), (t0, "again"));
    set_condition(&mut status, CONDITION_READY, false, REASON_RECONCILE_FAILED, "", t1);
    let c = &status.conditions.as_ref().unwrap()[0];
    assert_eq!(c.last_transition_time.0, t1);
    assert_eq!(status.conditions.as_ref().unwrap().len(), 1);
}

#[test]
fn an_unschedulable_machine_stays_pending_and_says_why_and_the_false_stays_once_placed() {
    let now = Timestamp::UNIX_EPOCH;
    let m = machine(Some(phase::PENDING), true, false, &[]);
    let waiting = unschedulable_status(&m, "no host matches nodeSelector {zone=z}", now);
    assert_eq!(waiting.phase.as_deref(), Some(phase::PENDING));
    let c = &waiting.conditions.as_ref().unwrap()[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        (CONDITION_SCHEDULED, "False", REASON_UNSCHEDULABLE)
    );
    assert_eq!(c.message, "no host matches nodeSelector {zone=z}");
    assert_eq!(
        next_step(
            &Machine {
                status: Some(waiting.clone()),
                ..m.clone()
            },
            true
        ),
        Step::Place
    );
    let placed = starting_status(
        &Machine {
            status: Some(waiting),
            ..m
        },
        "h1",
        "rt".into(),
    );
    assert_eq!(placed.conditions.unwrap()[0].status, "False", "as Kairon leaves it");
}

#[test]
fn a_runtime_is_made_and_seeded_anew_when_placed_or_run_after_stopped_only() {
    let with_runtime = |phase: &str, runtime: Option<&str>| {
        let mut m = machine(Some(phase), true, false, &[]);
        m.status.as_mut().unwrap().runtime_id = runtime.map(Into::into);
        m
    };
    let rows = [
        ("placed", Step::Place, with_runtime(phase::PENDING, None), true),
        (
            "run after Stopped (runtime deleted)",
            Step::PowerOn,
            with_runtime(phase::STOPPED, None),
            true,
        ),
        (
            "run after Halted (runtime kept)",
            Step::PowerOn,
            with_runtime(phase::HALTED, Some("rt-1")),
            false,
        ),
        (
            "resumed after Paused",
            Step::PowerOn,
            with_runtime(phase::PAUSED, Some("rt-1")),
            false,
        ),
        (
            "booting",
            Step::Boot,
            with_runtime(phase::STARTING, Some("rt-1")),
            false,
        ),
        (
            "powered off",
            Step::PowerOff("Stopped"),
            with_runtime(phase::RUNNING, Some("rt-1")),
            false,
        ),
    ];
    for (case, step, m, want) in rows {
        assert_eq!(creates_runtime(&step, &m), want, "{case}");
        if step == Step::PowerOn {
            // The status written says the same: a new runtime id exactly when one is made.
            let next = powered_on_status(&m, Timestamp::UNIX_EPOCH);
            let made = status_runtime(Some(&next)) != status_runtime(m.status.as_ref());
            assert_eq!(made, want, "{case}: the status written");
        }
    }
}
