//! Table tests of [`super`]: selectors, capacity, cordoned hosts, migration targets and
//! soft and hard anti-affinity.

use super::*;

fn key(name: &str) -> Key {
    Key {
        namespace: "default".into(),
        name: name.into(),
    }
}

fn host(name: &str, labels: &[(&str, &str)]) -> Host {
    Host {
        name: name.into(),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

/// No host to avoid.
fn none() -> HashMap<String, i64> {
    HashMap::new()
}

fn selector(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

const ZONE: &str = "topology.kairon.zyvor.dev/zone";

fn three_hosts(capacity: usize) -> Placement {
    Placement::new(
        vec![
            host("h1", &[(ZONE, "zone-a")]),
            host("h2", &[(ZONE, "zone-b")]),
            host("h3", &[(ZONE, "zone-b")]),
        ],
        capacity,
    )
}

#[test]
fn placement_honours_node_selector_and_capacity() {
    struct Case {
        name: &'static str,
        capacity: usize,
        placed: &'static [(&'static str, &'static str)],
        selector: Option<&'static [(&'static str, &'static str)]>,
        want: Result<&'static str, &'static str>,
    }
    let cases = [
        Case {
            name: "no selector, empty hosts",
            capacity: 0,
            placed: &[],
            selector: None,
            want: Ok("h1"),
        },
        Case {
            name: "spreads to least loaded",
            capacity: 0,
            placed: &[("m1", "h1")],
            selector: None,
            want: Ok("h2"),
        },
        Case {
            name: "selector picks zone",
            capacity: 0,
            placed: &[],
            selector: Some(&[(ZONE, "zone-b")]),
            want: Ok("h2"),
        },
        Case {
            name: "empty selector matches all",
            capacity: 0,
            placed: &[],
            selector: Some(&[]),
            want: Ok("h1"),
        },
        Case {
            name: "unknown zone",
            capacity: 0,
            placed: &[],
            selector: Some(&[(ZONE, "zone-x")]),
            want: Err("no host matches nodeSelector {topology.kairon.zyvor.dev/zone=zone-x}"),
        },
        Case {
            name: "zone full",
            capacity: 1,
            placed: &[("m1", "h1")],
            selector: Some(&[(ZONE, "zone-a")]),
            want: Err(
                "all 1 host(s) matching nodeSelector {topology.kairon.zyvor.dev/zone=zone-a} are full (capacity 1 machines per host)",
            ),
        },
        Case {
            name: "capacity skips full host",
            capacity: 2,
            placed: &[("m1", "h1"), ("m2", "h1"), ("m3", "h2"), ("m4", "h3"), ("m5", "h3")],
            selector: None,
            want: Ok("h2"),
        },
        Case {
            name: "all full",
            capacity: 1,
            placed: &[("m1", "h1"), ("m2", "h2"), ("m3", "h3")],
            selector: None,
            want: Err("all 3 host(s) matching nodeSelector {} are full (capacity 1 machines per host)"),
        },
        Case {
            name: "unlimited",
            capacity: 0,
            placed: &[("m1", "h1"), ("m2", "h2"), ("m3", "h3")],
            selector: None,
            want: Ok("h1"),
        },
    ];
    for case in cases {
        let mut placement = Placement::new(
            vec![
                host("h1", &[(ZONE, "zone-a")]),
                host("h2", &[(ZONE, "zone-b")]),
                host("h3", &[]),
            ],
            case.capacity,
        );
        for (m, h) in case.placed {
            placement.assign(&key(m), h);
        }
        let sel = case.selector.map(selector);
        let got = placement.choose(sel.as_ref(), &none());
        let want = case.want.map(str::to_string).map_err(|m| Unschedulable(m.to_string()));
        assert_eq!(got, want, "{}", case.name);
    }
}

#[test]
fn releasing_a_machine_frees_its_slot() {
    let mut placement = Placement::new(vec![host("h1", &[])], 1);
    placement.assign(&key("m1"), "h1");
    assert!(placement.choose(None, &none()).is_err());
    placement.release(&key("m1"));
    assert_eq!(placement.choose(None, &none()), Ok("h1".to_string()));
}

#[test]
fn cordoned_hosts_get_no_new_vms() {
    let mut placement = three_hosts(0);
    placement.set_cordoned(["h2".to_string()].into());
    let zone_b = selector(&[(ZONE, "zone-b")]);
    assert_eq!(placement.choose(Some(&zone_b), &none()), Ok("h3".to_string()));
    placement.set_cordoned(["h2".to_string(), "h3".to_string()].into());
    let err = placement.choose(Some(&zone_b), &none()).unwrap_err();
    assert!(err.0.contains("no schedulable host matches"), "{}", err.0);
    assert_eq!(placement.choose(None, &none()), Ok("h1".to_string()));
}

#[test]
fn migration_targets_exclude_the_source_and_cordoned_hosts() {
    let mut placement = three_hosts(0);
    placement.assign(&key("m1"), "h2");
    let zone_b = selector(&[(ZONE, "zone-b")]);
    assert_eq!(placement.choose_target(Some(&zone_b), "h2"), Ok("h3".to_string()));
    placement.set_cordoned(["h3".to_string()].into());
    let err = placement.choose_target(Some(&zone_b), "h2").unwrap_err();
    assert!(err.0.contains("other than the VM's"), "{}", err.0);
    // Without a selector, any other schedulable host.
    assert_eq!(placement.choose_target(None, "h2"), Ok("h1".to_string()));
}

#[test]
fn migrations_under_way_hold_their_target() {
    let mut placement = three_hosts(1);
    placement.assign(&key("m1"), "h2");
    placement.set_reserved([(key("m1"), "h3".to_string())].into());
    let zone_b = selector(&[(ZONE, "zone-b")]);
    assert!(placement.choose(Some(&zone_b), &none()).is_err());
    assert!(placement.check_target("h3", "h1").is_err());
    placement.set_reserved(HashMap::new());
    assert_eq!(placement.choose(Some(&zone_b), &none()), Ok("h3".to_string()));
}

#[test]
fn named_targets_must_be_known_schedulable_other_and_have_room() {
    let mut placement = three_hosts(1);
    placement.assign(&key("m1"), "h1");
    placement.assign(&key("m2"), "h2");
    placement.set_cordoned(["h3".to_string()].into());
    let cases = [
        ("h1", "no: the source", false),
        ("hx", "no: unknown", false),
        ("h3", "no: cordoned", false),
        ("h2", "no: full", false),
    ];
    for (target, name, ok) in cases {
        assert_eq!(placement.check_target(target, "h1").is_ok(), ok, "{name}");
    }
    placement.set_cordoned(BTreeSet::new());
    // The selector is not checked: zone-a's VM may go to zone-b's h3 when named.
    assert_eq!(placement.check_target("h3", "h1"), Ok(()));
}

fn term(weight: i32, labels: &[(&str, &str)], topology_key: &str) -> WeightedTerm {
    WeightedTerm {
        weight,
        label_selector: selector(labels),
        topology_key: topology_key.into(),
    }
}

#[test]
fn soft_anti_affinity_prefers_hosts_without_a_matching_vm() {
    const CP: &str = "cluster.x-k8s.io/control-plane";
    const ROLE: &str = "infrastructure.cluster.x-k8s.io/kairon-role";
    let mut placement = three_hosts(0);
    placement.assign(&key("cp-0"), "h1");
    placement.assign(&key("worker"), "h2");
    let labels: HashMap<Key, BTreeMap<String, String>> = [
        (
            key("cp-0"),
            selector(&[(CP, ""), (ROLE, "control-plane"), ("cluster", "demo")]),
        ),
        (
            key("cp-1"),
            selector(&[(CP, ""), (ROLE, "control-plane"), ("cluster", "demo")]),
        ),
        (key("worker"), selector(&[("cluster", "demo")])),
    ]
    .into();
    let labels_of = |k: &Key| labels.get(k);
    let spread = [term(
        100,
        &[(ROLE, "control-plane"), ("cluster", "demo")],
        HOSTNAME_TOPOLOGY_KEY,
    )];

    // Kairon's match: `key: ""` holds on a VM without the key, so a term on CAPI's
    // control-plane label (empty value) takes the worker for a control plane too.
    let empty_value = [term(100, &[(CP, ""), ("cluster", "demo")], HOSTNAME_TOPOLOGY_KEY)];
    let avoid = placement.anti_affinity(&key("cp-1"), &empty_value, labels_of);
    assert_eq!(avoid, [("h1".to_string(), 100), ("h2".to_string(), 100)].into());
    // An empty selector matches nothing.
    assert!(
        placement
            .anti_affinity(&key("cp-1"), &[term(100, &[], HOSTNAME_TOPOLOGY_KEY)], labels_of)
            .is_empty()
    );

    // h1 runs cp-0: avoided. h2 (one worker) and h3 (empty) are not: the least loaded wins.
    let avoid = placement.anti_affinity(&key("cp-1"), &spread, labels_of);
    assert_eq!(avoid, [("h1".to_string(), 100)].into());
    assert_eq!(placement.choose(None, &avoid), Ok("h3".to_string()));

    // A Machine never matches itself: cp-0 placed again avoids nothing.
    assert!(placement.anti_affinity(&key("cp-0"), &spread, labels_of).is_empty());

    // Soft: with only the avoided host matching the selector, it is still chosen.
    let zone_a = selector(&[(ZONE, "zone-a")]);
    assert_eq!(placement.choose(Some(&zone_a), &avoid), Ok("h1".to_string()));

    // Every host taken: the least weighed, then the least loaded.
    placement.assign(&key("cp-2"), "h2");
    placement.assign(&key("cp-3"), "h3");
    let mut labels = labels.clone();
    labels.insert(key("cp-2"), selector(&[(CP, ""), ("cluster", "demo")]));
    labels.insert(key("cp-3"), selector(&[(CP, "")]));
    let labels_of = |k: &Key| labels.get(k);
    let weak = [
        term(100, &[(CP, "")], HOSTNAME_TOPOLOGY_KEY),
        term(10, &[("cluster", "demo")], HOSTNAME_TOPOLOGY_KEY),
    ];
    let avoid = placement.anti_affinity(&key("cp-1"), &weak, labels_of);
    assert_eq!(
        avoid,
        [
            ("h1".to_string(), 110),
            ("h2".to_string(), 110),
            ("h3".to_string(), 100)
        ]
        .into()
    );
    assert_eq!(placement.choose(None, &avoid), Ok("h3".to_string()));
}

#[test]
fn anti_affinity_domains_come_from_the_topology_key() {
    let mut placement = three_hosts(0);
    placement.assign(&key("a"), "h2");
    let labels: HashMap<Key, BTreeMap<String, String>> = [(key("a"), selector(&[("app", "db")]))].into();
    let labels_of = |k: &Key| labels.get(k);
    // By zone: h2 and h3 are both zone-b.
    let by_zone = [term(50, &[("app", "db")], ZONE)];
    let avoid = placement.anti_affinity(&key("b"), &by_zone, labels_of);
    assert_eq!(avoid, [("h2".to_string(), 50), ("h3".to_string(), 50)].into());
    assert_eq!(placement.choose(None, &avoid), Ok("h1".to_string()));
    // A key no host has weighs nothing; nor does a selector no VM matches, or weight 0.
    for spread in [
        [term(50, &[("app", "db")], "rack")],
        [term(50, &[("app", "web")], ZONE)],
        [term(0, &[("app", "db")], ZONE)],
    ] {
        assert!(placement.anti_affinity(&key("b"), &spread, labels_of).is_empty());
    }
    // A migration target counts as taken.
    placement.set_reserved([(key("a"), "h1".to_string())].into());
    let by_host = [term(1, &[("app", "db")], HOSTNAME_TOPOLOGY_KEY)];
    let avoid = placement.anti_affinity(&key("b"), &by_host, labels_of);
    assert_eq!(avoid, [("h1".to_string(), 1), ("h2".to_string(), 1)].into());
}

#[test]
fn the_spec_names_selector_and_terms_under_placement() {
    let mut spec = MachineSpec::default();
    assert_eq!(node_selector(&spec), None);
    assert!(preferred_anti_affinity(&spec).is_empty());
    spec.placement = Some(capkr::kairon::Placement {
        node_selector: Some(selector(&[(ZONE, "zone-a")])),
        preferred_anti_affinity: Some(vec![term(1, &[], HOSTNAME_TOPOLOGY_KEY)]),
        anti_affinity: Some(vec![capkr::kairon::Term {
            label_selector: selector(&[("cluster", "demo")]),
            topology_key: HOSTNAME_TOPOLOGY_KEY.into(),
        }]),
    });
    assert_eq!(node_selector(&spec), Some(&selector(&[(ZONE, "zone-a")])));
    assert_eq!(preferred_anti_affinity(&spec).len(), 1);
    assert_eq!(
        required_anti_affinity(&spec),
        [term(1, &[("cluster", "demo")], HOSTNAME_TOPOLOGY_KEY)]
    );
}

#[test]
fn hard_anti_affinity_never_shares_a_host_and_says_so_when_none_is_left() {
    const CP: &str = "cluster.x-k8s.io/control-plane";
    let mut placement = three_hosts(0);
    placement.assign(&key("cp-0"), "h1");
    let labels: HashMap<Key, BTreeMap<String, String>> = [
        (key("cp-0"), selector(&[(CP, "")])),
        (key("cp-1"), selector(&[(CP, "")])),
    ]
    .into();
    let labels_of = |k: &Key| labels.get(k);
    let hard = [term(1, &[(CP, "")], HOSTNAME_TOPOLOGY_KEY)];
    let forbidden = |p: &Placement| -> HashMap<String, i64> {
        p.anti_affinity(&key("cp-1"), &hard, labels_of)
            .into_keys()
            .map(|h| (h, FORBIDDEN))
            .collect()
    };

    // Unlike a soft term, a hard one is never given in to: with only h1 in zone-a, nothing.
    let zone_a = selector(&[(ZONE, "zone-a")]);
    let err = placement.choose(Some(&zone_a), &forbidden(&placement)).unwrap_err();
    assert!(err.0.contains("antiAffinity"), "{}", err.0);
    assert_eq!(placement.choose(None, &forbidden(&placement)), Ok("h2".to_string()));

    // Every host taken by a control plane: cp-1 stays unplaced.
    placement.assign(&key("cp-2"), "h2");
    placement.assign(&key("cp-3"), "h3");
    let labels: HashMap<Key, BTreeMap<String, String>> = ["cp-0", "cp-1", "cp-2", "cp-3"]
        .into_iter()
        .map(|n| (key(n), selector(&[(CP, "")])))
        .collect();
    let avoid: HashMap<String, i64> = placement
        .anti_affinity(&key("cp-1"), &hard, |k: &Key| labels.get(k))
        .into_keys()
        .map(|h| (h, FORBIDDEN))
        .collect();
    assert!(placement.choose(None, &avoid).is_err());
}
