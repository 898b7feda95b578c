//! What the benchmark measured, as written to `results.json`, and the targets it is held to.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use capkr_testenv::audit::RequestCounts;
use serde::{Deserialize, Serialize};

/// A client-side rate limit: `--kube-api-qps` and `--kube-api-burst`. `qps <= 0`: none.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiLimits {
    pub qps: f32,
    pub burst: u32,
}

impl ApiLimits {
    /// The manager's defaults (CAPI's).
    pub const DEFAULT: ApiLimits = ApiLimits { qps: 100.0, burst: 200 };

    pub fn is_unlimited(&self) -> bool {
        self.qps <= 0.0
    }
}

impl fmt::Display for ApiLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_unlimited() {
            write!(f, "no client limit")
        } else if *self == ApiLimits::DEFAULT {
            write!(f, "{}/{} (defaults)", self.qps, self.burst)
        } else {
            write!(f, "{}/{}", self.qps, self.burst)
        }
    }
}

impl FromStr for ApiLimits {
    type Err = String;
    /// `qps/burst`, or `0` for no limit.
    fn from_str(s: &str) -> Result<Self, String> {
        let err = || format!("invalid API limit {s:?}: use qps/burst (e.g. 100/200) or 0 for none");
        let (qps, burst) = match s.split_once('/') {
            Some((q, b)) => (
                q.parse::<f32>().map_err(|_| err())?,
                b.parse::<u32>().map_err(|_| err())?,
            ),
            None => (s.parse::<f32>().map_err(|_| err())?, 0),
        };
        if !qps.is_finite() || qps < 0.0 || (qps > 0.0 && burst == 0) {
            return Err(err());
        }
        Ok(ApiLimits { qps, burst })
    }
}

/// Nearest-rank percentiles of a sample, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(sample: &[f64]) -> Percentiles {
        let mut v: Vec<f64> = sample.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Percentiles {
            count: v.len(),
            p50: rank(0.50),
            p99: rank(0.99),
            max: v[v.len() - 1],
        }
    }
}

/// One phase of the full CAPI path over the Machines that went through it
/// ([`crate::phases`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// What ends the phase.
    pub until: String,
    /// Whose work the phase is.
    pub by: String,
    /// Seconds from the end of the phase before.
    pub latency: Percentiles,
    /// Whether its end is read to the second only (an object's timestamp).
    pub whole_seconds: bool,
}

/// Requests divided by the number of machines.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PerMachine {
    pub requests: f64,
    pub reads: f64,
    pub writes: f64,
    pub by_verb: BTreeMap<String, f64>,
    pub by_resource: BTreeMap<String, f64>,
}

impl PerMachine {
    pub fn of(c: &RequestCounts, n: usize) -> PerMachine {
        let n = n.max(1) as f64;
        let div = |m: &BTreeMap<String, u64>| m.iter().map(|(k, v)| (k.clone(), *v as f64 / n)).collect();
        PerMachine {
            requests: c.total as f64 / n,
            reads: c.reads as f64 / n,
            writes: c.writes as f64 / n,
            by_verb: div(&c.by_verb),
            by_resource: div(&c.by_resource),
        }
    }
}

/// Part 1: the manager provisions N machines.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProviderRun {
    /// From the first create of the burst until the last KaironMachine was seen provisioned.
    pub wall_s: f64,
    /// How long creating the N Secrets, Machines and KaironMachines took.
    pub create_s: f64,
    pub created_to_provisioned: Percentiles,
    pub running_to_provisioned: Percentiles,
    /// The manager's requests from the burst until it went quiet.
    pub requests: RequestCounts,
    pub per_machine: PerMachine,
    /// Versions of each KaironMachine the benchmark's watch saw, creation included: writes
    /// that changed something. Compare with the KaironMachine writes per machine.
    pub kaironmachine_versions: f64,
    /// VmHWM at the end of provisioning, MiB.
    pub peak_rss_mib: f64,
    /// Manager CPU time from the burst until it went quiet.
    pub cpu_s: f64,
    /// Whether the manager went quiet before the timeout.
    pub quiet: bool,
}

/// Part 2: the minimal client.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FloorRun {
    pub wall_s: f64,
    pub create_s: f64,
    pub created_to_provisioned: Percentiles,
    pub running_to_provisioned: Percentiles,
    pub requests: RequestCounts,
    pub per_machine: PerMachine,
    pub kaironmachine_versions: f64,
    pub concurrency: usize,
}

/// Part 3a: nothing changes; the manager should write nothing.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SteadyState {
    pub idle_s: f64,
    pub requests: RequestCounts,
    /// The writes (`verb URI`), at most 50.
    pub writes: Vec<String>,
    /// VmHWM at the end of the idle period, MiB.
    pub peak_rss_mib: f64,
}

