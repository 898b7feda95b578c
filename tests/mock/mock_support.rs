//! What the mock-server tests share: the world a reconcile starts in (every cache filled by
//! hand, for any of the reconcilers), and a mock API server that takes requests one by one,
//! checks each and answers it.

use std::future::Future;
use std::time::Duration;

use capkr::api::KaironMachine;
use capkr::controller::{kairon_cluster, kairon_machine, kairon_machine_pool};
use capkr::{capi, kairon};
use http::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::client::Body;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

/// What the caches hold when a reconcile starts. Each reconciler's test context is made from
/// it, on top of that reconciler's `Context::for_request_tests`; a test names the objects it
/// needs and leaves the rest to `..World::default()`.
#[derive(Clone, Default)]
pub struct World {
    pub machines: Vec<capi::Machine>,
    pub clusters: Vec<capi::Cluster>,
    /// Kairon Machines.
    pub instances: Vec<kairon::Machine>,
    /// KaironMachines: a pool's members, a KaironCluster's members.
    pub kaironmachines: Vec<KaironMachine>,
    pub machine_pools: Vec<capi::MachinePool>,
    pub health_checks: Vec<capi::MachineHealthCheck>,
    /// Kairon's Nodes (`None`: not readable, as on a tenant's Kairon API).
    pub nodes: Option<Vec<Node>>,
}

impl World {
    /// The KaironMachine reconciler's context: every request to `client`.
    pub fn machine_context(self, client: Client) -> kairon_machine::Context {
        kairon_machine::Context {
            machines: filled(self.machines.into_iter().map(capi::MachineView::cached).collect()).0,
            clusters: filled(self.clusters).0,
            instances: filled(self.instances.into_iter().map(kairon::Vm::cached).collect()).0,
            health_checks: filled(self.health_checks).0,
            machine_pools: filled(self.machine_pools).0,
            nodes: self.nodes.map(|n| filled(n).0),
            ..kairon_machine::Context::for_request_tests(client)
        }
    }

    /// The KaironCluster reconciler's context: its members are the KaironMachines.
    pub fn cluster_context(self, client: Client) -> kairon_cluster::Context {
        kairon_cluster::Context {
            clusters: filled(self.clusters).0,
            members: filled(self.kaironmachines).0,
            ..kairon_cluster::Context::for_request_tests(client)
        }
    }

    /// The KaironMachinePool reconciler's context.
    pub fn pool_context(self, client: Client) -> kairon_machine_pool::Context {
        kairon_machine_pool::Context {
            machine_pools: filled(self.machine_pools).0,
            clusters: filled(self.clusters).0,
            kaironmachines: filled(self.kaironmachines).0,
            machines: filled(self.machines).0,
            ..kairon_machine_pool::Context::for_request_tests(client)
        }
    }
}

/// Runs `reconcile` with a client whose every request goes to a mock API server that
/// `server` drives; the server must be done within 3 s of the reconcile, without panicking.
/// Returns what the reconcile returned.
pub async fn against<S, SFut, R>(server: S, reconcile: impl FnOnce(Client) -> R) -> R::Output
where
    S: FnOnce(Handle<Request<Body>, Response<Body>>) -> SFut,
    SFut: Future<Output = ()> + Send + 'static,
    R: Future,
{
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(server(handle));
    let result = reconcile(Client::new(service, "default")).await;
    tokio::time::timeout(Duration::from_secs(3), server)
        .await
        .expect("mock server finished")
        .expect("mock server did not panic");
    result
}

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

/// KaironMachine `m1` of cluster `demo` in `ns`, controlled by Machine `m1` (uid
/// `machine-uid`), no VM yet.
pub fn kaironmachine(ns: &str) -> capkr::api::KaironMachine {
    use capkr::api::{KaironMachine, KaironMachineSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let mut km = KaironMachine::new(
        "m1",
        KaironMachineSpec {
            image: capkr::api::MachineImage::from_image_ref("ubuntu-2404-kube-v1.36.3", Some("20Gi")),
            resources: Some(capkr::api::MachineResources::new(2, "4Gi")),
            ..Default::default()
        },
    );
    km.metadata.namespace = Some(ns.into());
    km.metadata.uid = Some("km-uid".into());
    km.metadata.generation = Some(1);
    km.metadata.labels = Some([(capkr::capi::CLUSTER_NAME_LABEL.to_string(), "demo".to_string())].into());
    km.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Machine".into(),
        name: "m1".into(),
        uid: "machine-uid".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    km
}

/// Machine `name` of cluster `demo` in `ns`, bootstrap data in `<name>-bootstrap`, its
/// KaironMachine of the same name; `m1`'s uid is `machine-uid` (what [`kaironmachine`]'s
/// owner reference names), any other's `<name>-uid`.
pub fn machine(ns: &str, name: &str) -> capkr::capi::Machine {
    use capkr::capi::{Bootstrap, ContractVersionedObjectReference, Machine, MachineSpec};
    let mut m = Machine::new(
        name,
        MachineSpec {
            cluster_name: "demo".into(),
            bootstrap: Some(Bootstrap {
                data_secret_name: Some(format!("{name}-bootstrap")),
                ..Default::default()
            }),
            infrastructure_ref: Some(ContractVersionedObjectReference {
                api_group: "infrastructure.cluster.x-k8s.io".into(),
                kind: "KaironMachine".into(),
                name: name.into(),
            }),
            ..Default::default()
        },
    );
    m.metadata.namespace = Some(ns.into());
    m.metadata.uid = Some(if name == "m1" {
        "machine-uid".into()
    } else {
        format!("{name}-uid")
    });
    m
}
