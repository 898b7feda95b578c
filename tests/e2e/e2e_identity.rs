//! Identities (`KaironCluster.spec.identityRef`): one manager, two Kairon API servers (each a
//! kube-apiserver of its own with a simulator), two clusters, each on its own; a shared
//! `KaironClusterIdentity` and the namespaces it allows; what ten endpoints cost; what an
//! identity's creator and a tenant's Kairon API cannot reach (a Secret not made for the
//! identity, the KaironMachines of other namespaces).
//!
//! The tests share the binary's environment, but their managers watch every namespace (as
//! installed): they run one after the other ([`ONE_AT_A_TIME`]), and each ends by deleting the
//! namespaces it made while its manager still runs (what our finalizers hold is released) and
//! stopping the API servers it started, so the next test's manager finds nothing of it.

use crate::common;

use std::time::Duration;

use capkr::api::conditions::{self, READY};
use capkr::api::{AllowedNamespaces, KaironClusterIdentity, KaironClusterIdentitySpec, KaironMachine};
use capkr::kairon;
use capkr_testenv::cluster::{ClusterOptions, all_running_with_a_node, cluster_yaml, scale_machine_deployment};
use capkr_testenv::{Env, WorkloadCluster, merged_args, parse_yaml_documents};
use common::{Rig, RigOptions, default_sim_args};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// One identity shared by the namespaces it allows, ten endpoints at once.
mod shared;

/// What an identity's Secret may be, and whose reconciles a tenant's Kairon API triggers.
mod secrets;

/// An identity repointed to another Kairon API: no VM lost.
mod repoint;

/// The annotation by which whoever writes a Secret of the manager's namespace says which
/// KaironClusterIdentities it was made for: only those become its owners.
const OWNED_BY_IDENTITY: &str = "infrastructure.cluster.x-k8s.io/owned-by-kaironclusteridentity";

const LONG: Duration = Duration::from_secs(240);

/// Held by each test for its whole run: a manager watching every namespace would act on the
/// other test's clusters.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The manager's `--namespace` emptied (the rig's default in a shared environment is the
/// rig's namespace): every namespace, as installed.
fn every_namespace() -> Vec<String> {
    vec!["--namespace".to_string(), String::new()]
}

/// The API servers a test starts beside the rig's workload cluster (Kairon APIs, a second
/// workload cluster): stopped when the test ends, also when it fails.
struct Started<'a> {
    env: &'a Env,
    apis: Vec<WorkloadCluster>,
}

impl<'a> Started<'a> {
    fn new(env: &'a Env) -> Self {
        Started { env, apis: vec![] }
    }
    fn keep(&mut self, api: WorkloadCluster) -> WorkloadCluster {
        self.apis.push(api.clone());
        api
    }
}

impl Drop for Started<'_> {
    fn drop(&mut self) {
        for api in &self.apis {
            self.env.stop_workload(api);
        }
    }
}

/// Fails if a Cluster of the other test is still there and not paused (a failed test pauses
/// its own): its manager would be acting on it beside this test's.
async fn assert_nothing_left(rig: &Rig) {
    let clusters: Api<kube::api::DynamicObject> =
        Api::all_with(rig.env.client(), &capkr_testenv::capi_resource("Cluster", "clusters"));
    let active: Vec<String> = clusters
        .list(&ListParams::default())
        .await
        .expect("list Clusters")
        .items
        .into_iter()
        .filter(|c| c.data["spec"]["paused"] != true)
        .map(|c| {
            format!(
                "{}/{}",
                c.metadata.namespace.unwrap_or_default(),
                c.metadata.name.unwrap_or_default()
            )
        })
        .collect();
    assert!(active.is_empty(), "Clusters of the other test: {active:?}");
}

