//! The exact API calls of the KaironMachine reconciler when Kairon's host maintenance touches
//! its VM, against a mock API server (tower-test): a migration writes the new node and one
//! event; a cordoned node marks the owner Machine once for remediation, then steady state
//! writes nothing; a paused evacuation writes the status alone.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use capkr::api::conditions::{EVACUATION, PAUSED, READY, reason};
use capkr::api::{KaironMachine, KaironMachineStatus, MACHINE_FINALIZER};
use capkr::capi::{self, ClusterCondition, MachineNodeReference, MachineStatus};
use capkr::controller::Settings;
use capkr::controller::kairon_machine::{Context, Observed, StatusInput, next_status, reconcile};
use capkr::kairon::{self, labels};
use http::{Request, Response};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::Handle;

use crate::mock_support;
use mock_support::{World, condition, expect, expect_no_more};

const NS: &str = "ns";
const KM_STATUS: &str = "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/ns/kaironmachines/m1/status";
const MACHINE_PATH: &str = "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines/m1";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";

/// The shared KaironMachine `m1`, its VM created (`spec.providerID`), never moved live.
fn kaironmachine() -> KaironMachine {
    let mut km = mock_support::kaironmachine(NS);
    km.spec.provider_id = Some("kairon://vm-uid".into());
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    km
}

