use super::*;
use crate::api::conditions::PAUSED;
use crate::api::{APIEndpoint, FailureDomainSpec, KaironClusterSpec};
use k8s_openapi::jiff::Timestamp;

fn at(s: i64) -> Time {
    Time(Timestamp::from_second(s).unwrap())
}

fn kc() -> KaironCluster {
    KaironCluster::new(
        "c",
        KaironClusterSpec {
            control_plane_endpoint: Some(APIEndpoint {
                host: Some("10.0.0.10".into()),
                port: Some(6443),
            }),
            failure_domains: Some(vec![
                FailureDomainSpec {
                    name: "zone-b".into(),
                    control_plane: None,
                    node_selector: Some([("zone".to_string(), "b".to_string())].into()),
                },
                FailureDomainSpec {
                    name: "zone-a".into(),
                    control_plane: Some(true),
                    node_selector: None,
                },
            ]),
            identity_ref: None,
        },
    )
}

fn ready(s: &KaironClusterStatus) -> (String, String) {
    let c = conditions::get(s.conditions.as_deref().unwrap(), READY).unwrap();
    (c.status.clone(), c.reason.clone())
}

#[test]
fn provisioned_publishes_failure_domains_with_it() {
    let s = next_status(&kc(), &Decision::Provisioned, &at(1));
    assert!(s.is_provisioned());
    let fds = s.failure_domains.clone().unwrap();
    assert_eq!(
        fds.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["zone-a", "zone-b"],
        "sorted by name"
    );
    assert_eq!(fds[0].control_plane, Some(true));
    assert_eq!(fds[1].attributes.as_ref().unwrap()["zone"], "b");
    assert_eq!(ready(&s), ("True".into(), "Ready".into()));
}

#[test]
fn cluster_status_table() {
    let cases = [
        (
            Decision::WaitingForEndpoint,
            ("False", reason::WAITING_FOR_CONTROL_PLANE_ENDPOINT),
            false,
        ),
        (Decision::Provisioned, ("True", reason::READY), true),
        (
            Decision::Deleting { machines: 2 },
            ("False", reason::WAITING_FOR_MACHINES_DELETION),
            false,
        ),
        (Decision::Deleting { machines: 0 }, ("False", reason::DELETING), false),
        (
            Decision::KaironUnavailable {
                reason: reason::KAIRON_API_UNAVAILABLE,
                why: "down".into(),
            },
            ("False", reason::KAIRON_API_UNAVAILABLE),
            false,
        ),
        (
            Decision::KaironUnavailable {
                reason: reason::KAIRON_API_SERVER_NOT_ALLOWED,
                why: "server 10.9.9.9 is not allowed".into(),
            },
            ("False", reason::KAIRON_API_SERVER_NOT_ALLOWED),
            false,
        ),
    ];
    for (decision, want, provisioned) in cases {
        let s = next_status(&kc(), &decision, &at(1));
        assert_eq!(ready(&s), (want.0.to_string(), want.1.to_string()), "{decision:?}");
        assert_eq!(s.is_provisioned(), provisioned, "{decision:?}");
    }
}

#[test]
fn steady_state_is_a_fixed_point() {
    let mut k = kc();
    k.status = Some(next_status(&k, &Decision::Provisioned, &at(1)));
    assert_eq!(
        next_status(&k, &Decision::Provisioned, &at(99)),
        k.status.clone().unwrap()
    );
}

#[test]
fn paused_sets_only_paused() {
    let mut k = kc();
    k.status = Some(next_status(&k, &Decision::Provisioned, &at(1)));
    let s = next_status(&k, &Decision::Paused("Cluster spec.paused is set to true"), &at(5));
    let p = conditions::get(s.conditions.as_deref().unwrap(), PAUSED).unwrap();
    assert_eq!((p.status.as_str(), p.reason.as_str()), ("True", "Paused"));
    assert_eq!(ready(&s), ("True".into(), "Ready".into()));
}
