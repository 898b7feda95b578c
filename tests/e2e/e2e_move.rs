//! Move: the real `clusterctl move` of a running cluster between two management clusters that
//! share one Kairon API, with the provider installed each way a user installs it — by
//! `clusterctl init` from the release components, and by `helm install` of the chart. The
//! clusters whose managers reach Kairon by flag also have a MachinePool of the shipped
//! `machinepool` flavor: its members' VMs stay, the target's KaironMachines adopt them as any
//! KaironMachine does, and the target's pool scales it.
//!
//! Three API servers per test: the source and the target management clusters (each an `Env`
//! with CAPI core, CABPK and KCP running), and the Kairon API the simulator serves, which both
//! managers reach with `--kairon-kubeconfig` or through an identity. On each management cluster
//! the provider's CRDs, RBAC and Deployment come only from the installation under test (the
//! environment's own copies of our CRDs are removed first); the Deployment cannot run without
//! kubelets, so its manager runs as a process with the Deployment's flags, acting as the
//! installed ServiceAccount. CAPI's providers are registered in clusterctl's inventory the way
//! `clusterctl init` leaves them (a `Provider` each, the clusterctl labels on their CRDs),
//! their controllers running as the environment runs them.
//!
//! The environments are shared by the tests of this file: one Kairon API for all, where each
//! test keeps to a namespace of its own (its simulator watches only that one), and one
//! source/target pair per install kind, the provider installed into it once. The managers of a
//! test watch every namespace, as installed, and the test restarts the source's: the tests of
//! one pair run one after the other ([`Install::serial`]), each leaving the pair without
//! anything of its own for the next test's managers to act on.

use crate::common;
use crate::distribution_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use capkr::api::{KaironClusterIdentity, KaironMachine, KaironMachinePool};
use capkr::kairon::budget::MachineDisruptionBudget;
use capkr::kairon::{self, labels};
use capkr_testenv::cluster::pool_selector;
use capkr_testenv::cluster::{ClusterOptions, all_running_with_a_node, cluster_yaml, scale_machine_deployment};
use capkr_testenv::{
    CapiManagers, Env, EnvOptions, Process, WorkloadCluster, capi_resource, merged_args, parse_yaml_documents, wait_for,
};
use common::{default_sim_args, km_ready};
use distribution_support::{CERT_MANAGER_STUB_CRDS, LocalRepo, VERSION, capi_module, run_ok, stdout};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The management clusters of a move: started, our CRDs removed, CAPI's providers registered as clusterctl init leaves them, the provider installed by clusterctl or helm.
mod install;
use install::*;

/// Waiting on both management clusters: Machines running, VMs settled, a pool adopted.
mod observe;
use observe::*;

const UP: Duration = Duration::from_secs(240);
const CLUSTER: &str = "c1";
/// The workers of the `machinepool` flavor's MachinePool (`--worker-machine-count`).
const POOL_WORKERS: usize = 2;
const PROVIDER_NS: &str = "capkr-system";
const SA: &str = "system:serviceaccount:capkr-system:capkr-manager";
/// Our CRDs, which the environment installs from `config/crd/bases` and the pair's setup
/// removes so that the installation under test provides them.
const OUR_CRDS: [&str; 7] = [
    "kaironclusters.infrastructure.cluster.x-k8s.io",
    "kaironclustertemplates.infrastructure.cluster.x-k8s.io",
    "kaironclusteridentities.infrastructure.cluster.x-k8s.io",
    "kaironmachines.infrastructure.cluster.x-k8s.io",
    "kaironmachinetemplates.infrastructure.cluster.x-k8s.io",
    "kaironmachinepools.infrastructure.cluster.x-k8s.io",
    "kaironmachinepooltemplates.infrastructure.cluster.x-k8s.io",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Install {
    /// `clusterctl init --infrastructure kairon` from the release components.
    Clusterctl,
    /// `helm install` of `charts/cluster-api-provider-kairon`.
    Helm,
}

impl Install {
    fn label(self) -> &'static str {
        match self {
            Install::Clusterctl => "clusterctl",
            Install::Helm => "helm",
        }
    }

    /// Held by a test of this install kind for its whole run: the managers it starts watch
    /// every namespace of the pair and it restarts the source's, so a second test on the same
    /// pair at the same time would see them act on its cluster. The other pair's test may run
    /// beside it.
    fn serial(self) -> &'static tokio::sync::Mutex<()> {
        static CLUSTERCTL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        static HELM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        match self {
            Install::Clusterctl => &CLUSTERCTL,
            Install::Helm => &HELM,
        }
    }
}

