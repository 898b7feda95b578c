//! The manager's flags, named as the Go CAPI providers name theirs (and with their meaning:
//! CAPI's managers, clusterctl's components and the Cluster API Operator pass them), and what
//! they may be.
//!
//! As Go's `pflag`, a flag given twice takes the last value: the Cluster API Operator appends
//! its arguments (`--diagnostics-address`, `--leader-elect=true`, …) to those of the
//! components, which may already name the same flag under another of its names.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};

use crate::admin::tls_options::{self, CipherSuites, Curves, TlsOptions, TlsVersion};
use crate::controller::{self, Settings};

mod feature_gates;

pub use feature_gates::FeatureGates;
use feature_gates::parse_feature_gates;

const WATCHING: &str = "Watching and reconciling";
const LEADER: &str = "Leader election";
const DIAGNOSTICS: &str = "Diagnostics: health, metrics, profiler";
const TLS: &str = "TLS of the metrics server (CAPI's manager options)";
const GATES: &str = "Feature gates";
const WEBHOOK: &str = "Webhook server: accepted for CAPI's tooling, unused (the provider has no webhook server)";
const KAIRON: &str = "Kairon";
const CLIENT: &str = "Kubernetes API client";
const LOGGING: &str = "Logging";

/// Flags, named as the Go CAPI providers name theirs.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "capkr-manager",
    version,
    about = "Cluster API infrastructure provider for Kairon",
    args_override_self = true
)]
pub struct Args {
    /// Namespace to watch; all namespaces when empty.
    #[arg(long, env = "CAPKR_NAMESPACE", default_value = "", help_heading = WATCHING)]
    pub namespace: String,

    /// Reconcile only objects labelled cluster.x-k8s.io/watch-filter=<value>.
    #[arg(long, default_value = "", help_heading = WATCHING)]
    pub watch_filter: String,

    /// Safety-net resync of every object (Go duration syntax, e.g. 10m0s).
    #[arg(long, default_value = "10m", value_parser = parse_duration, help_heading = WATCHING)]
    pub sync_period: Duration,

    /// How long a VM may stay on a cordoned Kairon node before its Machine is replaced through
    /// CAPI: the time an operator has to migrate it live instead (Go duration syntax).
    #[arg(long, default_value = "60s", value_parser = parse_duration, help_heading = WATCHING)]
    pub evacuation_grace_period: Duration,

    /// How long the deletion of a Kairon Machine may wait on Kairon's finalizers before the
    /// KaironMachine says it is stuck and what the operator can do (Go duration syntax).
    #[arg(long, default_value = "5m", value_parser = parse_duration, help_heading = WATCHING)]
    pub kairon_deletion_grace_period: Duration,

    /// KaironMachine reconciles at once in each of two lanes: machines on their way to a
    /// Kairon Machine (finalizer, bootstrap data, create, providerID), and all others (status,
    /// deletion), which never queue behind the first. [default: 10]
    #[arg(long, help_heading = WATCHING)]
    pub kaironmachine_concurrency: Option<u16>,

    /// Number of KaironClusters reconciled at once. [default: 10]
    #[arg(long, help_heading = WATCHING)]
    pub kaironcluster_concurrency: Option<u16>,

    /// Number of KaironMachineTemplates reconciled at once. [default: 2]
    #[arg(long, help_heading = WATCHING)]
    pub kaironmachinetemplate_concurrency: Option<u16>,

    /// Number of KaironMachinePools reconciled at once. [default: 5]
    #[arg(long, help_heading = WATCHING)]
    pub kaironmachinepool_concurrency: Option<u16>,

    /// Reconciles at once of every controller whose own --<kind>-concurrency is not given (the
    /// Cluster API Operator's `maxConcurrentReconciles`; for KaironMachines, per lane).
    #[arg(long, help_heading = WATCHING)]
    pub max_concurrent_reconciles: Option<u16>,

    /// Largest bootstrap payload accepted, in bytes.
    #[arg(long, default_value_t = crate::capi::bootstrap::DEFAULT_MAX_BOOTSTRAP_DATA_BYTES, help_heading = WATCHING)]
    pub max_bootstrap_data_size: usize,

