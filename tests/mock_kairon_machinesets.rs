//! What the Kairon MachineSet client sends, against a mock API server: a pool's set is created
//! Stopped and without bootstrap data; every write that decides a number of members names the
//! version it was decided on (a release lowers the set by one together with its record, in one
//! write); errors never repeat what the server said, and what is read never holds a template's
//! user-data (a set made by someone else may carry some); a delete names the UID it means.

mod mock_support;

use capkr::kairon::machineset::MachineSet;
use capkr::kairon::set_desired::{
    POOL_ID_ANNOTATION, PoolLink, REVISION_LABEL, SetInputs, desired_machine_set, desired_template, revision, set_name,
};
use capkr::kairon::{Deletion, Instances, SetCreated, SetError, labels, release_record};
use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use mock_support::{expect, expect_no_more, status_error};
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

const SETS: &str = "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machinesets";
/// What a set made by someone else may carry, and an API error may quote.
const SECRET: &str = "#cloud-config TOP-SECRET-KEY";

fn sets() -> (capkr::kairon::MachineSets, Handle<Request<Body>, Response<Body>>) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    (
        Instances::new(client, capkr::kairon::served::Served::assumed("v1alpha1")).machine_sets(),
        handle,
    )
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

fn desired_with(pool_id: Option<&str>, replicas: i32) -> MachineSet {
    let (p, s) = (pool(), shape());
    let inputs = SetInputs {
        pool: &p,
        cluster_name: "demo",
        template: &s,
        bootstrap_secret: "pool-boot",
        version: Some("v1.36.1"),
    };
    desired_machine_set(&inputs, pool_id, replicas)
}

fn desired() -> MachineSet {
    desired_with(None, 0)
}

/// The set's name: the pool's and its template's revision.
fn name() -> String {
    let (p, s) = (pool(), shape());
    let inputs = SetInputs {
        pool: &p,
        cluster_name: "demo",
        template: &s,
        bootstrap_secret: "pool-boot",
        version: Some("v1.36.1"),
    };
    set_name("pool", &revision(&desired_template(&inputs)))
}

fn path() -> String {
    format!("{SETS}/{}", name())
}

/// The set as the API server answers with it: with `replicas`, at `rv`, and user-data in its
/// template (as a set someone else made, or edited, may have).
fn stored(rv: &str, replicas: i32) -> Value {
    let mut v = serde_json::to_value(desired_with(None, replicas)).unwrap();
    v["metadata"]["uid"] = json!("set-uid");
    v["metadata"]["resourceVersion"] = json!(rv);
    v["spec"]["template"]["spec"]["cloudInit"] = json!({"runCmd": [SECRET]});
    v["spec"]["template"]["spec"]["legacyUserData"] = json!(SECRET);
    v
}

fn read(rv: &str, replicas: i32) -> MachineSet {
    capkr::kairon::machine_set_from_value(stored(rv, replicas))
}

/// An API error whose message quotes `quoted`, as an apiserver's validation errors do.
fn quoting(code: u16, reason: &str, quoted: &str) -> Value {
    let mut e = status_error(code, reason);
    e["message"] = json!(format!("spec.template.spec: {quoted} is invalid"));
    e
}

fn assert_redacted(err: &SetError, code: &str) {
    let text = format!("{err} {err:?}");
    assert!(!text.contains("TOP-SECRET-KEY"), "{text}");
    assert!(text.contains(code), "the answer's code is kept: {text}");
}

