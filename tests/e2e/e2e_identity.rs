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
        cluster_with_identity(&rig, "c1", &rig.workload, "identity-a"),
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

/// A KaironClusterIdentity that an operator shares: its Secret lives in the manager's
/// namespace, out of the cluster owner's reach. A namespace it does not allow gets a condition
/// that says so and no VM (and cannot hold the identity with a finalizer); once the namespace
/// carries the selected label the cluster comes up on the identity's Kairon API. While VMs
/// exist the identity and its Secret cannot go; when the cluster is gone they are released and
/// the Secret, marked as made for the identity, goes with its owner. Then ten identity Secrets for one Kairon API:
/// ten endpoints, ten watches, and what they cost the manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_identity_serves_the_namespaces_it_allows_and_ten_endpoints() {
    const OPS: &str = "capkr-ops";
    const FINALIZER: &str = "kaironcluster.infrastructure.cluster.x-k8s.io/identity";
    let _alone = ONE_AT_A_TIME.lock().await;
    let rig = Rig::start(RigOptions {
        create: false,
        // Ten endpoints in the rig's namespace below: more than the default cap of eight.
        manager_args: [
            every_namespace(),
            vec![
                format!("--identity-secret-namespace={OPS}"),
                "--identity-endpoints-per-namespace=10".to_string(),
            ],
        ]
        .concat(),
        ..RigOptions::new("shared-identity")
    })
    .await;
    let mut started = Started::new(&rig.env);
    assert_nothing_left(&rig).await;
    let manager_pid = rig.manager.pid().expect("manager pid");
    let kairon_s = started.keep(rig.env.kairon_api(&rig.ns, "kairon-s").await.expect("Kairon API s"));
    let _sim = rig
        .env
        .start_simulator(merged_args(
            default_sim_args(),
            &[format!("--kairon-kubeconfig={}", kairon_s.kubeconfig_path().display())],
        ))
        .expect("simulator");
    rig.env.create_namespace(OPS).await.expect("operator namespace");
    let ops_secrets: Api<Secret> = Api::namespaced(rig.env.client(), OPS);
    let s_kubeconfig = kubeconfig(&kairon_s, None);
    // Made for the identity, and marked so: the identity becomes its owner.
    let mut site_s = identity_secret("site-s", &s_kubeconfig);
    site_s.metadata.annotations = Some([(OWNED_BY_IDENTITY.to_string(), "site-s".to_string())].into());
    ops_secrets
        .create(&PostParams::default(), &site_s)
        .await
        .expect("identity Secret");
    let client_key = s_kubeconfig["users"][0]["user"]["client-key-data"]
        .as_str()
        .expect("a client key")
        .to_string();
    let identities: Api<KaironClusterIdentity> = Api::all(rig.env.client());
    let mut identity = KaironClusterIdentity::new(
        "site-s",
        KaironClusterIdentitySpec {
            secret_name: "site-s".into(),
            allowed_namespaces: Some(AllowedNamespaces {
                list: None,
                selector: Some(LabelSelector {
                    match_labels: Some([("kairon.test/site".to_string(), "s".to_string())].into()),
                    match_expressions: None,
                }),
            }),
        },
    );
    identity = identities
        .create(&PostParams::default(), &identity)
        .await
        .expect("KaironClusterIdentity");

    rig.env
        .apply(
            &cluster_with_identity_of_kind(&rig, "c1", &rig.workload, "KaironClusterIdentity", "site-s"),
            Some(&rig.ns),
        )
        .await
        .expect("cluster apply");
    let (_, _, why) = rig
        .wait(
            "c1 reports that the identity does not allow its namespace",
            LONG,
            || async {
                kc_ready(&rig, "c1")
                    .await
                    .filter(|(s, r, m)| s == "False" && r == "KaironAPIUnavailable" && m.contains("does not allow"))
            },
        )
        .await;
    assert!(why.contains("site-s") && why.contains(&rig.ns), "{why}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The simulator's own watches; no endpoint runs yet.
    let base = machine_watches(&kairon_s).await;
    assert!(vms_on(&rig, &kairon_s).await.is_empty(), "no VM while not allowed");
    assert!(
        rig.vm_map().await.is_empty(),
        "nothing on the management cluster's Kairon"
    );
    assert!(
        finalizers(&identities.get("site-s").await.unwrap().metadata).is_empty(),
        "a namespace not allowed cannot hold the identity"
    );
    assert!(kms_of(&rig, "c1").await.iter().all(|km| km.spec.provider_id.is_none()));

    // The operator allows the namespace: the cluster comes up on the identity's Kairon API.
    Api::<k8s_openapi::api::core::v1::Namespace>::all(rig.env.client())
        .patch(
            &rig.ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kairon.test/site": "s"}}})),
        )
        .await
        .expect("label the namespace");
    wait_cluster_running(&rig, "c1", 2).await;
    let vms = vms_on(&rig, &kairon_s).await;
    assert_eq!(vms.len(), 2, "{vms:?}");
    assert!(rig.vm_map().await.is_empty());
    for km in kms_of(&rig, "c1").await {
        let recorded = km
            .status
            .as_ref()
            .and_then(|s| s.instance.as_ref())
            .and_then(|i| i.identity_ref.clone());
        assert_eq!(
            recorded.map(|r| (r.kind, r.name)),
            Some(("KaironClusterIdentity".to_string(), "site-s".to_string()))
        );
    }
    rig.wait("the identity and its Secret are protected", LONG, || async {
        let id = identities.get("site-s").await.ok()?;
        let secret = ops_secrets.get("site-s").await.ok()?;
        let owned = secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "KaironClusterIdentity" && Some(&o.uid) == identity.metadata.uid.as_ref());
        (finalizers(&id.metadata).contains(&FINALIZER.to_string())
            && finalizers(&secret.metadata).contains(&FINALIZER.to_string())
            && owned)
            .then_some(())
    })
    .await;

    // The shipped ClusterClass passes its `identityRef` variable to the KaironCluster.
    let class = std::fs::read_to_string(capkr_testenv::workspace_root().join("templates/clusterclass-kairon.yaml"))
        .expect("the shipped ClusterClass");
    rig.env.apply(&class, Some(&rig.ns)).await.expect("ClusterClass apply");
    let topology = format!(
        r#"apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata:
  name: t1
spec:
  topology:
    classRef:
      name: kairon
    version: {version}
    controlPlane:
      replicas: 1
    variables:
      - name: controlPlaneEndpoint
        value: {{host: 10.0.0.200, port: 6443}}
      - name: machineImage
        value: test-image
      - name: identityRef
        value: {{kind: KaironClusterIdentity, name: site-s}}"#,
        version = capkr_testenv::KUBERNETES_VERSION
    );
    rig.env
        .apply(&topology, Some(&rig.ns))
        .await
        .expect("topology Cluster apply");
    let t1 = rig
        .wait(
            "the KaironCluster of Cluster t1 names the identity and is Ready",
            LONG,
            || async {
                let kcs = rig
                    .kcs()
                    .list(&ListParams::default().labels("cluster.x-k8s.io/cluster-name=t1"))
                    .await
                    .ok()?;
                let kc = kcs.items.into_iter().next()?;
                let r = kc.spec.identity_ref.clone()?;
                let ready = kc_ready(&rig, &kc.metadata.name.clone()?).await?;
                (ready.0 == "True").then_some((r.kind, r.name))
            },
        )
        .await;
    assert_eq!(t1, ("KaironClusterIdentity".to_string(), "site-s".to_string()));
    rig.clusters()
        .delete("t1", &DeleteParams::default())
        .await
        .expect("delete Cluster t1");
    rig.wait("t1 gone", LONG, || async {
        rig.clusters().get_opt("t1").await.is_ok_and(|c| c.is_none())
    })
    .await;

    // Deleting the identity while VMs exist only marks it; the cluster still scales.
    delete_is_only_marked(&identities, "site-s").await;
    scale(&rig, "c1", 2).await;
    wait_cluster_running(&rig, "c1", 3).await;
    assert_eq!(vms_on(&rig, &kairon_s).await.len(), 3);

    // The cluster goes: its VMs, then the identity, then (garbage-collected) its Secret.
    rig.clusters()
        .delete("c1", &DeleteParams::default())
        .await
        .expect("delete Cluster");
    rig.wait("c1 gone", LONG, || async {
        rig.clusters().get_opt("c1").await.is_ok_and(|c| c.is_none())
    })
    .await;
    assert!(vms_on(&rig, &kairon_s).await.is_empty());
    rig.wait("the identity released and gone, its Secret with it", LONG, || async {
        let id_gone = identities.get_opt("site-s").await.is_ok_and(|i| i.is_none());
        let secret_gone = ops_secrets.get_opt("site-s").await.is_ok_and(|s| s.is_none());
        id_gone && secret_gone
    })
    .await;
    rig.wait("the endpoint stopped", Duration::from_secs(60), || async {
        machine_watches(&kairon_s).await == base
    })
    .await;

    // Ten identity Secrets for the same Kairon API: ten endpoints, each its own client and watch.
    let rss_none = rss_kib(manager_pid);
    let secrets: Api<Secret> = Api::namespaced(rig.env.client(), &rig.ns);
    let mut yaml = vec![];
    for i in 0..10 {
        secrets
            .create(
                &PostParams::default(),
                &identity_secret(&format!("e{i}"), &s_kubeconfig),
            )
            .await
            .expect("identity Secret");
        yaml.push(format!(
            r#"apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata:
  name: e{i}
spec:
  infrastructureRef:
    apiGroup: infrastructure.cluster.x-k8s.io
    kind: KaironCluster
    name: e{i}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KaironCluster
metadata:
  name: e{i}
spec:
  controlPlaneEndpoint:
    host: 10.0.0.{i}
    port: 6443
  identityRef:
    kind: Secret
    name: e{i}"#
        ));
    }
    rig.env
        .apply(&yaml.join("\n---\n"), Some(&rig.ns))
        .await
        .expect("ten clusters");
    rig.wait("ten KaironClusters Ready on ten endpoints", LONG, || async {
        let mut ready = 0;
        for i in 0..10 {
            ready += usize::from(
                kc_ready(&rig, &format!("e{i}"))
                    .await
                    .is_some_and(|(s, _, _)| s == "True"),
            );
        }
        ready == 10 && machine_watches(&kairon_s).await == base + 10
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_ten = rss_kib(manager_pid);
    let watches = machine_watches(&kairon_s).await - base;
    assert_eq!(watches, 10, "one watch per endpoint");
    for i in 0..10 {
        rig.clusters()
            .delete(&format!("e{i}"), &DeleteParams::default())
            .await
            .expect("delete Cluster");
    }
    rig.wait("the ten endpoints stopped", LONG, || async {
        machine_watches(&kairon_s).await == base
    })
    .await;
    let log = std::fs::read_to_string(rig.manager.log_path()).unwrap();
    assert!(
        !log.contains(&client_key[..40]),
        "no secret content in the manager's log"
    );
    eprintln!(
        "manager RSS: {rss_none} KiB without endpoints, {rss_ten} KiB with ten ({} KiB per endpoint); {watches} Kairon Machine watches",
        (rss_ten.saturating_sub(rss_none)) / 10
    );
    // The ten clusters are being deleted: the namespace goes once they are.
    leave_nothing(&rig, &[OPS]).await;
}

/// Marks every KaironMachine of `cluster` changed, so that each is reconciled now rather than
/// at its next resync (nothing else triggers one when an identity names another server: the
/// new server's watch has none of their VMs).
async fn poke_kms(rig: &Rig, cluster: &str) {
    let now = format!("{:?}", std::time::SystemTime::now());
    for km in kms_of(rig, cluster).await {
        let _ = rig
            .kms()
            .patch(
                &km.metadata.name.unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"test.kairon/poke": now}}})),
            )
            .await;
    }
}

