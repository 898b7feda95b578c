//! A bootstrap Secret is used once its config is read to be this machine's; what follows a VM Kairon reports.

use super::*;

const CONFIG_PATH: &str = "/apis/bootstrap.cluster.x-k8s.io/v1beta2/namespaces/ns/kubeadmconfigs/m1-config";

/// `machine()` with bootstrap config `m1-config`, and its bootstrap Secret as CABPK makes it
/// (controlled by that config).
fn machine_with_config() -> (capi::Machine, serde_json::Value) {
    let mut m = machine();
    m.spec.bootstrap.as_mut().unwrap().config_ref = Some(ContractVersionedObjectReference {
        api_group: "bootstrap.cluster.x-k8s.io".into(),
        kind: "KubeadmConfig".into(),
        name: "m1-config".into(),
    });
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "m1-bootstrap", "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
            "ownerReferences": [{"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig",
                "name": "m1-config", "uid": "config-uid", "controller": true}]},
        "data": {"value": "I2Nsb3VkLWNvbmZpZwpydW5jbWQ6Ci0ga3ViZWFkbSBqb2luIC0tdG9rZW4gVE9QU0VDUkVUCg=="}});
    (m, secret)
}

/// The metadata of bootstrap config `m1-config`, controlled by Machine `machine`/`uid`.
fn config_metadata(machine: &str, uid: &str) -> serde_json::Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": "m1-config", "namespace": NS, "uid": "config-uid",
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "name": machine, "uid": uid, "controller": true, "blockOwnerDeletion": true}]}})
}