#[tokio::test]
async fn a_create_sends_a_stopped_set_without_bootstrap_data_and_an_error_never_repeats_the_answer() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        let (query, sent) = expect(&mut h, "POST", SETS, 201, stored("1", 0)).await;
        assert!(query.contains("fieldManager="), "{query}");
        assert_eq!(sent["metadata"]["name"], name());
        assert_eq!(sent["metadata"]["namespace"], "ns");
        assert_eq!(sent["spec"]["replicas"], 0);
        let spec = &sent["spec"]["template"]["spec"];
        assert_eq!(spec["powerState"], "Stopped", "no member boots from the template");
        assert!(
            spec.get("cloudInit").is_none() && spec.get("legacyUserData").is_none(),
            "{sent}"
        );
        assert!(sent["spec"].get("strategy").is_none(), "Kairon's default: {sent}");
        assert!(sent["spec"].get("maxUnavailable").is_none(), "{sent}");
        let l = &sent["metadata"]["labels"];
        assert_eq!(l[labels::KAIRONMACHINEPOOL_UID], "pool-uid");
        assert_eq!(l[labels::KAIRONMACHINEPOOL_NAME], "pool");
        assert_eq!(l[REVISION_LABEL], name().trim_start_matches("pool-"));
        // Instances::new speaks for no management cluster (an empty id): nothing to stamp.
        assert!(l.get(labels::MANAGEMENT_CLUSTER).is_none(), "{l}");
        assert!(
            sent["metadata"].get("annotations").is_none(),
            "no pool ID yet: no annotation: {sent}"
        );
        let (_, sent) = expect(&mut h, "POST", SETS, 201, stored("1", 0)).await;
        assert_eq!(
            sent["metadata"]["annotations"],
            json!({POOL_ID_ANNOTATION: "kairon://machinesets/first-uid"}),
            "a later set carries the pool's ID"
        );
        expect(&mut h, "POST", SETS, 422, quoting(422, "Invalid", SECRET)).await;
        h
    });
    match sets.create(desired()).await.expect("created") {
        SetCreated::New(set) => {
            assert_eq!(set.metadata.uid.as_deref(), Some("set-uid"));
            assert!(
                set.spec.template.spec.cloud_init.is_none(),
                "user-data in the answer is not held"
            );
        }
        other => panic!("{other:?}"),
    }
    sets.create(desired_with(Some("kairon://machinesets/first-uid"), 0))
        .await
        .expect("created");
    let err = sets.create(desired()).await.expect_err("refused");
    assert_redacted(&err, "422");
    assert!(format!("{err}").contains("Invalid"), "{err}");
    let mut h = server.await.unwrap();
    expect_no_more(&mut h).await;
}

#[tokio::test]
async fn a_name_taken_reads_what_has_it_without_its_user_data() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        expect(&mut h, "POST", SETS, 409, status_error(409, "AlreadyExists")).await;
        expect(&mut h, "GET", &path(), 200, stored("7", 2)).await;
        h
    });
    match sets.create(desired()).await.expect("found") {
        SetCreated::Existing(set) => {
            assert_eq!(set.metadata.resource_version.as_deref(), Some("7"));
            assert_eq!(set.spec.replicas, 2);
            assert!(set.spec.template.spec.cloud_init.is_none(), "user-data dropped on read");
            assert!(!format!("{set:?}").contains("TOP-SECRET-KEY"));
        }
        other => panic!("{other:?}"),
    }
    expect_no_more(&mut server.await.unwrap()).await;
}

#[tokio::test]
async fn a_read_of_a_missing_set_is_none() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        expect(&mut h, "GET", &path(), 404, status_error(404, "NotFound")).await;
        h
    });
    assert!(sets.get("ns", &name()).await.expect("read").is_none());
    expect_no_more(&mut server.await.unwrap()).await;
}

#[tokio::test]
async fn replicas_are_written_against_the_version_they_were_decided_on() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        let (_, sent) = expect(&mut h, "PATCH", &path(), 200, stored("4", 5)).await;
        assert_eq!(
            sent,
            json!({"metadata": {"resourceVersion": "3"}, "spec": {"replicas": 5}})
        );
        expect(&mut h, "PATCH", &path(), 409, status_error(409, "Conflict")).await;
        expect(&mut h, "PATCH", &path(), 500, quoting(500, "InternalError", SECRET)).await;
        h
    });
    sets.patch_replicas(&read("3", 2), 5).await.expect("scaled");
    let err = sets.patch_replicas(&read("3", 2), 6).await.expect_err("stale");
    assert!(matches!(err, SetError::Stale { .. }), "{err:?}");
    let err = sets.patch_replicas(&read("3", 2), 6).await.expect_err("failed");
    assert!(matches!(err, SetError::Write { .. }), "{err:?}");
    assert_redacted(&err, "500");
    expect_no_more(&mut server.await.unwrap()).await;
}

