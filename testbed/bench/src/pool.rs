//! Part 6, MachinePool against MachineDeployment: the same cluster as part 4 (one
//! control-plane Machine, the real CAPI core, kubeadm bootstrap and control plane managers, a
//! workload API server where the simulated guests register their Nodes), its N workers once
//! as a MachineDeployment and once as a MachinePool of a KaironMachinePool (one KaironMachine,
//! so one plain Kairon Machine, per member), each in a fresh environment, one after the other.
//! Timed from the scale 0 → N until every Machine runs with a nodeRef, every Node is Ready and
//! the owner counts N ready replicas; the manager's requests from the scale until it went quiet.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use capkr_testenv::audit::{AUDIT_POLICY_METADATA_RESPONSES, AuditEvent, RequestCounts};
use capkr_testenv::cluster::{
    ClusterOptions, Infrastructure, all_running_with_a_node, cluster_yaml, machine_pool_yaml, running_with_a_node,
};
use capkr_testenv::{Env, EnvOptions, Signal, WorkloadCluster, capi_resource, infrastructure_resource};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::full_capi::{manager_args, simulator_args, wait_running};
use crate::procstat::{cpu_seconds, peak_rss_kib};
use crate::provider::{health_port, mib, wait_ready};
use crate::results::{PerMachine, PoolComparison, PoolPathRun};
use crate::traffic::{Traffic, is_manager_request};

const NAMESPACE: &str = "bench-pool";
const CLUSTER: &str = "pool";

/// How the N workers are owned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workers {
    MachineDeployment,
    MachinePool,
}

impl Workers {
    pub fn name(self) -> &'static str {
        match self {
            Workers::MachineDeployment => "MachineDeployment",
            Workers::MachinePool => "MachinePool",
        }
    }

    /// The owner's name: `<cluster>-md-0` of the test cluster, or the pool beside it.
    fn owner(self) -> String {
        match self {
            Workers::MachineDeployment => format!("{CLUSTER}-md-0"),
            Workers::MachinePool => format!("{CLUSTER}-mp-0"),
        }
    }

    fn owner_api(self, env: &Env) -> Api<DynamicObject> {
        let ar = match self {
            Workers::MachineDeployment => capi_resource("MachineDeployment", "machinedeployments"),
            Workers::MachinePool => capi_resource("MachinePool", "machinepools"),
        };
        Api::namespaced_with(env.client(), NAMESPACE, &ar)
    }
}

/// Both paths at `n` workers, the MachineDeployment first, each in a fresh environment.
pub async fn run(n: usize, quiet: Duration) -> Result<PoolComparison> {
    let measured_at = k8s_openapi::jiff::Timestamp::now().to_string();
    let deployment = run_path(Workers::MachineDeployment, n, quiet).await?;
    let pool = run_path(Workers::MachinePool, n, quiet).await?;
    Ok(PoolComparison {
        n,
        measured_at,
        git_commit: String::new(),
        deployment,
        pool,
    })
}

async fn run_path(workers: Workers, n: usize, quiet: Duration) -> Result<PoolPathRun> {
    eprintln!("capkr-bench: {} 0 -> {n}", workers.name());
    let label = match workers {
        Workers::MachineDeployment => "md",
        Workers::MachinePool => "mp",
    };
    let env =
        Env::start(EnvOptions::new(format!("bench-pool-{label}-{n}")).audit_policy(AUDIT_POLICY_METADATA_RESPONSES))
            .await?;
    crate::explain_failure(&env, n, run_in(&env, workers, n, quiet).await)
        .with_context(|| format!("{} 0 -> {n}", workers.name()))
}

