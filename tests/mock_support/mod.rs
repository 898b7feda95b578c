//! What the mock-server tests share: caches filled by hand, and a mock API server that takes
//! requests one by one, checks each and answers it.

#![allow(dead_code)] // each test file uses its own subset

use std::time::Duration;

use http::{Request, Response, StatusCode};
use kube::client::Body;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tower_test::mock::Handle;

/// A cache holding `objs`, synced.
pub fn filled<K>(objs: Vec<K>) -> (Store<K>, Writer<K>)
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objs {
        writer.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (store, writer)
}

/// Takes the next request, checks method and path, answers with `status` and `body`, and
/// returns the request body.
pub async fn expect(
    handle: &mut Handle<Request<Body>, Response<Body>>,
    method: &str,
    path: &str,
    status: u16,
    body: Value,
) -> (String, Value) {
    let (req, send) = tokio::time::timeout(Duration::from_secs(1), handle.next_request())
        .await
        .unwrap_or_else(|_| panic!("expected {method} {path}, got no request"))
        .expect("service alive");
    assert_eq!(req.method().as_str(), method, "method of request to {}", req.uri());
    assert_eq!(req.uri().path(), path, "path of {method} request");
    let query = req.uri().query().unwrap_or_default().to_string();
    let bytes = req.into_body().collect_bytes().await.expect("body");
    let sent: Value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).expect("JSON body")
    };
    send.send_response(
        Response::builder()
            .status(StatusCode::from_u16(status).unwrap())
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
    (query, sent)
}

/// No further request arrives.
pub async fn expect_no_more(handle: &mut Handle<Request<Body>, Response<Body>>) {
    if let Ok(Some((req, _))) = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await {
        panic!("unexpected request {} {}", req.method(), req.uri());
    }
}

pub fn status_error(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": format!("{reason} (test)")})
}

pub fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} in {status}"))
}

/// Cluster `demo` in `ns`: infrastructure provisioned, control plane initialized, paused or not.
pub fn provisioned_cluster(ns: &str, paused: bool) -> capkr::capi::Cluster {
    use capkr::capi::{Cluster, ClusterInitialization, ClusterSpec, ClusterStatus};
    let mut c = Cluster::new(
        "demo",
        ClusterSpec {
            paused: paused.then_some(true),
            ..Default::default()
        },
    );
    c.metadata.namespace = Some(ns.into());
    c.status = Some(ClusterStatus {
        initialization: Some(ClusterInitialization {
            infrastructure_provisioned: Some(true),
            control_plane_initialized: Some(true),
        }),
        ..Default::default()
    });
    c
}
