//! The exact API calls of the KaironCluster reconciler on its main paths, against a mock API
//! server (tower-test): what provisioning, steady state, waiting, pause and deletion write, and
//! that nothing at all is written where the contract says so (no owner, externally managed).

use std::sync::Arc;
use std::time::Duration;

use capkr::api::conditions::{PAUSED, READY, reason};
use capkr::api::{APIEndpoint, CLUSTER_FINALIZER, FailureDomainSpec, KaironCluster, KaironClusterSpec, KaironMachine};
use capkr::capi::{self, ClusterSpec};
use capkr::controller::kairon_cluster::{Context, Decision, next_status, reconcile};
use http::{Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Client;
use kube::client::Body;
use serde_json::json;
use tower_test::mock::{self, Handle};

use crate::mock_support;
use mock_support::{World, condition, expect, expect_no_more};

const NS: &str = "ns";
const KC_PATH: &str = "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/ns/kaironclusters/demo";

fn kaironcluster(endpoint: bool) -> KaironCluster {
    let mut kc = KaironCluster::new(
        "demo",
        KaironClusterSpec {
            control_plane_endpoint: endpoint.then(|| APIEndpoint {
                host: Some("127.0.10.1".into()),
                port: Some(6443),
            }),
            failure_domains: Some(vec![FailureDomainSpec {
                name: "zone-a".into(),
                control_plane: Some(true),
                node_selector: None,
            }]),
            identity_ref: None,
        },
    );
    kc.metadata.namespace = Some(NS.into());
    kc.metadata.uid = Some("kc-uid".into());
    kc.metadata.generation = Some(1);
    kc.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Cluster".into(),
        name: "demo".into(),
        uid: "cluster-uid".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    kc
}

fn with_finalizer(mut kc: KaironCluster) -> KaironCluster {
    kc.metadata.finalizers = Some(vec![CLUSTER_FINALIZER.into()]);
    kc
}

fn with_status(mut kc: KaironCluster, decision: Decision) -> KaironCluster {
    let at = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
    kc.status = Some(next_status(&kc, &decision, &at));
    kc
}

fn deleting(mut kc: KaironCluster) -> KaironCluster {
    kc.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_100).unwrap()));
    kc
}

fn cluster(paused: bool) -> capi::Cluster {
    let mut c = capi::Cluster::new(
        "demo",
        ClusterSpec {
            paused: paused.then_some(true),
            ..Default::default()
        },
    );
    c.metadata.namespace = Some(NS.into());
    c
}

/// A KaironMachine of cluster `demo` owned by a Machine.
fn member(name: &str) -> KaironMachine {
    let mut m = orphan(name);
    m.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Machine".into(),
        name: name.into(),
        uid: format!("{name}-uid"),
        ..Default::default()
    }]);
    m
}

