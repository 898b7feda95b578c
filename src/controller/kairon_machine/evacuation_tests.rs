use super::*;
use crate::api::conditions;
use crate::capi::{ClusterCondition, MachineNodeReference, MachineSpec, MachineStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

const T0: &str = "2026-01-01T00:00:00Z";

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

#[derive(Clone, Copy, Default)]
struct M {
    cp: bool,
    mhc: bool,
    no_node: bool,
    marked: bool,
    ours: bool,
    deleting: bool,
    skip: bool,
}

fn machine(name: &str, m: M) -> capi::Machine {
    let mut machine = capi::Machine::new(name, MachineSpec::default());
    let owner = if m.cp { "KubeadmControlPlane" } else { "MachineSet" };
    machine.metadata.owner_references = Some(vec![OwnerReference {
        kind: owner.into(),
        controller: Some(true),
        ..Default::default()
    }]);
    if m.cp {
        machine.metadata.labels = Some([(capi::CONTROL_PLANE_LABEL.to_string(), String::new())].into());
    }
    let mut annotations = std::collections::BTreeMap::new();
    if m.marked {
        annotations.insert(capi::REMEDIATE_MACHINE_ANNOTATION.to_string(), String::new());
    }
    if m.ours {
        annotations.insert(capi::EVACUATION_ANNOTATION.to_string(), "h1".to_string());
    }
    if m.skip {
        annotations.insert(capi::SKIP_REMEDIATION_ANNOTATION.to_string(), String::new());
    }
    machine.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    if m.deleting {
        machine.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    }
    machine.status = Some(MachineStatus {
        node_ref: (!m.no_node).then(|| MachineNodeReference { name: name.into() }),
        conditions: m.mhc.then(|| {
            vec![ClusterCondition {
                type_: capi::HEALTH_CHECK_SUCCEEDED.into(),
                status: "True".into(),
            }]
        }),
    });
    machine
}

fn request(deadline: &str) -> Request {
    Request {
        host: "h1".into(),
        reason: "HostMaintenance".into(),
        deadline: Some(at(deadline)),
    }
}

fn previous(status: Status, message: &str) -> Condition {
    let mut c = vec![];
    conditions::set(
        &mut c,
        Decided::new(EVACUATION, status, reason::WAITING_FOR_TURN, message),
        None,
        &Time(at(T0)),
    );
    c.remove(0)
}

struct Case {
    name: &'static str,
    me: M,
    request: Option<&'static str>,
    stopped: bool,
    host: Option<&'static str>,
    previous: Option<Condition>,
    /// Why the Cluster is not whole, as it counts its Machines.
    short: Option<&'static str>,
    /// Other Machines of the cluster: name, shape, deadline of their evacuation.
    others: Vec<(&'static str, M, Option<&'static str>)>,
    act: Act,
    /// Status and reason of the condition (`None`: left as it is), and a word of its message.
    want: Option<(Status, &'static str, &'static str)>,
}

fn case(name: &'static str, me: M, act: Act, want: Option<(Status, &'static str, &'static str)>) -> Case {
    Case {
        name,
        me,
        request: Some("2026-01-01T01:00:00Z"),
        stopped: false,
        host: Some("h1"),
        previous: None,
        short: None,
        others: vec![],
        act,
        want,
    }
}

#[test]
fn what_an_evacuation_does_in_every_situation() {
    let mhc = M {
        mhc: true,
        ..M::default()
    };
    let cp_mhc = M { cp: true, ..mhc };
    let later = Some("2026-01-01T02:00:00Z");
    let earlier = Some("2026-01-01T00:30:00Z");
    let cases = vec![
        Case {
            request: None,
            ..case("nothing asked", mhc, Act::Nothing, None)
        },
        case(
            "a worker with a MachineHealthCheck is marked",
            mhc,
            Act::Mark,
            Some((Status::True, reason::REPLACEMENT_REQUESTED, "remediate-machine")),
        ),
        case(
            "a control plane with a MachineHealthCheck is marked",
            cp_mhc,
            Act::Mark,
            Some((Status::True, reason::REPLACEMENT_REQUESTED, "is marked")),
        ),
        case(
            "a MachineSet worker without one is deleted",
            M::default(),
            Act::Delete,
            Some((Status::True, reason::REPLACEMENT_REQUESTED, "is deleted")),
        ),
        case(
            "a control plane without one is never deleted",
            M {
                cp: true,
                ..M::default()
            },
            Act::Nothing,
            Some((
                Status::True,
                reason::NO_MACHINE_HEALTH_CHECK,
                "create a MachineHealthCheck",
            )),
        ),
        case(
            "skip-remediation blocks",
            M { skip: true, ..mhc },
            Act::Nothing,
            Some((Status::True, reason::REPLACEMENT_BLOCKED, "skip-remediation")),
        ),
        case(
            "already marked: nothing more",
            M { marked: true, ..mhc },
            Act::Nothing,
            Some((Status::True, reason::REPLACEMENT_REQUESTED, "h1")),
        ),
        case(
            "being deleted: replacing",
            M { deleting: true, ..mhc },
            Act::Nothing,
            Some((Status::True, reason::REPLACING, "drains its Node")),
        ),
        Case {
            others: vec![("a-other", M { deleting: true, ..mhc }, None)],
            ..case(
                "another Machine is being deleted",
                mhc,
                Act::Nothing,
                Some((Status::True, reason::WAITING_FOR_TURN, "a-other is being deleted")),
            )
        },
        Case {
            others: vec![("z-other", M { marked: true, ..mhc }, later)],
            ..case(
                "another Machine is marked and not yet acted on",
                mhc,
                Act::Nothing,
                Some((Status::True, reason::WAITING_FOR_TURN, "z-other is marked")),
            )
        },
        Case {
            others: vec![("new", M { no_node: true, ..mhc }, None)],
            ..case(
                "a replacement is still coming up",
                mhc,
                Act::Nothing,
                Some((Status::True, reason::WAITING_FOR_TURN, "new has no Node yet")),
            )
        },
        Case {
            others: vec![("z-first", mhc, earlier)],
            ..case(
                "an earlier deadline goes first",
                mhc,
                Act::Nothing,
                Some((Status::True, reason::WAITING_FOR_TURN, "z-first goes first")),
            )
        },
        Case {
            others: vec![("z-after", mhc, later), ("quiet", mhc, None)],
            ..case(
                "a later deadline and a Machine not evacuating wait",
                mhc,
                Act::Mark,
                Some((Status::True, reason::REPLACEMENT_REQUESTED, "marked")),
            )
        },
        Case {
            others: vec![("a-same", mhc, Some("2026-01-01T01:00:00Z"))],
            ..case(
                "the same deadline: the first name goes",
                mhc,
                Act::Nothing,
                Some((Status::True, reason::WAITING_FOR_TURN, "a-same goes first")),
            )
        },
        Case {
            others: vec![
                (
                    "a-stuck",
                    M {
                        cp: true,
                        ..M::default()
                    },
                    earlier,
                ),
                ("b-skip", M { skip: true, ..mhc }, earlier),
            ],
            ..case(
                "a Machine that cannot be replaced does not hold the others",
                mhc,
                Act::Mark,
                Some((Status::True, reason::REPLACEMENT_REQUESTED, "marked")),
            )
        },
        Case {
            request: None,
            stopped: true,
            host: None,
            ..case(
                "stopped at the deadline: still replaced, loudly",
                mhc,
                Act::Mark,
                Some((Status::True, reason::DEADLINE_EXCEEDED, "stopped the VM")),
            )
        },
        Case {
            request: None,
            stopped: true,
            host: None,
            ..case(
                "stopped at the deadline and being deleted: replacing",
                M { deleting: true, ..mhc },
                Act::Nothing,
                Some((Status::True, reason::REPLACING, "drains")),
            )
        },
        Case {
            request: None,
            previous: Some(previous(
                Status::True,
                "Kairon host h1 is in maintenance (deadline x): ...",
            )),
            ..case(
                "no longer asked, same host: cancelled",
                mhc,
                Act::Nothing,
                Some((Status::False, reason::CANCELED, "cancelled")),
            )
        },
        Case {
            request: None,
            host: Some("h2"),
            previous: Some(previous(
                Status::True,
                "Kairon host h1 is in maintenance (deadline x): ...",
            )),
            ..case(
                "no longer asked, another host: migrated",
                mhc,
                Act::Nothing,
                Some((Status::False, reason::MIGRATED, "h2")),
            )
        },
        Case {
            request: None,
            previous: Some(previous(
                Status::True,
                "Kairon host h1 is in maintenance (deadline x): ...",
            )),
            ..case(
                "no longer asked, but marked by us: the replacement goes on",
                M {
                    marked: true,
                    ours: true,
                    ..mhc
                },
                Act::Nothing,
                Some((Status::True, reason::REPLACEMENT_REQUESTED, "no longer asks")),
            )
        },
        Case {
            request: None,
            previous: Some(previous(Status::False, "over")),
            ..case("over already: left as it is", mhc, Act::Nothing, None)
        },
    ];
    let now = at(T0);
    let cases = cases.into_iter().chain([
        Case {
            short: Some("its workers have 1 of 2 Machines available (1 in all)"),
            ..case(
                "the Cluster misses a replacement not yet created: wait",
                mhc,
                Act::Nothing,
                Some((Status::True, reason::WAITING_FOR_TURN, "1 of 2")),
            )
        },
        Case {
            short: Some("its workers have 1 of 2 Machines available (2 in all)"),
            stopped: true,
            ..case(
                "the Cluster misses this very VM, stopped at the deadline: marked",
                mhc,
                Act::Mark,
                Some((Status::True, reason::DEADLINE_EXCEEDED, "marked")),
            )
        },
    ]);
    for c in cases {
        let me = machine("m-me", c.me);
        let others: Vec<(capi::Machine, Option<Option<Timestamp>>)> = c
            .others
            .iter()
            .map(|(n, m, d)| (machine(n, *m), d.map(|d| Some(at(d)))))
            .collect();
        let req = c.request.map(request);
        let own = Own {
            machine: &me,
            request: req.as_ref(),
            stopped_at_deadline: c.stopped,
            host: c.host,
            previous: c.previous.as_ref(),
            cluster_short: c.short,
        };
        let mut peers: Vec<Peer<'_>> = others
            .iter()
            .map(|(m, e)| Peer {
                machine: m,
                evacuating: *e,
            })
            .collect();
        peers.push(Peer {
            machine: &me,
            evacuating: req.as_ref().map(|r| r.deadline),
        });
        let d = decide(&own, &peers, now);
        assert_eq!(d.act, c.act, "{}: act", c.name);
        match (c.want, &d.condition) {
            (None, None) => {}
            (Some((status, r, word)), Some(got)) => {
                assert_eq!((got.status, got.reason), (status, r), "{}: {}", c.name, got.message);
                assert!(
                    got.message.contains(word),
                    "{}: {:?} lacks {word:?}",
                    c.name,
                    got.message
                );
            }
            (want, got) => panic!("{}: want {want:?}, got {got:?}", c.name),
        }
    }
}

/// Every evacuating Machine of a cluster decides from the same caches: exactly one goes.
#[test]
fn of_several_evacuating_machines_exactly_one_goes() {
    let mhc = M {
        mhc: true,
        ..M::default()
    };
    let deadlines = [
        ("w1", "2026-01-01T01:00:00Z"),
        ("w2", "2026-01-01T00:40:00Z"),
        ("cp1", "2026-01-01T00:40:00Z"),
    ];
    let machines: Vec<capi::Machine> = deadlines.iter().map(|(n, _)| machine(n, mhc)).collect();
    let requests: Vec<Request> = deadlines.iter().map(|(_, d)| request(d)).collect();
    let peers: Vec<Peer<'_>> = machines
        .iter()
        .zip(&requests)
        .map(|(m, r)| Peer {
            machine: m,
            evacuating: Some(r.deadline),
        })
        .collect();
    let going: Vec<&str> = machines
        .iter()
        .zip(&requests)
        .filter(|(m, r)| {
            let own = Own {
                machine: m,
                request: Some(r),
                stopped_at_deadline: false,
                host: Some("h1"),
                previous: None,
                cluster_short: None,
            };
            decide(&own, &peers, at(T0)).act == Act::Mark
        })
        .map(|(m, _)| name(m))
        .collect();
    assert_eq!(going, ["cp1"], "earliest deadline, then the first name");
}

#[test]
fn a_paused_evacuation_waits_for_unpause() {
    let m = machine("m1", M::default());
    let r = request("2026-01-01T01:00:00Z");
    let own = Own {
        machine: &m,
        request: Some(&r),
        stopped_at_deadline: false,
        host: Some("h1"),
        previous: None,
        cluster_short: None,
    };
    let d = while_paused(&own, "Cluster spec.paused is set to true").unwrap();
    assert_eq!((d.status, d.reason), (Status::True, reason::WAITING_FOR_UNPAUSE));
    assert!(
        d.message
            .starts_with("Kairon host h1 is in maintenance (deadline 2026-01-01T01:00:00Z)"),
        "{}",
        d.message
    );
    assert!(d.message.contains("spec.paused"), "{}", d.message);
    let quiet = Own { request: None, ..own };
    assert_eq!(while_paused(&quiet, "paused"), None, "nothing asked: nothing said");
}

#[test]
fn looks_again_before_the_deadline() {
    let r = request("2026-01-01T00:01:00Z");
    let now = at(T0);
    assert_eq!(
        until_deadline(Some(&r), now, Duration::from_secs(300)),
        Duration::from_secs(60)
    );
    assert_eq!(
        until_deadline(Some(&r), now, Duration::from_secs(30)),
        Duration::from_secs(30)
    );
    let past = request("2025-01-01T00:00:00Z");
    assert_eq!(
        until_deadline(Some(&past), now, Duration::from_secs(300)),
        Duration::from_secs(5)
    );
    assert_eq!(
        until_deadline(None, now, Duration::from_secs(300)),
        Duration::from_secs(300)
    );
}
