//! The exact API calls of the KaironMachinePool reconciler, against a mock API server: nothing
//! before CAPI sets the owner MachinePool; the finalizer first; a KaironMachine per new member
//! (the pool's template and revision, no providerID: it makes its own VM), never a Kairon
//! request nor a read of the bootstrap Secret; steady state without a request; scale-in and
//! rollout through CAPI Machines only, within `maxUnavailable`; a repointed MachinePool's old
//! pool touching nothing, its deletion leaving the members to the new pool; and a deletion
//! that drains the members first, and keeps them while paused or moved.

use std::sync::Arc;

use capkr::api::conditions::{PAUSED, reason};
use capkr::api::{KaironMachine, KaironMachinePool, MACHINE_POOL_FINALIZER};
use capkr::capi::{self, MachinePool};
use capkr::controller::Settings;
use capkr::controller::kairon_machine_pool::revision::{REVISION_LABEL, revision};
use capkr::controller::kairon_machine_pool::status::{Counted, Observed, pool_status};
use capkr::controller::kairon_machine_pool::{Context, reconcile};
use capkr::kairon::labels;
use http::{Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::client::Body;
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use tower_test::mock::Handle;

use crate::mock_support;
use mock_support::{World, condition, expect, expect_no_more};

const NS: &str = "ns";
const KMP: &str = "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/ns/kaironmachinepools/pool";
const KMS: &str = "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/ns/kaironmachines";
const MACHINES: &str = "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines";
/// The MachinePool's Kubernetes version: the current revision's.
const VERSION: &str = "v1.37.2";
/// An earlier version: an older revision.
const OLD_VERSION: &str = "v1.37.1";

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
        "spec": {"clusterName": "demo", "replicas": replicas, "template": {"spec": {"version": VERSION,
            "bootstrap": {"dataSecretName": "pool-boot"},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironMachinePool", "name": "pool"}}}}
    }))
    .unwrap();
    mp.metadata.uid = Some("mp-uid".into());
    mp
}

/// The revision of the pool's members for Kubernetes `version`.
fn revision_for(version: &str) -> String {
    revision(&template(), Some(version), "pool-boot")
}

