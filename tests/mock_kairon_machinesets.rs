//! What the Kairon MachineSet client sends, against a mock API server: every write that
//! decides a number of members or a template names the version it was decided on, errors of
//! requests that carry bootstrap data never repeat what the server said, and a delete names
//! the UID it means.

mod mock_support;

use capkr::kairon::machineset::MachineSet;
use capkr::kairon::set_desired::{PoolLink, SetInputs, desired_machine_set, desired_template};
use capkr::kairon::{Deletion, Instances, SetCreated, SetError, UserData};
use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use mock_support::{expect, expect_no_more, status_error};
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

const SETS: &str = "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machinesets";
const SECRET: &str = "#cloud-config TOP-SECRET-KEY";

fn sets() -> (capkr::kairon::MachineSets, Handle<Request<Body>, Response<Body>>) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    (Instances::new(client).machine_sets(), handle)
}

fn pool() -> PoolLink {
    PoolLink {
        name: "pool".into(),
        namespace: "ns".into(),
        uid: "pool-uid".into(),
    }
}

fn shape() -> capkr::api::KaironMachineSpec {
    serde_json::from_value(
        json!({"image": {"imageRef": "img", "diskSize": "20Gi"}, "resources": {"cpu": 2, "memory": "4Gi"}}),
    )
    .unwrap()
}

fn desired() -> MachineSet {
    let (p, s) = (pool(), shape());
    let inputs = SetInputs {
        pool: &p,
        cluster_name: "demo",
        template: &s,
        bootstrap_secret: "pool-boot",
        version: Some("v1.36.1"),
    };
    desired_machine_set(&inputs, UserData(SECRET.into()), 0)
}

/// The set as the API server answers with it (user-data included, as Kairon stores it).
fn stored(rv: &str) -> Value {
    let mut v = serde_json::to_value(desired()).unwrap();
    v["metadata"]["uid"] = json!("set-uid");
    v["metadata"]["resourceVersion"] = json!(rv);
    v
}

fn read(rv: &str) -> MachineSet {
    capkr::kairon::machine_set_from_value(stored(rv))
}

#[tokio::test]
async fn a_create_sends_the_user_data_and_an_error_never_repeats_it() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        let (_, sent) = expect(&mut h, "POST", SETS, 201, stored("1")).await;
        assert_eq!(sent["spec"]["template"]["spec"]["legacyUserData"], SECRET);
        assert_eq!(sent["spec"]["replicas"], 0);
        assert_eq!(sent["spec"]["updateStrategy"]["type"], "OnDelete");
        assert_eq!(
            sent["metadata"]["labels"]["infrastructure.cluster.x-k8s.io/kaironmachinepool-uid"],
            "pool-uid"
        );
        let mut quoting = status_error(422, "Invalid");
        quoting["message"] = json!(format!("spec.template.spec.legacyUserData: {SECRET} is invalid"));
        expect(&mut h, "POST", SETS, 422, quoting).await;
        h
    });
    let created = sets.create(desired()).await.expect("created");
    match created {
        SetCreated::New(set) => assert!(set.spec.template.spec.cloud_init.is_none(), "not held after the answer"),
        other => panic!("{other:?}"),
    }
    let err = sets.create(desired()).await.expect_err("refused");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("TOP-SECRET-KEY"), "{text}");
    assert!(text.contains("422") && text.contains("Invalid"), "{text}");
    let mut h = server.await.unwrap();
    expect_no_more(&mut h).await;
}

#[tokio::test]
async fn a_name_taken_reads_what_has_it() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        expect(&mut h, "POST", SETS, 409, status_error(409, "AlreadyExists")).await;
        expect(&mut h, "GET", &format!("{SETS}/pool"), 200, stored("7")).await;
        h
    });
    match sets.create(desired()).await.expect("found") {
        SetCreated::Existing(set) => {
            assert_eq!(set.metadata.resource_version.as_deref(), Some("7"));
            assert!(set.spec.template.spec.cloud_init.is_none(), "user-data dropped on read");
        }
        other => panic!("{other:?}"),
    }
    expect_no_more(&mut server.await.unwrap()).await;
}

#[tokio::test]
async fn replicas_are_written_against_the_version_they_were_decided_on() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        let (_, sent) = expect(&mut h, "PATCH", &format!("{SETS}/pool"), 200, stored("4")).await;
        assert_eq!(
            sent,
            json!({"metadata": {"resourceVersion": "3"}, "spec": {"replicas": 5}})
        );
        expect(
            &mut h,
            "PATCH",
            &format!("{SETS}/pool"),
            409,
            status_error(409, "Conflict"),
        )
        .await;
        h
    });
    sets.patch_replicas(&read("3"), 5).await.expect("scaled");
    let err = sets.patch_replicas(&read("3"), 6).await.expect_err("stale");
    assert!(matches!(err, SetError::Stale { .. }), "{err:?}");
    expect_no_more(&mut server.await.unwrap()).await;
}

