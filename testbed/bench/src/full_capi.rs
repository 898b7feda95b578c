//! Part 4, the full CAPI path: real CAPI core and kubeadm bootstrap managers, a workload API
//! server where the simulated guests register their Nodes, and a MachineDeployment scaled
//! from 0 to N. Timed until every worker Machine is `Running` with a nodeRef.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use capkr::api::KaironMachine;
use capkr_testenv::audit::{AUDIT_POLICY_METADATA_RESPONSES, AuditEvent, RequestCounts};
use capkr_testenv::cluster::{
    ClusterOptions, all_running_with_a_node, cluster_yaml, running_with_a_node, scale_machine_deployment,
};
use capkr_testenv::{Env, EnvOptions, SIMULATOR_HOSTS, Signal, capi_resource};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};

use crate::phases::phases;
use crate::procstat::{cpu_seconds, peak_rss_kib};
use crate::provider::{health_port, mib, wait_ready};
use crate::results::Phase;
use crate::results::{FullCapiRun, PerMachine};
use crate::traffic::{MANAGER_IDENTITY, Traffic, is_manager_request};

const NAMESPACE: &str = "bench-capi";
const CLUSTER: &str = "capi";

/// Simulator flags of this part: no delays, guests register Nodes, hosts in the two failure
/// domains of the test cluster's KaironCluster.
pub fn simulator_args() -> Vec<String> {
    let mut args = crate::zero_delay_simulator_args();
    args.extend(["--hosts".to_string(), SIMULATOR_HOSTS.to_string()]);
    args
}

/// The manager's flags here: its defaults, and the identity the audit log is filtered by.
pub fn manager_args() -> Vec<String> {
    ["--leader-elect-identity", MANAGER_IDENTITY].map(String::from).to_vec()
}

pub async fn run(n: usize, quiet: Duration) -> Result<FullCapiRun> {
    let env =
        Env::start(EnvOptions::new(format!("bench-capi-{n}")).audit_policy(AUDIT_POLICY_METADATA_RESPONSES)).await?;
    crate::explain_failure(&env, n, run_in(&env, n, quiet).await)
}

async fn run_in(env: &Env, n: usize, quiet: Duration) -> Result<FullCapiRun> {
    env.create_namespace(NAMESPACE).await?;
    let workload = env.workload_cluster(NAMESPACE, CLUSTER).await?;
    let sim = env.start_simulator(simulator_args())?;
    let manager = env.start_manager(manager_args())?;
    wait_ready(&manager, health_port(&manager)?, Duration::from_secs(60)).await?;
    let pid = manager.pid().ok_or_else(|| anyhow!("the manager has no pid"))?;

    let shape = ClusterOptions {
        workers: 0,
        ..ClusterOptions::default()
    };
    let t_cp = Instant::now();
    env.apply(
        &cluster_yaml(NAMESPACE, CLUSTER, &workload.host, workload.port, &shape),
        Some(NAMESPACE),
    )
    .await
    .context("creating the cluster")?;
    let machines: Api<DynamicObject> =
        Api::namespaced_with(env.client(), NAMESPACE, &capi_resource("Machine", "machines"));
    wait_running(&machines, 1, Duration::from_secs(180)).await?;
    let control_plane = t_cp.elapsed();

    let under = Under {
        pid,
        name: "capkr-manager",
        others: sim.pid().map(|p| ("kairon-sim", p)).into_iter().collect(),
        is_provider: is_manager_request,
        infra: ApiResource::erase::<KaironMachine>(&()),
        vm_group: Some("kairon.zyvor.dev"),
    };
    let scaled = scale(env, NAMESPACE, &format!("{CLUSTER}-md-0"), n, &under, quiet).await?;
    let run = FullCapiRun {
        n,
        manager_args: manager_args(),
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
        "capkr-bench: full CAPI path, 0 -> {n} workers: {:.1}s ({:.2} manager writes per machine)",
        run.scale_s, run.per_machine.writes
    );
    manager.kill(Signal::Term).await?;
    sim.kill(Signal::Term).await?;
    Ok(run)
}

/// What [`scale`] measured.
pub struct Scaled {
    pub scale_s: f64,
    pub requests: RequestCounts,
    pub peak_rss_mib: f64,
    pub cpu_s: f64,
    pub phases: Vec<Phase>,
    pub environment_cpu_s: std::collections::BTreeMap<String, f64>,
}

