//! The manager's flags as operators read them and as CAPI's tooling passes them: the flag table
//! (docs/operations.md) documents every flag of `capkr-manager --help` with its default; the flags of clusterctl's
//! components, of CAPI's own managers and those the Cluster API Operator (v0.29.0,
//! `internal/controller/component_customizer.go`) adds are accepted, with CAPI's meaning, by a
//! manager that then serves `/readyz` against a real API server; an unknown feature gate or
//! cipher suite stops it at start, naming what is wrong; and `--tls-min-version` and
//! `--tls-cipher-suites` hold on the metrics port.

use std::sync::Arc;
use std::time::Duration;

use capkr_testenv::{CapiManagers, Env, EnvOptions, free_port, http_get, own_binary};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

/// Every flag of `capkr-manager --help` has a row in the flag table (docs/operations.md), and the default
/// the table gives is the one `--help` shows where `--help` shows one; the row names the
/// flag's other names (`[aliases: ...]`) too.
#[test]
fn the_flag_table_documents_every_manager_flag_with_its_default() {
    let manager = own_binary("capkr-manager", "CAPKR_MANAGER_BIN").unwrap();
    let out = std::process::Command::new(manager).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let readme = std::fs::read_to_string(capkr_testenv::workspace_root().join("docs/operations.md")).unwrap();
    let mut flags = 0;
    // `--help` entries: "      --flag <VALUE>" or "  -v, --v <V>", then the help text up to
    // the next entry, where clap shows "[default: x]". Headings ("Leader election:") end an
    // entry.
    let mut entries: Vec<String> = vec![];
    let mut in_entry = false;
    for line in help.lines() {
        if line.trim_start().starts_with('-') {
            entries.push(line.to_string());
            in_entry = true;
        } else if !line.starts_with(' ') {
            in_entry = false;
        } else if let Some(e) = entries.last_mut().filter(|_| in_entry) {
            e.push(' ');
            e.push_str(line.trim());
        }
    }
    let mut defaults = 0;
    for entry in &entries {
        let flag = entry
            .split_whitespace()
            .find(|w| w.starts_with("--"))
            .unwrap()
            .trim_end_matches(',');
        let flag = flag.split('[').next().unwrap();
        if flag == "--help" || flag == "--version" {
            continue;
        }
        let readme_flag = if flag == "--v" { "-v" } else { flag };
        let row = readme
            .lines()
            .find(|l| l.starts_with(&format!("| `{readme_flag}` |")))
            .unwrap_or_else(|| panic!("docs/operations.md has no row for {readme_flag}"));
        if let Some(default) = entry
            .split("[default: ")
            .nth(1)
            .and_then(|d| d.split(']').next())
            .filter(|d| !d.is_empty() && *d != "\"\"")
        {
            defaults += 1;
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert!(
                cells[2].contains(&format!("`{default}`")),
                "the row of {readme_flag} gives default {:?}, --help says {default:?}",
                cells[2]
            );
        }
        let aliases = ["[aliases: ", "[alias: "]
            .iter()
            .find_map(|a| entry.split(a).nth(1))
            .and_then(|a| a.split(']').next());
        for alias in aliases.into_iter().flat_map(|a| a.split(", ")) {
            assert!(
                row.contains(&format!("`{alias}`")),
                "the row of {readme_flag} does not name its alias {alias}: {row}"
            );
        }
        flags += 1;
    }
    assert!(
        flags >= 30 && defaults >= 20,
        "parsed {flags} flags and {defaults} defaults from --help:\n{help}"
    );
}

/// One environment for the tests that run managers: an API server with the CRDs (no CAPI
/// managers), and the namespace of the shipped Lease.
async fn env() -> &'static Env {
    Env::shared_with(
        EnvOptions::new("operability-flags").capi_managers(CapiManagers::NONE),
        |env| async move {
            env.create_namespace("capkr-system").await?;
            Ok(())
        },
    )
    .await
    .expect("test environment")
}