/// `status.instance` of KaironMachine `name`, as stored (whatever our types know of it).
async fn instance_as_stored(rig: &Rig, name: &str) -> Value {
    let kms: Api<kube::api::DynamicObject> = Api::namespaced_with(
        rig.env.client(),
        &rig.ns,
        &capkr_testenv::infrastructure_resource("KaironMachine", "kaironmachines"),
    );
    kms.get(name).await.expect("KaironMachine").data["status"]["instance"].clone()
}

/// Repointing an identity: the Secret of a running cluster's identity is changed to name the
/// other Kairon API. The VMs live on where they were created, so the machines report that
/// their endpoint changed, keep their last known status (no InstanceNotFound, no Machine
/// remediated by the MachineHealthCheck, which replaces a machine whose infrastructure is not
/// ready for 5 s), and a deleted machine keeps its finalizer while its VM lives on the old
/// server; pointing the identity back makes everything Ready again and lets the deletion
/// finish there. Without the recorded endpoint the machines read as InstanceNotFound on the
/// new server, and a deletion released its finalizer with the VM running on the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repointing_an_identity_to_another_kairon_api_loses_no_vm() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let rig = Rig::start(RigOptions {
        create: false,
        ..RigOptions::new("identity_repoint")
    })
    .await;
    let mut started = Started::new(&rig.env);
    assert_nothing_left(&rig).await;
    let kairon_a = started.keep(rig.env.kairon_api(&rig.ns, "kairon-a").await.expect("Kairon API a"));
    let kairon_b = started.keep(rig.env.kairon_api(&rig.ns, "kairon-b").await.expect("Kairon API b"));
    let _sims = simulators_for(&rig, &[&kairon_a, &kairon_b]);
    let secrets: Api<Secret> = Api::namespaced(rig.env.client(), &rig.ns);
    secrets
        .create(
            &PostParams::default(),
            &identity_secret("identity-a", &kubeconfig(&kairon_a, None)),
        )
        .await
        .expect("identity-a");
    let shape = ClusterOptions {
        workers: 1,
        cp_failure_domain: None,
        md_failure_domain: None,
        health_check: true,
    };
    let yaml = cluster_of_shape_with_identity(&rig, "c1", &rig.workload, "Secret", "identity-a", &shape);
    rig.env.apply(&yaml, Some(&rig.ns)).await.expect("cluster apply");
    wait_cluster_running(&rig, "c1", 2).await;
    let machine_uids = || async {
        let mut uids: Vec<String> = rig
            .machines()
            .list(&ListParams::default())
            .await
            .expect("list Machines")
            .items
            .into_iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter_map(|m| m.metadata.uid)
            .collect();
        uids.sort();
        uids
    };
    let machines_before = machine_uids().await;
    let vms_before = vms_on(&rig, &kairon_a).await;
    assert_eq!(vms_before.len(), 2, "{vms_before:?}");
    // Which endpoint holds each VM is recorded: server, TLS name and CA, as a fingerprint.
    let mut recorded = vec![];
    for km in kms_of(&rig, "c1").await {
        let instance = instance_as_stored(&rig, &km.metadata.name.unwrap()).await;
        recorded.push(instance["endpoint"].as_str().unwrap_or_default().to_string());
    }
    assert!(
        recorded.len() == 2 && !recorded[0].is_empty() && recorded[0] == recorded[1],
        "status.instance records the endpoint of a: {recorded:?}"
    );
    let repoint = |api: &WorkloadCluster| {
        let data = identity_secret("x", &kubeconfig(api, None)).data;
        let secrets = secrets.clone();
        async move {
            let mut s = secrets.get("identity-a").await.unwrap();
            s.data = data;
            secrets
                .replace("identity-a", &PostParams::default(), &s)
                .await
                .expect("repoint identity-a");
        }
    };

    // The identity now names b, where none of c1's VMs are.
    repoint(&kairon_b).await;
    let poked = std::sync::Mutex::new(std::time::Instant::now());
    let poke_now_and_then = || async {
        let due = {
            let mut at = poked.lock().unwrap();
            let due = at.elapsed() >= Duration::from_secs(3);
            if due {
                *at = std::time::Instant::now();
            }
            due
        };
        if due {
            poke_kms(&rig, "c1").await;
        }
    };
    let never_gone = |kms: &[KaironMachine]| {
        for km in kms {
            if let Some((reason, message)) = common::km_instance(km)
                && reason == "InstanceNotFound"
            {
                rig.fail(format!("{:?} reads as gone: {message}", km.metadata.name));
            }
        }
    };
    let message = rig
        .wait("c1's KaironMachines report the changed endpoint", LONG, || async {
            poke_now_and_then().await;
            let kms = kms_of(&rig, "c1").await;
            never_gone(&kms);
            let changed: Vec<String> = kms
                .iter()
                .filter_map(common::km_instance)
                .filter(|(r, _)| r == "InstanceEndpointChanged")
                .map(|(_, m)| m)
                .collect();
            (kms.len() == 2 && changed.len() == 2).then(|| changed[0].clone())
        })
        .await;
    assert!(message.contains("identity-a"), "names the identity: {message}");
    for km in kms_of(&rig, "c1").await {
        let status = km.status.clone().unwrap_or_default();
        assert_eq!(
            ready_reason(&km).as_deref(),
            Some("Unknown/InstanceEndpointChanged"),
            "{:?}",
            km.metadata.name
        );
        assert!(status.is_provisioned(), "the last known status is kept");
        assert!(
            status.instance.is_some_and(|i| i.uid.is_some()),
            "{:?}",
            km.metadata.name
        );
        assert!(!status.addresses.unwrap_or_default().is_empty());
    }
    // Longer than the MachineHealthCheck's 5 s: nothing remediated, no VM anywhere but on a.
    tokio::time::sleep(Duration::from_secs(10)).await;
    never_gone(&kms_of(&rig, "c1").await);
    assert_eq!(machine_uids().await, machines_before, "no Machine replaced");
    assert_eq!(vms_on(&rig, &kairon_a).await, vms_before);
    assert!(vms_on(&rig, &kairon_b).await.is_empty());

    // The worker is deleted: its deletion waits, with the reason, while its VM lives on a.
    scale(&rig, "c1", 0).await;
    let worker = rig
        .wait("the worker's KaironMachine is being deleted", LONG, || async {
            poke_now_and_then().await;
            let kms = kms_of(&rig, "c1").await;
            never_gone(&kms);
            kms.into_iter().find(|km| {
                km.metadata.deletion_timestamp.is_some()
                    && common::km_instance(km).is_some_and(|(r, _)| r == "InstanceEndpointChanged")
            })
        })
        .await;
    let worker_name = worker.metadata.name.clone().unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let worker = rig
        .kms()
        .get_opt(&worker_name)
        .await
        .unwrap()
        .unwrap_or_else(|| rig.fail("the worker's KaironMachine went while its VM lives on the old server"));
    assert!(
        worker
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == capkr::api::MACHINE_FINALIZER),
        "the finalizer is kept"
    );
    assert_eq!(vms_on(&rig, &kairon_a).await, vms_before, "both VMs live on a");

    // Pointed back: the deletion finishes on a, the control plane is Ready again.
    repoint(&kairon_a).await;
    rig.wait("the worker gone from a, the control plane Ready", LONG, || async {
        poke_now_and_then().await;
        let kms = kms_of(&rig, "c1").await;
        never_gone(&kms);
        let a = vms_on(&rig, &kairon_a).await;
        kms.len() == 1 && a.len() == 1 && kms.iter().all(|km| ready_reason(km).as_deref() == Some("True/Ready"))
    })
    .await;
    wait_cluster_running(&rig, "c1", 1).await;
    assert!(vms_on(&rig, &kairon_b).await.is_empty());
    let cp = kms_of(&rig, "c1").await.remove(0);
    let instance = instance_as_stored(&rig, &cp.metadata.name.unwrap()).await;
    assert_eq!(instance["endpoint"].as_str(), Some(recorded[0].as_str()), "a, still");
    assert!(rig.manager.is_running());
    leave_nothing(&rig, &[]).await;
}

