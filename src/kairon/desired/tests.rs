use super::*;
use crate::api::{KaironMachineSpec, MachineImage, MachineNetwork, MachinePlacement, MachineResources};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn km(name: &str) -> KaironMachine {
    let mut km = KaironMachine::new(
        name,
        KaironMachineSpec {
            resources: Some(MachineResources::new(2, "4Gi")),
            image: MachineImage::from_image_ref("ubuntu-2404-kube-v1.36.1", Some("40Gi")),
            ..Default::default()
        },
    );
    km.metadata.namespace = Some("ns".into());
    km.metadata.uid = Some("km-uid".into());
    km
}

fn fd(name: &str, sel: &[(&str, &str)]) -> FailureDomainSpec {
    FailureDomainSpec {
        name: name.into(),
        control_plane: Some(true),
        node_selector: Some(sel.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
    }
}

fn label<'a>(m: &'a Machine, k: &str) -> Option<&'a str> {
    m.metadata.labels.as_ref().unwrap().get(k).map(String::as_str)
}

fn cloud_init(hostname: &str) -> CloudInit {
    CloudInit {
        hostname: hostname.into(),
        run_cmd: vec!["kubeadm join".into()],
        ..Default::default()
    }
}

struct Case {
    name: &'static str,
    km: KaironMachine,
    fd: Option<FailureDomainSpec>,
    want_selector: Option<Vec<(&'static str, &'static str)>>,
    want_fd_annotation: Option<&'static str>,
    want_name_label: bool,
}

#[test]
fn desired_kairon_machine_table() {
    let mut with_sel = km("m-sel");
    with_sel.spec.placement = Some(MachinePlacement {
        node_selector: Some(
            [
                ("disk".to_string(), "ssd".to_string()),
                ("zone".to_string(), "template".to_string()),
            ]
            .into(),
        ),
        ..Default::default()
    });
    let cases = vec![
        Case {
            name: "plain",
            km: km("m1"),
            fd: None,
            want_selector: None,
            want_fd_annotation: None,
            want_name_label: true,
        },
        Case {
            name: "failure domain adds its node selector",
            km: km("m2"),
            fd: Some(fd("zone-a", &[("zone", "a")])),
            want_selector: Some(vec![("zone", "a")]),
            want_fd_annotation: Some("zone-a"),
            want_name_label: true,
        },
        Case {
            name: "failure domain wins a conflicting key, template keys stay",
            km: with_sel,
            fd: Some(fd("zone-b", &[("zone", "b")])),
            want_selector: Some(vec![("disk", "ssd"), ("zone", "b")]),
            want_fd_annotation: Some("zone-b"),
            want_name_label: true,
        },
        Case {
            name: "name too long for a label value",
            km: km(&"x".repeat(64)),
            fd: None,
            want_selector: None,
            want_fd_annotation: None,
            want_name_label: false,
        },
    ];
    for c in cases {
        let m = desired_kairon_machine(&c.km, "demo", false, cloud_init("h"), c.fd.as_ref());
        assert_eq!(m.metadata.name, c.km.metadata.name, "{}", c.name);
        assert_eq!(m.metadata.namespace.as_deref(), Some("ns"), "{}", c.name);
        assert!(m.metadata.owner_references.is_none(), "{}: no ownerReferences", c.name);
        assert_eq!(label(&m, labels::KAIRONMACHINE_UID), Some("km-uid"), "{}", c.name);
        assert_eq!(label(&m, labels::KAIRONMACHINE_NAMESPACE), Some("ns"), "{}", c.name);
        assert_eq!(label(&m, labels::CLUSTER_NAME), Some("demo"), "{}", c.name);
        assert_eq!(label(&m, labels::CONTROL_PLANE), None, "{}", c.name);
        assert_eq!(
            label(&m, labels::MANAGED_BY),
            Some("cluster-api-provider-kairon"),
            "{}",
            c.name
        );
        assert_eq!(
            label(&m, labels::KAIRONMACHINE_NAME).is_some(),
            c.want_name_label,
            "{}",
            c.name
        );
        let placement = m.spec.placement.clone();
        let sel = placement
            .as_ref()
            .and_then(|p| p.node_selector.clone())
            .map(|s| s.into_iter().collect::<Vec<_>>());
        let want = c.want_selector.map(|v| {
            v.into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        });
        assert_eq!(sel, want, "{}", c.name);
        assert!(
            placement.is_none_or(|p| p.preferred_anti_affinity.is_none()),
            "{}: a worker is not spread",
            c.name
        );
        assert_eq!(
            m.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(FAILURE_DOMAIN_ANNOTATION))
                .map(String::as_str),
            c.want_fd_annotation,
            "{}",
            c.name
        );
        assert_eq!(
            m.spec.resources,
            Some(Resources {
                cpu: Some("2".into()),
                memory: Some("4Gi".into())
            })
        );
        let image = m.spec.image.as_ref().expect("image");
        assert_eq!(image.image_ref.as_deref(), Some("ubuntu-2404-kube-v1.36.1"));
        assert_eq!(image.disk_size.as_deref(), Some("40Gi"));
        assert_eq!(m.spec.cloud_init, Some(cloud_init("h")));
        assert_eq!(m.spec.node_name, None, "{}: Kairon schedules", c.name);
    }
}