/// The KaironMachine of member `name`, made for `version`'s revision, owned by its Machine;
/// provisioned or not yet.
fn km(name: &str, version: &str, provisioned: bool) -> KaironMachine {
    let mut km = KaironMachine::new(name, template());
    km.metadata.namespace = Some(NS.into());
    km.metadata.uid = Some(format!("{name}-uid"));
    km.metadata.labels = Some(
        [
            (labels::KAIRONMACHINEPOOL_NAME.to_string(), "pool".to_string()),
            (capi::POOL_NAME_LABEL.to_string(), "pool".to_string()),
            (capi::CLUSTER_NAME_LABEL.to_string(), "demo".to_string()),
            (REVISION_LABEL.to_string(), revision_for(version)),
        ]
        .into(),
    );
    km.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Machine".into(),
        name: name.into(),
        uid: format!("{name}-machine-uid"),
        controller: Some(true),
        ..Default::default()
    }]);
    km.spec.provider_id = Some(format!("kairon://{name}"));
    km.status = Some(capkr::api::KaironMachineStatus {
        initialization: Some(capkr::api::Initialization {
            provisioned: Some(provisioned),
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
    m.spec.cluster_name = "demo".into();
    // As CAPI labels a pool's Machines: the MachinePool's name and the Cluster's.
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

/// Pool `pool`, owned by MachinePool `pool`, with its finalizer, and `spec.providerIDList` and
/// the status as they are for `w` (so that nothing needs writing).
fn pool(w: &World) -> KaironMachinePool {
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
    let counted: Vec<Counted> = w
        .kaironmachines
        .iter()
        .map(|km| Counted {
            provider_id: km.spec.provider_id.clone(),
            running: km.status.as_ref().is_some_and(|s| s.is_provisioned()),
        })
        .collect();
    p.spec.provider_id_list = Some(capkr::controller::kairon_machine_pool::status::provider_id_list(
        &counted,
    ));
    p.status = Some(pool_status(
        &Observed {
            instances: &counted,
            generation: Some(1),
            ..Default::default()
        },
        &at(1_700_000_000),
    ));
    p
}

/// A pool of `replicas` wanted, with two members a and b of the current revision, their
/// KaironMachines and Machines.
fn steady(replicas: i32) -> World {
    World {
        machine_pools: vec![machine_pool(replicas)],
        clusters: vec![cluster(false)],
        kaironmachines: vec![km("pool-a", VERSION, true), km("pool-b", VERSION, true)],
        machines: vec![machine("pool-a", 10, false), machine("pool-b", 20, false)],
        ..World::default()
    }
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

/// Reconciles `pool` in `w` against `server` with `settings`; returns what the reconcile
/// returned.
async fn run_with<F, Fut>(
    pool: KaironMachinePool,
    w: World,
    settings: Settings,
    server: F,
) -> Result<Action, capkr::controller::Error>
where
    F: FnOnce(Handle<Request<Body>, Response<Body>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    mock_support::against(server, |client| {
        let ctx = Context {
            settings,
            ..w.pool_context(client)
        };
        reconcile(Arc::new(pool), Arc::new(ctx))
    })
    .await
}

async fn run<F, Fut>(pool: KaironMachinePool, w: World, server: F)
where
    F: FnOnce(Handle<Request<Body>, Response<Body>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    run_with(pool, w, Settings::default(), server)
        .await
        .expect("reconciled");
}

/// What the API server answers a create with (the reconciler reads only its success).
fn created() -> Value {
    serde_json::to_value(km("pool-new", VERSION, false)).unwrap()
}

fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}})
}

#[tokio::test]
async fn steady_state_makes_no_request() {
    let w = steady(2);
    run(pool(&w), w, |mut h| async move { expect_no_more(&mut h).await }).await;
}

#[tokio::test]
async fn nothing_is_written_before_capi_sets_the_owner_machine_pool() {
    let w = steady(2);
    let mut p = pool(&w);
    p.metadata.owner_references = None;
    p.metadata.finalizers = None;
    run(p, w, |mut h| async move { expect_no_more(&mut h).await }).await;
}

/// A new pool: the finalizer, then one KaironMachine per member wanted, each of the pool's
/// template and current revision, without a providerID (it makes its own VM), labelled so that
/// CAPI finds it; no read of the bootstrap Secret, no request to Kairon.
#[tokio::test]
async fn first_provisioning_adds_the_finalizer_then_a_kaironmachine_per_member() {
    let world = World {
        kaironmachines: vec![],
        machines: vec![],
        ..steady(2)
    };
    let mut p = pool(&world);
    p.metadata.finalizers = None;
    p.spec.provider_id_list = None;
    p.status = None;
    let p_json = serde_json::to_value(&p).unwrap();
    let settings = Settings {
        watch_filter: Some("team-a".into()),
        ..Settings::default()
    };
    run_with(p, world, settings, move |mut h| async move {
        let (_, ops) = expect(&mut h, "PATCH", KMP, 200, p_json.clone()).await;
        assert_eq!(ops[1]["value"], json!([MACHINE_POOL_FINALIZER]), "the finalizer first");
        let mut names = vec![];
        for _ in 0..2 {
            let (_, body) = expect(&mut h, "POST", KMS, 201, created()).await;
            let name = body["metadata"]["name"].as_str().unwrap().to_string();
            assert!(name.starts_with("pool-") && name.len() == "pool-".len() + 5, "{name}");
            let l = &body["metadata"]["labels"];
            assert_eq!(l[REVISION_LABEL], revision_for(VERSION).as_str());
            assert_eq!(l[capi::POOL_NAME_LABEL], "pool", "as CAPI finds a pool's machines");
            assert_eq!(l[capi::CLUSTER_NAME_LABEL], "demo");
            assert_eq!(
                l["cluster.x-k8s.io/watch-filter"], "team-a",
                "seen by a filtered manager"
            );
            assert_eq!(body["metadata"]["ownerReferences"][0]["kind"], "KaironMachinePool");
            assert!(body["spec"].get("providerID").is_none(), "{body}");
            assert_eq!(body["spec"]["image"]["imageRef"], "img");
            names.push(name);
        }
        assert_ne!(names[0], names[1]);
        // No providerIDList yet: no member has a VM.
        let (_, body) = expect(&mut h, "PATCH", &format!("{KMP}/status"), 200, p_json).await;
        assert_eq!(body["status"]["ready"], true, "provisioned once it can make members");
        assert_eq!(body["status"]["infrastructureMachineKind"], "KaironMachine");
        expect_no_more(&mut h).await;
    })
    .await
    .expect("reconciled");
}

#[tokio::test]
async fn scale_in_deletes_the_machine_capi_chose_never_a_vm_or_a_kaironmachine() {
    let mut w = steady(1);
    w.machines = vec![machine("pool-a", 10, false), machine("pool-b", 20, true)];
    let listed = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineList", "metadata": {},
        "items": [machine("pool-a", 10, false), machine("pool-b", 20, true)]});
    let p = pool(&w);
    run(p, w, move |mut h| async move {
        let (req, _) = expect(&mut h, "GET", MACHINES, 200, listed).await;
        assert!(
            req.contains("labelSelector=cluster.x-k8s.io%2Fpool-name%3Dpool"),
            "the pool's Machines, read fresh: {req}"
        );
        let (_, body) = expect(&mut h, "DELETE", &format!("{MACHINES}/pool-b"), 200, success()).await;
        assert_eq!(body["preconditions"]["uid"], "pool-b-machine-uid");
        // No DELETE of a Kairon Machine or a KaironMachine: CAPI drains, then deletes the
        // KaironMachine, whose finalizer deletes the VM.
        expect_no_more(&mut h).await;
    })
    .await;
}

