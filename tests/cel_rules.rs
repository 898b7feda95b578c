//! The CRDs' CEL rules, evaluated client-side (kube's `cel` feature) against good and bad
//! objects. Each bad object must be rejected with a message naming the field.

use capkr::api::crds;
use kube::core::cel::Validator;
use serde_json::{Value, json};

fn schema(plural: &str) -> Value {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.plural == plural)
        .expect("CRD exists");
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

/// The messages of the rules that fail.
fn failures(plural: &str, obj: &Value, old: Option<&Value>) -> Vec<String> {
    match Validator::new().validate(&schema(plural), obj, old) {
        Ok(()) => vec![],
        Err(errs) => errs.into_vec().into_iter().map(|e| e.to_string()).collect(),
    }
}

fn machine(spec: Value) -> Value {
    json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironMachine", "metadata": {"name": "m"}, "spec": spec})
}

fn good_spec() -> Value {
    json!({"cpus": 2, "memory": "4Gi", "image": "ubuntu-2404-kube-v1.36.1", "diskSize": "40Gi"})
}

fn with(mut base: Value, key: &str, value: Value) -> Value {
    base[key] = value;
    base
}

#[test]
fn kaironmachine_quantities_table() {
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        ("good", good_spec(), None),
        ("one cpu", with(good_spec(), "cpus", json!(1)), None),
        (
            "zero cpus",
            with(good_spec(), "cpus", json!(0)),
            Some("cpus must be at least 1"),
        ),
        (
            "negative cpus",
            with(good_spec(), "cpus", json!(-2)),
            Some("cpus must be at least 1"),
        ),
        ("512Mi memory", with(good_spec(), "memory", json!("512Mi")), None),
        ("memory as bytes", with(good_spec(), "memory", json!(1073741824)), None),
        (
            "256Mi memory",
            with(good_spec(), "memory", json!("256Mi")),
            Some("memory must be a quantity of at least 512Mi"),
        ),
        (
            "memory not a quantity",
            with(good_spec(), "memory", json!("lots")),
            Some("memory must be a quantity of at least 512Mi"),
        ),
        (
            "zero disk",
            with(good_spec(), "diskSize", json!("0")),
            Some("diskSize must be a quantity greater than 0"),
        ),
        (
            "disk not a quantity",
            with(good_spec(), "diskSize", json!("big")),
            Some("diskSize must be a quantity greater than 0"),
        ),
    ];
    for (name, spec, want) in cases {
        let got = failures("kaironmachines", &machine(spec), None);
        match want {
            None => assert!(got.is_empty(), "{name}: unexpected {got:?}"),
            Some(msg) => assert!(got.iter().any(|g| g.contains(msg)), "{name}: want {msg:?}, got {got:?}"),
        }
    }
}

#[test]
fn providerid_is_write_once() {
    let unset = machine(good_spec());
    let set = machine(with(good_spec(), "providerID", json!("kairon://a")));
    let other = machine(with(good_spec(), "providerID", json!("kairon://b")));
    assert!(
        failures("kaironmachines", &set, Some(&unset)).is_empty(),
        "first write is allowed"
    );
    assert!(
        failures("kaironmachines", &set, Some(&set)).is_empty(),
        "rewriting the same value is allowed"
    );
    let changed = failures("kaironmachines", &other, Some(&set));
    assert!(
        changed.iter().any(|m| m.contains("spec.providerID is write-once")),
        "{changed:?}"
    );
    let removed = failures("kaironmachines", &unset, Some(&set));
    assert!(
        removed.iter().any(|m| m.contains("spec.providerID is write-once")),
        "{removed:?}"
    );
}

#[test]
fn kaironmachine_spec_is_immutable_except_providerid() {
    let old = machine(good_spec());
    let cases: Vec<(&str, Value, &str)> = vec![
        ("cpus", with(good_spec(), "cpus", json!(4)), "spec.cpus is immutable"),
        (
            "memory",
            with(good_spec(), "memory", json!("8Gi")),
            "spec.memory is immutable",
        ),
        (
            "image",
            with(good_spec(), "image", json!("other")),
            "spec.image is immutable",
        ),
        (
            "diskSize",
            with(good_spec(), "diskSize", json!("80Gi")),
            "spec.diskSize is immutable",
        ),
        (
            "network added",
            with(good_spec(), "network", json!({"name": "n"})),
            "spec.network is immutable",
        ),
        (
            "nodeSelector added",
            with(good_spec(), "nodeSelector", json!({"a": "b"})),
            "spec.nodeSelector is immutable",
        ),
    ];
    for (name, spec, msg) in cases {
        let got = failures("kaironmachines", &machine(spec), Some(&old));
        assert!(got.iter().any(|g| g.contains(msg)), "{name}: want {msg:?}, got {got:?}");
    }
    let with_net = machine(with(good_spec(), "network", json!({"name": "n"})));
    let got = failures("kaironmachines", &machine(good_spec()), Some(&with_net));
    assert!(
        got.iter().any(|g| g.contains("spec.network is immutable")),
        "network removed: {got:?}"
    );
    assert!(
        failures("kaironmachines", &with_net, Some(&with_net)).is_empty(),
        "unchanged spec passes"
    );
}