/// What a row expects of its manager once `/readyz` is 200.
enum Expect {
    /// Nothing more.
    Ready,
    /// `/metrics` over plain HTTP on this port (controller-runtime's names in it), and no
    /// answer on the other.
    MetricsOn { port: u16, not_on: Option<u16> },
    /// `/metrics` over HTTPS on this port, 401 without a token.
    HttpsMetricsOn(u16),
    /// The Lease `namespace/name` held by the row's identity.
    Lease(&'static str, &'static str),
    /// `controller_runtime_max_concurrent_reconciles` of each controller, on this port.
    Places(u16, [(&'static str, u32); 4]),
}

/// `curl -sk https://127.0.0.1:<port>/metrics`: the HTTP status, 0 without an answer.
fn https_status(port: u16) -> u16 {
    let out = std::process::Command::new("curl")
        .args(["-sk", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("https://127.0.0.1:{port}/metrics"))
        .output()
        .expect("curl runs");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
}

/// The flags clusterctl's components (ours, as shipped), CAPI's own managers' components and
/// the Cluster API Operator pass, one manager per row: each starts and serves `/readyz`, and
/// the flag does what it means in CAPI. The environment chooses the loopback addresses (the
/// shipped `:9440` and `:8443` would collide between managers) and, where a row elects a
/// leader, a Lease of its own, so that the rows run side by side.
#[tokio::test(flavor = "multi_thread")]
async fn the_flags_clusterctl_components_and_the_operator_pass_are_accepted_with_capis_meaning() {
    let env = env().await;
    env.create_namespace("flags-watched").await.unwrap();
    let shipped = shipped_manager_args();
    assert!(
        shipped.iter().any(|a| a == "--leader-elect")
            && shipped.iter().any(|a| a.starts_with("--metrics-bind-address")),
        "config/manager/manager.yaml's arguments: {shipped:?}"
    );
    let port = || free_port().unwrap();
    let (components_metrics, operator_metrics, old_name, places) = (port(), port(), port(), port());
    let (capi_style, tls) = (port(), port());
    // The environment gives every manager `--metrics-bind-address` unless a row does: a row
    // naming the address by another name gives it first, as the components do before the
    // operator's arguments, so that its own comes last and wins.
    let components = || format!("--metrics-bind-address=127.0.0.1:{}", free_port().unwrap());
    let rows: Vec<(&str, Vec<String>, Expect)> = vec![
        (
            "clusterctl components: config/manager/manager.yaml's arguments",
            [shipped, vec!["--leader-election-id=flags-shipped".into()]].concat(),
            Expect::Ready,
        ),
        (
            "CAPI's components: --diagnostics-address with --insecure-diagnostics=false, --feature-gates",
            vec![
                "--leader-elect".into(),
                components(),
                format!("--diagnostics-address=127.0.0.1:{capi_style}"),
                "--insecure-diagnostics=false".into(),
                "--feature-gates=MachinePool=true".into(),
                "--leader-election-id=flags-capi-style".into(),
            ],
            Expect::HttpsMetricsOn(capi_style),
        ),
        (
            "operator: --diagnostics-address and --insecure-diagnostics=true after the components' --metrics-bind-address",
            vec![
                format!("--metrics-bind-address=127.0.0.1:{components_metrics}"),
                format!("--diagnostics-address=127.0.0.1:{operator_metrics}"),
                "--insecure-diagnostics=true".into(),
            ],
            Expect::MetricsOn {
                port: operator_metrics,
                not_on: Some(components_metrics),
            },
        ),
        (
            "operator: the deprecated --metrics-bind-addr",
            vec![
                components(),
                format!("--metrics-bind-addr=127.0.0.1:{old_name}"),
                "--insecure-diagnostics=true".into(),
            ],
            Expect::MetricsOn {
                port: old_name,
                not_on: None,
            },
        ),
        (
            "operator: leader election, --leader-election-id=<namespace>/<name>",
            vec![
                "--leader-elect=true".into(),
                "--leader-election-id=capkr-system/flags-operator-lease".into(),
                "--leader-elect-lease-duration=15s".into(),
                "--leader-elect-renew-deadline=10s".into(),
                "--leader-elect-retry-period=2s".into(),
                "--leader-elect-identity=flags-operator".into(),
            ],
            Expect::Lease("capkr-system", "flags-operator-lease"),
        ),
        (
            "operator: manager spec (namespace, sync period, verbosity, feature gates, concurrency)",
            vec![
                "--namespace=flags-watched".into(),
                "--sync-period=600s".into(),
                "--v=2".into(),
                "--feature-gates=AllAlpha=false,AllBeta=false,MachinePool=true".into(),
                "--max-concurrent-reconciles=3".into(),
                "--kaironcluster-concurrency=7".into(),
                components(),
                format!("--diagnostics-address=127.0.0.1:{places}"),
                "--insecure-diagnostics=true".into(),
            ],
            Expect::Places(
                places,
                [
                    ("kaironmachine", 6),
                    ("kaironcluster", 7),
                    ("kaironmachinetemplate", 3),
                    ("kaironmachinepool", 3),
                ],
            ),
        ),
        (
            "operator and CAPI: the webhook flags (no webhook server)",
            vec![
                "--webhook-host=0.0.0.0".into(),
                "--webhook-port=9443".into(),
                "--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs/".into(),
                "--webhook-cert-name=tls.crt".into(),
                "--webhook-key-name=tls.key".into(),
            ],
            Expect::Ready,
        ),
        (
            "CAPI's manager options: TLS flags, --profiler-address empty, --logging-format",
            vec![
                components(),
                format!("--diagnostics-address=127.0.0.1:{tls}"),
                "--insecure-diagnostics=false".into(),
                "--tls-min-version=VersionTLS12".into(),
                "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256".into(),
                "--tls-curve-preferences=29,23".into(),
                "--profiler-address=".into(),
                "--logging-format=json".into(),
            ],
            Expect::HttpsMetricsOn(tls),
        ),
    ];
    let started = std::time::Instant::now();
    let checks = rows.into_iter().map(|(what, args, expect)| async move {
        let t0 = std::time::Instant::now();
        let mut args = args;
        if !args.iter().any(|a| a.starts_with("--health-addr")) {
            args.push(format!("--health-addr=127.0.0.1:{}", free_port().unwrap()));
        }
        let manager = env.start_manager(args.clone()).unwrap();
        let health = manager.spec().loopback_port("--health-addr").unwrap();
        let ready = capkr_testenv::wait_for(format!("{what}: /readyz 200"), Duration::from_secs(60), || async {
            http_get(health, "/readyz").await.is_ok_and(|r| r.status == 200)
        })
        .await;
        if let Err(e) = ready {
            panic!("{what}: {args:?}\n{e:#}\n{}", manager.log_tail(30));
        }
        let checked: anyhow::Result<()> = async {
            match expect {
                Expect::Ready => Ok(()),
                Expect::MetricsOn { port, not_on } => {
                    let body = http_get(port, "/metrics").await.map(|r| r.body).unwrap_or_default();
                    anyhow::ensure!(
                        body.contains("controller_runtime_reconcile_total"),
                        "no metrics on {port}: {body}"
                    );
                    if let Some(other) = not_on {
                        anyhow::ensure!(http_get(other, "/metrics").await.is_err(), "metrics also on {other}");
                    }
                    Ok(())
                }
                Expect::HttpsMetricsOn(port) => {
                    let code = https_status(port);
                    anyhow::ensure!(code == 401, "HTTPS /metrics without a token on {port}: {code}");
                    Ok(())
                }
                Expect::Lease(ns, name) => {
                    // Ready as a standby already (as client-go standbys are): the Lease comes
                    // when it leads.
                    let leases = Api::<Lease>::namespaced(env.client(), ns);
                    capkr_testenv::wait_for(
                        format!("Lease {ns}/{name} held by flags-operator"),
                        Duration::from_secs(30),
                        || async {
                            let lease = leases.get_opt(name).await?;
                            let holder = lease.and_then(|l| l.spec).and_then(|s| s.holder_identity);
                            Ok::<_, kube::Error>(holder.as_deref() == Some("flags-operator"))
                        },
                    )
                    .await
                }
                Expect::Places(port, places) => {
                    let body = http_get(port, "/metrics").await?.body;
                    for (controller, n) in places {
                        let series =
                            format!("controller_runtime_max_concurrent_reconciles{{controller=\"{controller}\"}} {n}");
                        anyhow::ensure!(body.lines().any(|l| l == series), "{series} missing in\n{body}");
                    }
                    Ok(())
                }
            }
        }
        .await;
        if let Err(e) = checked {
            panic!("{what}: {args:?}\n{e:#}\n{}", manager.log_tail(30));
        }
        if what.contains("webhook") {
            let log = std::fs::read_to_string(manager.log_path()).unwrap();
            assert!(log.contains("webhook flags ignored"), "{what}: says so\n{log}");
        }
        assert!(manager.is_running(), "{what}");
        println!("{what}: accepted, ready in {:.1?}", t0.elapsed());
    });
    futures::future::join_all(checks).await;
    println!("all rows in {:.1?}", started.elapsed());
}

/// The arguments of the manager container in `config/manager/manager.yaml` (what clusterctl's
/// components run), with the environment's addresses after them.
fn shipped_manager_args() -> Vec<String> {
    let path = capkr_testenv::workspace_root().join("config/manager/manager.yaml");
    let docs = capkr_testenv::parse_yaml_documents(&std::fs::read_to_string(path).unwrap()).unwrap();
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").expect("a Deployment");
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("the manager's args")
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect::<Vec<_>>();
    let health = format!("--health-addr=127.0.0.1:{}", free_port().unwrap());
    let metrics = format!("--metrics-bind-address=127.0.0.1:{}", free_port().unwrap());
    [args, vec![health, metrics]].concat()
}

/// A bad feature gate, cipher suite, TLS version or a profiler address stops the manager at
/// start with a message naming the value and what it may be — before it reads its kubeconfig
/// (here one that does not exist, which is what stops it when the flags are fine).
#[test]
fn an_unknown_feature_gate_or_cipher_suite_stops_the_manager_naming_it() {
    let manager = own_binary("capkr-manager", "CAPKR_MANAGER_BIN").unwrap();
    let run = |flag: &str| {
        let out = std::process::Command::new(&manager)
            .args(["--kubeconfig=/nonexistent/kubeconfig", flag])
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let cases: [(&str, &[&str]); 7] = [
        (
            "--feature-gates=MachinePool=true,NoSuchGate=true",
            &["NoSuchGate", "known gates: MachinePool"],
        ),
        ("--feature-gates=MachinePool=false", &["MachinePool", "locked to true"]),
        (
            "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_NOPE_WITH_NOTHING",
            &["TLS_NOPE_WITH_NOTHING", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"],
        ),
        (
            "--tls-cipher-suites=TLS_RSA_WITH_AES_128_CBC_SHA",
            &["TLS_RSA_WITH_AES_128_CBC_SHA", "not supported"],
        ),
        (
            "--tls-min-version=VersionTLS11",
            &["VersionTLS11", "TLS 1.2 and 1.3 only"],
        ),
        ("--tls-curve-preferences=25", &["P-521", "29 (X25519)"]),
        (
            "--profiler-address=localhost:6060",
            &["--profiler-address", "no pprof profiler"],
        ),
    ];
    for (flag, parts) in cases {
        let (ok, stderr) = run(flag);
        assert!(!ok, "{flag} is refused");
        for part in parts {
            assert!(stderr.contains(part), "{flag}: {part:?} missing in\n{stderr}");
        }
        assert!(
            !stderr.contains("reading kubeconfig"),
            "{flag}: refused before start\n{stderr}"
        );
    }
    // The same manager with good values gets as far as its kubeconfig.
    let (ok, stderr) = run("--feature-gates=MachinePool=true");
    assert!(!ok && stderr.contains("reading kubeconfig"), "{stderr}");
}

/// A certificate for `/metrics` (`--metrics-cert-dir`) and the roots that trust it.
fn metrics_cert() -> (capkr_testenv::ScratchDir, rustls::RootCertStore) {
    let dir = capkr_testenv::ScratchDir::new("flags-metrics-cert").unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path().join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).unwrap();
    (dir, roots)
}

/// A TLS client of one protocol version, offering only `suites` of TLS 1.2 if given.
fn client(
    roots: &rustls::RootCertStore,
    version: &'static rustls::SupportedProtocolVersion,
    suites: Option<&[rustls::CipherSuite]>,
) -> Arc<rustls::ClientConfig> {
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(suites) = suites {
        provider.cipher_suites.retain(|s| suites.contains(&s.suite()));
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    Arc::new(config)
}

/// A TLS handshake with the metrics port: `Ok` with the version agreed, or the error.
async fn handshake(port: u16, tls: &Arc<rustls::ClientConfig>) -> Result<rustls::ProtocolVersion, String> {
    let connect = async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp).await
    };
    match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(stream)) => Ok(stream.get_ref().1.protocol_version().unwrap()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no handshake within 5 s".into()),
    }
}

/// A manager with `/metrics` over HTTPS and `extra` flags, once its TLS answers `probe`.
async fn tls_manager(
    env: &Env,
    cert_dir: &std::path::Path,
    extra: &[&str],
    probe: &Arc<rustls::ClientConfig>,
) -> (capkr_testenv::Process, u16) {
    let mut args = vec![
        "--insecure-diagnostics=false".to_string(),
        format!("--metrics-cert-dir={}", cert_dir.display()),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let manager = env.start_manager(args).unwrap();
    let port = manager.spec().loopback_port("--metrics-bind-address").unwrap();
    let up = capkr_testenv::wait_for("the metrics port's TLS", Duration::from_secs(60), || async {
        handshake(port, probe).await.is_ok()
    })
    .await;
    if let Err(e) = up {
        panic!("{e:#}\n{}", manager.log_tail(30));
    }
    (manager, port)
}

/// `--tls-min-version=VersionTLS13`: a client of TLS 1.2 only is refused on the metrics port,
/// one of TLS 1.3 is served. `--tls-cipher-suites` (TLS 1.2): a client offering only a suite
/// not listed is refused, one offering the listed suite is served over TLS 1.2.
#[tokio::test(flavor = "multi_thread")]
async fn the_tls_flags_hold_on_the_metrics_port() {
    use rustls::CipherSuite::{TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384};
    use rustls::version::{TLS12, TLS13};
    let env = env().await;
    let (cert_dir, roots) = metrics_cert();
    let (tls12, tls13) = (client(&roots, &TLS12, None), client(&roots, &TLS13, None));

    let (manager, port) = tls_manager(env, cert_dir.path(), &["--tls-min-version=VersionTLS13"], &tls13).await;
    assert_eq!(handshake(port, &tls13).await, Ok(rustls::ProtocolVersion::TLSv1_3));
    let refused = handshake(port, &tls12).await;
    assert!(
        refused.is_err(),
        "a TLS 1.2 client with --tls-min-version=VersionTLS13: {refused:?}"
    );
    println!("TLS 1.2 client refused: {refused:?}");
    assert!(manager.is_running());

    let listed = client(&roots, &TLS12, Some(&[TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]));
    let unlisted = client(&roots, &TLS12, Some(&[TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]));
    let (manager, port) = tls_manager(
        env,
        cert_dir.path(),
        &["--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
        &tls13,
    )
    .await;
    assert_eq!(handshake(port, &listed).await, Ok(rustls::ProtocolVersion::TLSv1_2));
    let refused = handshake(port, &unlisted).await;
    assert!(
        refused.is_err(),
        "a TLS 1.2 client offering only a suite not listed: {refused:?}"
    );
    // Without the flag the same client is served: the suite, not the client, is refused.
    let (_default, port) = tls_manager(env, cert_dir.path(), &[], &tls13).await;
    assert_eq!(handshake(port, &unlisted).await, Ok(rustls::ProtocolVersion::TLSv1_2));
    assert!(manager.is_running());
}