#[tokio::test]
async fn a_release_lowers_the_set_by_one_with_its_record_in_one_write_against_the_version_read() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        let (_, sent) = expect(&mut h, "PATCH", &path(), 200, stored("4", 2)).await;
        assert_eq!(
            sent,
            json!({"metadata": {"resourceVersion": "3", "annotations": {release_record("m-uid"): "pool-m"}},
                "spec": {"replicas": 2}})
        );
        // A set already at 0 is not lowered below it.
        let (_, sent) = expect(&mut h, "PATCH", &path(), 200, stored("9", 0)).await;
        assert_eq!(sent["spec"]["replicas"], 0);
        assert_eq!(sent["metadata"]["resourceVersion"], "8");
        expect(&mut h, "PATCH", &path(), 409, status_error(409, "Conflict")).await;
        expect(&mut h, "PATCH", &path(), 403, quoting(403, "Forbidden", SECRET)).await;
        h
    });
    sets.release(&read("3", 3), "m-uid", "pool-m").await.expect("released");
    sets.release(&read("8", 0), "m-uid", "pool-m").await.expect("released");
    let err = sets.release(&read("3", 3), "m-uid", "pool-m").await.expect_err("stale");
    assert!(
        matches!(err, SetError::Stale { .. }),
        "a release is counted once: {err:?}"
    );
    let err = sets
        .release(&read("3", 3), "m-uid", "pool-m")
        .await
        .expect_err("refused");
    assert!(matches!(err, SetError::Write { .. }), "{err:?}");
    assert_redacted(&err, "403");
    expect_no_more(&mut server.await.unwrap()).await;
}

#[tokio::test]
async fn forgetting_releases_removes_exactly_their_records_against_the_version_read() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        let (_, sent) = expect(&mut h, "PATCH", &path(), 200, stored("4", 2)).await;
        assert_eq!(
            sent,
            json!({"metadata": {"resourceVersion": "3", "annotations": {
                release_record("a-uid"): null, release_record("b-uid"): null}}})
        );
        expect(&mut h, "PATCH", &path(), 409, status_error(409, "Conflict")).await;
        h
    });
    let gone = ["a-uid".to_string(), "b-uid".to_string()];
    sets.forget_releases(&read("3", 2), &gone).await.expect("forgotten");
    let err = sets.forget_releases(&read("3", 2), &gone).await.expect_err("stale");
    assert!(matches!(err, SetError::Stale { .. }), "{err:?}");
    expect_no_more(&mut server.await.unwrap()).await;
}

#[tokio::test]
async fn a_delete_names_the_uid_and_a_missing_set_is_gone() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        let (_, sent) = expect(&mut h, "DELETE", &path(), 200, stored("5", 0)).await;
        assert_eq!(sent["preconditions"]["uid"], "set-uid");
        expect(&mut h, "DELETE", &path(), 404, status_error(404, "NotFound")).await;
        expect(&mut h, "DELETE", &path(), 409, status_error(409, "Conflict")).await;
        h
    });
    assert_eq!(sets.delete(&read("4", 0)).await.expect("deleted"), Deletion::Started);
    assert_eq!(sets.delete(&read("4", 0)).await.expect("gone"), Deletion::Gone);
    let err = sets
        .delete(&read("4", 0))
        .await
        .expect_err("another set has the name now");
    assert!(matches!(err, SetError::Delete { .. }), "{err:?}");
    expect_no_more(&mut server.await.unwrap()).await;
}

#[tokio::test]
async fn adoption_relabels_the_set_and_leaves_its_template() {
    let (sets, mut h) = sets();
    let server = tokio::spawn(async move {
        let (_, sent) = expect(&mut h, "PATCH", &path(), 200, stored("4", 2)).await;
        assert_eq!(
            sent,
            json!({"metadata": {"labels": {
                "infrastructure.cluster.x-k8s.io/kaironmachinepool-uid": "new-uid",
                "infrastructure.cluster.x-k8s.io/kaironmachinepool-namespace": "ns"}}})
        );
        h
    });
    sets.adopt(&read("3", 2), "new-uid", "ns").await.expect("adopted");
    expect_no_more(&mut server.await.unwrap()).await;
}