    /// Run the controllers only while holding the leader Lease (for more than one replica).
    /// `--leader-elect`, `--leader-elect=true` and `--leader-elect=false` work, as in Go.
    #[arg(
        long,
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        help_heading = LEADER
    )]
    pub leader_elect: bool,

    /// How long a lease not renewed stays valid for the other candidates.
    #[arg(long, default_value = "15s", value_parser = parse_duration, help_heading = LEADER)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader retries renewing before it gives up leadership (and exits).
    #[arg(long, default_value = "10s", value_parser = parse_duration, help_heading = LEADER)]
    pub leader_elect_renew_deadline: Duration,

    /// How often candidates try to acquire, and the leader renews, the lease.
    #[arg(long, default_value = "2s", value_parser = parse_duration, help_heading = LEADER)]
    pub leader_elect_retry_period: Duration,

    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "capkr-system", help_heading = LEADER)]
    pub leader_election_namespace: String,

    /// Name of the leader Lease; `<namespace>/<name>` (as the Cluster API Operator passes it)
    /// also sets its namespace.
    #[arg(long, default_value = "controller-leader-election-capkr", help_heading = LEADER)]
    pub leader_election_id: String,

    /// This replica's identity in the Lease, events and User-Agent; hostname and a random
    /// suffix when empty.
    #[arg(long, env = "POD_NAME", default_value = "", help_heading = LEADER)]
    pub leader_elect_identity: String,

    /// Address of /healthz and /readyz.
    #[arg(long, default_value = ":9440", help_heading = DIAGNOSTICS)]
    pub health_addr: String,

    /// Address of /metrics (HTTPS, authorized callers only; see --insecure-diagnostics); 0
    /// disables it. CAPI's --diagnostics-address (and the older --metrics-bind-addr) are
    /// other names of it.
    #[arg(
        long,
        visible_aliases = ["diagnostics-address", "metrics-bind-addr"],
        default_value = ":8443",
        help_heading = DIAGNOSTICS
    )]
    pub metrics_bind_address: String,

    /// Serve /metrics over plain HTTP without authentication or authorization (as CAPI's
    /// managers' flag of the same name).
    #[arg(
        long,
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        help_heading = DIAGNOSTICS
    )]
    pub insecure_diagnostics: bool,

    /// Directory with `tls.crt` and `tls.key` for /metrics; a self-signed certificate when empty.
    #[arg(long, default_value = "", help_heading = DIAGNOSTICS)]
    pub metrics_cert_dir: String,

    /// CAPI's pprof address. Accepted empty only: the manager is not a Go program and has no
    /// pprof profiler, so an address is refused at start rather than left silently unserved.
    #[arg(long, default_value = "", help_heading = DIAGNOSTICS)]
    pub profiler_address: String,

    /// Lowest TLS version of the metrics server (HTTPS only): VersionTLS12 or VersionTLS13
    /// (Go's VersionTLS10 and VersionTLS11 are refused: rustls implements neither).
    #[arg(long, default_value = "VersionTLS12", value_parser = tls_options::parse_tls_version, help_heading = TLS)]
    pub tls_min_version: TlsVersion,

    /// Comma-separated TLS 1.2 cipher suites of the metrics server, by the IANA names Go's
    /// crypto/tls gives: TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    /// TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    /// TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    /// TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256; all of them when empty. TLS 1.3 names are
    /// accepted and, as in Go, change nothing (TLS 1.3 suites are always offered). Go's CBC,
    /// RC4, 3DES and RSA key-exchange suites, and unknown names, are refused.
    #[arg(long, default_value = "", value_parser = tls_options::parse_cipher_suites, help_heading = TLS)]
    pub tls_cipher_suites: CipherSuites,

    /// Comma-separated key-exchange groups of the metrics server as Go's numeric
    /// tls.CurveID: 23 (P-256), 24 (P-384), 29 (X25519); all of them when empty (order
    /// ignored, as in Go).
    #[arg(long, default_value = "", value_parser = tls_options::parse_curves, help_heading = TLS)]
    pub tls_curve_preferences: Curves,

    /// Feature gates, `Gate=true|false,...` (Go's `strconv.ParseBool` values), as CAPI's
    /// managers take them; given more than once, merged. Options are:
    /// MachinePool=true|false (GA - default=true, locked: the KaironMachinePool controller
    /// always runs, so false is refused);
    /// AllAlpha=true|false and AllBeta=true|false (accepted: there is no alpha or beta gate).
    /// An unknown gate stops the manager at start.
    #[arg(long, value_parser = parse_feature_gates, action = ArgAction::Append, help_heading = GATES)]
    pub feature_gates: Vec<FeatureGates>,

    /// Kubeconfig of the management cluster; in-cluster config or $KUBECONFIG when empty.
    #[arg(long, default_value = "", help_heading = CLIENT)]
    pub kubeconfig: String,

    /// Requests per second to the Kubernetes API, sustained (client-side token bucket). The
    /// default is CAPI's own managers' (v1.14: 100, bursts of 200).
    #[arg(long, default_value_t = 100.0, help_heading = CLIENT)]
    pub kube_api_qps: f32,

    /// Requests to the Kubernetes API allowed at once above --kube-api-qps.
    #[arg(long, default_value_t = 200, help_heading = CLIENT)]
    pub kube_api_burst: u32,

    /// Kubeconfig of the API server serving Kairon Machines; the management cluster when empty.
    #[arg(long, default_value = "", help_heading = KAIRON)]
    pub kairon_kubeconfig: String,

    /// This management cluster's identity on Kairon, written as a label on every Kairon
    /// Machine it creates or adopts; the UID of its `kube-system` namespace when empty.
    #[arg(long, env = "CAPKR_MANAGEMENT_CLUSTER_ID", default_value = "", help_heading = KAIRON)]
    pub management_cluster_id: String,

    /// Management clusters (comma-separated identities) whose Kairon Machines this one may
    /// adopt: the source of a `clusterctl move` to this management cluster.
    #[arg(long, value_delimiter = ',', default_value = "", help_heading = KAIRON)]
    pub adopt_from_management_clusters: Vec<String>,

    /// Namespace of the Secrets that KaironClusterIdentities name: the manager's own.
    #[arg(long, env = "POD_NAMESPACE", default_value = "capkr-system", help_heading = KAIRON)]
    pub identity_secret_namespace: String,

    /// Kairon API servers an identity's kubeconfig may name (comma-separated): host names,
    /// `*.domain`, IP addresses, networks (`10.0.0.0/8`); any server when empty.
    #[arg(long, value_delimiter = ',', default_value = "", help_heading = KAIRON)]
    pub identity_allowed_servers: Vec<String>,

    /// Kairon APIs of identities the manager speaks to at once for one namespace; a
    /// KaironCluster naming one more identity waits, saying so, until one is no longer used.
    #[arg(long, default_value_t = controller::endpoints::ledger::ENDPOINTS_PER_NAMESPACE, help_heading = KAIRON)]
    pub identity_endpoints_per_namespace: usize,

    /// Bytes of Kairon Machines (as kept) the manager holds from the Kairon APIs of one
    /// namespace's identities together; the one that goes over is cut off.
    #[arg(long, default_value_t = controller::endpoints::ledger::BYTES_PER_NAMESPACE, help_heading = KAIRON)]
    pub identity_cache_bytes_per_namespace: usize,

    /// Bytes of Kairon Machines (as kept) the manager holds from the Kairon APIs of all
    /// identities together; the one that goes over is cut off.
    #[arg(long, default_value_t = controller::endpoints::ledger::BYTES, help_heading = KAIRON)]
    pub identity_cache_bytes: usize,

    /// Log format (CAPI's name: --logging-format).
    #[arg(long, visible_alias = "logging-format", value_enum, default_value_t = LogFormat::Text, help_heading = LOGGING)]
    pub log_format: LogFormat,

    /// Log verbosity: 0 info, 1 debug, 2 and more trace. RUST_LOG overrides it.
    #[arg(short = 'v', long = "v", default_value_t = 0, help_heading = LOGGING)]
    pub verbosity: u8,

    /// Unused: there is no webhook server.
    #[arg(long, default_value_t = 9443, help_heading = WEBHOOK)]
    pub webhook_port: u16,

    /// Unused: there is no webhook server.
    #[arg(long, default_value = "", help_heading = WEBHOOK)]
    pub webhook_host: String,

    /// Unused: there is no webhook server.
    #[arg(long, default_value = "/tmp/k8s-webhook-server/serving-certs/", help_heading = WEBHOOK)]
    pub webhook_cert_dir: String,

    /// Unused: there is no webhook server.
    #[arg(long, default_value = "tls.crt", help_heading = WEBHOOK)]
    pub webhook_cert_name: String,

    /// Unused: there is no webhook server.
    #[arg(long, default_value = "tls.key", help_heading = WEBHOOK)]
    pub webhook_key_name: String,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Go's `strconv.ParseBool`.
