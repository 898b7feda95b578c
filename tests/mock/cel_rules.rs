//! The CRDs' CEL rules, evaluated client-side (kube's `cel` feature) against good and bad
//! objects. Each bad object must be rejected with a message naming the field.

use capkr::api::crds;
use kube::core::cel::Validator;
use serde_json::{Value, json};

/// The KaironCluster's and KaironClusterIdentity's rules.
mod cluster;

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

/// A spec every rule accepts: a Kairon MachineImage with a disk size, 2 CPUs and 4Gi.
fn good_spec() -> Value {
    json!({
        "image": {"imageRef": "ubuntu-2404-kube-v1.36.1", "diskSize": "40Gi"},
        "resources": {"cpu": 2, "memory": "4Gi"},
    })
}

/// `base` with the field at the dotted `path` set to `value`, or removed when `value` is null.
fn with(mut base: Value, path: &str, value: Value) -> Value {
    let (parents, key) = path.rsplit_once('.').unwrap_or(("", path));
    let mut cur = &mut base;
    for p in parents.split('.').filter(|p| !p.is_empty()) {
        cur = &mut cur[p];
    }
    match value {
        Value::Null => {
            cur.as_object_mut().expect("an object to remove from").remove(key);
        }
        v => cur[key] = v,
    }
    base
}

/// A case of a KaironMachine table: name, spec, and `None` or the `(field path, message)` of the
/// rule that refuses it.
type MachineCase<'a> = (&'a str, Value, Option<(&'a str, &'a str)>);

/// Runs a table of KaironMachine specs: `None` must pass every rule; `Some((path, message))`
/// must fail, each failure being that rule at that field path (one bad field, one rule).
fn check_machine_table(cases: Vec<MachineCase>) {
    for (name, spec, want) in cases {
        let got = failures("kaironmachines", &machine(spec), None);
        match want {
            None => assert!(got.is_empty(), "{name}: unexpected {got:?}"),
            Some((path, msg)) => assert!(
                !got.is_empty()
                    && got
                        .iter()
                        .all(|g| g.starts_with(&format!("{path}: ")) && g.contains(msg)),
                "{name}: want only {path}: {msg:?}, got {got:?}"
            ),
        }
    }
}

const CPU: &str = "resources.cpu must be a whole number of at least 1";
const MEMORY: &str = "resources.memory must be a quantity of at least 512Mi";
const DISK: &str = "image.diskSize must be a quantity greater than 0";
const ONE_SOURCE: &str = "image: exactly one of imageRef, path and httpURL must be set";
const DIGEST_WITH_URL: &str = "image.digest is required with image.httpURL";
const DIGEST_FORM: &str = "image.digest must be sha256: followed by 64 lowercase hex digits";
const URL: &str = "image.httpURL must be an http:// or https:// URL";
const PATH: &str = "image.path must be an absolute path";
const ONE_SIZE: &str = "exactly one of resources and instanceTypeName must be set";
const BRIDGE: &str = "network.bridge is only used with network.mode tap";
const BRIDGE_NETNS: &str = "network.bridge is not used with network.netns: true";
const NETNS: &str = "network.netns is only used with network.mode tap";
const STATIC_NETWORK: &str = "network.staticNetwork needs network.mode tap with network.netns: true";
const LEARN_IP: &str = "network.learnIP is only used with network.mode tap";
const PARENT: &str = "network.parent is required with network.mode macvtap and only used with it";
const MACVTAP_MODE_ONLY: &str = "network.macvtapMode is only used with network.mode macvtap";
const MACVTAP_MODE: &str = "network.macvtapMode must be bridge, vepa, private or passthru";
const MAC: &str = "network.mac must be six hex octets separated by : or -";
const MODE: &str = "network.mode must be user, tap or macvtap";
const ANTI_AFFINITY: &str = "placement.controlPlaneAntiAffinity must be Preferred, Required or None";

