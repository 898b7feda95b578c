//! The exact API calls of the KaironMachine reconciler on its main paths, against a mock API
//! server (tower-test). These pin call sequences — e.g. that steady state makes no call at all
//! and that a paused deletion never deletes a VM; behaviour against real CAPI controllers is
//! proven by the tests that run the real control plane.

use std::sync::Arc;

use capkr::api::conditions::{self, Decided, INSTANCE_PROVISIONED, PAUSED, READY, Status, reason};
use capkr::api::{KaironMachine, MACHINE_FINALIZER};
use capkr::capi::{self, ContractVersionedObjectReference};
use capkr::controller::kairon_machine::{Observed, StatusInput, next_status, reconcile};
use capkr::kairon::cloud_init::RUNCMD_SCRIPT;
use capkr::kairon::{self, MachineStatus, labels};
use http::{Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::client::Body;
use serde_json::json;
use tower_test::mock::Handle;

use crate::mock_support;
use mock_support::{World, condition, expect, expect_no_more, status_error};

/// A bootstrap Secret is used once its config is read to be this machine's; what follows a VM Kairon reports.
mod bootstrap_config;

const NS: &str = "ns";
const KM_PATH: &str = "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/ns/kaironmachines/m1";
const VM_PATH: &str = "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machines/m1";
const SECRET_PATH: &str = "/api/v1/namespaces/ns/secrets/m1-bootstrap";

fn kaironmachine() -> KaironMachine {
    mock_support::kaironmachine(NS)
}

fn machine() -> capi::Machine {
    mock_support::machine(NS, "m1")
}

fn cluster(paused: bool) -> capi::Cluster {
    mock_support::provisioned_cluster(NS, paused)
}

fn vm(phase: &str) -> kairon::Machine {
    let mut vm = kairon::Machine::new("m1", Default::default());
    vm.metadata.namespace = Some(NS.into());
    vm.metadata.uid = Some("vm-uid".into());
    vm.metadata.labels = Some([(labels::KAIRONMACHINE_UID.to_string(), "km-uid".to_string())].into());
    vm.status = Some(MachineStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    vm
}

/// Runs one reconcile of `km` in `world` against a mock API server driven by `server`.
async fn run<F, Fut>(km: KaironMachine, world: World, server: F) -> Result<(), capkr::controller::Error>
where
    F: FnOnce(Handle<Request<Body>, Response<Body>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    mock_support::against(server, |client| {
        reconcile(Arc::new(km), Arc::new(world.machine_context(client)))
    })
    .await
    .map(|_| ())
}

/// `km` with the status the reconciler would have written for `observed` earlier.
fn with_status(mut km: KaironMachine, observed: Observed) -> KaironMachine {
    let at = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
    km.status = Some(next_status(
        km.status.as_ref(),
        StatusInput::Live(&observed),
        km.metadata.generation,
        &at,
    ));
    km
}

#[tokio::test]
async fn first_provisioning_adds_finalizer_reads_secret_once_creates_vm_then_records_provider_id_and_status() {
    let mut km = kaironmachine();
    km.metadata.resource_version = Some("10".into());
    let world = World {
        machines: vec![machine()],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    let created = {
        let mut v = vm("Pending");
        v.status = None;
        serde_json::to_value(&v).unwrap()
    };
    // What the API server answers to the two patches: the finalizer (metadata: same
    // generation), then the providerID (spec: the generation goes up).
    let with_finalizer = {
        let mut k = km.clone();
        k.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
        k.metadata.resource_version = Some("11".into());
        k
    };
    let with_provider_id = {
        let mut k = with_finalizer.clone();
        k.spec.provider_id = Some("kairon://m1".into());
        k.metadata.resource_version = Some("12".into());
        k.metadata.generation = Some(2);
        k
    };
    let km_json = serde_json::to_value(&with_provider_id).unwrap();
    let (with_finalizer, with_provider_id) = (
        serde_json::to_value(with_finalizer).unwrap(),
        serde_json::to_value(with_provider_id).unwrap(),
    );
    run(km, world, move |mut h| async move {
        let (_, patch) = expect(&mut h, "PATCH", KM_PATH, 200, with_finalizer).await;
        assert_eq!(
            patch[1],
            json!({"op": "add", "path": "/metadata/finalizers", "value": [MACHINE_FINALIZER]})
        );

        expect(
            &mut h,
            "GET",
            SECRET_PATH,
            200,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "m1-bootstrap", "namespace": NS},
                   "data": {"value": "I2Nsb3VkLWNvbmZpZwpydW5jbWQ6Ci0ga3ViZWFkbSBqb2luIC0tdG9rZW4gVE9QU0VDUkVUCg==", "format": "Y2xvdWQtY29uZmln"}}),
        )
        .await;

        let (query, body) = expect(
            &mut h,
            "POST",
            "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machines",
            201,
            created,
        )
        .await;
        assert!(query.contains("fieldManager=capkr-manager"), "{query}");
        assert_eq!(body["metadata"]["name"], "m1");
        assert_eq!(body["metadata"]["labels"][labels::KAIRONMACHINE_UID], "km-uid");
        assert_eq!(body["metadata"]["labels"][labels::CLUSTER_NAME], "demo");
        assert!(body["metadata"].get("ownerReferences").is_none());
        assert_eq!(
            body["spec"]["cloudInit"],
            json!({"hostname": "m1", "runCmd": [format!("sh '{RUNCMD_SCRIPT}'")],
                "writeFiles": [{"path": RUNCMD_SCRIPT, "content": "#!/bin/sh\nkubeadm join --token TOPSECRET\n", "permissions": "0700"}]}),
            "the bootstrap data as Kairon's structured cloudInit"
        );
        assert_eq!(body["spec"]["resources"]["cpu"], "2");

        let (_, patch) = expect(&mut h, "PATCH", KM_PATH, 200, with_provider_id).await;
        assert_eq!(patch, json!({"spec": {"providerID": "kairon://m1"}}));

        let (query, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        assert!(
            query.contains("fieldManager=capkr-manager") && query.contains("force=true"),
            "{query}"
        );
        let status = &body["status"];
        assert_eq!(
            condition(status, INSTANCE_PROVISIONED)["reason"],
            reason::INSTANCE_PROVISIONING,
            "just created: being provisioned, as it will be when Kairon says Pending or Provisioning"
        );
        assert_eq!(status["instance"]["phase"], "Provisioning");
        // Against the generation the providerID patch made: conditions naming the old one
        // would be written again, with nothing else changed, by the next reconcile.
        for c in status["conditions"].as_array().unwrap() {
            assert_eq!(c["observedGeneration"], 2, "{c}");
        }
        assert_eq!(condition(status, READY)["status"], "False");
        assert_eq!(condition(status, PAUSED)["status"], "False");
        assert_eq!(status["instance"]["uid"], "vm-uid");
        assert!(
            !body.to_string().contains("TOPSECRET"),
            "status never carries bootstrap data"
        );
        expect_no_more(&mut h).await;
    })
    .await
    .expect("reconcile succeeds");
}

#[tokio::test]
async fn steady_state_makes_no_request() {
    let mut km = kaironmachine();
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    km.spec.provider_id = Some("kairon://vm-uid".into());
    // The Machine has no Node yet: what the last reconcile saw of the VM, as this one sees it.
    let km = with_status(
        km,
        Observed::InstanceWithoutNode(Box::new(capkr::kairon::Vm::read(vm("Running")))),
    );
    let world = World {
        machines: vec![machine()],
        clusters: vec![cluster(false)],
        instances: vec![vm("Running")],
        ..World::default()
    };
    run(km, world, |mut h| async move { expect_no_more(&mut h).await })
        .await
        .expect("reconcile succeeds");
}

#[tokio::test]
async fn waiting_for_bootstrap_data_reads_nothing_and_writes_status_once() {
    let mut km = kaironmachine();
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    let mut m = machine();
    m.spec.bootstrap = None;
    let world = World {
        machines: vec![m.clone()],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km.clone(), world, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        assert_eq!(
            condition(&body["status"], INSTANCE_PROVISIONED)["reason"],
            reason::WAITING_FOR_BOOTSTRAP_DATA
        );
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();

    // Once written, the same wait writes nothing.
    let waiting = Observed::Waiting(Decided::new(
        INSTANCE_PROVISIONED,
        Status::False,
        reason::WAITING_FOR_BOOTSTRAP_DATA,
        "waiting for bootstrap data",
    ));
    let km = with_status(km, waiting);
    let world = World {
        machines: vec![m],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    run(km, world, |mut h| async move { expect_no_more(&mut h).await })
        .await
        .unwrap();
}

/// A control plane in Kairon's user mode (no `spec.network`) would be reachable by no peer:
/// no Secret is read and no VM created, the condition names the fix; once written, the
/// same verdict writes nothing. On a bridge, the same Machine reads its bootstrap data.
#[tokio::test]
async fn a_control_plane_in_user_mode_gets_no_vm_and_says_why() {
    let mut km = kaironmachine();
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    km.spec.network = None;
    let mut m = machine();
    m.metadata.labels = Some([("cluster.x-k8s.io/control-plane".to_string(), String::new())].into());
    let world = || World {
        machines: vec![m.clone()],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km.clone(), world(), move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        let c = condition(&body["status"], INSTANCE_PROVISIONED);
        assert_eq!(c["reason"], reason::CONTROL_PLANE_NETWORK_UNREACHABLE);
        assert!(
            c["message"]
                .as_str()
                .is_some_and(|m| m.contains("user mode") && m.contains("tap")),
            "{c}"
        );
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();

    let unreachable = Observed::Waiting(Decided::new(
        INSTANCE_PROVISIONED,
        Status::False,
        reason::CONTROL_PLANE_NETWORK_UNREACHABLE,
        capkr::kairon::network::control_plane_unreachable(None).unwrap_or_default(),
    ));
    run(with_status(km.clone(), unreachable), world(), |mut h| async move {
        expect_no_more(&mut h).await
    })
    .await
    .unwrap();

    // The same control plane on a bridge goes on to its bootstrap data.
    km.spec.network = Some(capkr::api::MachineNetwork {
        mode: Some("tap".into()),
        bridge: Some("br0".into()),
        ..Default::default()
    });
    run(km, world(), move |mut h| async move {
        expect(&mut h, "GET", SECRET_PATH, 404, json!({"kind": "Status", "code": 404})).await;
    })
    .await
    .ok();
}

#[tokio::test]
async fn ignition_bootstrap_data_is_a_terminal_condition_and_nothing_is_created() {
    let mut km = kaironmachine();
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    let world = World {
        machines: vec![machine()],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        expect(
            &mut h,
            "GET",
            SECRET_PATH,
            200,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "m1-bootstrap"},
            "data": {"value": "e30=", "format": "aWduaXRpb24="}}),
        )
        .await;
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        let status = &body["status"];
        assert_eq!(
            condition(status, INSTANCE_PROVISIONED)["reason"],
            reason::UNSUPPORTED_BOOTSTRAP_FORMAT
        );
        assert_eq!(status["deprecated"]["v1beta1"]["failureReason"], "InvalidConfiguration");
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_foreign_vm_with_our_name_is_reported_and_left_alone() {
    let mut km = kaironmachine();
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    let mut foreign = vm("Running");
    foreign.metadata.labels = Some([(labels::KAIRONMACHINE_UID.to_string(), "someone-else".to_string())].into());
    let foreign_json = serde_json::to_value(&foreign).unwrap();
    let world = World {
        machines: vec![machine()],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        expect(&mut h, "GET", SECRET_PATH, 200, json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "m1-bootstrap"}, "data": {"value": "I2Nsb3VkLWNvbmZpZwpydW5jbWQ6Ci0ga3ViZWFkbSBqb2luIC0tdG9rZW4gVE9QU0VDUkVUCg=="}})).await;
        expect(&mut h, "POST", "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machines", 409, status_error(409, "AlreadyExists")).await;
        expect(&mut h, "GET", VM_PATH, 200, foreign_json).await;
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        assert_eq!(condition(&body["status"], INSTANCE_PROVISIONED)["reason"], reason::INSTANCE_CONFLICT);
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn provisioned_machine_whose_vm_vanished_is_instance_not_found_not_recreated() {
    let mut km = kaironmachine();
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    km.spec.provider_id = Some("kairon://vm-uid".into());
    // The Machine has no Node yet: what the last reconcile saw of the VM, as this one sees it.
    let km = with_status(
        km,
        Observed::InstanceWithoutNode(Box::new(capkr::kairon::Vm::read(vm("Running")))),
    );
    let world = World {
        machines: vec![machine()],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        // The cache says gone; the API confirms before anything is concluded.
        expect(&mut h, "GET", VM_PATH, 404, status_error(404, "NotFound")).await;
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        let status = &body["status"];
        assert_eq!(condition(status, READY)["reason"], reason::INSTANCE_NOT_FOUND);
        assert_eq!(
            status["initialization"]["provisioned"], true,
            "provisioned never flips back"
        );
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();
}

fn deleting(km: KaironMachine) -> KaironMachine {
    let mut km = km;
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    km.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_100).unwrap()));
    km.spec.provider_id = Some("kairon://vm-uid".into());
    km
}