/// The provider [`scale`] measures.
pub struct Under {
    /// Its manager's process, and the name its CPU is shown under.
    pub pid: u32,
    pub name: &'static str,
    /// Processes of the provider's path that the environment does not run (the simulator),
    /// by name, counted in its CPU.
    pub others: Vec<(&'static str, u32)>,
    /// Its manager's requests.
    pub is_provider: fn(&AuditEvent) -> bool,
    /// Its infrastructure machines.
    pub infra: ApiResource,
    /// The API group of the VMs it creates (`None`: it creates none).
    pub vm_group: Option<&'static str>,
}

/// With one control-plane Machine running: waits until the provider manager has gone quiet,
/// scales the MachineDeployment `md` of `namespace` from 0 to `n`, waits until all `n + 1`
/// Machines run with a nodeRef and the manager has gone quiet again, and returns the time to
/// all Running, the manager's requests from the scale until quiet, its CPU time over the same
/// window, its peak RSS and where each worker's time went ([`phases`], from every client's
/// requests of the window).
pub async fn scale(env: &Env, namespace: &str, md: &str, n: usize, under: &Under, quiet: Duration) -> Result<Scaled> {
    let machines: Api<DynamicObject> =
        Api::namespaced_with(env.client(), namespace, &capi_resource("Machine", "machines"));
    let mut traffic = Traffic::from_now(env)?;
    traffic
        .until_quiet(under.is_provider, quiet, Duration::from_secs(30))
        .await?;
    let cpu0 = cpu_seconds(under.pid)?;
    let env_cpu0 = environment_cpu(env, under);
    let t0 = Instant::now();
    let scaled_at = Timestamp::now();
    scale_machine_deployment(&env.client(), namespace, md, n)
        .await
        .context("scaling the MachineDeployment")?;
    wait_running(&machines, n + 1, Duration::from_secs(180 + 3 * n as u64)).await?;
    let scale_s = t0.elapsed().as_secs_f64();
    let (events, _) = traffic
        .until_quiet_keeping(|_| true, under.is_provider, quiet, Duration::from_secs(60))
        .await?;
    let provider_events: Vec<AuditEvent> = events.iter().filter(|e| (under.is_provider)(e)).cloned().collect();
    let infra: Api<DynamicObject> = Api::namespaced_with(env.client(), namespace, &under.infra);
    let phases = phases(
        scaled_at,
        &events,
        &machines.list(&ListParams::default()).await?.items,
        &infra.list(&ListParams::default()).await?.items,
        under.vm_group,
    );
    Ok(Scaled {
        scale_s,
        requests: RequestCounts::of(&provider_events, |_| true),
        peak_rss_mib: mib(peak_rss_kib(under.pid)?),
        cpu_s: cpu_seconds(under.pid)? - cpu0,
        phases,
        environment_cpu_s: cpu_since(&env_cpu0, &environment_cpu(env, under)),
    })
}

/// CPU seconds so far of each process of `env` and of the manager `under` (which may run
/// outside it), by pid, with its name.
fn environment_cpu(env: &Env, under: &Under) -> Vec<(String, u32, f64)> {
    env.pids()
        .into_iter()
        .filter(|(_, pid)| *pid != under.pid)
        .chain([(under.name.to_string(), under.pid)])
        .chain(under.others.iter().map(|(name, pid)| (name.to_string(), *pid)))
        .filter_map(|(name, pid)| cpu_seconds(pid).ok().map(|s| (name, pid, s)))
        .collect()
}

/// CPU seconds from `before` to `after`, summed by process name; a process that was not there
/// before counts from zero.
fn cpu_since(before: &[(String, u32, f64)], after: &[(String, u32, f64)]) -> std::collections::BTreeMap<String, f64> {
    let mut by_name = std::collections::BTreeMap::new();
    for (name, pid, s) in after {
        let was = before.iter().find(|(_, p, _)| p == pid).map_or(0.0, |(_, _, s)| *s);
        *by_name.entry(name.clone()).or_insert(0.0) += s - was;
    }
    by_name
}

/// Waits until exactly `n` Machines exist and all are Running with a nodeRef.
pub async fn wait_running(machines: &Api<DynamicObject>, n: usize, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let list = machines.list(&ListParams::default()).await?;
        if all_running_with_a_node(&list.items, n) {
            return Ok(());
        }
        let running = list.items.iter().filter(|m| running_with_a_node(m)).count();
        if start.elapsed() > timeout {
            bail!(
                "{running} of {} Machines Running with a nodeRef after {timeout:?} (wanted {n})",
                list.items.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_summed_by_name_from_each_pids_own_start() {
        let before = vec![
            ("kube-apiserver".to_string(), 1, 10.0),
            ("kube-apiserver".to_string(), 2, 1.0),
        ];
        let after = vec![
            ("kube-apiserver".to_string(), 1, 12.0),
            ("kube-apiserver".to_string(), 2, 4.0),
            ("kairon-sim".to_string(), 3, 0.5),
        ];
        let got = cpu_since(&before, &after);
        assert_eq!(got.get("kube-apiserver"), Some(&5.0));
        assert_eq!(
            got.get("kairon-sim"),
            Some(&0.5),
            "a process started since counts from zero"
        );
    }
}
