use super::*;
use crate::api::conditions;
use crate::capi::{ClusterCondition, MachineNodeReference, MachineSpec, MachineStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;

#[derive(Clone, Copy, Default)]
pub(super) struct M {
    pub(super) cp: bool,
    pub(super) pool: bool,
    /// A MachineHealthCheck selects it now.
    pub(super) mhc: bool,
    /// It has the `HealthCheckSucceeded` condition a MachineHealthCheck left behind.
    pub(super) stale: bool,
    pub(super) no_node: bool,
    /// Phase `Failed`.
    pub(super) failed: bool,
    /// Created longer ago than a Node takes to start.
    pub(super) old: bool,
    pub(super) marked: bool,
    pub(super) ours: bool,
    pub(super) deleting: bool,
    pub(super) skip: bool,
}

pub(super) fn machine(name: &str, m: M) -> capi::MachineView {
    let mut machine = capi::Machine::new(name, MachineSpec::default());
    let owner = match (m.cp, m.pool) {
        (true, _) => "KubeadmControlPlane",
        (false, true) => "MachinePool",
        (false, false) => "MachineSet",
    };
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
        conditions: (m.mhc || m.stale).then(|| {
            vec![ClusterCondition {
                type_: capi::HEALTH_CHECK_SUCCEEDED.into(),
                status: "True".into(),
            }]
        }),
        phase: m.failed.then(|| "Failed".into()),
    });
    let age = if m.old { 3600 } else { 60 };
    machine.metadata.creation_timestamp = Some(Time(now() - k8s_openapi::jiff::SignedDuration::from_secs(age)));
    capi::MachineView::cached(machine)
}

fn now() -> Timestamp {
    "2026-01-01T01:00:00Z".parse().unwrap()
}

fn request() -> Request {
    Request { host: "h1".into() }
}

fn previous(status: Status, message: &str) -> Condition {
    let mut c = vec![];
    conditions::set(
        &mut c,
        Decided::new(EVACUATION, status, reason::WAITING_FOR_TURN, message),
        None,
        &Time(Timestamp::UNIX_EPOCH),
    );
    c.remove(0)
}

pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) me: M,
    /// The VM's node is cordoned.
    pub(super) request: bool,
    pub(super) host: Option<&'static str>,
    pub(super) previous: Option<Condition>,
    /// Why the Cluster is not whole, as it counts its Machines, and how many it misses.
    pub(super) short: Option<(&'static str, u32)>,
    /// Seconds left of the grace period.
    pub(super) grace_left: Option<u64>,
    /// Other Machines of the cluster: name, shape, whether their VM's node is cordoned.
    pub(super) others: Vec<(&'static str, M, bool)>,
    pub(super) act: Act,
    /// Status and reason of the condition (`None`: left as it is), and a word of its message.
    pub(super) want: Option<(Status, &'static str, &'static str)>,
}

pub(super) fn case(name: &'static str, me: M, act: Act, want: Option<(Status, &'static str, &'static str)>) -> Case {
    Case {
        name,
        me,
        request: true,
        host: Some("h1"),
        previous: None,
        short: None,
        grace_left: None,
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
    let cases = vec![
        Case {
            request: false,
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
            "a MachinePool worker without one is deleted",
            M {
                pool: true,
                ..M::default()
            },
            Act::Delete,
            Some((
                Status::True,
                reason::REPLACEMENT_REQUESTED,
                "its MachinePool replaces it",
            )),
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
            others: vec![("a-other", M { deleting: true, ..mhc }, false)],
            ..case(
                "another Machine is being deleted",
                mhc,
                Act::Nothing,
                Some((Status::True, reason::WAITING_FOR_TURN, "a-other is being deleted")),
            )
        },
        Case {
            others: vec![("z-other", M { marked: true, ..mhc }, true)],
            ..case(
                "another Machine is marked and not yet acted on",
                mhc,
                Act::Nothing,
                Some((Status::True, reason::WAITING_FOR_TURN, "z-other is marked")),
            )
        },
        Case {
            others: vec![("new", M { no_node: true, ..mhc }, false)],
            ..case(
                "a replacement is still coming up",
                mhc,
                Act::Nothing,
                Some((Status::True, reason::WAITING_FOR_TURN, "new has no Node yet")),
            )
        },
        Case {
            grace_left: Some(20),
            ..case(
                "cordoned a moment ago: the operator may still migrate it",
                mhc,
                Act::Nothing,
                Some((
                    Status::True,
                    reason::WAITING_FOR_MIGRATION,
                    "unless it is migrated off first",
                )),
            )
        },
        Case {
            grace_left: Some(20),
            ..case(
                "no health check is said at once, grace or not",
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
            )
        },
        Case {
            others: vec![("a-first", mhc, true)],
            ..case(
                "an earlier name on a cordoned node goes first",
                mhc,
                Act::Nothing,
                Some((Status::True, reason::WAITING_FOR_TURN, "a-first goes first")),
            )
        },
        Case {
            others: vec![("z-after", mhc, true), ("a-quiet", mhc, false)],
            ..case(
                "a later name and a Machine on a node not cordoned wait",
                mhc,
                Act::Mark,
                Some((Status::True, reason::REPLACEMENT_REQUESTED, "marked")),
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
                    true,
                ),
                ("b-skip", M { skip: true, ..mhc }, true),
            ],
            ..case(
                "a Machine that cannot be replaced does not hold the others",
                mhc,
                Act::Mark,
                Some((Status::True, reason::REPLACEMENT_REQUESTED, "marked")),
            )
        },
        Case {
            request: false,
            previous: Some(previous(Status::True, "Kairon node h1 is cordoned: ...")),
            ..case(
                "no longer asked, same host: cancelled",
                mhc,
                Act::Nothing,
                Some((Status::False, reason::CANCELED, "no longer cordoned")),
            )
        },
        Case {
            request: false,
            host: Some("h2"),
            previous: Some(previous(Status::True, "Kairon node h1 is cordoned: ...")),
            ..case(
                "no longer asked, another host: migrated",
                mhc,
                Act::Nothing,
                Some((Status::False, reason::MIGRATED, "h2")),
            )
        },
        Case {
            request: false,
            previous: Some(previous(Status::True, "Kairon node h1 is cordoned: ...")),
            ..case(
                "no longer asked, but marked by us: the replacement goes on",
                M {
                    marked: true,
                    ours: true,
                    ..mhc
                },
                Act::Nothing,
                Some((Status::True, reason::REPLACEMENT_REQUESTED, "no longer cordoned")),
            )
        },
        Case {
            request: false,
            previous: Some(previous(Status::False, "over")),
            ..case("over already: left as it is", mhc, Act::Nothing, None)
        },
    ];
    let cases = cases.into_iter().chain([Case {
        short: Some(("its workers have 1 of 2 Machines available (1 in all)", 1)),
        ..case(
            "the Cluster misses a replacement not yet created: wait",
            mhc,
            Act::Nothing,
            Some((Status::True, reason::WAITING_FOR_TURN, "1 of 2")),
        )
    }]);
    check(cases);
}

/// Runs each case of a table: the decision's act and its condition's status, reason and a
/// word of its message.
pub(super) fn check(cases: impl IntoIterator<Item = Case>) {
    for c in cases {
        let me = machine("m-me", c.me);
        let others: Vec<(capi::MachineView, bool)> = c.others.iter().map(|(n, m, e)| (machine(n, *m), *e)).collect();
        let req = c.request.then(request);
        let own = Own {
            machine: &me,
            request: req.as_ref(),
            host: c.host,
            grace_left: c.grace_left.map(Duration::from_secs),
            grace: Duration::from_secs(60),
            previous: c.previous.as_ref(),
            cluster_short: c.short,
            health_checked: c.me.mhc,
            now: now(),
        };
        let mut peers: Vec<Peer<'_>> = others
            .iter()
            .zip(&c.others)
            .map(|((m, e), (_, shape, _))| Peer {
                machine: m,
                evacuating: *e,
                health_checked: shape.mhc,
            })
            .collect();
        peers.push(Peer {
            machine: &me,
            evacuating: req.is_some(),
            health_checked: c.me.mhc,
        });
        let d = decide(&own, &peers);
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
    let machines: Vec<capi::MachineView> = ["w1", "w2", "cp1"].iter().map(|n| machine(n, mhc)).collect();
    let quiet = machine("a-not-cordoned", mhc);
    let r = request();
    let peers: Vec<Peer<'_>> = machines
        .iter()
        .map(|m| Peer {
            machine: m,
            evacuating: true,
            health_checked: true,
        })
        .chain([Peer {
            machine: &quiet,
            evacuating: false,
            health_checked: true,
        }])
        .collect();
    let going: Vec<&str> = machines
        .iter()
        .filter(|m| {
            let own = Own {
                machine: m,
                request: Some(&r),
                host: Some("h1"),
                grace_left: None,
                grace: Duration::from_secs(60),
                previous: None,
                cluster_short: None,
                health_checked: true,
                now: now(),
            };
            decide(&own, &peers).act == Act::Mark
        })
        .map(name)
        .collect();
    assert_eq!(going, ["cp1"], "the first name of those on cordoned nodes");
}

#[test]
fn a_paused_evacuation_waits_for_unpause() {
    let m = machine("m1", M::default());
    let r = request();
    let own = Own {
        machine: &m,
        request: Some(&r),
        host: Some("h1"),
        grace_left: None,
        grace: Duration::from_secs(60),
        previous: None,
        cluster_short: None,
        health_checked: false,
        now: now(),
    };
    let d = while_paused(&own, "Cluster spec.paused is set to true").unwrap();
    assert_eq!((d.status, d.reason), (Status::True, reason::WAITING_FOR_UNPAUSE));
    assert!(d.message.starts_with("Kairon node h1 is cordoned"), "{}", d.message);
    assert!(d.message.contains("spec.paused"), "{}", d.message);
    let quiet = Own { request: None, ..own };
    assert_eq!(while_paused(&quiet, "paused"), None, "nothing asked: nothing said");
}

#[test]
fn the_grace_period_counts_from_when_the_condition_turned_true() {
    let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
    let grace = Duration::from_secs(60);
    assert_eq!(grace_left(None, grace, now), Some(grace), "first seen: all of it");
    let since = |s: &str, status: Status| {
        let mut c = vec![];
        conditions::set(
            &mut c,
            Decided::new(EVACUATION, status, reason::WAITING_FOR_MIGRATION, "m"),
            None,
            &Time(s.parse().unwrap()),
        );
        c.remove(0)
    };
    assert_eq!(
        grace_left(Some(&since("2026-01-01T00:00:30Z", Status::True)), grace, now),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        grace_left(Some(&since("2026-01-01T00:00:00Z", Status::True)), grace, now),
        None
    );
    assert_eq!(
        grace_left(Some(&since("2026-01-01T00:00:00Z", Status::False)), grace, now),
        Some(grace),
        "an evacuation that was over starts again"
    );
    assert_eq!(grace_left(None, Duration::ZERO, now), None, "no grace period");
}