/// What the provider writes is Kairon's shape: no field of the old model's spec.
#[test]
fn the_spec_serializes_in_kairons_shape() {
    let mut k = km("m");
    k.spec.eviction_strategy = Some("External".into());
    let m = desired_kairon_machine(&k, "demo", true, cloud_init("m"), Some(&fd("zone-a", &[("zone", "a")])));
    let spec = serde_json::to_value(&m.spec).unwrap();
    assert_eq!(
        spec,
        serde_json::json!({
            "image": {"imageRef": "ubuntu-2404-kube-v1.36.1", "diskSize": "40Gi"},
            "resources": {"cpu": "2", "memory": "4Gi"},
            "placement": {
                "nodeSelector": {"zone": "a"},
                "preferredAntiAffinity": [{"weight": 100, "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"cluster.x-k8s.io/cluster-name": "demo", "infrastructure.cluster.x-k8s.io/kairon-role": "control-plane"}}]
            },
            "cloudInit": {"hostname": "m", "runCmd": ["kubeadm join"]}
        })
    );
    assert_eq!(label(&m, labels::CONTROL_PLANE), Some(""));
    assert!(
        m.metadata
            .annotations
            .as_ref()
            .is_none_or(|a| a.keys().all(|k| !k.contains("eviction"))),
        "the deprecated eviction strategy reaches Kairon in no form: {:?}",
        m.metadata.annotations
    );
}

#[test]
fn control_planes_are_spread_as_the_spec_asks() {
    let spread = |how: Option<&str>| {
        let mut k = km("m");
        k.spec.placement = how.map(|h| MachinePlacement {
            control_plane_anti_affinity: Some(h.into()),
            ..Default::default()
        });
        let m = desired_kairon_machine(&k, "demo", true, CloudInit::default(), None);
        let p = m.spec.placement.unwrap_or_default();
        (p.preferred_anti_affinity.is_some(), p.anti_affinity)
    };
    let others = BTreeMap::from([
        (labels::CLUSTER_NAME.to_string(), "demo".to_string()),
        (labels::ROLE.to_string(), labels::ROLE_CONTROL_PLANE.to_string()),
    ]);
    assert_eq!(spread(None), (true, None), "soft by default");
    assert_eq!(spread(Some("Preferred")), (true, None));
    assert_eq!(
        spread(Some("Required")),
        (
            false,
            Some(vec![Term {
                label_selector: others,
                topology_key: "kubernetes.io/hostname".into()
            }])
        ),
        "Kairon's hard antiAffinity"
    );
    assert_eq!(spread(Some("None")), (false, None));
}

#[test]
fn every_image_source_and_an_instance_type_go_over_in_kairons_shape() {
    let digest = format!("sha256:{}", "a".repeat(64));
    let mut k = km("m");
    k.spec.image = MachineImage {
        http_url: Some("https://images.example/u.qcow2".into()),
        digest: Some(digest.clone()),
        ..Default::default()
    };
    k.spec.resources = None;
    k.spec.instance_type_name = Some("m.large".into());
    let spec =
        serde_json::to_value(desired_kairon_machine(&k, "demo", false, CloudInit::default(), None).spec).unwrap();
    assert_eq!(
        spec["image"],
        serde_json::json!({"source": {"httpURL": "https://images.example/u.qcow2"}, "digest": digest})
    );
    assert_eq!(spec["instanceTypeName"], "m.large");
    assert!(spec.get("resources").is_none(), "Kairon fills resources from the type");
    k.spec.image = MachineImage {
        path: Some("/var/lib/kairon/images/u.qcow2".into()),
        disk_size: Some(Quantity("30Gi".into())),
        ..Default::default()
    };
    let spec =
        serde_json::to_value(desired_kairon_machine(&k, "demo", false, CloudInit::default(), None).spec).unwrap();
    assert_eq!(
        spec["image"],
        serde_json::json!({"path": "/var/lib/kairon/images/u.qcow2", "diskSize": "30Gi"})
    );
}

#[test]
fn a_tap_network_is_a_tap_on_that_bridge() {
    let mut k = km("m");
    k.spec.network = Some(MachineNetwork {
        mode: Some("tap".into()),
        bridge: Some("br-storage".into()),
        ..Default::default()
    });
    let m = desired_kairon_machine(&k, "demo", false, CloudInit::default(), None);
    assert_eq!(
        m.spec.network,
        Some(Network {
            mode: Some("tap".into()),
            bridge: Some("br-storage".into()),
            ..Default::default()
        })
    );
    assert_eq!(m.spec.guest_agent, None);
}

#[test]
fn every_network_field_the_user_wrote_is_copied_and_nothing_is_derived() {
    #[rustfmt::skip]
    let cases: [(&str, MachineNetwork, Option<bool>, Network); 3] = [
        (
            "bridged tap learning its address, with the guest agent",
            MachineNetwork { mode: Some("tap".into()), bridge: Some("br0".into()), learn_ip: Some(true), ..Default::default() },
            Some(true),
            Network { mode: Some("tap".into()), bridge: Some("br0".into()), learn_ip: Some(true), ..Default::default() },
        ),
        (
            // No MAC made up: Kairon derives a netns VM's own.
            "netns with a static address",
            MachineNetwork { mode: Some("tap".into()), netns: Some(true), static_network: Some(true), ..Default::default() },
            None,
            Network { mode: Some("tap".into()), netns: Some(true), static_network: Some(true), ..Default::default() },
        ),
        (
            "macvtap with a MAC of the user's",
            MachineNetwork { mode: Some("macvtap".into()), parent: Some("eth1".into()), macvtap_mode: Some("private".into()), mac: Some("52:54:00:aa:bb:cc".into()), ..Default::default() },
            Some(false),
            Network { mode: Some("macvtap".into()), parent: Some("eth1".into()), macvtap_mode: Some("private".into()), mac: Some("52:54:00:aa:bb:cc".into()), ..Default::default() },
        ),
    ];
    for (name, network, agent, want) in cases {
        let mut k = km("m");
        k.spec.network = Some(network);
        k.spec.guest_agent = agent.map(|enabled| crate::api::GuestAgent { enabled: Some(enabled) });
        let m = desired_kairon_machine(&k, "demo", false, CloudInit::default(), None);
        assert_eq!(m.spec.network, Some(want), "{name}");
        assert_eq!(
            m.spec.guest_agent,
            agent.map(|enabled| crate::kairon::GuestAgent { enabled: Some(enabled) }),
            "{name}"
        );
    }
}

#[test]
fn memory_is_written_in_a_form_kairon_parses() {
    for (given, want) in [
        ("4Gi", "4Gi"),
        ("512Mi", "512Mi"),
        ("1.5Gi", "1.5Gi"),
        ("8G", "8G"),
        ("4294967296", "4294967296"),
        ("1Pi", "1073741824Mi"),
        ("600000k", "573Mi"),
        ("4e9", "3815Mi"),
    ] {
        assert_eq!(kairon_memory(given), want, "{given}");
    }
}

#[test]
fn secrets_never_show_in_debug_output() {
    let ci = CloudInit {
        run_cmd: vec!["kubeadm join --token TOP-SECRET-KEY".into()],
        ..Default::default()
    };
    let m = desired_kairon_machine(&km("m"), "demo", false, ci, None);
    let dbg = format!("{m:?}");
    assert!(!dbg.contains("TOP-SECRET-KEY"), "{dbg}");
    assert!(dbg.contains("redacted"));
}

#[test]
fn provider_ids_use_the_kairon_scheme() {
    assert_eq!(provider_id("demo-md-0-x7k2p"), "kairon://demo-md-0-x7k2p");
    let mut vm = Machine::new("demo-md-0-x7k2p", MachineSpec::default());
    vm.metadata.uid = Some("3f6c".into());
    assert!(names_instance("kairon://demo-md-0-x7k2p", &Vm::from(vm.clone())));
    assert!(
        names_instance("kairon://3f6c", &Vm::from(vm.clone())),
        "the old model's uid form"
    );
    assert!(!names_instance("kairon://other", &Vm::from(vm.clone())));
    assert!(is_the_instance("kairon://demo-md-0-x7k2p", None, &Vm::from(vm.clone())));
    assert!(is_the_instance(
        "kairon://demo-md-0-x7k2p",
        Some("3f6c"),
        &Vm::from(vm.clone())
    ));
    assert!(
        !is_the_instance(
            "kairon://demo-md-0-x7k2p",
            Some("an-earlier-uid"),
            &Vm::from(vm.clone())
        ),
        "a Machine re-created under the name is another instance"
    );
    assert!(is_the_instance("kairon://3f6c", Some("3f6c"), &Vm::from(vm.clone())));
    assert!(!is_the_instance("kairon://an-earlier-uid", None, &Vm::from(vm.clone())));
}