/// Part 3b: the manager restarts with N machines provisioned.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RestartRun {
    /// SIGTERM until the old process exited.
    pub stop_s: f64,
    /// Start of the new process until `/readyz` answered 200.
    pub ready_s: f64,
    /// Start of the new process until it went quiet.
    pub quiet_s: f64,
    pub quiet: bool,
    pub requests: RequestCounts,
    pub writes: Vec<String>,
    /// VmHWM of the new process once quiet, MiB.
    pub peak_rss_mib: f64,
    pub cpu_s: f64,
}

/// Parts 1–3 for one N and one client limit, in one environment.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SizeRun {
    pub n: usize,
    pub limits: ApiLimits,
    pub manager_args: Vec<String>,
    pub provider: ProviderRun,
    pub floor: FloorRun,
    /// provider wall time / floor wall time.
    pub ratio: f64,
    pub steady: Option<SteadyState>,
    pub restart: Option<RestartRun>,
}

/// Part 4: real CAPI scales a MachineDeployment 0 → N.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FullCapiRun {
    pub n: usize,
    pub manager_args: Vec<String>,
    /// Cluster applied until its control-plane Machine ran with a nodeRef.
    pub control_plane_s: f64,
    /// Scale to N until all N workers ran with a nodeRef.
    pub scale_s: f64,
    pub requests: RequestCounts,
    pub per_machine: PerMachine,
    pub peak_rss_mib: f64,
    /// The provider manager's CPU time (user + system) from the scale until it went quiet.
    #[serde(default)]
    pub cpu_s: f64,
    /// Where each worker's time went, phase by phase.
    #[serde(default)]
    pub phases: Vec<Phase>,
    /// CPU time (user + system) of every process of the environment over the same window as
    /// `cpu_s`, by process name (the API servers, etcd, CAPI's managers, the provider's
    /// manager and, for ours, the simulator): what the whole path cost the machine.
    #[serde(default)]
    pub environment_cpu_s: std::collections::BTreeMap<String, f64>,
}

/// Part 4 for one N with both providers, from the same run: capkr-manager with the simulator
/// and CAPD's manager with its in-memory backend.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerRun {
    pub n: usize,
    pub ours: FullCapiRun,
    pub capd: FullCapiRun,
}

impl PeerRun {
    /// ours / CAPD's for one figure; `None` when CAPD's is zero.
    pub fn ratio(&self, figure: impl Fn(&FullCapiRun) -> f64) -> Option<f64> {
        let theirs = figure(&self.capd);
        (theirs > 0.0).then(|| figure(&self.ours) / theirs)
    }
}

/// Part 6, one path: the N workers of a cluster as a MachineDeployment or as a MachinePool
/// (KaironMachinePool), scaled 0 → N with the real CAPI controllers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PoolPathRun {
    pub n: usize,
    /// `MachineDeployment` or `MachinePool`.
    pub workers: String,
    pub manager_args: Vec<String>,
    /// Cluster applied until its control-plane Machine ran with a nodeRef.
    pub control_plane_s: f64,
    /// Scale until all N + 1 Machines ran with a nodeRef.
    pub running_s: f64,
    /// Scale until all N + 1 Nodes of the workload cluster were Ready.
    pub nodes_ready_s: f64,
    /// Scale until the MachineDeployment's or MachinePool's `status.readyReplicas` was N.
    pub ready_replicas_s: f64,
    /// The latest of the three: the workers are up.
    pub scale_s: f64,
    /// The manager's requests from the scale until it went quiet.
    pub requests: RequestCounts,
    pub per_machine: PerMachine,
    /// Every client's requests in the same window (Leases left out), per machine, keyed by
    /// client (User-Agent program, and controller for CAPI's managers); writes by resource.
    pub by_client: BTreeMap<String, PerMachine>,
    /// The manager's writes naming one worker, in order (`verb resource`).
    #[serde(default)]
    pub one_machine: Vec<String>,
    /// The manager's VmHWM once quiet, MiB.
    pub peak_rss_mib: f64,
    /// The manager's CPU time (user + system) from the scale until it went quiet.
    pub cpu_s: f64,
    /// Whether the manager went quiet before the timeout.
    pub quiet: bool,
}

/// Part 6 at one N: both paths, one after the other, each in a fresh environment.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PoolComparison {
    pub n: usize,
    /// When the MachineDeployment's run started.
    pub measured_at: String,
    /// The commit of the run (results of several runs may be merged into one file).
    #[serde(default)]
    pub git_commit: String,
    pub deployment: PoolPathRun,
    pub pool: PoolPathRun,
}

