//! `capkr-bench`: the scale benchmark of capkr-manager against the real control plane
//! (`capkr-testenv`). One run measures, for each N and client-side rate limit, in a fresh
//! environment:
//!
//! 1. provider throughput: CAPI's managers are off and the benchmark plays CAPI's part; with
//!    the manager running and ready, N Machines with bootstrap Secrets and KaironMachines are
//!    created in a burst; timed until every KaironMachine is provisioned, with latencies,
//!    the manager's requests per machine (audit log), peak RSS and CPU time;
//! 2. the floor: a minimal client makes only the unavoidable requests for N fresh machines,
//!    at the same concurrency and rate limit (see [`floor`]);
//! 3. steady state and restart: the manager's writes while nothing changes, then a restart
//!    with N machines in place (time to `/readyz`, requests and writes until quiet);
//!
//! and then, in an environment with CAPI's managers and a workload cluster,
//! 4. the full CAPI path: a MachineDeployment scaled 0 → N until every Machine runs with a Node;
//!    and the same with CAPD's manager and its in-memory backend instead ([`peer`]), side by
//!    side;
//! 6. MachinePool against MachineDeployment: the same cluster with its N workers in a
//!    MachinePool of a KaironMachinePool, and in a MachineDeployment ([`pool`]).
//!
//! Results go to `results.json`, `results.md` and two PNG plots in the output directory.

pub mod floor;
pub mod full_capi;
pub mod info;
pub mod markdown;
pub mod objects;
pub mod observe;
pub mod peer;
pub mod phases;
pub mod plot;
pub mod pool;
pub mod procstat;
pub mod provider;
pub mod results;
pub mod traffic;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use capkr_testenv::audit::AUDIT_POLICY_METADATA_RESPONSES;
use capkr_testenv::{Binaries, CapiManagers, Env, EnvOptions, own_binary};

use crate::results::{ApiLimits, PeerRun, Results, Settings, SizeRun, check_targets};
use crate::traffic::MANAGER_IDENTITY;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Machines of parts 1–3, one environment per size and limit.
    pub sizes: Vec<usize>,
    /// Client-side limits of parts 1–3 (manager and floor alike). Steady state and restart
    /// are measured with the first only.
    pub limits: Vec<ApiLimits>,
    /// Workers of part 4; empty: part 4 is skipped.
    pub capi_sizes: Vec<usize>,
    /// Part 4 with CAPD's in-memory provider too, at each size of `capi_sizes`.
    pub peer: bool,
    /// Workers of part 6, MachinePool against MachineDeployment; empty: part 6 is skipped.
    pub pool_sizes: Vec<usize>,
    /// Creates in flight while the benchmark makes the machines.
    pub create_concurrency: usize,
    /// `--kaironmachine-concurrency` of the manager, and the floor's concurrency.
    pub kaironmachine_concurrency: usize,
    /// The steady-state period.
    pub idle: Duration,
    /// A client is quiet after this long without a request.
    pub quiet: Duration,
    /// Client limits other than none are run only up to this N (a limited run at N=5000 takes
    /// an hour on two cores); `None`: every size with every limit.
    pub limited_max: Option<usize>,
    /// Extra manager flags for parts 1–3.
    pub manager_args: Vec<String>,
    pub out_dir: PathBuf,
    /// A TrueType font for the plots' text.
    pub font: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sizes: vec![100, 1000],
            limits: vec![ApiLimits::DEFAULT, ApiLimits { qps: 0.0, burst: 0 }],
            capi_sizes: vec![100, 1000],
            peer: true,
            pool_sizes: vec![100, 1000],
            create_concurrency: 32,
            kaironmachine_concurrency: 10,
            idle: Duration::from_secs(120),
            quiet: Duration::from_secs(3),
            limited_max: None,
            manager_args: Vec::new(),
            out_dir: PathBuf::from("docs/bench"),
            font: None,
        }
    }
}