#[test]
fn kaironmachine_quantities_table() {
    let cpu = |v: Value| with(good_spec(), "resources.cpu", v);
    let memory = |v: Value| with(good_spec(), "resources.memory", v);
    let disk = |v: Value| with(good_spec(), "image.diskSize", v);
    check_machine_table(vec![
        ("good", good_spec(), None),
        ("cpu 1", cpu(json!(1)), None),
        ("cpu 2 as an integer", cpu(json!(2)), None),
        ("cpu \"2\" as a string", cpu(json!("2")), None),
        ("cpu 0", cpu(json!(0)), Some(("spec.resources.cpu", CPU))),
        ("cpu -2", cpu(json!(-2)), Some(("spec.resources.cpu", CPU))),
        ("cpu \"1.5\"", cpu(json!("1.5")), Some(("spec.resources.cpu", CPU))),
        ("cpu \"500m\"", cpu(json!("500m")), Some(("spec.resources.cpu", CPU))),
        (
            "cpu not a quantity",
            cpu(json!("two")),
            Some(("spec.resources.cpu", CPU)),
        ),
        ("memory 512Mi", memory(json!("512Mi")), None),
        ("memory as bytes", memory(json!(1073741824)), None),
        (
            "memory 256Mi",
            memory(json!("256Mi")),
            Some(("spec.resources.memory", MEMORY)),
        ),
        (
            "memory not a quantity",
            memory(json!("lots")),
            Some(("spec.resources.memory", MEMORY)),
        ),
        ("no diskSize: the image's own size", disk(Value::Null), None),
        ("diskSize 0", disk(json!("0")), Some(("spec.image.diskSize", DISK))),
        (
            "diskSize not a quantity",
            disk(json!("big")),
            Some(("spec.image.diskSize", DISK)),
        ),
    ]);
}

