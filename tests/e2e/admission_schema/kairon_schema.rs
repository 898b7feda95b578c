//! What the provider writes into Kairon's Machines, against our fixture of Kairon's published Machine schema.

use super::*;

/// The network each case's VM gets: the shipped flavors' (a bridged tap learning its
/// address) for control planes and joining workers, a netns with a static address, and a
/// private macvtap with the user's MAC: every network field the provider writes.
fn network_of(fixture: &str) -> MachineNetwork {
    match fixture {
        "worker-files" => MachineNetwork {
            mode: Some(network_mode::TAP.into()),
            netns: Some(true),
            static_network: Some(true),
            ..Default::default()
        },
        "worker-user" => MachineNetwork {
            mode: Some(network_mode::MACVTAP.into()),
            parent: Some("eth1".into()),
            macvtap_mode: Some("private".into()),
            mac: Some("52:54:00:12:34:56".into()),
            ..Default::default()
        },
        _ => MachineNetwork {
            mode: Some(network_mode::TAP.into()),
            bridge: Some("br0".into()),
            learn_ip: Some(true),
            ..Default::default()
        },
    }
}

/// What [`network_of`] becomes on the Kairon Machine: the same fields, as Kairon spells them.
fn sent_network(fixture: &str) -> Value {
    match fixture {
        "worker-files" => json!({"mode": "tap", "netns": true, "staticNetwork": true}),
        "worker-user" => {
            json!({"mode": "macvtap", "parent": "eth1", "macvtapMode": "private", "mac": "52:54:00:12:34:56"})
        }
        _ => json!({"mode": "tap", "bridge": "br0", "learnIP": true}),
    }
}

