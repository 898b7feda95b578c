//! Part 4's peer: the same cluster shape and scale on the same CAPI core, with the manager of
//! Cluster API's Docker provider (CAPD) and its in-memory backend (`DevCluster`, `DevMachine`
//! with `backend.inMemory`), the provider CAPI runs its own scale tests with. Its "machines"
//! are objects in memory, and each cluster's API server and etcd are fakes served from the
//! CAPD process itself, so it shows what CAPI core plus a provider that does next to nothing
//! costs; capkr-manager is measured against it with the same figures in the same run.
//!
//! CAPD's manager is built from the Go module `tests/capi-e2e` (which pins
//! `sigs.k8s.io/cluster-api/test`) by `hack/capd-manager.sh` into a cache outside the source
//! tree, with its CRDs next to it; `CAPD_MANAGER_DIR` names such a directory instead.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use capkr_testenv::audit::{AUDIT_POLICY_METADATA_RESPONSES, AuditEvent};
use capkr_testenv::cluster::{ClusterOptions, Infrastructure, cluster_yaml_of};
use capkr_testenv::{
    Env, EnvOptions, Process, ProcessSpec, Signal, api_resource, capi_resource, free_port, http_get,
    parse_yaml_documents, workspace_root,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::Value;

use crate::full_capi::{Under, scale, wait_running};
use crate::results::{FullCapiRun, PerMachine};

const NAMESPACE: &str = "bench-capd";
const CLUSTER: &str = "capd";

/// CAPD's User-Agent is `<command>/<version> <controller name> (<os>/<arch>) cluster.x-k8s.io/<commit>`,
/// the command being the binary's file name.
pub const CAPD_USER_AGENT_PREFIX: &str = "capd-manager/";
pub const CAPD_CONTROLLER_NAME: &str = " cluster-api-docker-controller-manager ";

/// CAPD's requests that count, as for capkr-manager: no Leases, no `GET /version`.
pub fn is_capd_request(e: &AuditEvent) -> bool {
    e.from_agent(CAPD_USER_AGENT_PREFIX, None)
        && e.user_agent.contains(CAPD_CONTROLLER_NAME)
        && !e.is_lease()
        && e.resource_path() != "/version"
}

/// The directory holding `capd-manager` and `crd/`: `CAPD_MANAGER_DIR`, or what
/// `hack/capd-manager.sh` built (a cached build takes a moment; a fresh one, minutes).
pub fn capd_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CAPD_MANAGER_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        if !dir.join("capd-manager").is_file() {
            bail!("CAPD_MANAGER_DIR={} holds no capd-manager", dir.display());
        }
        return Ok(dir);
    }
    let script = workspace_root().join("hack/capd-manager.sh");
    let out = Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .last()
        .ok_or_else(|| anyhow!("{} printed nothing", script.display()))?;
    Ok(PathBuf::from(last.trim()))
}

/// The flags CAPD's manager runs with here besides the environment's kubeconfig, ports and
/// certificates: its defaults otherwise (client limit 100/200, 50 DevMachine workers).
pub fn capd_args() -> Vec<String> {
    [
        "--leader-elect=false",
        "--diagnostics-address=0",
        "--skip-crd-migration-phases=StorageVersionMigration,CleanupManagedFields",
    ]
    .map(String::from)
    .to_vec()
}

/// CAPD's manager from scaling the MachineDeployment of a cluster with one control-plane
/// Machine from 0 to `n`, in a fresh environment with CAPI's managers.
pub async fn run(capd: &Path, n: usize, quiet: Duration) -> Result<FullCapiRun> {
    let env =
        Env::start(EnvOptions::new(format!("bench-capd-{n}")).audit_policy(AUDIT_POLICY_METADATA_RESPONSES)).await?;
    crate::explain_failure(&env, n, run_in(&env, capd, n, quiet).await)
}

async fn run_in(env: &Env, capd: &Path, n: usize, quiet: Duration) -> Result<FullCapiRun> {
    install_crds(env, &capd.join("crd")).await?;
    env.create_namespace(NAMESPACE).await?;
    let manager = start(env, capd).await?;
    let result = async {
        let pid = manager.pid().ok_or_else(|| anyhow!("CAPD's manager has no pid"))?;
        let t_cp = Instant::now();
        env.apply(&cluster_yaml(NAMESPACE, CLUSTER), Some(NAMESPACE))
            .await
            .context("creating the cluster")?;
        let machines: Api<DynamicObject> =
            Api::namespaced_with(env.client(), NAMESPACE, &capi_resource("Machine", "machines"));
        wait_running(&machines, 1, Duration::from_secs(180)).await?;
        let control_plane = t_cp.elapsed();
        let under = Under {
            name: "capd-manager",
            others: vec![],
            pid,
            is_provider: is_capd_request,
            infra: api_resource(
                "infrastructure.cluster.x-k8s.io",
                "v1beta2",
                "DevMachine",
                "devmachines",
            ),
            vm_group: None,
        };
        let scaled = scale(env, NAMESPACE, &format!("{CLUSTER}-md-0"), n, &under, quiet).await?;
        let run = FullCapiRun {
            n,
            manager_args: capd_args(),
            control_plane_s: control_plane.as_secs_f64(),
            scale_s: scaled.scale_s,
            per_machine: PerMachine::of(&scaled.requests, n),
            requests: scaled.requests,
            peak_rss_mib: scaled.peak_rss_mib,
            cpu_s: scaled.cpu_s,
            phases: scaled.phases,
            environment_cpu_s: scaled.environment_cpu_s,
        };
        eprintln!(
            "capkr-bench: CAPD in-memory, 0 -> {n} workers: {:.1}s ({:.2} CAPD writes per machine)",
            run.scale_s, run.per_machine.writes
        );
        Ok::<_, anyhow::Error>(run)
    }
    .await;
    if result.is_err() {
        eprintln!("capkr-bench: CAPD's log:\n{}", manager.log_tail(60));
    }
    manager.kill(Signal::Term).await?;
    result
}