/// A KaironMachine of cluster `demo` that no Machine owns (CAPI will never delete it).
fn orphan(name: &str) -> KaironMachine {
    KaironMachine {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some([(capi::CLUSTER_NAME_LABEL.to_string(), "demo".to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Runs one reconcile of `kc` against a mock API server driven by `server`.
async fn run<F, Fut>(
    kc: KaironCluster,
    clusters: Vec<capi::Cluster>,
    members: Vec<KaironMachine>,
    server: F,
) -> Result<(), capkr::controller::Error>
where
    F: FnOnce(Handle<Request<Body>, Response<Body>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let world = World {
        clusters,
        kaironmachines: members,
        ..World::default()
    };
    mock_support::against(server, |client| {
        reconcile(Arc::new(kc), Arc::new(world.cluster_context(client)))
    })
    .await
    .map(|_| ())
}

#[tokio::test]
async fn first_reconcile_adds_the_finalizer_then_publishes_endpoint_and_failure_domains() {
    let kc_json = serde_json::to_value(kaironcluster(true)).unwrap();
    run(
        kaironcluster(true),
        vec![cluster(false)],
        vec![],
        move |mut h| async move {
            let (_, patch) = expect(&mut h, "PATCH", KC_PATH, 200, kc_json.clone()).await;
            assert_eq!(
                patch[1],
                json!({"op": "add", "path": "/metadata/finalizers", "value": [CLUSTER_FINALIZER]})
            );
            let (query, body) = expect(&mut h, "PATCH", &format!("{KC_PATH}/status"), 200, kc_json).await;
            assert!(
                query.contains("fieldManager=capkr-manager") && query.contains("force=true"),
                "{query}"
            );
            let status = &body["status"];
            assert_eq!(status["initialization"]["provisioned"], true);
            assert_eq!(status["failureDomains"][0]["name"], "zone-a");
            assert_eq!(condition(status, READY)["status"], "True");
            assert_eq!(condition(status, PAUSED)["status"], "False");
            expect_no_more(&mut h).await;
        },
    )
    .await
    .expect("reconcile succeeds");
}

#[tokio::test]
async fn steady_state_makes_no_request() {
    let kc = with_status(with_finalizer(kaironcluster(true)), Decision::Provisioned);
    run(kc, vec![cluster(false)], vec![member("m1")], |mut h| async move {
        expect_no_more(&mut h).await
    })
    .await
    .expect("reconcile succeeds");
}

#[tokio::test]
async fn without_an_endpoint_anywhere_it_waits_and_says_so() {
    let kc = with_finalizer(kaironcluster(false));
    let kc_json = serde_json::to_value(&kc).unwrap();
    run(kc, vec![cluster(false)], vec![], move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KC_PATH}/status"), 200, kc_json).await;
        let status = &body["status"];
        assert_eq!(
            condition(status, READY)["reason"],
            reason::WAITING_FOR_CONTROL_PLANE_ENDPOINT
        );
        assert!(status.get("initialization").is_none(), "{status}");
        expect_no_more(&mut h).await;
    })
    .await
    .expect("reconcile succeeds");

    // The endpoint set on the Cluster (by someone else) is enough.
    let kc = with_finalizer(kaironcluster(false));
    let kc_json = serde_json::to_value(&kc).unwrap();
    let mut c = cluster(false);
    c.spec.control_plane_endpoint = Some(APIEndpoint {
        host: Some("lb.example".into()),
        port: Some(443),
    });
    run(kc, vec![c], vec![], move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KC_PATH}/status"), 200, kc_json).await;
        assert_eq!(body["status"]["initialization"]["provisioned"], true);
        expect_no_more(&mut h).await;
    })
    .await
    .expect("reconcile succeeds");
}

#[tokio::test]
async fn without_an_owner_cluster_nothing_is_written_not_even_the_finalizer() {
    let mut kc = kaironcluster(true);
    kc.metadata.owner_references = None;
    run(kc, vec![cluster(false)], vec![], |mut h| async move {
        expect_no_more(&mut h).await
    })
    .await
    .expect("reconcile succeeds");
}

#[tokio::test]
async fn an_externally_managed_kaironcluster_is_left_alone() {
    let mut kc = kaironcluster(false);
    kc.metadata.annotations = Some([("cluster.x-k8s.io/managed-by".to_string(), "someone".to_string())].into());
    run(kc, vec![cluster(false)], vec![], |mut h| async move {
        expect_no_more(&mut h).await
    })
    .await
    .expect("reconcile succeeds");
}

#[tokio::test]
async fn marked_externally_managed_after_our_finalizer_it_releases_the_finalizer_and_nothing_else() {
    let mut kc = with_finalizer(kaironcluster(false));
    kc.metadata.annotations = Some([("cluster.x-k8s.io/managed-by".to_string(), "someone".to_string())].into());
    let kc_json = serde_json::to_value(&kc).unwrap();
    run(kc, vec![cluster(false)], vec![member("m1")], move |mut h| async move {
        let (_, patch) = expect(&mut h, "PATCH", KC_PATH, 200, kc_json).await;
        assert_eq!(patch[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
        expect_no_more(&mut h).await;
    })
    .await
    .expect("reconcile succeeds");
}

#[tokio::test]
async fn paused_reports_paused_once_and_then_writes_nothing() {
    let kc = with_status(with_finalizer(kaironcluster(true)), Decision::Provisioned);
    let kc_json = serde_json::to_value(&kc).unwrap();
    run(kc.clone(), vec![cluster(true)], vec![], move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KC_PATH}/status"), 200, kc_json).await;
        let paused = condition(&body["status"], PAUSED);
        assert_eq!(
            (paused["status"].as_str(), paused["reason"].as_str()),
            (Some("True"), Some("Paused"))
        );
        assert_eq!(condition(&body["status"], READY)["status"], "True", "Ready untouched");
        expect_no_more(&mut h).await;
    })
    .await
    .expect("reconcile succeeds");

    // Already reported, and deleted meanwhile: still nothing — a paused deletion waits.
    let kc = deleting(with_status(kc, Decision::Paused("Cluster spec.paused is set to true")));
    run(kc, vec![cluster(true)], vec![member("m1")], |mut h| async move {
        expect_no_more(&mut h).await
    })
    .await
    .expect("reconcile succeeds");
}

#[tokio::test]
async fn deletion_waits_for_the_clusters_kaironmachines_then_releases_the_finalizer() {
    let kc = deleting(with_status(with_finalizer(kaironcluster(true)), Decision::Provisioned));
    let kc_json = serde_json::to_value(&kc).unwrap();
    let mut other = member("x1");
    other.metadata.labels = Some([(capi::CLUSTER_NAME_LABEL.to_string(), "other".to_string())].into());
    run(
        kc.clone(),
        vec![cluster(false)],
        vec![member("m1"), member("m2"), other.clone()],
        move |mut h| async move {
            let (_, body) = expect(&mut h, "PATCH", &format!("{KC_PATH}/status"), 200, kc_json).await;
            let ready = condition(&body["status"], READY);
            assert_eq!(ready["reason"], reason::WAITING_FOR_MACHINES_DELETION);
            assert!(
                ready["message"].as_str().unwrap().contains("2 KaironMachine(s)"),
                "another cluster's machine is not counted: {ready}"
            );
            expect_no_more(&mut h).await;
        },
    )
    .await
    .expect("reconcile succeeds");

    // The last one gone (one no Machine owns does not count): the finalizer goes, with a test
    // that it is still where we saw it.
    let kc_json = serde_json::to_value(&kc).unwrap();
    run(
        kc,
        vec![cluster(false)],
        vec![other, orphan("o1")],
        move |mut h| async move {
            let (_, patch) = expect(&mut h, "PATCH", KC_PATH, 200, kc_json).await;
            assert_eq!(
                patch,
                json!([
                    {"op": "test", "path": "/metadata/finalizers/0", "value": CLUSTER_FINALIZER},
                    {"op": "remove", "path": "/metadata/finalizers/0"},
                ])
            );
            expect_no_more(&mut h).await;
        },
    )
    .await
    .expect("reconcile succeeds");
}

/// A transient error reading a KaironClusterIdentity (or the labels of the namespace its
/// selector needs) says nothing about whether it allows the namespace: nothing of it is
/// touched. Before, the reconcile went on to protect it, which put our finalizer on an identity
/// the namespace is not allowed to use and the identity as owner of its Secret.
#[tokio::test]
async fn a_transient_error_reading_an_identity_leaves_the_identity_untouched() {
    use capkr::api::{
        AllowedNamespaces, IDENTITY_KIND_CLUSTER_IDENTITY, KaironClusterIdentity, KaironClusterIdentitySpec,
        KaironIdentityReference,
    };
    use capkr::controller::Endpoints;
    use mock_support::status_error;

    const IDENTITY_PATH: &str = "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/kaironclusteridentities/site-a";
    const SECRET_PATH: &str = "/api/v1/namespaces/capkr-system/secrets/site-a";
    const NS_PATH: &str = "/api/v1/namespaces/ns";
    let mut identity = KaironClusterIdentity::new(
        "site-a",
        KaironClusterIdentitySpec {
            secret_name: "site-a".into(),
            // Namespace `ns` is neither listed nor labelled `site: a`.
            allowed_namespaces: Some(AllowedNamespaces {
                list: Some(vec!["team-a".into()]),
                selector: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_labels: Some([("site".to_string(), "a".to_string())].into()),
                    match_expressions: None,
                }),
            }),
        },
    );
    identity.metadata.uid = Some("identity-uid".into());
    let identity_json = serde_json::to_value(&identity).unwrap();
    let secret_json = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "site-a", "namespace": "capkr-system", "uid": "secret-uid"}});

    for (case, identity_fails_first) in [
        ("reading the identity fails once", true),
        ("reading the namespace's labels fails", false),
    ] {
        let mut kc = with_finalizer(kaironcluster(true));
        kc.spec.identity_ref = Some(KaironIdentityReference {
            kind: IDENTITY_KIND_CLUSTER_IDENTITY.into(),
            name: "site-a".into(),
        });
        let kc_json = serde_json::to_value(&kc).unwrap();
        let (service, mut h) = mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let world = World {
            clusters: vec![cluster(false)],
            ..World::default()
        };
        let ctx = Arc::new(Context {
            endpoints: Some(Arc::new(Endpoints::for_request_tests(client.clone(), "capkr-system"))),
            ..world.cluster_context(client)
        });
        let (identity_json, secret_json) = (identity_json.clone(), secret_json.clone());
        // Answers whatever comes, the identity's first read with a 500 in the first case and
        // the namespace's with a 500 always; returns the requests and the status written.
        let server = tokio::spawn(async move {
            let mut seen = vec![];
            let mut status = None;
            let mut identity_reads = 0;
            while let Ok(Some((req, send))) = tokio::time::timeout(Duration::from_millis(300), h.next_request()).await {
                let (method, path) = (req.method().to_string(), req.uri().path().to_string());
                let sent = req.into_body().collect_bytes().await.expect("body");
                let (code, body) = match (method.as_str(), path.as_str()) {
                    ("GET", IDENTITY_PATH) => {
                        identity_reads += 1;
                        if identity_fails_first && identity_reads == 1 {
                            (500, status_error(500, "InternalError"))
                        } else {
                            (200, identity_json.clone())
                        }
                    }
                    ("GET", NS_PATH) => (500, status_error(500, "InternalError")),
                    (_, IDENTITY_PATH) => (200, identity_json.clone()),
                    (_, SECRET_PATH) => (200, secret_json.clone()),
                    ("PATCH", p) if p == format!("{KC_PATH}/status") => {
                        status = Some(serde_json::from_slice::<serde_json::Value>(&sent).unwrap()["status"].clone());
                        (200, kc_json.clone())
                    }
                    _ => (404, status_error(404, "NotFound")),
                };
                seen.push(format!("{method} {path}"));
                send.send_response(
                    Response::builder()
                        .status(code)
                        .body(Body::from(serde_json::to_vec(&body).unwrap()))
                        .unwrap(),
                );
            }
            (seen, status)
        });
        let result = reconcile(Arc::new(kc), ctx).await;
        let (seen, status) = server.await.expect("mock server");
        result.unwrap_or_else(|e| panic!("{case}: reconcile failed: {e}; requests {seen:?}"));
        let writes: Vec<_> = seen
            .iter()
            .filter(|r| !r.starts_with("GET ") && (r.contains("/kaironclusteridentities/") || r.contains("/secrets/")))
            .collect();
        assert!(
            writes.is_empty(),
            "{case}: wrote to the identity or its Secret: {writes:?} (all requests {seen:?})"
        );
        let status = status.unwrap_or_else(|| panic!("{case}: no status written; requests {seen:?}"));
        let ready = condition(&status, READY);
        assert_eq!(ready["reason"], reason::KAIRON_API_UNAVAILABLE, "{case}: {ready}");
        assert!(ready["message"].as_str().unwrap().contains("site-a"), "{case}: {ready}");
    }
}