/// Simulator flags for zero delays and no jitter.
pub fn zero_delay_simulator_args() -> Vec<String> {
    [
        "--provision-delay",
        "0s",
        "--boot-delay",
        "0s",
        "--delete-delay",
        "0s",
        "--jitter",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

/// Simulator flags of parts 1–3: no delays, no guests (no workload cluster needed).
pub fn simulator_args() -> Vec<String> {
    let mut args = zero_delay_simulator_args();
    args.push("--no-boot-guest".into());
    args
}

/// The manager's flags of parts 1–3 for `limits`.
pub fn manager_args(opts: &Options, limits: ApiLimits) -> Vec<String> {
    let mut args = vec![
        "--leader-elect-identity".to_string(),
        MANAGER_IDENTITY.to_string(),
        format!("--kube-api-qps={}", limits.qps),
        format!("--kube-api-burst={}", limits.burst),
        format!("--kaironmachine-concurrency={}", opts.kaironmachine_concurrency),
    ];
    args.extend(opts.manager_args.iter().cloned());
    args
}

/// Runs everything, writes the results to `opts.out_dir` and returns them.
pub async fn run(opts: &Options) -> Result<Results> {
    let font = plot::load_font(opts.font.as_deref())?;
    std::fs::create_dir_all(&opts.out_dir).with_context(|| format!("creating {}", opts.out_dir.display()))?;
    let manager_bin = own_binary("capkr-manager", "CAPKR_MANAGER_BIN")?;
    let simulator_bin = own_binary("kairon-sim", "KAIRON_SIM_BIN")?;
    let versions = info::versions(&Binaries::locate()?, &manager_bin);
    let mut runs = Vec::new();
    for &n in &opts.sizes {
        let limits_of_n: Vec<ApiLimits> = opts
            .limits
            .iter()
            .copied()
            .filter(|l| l.qps <= 0.0 || opts.limited_max.is_none_or(|max| n <= max))
            .collect();
        for (i, &limits) in limits_of_n.iter().enumerate() {
            eprintln!("capkr-bench: N={n}, client limit {limits}");
            let env = Env::start(
                EnvOptions::new(format!("bench-{n}"))
                    .capi_managers(CapiManagers::NONE)
                    .audit_policy(AUDIT_POLICY_METADATA_RESPONSES),
            )
            .await?;
            let result = explain_failure(&env, n, size_run(&env, opts, n, limits, i == 0).await);
            runs.push(result.with_context(|| format!("N={n}, client limit {limits}"))?);
        }
    }
    let capd = match opts.peer && !opts.capi_sizes.is_empty() {
        true => Some(peer::capd_dir()?),
        false => None,
    };
    let mut full_capi = Vec::new();
    let mut peer = Vec::new();
    for &n in &opts.capi_sizes {
        eprintln!("capkr-bench: full CAPI path, N={n}");
        let ours = full_capi::run(n, opts.quiet).await?;
        full_capi.push(ours.clone());
        if let Some(capd) = &capd {
            eprintln!("capkr-bench: full CAPI path with CAPD's in-memory provider, N={n}");
            let theirs = peer::run(capd, n, opts.quiet).await?;
            peer.push(PeerRun { n, ours, capd: theirs });
        }
    }
    let mut pool = Vec::new();
    for &n in &opts.pool_sizes {
        eprintln!("capkr-bench: MachinePool against MachineDeployment, N={n}");
        let mut comparison = pool::run(n, opts.quiet).await?;
        comparison.git_commit = versions.git_commit.clone();
        pool.push(comparison);
    }
    let results = Results {
        generated_at: k8s_openapi::jiff::Timestamp::now().to_string(),
        machine: info::machine(),
        versions,
        settings: Settings {
            sizes: opts.sizes.clone(),
            limits: opts.limits.clone(),
            capi_sizes: opts.capi_sizes.clone(),
            pool_sizes: opts.pool_sizes.clone(),
            create_concurrency: opts.create_concurrency,
            kaironmachine_concurrency: opts.kaironmachine_concurrency,
            idle_s: opts.idle.as_secs_f64(),
            quiet_s: opts.quiet.as_secs_f64(),
            simulator_args: simulator_args(),
            manager_bin: in_workspace(&manager_bin),
            simulator_bin: in_workspace(&simulator_bin),
        },
        targets: check_targets(&runs),
        runs,
        full_capi,
        peer,
        pool,
    };
    write_results(&results, &opts.out_dir, &font)?;
    Ok(results)
}

async fn size_run(env: &Env, opts: &Options, n: usize, limits: ApiLimits, first: bool) -> Result<SizeRun> {
    let sim = env.start_simulator(simulator_args())?;
    let args = manager_args(opts, limits);
    let provider = provider::run(env, opts, n, &args, first).await?;
    let floor = floor::run(env, opts, n, limits).await?;
    sim.kill(capkr_testenv::Signal::Term).await?;
    Ok(SizeRun {
        n,
        limits,
        manager_args: args,
        ratio: provider.run.wall_s / floor.wall_s.max(f64::EPSILON),
        provider: provider.run,
        floor,
        steady: provider.steady,
        restart: provider.restart,
    })
}

/// `path` relative to the workspace when it is inside it.
fn in_workspace(path: &Path) -> String {
    let root = capkr_testenv::workspace_root();
    path.strip_prefix(&root).unwrap_or(path).display().to_string()
}

/// A failed run's result, with what explains it: the environment's processes that had exited
/// in the error, and printed, everything the environment holds for a small N, where the
/// objects fit on a screen (otherwise where the logs are).
pub fn explain_failure<T>(env: &Env, n: usize, result: Result<T>) -> Result<T> {
    let Err(e) = result else {
        return result;
    };
    if n <= 20 {
        env.dump();
    } else {
        eprintln!(
            "capkr-bench: process logs are in {} (kept with CAPKR_TEST_KEEP=1)",
            env.log_dir().display()
        );
    }
    // The dump goes to the log; the error is what a summary shows.
    match env.exited(20) {
        gone if gone.is_empty() => Err(e),
        gone => Err(e.context(format!("processes of the environment had exited:\n{gone}"))),
    }
}

/// `results.json`, `results.md`, `time-vs-n.png`, `rss-vs-n.png` and, with part 4's peer,
/// `peer-vs-n.png`.
pub fn write_results(results: &Results, dir: &Path, font: &plot::Font) -> Result<()> {
    let write = |name: &str, content: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, content).with_context(|| format!("writing {}", p.display()))
    };
    write("results.json", serde_json::to_string_pretty(results)?.as_bytes())?;
    write("results.md", markdown::render(results).as_bytes())?;
    plot::time_vs_n(results, &dir.join("time-vs-n.png"), font)?;
    plot::rss_vs_n(results, &dir.join("rss-vs-n.png"), font)?;
    if !results.peer.is_empty() {
        plot::peer_vs_n(results, &dir.join("peer-vs-n.png"), font)?;
    }
    eprintln!("capkr-bench: results in {}", dir.display());
    Ok(())
}