/// The annotation by which whoever writes a Secret of the manager's namespace says which
/// KaironClusterIdentities it was made for: only those become its owners.
const OWNED_BY_IDENTITY: &str = "infrastructure.cluster.x-k8s.io/owned-by-kaironclusteridentity";

/// A Cluster and its KaironCluster, nothing else (no control plane, no Machine): enough for
/// the KaironCluster reconciler to use, and protect, the identity it names.
fn bare_cluster(name: &str, kind: &str, identity: &str) -> String {
    format!(
        r#"apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata:
  name: {name}
spec:
  infrastructureRef:
    apiGroup: infrastructure.cluster.x-k8s.io
    kind: KaironCluster
    name: {name}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KaironCluster
metadata:
  name: {name}
spec:
  controlPlaneEndpoint:
    host: 10.0.0.1
    port: 6443
  identityRef:
    kind: {kind}
    name: {identity}"#
    )
}

/// Shared identities naming Secrets of the manager's namespace that were not made for them
/// (an operator's Secrets serving something else): one without owner, and one an earlier
/// version of the manager had already given its identity as owner. While a cluster uses each
/// identity our finalizer holds its Secret, but the identity is never (no longer) its owner,
/// so the identity's deletion leaves the Secret to whoever made it. Before, the manager made
/// every identity the owner of the Secret it named (with the `delete` it holds in its
/// namespace for that): whoever may create a KaironClusterIdentity could have the garbage
/// collector delete any Secret of the manager's namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_cannot_get_a_secret_not_made_for_it_deleted() {
    use k8s_openapi::api::core::v1::ConfigMap;
    const OPS: &str = "capkr-ops-foreign";
    const FINALIZER: &str = "kaironcluster.infrastructure.cluster.x-k8s.io/identity";
    // (identity, its cluster, the Secret it names, whether an earlier version made it owner)
    const CASES: [(&str, &str, &str, bool); 2] = [
        ("borrowed", "c1", "serving-cert", false),
        ("borrowed-earlier", "c2", "earlier-cert", true),
    ];
    let _alone = ONE_AT_A_TIME.lock().await;
    let rig = Rig::start(RigOptions {
        create: false,
        manager_args: [every_namespace(), vec![format!("--identity-secret-namespace={OPS}")]].concat(),
        ..RigOptions::new("identity-foreign-secret")
    })
    .await;
    assert_nothing_left(&rig).await;
    rig.env.create_namespace(OPS).await.expect("operator namespace");
    let ops_secrets: Api<Secret> = Api::namespaced(rig.env.client(), OPS);
    let identities: Api<KaironClusterIdentity> = Api::all(rig.env.client());
    let config_maps: Api<ConfigMap> = Api::namespaced(rig.env.client(), OPS);
    let mut uids = vec![];
    for (identity, cluster, secret, owned_before) in CASES {
        // Whoever may create identities names an operator's Secret made for something else,
        // and allows the rig's namespace.
        let id = KaironClusterIdentity::new(
            identity,
            KaironClusterIdentitySpec {
                secret_name: secret.into(),
                allowed_namespaces: Some(AllowedNamespaces {
                    list: Some(vec![rig.ns.clone()]),
                    selector: None,
                }),
            },
        );
        let id = identities
            .create(&PostParams::default(), &id)
            .await
            .expect("KaironClusterIdentity");
        let id_uid = id.metadata.uid.clone().expect("a UID");
        let owner = json!([{"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KaironClusterIdentity", "name": identity, "uid": id_uid}]);
        let mut meta = json!({"name": secret});
        if owned_before {
            meta["ownerReferences"] = owner.clone();
        }
        let serving: Secret = serde_json::from_value(json!({
            "metadata": meta, "stringData": {"tls.crt": "-----BEGIN CERTIFICATE-----"},
        }))
        .unwrap();
        let serving = ops_secrets
            .create(&PostParams::default(), &serving)
            .await
            .expect("the operator's Secret");
        // Something the identity does own: once the garbage collector has deleted it, it has
        // acted on the identity's deletion.
        let owned: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("owned-by-{identity}"), "ownerReferences": owner},
        }))
        .unwrap();
        config_maps
            .create(&PostParams::default(), &owned)
            .await
            .expect("a ConfigMap the identity owns");
        uids.push((id_uid, serving.metadata.uid.clone().expect("a UID")));
        // A cluster of the allowed namespace uses the identity.
        rig.env
            .apply(&bare_cluster(cluster, "KaironClusterIdentity", identity), Some(&rig.ns))
            .await
            .expect("cluster apply");
    }

    // Each Secret has no kubeconfig, its cluster says so, and the identity and the Secret are
    // held while the cluster exists.
    let mut owners_while_held = vec![];
    for (identity, cluster, secret, _) in CASES {
        let why = rig
            .wait(
                &format!("{cluster} reports that {secret} holds no kubeconfig"),
                LONG,
                || async {
                    kc_ready(&rig, cluster)
                        .await
                        .filter(|(s, r, m)| s == "False" && r == "KaironAPIUnavailable" && m.contains(secret))
                        .map(|(_, _, m)| m)
                },
            )
            .await;
        assert!(why.contains("kubeconfig"), "{why}");
        // The finalizer and the owner references change in one patch: what the Secret has
        // once it is held is what the manager decided.
        let held = rig
            .wait(
                &format!("{identity} and {secret} held while {cluster} uses them"),
                LONG,
                || async {
                    let id = identities.get(identity).await.ok()?;
                    let s = ops_secrets.get(secret).await.ok()?;
                    (finalizers(&id.metadata).contains(&FINALIZER.to_string())
                        && finalizers(&s.metadata).contains(&FINALIZER.to_string()))
                    .then_some(s)
                },
            )
            .await;
        owners_while_held.push(held.metadata.owner_references.clone().unwrap_or_default());
    }

    // The clusters go; then whoever made the identities deletes them.
    for (identity, cluster, secret, _) in CASES {
        rig.clusters()
            .delete(cluster, &DeleteParams::default())
            .await
            .expect("delete Cluster");
        rig.wait(&format!("{identity} and {secret} released"), LONG, || async {
            let id = identities.get(identity).await.ok()?;
            let s = ops_secrets.get(secret).await.ok()?;
            (finalizers(&id.metadata).is_empty() && finalizers(&s.metadata).is_empty()).then_some(())
        })
        .await;
        identities
            .delete(identity, &DeleteParams::default())
            .await
            .expect("delete the identity");
    }
    for ((identity, _, secret, owned_before), ((id_uid, secret_uid), owners)) in
        CASES.into_iter().zip(uids.iter().zip(&owners_while_held))
    {
        rig.wait(
            &format!("the garbage collector has deleted what {identity} owned"),
            LONG,
            || async {
                let id_gone = identities.get_opt(identity).await.is_ok_and(|i| i.is_none());
                let owned_gone = config_maps
                    .get_opt(&format!("owned-by-{identity}"))
                    .await
                    .is_ok_and(|c| c.is_none());
                id_gone && owned_gone
            },
        )
        .await;
        let earlier = if owned_before {
            ", which an earlier version had made its owner"
        } else {
            ""
        };
        match ops_secrets.get_opt(secret).await.expect("read the operator's Secret") {
            None => rig.fail(format!(
                "{secret} was deleted through {identity}{earlier} (its owners while held: {owners:?})"
            )),
            Some(s) if s.metadata.deletion_timestamp.is_some() => rig.fail(format!(
                "{secret} is being deleted through {identity}{earlier} (owners: {:?})",
                s.metadata.owner_references
            )),
            Some(s) => assert_eq!(s.metadata.uid.as_ref(), Some(secret_uid), "the same Secret"),
        }
        assert!(
            !owners.iter().any(|o| &o.uid == id_uid),
            "{identity} was the owner of {secret}, not made for it, while held{earlier}: {owners:?}"
        );
    }
    leave_nothing(&rig, &[OPS]).await;
}