#[tokio::test]
async fn a_token_rotation_rewrites_only_the_user_data_and_its_digest() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        let (_, sent) = expect(&mut h, "PATCH", &format!("{SETS}/pool"), 200, stored("4")).await;
        let ops = sent.as_array().expect("a JSON patch");
        assert_eq!(ops.len(), 3, "{sent}");
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "3"})
        );
        assert_eq!(ops[1]["path"], "/spec/template/spec/legacyUserData");
        assert_eq!(ops[1]["value"], "rotated");
        assert_eq!(
            ops[2]["path"],
            "/metadata/annotations/infrastructure.cluster.x-k8s.io~1bootstrap-data-hash"
        );
        let mut failed_test = status_error(422, "Invalid");
        failed_test["message"] =
            json!("the server rejected our request due to an error in our request: test operation failed");
        expect(&mut h, "PATCH", &format!("{SETS}/pool"), 422, failed_test).await;
        h
    });
    sets.patch_user_data(&read("3"), UserData("rotated".into()))
        .await
        .expect("written");
    let err = sets
        .patch_user_data(&read("3"), UserData("rotated".into()))
        .await
        .expect_err("stale");
    assert!(matches!(err, SetError::Stale { .. }), "{err:?}");
    expect_no_more(&mut server.await.unwrap()).await;
}

#[tokio::test]
async fn a_template_change_replaces_the_whole_template() {
    let (sets, mut h) = sets();
    let (p, mut s) = (pool(), shape());
    s.image = capkr::api::MachineImage::from_image_ref("img-2", Some("20Gi"));
    let template = desired_template(&SetInputs {
        pool: &p,
        cluster_name: "demo",
        template: &s,
        bootstrap_secret: "pool-boot",
        version: Some("v1.36.1"),
    });
    let server = tokio::spawn(async move {
        let (_, sent) = expect(&mut h, "PATCH", &format!("{SETS}/pool"), 200, stored("4")).await;
        let ops = sent.as_array().expect("a JSON patch");
        assert_eq!(ops[0]["op"], "test");
        assert_eq!(ops[1]["op"], "replace");
        assert_eq!(ops[1]["path"], "/spec/template");
        assert_eq!(ops[1]["value"]["spec"]["image"]["imageRef"], "img-2");
        assert_eq!(ops[1]["value"]["spec"]["legacyUserData"], SECRET);
        expect(
            &mut h,
            "PATCH",
            &format!("{SETS}/pool"),
            500,
            status_error(500, "InternalError"),
        )
        .await;
        h
    });
    sets.patch_template(&read("3"), template.clone(), UserData(SECRET.into()))
        .await
        .expect("written");
    let err = sets
        .patch_template(&read("3"), template, UserData(SECRET.into()))
        .await
        .expect_err("failed");
    assert!(!format!("{err} {err:?}").contains("TOP-SECRET-KEY"));
    expect_no_more(&mut server.await.unwrap()).await;
}

#[tokio::test]
async fn a_delete_names_the_uid_and_a_missing_set_is_gone() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        let (_, sent) = expect(&mut h, "DELETE", &format!("{SETS}/pool"), 200, stored("5")).await;
        assert_eq!(sent["preconditions"]["uid"], "set-uid");
        expect(
            &mut h,
            "DELETE",
            &format!("{SETS}/pool"),
            404,
            status_error(404, "NotFound"),
        )
        .await;
        h
    });
    assert_eq!(sets.delete(&read("4")).await.expect("deleted"), Deletion::Started);
    assert_eq!(sets.delete(&read("4")).await.expect("gone"), Deletion::Gone);
    expect_no_more(&mut server.await.unwrap()).await;
}

#[tokio::test]
async fn adoption_relabels_the_set_and_leaves_its_template() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        let (_, sent) = expect(&mut h, "PATCH", &format!("{SETS}/pool"), 200, stored("4")).await;
        assert_eq!(
            sent,
            json!({"metadata": {"labels": {
                "infrastructure.cluster.x-k8s.io/kaironmachinepool-uid": "new-uid",
                "infrastructure.cluster.x-k8s.io/kaironmachinepool-namespace": "ns"}}})
        );
        h
    });
    sets.adopt(&read("3"), "new-uid", "ns").await.expect("adopted");
    expect_no_more(&mut server.await.unwrap()).await;
}
