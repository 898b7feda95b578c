//! The exact API calls of the KaironMachinePool reconciler, against a mock API server: nothing
//! before CAPI sets the owner MachinePool, the finalizer before the Kairon MachineSet, steady
//! state without a request, the bootstrap Secret read only when the set is made or raised (a
//! rotated token rewrites only the user-data), scale-in through CAPI Machines only, and a
//! deletion that keeps the set while paused or moved.

use std::sync::Arc;
use std::time::Duration;

use capkr::api::conditions::{PAUSED, reason};
use capkr::api::{KaironMachine, KaironMachinePool, MACHINE_POOL_FINALIZER, MachineSetRef};
use capkr::capi::{self, MachinePool};
use capkr::controller::Settings;
use capkr::controller::kairon_machine_pool::status::{Counted, Observed, pool_status};
use capkr::controller::kairon_machine_pool::{Context, reconcile};
use capkr::kairon::machineset::{MACHINESET_LABEL, MachineSet, MachineSetStatus, TEMPLATE_HASH_LABEL};
use capkr::kairon::set_desired::{PoolLink, SetInputs, desired_machine_set};
use capkr::kairon::{self, UserData, labels};
use http::{Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

mod mock_support;
use mock_support::{condition, expect, expect_no_more, filled, status_error};

const NS: &str = "ns";
const KMP: &str = "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/ns/kaironmachinepools/pool";
const SETS: &str = "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machinesets";
const SET: &str = "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machinesets/pool";
const SECRET: &str = "/api/v1/namespaces/ns/secrets/pool-boot";
const MACHINES: &str = "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines";

fn at(s: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
}

fn template() -> capkr::api::KaironMachineSpec {
    serde_json::from_value(
        json!({"image": {"imageRef": "img", "diskSize": "20Gi"}, "resources": {"cpu": 2, "memory": "4Gi"}}),
    )
    .unwrap()
}

fn machine_pool(replicas: i32) -> MachinePool {
    let mut mp: MachinePool = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
        "metadata": {"name": "pool", "namespace": NS, "uid": "mp-uid"},
        "spec": {"clusterName": "demo", "replicas": replicas, "template": {"spec": {"version": "v1.36.1",
            "bootstrap": {"dataSecretName": "pool-boot"},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironMachinePool", "name": "pool"}}}}
    }))
    .unwrap();
    mp.metadata.uid = Some("mp-uid".into());
    mp
}

fn secret(value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pool-boot", "namespace": NS},
        "data": {"value": serde_json::to_value(k8s_openapi::ByteString(value.as_bytes().to_vec())).unwrap()}})
}

fn link() -> PoolLink {
    PoolLink {
        name: "pool".into(),
        namespace: NS.into(),
        uid: "pool-uid".into(),
    }
}

/// The set as the cache holds it: made for the pool with user-data `data`, `replicas` members.
fn set(data: &str, replicas: i32) -> MachineSet {
    let (l, t) = (link(), template());
    let inputs = SetInputs {
        pool: &l,
        cluster_name: "demo",
        template: &t,
        bootstrap_secret: "pool-boot",
        version: Some("v1.36.1"),
    };
    let mut set = desired_machine_set(&inputs, UserData(data.into()), replicas);
    set.spec.template.spec.cloud_init = None;
    set.metadata.uid = Some("set-uid".into());
    set.metadata.resource_version = Some("7".into());
    set.metadata.generation = Some(1);
    set.status = Some(MachineSetStatus {
        observed_generation: Some(1),
        replicas: Some(replicas),
        ready_replicas: Some(replicas),
        updated_replicas: Some(replicas),
        template_hash: Some("h".into()),
    });
    set
}

fn member(name: &str) -> kairon::Machine {
    let mut vm = kairon::Machine::new(name, Default::default());
    vm.metadata.namespace = Some(NS.into());
    vm.metadata.uid = Some(format!("{name}-uid"));
    vm.metadata.labels = Some(
        [
            (MACHINESET_LABEL, "pool"),
            (TEMPLATE_HASH_LABEL, "h"),
            (labels::KAIRONMACHINEPOOL_NAME, "pool"),
            (labels::KAIRONMACHINEPOOL_NAMESPACE, NS),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
    );
    vm.status = Some(kairon::MachineStatus {
        phase: Some("Running".into()),
        ..Default::default()
    });
    vm
}

fn km(name: &str) -> KaironMachine {
    let mut km = KaironMachine::new(name, template());
    km.metadata.namespace = Some(NS.into());
    km.metadata.labels = Some([(labels::KAIRONMACHINEPOOL_NAME.to_string(), "pool".to_string())].into());
    km.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Machine".into(),
        name: name.into(),
        uid: format!("{name}-machine-uid"),
        controller: Some(true),
        ..Default::default()
    }]);
    km.spec.provider_id = Some(format!("kairon://{name}-uid"));
    km.status = Some(capkr::api::KaironMachineStatus {
        initialization: Some(capkr::api::Initialization {
            provisioned: Some(true),
        }),
        ..Default::default()
    });
    km
}

