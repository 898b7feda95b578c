//! `make demo`: see `capkr_testenv::demo`. `--exit-when-ready` exits 0 once the cluster is up.

use std::time::Duration;

use anyhow::{Result, bail};
use capkr_testenv::demo::{DemoOptions, run};

fn usage() -> &'static str {
    "usage: capkr-demo [--exit-when-ready] [--timeout SECONDS] [--sim-arg ARG]... [--manager-arg ARG]..."
}

fn parse_args() -> Result<DemoOptions> {
    let mut opts = DemoOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--exit-when-ready" => opts.exit_when_ready = true,
            "--timeout" => {
                let v = args.next().unwrap_or_default();
                let secs: u64 = v
                    .parse()
                    .map_err(|_| anyhow::anyhow!("--timeout wants seconds, got {v:?}"))?;
                opts.timeout = Duration::from_secs(secs);
            }
            "--sim-arg" => opts.simulator_args.extend(args.next()),
            "--manager-arg" => opts.manager_args.extend(args.next()),
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{}", usage()),
        }
    }
    Ok(opts)
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let opts = parse_args()?;
    tokio::select! {
        r = run(opts) => { r?; }
        _ = shutdown_signal() => {
            // Dropping `run` drops the environment: every process is stopped, the dir removed.
            eprintln!("\nStopping: tearing down the demo environment ...");
        }
    }
    Ok(())
}