/// The mark on the Machine to remove may reach the cache after the MachinePool's lower size:
/// the victim is chosen from the Machines as the API server has them.
#[tokio::test]
async fn scale_in_chooses_from_the_machines_as_the_api_server_has_them() {
    let mut w = steady(1);
    w.machines = vec![machine("pool-a", 10, false), machine("pool-b", 20, false)];
    let listed = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineList", "metadata": {},
        "items": [machine("pool-a", 10, false), machine("pool-b", 20, true)]});
    let p = pool(&w);
    run(p, w, move |mut h| async move {
        expect(&mut h, "GET", MACHINES, 200, listed).await;
        let (_, body) = expect(&mut h, "DELETE", &format!("{MACHINES}/pool-b"), 200, success()).await;
        assert_eq!(body["preconditions"]["uid"], "pool-b-machine-uid");
        expect_no_more(&mut h).await;
    })
    .await;
}

/// A new version: the members of the old revision are outdated; with `maxSurge` 1 one member
/// of the new revision is made first, and none goes before it is available.
#[tokio::test]
async fn a_new_revision_surges_one_member_first_and_deletes_none_yet() {
    let w = World {
        kaironmachines: vec![km("pool-a", OLD_VERSION, true), km("pool-b", OLD_VERSION, true)],
        ..steady(2)
    };
    let p = pool(&w);
    run(p, w, move |mut h| async move {
        let (_, body) = expect(&mut h, "POST", KMS, 201, created()).await;
        assert_eq!(
            body["metadata"]["labels"][REVISION_LABEL],
            revision_for(VERSION).as_str()
        );
        expect_no_more(&mut h).await;
    })
    .await;
}

/// The surge member available: the oldest outdated member's Machine goes (CAPI drains it).
#[tokio::test]
async fn an_outdated_member_goes_through_its_machine_once_its_replacement_is_available() {
    let mut w = World {
        kaironmachines: vec![
            km("pool-a", OLD_VERSION, true),
            km("pool-b", OLD_VERSION, true),
            km("pool-c", VERSION, true),
        ],
        ..steady(2)
    };
    w.machines.push(machine("pool-c", 30, false));
    let p = pool(&w);
    run(p, w, move |mut h| async move {
        let (_, body) = expect(&mut h, "DELETE", &format!("{MACHINES}/pool-a"), 200, success()).await;
        assert_eq!(body["preconditions"]["uid"], "pool-a-machine-uid");
        expect_no_more(&mut h).await;
    })
    .await;
}