/// Kairon's published Machine schema (our own fixture of it, written from the field list of
/// `charts/kairon/crds/machines.yaml` in zyvorai/kairon: no unknown field kept, strict field
/// validation refusing one) takes, unchanged, the whole Kairon Machine the provider creates —
/// each image source (a MachineImage, a path, an http URL with its digest), resources or an
/// instance type, placement (a failure domain's node selector, the control planes' preferred or
/// required anti-affinity), each network mode with every network field the provider writes
/// and the guest agent, and the `spec.cloudInit` the bootstrap bridge makes of the
/// bootstrap data CABPK v1.14.2's templates write: every field it sets exists there with the
/// type it has.
#[tokio::test(flavor = "multi_thread")]
async fn kairons_published_machine_schema_takes_the_machines_the_provider_writes() {
    use capkr::api::{
        FailureDomainSpec, GuestAgent, KaironMachine, KaironMachineSpec, MachineImage, MachinePlacement,
        MachineResources, anti_affinity,
    };
    use capkr::kairon::cloud_init::{DEFAULT_MAX_DECODED_BYTES, GuestFacts, translate_cloud_config};
    use capkr::kairon::desired_kairon_machine;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::core::{ApiResource, GroupVersionKind};

    let opts = EnvOptions::new("kairon_schema").capi_managers(CapiManagers::NONE);
    let env = Env::start(opts).await.expect("test environment");
    env.create_namespace("kairon").await.unwrap();
    let root = capkr_testenv::workspace_root();
    let crd = std::fs::read_to_string(root.join("tests/fixtures/kairon/machines.kairon.zyvor.dev.yaml"))
        .expect("the fixture of Kairon's Machine schema");
    // It replaces the development CRD the environment installed, under the same name.
    env.apply(&crd, None)
        .await
        .expect("Kairon's Machine schema is a valid structural CRD");
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kairon.zyvor.dev", "v1alpha1", "Machine"),
        "machines",
    );
    let machines: Api<DynamicObject> = Api::namespaced_with(env.client(), "kairon", &resource);
    // Server-side apply: the one write whose field validation can be asked Strict here.
    let strict = PatchParams::apply("capkr-test").validation(kube::api::ValidationDirective::Strict);
    let testdata = root.join("testbed/kairon-sim/testdata/cabpk");
    let zone = FailureDomainSpec {
        name: "zone-a".into(),
        control_plane: Some(true),
        node_selector: Some([("topology.kubernetes.io/zone".to_string(), "zone-a".to_string())].into()),
    };
    let by_ref = || MachineImage::from_image_ref(machine_image(), Some("20Gi"));
    let by_url = MachineImage {
        http_url: Some(IMAGE_URL.into()),
        digest: Some(digest()),
        disk_size: Some(Quantity("20Gi".into())),
        ..Default::default()
    };
    let by_path = MachineImage {
        path: Some("/var/lib/kairon/images/ubuntu-2404-kube.qcow2".into()),
        ..Default::default()
    };
    // (CABPK fixture, boot disk, instance type instead of resources, control-plane anti-affinity)
    let cases = [
        ("control-plane-init", by_ref(), None, None),
        ("control-plane-join", by_url, None, Some(anti_affinity::REQUIRED)),
        (
            "control-plane-join",
            by_ref(),
            Some("m.large"),
            Some(anti_affinity::NONE),
        ),
        ("worker-join", by_ref(), None, None),
        ("worker-files", by_path, Some("m.large"), None),
        ("worker-user", by_ref(), None, None),
    ];
    let mut checked = 0;
    for (i, (fixture, image, instance_type, spread)) in cases.into_iter().enumerate() {
        let user_data = std::fs::read_to_string(testdata.join(format!("{fixture}.yaml"))).expect("a CABPK fixture");
        let name = format!("demo-{i}-{fixture}");
        let cloud_init = translate_cloud_config(&user_data, &GuestFacts::kairon(&name), DEFAULT_MAX_DECODED_BYTES)
            .unwrap_or_else(|e| panic!("{fixture}: {e}"));
        let control_plane = fixture.starts_with("control-plane");
        let mut km = KaironMachine::new(
            &name,
            KaironMachineSpec {
                image: image.clone(),
                resources: instance_type.is_none().then(|| MachineResources::new(2, "4Gi")),
                instance_type_name: instance_type.map(String::from),
                network: Some(network_of(fixture)),
                guest_agent: control_plane.then_some(GuestAgent { enabled: Some(true) }),
                placement: Some(MachinePlacement {
                    node_selector: Some([("kairon.zyvor.dev/pool".to_string(), "general".to_string())].into()),
                    control_plane_anti_affinity: spread.map(String::from),
                }),
                eviction_strategy: Some("External".into()),
                ..Default::default()
            },
        );
        km.metadata.namespace = Some("kairon".into());
        km.metadata.uid = Some(format!("uid-{i}-{fixture}"));
        let desired = desired_kairon_machine(&km, "demo", control_plane, cloud_init, Some(&zone));
        let mut vm = serde_json::to_value(&desired).unwrap();
        vm["apiVersion"] = json!("kairon.zyvor.dev/v1alpha1");
        vm["kind"] = json!("Machine");
        let sent = vm["spec"].clone();
        let case = format!("{name} ({spread:?})");
        // What is checked is what was sent: each variant reached Kairon's shape.
        let placement = &sent["placement"];
        assert_eq!(
            placement["nodeSelector"]["kairon.zyvor.dev/pool"], "general",
            "{case}: {sent}"
        );
        assert_eq!(
            placement["nodeSelector"]["topology.kubernetes.io/zone"], "zone-a",
            "{case}: {sent}"
        );
        match (control_plane, spread) {
            (true, Some(anti_affinity::REQUIRED)) => assert!(
                placement["antiAffinity"].is_array() && placement.get("preferredAntiAffinity").is_none(),
                "{case}: {sent}"
            ),
            (true, Some(anti_affinity::NONE)) | (false, _) => assert!(
                placement.get("antiAffinity").is_none() && placement.get("preferredAntiAffinity").is_none(),
                "{case}: {sent}"
            ),
            (true, _) => assert!(
                placement["preferredAntiAffinity"].is_array() && placement.get("antiAffinity").is_none(),
                "{case}: {sent}"
            ),
        }
        assert_eq!(sent["network"], sent_network(fixture), "{case}");
        assert_eq!(
            sent.get("guestAgent"),
            control_plane.then(|| json!({"enabled": true})).as_ref(),
            "{case}"
        );
        if let Some(url) = &image.http_url {
            assert_eq!(
                sent["image"],
                json!({"source": {"httpURL": url}, "digest": digest(), "diskSize": "20Gi"}),
                "{case}"
            );
        } else if let Some(path) = &image.path {
            assert_eq!(sent["image"], json!({"path": path}), "{case}");
        } else {
            assert_eq!(
                sent["image"],
                json!({"imageRef": machine_image(), "diskSize": "20Gi"}),
                "{case}"
            );
        }
        match instance_type {
            Some(t) => assert!(
                sent["instanceTypeName"] == t && sent.get("resources").is_none(),
                "{case}: {sent}"
            ),
            None => assert!(
                sent["resources"] == json!({"cpu": "2", "memory": "4Gi"}) && sent.get("instanceTypeName").is_none(),
                "{case}: {sent}"
            ),
        }
        let vm: DynamicObject = serde_json::from_value(vm).unwrap();
        // The deprecation warning of v1alpha1 is no error; an unknown or mistyped field is.
        let created = machines
            .patch(&name, &strict, &Patch::Apply(&vm))
            .await
            .unwrap_or_else(|e| panic!("{case}: Kairon's schema refuses the Machine: {e}"));
        // Kairon's schema adds its defaults (powerState, the network's flags); it must keep
        // everything the provider sent, as sent.
        if let Some(path) = first_difference(&sent, &created.data["spec"], "spec") {
            panic!(
                "{case}: the schema pruned or changed {path}: sent {sent}, stored {}",
                created.data["spec"]
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 6);
    // The fixture bites: a field Kairon does not have is refused by name.
    let unknown: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "Machine",
        "metadata": {"name": "unknown-field", "namespace": "kairon"},
        "spec": {"cloudInit": {"userData": "#cloud-config\n"}},
    }))
    .unwrap();
    let err = machines
        .patch("unknown-field", &strict, &Patch::Apply(&unknown))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("spec.cloudInit.userData"), "{err}");
}