pub(super) fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

impl Args {
    /// Rejects values that would make the manager spin or never act, as client-go and
    /// controller-runtime do: a zero resync period would hot-loop every object, a zero retry
    /// period would spin on the Lease, and a lease that expires before the leader's renew
    /// deadline would let two replicas lead at once. Also what it would accept and not do: a
    /// profiler address, a Lease id that names no Lease.
    pub fn validate(&self) -> Result<(), String> {
        if self.sync_period.is_zero() {
            return Err("--sync-period must be greater than 0".into());
        }
        if [
            self.kaironmachine_concurrency,
            self.kaironcluster_concurrency,
            self.kaironmachinetemplate_concurrency,
            self.kaironmachinepool_concurrency,
            self.max_concurrent_reconciles,
        ]
        .contains(&Some(0))
        {
            return Err("the --*-concurrency flags and --max-concurrent-reconciles must be at least 1".into());
        }
        if !self.profiler_address.is_empty() {
            return Err(format!(
                "--profiler-address={}: capkr-manager is not a Go program and has no pprof profiler to serve; \
                 leave the flag out (or empty). Its reconcile, work-queue and request metrics are on /metrics",
                self.profiler_address
            ));
        }
        self.leader_election_lease()?;
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
        if [
            self.identity_endpoints_per_namespace,
            self.identity_cache_bytes_per_namespace,
            self.identity_cache_bytes,
        ]
        .contains(&0)
        {
            return Err(
                "--identity-endpoints-per-namespace, --identity-cache-bytes-per-namespace and --identity-cache-bytes \
                 must be at least 1"
                    .into(),
            );
        }
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
        let defaults = Settings::default();
        // A controller's own flag, else --max-concurrent-reconciles, else its default.
        let places = |own: Option<u16>, default: u16| own.or(self.max_concurrent_reconciles).unwrap_or(default);
        Settings {
            namespace: non_empty(&self.namespace),
            watch_filter: non_empty(&self.watch_filter),
            sync_period: self.sync_period,
            max_bootstrap_data_bytes: self.max_bootstrap_data_size,
            machine_concurrency: places(self.kaironmachine_concurrency, defaults.machine_concurrency),
            cluster_concurrency: places(self.kaironcluster_concurrency, defaults.cluster_concurrency),
            template_concurrency: places(self.kaironmachinetemplate_concurrency, defaults.template_concurrency),
            pool_concurrency: places(
                self.kaironmachinepool_concurrency,
                controller::settings::POOL_CONCURRENCY,
            ),
            // Found out from the API servers at start.
            streaming_lists: false,
            kairon_streaming_lists: false,
            kairon_watch_timeout: (!self.kairon_kubeconfig.is_empty())
                .then_some(controller::endpoints::trust::WATCH_TIMEOUT_SECS),
            evacuation_grace_period: self.evacuation_grace_period,
            kairon_deletion_grace_period: self.kairon_deletion_grace_period,
        }
    }

