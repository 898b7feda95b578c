//! Wiring of the manager: flags, logging, clients, the three controllers, shutdown.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Parser, ValueEnum};
use futures::FutureExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use tracing::info;
use tracing_subscriber::EnvFilter;

use crate::admin::{self, Health};
use crate::api::KaironMachine;
use crate::client::{BodyLimits, RequestMetrics, TokenBucket};
use crate::controller::{self, Settings};
use crate::controller::{CacheReadiness, Telemetry};
use crate::events::EventSource;
use crate::kairon::{Instances, Owner};
use crate::leader::{LeaderElectionConfig, LeaderElector};
use crate::metrics::Metrics;

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

    /// KaironMachine reconciles at once in each of two lanes: machines on their way to a
    /// Kairon Machine (finalizer, bootstrap data, create, providerID), and all others (status,
    /// deletion), which never queue behind the first.
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

    /// This management cluster's identity on Kairon, written as a label on every Kairon
    /// Machine it creates or adopts; the UID of its `kube-system` namespace when empty.
    #[arg(long, env = "CAPKR_MANAGEMENT_CLUSTER_ID", default_value = "")]
    pub management_cluster_id: String,

    /// Management clusters (comma-separated identities) whose Kairon Machines this one may
    /// adopt: the source of a `clusterctl move` to this management cluster.
    #[arg(long, value_delimiter = ',', default_value = "")]
    pub adopt_from_management_clusters: Vec<String>,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log verbosity: 0 info, 1 debug, 2 and more trace. RUST_LOG overrides it.
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    pub verbosity: u8,

    /// Run the controllers only while holding the leader Lease (for more than one replica).
    /// `--leader-elect`, `--leader-elect=true` and `--leader-elect=false` work, as in Go.
    #[arg(
        long,
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub leader_elect: bool,

    /// How long a lease not renewed stays valid for the other candidates.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader retries renewing before it gives up leadership (and exits).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// How often candidates try to acquire, and the leader renews, the lease.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,

    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "capkr-system")]
    pub leader_election_namespace: String,

    /// Namespace of the Secrets that KaironClusterIdentities name: the manager's own.
    #[arg(long, env = "POD_NAMESPACE", default_value = "capkr-system")]
    pub identity_secret_namespace: String,

    /// Kairon API servers an identity's kubeconfig may name (comma-separated): host names,
    /// `*.domain`, IP addresses, networks (`10.0.0.0/8`); any server when empty.
    #[arg(long, value_delimiter = ',', default_value = "")]
    pub identity_allowed_servers: Vec<String>,

    /// Name of the leader Lease.
    #[arg(long, default_value = "controller-leader-election-capkr")]
    pub leader_election_id: String,

    /// This replica's identity in the Lease, events and User-Agent; hostname and a random
    /// suffix when empty.
    #[arg(long, env = "POD_NAME", default_value = "")]
    pub leader_elect_identity: String,

    /// Address of /healthz and /readyz.
    #[arg(long, default_value = ":9440")]
    pub health_addr: String,

    /// Address of /metrics (HTTPS, authorized callers only; see --insecure-diagnostics); 0
    /// disables it.
    #[arg(long, default_value = ":8443")]
    pub metrics_bind_address: String,

    /// Serve /metrics over plain HTTP without authentication or authorization (as CAPI's
    /// managers' flag of the same name).
    #[arg(
        long,
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub insecure_diagnostics: bool,

    /// Directory with `tls.crt` and `tls.key` for /metrics; a self-signed certificate when empty.
    #[arg(long, default_value = "")]
    pub metrics_cert_dir: String,

    /// Requests per second to the Kubernetes API, sustained (client-side token bucket).
    #[arg(long, default_value_t = 20.0)]
    pub kube_api_qps: f32,

    /// Requests to the Kubernetes API allowed at once above --kube-api-qps.
    #[arg(long, default_value_t = 30)]
    pub kube_api_burst: u32,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl Args {
    /// Rejects values that would make the manager spin or never act, as client-go and
    /// controller-runtime do: a zero resync period would hot-loop every object, a zero retry
    /// period would spin on the Lease, and a lease that expires before the leader's renew
    /// deadline would let two replicas lead at once.
    pub fn validate(&self) -> Result<(), String> {
        if self.sync_period.is_zero() {
            return Err("--sync-period must be greater than 0".into());
        }
        if self.kaironmachine_concurrency == 0
            || self.kaironcluster_concurrency == 0
            || self.kaironmachinetemplate_concurrency == 0
        {
            return Err("the --*-concurrency flags must be at least 1".into());
        }
        for (flag, id) in std::iter::once(("--management-cluster-id", &self.management_cluster_id))
            .chain(
                self.adopt_from_management_clusters
                    .iter()
                    .map(|id| ("--adopt-from-management-clusters", id)),
            )
            .filter(|(_, id)| !id.is_empty())
        {
            if !is_label_value(id) {
                return Err(format!(
                    "{flag}: {id:?} is not a valid label value (at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends)"
                ));
            }
        }
        controller::AllowedServers::parse(&self.identity_allowed_servers)
            .map_err(|e| format!("--identity-allowed-servers: {e}"))?;
        if self.leader_elect {
            let (lease, renew, retry) = (
                self.leader_elect_lease_duration,
                self.leader_elect_renew_deadline,
                self.leader_elect_retry_period,
            );
            if retry.is_zero() {
                return Err("--leader-elect-retry-period must be greater than 0".into());
            }
            if lease <= renew {
                return Err(format!(
                    "--leader-elect-lease-duration ({lease:?}) must be greater than --leader-elect-renew-deadline ({renew:?})"
                ));
            }
            // client-go's rule, with its jitter factor of 1.2.
            if renew.as_secs_f64() <= 1.2 * retry.as_secs_f64() {
                return Err(format!(
                    "--leader-elect-renew-deadline ({renew:?}) must be greater than 1.2 x --leader-elect-retry-period ({retry:?})"
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn settings(&self) -> Settings {
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Settings {
            namespace: non_empty(&self.namespace),
            watch_filter: non_empty(&self.watch_filter),
            sync_period: self.sync_period,
            max_bootstrap_data_bytes: self.max_bootstrap_data_size,
            machine_concurrency: self.kaironmachine_concurrency,
            cluster_concurrency: self.kaironcluster_concurrency,
            template_concurrency: self.kaironmachinetemplate_concurrency,
            // Found out from the API servers at start.
            streaming_lists: false,
            kairon_streaming_lists: false,
            kairon_watch_timeout: (!self.kairon_kubeconfig.is_empty())
                .then_some(controller::endpoint_trust::WATCH_TIMEOUT_SECS),
        }
    }
}

/// A Kubernetes label value: at most 63 characters of `[A-Za-z0-9_.-]`, alphanumeric at both
/// ends.
fn is_label_value(s: &str) -> bool {
    s.len() <= 63
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// This management cluster's identity: the flag, else the UID of `kube-system` (stable for
/// the life of the cluster, different for every cluster).
async fn management_cluster_id(args: &Args, client: &Client) -> Result<String> {
    if !args.management_cluster_id.is_empty() {
        return Ok(args.management_cluster_id.clone());
    }
    let ns = Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .context("reading the kube-system namespace for --management-cluster-id")?;
    ns.metadata
        .uid
        .context("the kube-system namespace has no UID; set --management-cluster-id")
}

/// Parses a Go-style duration: `90s`, `10m`, `1h30m`, `10m0s`, `500ms`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
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
/// metrics and audit logs; followed by ` (<identity>)` to tell replicas apart.
pub(crate) const USER_AGENT: &str = concat!("capkr-manager/", env!("CARGO_PKG_VERSION"));

/// A replica identity when none is given: `<hostname>_<random>`, like client-go's.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "capkr-manager".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{host}_{:08x}", nanos ^ std::process::id().rotate_left(16))
}

/// Client limits and instruments; `None` for the plain client (leader election, probes).
struct Limits {
    qps: f32,
    burst: u32,
    metrics: Arc<Metrics>,
    /// Bounds on what the server sends back: for the Kairon APIs of identities.
    bodies: Option<BodyLimits>,
}

async fn client_from(path: &str, identity: &str, limits: Option<&Limits>) -> Result<Client> {
    Ok(client_with(config_from(path).await?, identity, limits)?)
}

async fn config_from(path: &str) -> Result<kube::Config> {
    if path.is_empty() {
        return kube::Config::infer()
            .await
            .context("no kubeconfig and not running in a cluster");
    }
    let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {path}"))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading kubeconfig {path}"))
}

/// A client of `config` with our User-Agent and, if given, the rate limit and request metrics.
fn client_with(mut config: kube::Config, identity: &str, limits: Option<&Limits>) -> Result<Client, kube::Error> {
    let ua = http::HeaderValue::from_str(&format!("{USER_AGENT} ({identity})"))
        .unwrap_or_else(|_| http::HeaderValue::from_static(USER_AGENT));
    config.headers.push((http::header::USER_AGENT, ua));
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(match limits {
        None => builder.build(),
        Some(l @ Limits { bodies: None, .. }) => builder
            .with_layer(&RequestMetrics(l.metrics.clone()))
            .with_layer(&TokenBucket::new(l.qps, l.burst))
            .build(),
        Some(l @ Limits { bodies: Some(b), .. }) => builder
            .with_layer(b)
            .with_layer(&RequestMetrics(l.metrics.clone()))
            .with_layer(&TokenBucket::new(l.qps, l.burst))
            .build(),
    })
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

/// Runs the manager until a shutdown signal (or, with leader election, until the lease is
/// lost: then the process exits with status 1 at once, so nothing more is written, and the
/// Deployment restarts it as a standby).
pub async fn run(args: Args) -> Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    init_logging(&args);
    let settings = args.settings();
    let identity = if args.leader_elect_identity.is_empty() {
        default_identity()
    } else {
        args.leader_elect_identity.clone()
    };
    let metrics = Metrics::new();
    let limits = Limits {
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
        metrics: metrics.clone(),
        bodies: None,
    };
    let client = client_from(&args.kubeconfig, &identity, Some(&limits)).await?;
    // A Kairon API of its own gives up on connections and silence as the identities' do.
    let kairon = if args.kairon_kubeconfig.is_empty() {
        client.clone()
    } else {
        let config = controller::endpoint_trust::bounded_waits(config_from(&args.kairon_kubeconfig).await?);
        client_with(config, &identity, Some(&limits))?
    };
    // Lease renewals and probes must not queue behind a burst of reconciles.
    let plain = client_from(&args.kubeconfig, &identity, None).await?;
    info!(?settings, %identity, version = env!("CARGO_PKG_VERSION"), "starting capkr-manager");

    // Events get a client of their own with its own token bucket of the same size, as a Go
    // provider's event recorder has (controller-runtime builds it from the same rest.Config):
    // publishing an event never delays a reconcile's own requests.
    let events_client = client_from(&args.kubeconfig, &identity, Some(&limits)).await?;
    let telemetry = Telemetry {
        metrics: metrics.clone(),
        caches: CacheReadiness::default(),
        events: Some(EventSource::new(events_client, identity.clone())),
    };
    let leading = Arc::new(AtomicBool::new(!args.leader_elect));
    let health = Health {
        client: plain.clone(),
        caches: telemetry.caches.clone(),
        leading: leading.clone(),
        reachability: Default::default(),
    };
    let health_addr = admin::parse_addr(&args.health_addr).map_err(anyhow::Error::msg)?;
    // An address that cannot be bound is fatal, as in the Go providers: a manager without its
    // probes would be restarted by the kubelet anyway, and silently.
    admin::spawn_health(health_addr, health)
        .await
        .with_context(|| format!("serving /healthz and /readyz on {}", args.health_addr))?;
    if args.metrics_bind_address != "0" {
        let addr = admin::parse_addr(&args.metrics_bind_address).map_err(anyhow::Error::msg)?;
        let access = if args.insecure_diagnostics {
            admin::MetricsAccess::Insecure
        } else {
            let dir = (!args.metrics_cert_dir.is_empty()).then(|| std::path::Path::new(&args.metrics_cert_dir));
            // Anyone who reaches the port can make the manager review tokens: on a client of
            // their own with a small rate limit, never delaying lease renewals or reconciles.
            let review_limits = Limits {
                qps: admin::REVIEW_QPS,
                burst: admin::REVIEW_BURST,
                metrics: metrics.clone(),
                bodies: None,
            };
            let reviews = client_from(&args.kubeconfig, &identity, Some(&review_limits)).await?;
            admin::MetricsAccess::Secure {
                gate: admin::Gate::new(reviews),
                tls: Box::new(admin::tls_config(dir)?),
            }
        };
        admin::spawn_metrics(addr, metrics.clone(), access)
            .await
            .with_context(|| format!("serving /metrics on {}", args.metrics_bind_address))?;
    }

    let shutdown = shutdown_signal().shared();
    let mut elector = None;
    if args.leader_elect {
        let mut e = LeaderElector::new(
            plain.clone(),
            LeaderElectionConfig {
                namespace: args.leader_election_namespace.clone(),
                name: args.leader_election_id.clone(),
                identity: identity.clone(),
                lease_duration: args.leader_elect_lease_duration,
                renew_deadline: args.leader_elect_renew_deadline,
                retry_period: args.leader_elect_retry_period,
            },
        );
        tokio::select! {
            _ = e.acquire() => {}
            _ = shutdown.clone() => {
                info!("shut down while standing by");
                return Ok(());
            }
        }
        leading.store(true, Ordering::SeqCst);
        elector = Some(e);
    }
    metrics.leader.set(1);

    let owner = Owner {
        id: management_cluster_id(&args, &client).await?,
        adopt_from: args
            .adopt_from_management_clusters
            .iter()
            .filter(|a| !a.is_empty())
            .cloned()
            .collect(),
    };
    info!(management_cluster = %owner.id, adopt_from = ?owner.adopt_from, "identity on Kairon");
    // Kairon APIs of identities: each gets a client of its own, with a token bucket of its own
    // (a busy or slow endpoint never delays another's requests) and bounds on what its server
    // sends back (the server is a tenant's).
    let factory: controller::endpoints::ClientFactory = {
        let (identity, qps, burst, metrics) = (
            identity.clone(),
            args.kube_api_qps,
            args.kube_api_burst,
            metrics.clone(),
        );
        Arc::new(move |config| {
            let limits = Limits {
                qps,
                burst,
                metrics: metrics.clone(),
                bodies: Some(BodyLimits::IDENTITY),
            };
            client_with(config, &identity, Some(&limits))
        })
    };
    let (triggers_tx, triggers) = futures::channel::mpsc::unbounded();
    let allowed = controller::AllowedServers::parse(&args.identity_allowed_servers).map_err(anyhow::Error::msg)?;
    let endpoints = Arc::new(
        controller::Endpoints::new(
            client.clone(),
            factory,
            owner.clone(),
            args.identity_secret_namespace.clone(),
            triggers_tx,
            telemetry.clone(),
        )
        .with_allowed_servers(allowed),
    );
    // Initial lists streamed where the API servers can: the least memory after a restart.
    let mut settings = settings;
    settings.streaming_lists = controller::streams_initial_lists(&settings.api::<KaironMachine>(&client)).await;
    settings.kairon_streaming_lists = if args.kairon_kubeconfig.is_empty() {
        settings.streaming_lists
    } else {
        controller::streams_initial_lists(&Instances::new(kairon.clone()).api(settings.namespace.as_deref())).await
    };
    info!(
        management = if settings.streaming_lists { "streamed" } else { "paged" },
        kairon = if settings.kairon_streaming_lists {
            "streamed"
        } else {
            "paged"
        },
        "initial lists"
    );
    // Clusters, KaironClusters and KaironMachines: one watch and one cache each, for all
    // controllers.
    let (caches, watches) = controller::caches::Caches::new(&client, &settings, &telemetry);
    let machines = controller::kairon_machine::controller(
        client.clone(),
        Instances::new(kairon).with_owner(owner),
        Some(controller::kairon_machine::Remote {
            endpoints: endpoints.clone(),
            triggers,
        }),
        &caches,
        settings.clone(),
        telemetry.clone(),
        shutdown.clone(),
    );
    let kcs = controller::kairon_cluster::controller(
        client.clone(),
        Some(endpoints),
        &caches,
        settings.clone(),
        telemetry.clone(),
        shutdown.clone(),
    );
    let templates = controller::kairon_machine_template::controller(
        client,
        settings,
        caches.clusters.store(),
        caches.clusters.synced(),
        telemetry,
        shutdown.clone(),
    );
    let controllers = async {
        // The shared watches run until every controller has stopped.
        tokio::select! {
            _ = async { tokio::join!(machines, kcs, templates) } => {}
            _ = watches => {}
        }
    };
    match elector {
        None => controllers.await,
        Some(mut e) => {
            tokio::select! {
                _ = controllers => {}
                why = e.keep() => {
                    // Stop writing at once: a new leader may already be reconciling.
                    tracing::error!(reason = %why, "leader election lost; exiting");
                    std::process::exit(1);
                }
            }
            // Stopped on a signal, after in-flight reconciles finished: hand over now rather
            // than after the lease expires.
            if let Err(e) = e.release().await {
                tracing::warn!(error = %e, "could not release the leader lease");
            }
        }
    }
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
        assert_eq!(
            s.kairon_watch_timeout, None,
            "the management cluster's client has no read timeout"
        );
        let s = Args::parse_from(["capkr-manager", "--kairon-kubeconfig=/k"]).settings();
        assert_eq!(
            s.kairon_watch_timeout,
            Some(controller::endpoint_trust::WATCH_TIMEOUT_SECS),
            "a Kairon API of its own: watches end before its client's read timeout"
        );
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

    #[test]
    fn operability_flags_have_capi_defaults() {
        let a = Args::parse_from(["capkr-manager"]);
        assert!(!a.leader_elect);
        assert_eq!(a.leader_elect_lease_duration, Duration::from_secs(15));
        assert_eq!(a.leader_elect_renew_deadline, Duration::from_secs(10));
        assert_eq!(a.leader_elect_retry_period, Duration::from_secs(2));
        assert_eq!(a.health_addr, ":9440");
        assert_eq!(a.metrics_bind_address, ":8443");
        assert_eq!(a.kube_api_qps, 20.0);
        assert_eq!(a.kube_api_burst, 30);
    }

    #[test]
    fn flags_that_would_spin_or_split_leadership_are_rejected() {
        let check = |extra: &[&str]| {
            Args::try_parse_from(["capkr-manager"].iter().chain(extra))
                .unwrap()
                .validate()
        };
        assert_eq!(check(&[]), Ok(()), "the defaults");
        assert_eq!(check(&["--leader-elect"]), Ok(()), "the leader-election defaults");
        for (bad, names) in [
            (vec!["--sync-period=0s"], "--sync-period"),
            (vec!["--management-cluster-id=not a label"], "--management-cluster-id"),
            (
                vec!["--adopt-from-management-clusters=ok,-bad"],
                "--adopt-from-management-clusters",
            ),
            (vec!["--kaironmachine-concurrency=0"], "concurrency"),
            (
                vec!["--leader-elect", "--leader-elect-retry-period=0s"],
                "--leader-elect-retry-period",
            ),
            (
                vec!["--leader-elect", "--leader-elect-lease-duration=10s"],
                "--leader-elect-lease-duration",
            ),
            (
                vec!["--leader-elect", "--leader-elect-retry-period=9s"],
                "--leader-elect-renew-deadline",
            ),
        ] {
            let err = check(&bad).expect_err(&format!("{bad:?} is rejected"));
            assert!(err.contains(names), "{bad:?}: {err}");
        }
        // Without leader election the lease flags do not matter; qps 0 means no client limit.
        assert_eq!(check(&["--leader-elect-retry-period=0s"]), Ok(()));
        assert_eq!(check(&["--kube-api-qps=0", "--kube-api-burst=0"]), Ok(()));
        assert_eq!(
            check(&[
                "--management-cluster-id=0f3c2e9a-1b7d-4c1e-9e55-3b8f1f0f0a11",
                "--adopt-from-management-clusters=mc-a,mc.b"
            ]),
            Ok(())
        );
    }

    #[test]
    fn identity_allowed_servers_take_names_domains_and_networks() {
        let parse = |value: &str| {
            Args::try_parse_from(["capkr-manager", &format!("--identity-allowed-servers={value}")])
                .map_err(|e| e.to_string())
                .and_then(|a| a.validate().map(|()| a.identity_allowed_servers))
        };
        assert_eq!(
            Args::parse_from(["capkr-manager"]).validate(),
            Ok(()),
            "none given: any server"
        );
        let cases: [(&str, Result<usize, &str>); 9] = [
            ("kairon.example.com", Ok(1)),
            ("kairon.example.com,*.sites.example.org", Ok(2)),
            ("10.0.0.0/8,fd00::/8,192.168.1.7", Ok(3)),
            ("10.0.0.0/8, kairon.example.com", Ok(2)),
            ("10.0.0.0/33", Err("10.0.0.0/33")),
            ("kairon.example.com:6443", Err("kairon.example.com:6443")),
            ("https://kairon.example.com", Err("https://kairon.example.com")),
            ("*", Err("\"*\"")),
            ("bad_name", Err("bad_name")),
        ];
        for (value, want) in cases {
            match (parse(value), want) {
                (Ok(entries), Ok(n)) => {
                    assert_eq!(entries.iter().filter(|e| !e.trim().is_empty()).count(), n, "{value}")
                }
                (Err(e), Err(names)) => {
                    assert!(
                        e.contains("--identity-allowed-servers") && e.contains(names),
                        "{value}: {e}"
                    )
                }
                (got, _) => panic!("{value}: {got:?}"),
            }
        }
    }

    #[test]
    fn leader_elect_takes_go_style_boolean_values() {
        let parse = |extra: &[&str]| {
            Args::try_parse_from(["capkr-manager"].iter().chain(extra)).map(|a| (a.leader_elect, a.namespace))
        };
        assert!(parse(&["--leader-elect"]).unwrap().0);
        assert!(parse(&["--leader-elect=true"]).unwrap().0);
        assert!(!parse(&["--leader-elect=false"]).unwrap().0);
        // A following flag or positional is not taken as its value.
        assert_eq!(
            parse(&["--leader-elect", "--namespace=a"]).unwrap(),
            (true, "a".to_string())
        );
        let err = parse(&["--leader-elect=yes"]).unwrap_err().to_string();
        assert!(err.contains("--leader-elect"), "{err}");
    }
}
