//! Admission by the CRD schema on a real kube-apiserver (no CAPI managers, no webhook server):
//! invalid specs are rejected with messages that name the field, and updates of immutable
//! fields are rejected — the CRDs' OpenAPI schema and CEL rules doing the work.

use capkr_testenv::{CapiManagers, Env, EnvOptions, infrastructure_resource, machine_image};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn api(env: &Env, kind: &str, plural: &str) -> Api<DynamicObject> {
    Api::namespaced_with(env.client(), "admission", &infrastructure_resource(kind, plural))
}

fn obj(kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": kind,
        "metadata": {"name": name, "namespace": "admission"}, "spec": spec
    }))
    .unwrap()
}

fn machine_spec() -> Value {
    json!({"cpus": 2, "memory": "4Gi", "image": machine_image(), "diskSize": "20Gi"})
}

fn with(mut v: Value, path: &[&str], value: Value) -> Value {
    let mut cur = &mut v;
    for p in &path[..path.len() - 1] {
        cur = &mut cur[*p];
    }
    match value {
        Value::Null => {
            cur.as_object_mut().unwrap().remove(path[path.len() - 1]);
        }
        other => cur[path[path.len() - 1]] = other,
    }
    v
}

fn plural(kind: &str) -> &'static str {
    match kind {
        "KaironMachine" => "kaironmachines",
        "KaironMachineTemplate" => "kaironmachinetemplates",
        "KaironCluster" => "kaironclusters",
        "KaironClusterTemplate" => "kaironclustertemplates",
        "KaironMachinePool" => "kaironmachinepools",
        "KaironMachinePoolTemplate" => "kaironmachinepooltemplates",
        other => panic!("{other}"),
    }
}