fn machine(name: &str, created: i64, marked: bool) -> capi::Machine {
    let mut m = capi::Machine::new(name, Default::default());
    m.metadata.namespace = Some(NS.into());
    m.metadata.uid = Some(format!("{name}-machine-uid"));
    m.metadata.creation_timestamp = Some(at(created));
    // As CAPI labels a pool's Machines: the pool's name and the Cluster's.
    m.metadata.labels = Some(
        [
            (capi::POOL_NAME_LABEL.to_string(), "pool".to_string()),
            (capi::CLUSTER_NAME_LABEL.to_string(), "demo".to_string()),
        ]
        .into(),
    );
    if marked {
        m.metadata.annotations = Some([(capi::DELETE_MACHINE_ANNOTATION.to_string(), "yes".to_string())].into());
    }
    m.status = Some(capi::MachineStatus {
        conditions: Some(vec![capi::ClusterCondition {
            type_: "Available".into(),
            status: "True".into(),
        }]),
        ..Default::default()
    });
    m
}

/// Pool `pool`, owned by MachinePool `pool`, provisioned with members a and b.
fn pool() -> KaironMachinePool {
    let mut p = KaironMachinePool::new("pool", Default::default());
    p.spec.template = template();
    p.metadata.namespace = Some(NS.into());
    p.metadata.uid = Some("pool-uid".into());
    p.metadata.generation = Some(1);
    p.metadata.labels = Some([(capi::CLUSTER_NAME_LABEL.to_string(), "demo".to_string())].into());
    p.metadata.finalizers = Some(vec![MACHINE_POOL_FINALIZER.into()]);
    p.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "MachinePool".into(),
        name: "pool".into(),
        uid: "mp-uid".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    p.spec.provider_id = Some("kairon://machinesets/set-uid".into());
    p.spec.provider_id_list = Some(vec!["kairon://pool-a-uid".into(), "kairon://pool-b-uid".into()]);
    let counted = [
        Counted {
            provider_id: Some("kairon://pool-a-uid".into()),
            running: true,
        },
        Counted {
            provider_id: Some("kairon://pool-b-uid".into()),
            running: true,
        },
    ];
    let set_ref = MachineSetRef {
        name: "pool".into(),
        uid: Some("set-uid".into()),
        template_hash: Some("h".into()),
        ..Default::default()
    };
    p.status = Some(pool_status(
        &Observed {
            set: Some((set_ref, true)),
            instances: &counted,
            generation: Some(1),
            ..Default::default()
        },
        &at(1_700_000_000),
    ));
    p
}

struct World {
    mp: MachinePool,
    kaironclusters: Vec<capkr::api::KaironCluster>,
    cluster_paused: bool,
    sets: Vec<MachineSet>,
    members: Vec<kairon::Machine>,
    kms: Vec<KaironMachine>,
    machines: Vec<capi::Machine>,
}

fn steady(replicas: i32) -> World {
    World {
        mp: machine_pool(replicas),
        kaironclusters: vec![],
        cluster_paused: false,
        sets: vec![set("#cloud-config token-1", 2)],
        members: vec![member("pool-a"), member("pool-b")],
        kms: vec![km("pool-a"), km("pool-b")],
        machines: vec![machine("pool-a", 10, false), machine("pool-b", 20, false)],
    }
}

async fn run<F, Fut>(pool: KaironMachinePool, w: World, server: F)
where
    F: FnOnce(Handle<Request<Body>, Response<Body>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let ctx = Arc::new(Context {
        client: client.clone(),
        kairon: kairon::Instances::new(client),
        machine_pools: filled(vec![w.mp]).0,
        clusters: filled(vec![cluster(w.cluster_paused)]).0,
        kaironclusters: filled(w.kaironclusters).0,
        sets: filled(w.sets).0,
        members: filled(w.members).0,
        kaironmachines: filled(w.kms).0,
        machines: filled(w.machines).0,
        synced: vec![capkr::controller::Synced::ready()],
        settings: Settings::default(),
        events: capkr::events::Events::disabled(),
        metrics: capkr::metrics::Metrics::new(),
    });
    let server = tokio::spawn(server(handle));
    reconcile(Arc::new(pool), ctx).await.expect("reconciled");
    tokio::time::timeout(Duration::from_secs(2), server)
        .await
        .expect("mock server finished")
        .expect("mock server did not panic");
}