#[tokio::test]
async fn deletion_deletes_the_vm_and_keeps_the_finalizer_until_it_is_gone() {
    let km = with_status(
        deleting(kaironmachine()),
        Observed::Instance(Box::new(capkr::kairon::Vm::read(vm("Running")))),
    );
    let world = || World {
        machines: vec![machine()],
        clusters: vec![cluster(false)],
        instances: vec![vm("Running")],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    let vm_json = serde_json::to_value(vm("Running")).unwrap();
    run(km.clone(), world(), move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 200, vm_json.clone()).await;
        let (_, body) = expect(&mut h, "DELETE", VM_PATH, 200, vm_json).await;
        assert_eq!(body["preconditions"]["uid"], "vm-uid", "deletes exactly the VM it read");
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        assert_eq!(condition(&body["status"], READY)["reason"], reason::DELETING);
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();

    // Next round: the VM is gone, so the finalizer goes (and nothing else happens).
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world(), move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 404, status_error(404, "NotFound")).await;
        let (_, patch) = expect(&mut h, "PATCH", KM_PATH, 200, km_json).await;
        assert_eq!(
            patch[0],
            json!({"op": "test", "path": "/metadata/finalizers/0", "value": MACHINE_FINALIZER})
        );
        assert_eq!(patch[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn deletion_without_machine_but_with_its_cluster_still_cleans_up() {
    let km = deleting(kaironmachine());
    let world = World {
        machines: vec![],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 404, status_error(404, "NotFound")).await;
        expect(&mut h, "PATCH", KM_PATH, 200, km_json).await;
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn deletion_after_the_cluster_is_gone_keeps_the_vm_and_releases_the_finalizer() {
    let km = with_status(
        deleting(kaironmachine()),
        Observed::Instance(Box::new(capkr::kairon::Vm::read(vm("Running")))),
    );
    let world = World {
        machines: vec![],
        clusters: vec![],
        instances: vec![vm("Running")],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        // Not in the cache: the API server is asked before anything is concluded.
        expect(
            &mut h,
            "GET",
            "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/clusters/demo",
            404,
            status_error(404, "NotFound"),
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

#[tokio::test]
async fn paused_deletion_issues_no_delete_and_only_reports_paused() {
    let km = with_status(
        deleting(kaironmachine()),
        Observed::Instance(Box::new(capkr::kairon::Vm::read(vm("Running")))),
    );
    let world = || World {
        machines: vec![machine()],
        clusters: vec![cluster(true)],
        instances: vec![vm("Running")],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km.clone(), world(), move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        let paused = condition(&body["status"], PAUSED);
        assert_eq!(
            (paused["status"].as_str(), paused["reason"].as_str()),
            (Some("True"), Some(reason::PAUSED))
        );
        assert!(paused["message"].as_str().unwrap().contains("spec.paused"));
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();

    // Already reported: nothing at all.
    let mut km = km;
    let at = conditions::now();
    km.status = Some(next_status(
        km.status.as_ref(),
        StatusInput::Paused("Cluster spec.paused is set to true"),
        km.metadata.generation,
        &at,
    ));
    run(km, world(), |mut h| async move { expect_no_more(&mut h).await })
        .await
        .unwrap();
}

#[tokio::test]
async fn paused_by_annotation_blocks_provisioning() {
    let mut km = kaironmachine();
    km.metadata.annotations = Some([(capi::PAUSED_ANNOTATION.to_string(), String::new())].into());
    let world = World {
        machines: vec![machine()],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        assert!(
            condition(&body["status"], PAUSED)["message"]
                .as_str()
                .unwrap()
                .contains("annotation")
        );
        assert!(
            body["status"]["conditions"].as_array().unwrap().len() == 1,
            "only Paused is written"
        );
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn without_an_owner_machine_nothing_is_written_not_even_the_finalizer() {
    let mut km = kaironmachine();
    km.metadata.owner_references = None;
    let world = World {
        machines: vec![],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    run(km, world, |mut h| async move { expect_no_more(&mut h).await })
        .await
        .unwrap();
}

#[tokio::test]
async fn deleted_for_move_releases_the_finalizer_and_keeps_the_vm() {
    let mut km = deleting(kaironmachine());
    km.metadata.annotations = Some([("clusterctl.cluster.x-k8s.io/delete-for-move".to_string(), String::new())].into());
    let world = World {
        machines: vec![],
        clusters: vec![],
        instances: vec![vm("Running")],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        let (_, patch) = expect(&mut h, "PATCH", KM_PATH, 200, km_json).await;
        assert_eq!(patch[1]["op"], "remove");
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn an_owner_machine_that_does_not_name_us_gets_a_condition_and_nothing_else() {
    // Another incarnation of the Machine (other UID), and a Machine that points elsewhere.
    let mut other_uid = machine();
    other_uid.metadata.uid = Some("another-machine-uid".into());
    let mut points_elsewhere = machine();
    points_elsewhere.spec.infrastructure_ref.as_mut().unwrap().name = "m2".into();
    for m in [other_uid, points_elsewhere] {
        let km = kaironmachine();
        let km_json = serde_json::to_value(&km).unwrap();
        let world = World {
            machines: vec![m],
            clusters: vec![cluster(false)],
            instances: vec![],
            ..World::default()
        };
        run(km, world, move |mut h| async move {
            // No finalizer, no Secret read, no VM: only the condition.
            let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
            let c = condition(&body["status"], INSTANCE_PROVISIONED);
            assert_eq!(c["reason"], reason::OWNER_MACHINE_MISMATCH);
            assert!(c["message"].as_str().unwrap().contains("Machine m1"), "{c}");
            expect_no_more(&mut h).await;
        })
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn a_bootstrap_secret_not_made_by_the_machines_config_is_not_used() {
    let mut km = kaironmachine();
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    let mut m = machine();
    m.spec.bootstrap.as_mut().unwrap().config_ref = Some(ContractVersionedObjectReference {
        api_group: "bootstrap.cluster.x-k8s.io".into(),
        kind: "KubeadmConfig".into(),
        name: "m1-config".into(),
    });
    let world = World {
        machines: vec![m],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        // A Secret someone else made (here: the cluster's kubeconfig, owned by the Cluster).
        expect(
            &mut h,
            "GET",
            SECRET_PATH,
            200,
            json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "m1-bootstrap", "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2",
                "kind": "Cluster", "name": "demo", "uid": "cluster-uid"}]},
            "data": {"value": "QURNSU4tS1VCRUNPTkZJRw=="}}),
        )
        .await;
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        let c = condition(&body["status"], INSTANCE_PROVISIONED);
        assert_eq!(c["reason"], reason::BOOTSTRAP_DATA_SECRET_NOT_TRUSTED);
        assert!(
            c["message"].as_str().unwrap().contains("KubeadmConfig m1-config"),
            "{c}"
        );
        assert!(!body.to_string().contains("ADMIN-KUBECONFIG"), "never the content");
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_vm_replaced_under_our_name_is_gone_not_ours() {
    // Same name and labels (a restore), but not the UID our providerID names.
    let mut km = kaironmachine();
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    km.spec.provider_id = Some("kairon://vm-uid".into());
    let km = with_status(km, Observed::Instance(Box::new(capkr::kairon::Vm::read(vm("Running")))));
    let mut replaced = vm("Running");
    replaced.metadata.uid = Some("restored-uid".into());
    replaced.status.as_mut().unwrap().guest_ips = Some(vec!["10.99.0.1".into()]);
    let world = World {
        machines: vec![machine()],
        clusters: vec![cluster(false)],
        instances: vec![replaced],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        let status = &body["status"];
        assert_eq!(condition(status, READY)["reason"], reason::INSTANCE_NOT_FOUND);
        assert!(
            !status.to_string().contains("10.99.0.1"),
            "never the other VM's addresses: {status}"
        );
        assert!(!status.to_string().contains("restored-uid"), "{status}");
        expect_no_more(&mut h).await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_create_kairon_rejects_is_reported_with_code_and_reason_and_is_an_error() {
    let mut km = kaironmachine();
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    let world = World {
        machines: vec![machine()],
        clusters: vec![cluster(false)],
        instances: vec![],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    let result = run(km, world, move |mut h| async move {
        expect(&mut h, "GET", SECRET_PATH, 200, json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "m1-bootstrap"}, "data": {"value": "I2Nsb3VkLWNvbmZpZwpydW5jbWQ6Ci0ga3ViZWFkbSBqb2luIC0tdG9rZW4gVE9QU0VDUkVUCg=="}})).await;
        // Kairon's answer quotes the request, as API errors can.
        let mut answer = status_error(403, "Forbidden");
        answer["message"] = json!("machines \"m1\" is forbidden: exceeded quota; spec.cloudInit.runCmd[0]=kubeadm join --token TOPSECRET");
        expect(&mut h, "POST", "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machines", 403, answer).await;
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        let c = condition(&body["status"], INSTANCE_PROVISIONED);
        assert_eq!(c["reason"], reason::INSTANCE_CREATE_FAILED);
        assert!(c["message"].as_str().unwrap().contains("403 Forbidden"), "{c}");
        assert!(!body.to_string().contains("TOPSECRET"), "never the payload: {body}");
        expect_no_more(&mut h).await;
    })
    .await;
    let e = result.expect_err("the reconcile fails, so that the object backs off");
    assert_eq!(e.stage(), "create_instance");
    assert!(!e.to_string().contains("TOPSECRET"), "{e}");
}