async fn rejection(env: &Env, o: &DynamicObject) -> Option<String> {
    let kind = o.types.as_ref().unwrap().kind.clone();
    match api(env, &kind, plural(&kind)).create(&PostParams::default(), o).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(s.message.clone()),
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_specs_are_rejected_with_messages_naming_the_field() {
    let opts = EnvOptions::new("admission").capi_managers(CapiManagers::NONE);
    let env = Env::start(opts).await.expect("test environment");
    env.create_namespace("admission").await.unwrap();

    let tmpl = |spec: Value| json!({"template": {"spec": spec}});
    let endpoint = json!({"controlPlaneEndpoint": {"host": "10.0.0.10", "port": 6443}});
    // (kind, spec, field path the message must name, phrase it must contain)
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "KaironMachine",
            with(machine_spec(), &["cpus"], json!(0)),
            "spec.cpus",
            "cpus must be at least 1",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["cpus"], json!(-4)),
            "spec.cpus",
            "cpus must be at least 1",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["memory"], json!("256Mi")),
            "spec.memory",
            "at least 512Mi",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["memory"], json!("lots")),
            "spec.memory",
            "",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["diskSize"], json!("0")),
            "spec.diskSize",
            "greater than 0",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["image"], json!("")),
            "spec.image",
            "",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["image"], Value::Null),
            "spec.image",
            "Required",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["cpus"], Value::Null),
            "spec.cpus",
            "Required",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["providerID"], json!("")),
            "spec.providerID",
            "",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["network"], json!({"name": ""})),
            "spec.network.name",
            "",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["cpus"], json!("two")),
            "spec.cpus",
            "",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["evictionStrategy"], json!("LiveMigrate")),
            "spec.evictionStrategy",
            "must be LiveMigrateIfPossible or External",
        ),
        (
            "KaironMachineTemplate",
            tmpl(with(machine_spec(), &["evictionStrategy"], json!("None"))),
            "spec.template.spec.evictionStrategy",
            "must be LiveMigrateIfPossible or External",
        ),
        (
            "KaironMachineTemplate",
            tmpl(with(machine_spec(), &["providerID"], json!("kairon://x"))),
            "spec.template.spec.providerID",
            "must not be set",
        ),
        (
            "KaironMachineTemplate",
            tmpl(with(machine_spec(), &["cpus"], json!(0))),
            "spec.template.spec.cpus",
            "cpus must be at least 1",
        ),
        (
            "KaironMachineTemplate",
            tmpl(with(machine_spec(), &["memory"], json!("100Mi"))),
            "spec.template.spec.memory",
            "at least 512Mi",
        ),
        (
            "KaironCluster",
            json!({"controlPlaneEndpoint": {"host": "h", "port": 0}}),
            "spec.controlPlaneEndpoint.port",
            "between 1 and 65535",
        ),
        (
            "KaironCluster",
            json!({"controlPlaneEndpoint": {"host": "h", "port": 70000}}),
            "spec.controlPlaneEndpoint.port",
            "between 1 and 65535",
        ),
        (
            "KaironCluster",
            json!({"controlPlaneEndpoint": {"host": "", "port": 6443}}),
            "spec.controlPlaneEndpoint.host",
            "",
        ),
        (
            "KaironCluster",
            json!({"controlPlaneEndpoint": {}}),
            "spec.controlPlaneEndpoint",
            "must set host or port",
        ),
        (
            "KaironCluster",
            json!({"failureDomains": [{"name": "a"}, {"name": "a"}]}),
            "spec.failureDomains",
            "",
        ),
        (
            "KaironCluster",
            json!({"failureDomains": [{"name": ""}]}),
            "spec.failureDomains[0].name",
            "",
        ),
        (
            "KaironCluster",
            json!({"failureDomains": []}),
            "spec.failureDomains",
            "",
        ),
        (
            "KaironClusterTemplate",
            tmpl(json!({"controlPlaneEndpoint": {"host": "h", "port": 0}})),
            "spec.template.spec.controlPlaneEndpoint.port",
            "between 1 and 65535",
        ),
        (
            "KaironCluster",
            json!({"identityRef": {"kind": "ConfigMap", "name": "a"}}),
            "spec.identityRef.kind",
            "must be Secret",
        ),
        (
            "KaironClusterTemplate",
            tmpl(json!({"identityRef": {"kind": "Secret", "name": "Not A Name"}})),
            "spec.template.spec.identityRef.name",
            "must be an object name",
        ),
        (
            "KaironMachinePool",
            json!({"template": with(machine_spec(), &["providerID"], json!("kairon://x"))}),
            "spec.template",
            "providerID must not be set",
        ),
        (
            "KaironMachinePool",
            json!({"template": machine_spec(), "providerIDList": [""]}),
            "spec.providerIDList[0]",
            "",
        ),
        (
            "KaironMachinePool",
            json!({"template": machine_spec(), "strategy": {"maxSurge": 0, "maxUnavailable": 0}}),
            "spec.strategy",
            "must not both be 0",
        ),
        (
            "KaironMachinePoolTemplate",
            tmpl(json!({"template": machine_spec(), "providerID": "kairon://machinesets/x"})),
            "spec.template.spec.providerID",
            "must not be set",
        ),
    ];
    assert!(cases.len() >= 15);
    let mut failures = vec![];
    for (i, (kind, spec, field, phrase)) in cases.iter().enumerate() {
        let o = obj(kind, &format!("bad-{i}"), spec.clone());
        match rejection(&env, &o).await {
            None => failures.push(format!("case {i} ({kind} {spec}): accepted")),
            Some(msg) if !msg.contains(field) || !msg.contains(phrase) => failures.push(format!(
                "case {i} ({kind} {spec}): message {msg:?} lacks {field:?} or {phrase:?}"
            )),
            Some(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Good objects are accepted...
    let machines = api(&env, "KaironMachine", "kaironmachines");
    machines
        .create(&PostParams::default(), &obj("KaironMachine", "good", machine_spec()))
        .await
        .expect("a valid KaironMachine");
    for strategy in ["LiveMigrateIfPossible", "External"] {
        let spec = with(machine_spec(), &["evictionStrategy"], json!(strategy));
        machines
            .create(
                &PostParams::default(),
                &obj("KaironMachine", &strategy.to_lowercase(), spec),
            )
            .await
            .unwrap_or_else(|e| panic!("evictionStrategy {strategy} is accepted: {e}"));
    }
    let clusters = api(&env, "KaironCluster", "kaironclusters");
    clusters
        .create(&PostParams::default(), &obj("KaironCluster", "good", endpoint))
        .await
        .expect("a valid KaironCluster");

    // ...and their immutable fields stay put.
    let pp = PatchParams::default();
    let updates: Vec<(&Api<DynamicObject>, Value, &str, &str)> = vec![
        (&machines, json!({"spec": {"cpus": 8}}), "spec.cpus", "immutable"),
        (
            &machines,
            json!({"spec": {"image": "other"}}),
            "spec.image",
            "immutable",
        ),
        (
            &machines,
            json!({"spec": {"nodeSelector": {"a": "b"}}}),
            "spec.nodeSelector",
            "immutable",
        ),
        (
            &machines,
            json!({"spec": {"evictionStrategy": "External"}}),
            "spec.evictionStrategy",
            "immutable",
        ),
        (
            &clusters,
            json!({"spec": {"controlPlaneEndpoint": {"host": "10.0.0.11"}}}),
            "spec.controlPlaneEndpoint",
            "immutable once set",
        ),
        (
            &clusters,
            json!({"spec": {"identityRef": {"kind": "Secret", "name": "kairon-site-b"}}}),
            "spec.identityRef",
            "immutable",
        ),
    ];
    for (api, patch, field, phrase) in updates {
        match api.patch("good", &pp, &Patch::Merge(patch.clone())).await {
            Ok(_) => panic!("update {patch} accepted"),
            Err(kube::Error::Api(s)) => assert!(
                s.message.contains(field) && s.message.contains(phrase),
                "{patch}: {}",
                s.message
            ),
            Err(e) => panic!("{e}"),
        }
    }
    // providerID: set once, then never changed.
    machines
        .patch(
            "good",
            &pp,
            &Patch::Merge(json!({"spec": {"providerID": "kairon://a"}})),
        )
        .await
        .expect("first providerID write");
    let err = machines
        .patch(
            "good",
            &pp,
            &Patch::Merge(json!({"spec": {"providerID": "kairon://b"}})),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("spec.providerID is write-once"), "{err}");
    // Metadata stays editable (CAPI syncs labels and annotations onto KaironMachines).
    machines
        .patch(
            "good",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}, "annotations": {"a": "b"}}})),
        )
        .await
        .expect("metadata edits are allowed");

    // A KaironMachinePool's template is mutable (a change rolls the pool; ClusterClass
    // topology patches it in place); its providerID is write-once; its status takes both
    // `ready` (what CAPI v1.14.2 reads) and `initialization.provisioned`.
    let pools = api(&env, "KaironMachinePool", "kaironmachinepools");
    pools
        .create(
            &PostParams::default(),
            &obj("KaironMachinePool", "good", json!({"template": machine_spec()})),
        )
        .await
        .expect("a valid KaironMachinePool");
    let rolled = json!({"spec": {"template": {"image": "ubuntu-2404-kube-v1.36.9", "cpus": 4},
        "providerID": "kairon://machinesets/a", "providerIDList": ["kairon://vm-1", "kairon://vm-2"]}});
    pools
        .patch("good", &pp, &Patch::Merge(rolled))
        .await
        .expect("the pool's template and lists are writable");
    let err = pools
        .patch(
            "good",
            &pp,
            &Patch::Merge(json!({"spec": {"providerID": "kairon://machinesets/b"}})),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("spec.providerID is write-once"), "{err}");
    let status = json!({"status": {"ready": true, "initialization": {"provisioned": true}, "replicas": 2,
        "readyReplicas": 1, "infrastructureMachineKind": "KaironMachine"}});
    let written = pools
        .patch_status("good", &pp, &Patch::Merge(status))
        .await
        .expect("status subresource");
    assert_eq!(written.data["status"]["ready"], true);
    assert_eq!(written.data["status"]["initialization"]["provisioned"], true);
    assert_eq!(written.data["status"]["infrastructureMachineKind"], "KaironMachine");
}