/// A worker Machine of a MachineSet with its Node, selected by a MachineHealthCheck
/// ([`health_check`]).
fn machine(name: &str) -> capi::Machine {
    let mut m = mock_support::machine(NS, name);
    m.metadata.labels = Some([(capi::DEPLOYMENT_NAME_LABEL.to_string(), "md".to_string())].into());
    m.metadata.owner_references = Some(vec![OwnerReference {
        kind: "MachineSet".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    m.status = Some(MachineStatus {
        node_ref: Some(MachineNodeReference { name: name.into() }),
        conditions: Some(vec![ClusterCondition {
            type_: capi::HEALTH_CHECK_SUCCEEDED.into(),
            status: "True".into(),
        }]),
        phase: None,
    });
    m
}

/// The MachineHealthCheck over the cluster's MachineDeployment `md`.
fn health_check() -> capi::MachineHealthCheck {
    let mut c = capi::MachineHealthCheck::new(
        "md-unhealthy",
        capi::MachineHealthCheckSpec {
            cluster_name: "demo".into(),
            selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some([(capi::DEPLOYMENT_NAME_LABEL.to_string(), "md".to_string())].into()),
                match_expressions: None,
            },
        },
    );
    c.metadata.namespace = Some(NS.into());
    c
}

fn cluster(paused: bool) -> capi::Cluster {
    mock_support::provisioned_cluster(NS, paused)
}

fn vm(host: &str) -> kairon::Machine {
    let mut vm = kairon::Machine::new("m1", Default::default());
    vm.metadata.namespace = Some(NS.into());
    vm.metadata.uid = Some("vm-uid".into());
    vm.metadata.labels = Some([(labels::KAIRONMACHINE_UID.to_string(), "km-uid".to_string())].into());
    vm.status = Some(kairon::MachineStatus {
        phase: Some("Running".into()),
        node_name: Some(host.into()),
        ..Default::default()
    });
    vm
}

/// `km` as the reconciler left it after seeing `vm` before.
fn provisioned_on(vm: kairon::Machine) -> KaironMachine {
    let mut km = kaironmachine();
    let at = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
    km.status = Some(next_status(
        None,
        StatusInput::Live(&Observed::Instance(Box::new(capkr::kairon::Vm::read(vm)))),
        km.metadata.generation,
        &at,
    ));
    km
}

/// Kairon's node `name`, cordoned or not.
fn node(name: &str, cordoned: bool) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    n.spec = Some(NodeSpec {
        unschedulable: cordoned.then_some(true),
        ..Default::default()
    });
    n
}

/// Kairon's nodes h1 (cordoned or not) and h2.
fn hosts(h1_cordoned: bool) -> Option<Vec<Node>> {
    Some(vec![node("h1", h1_cordoned), node("h2", false)])
}

/// Runs one reconcile of `km` in `world` against a mock API server driven by `server`, no
/// `--evacuation-grace-period`; events are published (to the mock server).
async fn run<F, Fut>(km: KaironMachine, world: World, server: F)
where
    F: FnOnce(Handle<Request<Body>, Response<Body>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    run_with_grace(km, world, Duration::ZERO, server).await
}

/// [`run`] with `--evacuation-grace-period` `grace`.
async fn run_with_grace<F, Fut>(km: KaironMachine, world: World, grace: Duration, server: F)
where
    F: FnOnce(Handle<Request<Body>, Response<Body>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    mock_support::against(server, |client| {
        let ctx = Context {
            settings: Settings {
                evacuation_grace_period: grace,
                ..Settings::default()
            },
            events: capkr::events::Events::new(client.clone(), "capkr-kaironmachine-controller", "test"),
            ..world.machine_context(client)
        };
        reconcile(Arc::new(km), Arc::new(ctx))
    })
    .await
    .expect("reconcile succeeds");
}

/// Takes the next request, an event, and returns its reason.
async fn event(h: &mut Handle<Request<Body>, Response<Body>>) -> (String, String) {
    let (_, body) = expect(h, "POST", EVENTS, 201, json!({})).await;
    (
        body["reason"].as_str().unwrap_or_default().to_string(),
        body["note"].as_str().unwrap_or_default().to_string(),
    )
}

/// `km` with the status a PATCH sent.
fn with_sent_status(mut km: KaironMachine, sent: &Value) -> KaironMachine {
    km.status = Some(serde_json::from_value::<KaironMachineStatus>(sent["status"].clone()).unwrap());
    km
}

#[tokio::test]
async fn a_live_migration_writes_the_host_and_one_event() {
    let km = provisioned_on(vm("h1"));
    let world = || World {
        machines: vec![machine("m1")],
        clusters: vec![cluster(false)],
        instances: vec![vm("h2")],
        nodes: hosts(false),
        health_checks: vec![health_check()],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    let sent = Arc::new(Mutex::new(Value::Null));
    let keep = sent.clone();
    run(km.clone(), world(), move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", KM_STATUS, 200, km_json).await;
        assert_eq!(body["status"]["instance"]["host"], "h2");
        let ready = condition(&body["status"], READY);
        assert_eq!(ready["status"], "True", "a live migration does not flip Ready");
        assert!(
            body["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["type"] != EVACUATION),
            "no evacuation is reported"
        );
        let (reason, note) = event(&mut h).await;
        assert_eq!(reason, "InstanceMigrated");
        assert!(note.contains("from node h1 to node h2"), "{note}");
        expect_no_more(&mut h).await;
        *keep.lock().unwrap() = body;
    })
    .await;
    // On the new host: nothing more, no second event.
    let km = with_sent_status(km, &sent.lock().unwrap());
    assert_eq!(km.status.as_ref().unwrap().conditions.as_ref().unwrap().len(), 3);
    run(km, world(), |mut h| async move { expect_no_more(&mut h).await }).await;
}

#[tokio::test]
async fn a_cordoned_node_marks_the_machine_once_and_steady_state_writes_nothing() {
    let km = provisioned_on(vm("h1"));
    let world = |marked: bool| {
        let mut m = machine("m1");
        if marked {
            m.metadata.annotations = Some(
                [
                    (capi::REMEDIATE_MACHINE_ANNOTATION.to_string(), String::new()),
                    (
                        capi::EVACUATION_ANNOTATION.to_string(),
                        "Kairon node h1 cordoned".to_string(),
                    ),
                ]
                .into(),
            );
        }
        World {
            machines: vec![m, machine("m2")],
            clusters: vec![cluster(false)],
            instances: vec![vm("h1")],
            nodes: hosts(true),
            health_checks: vec![health_check()],
            ..World::default()
        }
    };
    let km_json = serde_json::to_value(&km).unwrap();
    let machine_json = serde_json::to_value(machine("m1")).unwrap();
    let sent = Arc::new(Mutex::new(Value::Null));
    let keep = sent.clone();
    run(km.clone(), world(false), move |mut h| async move {
        let (_, patch) = expect(&mut h, "PATCH", MACHINE_PATH, 200, machine_json).await;
        assert_eq!(
            patch,
            json!({"metadata": {"annotations": {
                "cluster.x-k8s.io/remediate-machine": "",
                "infrastructure.cluster.x-k8s.io/kairon-evacuation": "Kairon node h1 cordoned",
            }}}),
            "a metadata-only merge patch"
        );
        assert_eq!(event(&mut h).await.0, "ReplacementRequested");
        let (_, body) = expect(&mut h, "PATCH", KM_STATUS, 200, km_json).await;
        let evacuation = condition(&body["status"], EVACUATION);
        assert_eq!(
            (evacuation["status"].as_str(), evacuation["reason"].as_str()),
            (Some("True"), Some(reason::REPLACEMENT_REQUESTED))
        );
        assert!(
            evacuation["message"]
                .as_str()
                .unwrap()
                .starts_with("Kairon node h1 is cordoned: "),
            "{evacuation}"
        );
        assert_eq!(condition(&body["status"], READY)["status"], "True");
        assert_eq!(event(&mut h).await.0, "EvacuationRequested");
        expect_no_more(&mut h).await;
        *keep.lock().unwrap() = body;
    })
    .await;
    // Marked, as the cache now shows: nothing is written again, no event.
    let km = with_sent_status(km, &sent.lock().unwrap());
    run(
        km.clone(),
        world(true),
        |mut h| async move { expect_no_more(&mut h).await },
    )
    .await;
    // Nor while the Machine cache has not caught up with the mark yet (the status write
    // triggers the next reconcile at once): the status already records it.
    run(km, world(false), |mut h| async move { expect_no_more(&mut h).await }).await;
}

#[tokio::test]
async fn an_evacuation_waits_while_another_machine_of_the_cluster_is_being_replaced() {
    let km = provisioned_on(vm("h1"));
    let mut other = machine("m0");
    other.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let world = World {
        machines: vec![machine("m1"), other],
        clusters: vec![cluster(false)],
        instances: vec![vm("h1")],
        nodes: hosts(true),
        health_checks: vec![health_check()],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, world, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", KM_STATUS, 200, km_json).await;
        let evacuation = condition(&body["status"], EVACUATION);
        assert_eq!(evacuation["reason"], reason::WAITING_FOR_TURN);
        assert!(
            evacuation["message"]
                .as_str()
                .unwrap()
                .contains("Machine m0 is being deleted"),
            "{evacuation}"
        );
        assert_eq!(event(&mut h).await.0, "EvacuationRequested");
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn a_paused_evacuation_writes_only_status() {
    let km = provisioned_on(vm("h1"));
    let world = || World {
        machines: vec![machine("m1")],
        clusters: vec![cluster(true)],
        instances: vec![vm("h1")],
        nodes: hosts(true),
        health_checks: vec![health_check()],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    let sent = Arc::new(Mutex::new(Value::Null));
    let keep = sent.clone();
    run(km.clone(), world(), move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", KM_STATUS, 200, km_json).await;
        assert_eq!(condition(&body["status"], PAUSED)["status"], "True");
        let evacuation = condition(&body["status"], EVACUATION);
        assert_eq!(
            (evacuation["status"].as_str(), evacuation["reason"].as_str()),
            (Some("True"), Some(reason::WAITING_FOR_UNPAUSE))
        );
        assert!(evacuation["message"].as_str().unwrap().contains("spec.paused"));
        expect_no_more(&mut h).await;
        *keep.lock().unwrap() = body;
    })
    .await;
    // Said once: the pause writes nothing more.
    let km = with_sent_status(km, &sent.lock().unwrap());
    run(km, world(), |mut h| async move { expect_no_more(&mut h).await }).await;
}

#[tokio::test]
async fn a_cordoned_node_first_waits_its_grace_period_writing_the_status_alone() {
    let km = provisioned_on(vm("h1"));
    let world = World {
        machines: vec![machine("m1")],
        clusters: vec![cluster(false)],
        instances: vec![vm("h1")],
        nodes: hosts(true),
        health_checks: vec![health_check()],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    run_with_grace(km, world, Duration::from_secs(60), move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", KM_STATUS, 200, km_json).await;
        let evacuation = condition(&body["status"], EVACUATION);
        assert_eq!(
            (evacuation["status"].as_str(), evacuation["reason"].as_str()),
            (Some("True"), Some(reason::WAITING_FOR_MIGRATION))
        );
        assert!(
            evacuation["message"].as_str().unwrap().contains("for 60s"),
            "{evacuation}"
        );
        assert_eq!(event(&mut h).await.0, "EvacuationRequested");
        expect_no_more(&mut h).await;
    })
    .await;
}

/// A worker marked while a MachineHealthCheck selected it, whose check is gone since (its
/// `HealthCheckSucceeded` condition left behind on the Machine): nobody acts on the mark, so
/// the provider deletes the Machine (its MachineSet replaces it, CAPI drains it) instead of
/// waiting for ever.
#[tokio::test]
async fn a_marked_worker_whose_machine_health_check_is_gone_is_deleted() {
    let km = provisioned_on(vm("h1"));
    let mut marked = machine("m1");
    marked.metadata.annotations = Some(
        [
            (capi::REMEDIATE_MACHINE_ANNOTATION.to_string(), String::new()),
            (
                capi::EVACUATION_ANNOTATION.to_string(),
                "Kairon node h1 cordoned".to_string(),
            ),
        ]
        .into(),
    );
    let world = World {
        machines: vec![marked, machine("m2")],
        clusters: vec![cluster(false)],
        instances: vec![vm("h1")],
        nodes: hosts(true),
        health_checks: vec![],
        ..World::default()
    };
    let km_json = serde_json::to_value(&km).unwrap();
    let machine_json = serde_json::to_value(machine("m1")).unwrap();
    run(km, world, move |mut h| async move {
        expect(&mut h, "DELETE", MACHINE_PATH, 200, machine_json).await;
        assert_eq!(event(&mut h).await.0, "ReplacementRequested");
        let (_, body) = expect(&mut h, "PATCH", KM_STATUS, 200, km_json).await;
        let evacuation = condition(&body["status"], EVACUATION);
        assert_eq!(evacuation["reason"], reason::REPLACEMENT_REQUESTED);
        assert!(
            evacuation["message"]
                .as_str()
                .unwrap()
                .contains("no MachineHealthCheck selects Machine m1"),
            "{evacuation}"
        );
        assert_eq!(event(&mut h).await.0, "EvacuationRequested");
        expect_no_more(&mut h).await;
    })
    .await;
}