/// The first place (a JSON path) where `kept` lacks or changes something of `sent`; `None` when
/// every field of `sent` is in `kept` with the same value (`kept` may have more).
fn first_difference(sent: &Value, kept: &Value, path: &str) -> Option<String> {
    match (sent, kept) {
        (Value::Object(s), Value::Object(k)) => s.iter().find_map(|(key, v)| match k.get(key) {
            Some(kv) => first_difference(v, kv, &format!("{path}.{key}")),
            None => Some(format!("{path}.{key}")),
        }),
        (Value::Array(s), Value::Array(k)) if s.len() == k.len() => s
            .iter()
            .zip(k)
            .enumerate()
            .find_map(|(i, (sv, kv))| first_difference(sv, kv, &format!("{path}[{i}]"))),
        _ => (sent != kept).then(|| path.to_string()),
    }
}

#[test]
fn first_difference_finds_what_was_dropped_or_changed() {
    let sent = json!({"a": {"b": 1, "c": [1, {"d": "x"}]}});
    assert_eq!(
        first_difference(&sent, &json!({"a": {"b": 1, "c": [1, {"d": "x"}]}, "e": 2}), "spec"),
        None
    );
    assert_eq!(
        first_difference(&sent, &json!({"a": {"c": [1, {"d": "x"}]}}), "spec").as_deref(),
        Some("spec.a.b")
    );
    assert_eq!(
        first_difference(&sent, &json!({"a": {"b": 1, "c": [1, {"d": "y"}]}}), "spec").as_deref(),
        Some("spec.a.c[1].d")
    );
    assert_eq!(
        first_difference(&sent, &json!({"a": {"b": 1, "c": [1]}}), "spec").as_deref(),
        Some("spec.a.c")
    );
}