/// Kairon's published Machine schema (our own fixture of it, written from the field list of
/// `charts/kairon/crds/machines.yaml` in zyvorai/kairon: no unknown field kept, strict field
/// validation refusing one) takes, unchanged, the whole Kairon Machine the provider creates —
/// image, resources, placement (a failure domain's node selector, the control planes'
/// anti-affinity), a named network, and the `spec.cloudInit` the bootstrap bridge makes of the
/// bootstrap data CABPK v1.14.2's templates write: every field it sets exists there with the
/// type it has.
#[tokio::test(flavor = "multi_thread")]
async fn kairons_published_machine_schema_takes_the_machines_the_provider_writes() {
    use capkr::api::{FailureDomainSpec, KaironMachine, KaironMachineSpec, NetworkRef};
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
    let testdata = root.join("tests/kairon-sim/testdata/cabpk");
    let zone = FailureDomainSpec {
        name: "zone-a".into(),
        control_plane: Some(true),
        node_selector: Some([("topology.kubernetes.io/zone".to_string(), "zone-a".to_string())].into()),
    };
    let mut checked = 0;
    for fixture in [
        "control-plane-init",
        "control-plane-join",
        "worker-join",
        "worker-files",
        "worker-user",
    ] {
        let user_data = std::fs::read_to_string(testdata.join(format!("{fixture}.yaml"))).expect("a CABPK fixture");
        let name = format!("demo-{fixture}");
        let cloud_init = translate_cloud_config(&user_data, &GuestFacts::kairon(&name), DEFAULT_MAX_DECODED_BYTES)
            .unwrap_or_else(|e| panic!("{fixture}: {e}"));
        let mut km = KaironMachine::new(
            &name,
            KaironMachineSpec {
                cpus: 2,
                memory: Quantity("4Gi".into()),
                image: machine_image(),
                disk_size: Quantity("20Gi".into()),
                network: fixture.starts_with("worker").then(|| NetworkRef { name: "br0".into() }),
                node_selector: Some([("kairon.zyvor.dev/pool".to_string(), "general".to_string())].into()),
                eviction_strategy: Some("External".into()),
                ..Default::default()
            },
        );
        km.metadata.namespace = Some("kairon".into());
        km.metadata.uid = Some(format!("uid-{fixture}"));
        let control_plane = fixture.starts_with("control-plane");
        let desired = desired_kairon_machine(&km, "demo", control_plane, cloud_init, Some(&zone));
        let mut vm = serde_json::to_value(&desired).unwrap();
        vm["apiVersion"] = json!("kairon.zyvor.dev/v1alpha1");
        vm["kind"] = json!("Machine");
        let sent = vm["spec"].clone();
        if control_plane {
            assert!(
                sent["placement"]["preferredAntiAffinity"].is_array(),
                "{fixture}: {sent}"
            );
        } else {
            assert_eq!(sent["network"]["bridge"], "br0", "{fixture}");
        }
        let vm: DynamicObject = serde_json::from_value(vm).unwrap();
        // The deprecation warning of v1alpha1 is no error; an unknown or mistyped field is.
        let created = machines
            .patch(&name, &strict, &Patch::Apply(&vm))
            .await
            .unwrap_or_else(|e| panic!("{fixture}: Kairon's schema refuses the Machine: {e}"));
        // Kairon's schema adds its defaults (powerState, the network's flags); it must keep
        // everything the provider sent, as sent.
        if let Some(path) = first_difference(&sent, &created.data["spec"], "spec") {
            panic!(
                "{fixture}: the schema pruned or changed {path}: sent {sent}, stored {}",
                created.data["spec"]
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 5);
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