/// Starts CAPD's manager against `env` and waits until it is ready. Its webhooks are served
/// with the environment's webhook certificate but not registered: the benchmark's objects are
/// written complete. The in-memory backend listens on fixed ports (19000 for its debug
/// server, 20000 and up for the clusters' API servers) on 127.0.0.1 (`POD_IP`).
async fn start(env: &Env, capd: &Path) -> Result<Process> {
    let health = free_port()?;
    let mut args = vec![
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--webhook-port={}", free_port()?),
        format!("--webhook-cert-dir={}", env.dir().join("webhook-certs").display()),
        format!("--health-addr=127.0.0.1:{health}"),
    ];
    args.extend(capd_args());
    let spec = ProcessSpec::new("capd-manager", capd.join("capd-manager"), &env.log_dir())
        .args(args)
        .env("POD_IP", "127.0.0.1");
    let p = Process::spawn(spec)?;
    let start = Instant::now();
    loop {
        if let Some(status) = p.try_exit_status() {
            bail!("CAPD's manager: {}", p.exit_report(status, 40));
        }
        if matches!(http_get(health, "/readyz").await.map(|r| r.status), Ok(200)) {
            return Ok(p);
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("CAPD's manager not ready after 60s:\n{}", p.log_tail(40));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// CAPD's CRDs, labelled with the contract version CAPI core looks for (kustomize adds the
/// label in CAPD's own manifests).
async fn install_crds(env: &Env, dir: &Path) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    let mut names = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        for mut doc in parse_yaml_documents(&text)? {
            if doc["kind"] != "CustomResourceDefinition" {
                continue;
            }
            doc["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"] = Value::from("v1beta2");
            let crd: CustomResourceDefinition = serde_json::from_value(doc)?;
            names.push(crd.metadata.name.clone().unwrap_or_default());
            crds.create(&PostParams::default(), &crd)
                .await
                .with_context(|| format!("creating {}", f.display()))?;
        }
    }
    let start = Instant::now();
    for name in names {
        loop {
            let crd = crds.get(&name).await?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
            if established {
                break;
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("CRD {name} not Established after 30s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// The in-memory backend's timings: everything at once, as the simulator runs here (a machine's
/// spec, indented as under a machine).
const IN_MEMORY: &str = "  backend:
    inMemory:
      vm:
        provisioning:
          startupDuration: 0s
      node:
        provisioning:
          startupDuration: 0s
      apiServer:
        provisioning:
          startupDuration: 0s
      etcd:
        provisioning:
          startupDuration: 0s";

/// CAPD's in-memory kinds for the shape of `capkr_testenv::cluster::cluster_yaml_of`: a
/// DevCluster, DevMachines and a DevMachineTemplate with `backend.inMemory`.
pub fn in_memory() -> Infrastructure {
    Infrastructure {
        api_version: "infrastructure.cluster.x-k8s.io/v1beta2".into(),
        cluster_kind: "DevCluster".into(),
        machine_kind: "DevMachine".into(),
        machine_template_kind: "DevMachineTemplate".into(),
        // CAPD's in-memory backend records its listener in an annotation and expects the map
        // to exist (the topology controller always sets some).
        cluster_annotations: "bench.capkr.zyvor.dev/shape: one-control-plane-machine".into(),
        cluster_spec: "  backend:\n    inMemory: {}".into(),
        machine_spec: IN_MEMORY.into(),
        provider_id: false,
    }
}

/// The cluster of the benchmark with CAPD's in-memory kinds: one control-plane Machine with
/// kubeadm init data and a MachineDeployment of 0 workers with join data.
pub fn cluster_yaml(namespace: &str, cluster: &str) -> String {
    let shape = ClusterOptions {
        workers: 0,
        ..ClusterOptions::default()
    };
    cluster_yaml_of(namespace, cluster, &in_memory(), &shape)
}