#[tokio::test]
async fn steady_state_makes_no_request() {
    run(pool(), steady(2), |mut h| async move { expect_no_more(&mut h).await }).await;
}

#[tokio::test]
async fn nothing_is_written_before_capi_sets_the_owner_machine_pool() {
    let mut p = pool();
    p.metadata.owner_references = None;
    p.metadata.finalizers = None;
    run(p, steady(2), |mut h| async move { expect_no_more(&mut h).await }).await;
}

#[tokio::test]
async fn first_provisioning_adds_the_finalizer_then_creates_the_set_with_no_member_and_records_it() {
    let mut p = pool();
    p.metadata.finalizers = None;
    p.spec.provider_id = None;
    p.spec.provider_id_list = None;
    p.status = None;
    let p_json = serde_json::to_value(&p).unwrap();
    let world = World {
        sets: vec![],
        members: vec![],
        kms: vec![],
        machines: vec![],
        ..steady(2)
    };
    let created = serde_json::to_value(set("#cloud-config token-1", 0)).unwrap();
    run(p, world, move |mut h| async move {
        let (_, ops) = expect(&mut h, "PATCH", KMP, 200, p_json.clone()).await;
        assert_eq!(ops[1]["value"], json!([MACHINE_POOL_FINALIZER]), "the finalizer first");
        expect(&mut h, "GET", SET, 404, status_error(404, "NotFound")).await;
        expect(&mut h, "GET", SECRET, 200, secret("#cloud-config token-1")).await;
        let (_, body) = expect(&mut h, "POST", SETS, 201, created).await;
        assert_eq!(body["spec"]["replicas"], 0, "created empty; the plan raises it");
        assert_eq!(
            body["spec"]["template"]["spec"]["legacyUserData"],
            "#cloud-config token-1"
        );
        assert_eq!(body["spec"]["updateStrategy"]["type"], "OnDelete");
        let (_, body) = expect(&mut h, "PATCH", KMP, 200, p_json).await;
        assert_eq!(body, json!({"spec": {"providerID": "kairon://machinesets/set-uid"}}));
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn a_raise_reads_the_secret_and_a_rotated_token_rewrites_only_the_user_data() {
    let s_json = serde_json::to_value(set("#cloud-config token-1", 2)).unwrap();
    run(pool(), steady(3), move |mut h| async move {
        expect(&mut h, "GET", SECRET, 200, secret("#cloud-config token-2")).await;
        let (_, ops) = expect(&mut h, "PATCH", SET, 200, s_json).await;
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
        );
        assert_eq!(
            ops[1],
            json!({"op": "add", "path": "/spec/template/spec/legacyUserData", "value": "#cloud-config token-2"})
        );
        assert_eq!(
            ops.as_array().unwrap().len(),
            3,
            "the template's hash is untouched: nothing rolls"
        );
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn a_raise_with_the_same_token_scales_the_set_against_its_version() {
    let s_json = serde_json::to_value(set("#cloud-config token-1", 2)).unwrap();
    run(pool(), steady(3), move |mut h| async move {
        expect(&mut h, "GET", SECRET, 200, secret("#cloud-config token-1")).await;
        let (_, body) = expect(&mut h, "PATCH", SET, 200, s_json).await;
        assert_eq!(
            body,
            json!({"metadata": {"resourceVersion": "7"}, "spec": {"replicas": 3}})
        );
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn scale_in_deletes_the_machine_capi_chose_never_a_vm_or_a_kaironmachine() {
    let mut world = steady(1);
    world.machines = vec![machine("pool-a", 10, false), machine("pool-b", 20, true)];
    run(pool(), world, move |mut h| async move {
        let (_, body) = expect(
            &mut h,
            "DELETE",
            &format!("{MACHINES}/pool-b"),
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}),
        )
        .await;
        assert_eq!(body["preconditions"]["uid"], "pool-b-machine-uid");
        // No DELETE of a Kairon Machine or a KaironMachine, no write to the set (Kairon lowers
        // it when the VM goes).
        expect_no_more(&mut h).await;
    })
    .await;
}

/// Cluster `demo`, its infrastructure the KaironCluster `demo`.
fn cluster(paused: bool) -> capi::Cluster {
    let mut c = mock_support::provisioned_cluster(NS, paused);
    c.spec.infrastructure_ref = Some(capi::ContractVersionedObjectReference {
        api_group: "infrastructure.cluster.x-k8s.io".into(),
        kind: "KaironCluster".into(),
        name: "demo".into(),
    });
    c
}

#[tokio::test]
async fn a_pool_of_a_cluster_on_an_identitys_kairon_api_makes_nothing_and_says_why() {
    let mut kc: capkr::api::KaironCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironCluster",
        "metadata": {"name": "demo", "namespace": NS},
        "spec": {"identityRef": {"kind": "Secret", "name": "site-b"}}}))
    .unwrap();
    kc.metadata.namespace = Some(NS.into());
    let mut p = pool();
    p.spec.provider_id = None;
    p.status = None;
    let p_json = serde_json::to_value(&p).unwrap();
    let world = World {
        kaironclusters: vec![kc],
        sets: vec![],
        ..steady(2)
    };
    run(p, world, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KMP}/status"), 200, p_json).await;
        assert_eq!(
            condition(&body["status"], "Ready")["reason"],
            reason::IDENTITY_NOT_SUPPORTED
        );
        // No Secret read, no set made.
        expect_no_more(&mut h).await;
    })
    .await;
}

fn deleting(mut p: KaironMachinePool) -> KaironMachinePool {
    p.metadata.deletion_timestamp = Some(at(1_700_000_100));
    p
}

#[tokio::test]
async fn a_paused_deletion_never_deletes_the_set_and_only_reports_paused() {
    let p = deleting(pool());
    let p_json = serde_json::to_value(&p).unwrap();
    let world = World {
        cluster_paused: true,
        ..steady(2)
    };
    run(p, world, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KMP}/status"), 200, p_json).await;
        assert_eq!(condition(&body["status"], PAUSED)["status"], "True");
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn deleted_for_move_releases_the_finalizer_and_keeps_the_set() {
    let mut p = deleting(pool());
    p.metadata.annotations = Some([("clusterctl.cluster.x-k8s.io/delete-for-move".to_string(), String::new())].into());
    let p_json = serde_json::to_value(&p).unwrap();
    run(p, steady(2), move |mut h| async move {
        let (_, ops) = expect(&mut h, "PATCH", KMP, 200, p_json).await;
        assert_eq!(ops[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn deletion_drains_the_instances_first_then_deletes_the_set_then_releases_the_finalizer() {
    let p = deleting(pool());
    let p_json = serde_json::to_value(&p).unwrap();
    let pj = p_json.clone();
    run(p.clone(), steady(2), move |mut h| async move {
        for name in ["pool-a", "pool-b"] {
            let (_, body) = expect(
                &mut h,
                "DELETE",
                &format!("{MACHINES}/{name}"),
                200,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}),
            )
            .await;
            // Exactly the Machine the KaironMachine names, not another made since by that name.
            assert_eq!(body["preconditions"]["uid"], format!("{name}-machine-uid"), "{name}");
        }
        let (_, body) = expect(&mut h, "PATCH", &format!("{KMP}/status"), 200, pj).await;
        assert_eq!(condition(&body["status"], "Ready")["reason"], reason::DELETING);
        expect_no_more(&mut h).await;
    })
    .await;
    let s_json = serde_json::to_value(set("x", 0)).unwrap();
    let gone = World {
        kms: vec![],
        members: vec![],
        machines: vec![],
        ..steady(2)
    };
    let sj = s_json.clone();
    run(p.clone(), gone, move |mut h| async move {
        expect(&mut h, "GET", SET, 200, sj.clone()).await;
        let (_, body) = expect(&mut h, "DELETE", SET, 200, sj).await;
        assert_eq!(body["preconditions"]["uid"], "set-uid");
        expect_no_more(&mut h).await;
    })
    .await;
    let gone = World {
        kms: vec![],
        members: vec![],
        machines: vec![],
        ..steady(2)
    };
    run(p, gone, move |mut h| async move {
        expect(&mut h, "GET", SET, 404, status_error(404, "NotFound")).await;
        let (_, ops) = expect(&mut h, "PATCH", KMP, 200, p_json).await;
        assert_eq!(ops[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
        expect_no_more(&mut h).await;
    })
    .await;
}