#[test]
fn kaironmachine_image_resources_network_placement_table() {
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let url = "https://images.example/ubuntu-2404.qcow2";
    let image = |v: Value| with(good_spec(), "image", v);
    let by_type = with(good_spec(), "resources", Value::Null);
    let network = |v: Value| with(good_spec(), "network", v);
    let placement = |v: Value| with(good_spec(), "placement", v);
    let anti_affinity = |v: &str| placement(json!({"controlPlaneAntiAffinity": v}));
    check_machine_table(vec![
        ("image from a MachineImage", good_spec(), None),
        (
            "image from a path",
            image(json!({"path": "/var/lib/kairon/images/ubuntu.qcow2", "diskSize": "40Gi"})),
            None,
        ),
        (
            "image from an https URL with its digest",
            image(json!({"httpURL": url, "digest": digest})),
            None,
        ),
        (
            "image from an http URL with its digest",
            image(json!({"httpURL": "http://images.local/u.qcow2", "digest": digest})),
            None,
        ),
        (
            "imageRef and path",
            image(json!({"imageRef": "u", "path": "/u.qcow2"})),
            Some(("spec.image", ONE_SOURCE)),
        ),
        (
            "imageRef and httpURL",
            image(json!({"imageRef": "u", "httpURL": url, "digest": digest})),
            Some(("spec.image", ONE_SOURCE)),
        ),
        (
            "path and httpURL",
            image(json!({"path": "/u.qcow2", "httpURL": url, "digest": digest})),
            Some(("spec.image", ONE_SOURCE)),
        ),
        (
            "no source, only a disk size",
            image(json!({"diskSize": "40Gi"})),
            Some(("spec.image", ONE_SOURCE)),
        ),
        ("no source at all", image(json!({})), Some(("spec.image", ONE_SOURCE))),
        (
            "httpURL without digest",
            image(json!({"httpURL": url})),
            Some(("spec.image", DIGEST_WITH_URL)),
        ),
        (
            "digest without httpURL",
            image(json!({"imageRef": "u", "digest": digest})),
            Some(("spec.image", DIGEST_WITH_URL)),
        ),
        (
            "digest in upper case",
            image(json!({"httpURL": url, "digest": digest.to_uppercase().replacen("SHA256", "sha256", 1)})),
            Some(("spec.image.digest", DIGEST_FORM)),
        ),
        (
            "digest too short",
            image(json!({"httpURL": url, "digest": "sha256:0123abcd"})),
            Some(("spec.image.digest", DIGEST_FORM)),
        ),
        (
            "digest of another algorithm",
            image(json!({"httpURL": url, "digest": digest.replacen("sha256", "sha512", 1)})),
            Some(("spec.image.digest", DIGEST_FORM)),
        ),
        (
            "ftp URL",
            image(json!({"httpURL": "ftp://images.example/u.qcow2", "digest": digest})),
            Some(("spec.image.httpURL", URL)),
        ),
        (
            "URL without a scheme",
            image(json!({"httpURL": "images.example/u.qcow2", "digest": digest})),
            Some(("spec.image.httpURL", URL)),
        ),
        (
            "relative path",
            image(json!({"path": "images/ubuntu.qcow2"})),
            Some(("spec.image.path", PATH)),
        ),
        (
            "instance type instead of resources",
            with(by_type.clone(), "instanceTypeName", json!("m.large")),
            None,
        ),
        (
            "resources and instance type",
            with(good_spec(), "instanceTypeName", json!("m.large")),
            Some(("spec", ONE_SIZE)),
        ),
        ("neither resources nor instance type", by_type, Some(("spec", ONE_SIZE))),
        (
            "network tap on a bridge",
            network(json!({"mode": "tap", "bridge": "br0"})),
            None,
        ),
        ("network user", network(json!({"mode": "user"})), None),
        (
            "network tap without bridge (the node's default bridge)",
            network(json!({"mode": "tap"})),
            None,
        ),
        (
            "network tap on a bridge with learnIP",
            network(json!({"mode": "tap", "bridge": "br0", "learnIP": true})),
            None,
        ),
        (
            "network tap in a netns with a static address and a MAC",
            network(json!({"mode": "tap", "netns": true, "staticNetwork": true, "mac": "52:54:00:12:34:56"})),
            None,
        ),
        (
            "a hyphenated MAC",
            network(json!({"mode": "tap", "bridge": "br0", "mac": "52-54-00-12-34-56"})),
            None,
        ),
        (
            "network macvtap on a parent",
            network(json!({"mode": "macvtap", "parent": "eth1", "macvtapMode": "bridge"})),
            None,
        ),
        (
            "bridge with network user",
            network(json!({"mode": "user", "bridge": "br0"})),
            Some(("spec.network", BRIDGE)),
        ),
        (
            "bridge without a mode (user)",
            network(json!({"bridge": "br0"})),
            Some(("spec.network", BRIDGE)),
        ),
        (
            "bridge and netns",
            network(json!({"mode": "tap", "bridge": "br0", "netns": true})),
            Some(("spec.network", BRIDGE_NETNS)),
        ),
        (
            "netns with network user",
            network(json!({"mode": "user", "netns": true})),
            Some(("spec.network", NETNS)),
        ),
        (
            "staticNetwork without netns",
            network(json!({"mode": "tap", "bridge": "br0", "staticNetwork": true})),
            Some(("spec.network", STATIC_NETWORK)),
        ),
        (
            "learnIP with network user",
            network(json!({"mode": "user", "learnIP": true})),
            Some(("spec.network", LEARN_IP)),
        ),
        (
            "learnIP with macvtap (Kairon learns no address there)",
            network(json!({"mode": "macvtap", "parent": "eth1", "learnIP": true})),
            Some(("spec.network", LEARN_IP)),
        ),
        (
            "macvtap without a parent",
            network(json!({"mode": "macvtap"})),
            Some(("spec.network", PARENT)),
        ),
        (
            "parent with network tap",
            network(json!({"mode": "tap", "bridge": "br0", "parent": "eth1"})),
            Some(("spec.network", PARENT)),
        ),
        (
            "macvtapMode with network tap",
            network(json!({"mode": "tap", "bridge": "br0", "macvtapMode": "bridge"})),
            Some(("spec.network", MACVTAP_MODE_ONLY)),
        ),
        (
            "macvtapMode unknown",
            network(json!({"mode": "macvtap", "parent": "eth1", "macvtapMode": "shared"})),
            Some(("spec.network.macvtapMode", MACVTAP_MODE)),
        ),
        (
            "a MAC of five octets",
            network(json!({"mode": "tap", "bridge": "br0", "mac": "52:54:00:12:34"})),
            Some(("spec.network.mac", MAC)),
        ),
        (
            "a MAC of mixed separators",
            network(json!({"mode": "tap", "bridge": "br0", "mac": "52:54-00:12:34:56"})),
            Some(("spec.network.mac", MAC)),
        ),
        (
            "network mode none",
            network(json!({"mode": "none"})),
            Some(("spec.network.mode", MODE)),
        ),
        (
            "placement nodeSelector",
            placement(json!({"nodeSelector": {"kairon.zyvor.dev/pool": "general"}})),
            None,
        ),
        ("controlPlaneAntiAffinity Preferred", anti_affinity("Preferred"), None),
        ("controlPlaneAntiAffinity Required", anti_affinity("Required"), None),
        ("controlPlaneAntiAffinity None", anti_affinity("None"), None),
        (
            "controlPlaneAntiAffinity Soft",
            anti_affinity("Soft"),
            Some(("spec.placement.controlPlaneAntiAffinity", ANTI_AFFINITY)),
        ),
        (
            "controlPlaneAntiAffinity in lower case",
            anti_affinity("required"),
            Some(("spec.placement.controlPlaneAntiAffinity", ANTI_AFFINITY)),
        ),
    ]);
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
    let typed = with(
        with(good_spec(), "resources", Value::Null),
        "instanceTypeName",
        json!("m.large"),
    );
    let tapped = with(good_spec(), "network", json!({"mode": "tap", "bridge": "br0"}));
    let placed = with(
        good_spec(),
        "placement",
        json!({"nodeSelector": {"a": "b"}, "controlPlaneAntiAffinity": "Required"}),
    );
    // (change, new spec, old spec, the fields whose immutability rule refuses it)
    #[rustfmt::skip]
    let cases: Vec<(&str, Value, Value, &[&str])> = vec![
        ("resources.cpu", with(good_spec(), "resources.cpu", json!(4)), good_spec(), &["spec.resources"]),
        ("resources.memory", with(good_spec(), "resources.memory", json!("8Gi")), good_spec(), &["spec.resources"]),
        ("image.imageRef", with(good_spec(), "image.imageRef", json!("other")), good_spec(), &["spec.image"]),
        ("image.diskSize", with(good_spec(), "image.diskSize", json!("80Gi")), good_spec(), &["spec.image"]),
        ("image.diskSize removed", with(good_spec(), "image.diskSize", Value::Null), good_spec(), &["spec.image"]),
        ("image source", with(good_spec(), "image", json!({"path": "/u.qcow2"})), good_spec(), &["spec.image"]),
        ("resources for an instance type", typed.clone(), good_spec(), &["spec.resources", "spec.instanceTypeName"]),
        ("instance type for resources", good_spec(), typed.clone(), &["spec.resources", "spec.instanceTypeName"]),
        ("instanceTypeName", with(typed.clone(), "instanceTypeName", json!("m.xlarge")), typed.clone(), &["spec.instanceTypeName"]),
        ("network added", tapped.clone(), good_spec(), &["spec.network"]),
        ("network removed", good_spec(), tapped.clone(), &["spec.network"]),
        ("network.bridge", with(tapped.clone(), "network.bridge", json!("br1")), tapped.clone(), &["spec.network"]),
        ("network.learnIP", with(tapped.clone(), "network.learnIP", json!(true)), tapped.clone(), &["spec.network"]),
        ("guestAgent added", with(good_spec(), "guestAgent", json!({"enabled": true})), good_spec(), &["spec.guestAgent"]),
        ("guestAgent.enabled", with(good_spec(), "guestAgent", json!({"enabled": false})), with(good_spec(), "guestAgent", json!({"enabled": true})), &["spec.guestAgent"]),
        ("placement added", placed.clone(), good_spec(), &["spec.placement"]),
        ("placement removed", good_spec(), placed.clone(), &["spec.placement"]),
        ("placement.nodeSelector", with(placed.clone(), "placement.nodeSelector", json!({"a": "c"})), placed.clone(), &["spec.placement"]),
        ("placement.controlPlaneAntiAffinity", with(placed.clone(), "placement.controlPlaneAntiAffinity", json!("Preferred")), placed.clone(), &["spec.placement"]),
    ];
    for (name, new, old, fields) in cases {
        // The client-side validator reports a rule's fieldPath as written (`.spec.image`).
        let mut got: Vec<String> = failures("kaironmachines", &machine(new), Some(&machine(old)))
            .into_iter()
            .map(|g| g.trim_start_matches('.').to_string())
            .collect();
        got.sort();
        let mut want: Vec<String> = fields
            .iter()
            .map(|f| format!("{f}: {f} is immutable: create a new KaironMachineTemplate and roll out instead"))
            .collect();
        want.sort();
        assert_eq!(got, want, "{name}");
    }
    // Everything set, nothing changed: passes; adding the providerID is no change of shape.
    let full = with(
        with(placed, "network", json!({"mode": "tap", "bridge": "br0"})),
        "evictionStrategy",
        json!("External"),
    );
    assert!(
        failures("kaironmachines", &machine(full.clone()), Some(&machine(full.clone()))).is_empty(),
        "unchanged spec passes"
    );
    let got = failures(
        "kaironmachines",
        &machine(with(full.clone(), "providerID", json!("kairon://m"))),
        Some(&machine(full)),
    );
    assert!(got.is_empty(), "providerID written: {got:?}");
    let got = failures("kaironmachines", &machine(typed.clone()), Some(&machine(typed)));
    assert!(got.is_empty(), "an instance type unchanged: {got:?}");
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
    // The KaironMachine's rules apply in templates, at the template's paths.
    for (spec, path, msg) in [
        (
            with(good_spec(), "resources.cpu", json!(0)),
            "spec.template.spec.resources.cpu",
            CPU,
        ),
        (
            with(good_spec(), "instanceTypeName", json!("m.large")),
            "spec.template.spec",
            ONE_SIZE,
        ),
        (
            with(good_spec(), "image.path", json!("/u.qcow2")),
            "spec.template.spec.image",
            ONE_SOURCE,
        ),
        (
            with(good_spec(), "network", json!({"mode": "user", "bridge": "br0"})),
            "spec.template.spec.network",
            BRIDGE,
        ),
        (
            with(
                good_spec(),
                "network",
                json!({"mode": "tap", "bridge": "br0", "mac": "52:54:00:12:34:56"}),
            ),
            "spec.template.spec.network.mac",
            "spec.template.spec.network.mac must not be set: every KaironMachine made from the template would have the same MAC address",
        ),
    ] {
        let got = failures("kaironmachinetemplates", &t(spec), None);
        assert!(
            !got.is_empty()
                && got
                    .iter()
                    .all(|g| g.starts_with(&format!("{path}: ")) && g.contains(msg)),
            "template: want only {path}: {msg:?}, got {got:?}"
        );
    }
    // Templates carry no transition rules of their own: immutability is an admission policy
    // with the SSA dry-run exception ClusterClass needs.
    let got = failures(
        "kaironmachinetemplates",
        &t(with(good_spec(), "resources.cpu", json!(8))),
        Some(&t(good_spec())),
    );
    assert!(got.is_empty(), "{got:?}");
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

/// KaironMachinePool: the VM template carries no providerID, a strategy that could never roll
/// is refused, the template is mutable (a change rolls the pool); a KaironMachinePoolTemplate
/// carries no providerIDList.
#[test]
fn kaironmachinepool_rules_table() {
    let pool = |spec: Value| json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironMachinePool", "metadata": {"name": "p"}, "spec": spec});
    let base = json!({"template": good_spec()});
    let strategy = |s: Value| with(base.clone(), "strategy", s);
    let mut tpl_pid = base.clone();
    tpl_pid["template"]["providerID"] = json!("kairon://x");
    let new_image = with(
        base.clone(),
        "template.image.imageRef",
        json!("ubuntu-2404-kube-v1.36.2"),
    );
    let new_size = with(
        with(base.clone(), "template.resources", Value::Null),
        "template.instanceTypeName",
        json!("m.large"),
    );
    #[rustfmt::skip]
    let cases: Vec<(&str, Value, Option<Value>, Option<&str>)> = vec![
        ("good", base.clone(), None, None),
        ("template changed: rolls, allowed", new_image, Some(base.clone()), None),
        ("template resized to an instance type: rolls, allowed", new_size, Some(base.clone()), None),
        ("template with a providerID", tpl_pid, None, Some("spec.template.providerID must not be set")),
        ("template cpu 0", with(base.clone(), "template.resources.cpu", json!(0)), None, Some(CPU)),
        ("template without resources or instance type", with(base.clone(), "template.resources", Value::Null), None, Some(ONE_SIZE)),
        ("template httpURL without digest", with(base.clone(), "template.image", json!({"httpURL": "https://images.example/u.qcow2"})), None, Some(DIGEST_WITH_URL)),
        ("template with a MAC", with(base.clone(), "template.network", json!({"mode": "tap", "bridge": "br0", "mac": "52:54:00:12:34:56"})), None, Some("spec.template.network.mac must not be set: every VM of the pool would have the same MAC address")),
        ("template with macvtap but no parent", with(base.clone(), "template.network", json!({"mode": "macvtap"})), None, Some(PARENT)),
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
        &template(with(base, "providerIDList", json!(["kairon://a"]))),
        None,
    );
    assert!(
        got.iter()
            .any(|g| g.contains("spec.template.spec.providerIDList must not be set")),
        "{got:?}"
    );
}
