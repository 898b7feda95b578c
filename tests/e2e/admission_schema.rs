//! Admission by the CRD schema on a real kube-apiserver (no CAPI managers, no webhook server):
//! invalid specs are rejected with messages that name the field, and updates of immutable
//! fields are rejected — the CRDs' OpenAPI schema and CEL rules doing the work.

use capkr::api::{MachineNetwork, network_mode};
use capkr_testenv::{CapiManagers, Env, EnvOptions, infrastructure_resource, machine_image};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// What the provider writes into Kairon's Machines, against our fixture of Kairon's published Machine schema.
mod kairon_schema;

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
    json!({"image": {"imageRef": machine_image(), "diskSize": "20Gi"}, "resources": {"cpu": 2, "memory": "4Gi"}})
}

/// A digest of the form the CRD takes (`sha256:` and 64 lowercase hex digits).
fn digest() -> String {
    format!("sha256:{}", "0123456789abcdef".repeat(4))
}

const IMAGE_URL: &str = "https://images.example/ubuntu-2404-kube.qcow2";

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

/// An update that must be refused: API, object name, merge patch, and the field paths the
/// refusal must name with the phrase each must carry.
type Update<'a> = (&'a Api<DynamicObject>, &'a str, Value, Vec<(&'a str, String)>);

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
    let image = |v: Value| with(machine_spec(), &["image"], v);
    let network = |v: Value| with(machine_spec(), &["network"], v);
    let by_type = with(machine_spec(), &["resources"], Value::Null);
    let one_source = "image: exactly one of imageRef, path and httpURL must be set";
    let digest_with_url = "image.digest is required with image.httpURL";
    let whole_cpu = "resources.cpu must be a whole number of at least 1";
    let one_size = "exactly one of resources and instanceTypeName must be set";
    let bridge = "network.bridge is only used with network.mode tap";
    let parent = "network.parent is required with network.mode macvtap and only used with it";
    // (kind, spec, field path the message must name, phrase it must contain)
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "KaironMachine",
            with(machine_spec(), &["resources", "cpu"], json!(0)),
            "spec.resources.cpu",
            whole_cpu,
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["resources", "cpu"], json!(-4)),
            "spec.resources.cpu",
            whole_cpu,
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["resources", "cpu"], json!("1.5")),
            "spec.resources.cpu",
            whole_cpu,
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["resources", "cpu"], json!("500m")),
            "spec.resources.cpu",
            whole_cpu,
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["resources", "memory"], json!("256Mi")),
            "spec.resources.memory",
            "resources.memory must be a quantity of at least 512Mi",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["resources", "memory"], json!("lots")),
            "spec.resources.memory",
            "resources.memory must be a quantity of at least 512Mi",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["image", "diskSize"], json!("0")),
            "spec.image.diskSize",
            "image.diskSize must be a quantity greater than 0",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["image", "imageRef"], json!("")),
            "spec.image.imageRef",
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
            with(machine_spec(), &["image"], json!("ubuntu-2404-kube")),
            "spec.image",
            "must be of type object",
        ),
        (
            "KaironMachine",
            image(json!({"imageRef": machine_image(), "path": "/var/lib/kairon/images/u.qcow2"})),
            "spec.image",
            one_source,
        ),
        (
            "KaironMachine",
            image(json!({"imageRef": machine_image(), "httpURL": IMAGE_URL, "digest": digest()})),
            "spec.image",
            one_source,
        ),
        (
            "KaironMachine",
            image(json!({"diskSize": "20Gi"})),
            "spec.image",
            one_source,
        ),
        (
            "KaironMachine",
            image(json!({"httpURL": IMAGE_URL})),
            "spec.image",
            digest_with_url,
        ),
        (
            "KaironMachine",
            image(json!({"imageRef": machine_image(), "digest": digest()})),
            "spec.image",
            digest_with_url,
        ),
        (
            "KaironMachine",
            image(json!({"httpURL": IMAGE_URL, "digest": digest().to_uppercase().replacen("SHA256", "sha256", 1)})),
            "spec.image.digest",
            "image.digest must be sha256: followed by 64 lowercase hex digits",
        ),
        (
            "KaironMachine",
            image(json!({"httpURL": "ftp://images.example/u.qcow2", "digest": digest()})),
            "spec.image.httpURL",
            "image.httpURL must be an http:// or https:// URL",
        ),
        (
            "KaironMachine",
            image(json!({"path": "images/u.qcow2"})),
            "spec.image.path",
            "image.path must be an absolute path",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["resources", "cpu"], Value::Null),
            "spec.resources.cpu",
            "Required",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["instanceTypeName"], json!("m.large")),
            "spec",
            one_size,
        ),
        ("KaironMachine", by_type.clone(), "spec", one_size),
        (
            "KaironMachine",
            with(by_type, &["instanceTypeName"], json!("")),
            "spec.instanceTypeName",
            "",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["providerID"], json!("")),
            "spec.providerID",
            "",
        ),
        (
            "KaironMachine",
            network(json!({"mode": "tap", "bridge": ""})),
            "spec.network.bridge",
            "",
        ),
        (
            "KaironMachine",
            network(json!({"mode": "macvtap"})),
            "spec.network",
            parent,
        ),
        (
            "KaironMachine",
            network(json!({"mode": "user", "bridge": "br0"})),
            "spec.network",
            bridge,
        ),
        (
            "KaironMachine",
            network(json!({"mode": "none"})),
            "spec.network.mode",
            "network.mode must be user, tap or macvtap",
        ),
        (
            "KaironMachine",
            network(json!({"mode": "tap", "bridge": "br0", "staticNetwork": true})),
            "spec.network",
            "network.staticNetwork needs network.mode tap with network.netns: true",
        ),
        (
            "KaironMachine",
            network(json!({"mode": "tap", "bridge": "br0", "mac": "52:54:00:12:34"})),
            "spec.network.mac",
            "network.mac must be six hex octets separated by : or -",
        ),
        (
            "KaironMachine",
            with(
                machine_spec(),
                &["placement"],
                json!({"controlPlaneAntiAffinity": "Soft"}),
            ),
            "spec.placement.controlPlaneAntiAffinity",
            "placement.controlPlaneAntiAffinity must be Preferred, Required or None",
        ),
        (
            "KaironMachine",
            with(machine_spec(), &["resources", "cpu"], json!("two")),
            "spec.resources.cpu",
            whole_cpu,
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
            tmpl(with(machine_spec(), &["resources", "cpu"], json!(0))),
            "spec.template.spec.resources.cpu",
            whole_cpu,
        ),
        (
            "KaironMachineTemplate",
            tmpl(with(machine_spec(), &["resources", "memory"], json!("100Mi"))),
            "spec.template.spec.resources.memory",
            "at least 512Mi",
        ),
        (
            "KaironMachineTemplate",
            tmpl(with(machine_spec(), &["instanceTypeName"], json!("m.large"))),
            "spec.template.spec",
            one_size,
        ),
        (
            "KaironMachineTemplate",
            tmpl(with(machine_spec(), &["image", "httpURL"], json!(IMAGE_URL))),
            "spec.template.spec.image",
            one_source,
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
            json!({"template": with(machine_spec(), &["network"], json!({"mode": "macvtap"}))}),
            "spec.template.network",
            parent,
        ),
        (
            "KaironMachinePool",
            json!({"template": machine_spec(), "strategy": {"maxSurge": 0, "maxUnavailable": 0}}),
            "spec.strategy",
            "must not both be 0",
        ),
    ];
    assert!(cases.len() >= 50);
    let mut failures = vec![];
    for (i, (kind, spec, field, phrase)) in cases.iter().enumerate() {
        let o = obj(kind, &format!("bad-{i}"), spec.clone());
        match rejection(&env, &o).await {
            None => failures.push(format!("case {i} ({kind} {spec}): accepted")),
            Some(msg) if !msg.contains(&format!("{field}: ")) || !msg.contains(phrase) => failures.push(format!(
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
    let typed = with(
        with(machine_spec(), &["resources"], Value::Null),
        &["instanceTypeName"],
        json!("m.large"),
    );
    let required = with(
        machine_spec(),
        &["placement"],
        json!({"nodeSelector": {"kairon.zyvor.dev/pool": "general"}, "controlPlaneAntiAffinity": "Required"}),
    );
    let goods: Vec<(&str, Value)> = vec![
        (
            "livemigrateifpossible",
            with(machine_spec(), &["evictionStrategy"], json!("LiveMigrateIfPossible")),
        ),
        (
            "external",
            with(machine_spec(), &["evictionStrategy"], json!("External")),
        ),
        ("cpu-string", with(machine_spec(), &["resources", "cpu"], json!("2"))),
        (
            "memory-bytes",
            with(machine_spec(), &["resources", "memory"], json!(1073741824)),
        ),
        ("image-size", with(machine_spec(), &["image", "diskSize"], Value::Null)),
        (
            "image-path",
            image(json!({"path": "/var/lib/kairon/images/u.qcow2", "diskSize": "20Gi"})),
        ),
        ("image-https", image(json!({"httpURL": IMAGE_URL, "digest": digest()}))),
        (
            "image-http",
            image(json!({"httpURL": "http://images.local/u.qcow2", "digest": digest()})),
        ),
        ("typed", typed),
        ("tap", network(json!({"mode": "tap", "bridge": "br0"}))),
        (
            "tap-learning",
            network(json!({"mode": "tap", "bridge": "br0", "learnIP": true})),
        ),
        (
            "netns",
            network(json!({"mode": "tap", "netns": true, "staticNetwork": true, "mac": "52-54-00-12-34-56"})),
        ),
        (
            "macvtap",
            network(json!({"mode": "macvtap", "parent": "eth1", "macvtapMode": "bridge"})),
        ),
        ("agent", with(machine_spec(), &["guestAgent"], json!({"enabled": true}))),
        ("user", network(json!({"mode": "user"}))),
        ("required", required),
        (
            "preferred",
            with(
                machine_spec(),
                &["placement"],
                json!({"controlPlaneAntiAffinity": "Preferred"}),
            ),
        ),
        (
            "spread-none",
            with(
                machine_spec(),
                &["placement"],
                json!({"controlPlaneAntiAffinity": "None"}),
            ),
        ),
    ];
    for (name, spec) in goods {
        let created = machines
            .create(&PostParams::default(), &obj("KaironMachine", name, spec.clone()))
            .await
            .unwrap_or_else(|e| panic!("{name} ({spec}) is accepted: {e}"));
        assert_eq!(created.data["spec"], spec, "{name}: stored as sent");
    }
    let clusters = api(&env, "KaironCluster", "kaironclusters");
    clusters
        .create(&PostParams::default(), &obj("KaironCluster", "good", endpoint))
        .await
        .expect("a valid KaironCluster");

    // ...and their immutable fields stay put.
    let pp = PatchParams::default();
    // A KaironMachine's refusal names the field twice: its path and its rule's message.
    let immutable = |field: &'static str| {
        (
            field,
            format!("{field} is immutable: create a new KaironMachineTemplate and roll out instead"),
        )
    };
    let updates: Vec<Update> = vec![
        (
            &machines,
            "good",
            json!({"spec": {"resources": {"cpu": 8}}}),
            vec![immutable("spec.resources")],
        ),
        (
            &machines,
            "good",
            json!({"spec": {"resources": {"memory": "8Gi"}}}),
            vec![immutable("spec.resources")],
        ),
        (
            &machines,
            "good",
            json!({"spec": {"image": {"imageRef": "other"}}}),
            vec![immutable("spec.image")],
        ),
        (
            &machines,
            "good",
            json!({"spec": {"image": {"diskSize": "80Gi"}}}),
            vec![immutable("spec.image")],
        ),
        (
            &machines,
            "good",
            json!({"spec": {"resources": null, "instanceTypeName": "m.large"}}),
            vec![immutable("spec.resources"), immutable("spec.instanceTypeName")],
        ),
        (
            &machines,
            "typed",
            json!({"spec": {"instanceTypeName": "m.xlarge"}}),
            vec![immutable("spec.instanceTypeName")],
        ),
        (
            &machines,
            "good",
            json!({"spec": {"network": {"mode": "tap", "bridge": "br0"}}}),
            vec![immutable("spec.network")],
        ),
        (
            &machines,
            "tap",
            json!({"spec": {"network": {"bridge": "br1"}}}),
            vec![immutable("spec.network")],
        ),
        (
            &machines,
            "good",
            json!({"spec": {"placement": {"nodeSelector": {"a": "b"}}}}),
            vec![immutable("spec.placement")],
        ),
        (
            &machines,
            "required",
            json!({"spec": {"placement": {"controlPlaneAntiAffinity": "Preferred"}}}),
            vec![immutable("spec.placement")],
        ),
        (
            &machines,
            "required",
            json!({"spec": {"placement": null}}),
            vec![immutable("spec.placement")],
        ),
        (
            &machines,
            "good",
            json!({"spec": {"evictionStrategy": "External"}}),
            vec![immutable("spec.evictionStrategy")],
        ),
        (
            &clusters,
            "good",
            json!({"spec": {"controlPlaneEndpoint": {"host": "10.0.0.11"}}}),
            vec![(
                "spec.controlPlaneEndpoint",
                "spec.controlPlaneEndpoint.host is immutable once set".into(),
            )],
        ),
        (
            &clusters,
            "good",
            json!({"spec": {"identityRef": {"kind": "Secret", "name": "kairon-site-b"}}}),
            vec![("spec.identityRef", "spec.identityRef is immutable".into())],
        ),
    ];
    for (api, name, patch, wants) in updates {
        match api.patch(name, &pp, &Patch::Merge(patch.clone())).await {
            Ok(_) => panic!("update of {name} {patch} accepted"),
            Err(kube::Error::Api(s)) => assert!(
                wants
                    .iter()
                    .all(|(field, phrase)| s.message.contains(&format!("{field}: ")) && s.message.contains(phrase)),
                "{name} {patch}: {} lacks one of {wants:?}",
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
    // topology patches it in place); it has no providerID of its own (each member's
    // KaironMachine has one), so one written is pruned; its status takes both `ready` (what
    // CAPI v1.14.2 reads) and `initialization.provisioned`.
    let pools = api(&env, "KaironMachinePool", "kaironmachinepools");
    pools
        .create(
            &PostParams::default(),
            &obj("KaironMachinePool", "good", json!({"template": machine_spec()})),
        )
        .await
        .expect("a valid KaironMachinePool");
    let rolled = json!({"spec": {"template": {"image": {"imageRef": "ubuntu-2404-kube-v1.36.9"}, "resources": {"cpu": 4}},
        "providerID": "kairon://machinesets/a", "providerIDList": ["kairon://vm-1", "kairon://vm-2"]}});
    let written = pools
        .patch("good", &pp, &Patch::Merge(rolled))
        .await
        .expect("the pool's template and list are writable");
    assert_eq!(written.data["spec"]["template"]["resources"]["cpu"], 4);
    assert_eq!(written.data["spec"]["providerIDList"][1], "kairon://vm-2");
    assert!(
        written.data["spec"].get("providerID").is_none(),
        "a pool has no providerID: {:?}",
        written.data["spec"]
    );
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