#[tokio::test]
async fn a_bootstrap_secret_from_a_config_is_used_once_the_config_is_read_to_be_this_machines() {
    let mut km = kaironmachine();
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    let (m, secret) = machine_with_config();
    let world = World {
        machines: vec![m],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    let created = serde_json::to_value(vm("Pending")).unwrap();
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        expect(&mut h, "GET", SECRET_PATH, 200, secret).await;
        // The config's metadata only, at the version its ownerReference names.
        expect(&mut h, "GET", CONFIG_PATH, 200, config_metadata("m1", "machine-uid")).await;
        let (_, body) = expect(
            &mut h,
            "POST",
            "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machines",
            201,
            created,
        )
        .await;
        assert_eq!(
            body["spec"]["cloudInit"]["writeFiles"][0]["content"],
            "#!/bin/sh\nkubeadm join --token TOPSECRET\n"
        );
        expect(&mut h, "PATCH", KM_PATH, 200, km_json.clone()).await;
        expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_bootstrap_secret_of_another_machines_config_is_not_used() {
    let mut km = kaironmachine();
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    let (m, secret) = machine_with_config();
    let world = World {
        machines: vec![m],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        expect(&mut h, "GET", SECRET_PATH, 200, secret).await;
        // The configRef names the control-plane Machine's config.
        expect(
            &mut h,
            "GET",
            CONFIG_PATH,
            200,
            config_metadata("demo-cp-0", "cp-machine-uid"),
        )
        .await;
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        let c = condition(&body["status"], INSTANCE_PROVISIONED);
        assert_eq!(c["reason"], reason::BOOTSTRAP_DATA_SECRET_NOT_TRUSTED);
        let message = c["message"].as_str().unwrap();
        assert!(
            message.contains("Secret m1-bootstrap") && message.contains("Machine demo-cp-0"),
            "{c}"
        );
        assert!(!body.to_string().contains("TOPSECRET"), "never the content");
        // No VM.
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn deletion_keeps_a_vm_another_live_kaironmachine_holds_and_releases_the_finalizer() {
    // Our providerID names the VM, but its labels name KaironMachine m0, which still exists.
    let km = deleting(kaironmachine());
    let mut held = vm("Running");
    held.metadata.labels = Some(
        [
            (labels::KAIRONMACHINE_UID.to_string(), "m0-uid".to_string()),
            (
                "infrastructure.cluster.x-k8s.io/kaironmachine-name".to_string(),
                "m0".to_string(),
            ),
        ]
        .into(),
    );
    let held_json = serde_json::to_value(&held).unwrap();
    let mut holder = kaironmachine();
    holder.metadata.name = Some("m0".into());
    holder.metadata.uid = Some("m0-uid".into());
    let holder_json = serde_json::to_value(&holder).unwrap();
    let world = World {
        machines: vec![machine()],
        clusters: vec![cluster(false)],
        instances: vec![held],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 200, held_json).await;
        expect(
            &mut h,
            "GET",
            "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/ns/kaironmachines/m0",
            200,
            holder_json,
        )
        .await;
        let (_, patch) = expect(&mut h, "PATCH", KM_PATH, 200, km_json).await;
        assert_eq!(patch[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
        // No DELETE of the Kairon Machine.
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();
}

/// The machine's Machine and Cluster, and `vm` in the Kairon Machines' cache.
fn world_with(vm: kairon::Machine) -> World {
    World {
        machines: vec![machine()],
        clusters: vec![cluster(false)],
        instances: vec![vm],
        ..World::default()
    }
}

/// A provisioned KaironMachine (finalizer, providerID, status) and its running VM, on which
/// Kairon reports runtime `runtime` and nothing is recorded yet.
fn provisioned_on_runtime(runtime: &str) -> (KaironMachine, kairon::Machine) {
    let mut km = kaironmachine();
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    km.spec.provider_id = Some("kairon://vm-uid".into());
    let mut running = vm("Running");
    running.status.as_mut().unwrap().runtime_id = Some(runtime.into());
    let km = with_status(
        km,
        Observed::InstanceWithoutNode(Box::new(capkr::kairon::Vm::read(running.clone()))),
    );
    (km, running)
}

#[tokio::test]
async fn once_kairon_reports_the_runtime_the_bootstrap_data_leaves_the_vm_and_the_runtime_is_recorded_once() {
    let (km, running) = provisioned_on_runtime("rt-1");
    let world = world_with(running.clone());
    let vm_json = serde_json::to_value(&running).unwrap();
    run(km.clone(), world, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", VM_PATH, 200, vm_json).await;
        assert_eq!(
            body,
            json!({
                "metadata": {"uid": "vm-uid", "annotations": {kairon::bootstrap_runtime::BOOTSTRAP_RUNTIME_ANNOTATION: "rt-1"}},
                "spec": {"cloudInit": {"writeFiles": null, "runCmd": null}},
            })
        );
        expect_no_more(&mut h).await;
    })
    .await
    .expect("reconcile succeeds");

    // Recorded: nothing more is written.
    let mut recorded = running;
    recorded.metadata.annotations = Some(
        [(
            kairon::bootstrap_runtime::BOOTSTRAP_RUNTIME_ANNOTATION.to_string(),
            "rt-1".to_string(),
        )]
        .into(),
    );
    let world = World {
        machines: vec![machine()],
        clusters: vec![cluster(false)],
        instances: vec![recorded],
        ..World::default()
    };
    run(km, world, |mut h| async move { expect_no_more(&mut h).await })
        .await
        .expect("reconcile succeeds");
}

#[tokio::test]
async fn a_reconcile_before_the_cache_shows_the_recorded_runtime_does_not_record_it_again() {
    let (km, running) = provisioned_on_runtime("rt-1");
    let km = Arc::new(km);
    // The cache keeps showing the VM as it was before the record, as it does until the watch
    // brings the patched VM.
    let world = world_with(running.clone());
    let vm_json = serde_json::to_value(&running).unwrap();
    mock_support::against(
        move |mut h| async move {
            expect(&mut h, "PATCH", VM_PATH, 200, vm_json).await;
            expect_no_more(&mut h).await;
        },
        |client| async move {
            let ctx = Arc::new(world.machine_context(client));
            reconcile(km.clone(), ctx.clone()).await?;
            reconcile(km, ctx).await
        },
    )
    .await
    .expect("both reconciles succeed");
}