/// How many reconciles of KaironMachine `namespace/name` the manager's log shows (its debug
/// line at the end of each).
fn reconciles_of(rig: &Rig, namespace: &str, name: &str) -> usize {
    let tail = format!(" reconciled obj=KaironMachine.v1alpha1.infrastructure.cluster.x-k8s.io/{name}.{namespace}");
    std::fs::read_to_string(rig.manager.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with(&tail))
        .count()
}

/// A tenant's Kairon API (its own, named by the identity Secret of its namespace) holds a
/// Kairon Machine labelled for a KaironMachine of another namespace, and one labelled for a
/// KaironMachine of its own: the first never reconciles the other namespace's KaironMachine,
/// the second reconciles the tenant's. Before, the endpoint's watch turned every Kairon
/// Machine's link-back labels into a reconcile of whatever KaironMachine they named, in any
/// namespace the manager serves: no data crossed, but a tenant could spend the manager's
/// reconciles (and their requests) on anyone's machines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_kairon_api_triggers_reconciles_only_in_its_own_namespace() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let rig = Rig::start(RigOptions {
        create: false,
        manager_args: every_namespace(),
        ..RigOptions::new("identity-endpoint-scope")
    })
    .await;
    let mut started = Started::new(&rig.env);
    assert_nothing_left(&rig).await;
    let kairon_t = started.keep(rig.env.kairon_api(&rig.ns, "kairon-t").await.expect("Kairon API t"));
    let other = format!("{}-other", rig.ns);
    rig.env.create_namespace(&other).await.expect("the other namespace");
    let secrets: Api<Secret> = Api::namespaced(rig.env.client(), &rig.ns);
    secrets
        .create(
            &PostParams::default(),
            &identity_secret("tenant-t", &kubeconfig(&kairon_t, None)),
        )
        .await
        .expect("the tenant's identity Secret");
    rig.env
        .apply(&bare_cluster("c1", "Secret", "tenant-t"), Some(&rig.ns))
        .await
        .expect("cluster apply");
    rig.wait("c1 Ready on the tenant's Kairon API", LONG, || async {
        kc_ready(&rig, "c1").await.is_some_and(|(s, _, _)| s == "True")
    })
    .await;

    // A KaironMachine in each namespace, without owner Machine: a reconcile of it reads the
    // caches, logs and returns, and nothing but a trigger reconciles it again.
    for ns in [rig.ns.as_str(), other.as_str()] {
        let km: KaironMachine = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironMachine",
            "metadata": {"name": "km", "namespace": ns},
            "spec": {"image": {"imageRef": "img", "diskSize": "10Gi"}, "resources": {"cpu": 1, "memory": "1Gi"}}
        }))
        .unwrap();
        Api::<KaironMachine>::namespaced(rig.env.client(), ns)
            .create(&PostParams::default(), &km)
            .await
            .expect("a KaironMachine");
    }
    let (own_before, other_before) = rig
        .wait("both KaironMachines reconciled once", LONG, || async {
            let own = reconciles_of(&rig, &rig.ns, "km");
            let theirs = reconciles_of(&rig, &other, "km");
            (own >= 1 && theirs >= 1).then_some((own, theirs))
        })
        .await;

    // On the tenant's Kairon API, in the tenant's namespace: a Kairon Machine labelled for the
    // other namespace's KaironMachine, then one labelled for the tenant's own.
    let vms: Api<kube::api::DynamicObject> = Api::namespaced_with(
        kairon_t.client(),
        &rig.ns,
        &capkr_testenv::api_resource("kairon.zyvor.dev", "v1alpha1", "Machine", "machines"),
    );
    let vm = |name: &str, ns: &str| -> kube::api::DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "Machine",
            "metadata": {"name": name, "labels": {
                "app.kubernetes.io/managed-by": "cluster-api-provider-kairon",
                "infrastructure.cluster.x-k8s.io/kaironmachine-name": "km",
                "infrastructure.cluster.x-k8s.io/kaironmachine-namespace": ns}},
            "spec": {"resources": {"cpu": "1", "memory": "1Gi"}, "image": {"imageRef": "img", "diskSize": "10Gi"}}
        }))
        .unwrap()
    };
    vms.create(&PostParams::default(), &vm("for-the-other", &other))
        .await
        .expect("the Kairon Machine for the other namespace");
    vms.create(&PostParams::default(), &vm("for-the-tenant", &rig.ns))
        .await
        .expect("the Kairon Machine for the tenant's namespace");
    // The endpoint's watch delivers its events in order: once the second has reconciled the
    // tenant's KaironMachine, the first has been mapped (or dropped).
    let own_after_create = rig
        .wait(
            "the tenant's KaironMachine reconciled by its Kairon Machine",
            LONG,
            || async {
                let n = reconciles_of(&rig, &rig.ns, "km");
                (n > own_before).then_some(n)
            },
        )
        .await;
    // Once more, both changed in the same order: a reconcile the first event started is long
    // done when the second round's has come back.
    let touch = json!({"metadata": {"labels": {"test.kairon/touched": "yes"}}});
    for name in ["for-the-other", "for-the-tenant"] {
        vms.patch(name, &PatchParams::default(), &Patch::Merge(&touch))
            .await
            .expect("touch a Kairon Machine");
    }
    rig.wait("the tenant's KaironMachine reconciled again", LONG, || async {
        reconciles_of(&rig, &rig.ns, "km") > own_after_create
    })
    .await;
    let other_after = reconciles_of(&rig, &other, "km");
    assert_eq!(
        other_after, other_before,
        "the other namespace's KaironMachine was reconciled because of the tenant's Kairon API"
    );
    leave_nothing(&rig, &[other.as_str()]).await;
}