    /// How many endpoints of identities a namespace opens, and how much they keep.
    pub(crate) fn endpoint_caps(&self) -> controller::EndpointCaps {
        controller::EndpointCaps {
            endpoints_per_namespace: self.identity_endpoints_per_namespace,
            bytes_per_namespace: self.identity_cache_bytes_per_namespace,
            bytes: self.identity_cache_bytes,
        }
    }

    /// The leader Lease: (namespace, name). `--leader-election-id=<ns>/<name>` names both,
    /// as the Cluster API Operator writes it.
    pub(crate) fn leader_election_lease(&self) -> Result<(String, String), String> {
        let id = &self.leader_election_id;
        match id.split_once('/') {
            None if !id.is_empty() => Ok((self.leader_election_namespace.clone(), id.clone())),
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok((ns.to_string(), name.to_string()))
            }
            _ => Err(format!(
                "--leader-election-id={id:?}: a Lease name, or <namespace>/<name>"
            )),
        }
    }

    /// The gates as set: every known gate, given or at its default.
    pub(crate) fn feature_gates(&self) -> BTreeMap<&'static str, bool> {
        feature_gates::effective(&self.feature_gates)
    }

    /// What every TLS listener allows.
    pub(crate) fn tls_options(&self) -> TlsOptions {
        TlsOptions {
            min_version: self.tls_min_version,
            cipher_suites: self.tls_cipher_suites.0.clone(),
            curves: self.tls_curve_preferences.0.clone(),
        }
    }

    /// The webhook flags given with other values than their defaults: accepted, and unused.
    pub(crate) fn webhook_flags_given(&self) -> Vec<&'static str> {
        let d = Args::parse_from(["capkr-manager"]);
        [
            ("--webhook-port", self.webhook_port != d.webhook_port),
            ("--webhook-host", self.webhook_host != d.webhook_host),
            ("--webhook-cert-dir", self.webhook_cert_dir != d.webhook_cert_dir),
            ("--webhook-cert-name", self.webhook_cert_name != d.webhook_cert_name),
            ("--webhook-key-name", self.webhook_key_name != d.webhook_key_name),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
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

#[cfg(test)]
mod tests;