/// Deletes the rig's namespace and `others` while the manager still runs (it releases what
/// our finalizers hold) and waits until they are gone: nothing of the test is left for the
/// next test's manager.
async fn leave_nothing(rig: &Rig, others: &[&str]) {
    let nss: Api<Namespace> = Api::all(rig.env.client());
    let names: Vec<&str> = std::iter::once(rig.ns.as_str()).chain(others.iter().copied()).collect();
    for ns in &names {
        nss.delete(ns, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting namespace {ns}: {e}"));
    }
    rig.wait(&format!("namespaces {names:?} gone"), LONG, || async {
        for ns in &names {
            if nss.get_opt(ns).await?.is_some() {
                return Ok(false);
            }
        }
        Ok::<_, kube::Error>(true)
    })
    .await;
}

/// A TCP forwarder that can be stopped and started again on the same port: a Kairon API that
/// goes away for a while.
struct Forwarder {
    port: u16,
    upstream: u16,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Forwarder {
    async fn start(upstream: u16) -> Forwarder {
        let port = capkr_testenv::free_port().unwrap();
        let mut f = Forwarder {
            port,
            upstream,
            task: None,
        };
        f.up().await;
        f
    }

    async fn up(&mut self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.unwrap();
        let upstream = self.upstream;
        self.task = Some(tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                conns.spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
            }
        }));
    }

    /// Closes the listener and every open connection (dropping the JoinSet aborts them).
    fn down(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// `api`'s admin kubeconfig as JSON (JSON is YAML), its server moved to `port` if given.
fn kubeconfig(api: &WorkloadCluster, port: Option<u16>) -> Value {
    let text = std::fs::read_to_string(api.kubeconfig_path()).unwrap();
    let mut kc = parse_yaml_documents(&text).unwrap().remove(0);
    if let Some(port) = port {
        kc["clusters"][0]["cluster"]["server"] = json!(format!("https://127.0.0.1:{port}"));
    }
    kc
}

fn identity_secret(name: &str, kubeconfig: &Value) -> Secret {
    let mut s = Secret::default();
    s.metadata.name = Some(name.into());
    s.data = Some(
        [(
            "kubeconfig".to_string(),
            ByteString(serde_json::to_vec(kubeconfig).unwrap()),
        )]
        .into(),
    );
    s
}

/// The test cluster's objects with `spec.identityRef` (a Secret) on the KaironCluster.
fn cluster_with_identity(rig: &Rig, cluster: &str, workload: &WorkloadCluster, identity: &str) -> String {
    cluster_with_identity_of_kind(rig, cluster, workload, "Secret", identity)
}

fn cluster_with_identity_of_kind(
    rig: &Rig,
    cluster: &str,
    workload: &WorkloadCluster,
    kind: &str,
    identity: &str,
) -> String {
    let shape = ClusterOptions {
        workers: 1,
        cp_failure_domain: None,
        md_failure_domain: None,
        health_check: false,
    };
    cluster_of_shape_with_identity(rig, cluster, workload, kind, identity, &shape)
}

fn cluster_of_shape_with_identity(
    rig: &Rig,
    cluster: &str,
    workload: &WorkloadCluster,
    kind: &str,
    identity: &str,
    shape: &ClusterOptions,
) -> String {
    let yaml = cluster_yaml(&rig.ns, cluster, &workload.host, workload.port, shape);
    let docs: Vec<String> = parse_yaml_documents(&yaml)
        .unwrap()
        .into_iter()
        .map(|mut d| {
            if d["kind"] == "KaironCluster" {
                d["spec"]["identityRef"] = json!({"kind": kind, "name": identity});
            }
            serde_json::to_string(&d).unwrap()
        })
        .collect();
    docs.join("\n---\n")
}

fn cluster_of(labels: Option<&std::collections::BTreeMap<String, String>>) -> String {
    labels
        .and_then(|l| l.get(kairon::labels::CLUSTER_NAME))
        .cloned()
        .unwrap_or_default()
}

/// Kairon Machines on `api`, by cluster.
/// A simulator for each of `apis` (a Kairon API of its own each); they stop when dropped.
fn simulators_for(rig: &Rig, apis: &[&WorkloadCluster]) -> Vec<capkr_testenv::Process> {
    apis.iter()
        .map(|api| {
            let args = merged_args(
                default_sim_args(),
                &[format!("--kairon-kubeconfig={}", api.kubeconfig_path().display())],
            );
            rig.env.start_simulator(args).expect("simulator")
        })
        .collect()
}

async fn vms_on(rig: &Rig, api: &WorkloadCluster) -> Vec<(String, String)> {
    let vms: Api<kairon::Machine> = Api::namespaced(api.client(), &rig.ns);
    let mut out: Vec<_> = vms
        .list(&ListParams::default())
        .await
        .expect("list Kairon Machines")
        .items
        .into_iter()
        .map(|v| {
            (
                cluster_of(v.metadata.labels.as_ref()),
                v.metadata.name.unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Waits until `cluster` has `n` Machines, all Running with a nodeRef.
async fn wait_cluster_running(rig: &Rig, cluster: &str, n: usize) {
    let machines = rig.machines();
    let lp = ListParams::default().labels(&format!("cluster.x-k8s.io/cluster-name={cluster}"));
    rig.wait(&format!("{n} Machines of {cluster} Running"), LONG, || async {
        let list = machines.list(&lp).await?;
        Ok::<_, kube::Error>(all_running_with_a_node(&list.items, n))
    })
    .await
}

async fn scale(rig: &Rig, cluster: &str, replicas: usize) {
    scale_machine_deployment(&rig.env.client(), &rig.ns, &format!("{cluster}-md-0"), replicas)
        .await
        .expect("scale");
}

/// Ready of KaironCluster `name`: (status, reason, message).
async fn kc_ready(rig: &Rig, name: &str) -> Option<(String, String, String)> {
    let kc = rig.kcs().get(name).await.ok()?;
    let c = conditions::get(kc.status.as_ref()?.conditions.as_deref()?, READY)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The KaironMachines of `cluster`.
async fn kms_of(rig: &Rig, cluster: &str) -> Vec<KaironMachine> {
    rig.kms()
        .list(&ListParams::default().labels(&format!("cluster.x-k8s.io/cluster-name={cluster}")))
        .await
        .expect("list KaironMachines")
        .items
}

fn ready_reason(km: &KaironMachine) -> Option<String> {
    common::km_ready(km).map(|(s, r)| format!("{s}/{r}"))
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|v| v.parse().unwrap_or(0)))
        })
        .unwrap_or(0)
}

/// Two clusters on two Kairon APIs through identities: both come up, scale and delete with
/// every VM on its own side (none on the management cluster's Kairon); wrong credentials
/// are reported on the cluster and fixed by rotating the Secret, without a restart; an
/// endpoint that goes away is reported on its cluster and machines only, and they recover;
/// the identity Secret cannot go while VMs exist; the endpoints stop when their clusters are
/// gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_on_two_kairon_apis_through_identities() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let rig = Rig::start(RigOptions {
        create: false,
        manager_args: every_namespace(),
        ..RigOptions::new("identity")
    })
    .await;
    let mut started = Started::new(&rig.env);
    assert_nothing_left(&rig).await;
    let manager_pid = rig.manager.pid().expect("manager pid");
    let kairon_a = started.keep(rig.env.kairon_api(&rig.ns, "kairon-a").await.expect("Kairon API a"));
    let kairon_b = started.keep(rig.env.kairon_api(&rig.ns, "kairon-b").await.expect("Kairon API b"));
    let mut forwarder_a = Forwarder::start(kairon_a.port).await;
    // One simulator per Kairon API; they stop when dropped at the end of the test.
    let _sims = simulators_for(&rig, &[&kairon_a, &kairon_b]);
    let c2 = started.keep(rig.env.workload_cluster(&rig.ns, "c2").await.expect("workload c2"));
    let secrets: Api<Secret> = Api::namespaced(rig.env.client(), &rig.ns);
    let a_kubeconfig = kubeconfig(&kairon_a, Some(forwarder_a.port));
    secrets
        .create(&PostParams::default(), &identity_secret("identity-a", &a_kubeconfig))
        .await
        .expect("identity-a");
    // Wrong credentials for b: b's CA (the server is trusted) with a's client certificate.
    let mut wrong = kubeconfig(&kairon_b, None);
    wrong["users"] = a_kubeconfig["users"].clone();
    secrets
        .create(&PostParams::default(), &identity_secret("identity-b", &wrong))
        .await
        .expect("identity-b");
    let client_key = a_kubeconfig["users"][0]["user"]["client-key-data"]
        .as_str()
        .expect("a client key")
        .to_string();
    let rss_before = rss_kib(manager_pid);

    let yaml = format!(
        "{}\n---\n{}",
        cluster_with_identity(&rig, "c1", rig.workload(), "identity-a"),
        cluster_with_identity(&rig, "c2", &c2, "identity-b")
    );
    rig.env.apply(&yaml, Some(&rig.ns)).await.expect("clusters apply");

    // b refuses the credentials: c2 says so (no secret content), c1 comes up regardless.
    let (_, _, why) = rig
        .wait("c2 reports its Kairon API unusable", LONG, || async {
            kc_ready(&rig, "c2")
                .await
                .filter(|(s, r, _)| s == "False" && r == "KaironAPIUnavailable")
        })
        .await;
    assert!(why.contains("identity-b"), "{why}");
    assert!(!why.contains(&client_key[..40]), "no secret content in {why}");
    wait_cluster_running(&rig, "c1", 2).await;
    let rss_one = rss_kib(manager_pid);
    let c2_kms = kms_of(&rig, "c2").await;
    assert!(
        c2_kms.iter().all(|km| km.spec.provider_id.is_none()),
        "no VM for c2 while its credentials are refused"
    );

    // Rotation: the right credentials, picked up without a restart.
    secrets
        .replace("identity-b", &PostParams::default(), &{
            let mut s = secrets.get("identity-b").await.unwrap();
            s.data = identity_secret("x", &kubeconfig(&kairon_b, None)).data;
            s
        })
        .await
        .expect("rotate identity-b");
    wait_cluster_running(&rig, "c2", 2).await;
    let rss_two = rss_kib(manager_pid);
    let restarts = rig.manager.is_running();
    assert!(restarts, "the manager kept running");

    // Each VM on its own side; none on the management cluster's Kairon.
    let check_sides = || async {
        let a = vms_on(&rig, &kairon_a).await;
        let b = vms_on(&rig, &kairon_b).await;
        let local = rig.vm_map().await;
        assert!(a.iter().all(|(c, _)| c == "c1"), "kairon-a: {a:?}");
        assert!(b.iter().all(|(c, _)| c == "c2"), "kairon-b: {b:?}");
        assert!(local.is_empty(), "management Kairon: {:?}", local.keys());
        for (cluster, side, identity) in [("c1", &a, "identity-a"), ("c2", &b, "identity-b")] {
            let kms = kms_of(&rig, cluster).await;
            assert_eq!(kms.len(), side.len(), "{cluster}: one VM per KaironMachine");
            for km in kms {
                let recorded = km
                    .status
                    .as_ref()
                    .and_then(|s| s.instance.as_ref())
                    .and_then(|i| i.identity_ref.as_ref())
                    .map(|r| r.name.clone());
                assert_eq!(recorded.as_deref(), Some(identity), "{:?}", km.metadata.name);
            }
        }
    };
    check_sides().await;

    // Scale both.
    scale(&rig, "c1", 2).await;
    scale(&rig, "c2", 2).await;
    wait_cluster_running(&rig, "c1", 3).await;
    wait_cluster_running(&rig, "c2", 3).await;
    check_sides().await;

    // Kairon API a goes away: c1 and its machines say so; c2 is untouched.
    forwarder_a.down();
    rig.wait("c1 reports its Kairon API unreachable", LONG, || async {
        kc_ready(&rig, "c1")
            .await
            .is_some_and(|(s, r, _)| s == "False" && r == "KaironAPIUnavailable")
    })
    .await;
    rig.wait("c1's KaironMachines report it", LONG, || async {
        let kms = kms_of(&rig, "c1").await;
        kms.iter()
            .all(|km| ready_reason(km).as_deref() == Some("Unknown/KaironAPIUnavailable"))
    })
    .await;
    assert_eq!(kc_ready(&rig, "c2").await.map(|(s, _, _)| s).as_deref(), Some("True"));
    for km in kms_of(&rig, "c2").await {
        assert_eq!(
            ready_reason(&km).as_deref(),
            Some("True/Ready"),
            "{:?}",
            km.metadata.name
        );
    }
    forwarder_a.up().await;
    rig.wait("c1 recovers", LONG, || async {
        let kc_ok = kc_ready(&rig, "c1").await.is_some_and(|(s, _, _)| s == "True");
        let kms = kms_of(&rig, "c1").await;
        kc_ok && kms.iter().all(|km| ready_reason(km).as_deref() == Some("True/Ready"))
    })
    .await;

    // The identity Secret cannot go while VMs exist: its deletion waits on our finalizer.
    let protected = secrets.get("identity-a").await.unwrap();
    assert!(
        protected
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == "kaironcluster.infrastructure.cluster.x-k8s.io/identity"),
        "{:?}",
        protected.metadata.finalizers
    );
    assert_eq!(
        protected
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("clusterctl.cluster.x-k8s.io/move"))
            .map(String::as_str),
        Some(""),
        "moves with the cluster"
    );
    delete_is_only_marked(&secrets, "identity-a").await;
    // The cluster still works on it: scale down removes a VM from a.
    scale(&rig, "c1", 1).await;
    wait_cluster_running(&rig, "c1", 2).await;
    rig.wait("c1 has two VMs on a", LONG, || async {
        vms_on(&rig, &kairon_a).await.len() == 2
    })
    .await;
    check_sides().await;

    // Delete both clusters: every VM goes, on its own side; then the Secret a, and both
    // endpoints stop.
    for c in ["c1", "c2"] {
        rig.clusters()
            .delete(c, &DeleteParams::default())
            .await
            .expect("delete Cluster");
    }
    rig.wait("both clusters gone", LONG, || async {
        rig.clusters()
            .list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await;
    assert!(vms_on(&rig, &kairon_a).await.is_empty());
    assert!(vms_on(&rig, &kairon_b).await.is_empty());
    rig.wait("identity-a released and gone", Duration::from_secs(60), || async {
        secrets.get_opt("identity-a").await.is_ok_and(|s| s.is_none())
    })
    .await;
    let b = secrets.get("identity-b").await.expect("identity-b stays");
    assert!(
        b.metadata.finalizers.iter().flatten().next().is_none(),
        "released: {:?}",
        b.metadata.finalizers
    );
    let log_path = rig.manager.log_path().to_path_buf();
    rig.wait("both endpoints stopped", Duration::from_secs(60), || async {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        log.matches("Kairon endpoint stopped").count() >= 2
    })
    .await;
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        !log.contains(&client_key[..40]),
        "no secret content in the manager's log"
    );
    eprintln!(
        "manager RSS: {rss_before} KiB before any identity, {rss_one} KiB with one endpoint, {rss_two} KiB with two"
    );
    leave_nothing(&rig, &[]).await;
}

/// Watches of Kairon Machines open on `api` (its API server's own gauge).
async fn machine_watches(api: &WorkloadCluster) -> u64 {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = api.client().request_text(req).await.expect("Kairon API /metrics");
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{")
                && l.contains("group=\"kairon.zyvor.dev\"")
                && l.contains("resource=\"machines\"")
                && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Deletes `name`, and checks a few seconds later that it is only marked deleting (a
/// finalizer of ours holds it).
async fn delete_is_only_marked<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.delete(name, &DeleteParams::default()).await.expect("delete");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pending = api.get(name).await.expect("still there");
    assert!(pending.meta().deletion_timestamp.is_some(), "{name} is marked deleting");
}

fn finalizers(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Vec<String> {
    meta.finalizers.clone().unwrap_or_default()
}