/// Repointed: the MachinePool names another pool. This one writes only its status, and its
/// deletion leaves the members (the new pool's now) alone.
#[tokio::test]
async fn a_pool_its_machine_pool_no_longer_names_touches_nothing_and_its_deletion_leaves_the_members() {
    let repointed = || {
        let mut w = steady(2);
        w.machine_pools[0]
            .spec
            .template
            .spec
            .infrastructure_ref
            .as_mut()
            .unwrap()
            .name = "pool-new".into();
        w
    };
    let w = repointed();
    let p = pool(&w);
    let p_json = serde_json::to_value(&p).unwrap();
    run(p, w, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KMP}/status"), 200, p_json).await;
        assert_eq!(
            condition(&body["status"], "Ready")["reason"],
            reason::MACHINE_POOL_NAMES_ANOTHER
        );
        expect_no_more(&mut h).await;
    })
    .await;

    let w = repointed();
    let p = deleting(pool(&w));
    let p_json = serde_json::to_value(&p).unwrap();
    run(p, w, move |mut h| async move {
        // No Machine deleted: the finalizer goes at once.
        let (_, ops) = expect(&mut h, "PATCH", KMP, 200, p_json).await;
        assert_eq!(ops[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
        expect_no_more(&mut h).await;
    })
    .await;
}

fn deleting(mut p: KaironMachinePool) -> KaironMachinePool {
    p.metadata.deletion_timestamp = Some(at(1_700_000_100));
    p
}

#[tokio::test]
async fn a_paused_deletion_deletes_nothing_and_only_reports_paused() {
    let world = World {
        clusters: vec![cluster(true)],
        ..steady(2)
    };
    let p = deleting(pool(&world));
    let p_json = serde_json::to_value(&p).unwrap();
    run(p, world, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KMP}/status"), 200, p_json).await;
        assert_eq!(condition(&body["status"], PAUSED)["status"], "True");
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn deleted_for_move_releases_the_finalizer_and_keeps_the_members() {
    let w = steady(2);
    let mut p = deleting(pool(&w));
    p.metadata.annotations = Some([("clusterctl.cluster.x-k8s.io/delete-for-move".to_string(), String::new())].into());
    let p_json = serde_json::to_value(&p).unwrap();
    run(p, w, move |mut h| async move {
        let (_, ops) = expect(&mut h, "PATCH", KMP, 200, p_json).await;
        assert_eq!(ops[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn deletion_drains_the_members_first_then_releases_the_finalizer() {
    let p = deleting(pool(&steady(2)));
    let p_json = serde_json::to_value(&p).unwrap();
    let pj = p_json.clone();
    run(p.clone(), steady(2), move |mut h| async move {
        for name in ["pool-a", "pool-b"] {
            let (_, body) = expect(&mut h, "DELETE", &format!("{MACHINES}/{name}"), 200, success()).await;
            // Exactly the Machine the KaironMachine names, not another made since by that name.
            assert_eq!(body["preconditions"]["uid"], format!("{name}-machine-uid"), "{name}");
        }
        let (_, body) = expect(&mut h, "PATCH", &format!("{KMP}/status"), 200, pj).await;
        assert_eq!(condition(&body["status"], "Ready")["reason"], reason::DELETING);
        expect_no_more(&mut h).await;
    })
    .await;

    let gone = World {
        kaironmachines: vec![],
        machines: vec![],
        ..steady(2)
    };
    run(p, gone, move |mut h| async move {
        let (_, ops) = expect(&mut h, "PATCH", KMP, 200, p_json).await;
        assert_eq!(ops[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
        expect_no_more(&mut h).await;
    })
    .await;
}