impl PoolComparison {
    /// MachinePool / MachineDeployment for one figure; `None` when the latter is zero.
    pub fn ratio(&self, figure: impl Fn(&PoolPathRun) -> f64) -> Option<f64> {
        let md = figure(&self.deployment);
        (md > 0.0).then(|| figure(&self.pool) / md)
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MachineInfo {
    pub nproc: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Versions {
    pub rustc: String,
    pub kube_apiserver: String,
    pub cluster_api: String,
    pub git_commit: String,
    pub manager: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Settings {
    pub sizes: Vec<usize>,
    pub limits: Vec<ApiLimits>,
    pub capi_sizes: Vec<usize>,
    /// Workers of part 6 (MachinePool against MachineDeployment).
    #[serde(default)]
    pub pool_sizes: Vec<usize>,
    pub create_concurrency: usize,
    pub kaironmachine_concurrency: usize,
    pub idle_s: f64,
    pub quiet_s: f64,
    pub simulator_args: Vec<String>,
    pub manager_bin: String,
    pub simulator_bin: String,
}

/// One target checked against one run that measures it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetCheck {
    pub target: String,
    pub run: String,
    pub value: String,
    pub met: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    pub generated_at: String,
    pub machine: MachineInfo,
    pub versions: Versions,
    pub settings: Settings,
    pub runs: Vec<SizeRun>,
    pub full_capi: Vec<FullCapiRun>,
    /// Part 4 side by side with CAPD's in-memory provider (empty without `--peer`).
    #[serde(default)]
    pub peer: Vec<PeerRun>,
    /// Part 6: MachinePool against MachineDeployment.
    #[serde(default)]
    pub pool: Vec<PoolComparison>,
    pub targets: Vec<TargetCheck>,
}

/// `N=1000, 100/200 (defaults)`.
pub fn run_label(r: &SizeRun) -> String {
    format!("N={}, {}", r.n, r.limits)
}

/// The targets, checked against every run that measures them.
pub fn check_targets(runs: &[SizeRun]) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    let mut check = |target: &str, run: &SizeRun, value: String, met: bool| {
        out.push(TargetCheck {
            target: target.into(),
            run: run_label(run),
            value,
            met,
        });
    };
    for r in runs {
        if r.n == 1000 {
            check(
                "provider time / floor time <= 1.5 at N=1000",
                r,
                format!("{:.2}", r.ratio),
                r.ratio <= 1.5,
            );
            if r.limits == ApiLimits::DEFAULT {
                let p99 = r.provider.running_to_provisioned.p99;
                check(
                    "p99 Running -> provisioned < 2 s at N=1000, default client limits",
                    r,
                    format!("{p99:.3} s"),
                    p99 < 2.0,
                );
            }
        }
        let w = r.provider.per_machine.writes;
        check(
            "<= 4 manager writes per machine (happy path, as the floor)",
            r,
            format!("{w:.2}"),
            w <= 4.0,
        );
        if let Some(s) = &r.steady {
            check(
                "0 manager writes at steady state",
                r,
                s.requests.writes.to_string(),
                s.requests.writes == 0,
            );
        }
        if let Some(s) = &r.restart {
            check(
                "0 manager writes on restart",
                r,
                s.requests.writes.to_string(),
                s.requests.writes == 0,
            );
        }
        if r.n == 5000 {
            let rss = r.provider.peak_rss_mib;
            check(
                "manager peak RSS <= 64 MiB at N=5000",
                r,
                format!("{rss:.1} MiB"),
                rss <= 64.0,
            );
            if let Some(s) = &r.restart {
                check(
                    "manager peak RSS after a restart <= 64 MiB at N=5000",
                    r,
                    format!("{:.1} MiB", s.peak_rss_mib),
                    s.peak_rss_mib <= 64.0,
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_and_print() {
        assert_eq!("100/200".parse::<ApiLimits>(), Ok(ApiLimits::DEFAULT));
        assert_eq!("0".parse::<ApiLimits>(), Ok(ApiLimits { qps: 0.0, burst: 0 }));
        assert_eq!("0/0".parse::<ApiLimits>(), Ok(ApiLimits { qps: 0.0, burst: 0 }));
        assert!("50".parse::<ApiLimits>().is_err());
        assert!("x/1".parse::<ApiLimits>().is_err());
        assert_eq!(ApiLimits::DEFAULT.to_string(), "100/200 (defaults)");
        assert_eq!("200/300".parse::<ApiLimits>().unwrap().to_string(), "200/300");
        assert_eq!("0".parse::<ApiLimits>().unwrap().to_string(), "no client limit");
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&v);
        assert_eq!((p.count, p.p50, p.p99, p.max), (100, 50.0, 99.0, 100.0));
        let p = Percentiles::of(&[3.0]);
        assert_eq!((p.p50, p.p99), (3.0, 3.0));
        assert_eq!(Percentiles::of(&[]).count, 0);
    }
}
