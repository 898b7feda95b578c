use super::*;
use crate::api::{MachineImage, MachineNetwork, MachinePlacement, MachineResources};

fn pool() -> PoolLink {
    PoolLink {
        name: "demo-mp-0".into(),
        namespace: "ns".into(),
        uid: "pool-uid".into(),
    }
}

fn shape() -> KaironMachineSpec {
    KaironMachineSpec {
        resources: Some(MachineResources::new(2, "4Gi")),
        image: MachineImage::from_image_ref("ubuntu-2404-kube-v1.36.1", Some("40Gi")),
        network: Some(MachineNetwork {
            mode: Some("tap".into()),
            bridge: Some("storage".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn inputs<'a>(pool: &'a PoolLink, shape: &'a KaironMachineSpec, secret: &'a str) -> SetInputs<'a> {
    SetInputs {
        pool,
        cluster_name: "demo",
        template: shape,
        bootstrap_secret: secret,
        version: Some("v1.36.1"),
    }
}

fn label<'a>(l: &'a Option<BTreeMap<String, String>>, k: &str) -> Option<&'a str> {
    l.as_ref().and_then(|l| l.get(k)).map(String::as_str)
}

#[test]
fn a_set_is_named_by_its_revision_links_back_to_its_pool_and_makes_stopped_members_without_cloud_init() {
    let (p, s) = (pool(), shape());
    let i = inputs(&p, &s, "demo-mp-0-boot");
    let set = desired_machine_set(&i, Some("kairon://machinesets/first"), 0);
    let rev = revision(&desired_template(&i));
    assert_eq!(rev.len(), 6);
    assert_eq!(set.metadata.name.as_deref(), Some(format!("demo-mp-0-{rev}").as_str()));
    assert_eq!(set.metadata.namespace.as_deref(), Some("ns"));
    assert!(set.metadata.owner_references.is_none());
    let l = &set.metadata.labels;
    assert_eq!(label(l, labels::KAIRONMACHINEPOOL_UID), Some("pool-uid"));
    assert_eq!(label(l, labels::KAIRONMACHINEPOOL_NAME), Some("demo-mp-0"));
    assert_eq!(label(l, labels::CLUSTER_NAME), Some("demo"));
    assert_eq!(label(l, REVISION_LABEL), Some(rev.as_str()));
    assert_eq!(
        label(&set.metadata.annotations, POOL_ID_ANNOTATION),
        Some("kairon://machinesets/first")
    );
    assert_eq!(set.spec.replicas, 0);
    assert_eq!(
        set.spec.strategy, None,
        "Kairon's default; the pool never changes a template"
    );

    let t = &set.spec.template;
    assert_eq!(label(&t.labels, labels::KAIRONMACHINEPOOL_NAME), Some("demo-mp-0"));
    assert_eq!(label(&t.labels, labels::BOOTSTRAP_SECRET), Some("demo-mp-0-boot"));
    assert_eq!(label(&t.labels, labels::KUBERNETES_VERSION), Some("v1.36.1"));
    for k in [
        labels::KAIRONMACHINEPOOL_UID,
        labels::KAIRONMACHINE_UID,
        labels::MANAGEMENT_CLUSTER,
    ] {
        assert_eq!(
            label(&t.labels, k),
            None,
            "{k} would change on a move and roll the pool"
        );
    }
    assert_eq!(
        t.spec.power_state.as_deref(),
        Some("Stopped"),
        "no member boots from the template"
    );
    assert_eq!(t.spec.cloud_init, None, "no bootstrap data in a set");
    assert_eq!(
        t.spec.image.as_ref().and_then(|i| i.image_ref.as_deref()),
        Some("ubuntu-2404-kube-v1.36.1")
    );
    assert_eq!(
        t.spec.network.as_ref().and_then(|n| n.bridge.as_deref()),
        Some("storage")
    );
    let without_id = desired_machine_set(&i, None, 0);
    assert_eq!(without_id.metadata.annotations, None);
}

#[test]
fn what_makes_a_new_revision_and_what_does_not() {
    let (p, s) = (pool(), shape());
    let base = inputs(&p, &s, "boot-a");
    let rev = |i: &SetInputs<'_>| revision(&desired_template(i));
    let mut bigger = shape();
    bigger.resources = Some(MachineResources::new(4, "4Gi"));
    let mut other_image = shape();
    other_image.image = MachineImage::from_image_ref("ubuntu-2404-kube-v1.36.2", Some("40Gi"));
    let mut selector = shape();
    selector.placement = Some(MachinePlacement {
        node_selector: Some([("disk".to_string(), "ssd".to_string())].into()),
        ..Default::default()
    });
    let mut empty_selector = shape();
    empty_selector.placement = Some(MachinePlacement {
        node_selector: Some(BTreeMap::new()),
        ..Default::default()
    });
    let other_pool = PoolLink {
        uid: "uid-after-move".into(),
        ..pool()
    };
    #[rustfmt::skip]
    let cases: Vec<(&str, SetInputs<'_>, bool)> = vec![
        ("the same inputs", base.clone(), false),
        ("more CPUs", SetInputs { template: &bigger, ..base.clone() }, true),
        ("another image", SetInputs { template: &other_image, ..base.clone() }, true),
        ("a host selector", SetInputs { template: &selector, ..base.clone() }, true),
        ("an empty host selector is none", SetInputs { template: &empty_selector, ..base.clone() }, false),
        ("another bootstrap Secret", SetInputs { bootstrap_secret: "boot-b", ..base.clone() }, true),
        ("another Kubernetes version", SetInputs { version: Some("v1.36.2"), ..base.clone() }, true),
        ("the pool re-created by a move (new UID)", SetInputs { pool: &other_pool, ..base.clone() }, false),
    ];
    for (name, i, new) in cases {
        assert_eq!(rev(&i) != rev(&base), new, "{name}");
    }
}

#[test]
fn bootstrap_data_digests_are_safe_to_show() {
    let hash = bootstrap_data_hash(&UserData("TOP-SECRET-KEY".into()));
    assert!(hash.starts_with("sha256:") && hash.len() == 7 + 64, "{hash}");
    assert!(!hash.contains("TOP-SECRET"));
}

#[test]
fn long_names_become_label_values_that_fit() {
    let long = "s".repeat(200);
    let v = label_value(&long);
    assert!(v.len() <= MAX_LABEL_VALUE, "{v}");
    assert_eq!(v, label_value(&long), "stable");
    assert_ne!(v, label_value(&"t".repeat(200)));
    assert_eq!(label_value("short"), "short");
    assert_eq!(machine_set_provider_id("abc"), "kairon://machinesets/abc");
}