async fn run_in(env: &Env, workers: Workers, n: usize, quiet: Duration) -> Result<PoolPathRun> {
    env.create_namespace(NAMESPACE).await?;
    let workload = env.workload_cluster(NAMESPACE, CLUSTER).await?;
    let sim = env.start_simulator(simulator_args())?;
    let manager = env.start_manager(manager_args())?;
    wait_ready(&manager, health_port(&manager)?, Duration::from_secs(60)).await?;
    let pid = manager.pid().ok_or_else(|| anyhow!("the manager has no pid"))?;

    // Both clusters have the test cluster's MachineDeployment; the pool's has it at 0 and the
    // pool beside it, made with the same VM shape and the same kubeadm join.
    let shape = ClusterOptions {
        workers: 0,
        ..ClusterOptions::default()
    };
    let mut yaml = cluster_yaml(NAMESPACE, CLUSTER, &workload.host, workload.port, &shape);
    if workers == Workers::MachinePool {
        let spec = Infrastructure::kairon(&workload.host, workload.port).machine_spec;
        yaml.push_str("\n---\n");
        yaml.push_str(&machine_pool_yaml(NAMESPACE, CLUSTER, 0, &spec));
    }
    let t_cp = Instant::now();
    env.apply(&yaml, Some(NAMESPACE))
        .await
        .context("creating the cluster")?;
    let machines: Api<DynamicObject> =
        Api::namespaced_with(env.client(), NAMESPACE, &capi_resource("Machine", "machines"));
    wait_running(&machines, 1, Duration::from_secs(180)).await?;
    let control_plane_s = t_cp.elapsed().as_secs_f64();
    if workers == Workers::MachinePool {
        wait_pool_provisioned(env, &workers.owner(), Duration::from_secs(120)).await?;
    }

    let mut traffic = Traffic::from_now(env)?;
    traffic
        .until_quiet(is_manager_request, quiet, Duration::from_secs(30))
        .await?;
    let cpu0 = cpu_seconds(pid)?;
    let t0 = Instant::now();
    workers
        .owner_api(env)
        .patch(
            &workers.owner(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": n}})),
        )
        .await
        .with_context(|| format!("scaling the {}", workers.name()))?;
    let done = wait_up(env, &workload, workers, n, t0, Duration::from_secs(180 + 3 * n as u64)).await?;
    let (events, quiet_reached) = traffic
        .until_quiet_keeping(|e| !e.is_lease(), is_manager_request, quiet, Duration::from_secs(120))
        .await?;
    let requests = RequestCounts::of(&events, is_manager_request);
    let run = PoolPathRun {
        n,
        workers: workers.name().to_string(),
        manager_args: manager_args(),
        control_plane_s,
        running_s: done.running_s,
        nodes_ready_s: done.nodes_ready_s,
        ready_replicas_s: done.ready_replicas_s,
        scale_s: done.running_s.max(done.nodes_ready_s).max(done.ready_replicas_s),
        per_machine: PerMachine::of(&requests, n),
        requests,
        by_client: per_client(&events, n),
        one_machine: one_machine_writes(&events),
        peak_rss_mib: mib(peak_rss_kib(pid)?),
        cpu_s: cpu_seconds(pid)? - cpu0,
        quiet: quiet_reached,
    };
    eprintln!(
        "capkr-bench: {} 0 -> {n}: {:.1}s ({:.2} manager requests, {:.2} writes per machine, peak RSS {:.1} MiB)",
        run.workers, run.scale_s, run.per_machine.requests, run.per_machine.writes, run.peak_rss_mib
    );
    manager.kill(Signal::Term).await?;
    sim.kill(Signal::Term).await?;
    Ok(run)
}

/// Waits until the KaironMachinePool is provisioned (it can make members): what a MachinePool
/// of 0 has before it is scaled.
async fn wait_pool_provisioned(env: &Env, pool: &str, timeout: Duration) -> Result<()> {
    let kmps: Api<DynamicObject> = Api::namespaced_with(
        env.client(),
        NAMESPACE,
        &infrastructure_resource("KaironMachinePool", "kaironmachinepools"),
    );
    let start = Instant::now();
    loop {
        if let Some(kmp) = kmps.get_opt(pool).await?
            && kmp.data["status"]["initialization"]["provisioned"] == true
        {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!("KaironMachinePool {pool} not provisioned after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// When, after the scale, each of the three ends was first seen.
struct Up {
    running_s: f64,
    nodes_ready_s: f64,
    ready_replicas_s: f64,
}

/// Polls until all `n + 1` Machines run with a nodeRef, all `n + 1` Nodes of the workload
/// cluster are Ready and the owner's `status.readyReplicas` is `n`; each time is taken the
/// first time its condition held (it stays so: nothing scales in).
async fn wait_up(
    env: &Env,
    workload: &WorkloadCluster,
    workers: Workers,
    n: usize,
    t0: Instant,
    timeout: Duration,
) -> Result<Up> {
    let machines: Api<DynamicObject> =
        Api::namespaced_with(env.client(), NAMESPACE, &capi_resource("Machine", "machines"));
    let nodes: Api<Node> = Api::all(workload.client());
    let owners = workers.owner_api(env);
    let owner = workers.owner();
    let (mut running, mut nodes_ready, mut replicas) = (None, None, None);
    loop {
        let now = || Some(t0.elapsed().as_secs_f64());
        if running.is_none() {
            let list = machines.list(&ListParams::default()).await?;
            if all_running_with_a_node(&list.items, n + 1) {
                running = now();
            }
        }
        if nodes_ready.is_none() {
            let list = nodes.list(&ListParams::default()).await?;
            if list.items.len() == n + 1 && list.items.iter().all(node_ready) {
                nodes_ready = now();
            }
        }
        if replicas.is_none() {
            let o = owners.get(&owner).await?;
            if o.data["status"]["readyReplicas"].as_u64() == Some(n as u64) {
                replicas = now();
            }
        }
        if let (Some(running_s), Some(nodes_ready_s), Some(ready_replicas_s)) = (running, nodes_ready, replicas) {
            return Ok(Up {
                running_s,
                nodes_ready_s,
                ready_replicas_s,
            });
        }
        if t0.elapsed() > timeout {
            let list = machines.list(&ListParams::default()).await?;
            let up = list.items.iter().filter(|m| running_with_a_node(m)).count();
            bail!(
                "after {timeout:?}: {up} of {} Machines Running with a nodeRef (wanted {}), Nodes Ready: {}, \
                 {} readyReplicas {}",
                list.items.len(),
                n + 1,
                nodes_ready.is_some(),
                workers.name(),
                replicas.is_some()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The manager's writes naming one worker (the first KaironMachine by name whose status it
/// wrote; its VM and its Machine carry the same name, its Events start with it), in order, as
/// `verb resource`: where a path's writes per machine come from.
fn one_machine_writes(events: &[AuditEvent]) -> Vec<String> {
    let writes: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| is_manager_request(e) && e.counts_request() && e.is_write())
        .collect();
    let name_of = |e: &AuditEvent| e.object_ref.as_ref().and_then(|r| r.name.clone());
    let Some(name) = writes
        .iter()
        .filter(|e| e.resource_path() == "kaironmachines.infrastructure.cluster.x-k8s.io/status")
        .filter_map(|e| name_of(e))
        .min()
    else {
        return Vec::new();
    };
    let event_prefix = format!("{name}.");
    writes
        .into_iter()
        .filter(|e| {
            name_of(e).is_some_and(|n| n == name || n.starts_with(&event_prefix))
                || (e.verb == "create" && e.request_uri.contains(&name))
        })
        .map(|e| format!("{} {}", e.verb, e.resource_path()))
        .collect()
}

/// Requests without a User-Agent: kube-rs clients, here the simulator's and the benchmark's.
pub const NO_USER_AGENT: &str = "(none: simulator, benchmark)";

/// The client a request came from: its User-Agent's first word without the version
/// (`capkr-manager`, `capi-manager`), and for CAPI's managers the controller name that
/// follows.
pub fn client_of(e: &AuditEvent) -> String {
    let mut words = e.user_agent.split_whitespace();
    let program = words.next().unwrap_or("").split('/').next().unwrap_or("");
    if program.is_empty() {
        return NO_USER_AGENT.to_string();
    }
    match words.next().filter(|w| !w.starts_with('(')) {
        Some(controller) => format!("{program} {controller}"),
        None => program.to_string(),
    }
}

/// Every client's requests and writes per machine in the window (Leases left out).
fn per_client(events: &[AuditEvent], n: usize) -> BTreeMap<String, PerMachine> {
    let mut by: BTreeMap<String, RequestCounts> = BTreeMap::new();
    for e in events.iter().filter(|e| !e.is_lease()) {
        by.entry(client_of(e)).or_default().add(e);
    }
    by.into_iter()
        .filter(|(_, c)| c.total > 0)
        .map(|(k, c)| {
            let mut pm = PerMachine::of(&c, n);
            // The clients' totals are what the table shows; their resources would swell the JSON.
            pm.by_resource.retain(|k, _| {
                ["create ", "update ", "patch ", "delete "]
                    .iter()
                    .any(|v| k.starts_with(v))
            });
            (k, pm)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(user_agent: &str) -> AuditEvent {
        serde_json::from_value(json!({
            "auditID": "x", "stage": "ResponseComplete", "verb": "get",
            "requestURI": "/api/v1/namespaces/ns/secrets/s", "userAgent": user_agent,
        }))
        .unwrap()
    }

    #[test]
    fn clients_are_named_by_program_and_capi_controller() {
        for (ua, client) in [
            ("capkr-manager/0.1.0 (bench)", "capkr-manager"),
            (
                "capi-manager/v1.14.2 cluster-api-controller-manager (linux/amd64) cluster.x-k8s.io/abc",
                "capi-manager cluster-api-controller-manager",
            ),
            (
                "kube-controller-manager/v1.36.3 (linux/amd64) kubernetes/abc/generic-garbage-collector",
                "kube-controller-manager",
            ),
            ("", NO_USER_AGENT),
        ] {
            assert_eq!(client_of(&from(ua)), client, "{ua:?}");
        }
    }
}
