//! What the provider asks a Kairon API to learn which versions it serves, against a mock API
//! server: one resource list per supported version (a version not served answers 404), then
//! the OpenAPI document of the version chosen for Machines; and what it then speaks.

use crate::mock_support;

use capkr::kairon::served::{KaironKind, discover};
use capkr::kairon::{Image, Machine, MachineSpec};
use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use mock_support::{expect, expect_no_more, status_error};
use serde_json::{Value, json};
use tower_test::mock;

fn resources(version: &str, plurals: &[(&str, &str)]) -> Value {
    let resources: Vec<Value> = plurals
        .iter()
        .map(|(name, kind)| json!({"name": name, "singularName": "", "namespaced": true, "kind": kind, "verbs": ["get", "list"]}))
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("kairon.zyvor.dev/{version}"), "resources": resources})
}

fn openapi(version: &str, image: Value) -> Value {
    json!({"openapi": "3.0.0", "components": {"schemas": {
        format!("dev.zyvor.kairon.{version}.Machine"): {"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"image": {"type": "object", "properties": image}}}}}}}})
}

fn with_image_ref() -> Machine {
    let mut vm = Machine::new(
        "vm",
        MachineSpec {
            image: Some(Image {
                image_ref: Some("ubuntu".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    vm.metadata.namespace = Some("ns".into());
    vm
}

#[tokio::test]
async fn a_kairon_serving_v1_and_deprecated_versions_is_spoken_to_in_v1_with_its_v1_schema() {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let asked = tokio::spawn(async move { discover(&client).await.map(|s| (s, client)) });
    let all = [
        ("machines", "Machine"),
        ("machinesets", "MachineSet"),
        ("machinedisruptionbudgets", "MachineDisruptionBudget"),
    ];
    expect(
        &mut handle,
        "GET",
        "/apis/kairon.zyvor.dev/v1",
        200,
        resources("v1", &all),
    )
    .await;
    expect(
        &mut handle,
        "GET",
        "/apis/kairon.zyvor.dev/v1beta1",
        200,
        resources("v1beta1", &all),
    )
    .await;
    expect(
        &mut handle,
        "GET",
        "/apis/kairon.zyvor.dev/v1alpha1",
        200,
        resources("v1alpha1", &all),
    )
    .await;
    let image = json!({"imageRef": {"type": "string"}, "path": {"type": "string"}});
    expect(
        &mut handle,
        "GET",
        "/openapi/v3/apis/kairon.zyvor.dev/v1",
        200,
        openapi("v1", image),
    )
    .await;
    expect_no_more(&mut handle).await;
    let (served, client) = asked.await.unwrap().expect("discovered");
    assert_eq!(served.version(KaironKind::Machine), Some("v1"));
    assert_eq!(served.version(KaironKind::MachineMigration), None);
    assert!(served.knows_machine_schema());
    assert_eq!(served.unsupported(&with_image_ref()), None);

    // Its kinds are then spoken in v1 (the e2e `api_versions` tests watch the writes).
    assert_eq!(served.resource(KaironKind::Machine).api_version, "kairon.zyvor.dev/v1");
    drop(client);
}

#[tokio::test]
async fn an_older_kairon_serving_v1alpha1_alone_is_spoken_to_in_v1alpha1_and_its_missing_fields_are_known() {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let asked = tokio::spawn(async move { discover(&client).await });
    let not_found = status_error(404, "NotFound");
    expect(&mut handle, "GET", "/apis/kairon.zyvor.dev/v1", 404, not_found.clone()).await;
    expect(&mut handle, "GET", "/apis/kairon.zyvor.dev/v1beta1", 404, not_found).await;
    let machines = resources("v1alpha1", &[("machines", "Machine")]);
    expect(&mut handle, "GET", "/apis/kairon.zyvor.dev/v1alpha1", 200, machines).await;
    let image = json!({"path": {"type": "string"}});
    expect(
        &mut handle,
        "GET",
        "/openapi/v3/apis/kairon.zyvor.dev/v1alpha1",
        200,
        openapi("v1alpha1", image),
    )
    .await;
    expect_no_more(&mut handle).await;
    let served = asked.await.unwrap().expect("discovered");
    assert_eq!(served.version(KaironKind::Machine), Some("v1alpha1"));
    assert_eq!(served.version(KaironKind::MachineDisruptionBudget), None);
    let gap = served.unsupported(&with_image_ref()).expect("imageRef is missing");
    assert_eq!(gap.fields, vec![("spec.image.imageRef".to_string(), Some("v0.8.0"))]);
    assert_eq!(gap.api_version, "kairon.zyvor.dev/v1alpha1");
}

#[tokio::test]
async fn an_unreadable_schema_leaves_fields_unchecked_and_an_unanswering_api_is_an_error() {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let asked = tokio::spawn(async move { discover(&client).await });
    let machines = resources("v1", &[("machines", "Machine")]);
    expect(&mut handle, "GET", "/apis/kairon.zyvor.dev/v1", 200, machines).await;
    let not_found = status_error(404, "NotFound");
    expect(
        &mut handle,
        "GET",
        "/apis/kairon.zyvor.dev/v1beta1",
        404,
        not_found.clone(),
    )
    .await;
    expect(&mut handle, "GET", "/apis/kairon.zyvor.dev/v1alpha1", 404, not_found).await;
    let forbidden = status_error(403, "Forbidden");
    expect(
        &mut handle,
        "GET",
        "/openapi/v3/apis/kairon.zyvor.dev/v1",
        403,
        forbidden,
    )
    .await;
    let served = asked.await.unwrap().expect("discovered");
    assert!(!served.knows_machine_schema());
    assert_eq!(served.unsupported(&with_image_ref()), None);

    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let asked = tokio::spawn(async move { discover(&client).await });
    expect(
        &mut handle,
        "GET",
        "/apis/kairon.zyvor.dev/v1",
        503,
        status_error(503, "ServiceUnavailable"),
    )
    .await;
    expect_no_more(&mut handle).await;
    assert!(
        asked.await.unwrap().is_err(),
        "a failing API is not taken for one serving nothing"
    );
}
