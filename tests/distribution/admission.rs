//! The template-immutability ValidatingAdmissionPolicy of the release components, on a real
//! kube-apiserver: spec changes of KaironMachineTemplates, KaironClusterTemplates and
//! KaironMachinePoolTemplates are
//! rejected with a clear message; metadata and status changes pass; a server-side-apply dry
//! run carrying `topology.cluster.x-k8s.io/dry-run` (what CAPI's topology controller sends)
//! passes, and neither the annotation alone nor a dry run alone does.

use std::time::Duration;

use capkr_testenv::{Env, infrastructure_resource, machine_image, wait_for};

use crate::distribution_support::*;
use crate::shared_env_options;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NS: &str = "templates";
const MESSAGE: &str = "spec.template.spec is immutable; create a new template and point the references at it";

fn api(env: &Env, kind: &str, plural: &str) -> Api<DynamicObject> {
    Api::namespaced_with(env.client(), NS, &infrastructure_resource(kind, plural))
}

fn object(v: Value) -> DynamicObject {
    serde_json::from_value(v).expect("a valid object")
}

fn machine_template(cpus: i64, annotations: Value) -> DynamicObject {
    object(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "KaironMachineTemplate",
        "metadata": {"name": "workers", "namespace": NS, "annotations": annotations},
        "spec": {"template": {"spec": {"image": {"imageRef": machine_image(), "diskSize": "20Gi"}, "resources": {"cpu": cpus, "memory": "4Gi"}}}},
    }))
}

fn denied(r: Result<DynamicObject, kube::Error>) -> Option<String> {
    match r {
        Err(kube::Error::Api(s)) if s.message.contains(MESSAGE) => Some(s.message.clone()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn template_specs_are_immutable_except_for_topology_dry_runs() {
    let repo = LocalRepo::new();
    let policy: String = docs(&read(&repo.components_path()))
        .into_iter()
        .filter(|d| {
            d["kind"]
                .as_str()
                .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
        })
        .map(|d| serde_json::to_string(&d).unwrap() + "\n---\n")
        .collect();
    let env = Env::shared(shared_env_options())
        .await
        .expect("shared test environment");
    env.create_namespace(NS).await.unwrap();
    let kmts = api(env, "KaironMachineTemplate", "kaironmachinetemplates");
    kmts.create(&PostParams::default(), &machine_template(2, json!({})))
        .await
        .unwrap();
    env.apply(&policy, None).await.unwrap();

    // The policy is enforced once kube-apiserver has loaded it (about a second).
    let mut cpus = 2;
    let message = wait_for("the spec update to be denied", Duration::from_secs(30), || {
        cpus += 1;
        let patch = json!({"spec": {"template": {"spec": {"resources": {"cpu": cpus}}}}});
        let kmts = kmts.clone();
        async move {
            let r = kmts
                .patch("workers", &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            Ok::<_, kube::Error>(denied(r))
        }
    })
    .await
    .unwrap();
    assert!(
        message.contains("KaironMachineTemplate workers: spec.template.spec is immutable"),
        "{message}"
    );
    let current = kmts.get("workers").await.unwrap().data["spec"]["template"]["spec"]["resources"]["cpu"].clone();

    // Metadata (CAPI syncs labels/annotations onto templates) and status (the manager
    // writes capacity) stay writable.
    kmts.patch(
        "workers",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
    )
    .await
    .expect("metadata changes are allowed");
    kmts.patch_status(
        "workers",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"capacity": {"cpu": "2"}}})),
    )
    .await
    .expect("status changes are allowed");

    // The topology controller's server-side-apply dry run, with the annotation: accepted.
    let topology = PatchParams::apply("capi-topology").force();
    let changed = machine_template(16, json!({"topology.cluster.x-k8s.io/dry-run": ""}));
    let dry = kmts
        .patch("workers", &topology.clone().dry_run(), &Patch::Apply(&changed))
        .await
        .expect("an SSA dry run with the topology annotation is accepted");
    assert_eq!(dry.data["spec"]["template"]["spec"]["resources"]["cpu"], 16);
    assert_eq!(
        kmts.get("workers").await.unwrap().data["spec"]["template"]["spec"]["resources"]["cpu"],
        current,
        "a dry run changes nothing"
    );
    // The annotation without dry run, and a dry run without the annotation: denied.
    assert!(denied(kmts.patch("workers", &topology, &Patch::Apply(&changed)).await).is_some());
    let unannotated = machine_template(16, json!({}));
    assert!(
        denied(
            kmts.patch("workers", &topology.clone().dry_run(), &Patch::Apply(&unannotated))
                .await
        )
        .is_some()
    );

    // KaironClusterTemplates alike.
    let kcts = api(env, "KaironClusterTemplate", "kaironclustertemplates");
    let kct = object(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "KaironClusterTemplate",
        "metadata": {"name": "cluster", "namespace": NS},
        "spec": {"template": {"spec": {"controlPlaneEndpoint": {"host": "10.0.0.1", "port": 6443}}}},
    }));
    kcts.create(&PostParams::default(), &kct).await.unwrap();
    let patch = json!({"spec": {"template": {"spec": {"controlPlaneEndpoint": {"port": 7443}}}}});
    let message = denied(
        kcts.patch("cluster", &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    )
    .expect("a KaironClusterTemplate spec change is denied");
    assert!(message.contains("KaironClusterTemplate cluster:"), "{message}");

    // KaironMachinePoolTemplates alike; the topology's dry run passes.
    let kmpts = api(env, "KaironMachinePoolTemplate", "kaironmachinepooltemplates");
    let pool_template = |cpus: i64, annotations: Value| {
        object(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KaironMachinePoolTemplate",
            "metadata": {"name": "pool", "namespace": NS, "annotations": annotations},
            "spec": {"template": {"spec": {"template":
                {"image": {"imageRef": machine_image(), "diskSize": "20Gi"}, "resources": {"cpu": cpus, "memory": "4Gi"}}}}},
        }))
    };
    kmpts
        .create(&PostParams::default(), &pool_template(2, json!({})))
        .await
        .unwrap();
    let patch = json!({"spec": {"template": {"spec": {"template": {"resources": {"cpu": 4}}}}}});
    let message = denied(
        kmpts
            .patch("pool", &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    )
    .expect("a KaironMachinePoolTemplate spec change is denied");
    assert!(message.contains("KaironMachinePoolTemplate pool:"), "{message}");
    let dry = PatchParams::apply("capi-topology").force().dry_run();
    let annotated = pool_template(4, json!({"topology.cluster.x-k8s.io/dry-run": ""}));
    let dried = kmpts
        .patch("pool", &dry, &Patch::Apply(&annotated))
        .await
        .expect("the topology's dry run passes");
    assert_eq!(
        dried.data["spec"]["template"]["spec"]["template"]["resources"]["cpu"],
        4
    );
    assert_eq!(
        kmpts.get("pool").await.unwrap().data["spec"]["template"]["spec"]["template"]["resources"]["cpu"],
        2,
        "a dry run changes nothing"
    );
}