#[test]
fn eviction_strategy_takes_two_values_and_is_immutable() {
    for good in ["LiveMigrateIfPossible", "External"] {
        let m = machine(with(good_spec(), "evictionStrategy", json!(good)));
        assert!(failures("kaironmachines", &m, None).is_empty(), "{good}");
        assert!(failures("kaironmachines", &m, Some(&m)).is_empty(), "{good} unchanged");
    }
    // Kairon's LiveMigrate would block a host's maintenance, None would lose the workloads.
    for bad in ["LiveMigrate", "None", "external", ""] {
        let got = failures(
            "kaironmachines",
            &machine(with(good_spec(), "evictionStrategy", json!(bad))),
            None,
        );
        assert!(
            got.iter()
                .any(|g| g.contains("evictionStrategy must be LiveMigrateIfPossible or External")),
            "{bad:?}: {got:?}"
        );
    }
    let absent = machine(good_spec());
    let external = machine(with(good_spec(), "evictionStrategy", json!("External")));
    let live = machine(with(good_spec(), "evictionStrategy", json!("LiveMigrateIfPossible")));
    for (name, new, old) in [
        ("added", &external, &absent),
        ("removed", &absent, &external),
        ("changed", &live, &external),
    ] {
        let got = failures("kaironmachines", new, Some(old));
        assert!(
            got.iter().any(|g| g.contains("spec.evictionStrategy is immutable")),
            "{name}: {got:?}"
        );
    }
    let tmpl = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironMachineTemplate",
        "metadata": {"name": "t"}, "spec": {"template": {"spec": with(good_spec(), "evictionStrategy", json!("None"))}}});
    let got = failures("kaironmachinetemplates", &tmpl, None);
    assert!(
        got.iter()
            .any(|g| g.contains("evictionStrategy must be LiveMigrateIfPossible or External")),
        "template: {got:?}"
    );
}

#[test]
fn template_must_not_carry_a_providerid() {
    let t = |spec: Value| json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironMachineTemplate", "metadata": {"name": "t"}, "spec": {"template": {"spec": spec}}});
    assert!(failures("kaironmachinetemplates", &t(good_spec()), None).is_empty());
    let got = failures(
        "kaironmachinetemplates",
        &t(with(good_spec(), "providerID", json!("kairon://x"))),
        None,
    );
    assert!(
        got.iter()
            .any(|g| g.contains("spec.template.spec.providerID must not be set")),
        "{got:?}"
    );
    let got = failures("kaironmachinetemplates", &t(with(good_spec(), "cpus", json!(0))), None);
    assert!(
        got.iter().any(|g| g.contains("cpus must be at least 1")),
        "quantity rules apply in templates: {got:?}"
    );
    // Templates carry no transition rules of their own: immutability is an admission policy
    // with the SSA dry-run exception ClusterClass needs.
    let got = failures(
        "kaironmachinetemplates",
        &t(with(good_spec(), "cpus", json!(8))),
        Some(&t(good_spec())),
    );
    assert!(got.is_empty(), "{got:?}");
}

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

#[test]
fn crds_carry_the_contract_label_names_and_categories() {
    let crds = crds();
    let names: Vec<_> = crds.iter().map(|c| c.metadata.name.clone().unwrap()).collect();
    assert_eq!(
        names,
        [
            "kaironclusters.infrastructure.cluster.x-k8s.io",
            "kaironclustertemplates.infrastructure.cluster.x-k8s.io",
            "kaironclusteridentities.infrastructure.cluster.x-k8s.io",
            "kaironmachines.infrastructure.cluster.x-k8s.io",
            "kaironmachinetemplates.infrastructure.cluster.x-k8s.io",
            "kaironmachinepools.infrastructure.cluster.x-k8s.io",
            "kaironmachinepooltemplates.infrastructure.cluster.x-k8s.io",
        ]
    );
    for crd in &crds {
        let labels = crd.metadata.labels.as_ref().unwrap();
        assert_eq!(
            labels.get("cluster.x-k8s.io/v1beta2").map(String::as_str),
            Some("v1alpha1")
        );
        let shared = crd.spec.names.kind == "KaironClusterIdentity";
        assert_eq!(crd.spec.scope, if shared { "Cluster" } else { "Namespaced" });
        assert_eq!(
            labels
                .get("clusterctl.cluster.x-k8s.io/move-hierarchy")
                .map(String::as_str),
            shared.then_some("true"),
            "clusterctl move copies identities with their Secrets"
        );
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["cluster-api".to_string()][..])
        );
        assert!(crd.spec.names.short_names.as_ref().is_some_and(|s| !s.is_empty()));
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        let has_status = !matches!(
            crd.spec.names.kind.as_str(),
            "KaironClusterTemplate" | "KaironClusterIdentity" | "KaironMachinePoolTemplate"
        );
        assert_eq!(
            v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(),
            has_status,
            "{}",
            crd.spec.names.kind
        );
        let text = serde_json::to_string(v).unwrap();
        assert!(
            !text.contains("nullable"),
            "{}: optional fields are omitted, not null",
            crd.spec.names.kind
        );
    }
    let km = crds.iter().find(|c| c.spec.names.kind == "KaironMachine").unwrap();
    let columns: Vec<_> = km.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Cluster", "Machine", "ProviderID", "Phase", "Ready", "Age"]);
}

