//! Wiring of the manager: flags, logging, clients, the three controllers, shutdown.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Parser, ValueEnum};
use futures::FutureExt;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tracing::info;
use tracing_subscriber::EnvFilter;

use crate::controller::{self, Settings};

/// Flags, named as the Go CAPI providers name theirs.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "capkr-manager",
    version,
    about = "Cluster API infrastructure provider for Kairon"
)]
pub struct Args {
    /// Namespace to watch; all namespaces when empty.
    #[arg(long, env = "CAPKR_NAMESPACE", default_value = "")]
    pub namespace: String,

    /// Reconcile only objects labelled cluster.x-k8s.io/watch-filter=<value>.
    #[arg(long, default_value = "")]
    pub watch_filter: String,

    /// Safety-net resync of every object (Go duration syntax, e.g. 10m0s).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub sync_period: Duration,

    /// Number of KaironMachines reconciled at once.
    #[arg(long, default_value_t = 10)]
    pub kaironmachine_concurrency: u16,

    /// Number of KaironClusters reconciled at once.
    #[arg(long, default_value_t = 10)]
    pub kaironcluster_concurrency: u16,

    /// Number of KaironMachineTemplates reconciled at once.
    #[arg(long, default_value_t = 2)]
    pub kaironmachinetemplate_concurrency: u16,

    /// Largest bootstrap payload accepted, in bytes.
    #[arg(long, default_value_t = crate::capi::bootstrap::DEFAULT_MAX_BOOTSTRAP_DATA_BYTES)]
    pub max_bootstrap_data_size: usize,

    /// Kubeconfig of the management cluster; in-cluster config or $KUBECONFIG when empty.
    #[arg(long, default_value = "")]
    pub kubeconfig: String,

    /// Kubeconfig of the API server serving Kairon Machines; the management cluster when empty.
    #[arg(long, default_value = "")]
    pub kairon_kubeconfig: String,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log verbosity: 0 info, 1 debug, 2 and more trace. RUST_LOG overrides it.
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    pub verbosity: u8,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl Args {
    pub fn settings(&self) -> Settings {
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Settings {
            namespace: non_empty(&self.namespace),
            watch_filter: non_empty(&self.watch_filter),
            sync_period: self.sync_period,
            max_bootstrap_data_bytes: self.max_bootstrap_data_size,
            machine_concurrency: self.kaironmachine_concurrency,
            cluster_concurrency: self.kaironcluster_concurrency,
            template_concurrency: self.kaironmachinetemplate_concurrency,
        }
    }
}

/// Parses a Go-style duration: `90s`, `10m`, `1h30m`, `10m0s`, `500ms`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("invalid duration {s:?}: use e.g. 30s, 10m, 1h30m");
    if s.is_empty() {
        return Err(err());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
        if digits == 0 {
            return Err(err());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| err())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            _ => return Err(err()),
        };
        total += unit;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

fn init_logging(args: &Args) {
    let default = match args.verbosity {
        0 => "info",
        1 => "info,capkr=debug",
        _ => "debug,capkr=trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match args.log_format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// The User-Agent of every request, so the manager's traffic can be told apart in API server
/// metrics and audit logs.
pub const USER_AGENT: &str = concat!("capkr-manager/", env!("CARGO_PKG_VERSION"));

async fn client_from(path: &str) -> Result<Client> {
    let mut config = if path.is_empty() {
        kube::Config::infer()
            .await
            .context("no kubeconfig and not running in a cluster")?
    } else {
        let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {path}"))?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("loading kubeconfig {path}"))?
    };
    config
        .headers
        .push((http::header::USER_AGENT, http::HeaderValue::from_static(USER_AGENT)));
    Ok(Client::try_from(config)?)
}

/// Resolves on the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received, shutting down"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT received, shutting down"),
    }
}

/// Runs the manager until a shutdown signal.
pub async fn run(args: Args) -> Result<()> {
    init_logging(&args);
    let settings = args.settings();
    let client = client_from(&args.kubeconfig).await?;
    let kairon = if args.kairon_kubeconfig.is_empty() {
        client.clone()
    } else {
        client_from(&args.kairon_kubeconfig).await?
    };
    info!(?settings, version = env!("CARGO_PKG_VERSION"), "starting capkr-manager");

    let shutdown = shutdown_signal().shared();
    let (clusters, machines) =
        controller::kairon_machine::controller(client.clone(), kairon, settings.clone(), shutdown.clone());
    let kcs = controller::kairon_cluster::controller(client.clone(), settings.clone(), shutdown.clone());
    let templates = controller::kairon_machine_template::controller(client, settings, clusters, shutdown);
    tokio::join!(machines, kcs, templates);
    info!("all controllers stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("10m0s"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("45s"), Ok(Duration::from_secs(45)));
        for bad in ["", "10", "m", "10x", "1.5h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_have_capi_style_defaults() {
        let args = Args::parse_from(["capkr-manager"]);
        let s = args.settings();
        assert_eq!(s.namespace, None);
        assert_eq!(s.watch_filter, None);
        assert_eq!(s.sync_period, Duration::from_secs(600));
        assert_eq!(s.machine_concurrency, 10);
        let args = Args::parse_from([
            "capkr-manager",
            "--namespace",
            "ns1",
            "--watch-filter",
            "team-a",
            "--log-format",
            "json",
            "-v",
            "2",
        ]);
        let s = args.settings();
        assert_eq!(s.namespace.as_deref(), Some("ns1"));
        assert_eq!(s.watch_filter.as_deref(), Some("team-a"));
        assert_eq!(args.log_format, LogFormat::Json);
        assert_eq!(args.verbosity, 2);
    }
}