/// Move with the provider installed by `clusterctl init`: the target owns every VM afterwards,
/// the restarted source manager deletes none, and scaling and deletion work on the target; the
/// same for a MachinePool's Kairon MachineSet and its VMs.
#[tokio::test(flavor = "multi_thread")]
async fn clusterctl_move_with_clusterctl_init_components_hands_every_vm_to_the_target() {
    move_between_management_clusters(Install::Clusterctl, Reach::Flag).await;
}

/// Move with the provider installed from the Helm chart (no inventory entry of its own: only
/// the chart's CRD labels let clusterctl find our kinds, the pool's among them), the same
/// outcome.
#[tokio::test(flavor = "multi_thread")]
async fn clusterctl_move_with_the_helm_chart_hands_every_vm_to_the_target() {
    move_between_management_clusters(Install::Helm, Reach::Flag).await;
}

/// Move: a cluster whose KaironCluster reaches Kairon through `spec.identityRef` (the managers
/// have no `--kairon-kubeconfig`): the identity Secret moves with the cluster, and the target
/// adopts, scales and deletes through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterctl_move_of_a_cluster_with_an_identity_ref_moves_its_identity_secret() {
    move_between_management_clusters(Install::Helm, Reach::Identity).await;
}

/// Move: a cluster whose KaironCluster names a KaironClusterIdentity, whose Secret is in the
/// provider's namespace: clusterctl copies both to the target (the CRD's `move-hierarchy`
/// label, the identity owning the Secret) and leaves them on the source, released there; the
/// target adopts, scales and deletes through them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterctl_move_of_a_cluster_with_a_shared_identity_copies_the_identity_and_its_secret() {
    move_between_management_clusters(Install::Clusterctl, Reach::SharedIdentity).await;
}

/// How the managers reach the Kairon API.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Reach {
    /// Every cluster's VMs through `--kairon-kubeconfig`.
    Flag,
    /// The cluster's through the Secret its KaironCluster names (`spec.identityRef`).
    Identity,
    /// The cluster's through a KaironClusterIdentity, its Secret in the provider's namespace.
    SharedIdentity,
}

/// The Kairon API the tests share: an API server with the Kairon Machine CRD, no CAPI.
fn kairon_options() -> EnvOptions {
    EnvOptions::new("move-kairon").capi_managers(CapiManagers::NONE)
}

/// The source and the target management clusters of `install`, started side by side by the
/// first test that asks, each with CAPI registered in clusterctl's inventory and our provider
/// installed (the target's adopting from the source, with the chart); `repo` serves that
/// setup.
async fn pair(install: Install, repo: &LocalRepo) -> (&'static Env, &'static Env) {
    let options = |side: &str| EnvOptions::new(format!("move-{}-{side}", install.label()));
    let source = || Env::shared_with(options("source"), move |env| prepare(env, repo, install, None));
    let target = Env::shared_with(options("target"), move |env| async move {
        // The chart takes the source's identity at install time: the source first.
        let source = source().await?;
        let source_id = kube_system_uid(source).await;
        prepare(env, repo, install, Some(&source_id)).await
    });
    let (source, target) = tokio::join!(source(), target);
    (
        source.expect("the source environment"),
        target.expect("the target environment"),
    )
}

