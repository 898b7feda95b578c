//! The KaironCluster's and KaironClusterIdentity's rules.

use super::*;

fn cluster(spec: Value) -> Value {
    json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironCluster", "metadata": {"name": "c"}, "spec": spec})
}

#[test]
fn kaironcluster_rules_table() {
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        ("empty spec", json!({}), None),
        (
            "endpoint",
            json!({"controlPlaneEndpoint": {"host": "10.0.0.10", "port": 6443}}),
            None,
        ),
        (
            "port 0",
            json!({"controlPlaneEndpoint": {"host": "h", "port": 0}}),
            Some("port must be between 1 and 65535"),
        ),
        (
            "port too big",
            json!({"controlPlaneEndpoint": {"host": "h", "port": 70000}}),
            Some("port must be between 1 and 65535"),
        ),
        (
            "empty endpoint",
            json!({"controlPlaneEndpoint": {}}),
            Some("controlPlaneEndpoint must set host or port"),
        ),
        (
            "unique failure domains",
            json!({"failureDomains": [{"name": "a", "controlPlane": true}, {"name": "b"}]}),
            None,
        ),
        (
            "duplicate failure domains",
            json!({"failureDomains": [{"name": "a"}, {"name": "a", "controlPlane": true}]}),
            Some("failureDomains names must be unique"),
        ),
        (
            "identity Secret",
            json!({"identityRef": {"kind": "Secret", "name": "kairon-site-a"}}),
            None,
        ),
        (
            "identity of another kind",
            json!({"identityRef": {"kind": "ConfigMap", "name": "kairon-site-a"}}),
            Some("identityRef.kind must be Secret or KaironClusterIdentity"),
        ),
        (
            "shared identity",
            json!({"identityRef": {"kind": "KaironClusterIdentity", "name": "site-a"}}),
            None,
        ),
        (
            "identity name not a Secret name",
            json!({"identityRef": {"kind": "Secret", "name": "Site A"}}),
            Some("identityRef.name must be an object name"),
        ),
        (
            "identity name empty",
            json!({"identityRef": {"kind": "Secret", "name": ""}}),
            Some("identityRef.name must be an object name"),
        ),
    ];
    for (name, spec, want) in cases {
        let got = failures("kaironclusters", &cluster(spec), None);
        match want {
            None => assert!(got.is_empty(), "{name}: unexpected {got:?}"),
            Some(msg) => assert!(got.iter().any(|g| g.contains(msg)), "{name}: want {msg:?}, got {got:?}"),
        }
    }
}

#[test]
fn kaironclusteridentity_rules() {
    let identity = |spec: Value| json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironClusterIdentity", "metadata": {"name": "site-a"}, "spec": spec});
    let good =
        identity(json!({"secretName": "site-a", "allowedNamespaces": {"selector": {"matchLabels": {"site": "a"}}}}));
    assert_eq!(failures("kaironclusteridentities", &good, None), Vec::<String>::new());
    let bad = identity(json!({"secretName": "Site A"}));
    let got = failures("kaironclusteridentities", &bad, None);
    assert!(
        got.iter().any(|g| g.contains("secretName must be a Secret name")),
        "{got:?}"
    );
}

#[test]
fn kaironcluster_identity_is_immutable() {
    let none = cluster(json!({}));
    let a = cluster(json!({"identityRef": {"kind": "Secret", "name": "a"}}));
    let b = cluster(json!({"identityRef": {"kind": "Secret", "name": "b"}}));
    assert!(failures("kaironclusters", &a, Some(&a)).is_empty(), "unchanged");
    for (name, new, old) in [("added", &a, &none), ("changed", &b, &a), ("removed", &none, &a)] {
        let got = failures("kaironclusters", new, Some(old));
        assert!(
            got.iter().any(|g| g.contains("spec.identityRef is immutable")),
            "{name}: {got:?}"
        );
    }
}

#[test]
fn kaironcluster_endpoint_is_fixed_once_set() {
    let unset = cluster(json!({}));
    let set = cluster(json!({"controlPlaneEndpoint": {"host": "10.0.0.10", "port": 6443}}));
    let moved = cluster(json!({"controlPlaneEndpoint": {"host": "10.0.0.11", "port": 6443}}));
    let reported = cluster(json!({"controlPlaneEndpoint": {"host": "10.0.0.10", "port": 7443}}));
    assert!(
        failures("kaironclusters", &set, Some(&unset)).is_empty(),
        "setting it is allowed"
    );
    let got = failures("kaironclusters", &moved, Some(&set));
    assert!(
        got.iter()
            .any(|g| g.contains("spec.controlPlaneEndpoint.host is immutable")),
        "{got:?}"
    );
    let got = failures("kaironclusters", &reported, Some(&set));
    assert!(
        got.iter()
            .any(|g| g.contains("spec.controlPlaneEndpoint.port is immutable")),
        "{got:?}"
    );
    let got = failures("kaironclusters", &unset, Some(&set));
    assert!(!got.is_empty(), "removing it is rejected");
}
