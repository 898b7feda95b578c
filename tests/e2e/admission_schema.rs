//! Admission by the CRD schema on a real kube-apiserver (no CAPI managers, no webhook server):
//! invalid specs are rejected with messages that name the field, and updates of immutable
//! fields are rejected — the CRDs' OpenAPI schema and CEL rules doing the work.

use capkr::api::{MachineNetwork, network_mode};
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
    let testdata = root.join("tests/kairon-sim/testdata/cabpk");
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