/// The setup of one side of a pair, run once. A setup that failed half-way is not tried again
/// on what it left (its namespaces exist, our CRDs are gone): the next test says so instead.
async fn prepare(
    env: &'static Env,
    repo: &LocalRepo,
    install: Install,
    adopt_from: Option<&str>,
) -> anyhow::Result<()> {
    static TRIED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    {
        let mut tried = TRIED.lock().unwrap_or_else(|e| e.into_inner());
        if tried.iter().any(|n| n == env.name()) {
            anyhow::bail!("the setup of {} failed in an earlier test (see its output)", env.name());
        }
        tried.push(env.name().to_string());
    }
    let started = Instant::now();
    register_capi_providers(env).await;
    remove_our_crds(env).await;
    match install {
        Install::Clusterctl => clusterctl_init(repo, env),
        Install::Helm => helm_install(repo, env, adopt_from),
    }
    eprintln!(
        "{}: provider installed ({install:?}) in {:.1}s",
        env.name(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What a test leaves on the environments it shares, also when it fails: its workload API
/// server stopped, and on a failure the environments printed and its Clusters paused, so that
/// the next test's managers (watching every namespace) leave what is left of it alone. Its
/// simulator and managers stop with their `Process`es.
struct Leave {
    envs: [&'static Env; 3],
    source: &'static Env,
    ns: String,
    workload: Option<WorkloadCluster>,
}

impl Drop for Leave {
    fn drop(&mut self) {
        for env in self.envs {
            env.leave_namespace(&self.ns);
        }
        if let Some(w) = &self.workload {
            self.source.stop_workload(w);
        }
    }
}

/// One management cluster: its environment, the test's namespace on it, the manager running
/// with the installed ServiceAccount's identity, and its identity on Kairon.
struct Management {
    env: &'static Env,
    ns: String,
    manager: Process,
    /// `--management-cluster-id`'s default: the UID of `kube-system`.
    id: String,
}

impl Management {
    fn machines(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.env.client(), &self.ns, &capi_resource("Machine", "machines"))
    }
    fn clusters(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.env.client(), &self.ns, &capi_resource("Cluster", "clusters"))
    }
    fn kms(&self) -> Api<KaironMachine> {
        Api::namespaced(self.env.client(), &self.ns)
    }
    fn machine_pools(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.env.client(),
            &self.ns,
            &capi_resource("MachinePool", "machinepools"),
        )
    }
    fn kmps(&self) -> Api<KaironMachinePool> {
        Api::namespaced(self.env.client(), &self.ns)
    }
}

/// Whether a KaironMachine stands for a VM of a pool (its pool owns it).
fn of_a_pool(km: &KaironMachine) -> bool {
    km.owner_references().iter().any(|o| o.kind == "KaironMachinePool")
}

/// The MachinePool of the shipped `machinepool` flavor, as `clusterctl generate cluster
/// --flavor machinepool` writes it with [`POOL_WORKERS`] workers: its KubeadmConfig,
/// KaironMachinePool and MachinePool (`<cluster>-mp-0`), to apply beside the test's cluster.
fn machinepool_flavor_pool(repo: &LocalRepo, ns: &str) -> String {
    let yaml = repo.generate_cluster(CLUSTER, ns, "machinepool");
    let name = format!("{CLUSTER}-mp-0");
    let docs: Vec<serde_json::Value> = parse_yaml_documents(&yaml)
        .unwrap()
        .into_iter()
        .filter(|d| d["metadata"]["name"] == name.as_str())
        .collect();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap_or_default()).collect();
    assert_eq!(
        kinds,
        ["KubeadmConfig", "KaironMachinePool", "MachinePool"],
        "the machinepool flavor's pool"
    );
    let pool = docs.iter().find(|d| d["kind"] == "MachinePool").unwrap();
    assert_eq!(pool["spec"]["replicas"], POOL_WORKERS);
    docs.iter()
        .map(|d| serde_json::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

async fn move_between_management_clusters(install: Install, reach: Reach) {
    let t0 = Instant::now();
    // The test's namespace on all three API servers.
    let ns = match (install, reach) {
        (_, Reach::Identity) => "move-identity",
        (_, Reach::SharedIdentity) => "move-shared",
        (Install::Clusterctl, _) => "move-clusterctl",
        (Install::Helm, _) => "move-helm",
    }
    .to_string();
    let ns = ns.as_str();
    let _serial = install.serial().lock().await;
    let waited = t0.elapsed();
    let repo = LocalRepo::new();
    add_capi_providers(&repo);
    let (kairon_env, (src_env, dst_env)) = tokio::join!(Env::shared(kairon_options()), pair(install, &repo));
    let kairon_env = kairon_env.expect("the Kairon API server");
    let mut leave = Leave {
        envs: [kairon_env, src_env, dst_env],
        source: src_env,
        ns: ns.to_string(),
        workload: None,
    };
    eprintln!(
        "the pair's turn after {:.1}s, environments ready at {:.1}s",
        waited.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    // What an earlier test of the pair left is paused or gone.
    for env in [src_env, dst_env] {
        let clusters: Api<DynamicObject> = Api::all_with(env.client(), &capi_resource("Cluster", "clusters"));
        let running: Vec<String> = clusters
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|c| c.data["spec"]["paused"] != true)
            .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
            .collect();
        assert!(
            running.is_empty(),
            "{}: Clusters of an earlier test: {running:?}",
            env.name()
        );
    }

    // The Kairon API: the namespace of the cluster's VMs, and the simulator with its way into
    // the workload cluster (what a guest's kubelet gets from its bootstrap data), given here
    // once so that it does not depend on which management cluster holds CAPI's Secrets.
    kairon_env.create_namespace(ns).await.unwrap();
    src_env.create_namespace(ns).await.unwrap();
    let workload = src_env.workload_cluster(ns, CLUSTER).await.expect("workload cluster");
    leave.workload = Some(workload.clone());
    let workload_kubeconfig = std::fs::read(workload.kubeconfig_path()).unwrap();
    let sim_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{CLUSTER}-kubeconfig"), "namespace": ns},
        "data": {"value": k8s_openapi::ByteString(workload_kubeconfig)},
    }))
    .unwrap();
    Api::<Secret>::namespaced(kairon_env.client(), ns)
        .create(&PostParams::default(), &sim_secret)
        .await
        .unwrap();
    let sim_args = [default_sim_args(), vec!["--namespace".to_string(), ns.to_string()]].concat();
    let _sim = kairon_env.start_simulator(sim_args).expect("simulator");

    let src_id = kube_system_uid(src_env).await;
    let flag = (reach == Reach::Flag).then(|| kairon_env.kubeconfig_path());
    let src = start_management(src_env, ns, flag, install, None).await;
    let dst = start_management(dst_env, ns, flag, install, Some(&src_id)).await;
    // The identity's name: the KaironClusterIdentity is cluster-scoped, so one a test's own.
    let identity_name = format!("{ns}-identity");
    let identity_name = identity_name.as_str();
    let secrets = |m: &Management| Api::<Secret>::namespaced(m.env.client(), ns);
    if reach == Reach::Identity {
        let identity: Secret = serde_json::from_value(json!({
            "metadata": {"name": identity_name, "namespace": ns},
            "data": {"kubeconfig": k8s_openapi::ByteString(std::fs::read(kairon_env.kubeconfig_path()).unwrap())},
        }))
        .unwrap();
        secrets(&src).create(&PostParams::default(), &identity).await.unwrap();
    }
    let provider_secrets = |m: &Management| Api::<Secret>::namespaced(m.env.client(), PROVIDER_NS);
    let identities = |m: &Management| Api::<KaironClusterIdentity>::all(m.env.client());
    if reach == Reach::SharedIdentity {
        // Made for the identity, and marked so: the identity owns it, and clusterctl copies it.
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": identity_name, "namespace": PROVIDER_NS, "annotations": {
                "infrastructure.cluster.x-k8s.io/owned-by-kaironclusteridentity": identity_name}},
            "data": {"kubeconfig": k8s_openapi::ByteString(std::fs::read(kairon_env.kubeconfig_path()).unwrap())},
        }))
        .unwrap();
        provider_secrets(&src)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let identity: KaironClusterIdentity = serde_json::from_value(json!({
            "metadata": {"name": identity_name},
            "spec": {"secretName": identity_name, "allowedNamespaces": {"list": [ns]}},
        }))
        .unwrap();
        identities(&src)
            .create(&PostParams::default(), &identity)
            .await
            .unwrap();
    }
    assert_ne!(src.id, dst.id, "two management clusters, two identities");
    let vms: Api<kairon::Machine> = Api::namespaced(kairon_env.client(), ns);

    // A running cluster on the source: one control-plane Machine, two workers, and where the
    // managers reach Kairon by flag the machinepool flavor's pool of two more (pools on an
    // identity's Kairon API are not supported yet).
    let pool_workers = if reach == Reach::Flag { POOL_WORKERS } else { 0 };
    let pool_name = format!("{CLUSTER}-mp-0");
    let shape = ClusterOptions {
        workers: 2,
        ..Default::default()
    };
    let mut objects = cluster_yaml(ns, CLUSTER, &workload.host, workload.port, &shape);
    if reach != Reach::Flag {
        let kind = if reach == Reach::Identity {
            "Secret"
        } else {
            "KaironClusterIdentity"
        };
        objects = parse_yaml_documents(&objects)
            .unwrap()
            .into_iter()
            .map(|mut d| {
                if d["kind"] == "KaironCluster" {
                    d["spec"]["identityRef"] = json!({"kind": kind, "name": identity_name});
                }
                serde_json::to_string(&d).unwrap()
            })
            .collect::<Vec<_>>()
            .join("\n---\n");
    }
    if pool_workers > 0 {
        objects = format!("{objects}\n---\n{}", machinepool_flavor_pool(&repo, ns));
    }
    src.env.apply(&objects, Some(ns)).await.expect("cluster objects apply");
    wait_running(&src, 3 + pool_workers).await;
    let before = vm_uids(&vms).await;
    assert_eq!(before.len(), 3 + pool_workers, "one VM per Machine: {before:?}");
    for vm in vms.list(&ListParams::default()).await.unwrap() {
        assert_eq!(
            vm.labels().get(labels::MANAGEMENT_CLUSTER),
            Some(&src.id),
            "created by the source"
        );
    }
    let pool_before = match pool_workers {
        0 => None,
        _ => {
            let members = pool_members(&vms, &pool_name).await;
            assert_eq!(members.len(), pool_workers, "the pool's members: {members:?}");
            Some(members)
        }
    };
    // The cluster's disruption budgets on Kairon, made by the source.
    let budgets: Api<MachineDisruptionBudget> = Api::namespaced(kairon_env.client(), ns);
    let mut budget_names = vec![format!("cp-{CLUSTER}"), format!("workers-{CLUSTER}")];
    budget_names.sort();
    let budgets_of = |id: String| {
        let (budgets, names) = (budgets.clone(), budget_names.clone());
        async move {
            let list = budgets.list(&ListParams::default()).await?.items;
            let mut mine: Vec<(String, String)> = list
                .iter()
                .filter(|b| b.labels().get(labels::MANAGEMENT_CLUSTER) == Some(&id))
                .map(|b| (b.name_any(), b.metadata.uid.clone().unwrap_or_default()))
                .collect();
            mine.sort();
            let named: Vec<&String> = mine.iter().map(|(n, _)| n).collect();
            Ok::<_, kube::Error>((named == names.iter().collect::<Vec<_>>()).then_some(mine))
        }
    };
    let budgets_before = wait("the cluster's budgets made by the source", || {
        budgets_of(src.id.clone())
    })
    .await;
    eprintln!("cluster running on the source at {:.1}s", t0.elapsed().as_secs_f64());

    // The move, with the real clusterctl.
    let moved_at = Instant::now();
    let out = run_ok(
        repo.clusterctl()
            .arg("move")
            .arg("--kubeconfig")
            .arg(src.env.kubeconfig_path())
            .arg("--to-kubeconfig")
            .arg(dst.env.kubeconfig_path())
            .args(["--namespace", ns, "-v", "1"]),
    );
    eprintln!(
        "clusterctl move took {:.1}s:\n{}{}",
        moved_at.elapsed().as_secs_f64(),
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );

    // Nothing of the cluster is left on the source; on the target every KaironMachine adopts
    // the VM it had, and no VM was deleted or duplicated.
    let left = (
        src.clusters().list(&ListParams::default()).await.unwrap().items.len(),
        src.machines().list(&ListParams::default()).await.unwrap().items.len(),
        src.kms().list(&ListParams::default()).await.unwrap().items.len(),
        src.machine_pools()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        src.kmps().list(&ListParams::default()).await.unwrap().items.len(),
    );
    assert_eq!(
        left,
        (0, 0, 0, 0, 0),
        "(Clusters, Machines, KaironMachines, MachinePools, KaironMachinePools) left on the source"
    );
    if reach == Reach::Identity {
        assert!(
            secrets(&src).get_opt(identity_name).await.unwrap().is_none(),
            "the identity Secret left on the source"
        );
        let moved = secrets(&dst).get_opt(identity_name).await.unwrap();
        assert!(moved.is_some(), "the identity Secret did not move to the target");
    }
    if reach == Reach::SharedIdentity {
        let copied = identities(&dst).get_opt(identity_name).await.unwrap();
        let copied_uid = copied
            .and_then(|i| i.metadata.uid)
            .expect("the identity copied to the target");
        let secret = provider_secrets(&dst).get_opt(identity_name).await.unwrap();
        let secret = secret.expect("the identity's Secret copied to the target");
        assert!(
            secret.owner_references().iter().any(|o| o.uid == copied_uid),
            "the copied Secret is owned by the copied identity: {:?}",
            secret.owner_references()
        );
        assert!(
            identities(&src).get_opt(identity_name).await.unwrap().is_some(),
            "left on the source"
        );
        assert!(
            provider_secrets(&src).get_opt(identity_name).await.unwrap().is_some(),
            "left on the source"
        );
        // The source's manager no longer has a cluster on it: it releases the identity.
        wait("the source's identity and Secret released", || async {
            let id = identities(&src).get(identity_name).await?;
            let secret = provider_secrets(&src).get(identity_name).await?;
            Ok::<_, kube::Error>(id.finalizers().is_empty() && secret.finalizers().is_empty())
        })
        .await;
    }
    let adopted = wait("the target's KaironMachines Ready on the VMs they had", || async {
        let kms = dst.kms().list(&ListParams::default()).await?.items;
        let vms = vms.list(&ListParams::default()).await?.items;
        let ready = kms.len() == 3 + pool_workers && kms.iter().all(|k| km_ready(k).is_some_and(|(s, _)| s == "True"));
        // A pool member's VM is adopted by its KaironMachine as any other.
        let owned = vms.iter().all(|v| {
            let uid_label = v.labels().get(labels::KAIRONMACHINE_UID);
            kms.iter()
                .any(|k| k.metadata.uid.as_ref() == uid_label && k.name_any() == v.name_any())
                && v.labels().get(labels::MANAGEMENT_CLUSTER) == Some(&dst.id)
        });
        Ok::<_, kube::Error>((ready && owned).then_some(kms))
    })
    .await;
    eprintln!(
        "target owns every VM {:.1}s after the move started",
        moved_at.elapsed().as_secs_f64()
    );
    assert_eq!(vm_uids(&vms).await, before, "the same VMs, none deleted or duplicated");
    // The budgets were handed over, not deleted and made again.
    let budgets_after = wait("the cluster's budgets taken over by the target", || {
        budgets_of(dst.id.clone())
    })
    .await;
    assert_eq!(budgets_after, budgets_before, "the same budgets (names and UIDs)");
    for km in &adopted {
        assert!(before.contains_key(&km.name_any()), "{}: its VM", km.name_any());
        // Every VM is named by its name, a pool member's as any KaironMachine's.
        assert_eq!(
            km.spec.provider_id.as_deref(),
            Some(format!("kairon://{}", km.name_any()).as_str()),
            "{}: providerID names the same VM",
            km.name_any()
        );
    }
    let all: Vec<String> = adopted.iter().map(|k| k.name_any()).collect();
    let adoptions = Api::<Event>::namespaced(dst.env.client(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("InstanceAdopted"))
        .filter(|e| {
            let name = e.regarding.as_ref().and_then(|r| r.name.as_deref());
            all.iter().any(|s| Some(s.as_str()) == name)
        })
        .count();
    assert_eq!(
        adoptions,
        3 + pool_workers,
        "one InstanceAdopted event per KaironMachine on the target, a pool member's too: {all:?}"
    );
    wait_running(&dst, 3 + pool_workers).await;
    if pool_before.is_some() {
        pool_adopted_by_the_target(&dst, &pool_name, pool_workers).await;
        eprintln!(
            "the target's pool has its members {:.1}s after the move started",
            moved_at.elapsed().as_secs_f64()
        );
    }

    // The source's manager, restarted, finds nothing to act on and deletes nothing: once ready
    // (its caches listed everything), it is given time to act on what it found.
    src.manager.restart().await.unwrap();
    let health = common::port_of(&src.manager, "--health-addr");
    wait("the restarted source manager ready", || async {
        capkr_testenv::http_get(health, "/readyz")
            .await
            .is_ok_and(|r| r.status == 200)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(src.manager.is_running(), "the source manager runs");
    let now = vms.list(&ListParams::default()).await.unwrap().items;
    assert!(
        now.iter().all(|v| v.metadata.deletion_timestamp.is_none()),
        "no VM is being deleted"
    );
    assert_eq!(
        vm_uids(&vms).await,
        before,
        "the restarted source manager deleted nothing"
    );
    let src_log = std::fs::read_to_string(src.manager.log_path()).unwrap_or_default();
    assert!(
        !src_log.contains("deleting Kairon Machine"),
        "the source manager deleted a VM:\n{src_log}"
    );

    if reach == Reach::SharedIdentity {
        wait("the target protects the identity its VMs use", || async {
            let id = identities(&dst).get(identity_name).await?;
            Ok::<_, kube::Error>(
                id.finalizers()
                    .iter()
                    .any(|f| f == "kaironcluster.infrastructure.cluster.x-k8s.io/identity"),
            )
        })
        .await;
    }

    // The pool reconciles on the target: one more worker is one new member, the others kept.
    if let Some(old) = &pool_before {
        let started = Instant::now();
        dst.machine_pools()
            .patch(
                &pool_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": pool_workers + 1}})),
            )
            .await
            .expect("scaling the MachinePool");
        wait_running(&dst, 3 + pool_workers + 1).await;
        let members = wait("the pool's new member", || async {
            let members = pool_members(&vms, &pool_name).await;
            Ok::<_, kube::Error>((members.len() == pool_workers + 1).then_some(members))
        })
        .await;
        let new: Vec<&String> = members.keys().filter(|m| !old.contains_key(*m)).collect();
        assert_eq!(new.len(), 1, "one new VM: {old:?} -> {members:?}");
        assert!(
            old.iter().all(|(n, uid)| members.get(n) == Some(uid)),
            "the pool's VMs from before the move kept: {old:?} -> {members:?}"
        );
        eprintln!(
            "the pool scaled {pool_workers} -> {} on the target in {:.1}s",
            pool_workers + 1,
            started.elapsed().as_secs_f64()
        );
    }
    let pool_now = if pool_workers > 0 { pool_workers + 1 } else { 0 };

    // Scaling on the target, up and down.
    scale(&dst, 3).await;
    settle(&dst, &vms, 4, pool_now).await;
    scale(&dst, 1).await;
    settle(&dst, &vms, 2, pool_now).await;
    let kept: Vec<String> = vm_uids(&vms).await.into_values().collect();
    assert!(
        kept.iter().filter(|u| before.values().any(|b| b == *u)).count() >= 1,
        "the control-plane VM from before the move is still there"
    );

    // Deleting the cluster on the target deletes every VM.
    dst.clusters().delete(CLUSTER, &DeleteParams::default()).await.unwrap();
    wait("the Cluster, its KaironMachines and every VM gone", || async {
        Ok::<_, kube::Error>(
            dst.clusters().get_opt(CLUSTER).await?.is_none()
                && dst.kms().list(&ListParams::default()).await?.items.is_empty()
                && dst.kmps().list(&ListParams::default()).await?.items.is_empty()
                && vms.list(&ListParams::default()).await?.items.is_empty(),
        )
    })
    .await;
    if reach == Reach::SharedIdentity {
        let id = identities(&dst).get(identity_name).await.unwrap();
        let secret = provider_secrets(&dst).get(identity_name).await.unwrap();
        assert!(
            id.finalizers().is_empty() && secret.finalizers().is_empty(),
            "the target's identity keeps a finalizer after its cluster is gone: {:?} {:?}",
            id.finalizers(),
            secret.finalizers()
        );
    }
    if reach == Reach::Identity {
        // On the target the identity was protected while it had VMs, and is released now.
        let identity = secrets(&dst).get(identity_name).await.unwrap();
        assert!(
            identity.finalizers().is_empty(),
            "the identity Secret keeps a finalizer after its cluster is gone: {:?}",
            identity.finalizers()
        );
        assert_eq!(
            vms.list(&ListParams::default()).await.unwrap().items.len(),
            0,
            "VMs left on the identity's Kairon API"
        );
    }
    for m in [&src, &dst] {
        let log = std::fs::read_to_string(m.manager.log_path()).unwrap_or_default();
        assert!(
            !log.to_lowercase().contains("forbidden"),
            "a manager was refused something with the installed RBAC:\n{log}"
        );
    }

    // Nothing of this test is left for the next test's managers on the pair: its namespace
    // (the templates, the moved Secrets) and its KaironClusterIdentity with the Secret, on
    // both sides.
    for m in [&src, &dst] {
        if reach == Reach::SharedIdentity {
            delete_and_wait(&identities(m), identity_name).await;
            delete_and_wait(&provider_secrets(m), identity_name).await;
        }
        delete_and_wait(&Api::<Namespace>::all(m.env.client()), ns).await;
    }
    delete_and_wait(&Api::<Namespace>::all(kairon_env.client()), ns).await;
    eprintln!("done in {:.1}s", t0.elapsed().as_secs_f64());
}
