//! Wiring of the manager: flags, logging, clients, the controllers, shutdown.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, Result};
use futures::FutureExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use tracing::info;
use tracing_subscriber::EnvFilter;

use crate::admin::{self, Health};
use crate::client::{BodyLimits, RequestMetrics, TokenBucket};
use crate::controller::{self};
use crate::controller::{CacheReadiness, Telemetry};
use crate::events::EventSource;
use crate::kairon::Owner;
use crate::leader::{LeaderElectionConfig, LeaderElector};
use crate::metrics::Metrics;

mod flags;

pub use flags::{Args, LogFormat};

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
        None
    } else {
        let config = controller::endpoints::trust::bounded_waits(config_from(&args.kairon_kubeconfig).await?);
        Some(client_with(config, &identity, Some(&limits))?)
    };
    // Lease renewals and probes must not queue behind a burst of reconciles.
    let plain = client_from(&args.kubeconfig, &identity, None).await?;
    let feature_gates = args.feature_gates();
    info!(?settings, ?feature_gates, %identity, version = env!("CARGO_PKG_VERSION"), "starting capkr-manager");
    let webhook_flags = args.webhook_flags_given();
    if !webhook_flags.is_empty() {
        info!(flags = ?webhook_flags, "webhook flags ignored: the provider has no webhook server (validation is in the CRD schemas)");
    }

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
                tls: Box::new(admin::tls_config(dir, &args.tls_options())?),
            }
        };
        admin::spawn_metrics(addr, metrics.clone(), access)
            .await
            .with_context(|| format!("serving /metrics on {}", args.metrics_bind_address))?;
    }

    let shutdown = shutdown_signal().shared();
    let mut elector = None;
    if args.leader_elect {
        let (namespace, name) = args.leader_election_lease().map_err(anyhow::Error::msg)?;
        let mut e = LeaderElector::new(
            plain.clone(),
            LeaderElectionConfig {
                namespace,
                name,
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
    let allowed = controller::AllowedServers::parse(&args.identity_allowed_servers).map_err(anyhow::Error::msg)?;
    let controllers = controller::run::run(
        controller::run::Wiring {
            management: client,
            kairon,
            owner,
            settings,
            telemetry,
            endpoint_clients: factory,
            allowed_servers: allowed,
            endpoint_caps: args.endpoint_caps(),
            identity_secret_namespace: args.identity_secret_namespace.clone(),
        },
        shutdown.clone(),
    );
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
