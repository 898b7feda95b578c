//! Parts 1 and 3: the manager provisions N machines that the benchmark creates in a burst
//! (playing CAPI's part), then sits idle, then restarts with the N machines in place.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use capkr_testenv::audit::{AuditEvent, RequestCounts};
use capkr_testenv::{Env, Process, Signal, http_get};

use crate::Options;
use crate::objects;
use crate::observe::Observer;
use crate::procstat::{cpu_seconds, peak_rss_kib};
use crate::results::{PerMachine, Percentiles, ProviderRun, RestartRun, SteadyState};
use crate::traffic::{Traffic, is_manager_request};

/// The namespace of the provider run.
pub const NAMESPACE: &str = "bench-provider";

/// Everything parts 1 and 3 measured; the manager is stopped when this is returned.
pub struct ProviderOutcome {
    pub run: ProviderRun,
    pub steady: Option<SteadyState>,
    pub restart: Option<RestartRun>,
}

/// How long to wait for N machines: generous, for the client limit and a busy machine.
pub fn provisioning_timeout(n: usize) -> Duration {
    Duration::from_secs(120 + 2 * n as u64)
}

pub async fn run(
    env: &Env,
    opts: &Options,
    n: usize,
    manager_args: &[String],
    with_steady_and_restart: bool,
) -> Result<ProviderOutcome> {
    let client = env.client();
    objects::create_cluster(&client, NAMESPACE).await?;
    let manager = env.start_manager(manager_args)?;
    let health = health_port(&manager)?;
    wait_ready(&manager, health, Duration::from_secs(60)).await?;
    let pid = manager.pid().ok_or_else(|| anyhow!("the manager has no pid"))?;
    let observer = Observer::start(&client, NAMESPACE).await?;
    // Let the manager settle on the Cluster and KaironCluster before the clock starts.
    let mut traffic = Traffic::from_now(env)?;
    traffic
        .until_quiet(is_manager_request, opts.quiet, Duration::from_secs(30))
        .await?;

    let cpu0 = cpu_seconds(pid)?;
    let t0 = Instant::now();
    let create = objects::create_machines(
        &client,
        NAMESPACE,
        n,
        opts.create_concurrency,
        observer.creation_recorder(),
    )
    .await?;
    let done = observer
        .wait_provisioned(n, provisioning_timeout(n))
        .await
        .with_context(|| format!("manager log tail:\n{}", manager.log_tail(20)))?;
    let wall = done.saturating_duration_since(t0);
    let (events, quiet) = traffic
        .until_quiet(is_manager_request, opts.quiet, Duration::from_secs(60))
        .await?;
    let requests = count(&events);
    let latencies = observer.latencies();
    let run = ProviderRun {
        wall_s: wall.as_secs_f64(),
        create_s: create.as_secs_f64(),
        created_to_provisioned: Percentiles::of(&latencies.created_to_provisioned),
        running_to_provisioned: Percentiles::of(&latencies.running_to_provisioned),
        per_machine: PerMachine::of(&requests, n),
        requests,
        kaironmachine_versions: observer.kaironmachine_versions_per_machine(),
        peak_rss_mib: mib(peak_rss_kib(pid)?),
        cpu_s: cpu_seconds(pid)? - cpu0,
        quiet,
    };
    eprintln!(
        "capkr-bench: N={n}: provider {:.1}s ({:.2} writes, {:.2} requests per machine, peak RSS {:.1} MiB)",
        run.wall_s, run.per_machine.writes, run.per_machine.requests, run.peak_rss_mib
    );

    let mut outcome = ProviderOutcome {
        run,
        steady: None,
        restart: None,
    };
    if with_steady_and_restart {
        outcome.steady = Some(steady_state(&mut traffic, opts.idle, pid).await?);
        outcome.restart = Some(restart(&manager, &mut traffic, health, opts, n).await?);
    }
    manager.kill(Signal::Term).await.context("stopping the manager")?;
    drop(observer);
    Ok(outcome)
}

/// Nothing changes for `idle`: every request the manager makes is counted.
async fn steady_state(traffic: &mut Traffic, idle: Duration, pid: u32) -> Result<SteadyState> {
    traffic.take(|_| false)?;
    let start = Instant::now();
    tokio::time::sleep(idle).await;
    let events = traffic.take(is_manager_request)?;
    let requests = count(&events);
    let s = SteadyState {
        idle_s: start.elapsed().as_secs_f64(),
        writes: writes_of(&events),
        requests,
        peak_rss_mib: mib(peak_rss_kib(pid)?),
    };
    eprintln!(
        "capkr-bench: idle {:.0}s: {} requests, {} writes",
        s.idle_s, s.requests.total, s.requests.writes
    );
    Ok(s)
}

/// SIGTERM, start again with the same flags, time `/readyz`, count requests until quiet.
async fn restart(
    manager: &Process,
    traffic: &mut Traffic,
    health: u16,
    opts: &Options,
    n: usize,
) -> Result<RestartRun> {
    // Counted from before the stop: a write made while shutting down counts too.
    traffic.take(|_| false)?;
    let t_stop = Instant::now();
    manager.kill(Signal::Term).await.context("stopping the manager")?;
    let stop = t_stop.elapsed();
    let t_start = Instant::now();
    manager.restart().await.context("starting the manager again")?;
    let pid = manager.pid().ok_or_else(|| anyhow!("the manager has no pid"))?;
    wait_ready(manager, health, provisioning_timeout(n)).await?;
    let ready = t_start.elapsed();
    let (events, quiet) = traffic
        .until_quiet(is_manager_request, opts.quiet, provisioning_timeout(n))
        .await?;
    let quiet_at = t_start
        .elapsed()
        .saturating_sub(if quiet { opts.quiet } else { Duration::ZERO });
    let requests = count(&events);
    let r = RestartRun {
        stop_s: stop.as_secs_f64(),
        ready_s: ready.as_secs_f64(),
        quiet_s: quiet_at.as_secs_f64(),
        quiet,
        writes: writes_of(&events),
        requests,
        peak_rss_mib: mib(peak_rss_kib(pid)?),
        cpu_s: cpu_seconds(pid)?,
    };
    eprintln!(
        "capkr-bench: restart: ready after {:.2}s, {} requests, {} writes",
        r.ready_s, r.requests.total, r.requests.writes
    );
    Ok(r)
}

fn count(events: &[AuditEvent]) -> RequestCounts {
    RequestCounts::of(events, |_| true)
}

fn writes_of(events: &[AuditEvent]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.counts_request() && e.is_write())
        .take(50)
        .map(AuditEvent::describe)
        .collect()
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The port of `--health-addr=127.0.0.1:<port>` (the test environment picks a free one).
pub fn health_port(p: &Process) -> Result<u16> {
    p.spec()
        .loopback_port("--health-addr")
        .ok_or_else(|| anyhow!("no --health-addr=127.0.0.1:<port> in {}", p.spec().command_line()))
}

/// Polls `/readyz` every 20 ms until it answers 200.
pub async fn wait_ready(p: &Process, port: u16, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        if let Some(status) = p.try_exit_status() {
            bail!("{}", p.exit_report(status, 30));
        }
        if http_get(port, "/readyz").await.is_ok_and(|r| r.status == 200) {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!("{}: /readyz did not answer 200 within {timeout:?}", p.name());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
