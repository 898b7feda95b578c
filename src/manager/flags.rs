//! The manager's flags, named as the Go CAPI providers name theirs, and what they may be.

use std::time::Duration;

use clap::{Parser, ValueEnum};

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
            pool_concurrency: controller::settings::POOL_CONCURRENCY,
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