#[test]
fn kaironmachine_has_no_spec_failure_domain() {
    // CAPI copies an infrastructure machine's spec.failureDomain over the Machine's, even
    // when empty; placement is reported in status.failureDomain instead.
    let s = schema("kaironmachines");
    assert!(s["properties"]["spec"]["properties"].get("failureDomain").is_none());
    assert!(s["properties"]["status"]["properties"].get("failureDomain").is_some());
}

/// KaironMachinePool: the set's providerID is write-once, the VM template carries no
/// providerID, a strategy that could never roll is refused, the template is mutable (a change
/// rolls the pool); a KaironMachinePoolTemplate carries neither providerID nor providerIDList.
#[test]
fn kaironmachinepool_rules_table() {
    let pool = |spec: Value| json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironMachinePool", "metadata": {"name": "p"}, "spec": spec});
    let base = json!({"template": good_spec()});
    let pid = |id: &str| with(base.clone(), "providerID", json!(id));
    let strategy = |s: Value| with(base.clone(), "strategy", s);
    let mut tpl_pid = base.clone();
    tpl_pid["template"]["providerID"] = json!("kairon://x");
    let mut new_image = pid("kairon://machinesets/a");
    new_image["template"]["image"] = json!("ubuntu-2404-kube-v1.36.2");
    #[rustfmt::skip]
    let cases: Vec<(&str, Value, Option<Value>, Option<&str>)> = vec![
        ("good", base.clone(), None, None),
        ("providerID set once", pid("kairon://machinesets/a"), Some(base.clone()), None),
        ("providerID changed", pid("kairon://machinesets/b"), Some(pid("kairon://machinesets/a")), Some("spec.providerID is write-once")),
        ("providerID removed", base.clone(), Some(pid("kairon://machinesets/a")), Some("spec.providerID is write-once")),
        ("template changed: rolls, allowed", new_image, Some(pid("kairon://machinesets/a")), None),
        ("template with a providerID", tpl_pid, None, Some("spec.template.providerID must not be set")),
        ("template cpus 0", { let mut b = base.clone(); b["template"]["cpus"] = json!(0); b }, None, Some("cpus must be at least 1")),
        ("surge 0, unavailable 1", strategy(json!({"maxSurge": 0, "maxUnavailable": 1})), None, None),
        ("surge 0 alone (unavailable defaults to 0)", strategy(json!({"maxSurge": 0})), None, Some("must not both be 0")),
        ("both 0", strategy(json!({"maxSurge": 0, "maxUnavailable": 0})), None, Some("must not both be 0")),
        ("negative surge", strategy(json!({"maxSurge": -1})), None, Some("strategy.maxSurge must be between 0 and 1000")),
        ("delete policy Newest", strategy(json!({"deletePolicy": "Newest"})), None, None),
        ("delete policy Random", strategy(json!({"deletePolicy": "Random"})), None, Some("strategy.deletePolicy must be Oldest or Newest")),
    ];
    for (name, spec, old, want) in cases {
        let got = failures("kaironmachinepools", &pool(spec), old.map(pool).as_ref());
        match want {
            None => assert!(got.is_empty(), "{name}: {got:?}"),
            Some(w) => assert!(got.iter().any(|g| g.contains(w)), "{name}: want {w:?} in {got:?}"),
        }
    }
    let template = |spec: Value| json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironMachinePoolTemplate", "metadata": {"name": "t"}, "spec": {"template": {"spec": spec}}});
    assert!(failures("kaironmachinepooltemplates", &template(base.clone()), None).is_empty());
    let got = failures(
        "kaironmachinepooltemplates",
        &template(pid("kairon://machinesets/a")),
        None,
    );
    assert!(
        got.iter()
            .any(|g| g.contains("spec.template.spec.providerID must not be set")),
        "{got:?}"
    );
    let got = failures(
        "kaironmachinepooltemplates",
        &template(with(base, "providerIDList", json!(["kairon://a"]))),
        None,
    );
    assert!(
        got.iter()
            .any(|g| g.contains("spec.template.spec.providerIDList must not be set")),
        "{got:?}"
    );
}
