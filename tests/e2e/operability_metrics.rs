//! `/metrics` as shipped, against a real API server: HTTPS, served only to callers whose token
//! may `get /metrics` (TokenReview + SubjectAccessReview), with the manager acting as its
//! ServiceAccount under the shipped RBAC — so the RBAC is proven to be enough; and after
//! reconciles of every kind, controller-runtime's standard names, which CAPI's dashboards
//! query, with sane values beside ours.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use capkr::api::KaironMachineTemplate;
use capkr_testenv::{CapiManagers, Env, EnvOptions};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// `curl -k` of `https://127.0.0.1:<port>/metrics`: (HTTP status, body); status 0 when no TLS
/// answer came.
fn scrape(port: u16, token: Option<&str>, scheme: &str) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--max-time", "5", "-w", "\n%{http_code}"]);
    if let Some(t) = token {
        cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
    }
    let out = cmd
        .arg(format!("{scheme}://127.0.0.1:{port}/metrics"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

async fn token_of(env: &Env, ns: &str, name: &str) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(env.client(), ns);
    let mut sa = ServiceAccount::default();
    sa.metadata.name = Some(name.into());
    sas.create(&PostParams::default(), &sa).await.unwrap();
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    sas.create_token_request(name, &PostParams::default(), &tr)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

/// What the tests share: an environment with the shipped RBAC, a reader and a stranger.
struct Setup {
    env: Env,
    /// Token of `monitoring/prometheus`, bound to `capkr-metrics-reader`.
    prometheus: String,
    /// Token of `monitoring/stranger`, bound to nothing.
    stranger: String,
}

async fn setup(opts: EnvOptions) -> Setup {
    let env = Env::start(opts.capi_managers(CapiManagers::NONE))
        .await
        .expect("test environment");
    env.create_namespace("capkr-system").await.unwrap();
    env.create_namespace("monitoring").await.unwrap();
    let root = capkr_testenv::workspace_root();
    let rbac = |file: &str| std::fs::read_to_string(root.join("config/rbac").join(file)).unwrap();
    for file in [
        "service_account.yaml",
        "role.yaml",
        "role_binding.yaml",
        "metrics_reader_role.yaml",
    ] {
        env.apply(&rbac(file), None).await.unwrap();
    }
    let prometheus = token_of(&env, "monitoring", "prometheus").await;
    let stranger = token_of(&env, "monitoring", "stranger").await;
    env.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: prometheus-reads-capkr\n\
         roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: capkr-metrics-reader\n\
         subjects:\n- kind: ServiceAccount\n  name: prometheus\n  namespace: monitoring\n",
        None,
    )
    .await
    .unwrap();
    Setup {
        env,
        prometheus,
        stranger,
    }
}

/// The manager as its ServiceAccount with `/metrics` as shipped (HTTPS, reviewed callers),
/// plus `extra` flags; and the port of `/metrics`.
fn start_secure_manager(env: &Env, extra: &[String]) -> (capkr_testenv::Process, u16) {
    let kubeconfig = env
        .impersonating_kubeconfig(
            "system:serviceaccount:capkr-system:capkr-manager",
            "capkr-manager-sa.kubeconfig",
        )
        .unwrap();
    // The environment picks the ports; the flag turns the shipped (secure) default back on.
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--insecure-diagnostics=false".to_string(),
    ];
    args.extend(extra.iter().cloned());
    let manager = env.start_manager(args).unwrap();
    let port = manager.spec().loopback_port("--metrics-bind-address").unwrap();
    (manager, port)
}

/// Waits until the reader gets `/metrics`; returns the body.
async fn first_scrape(manager: &capkr_testenv::Process, port: u16, token: &str) -> String {
    let allowed = capkr_testenv::wait_for("/metrics 200 for the reader", Duration::from_secs(30), || async {
        let (code, body) = scrape(port, Some(token), "https");
        Ok::<_, std::io::Error>((code == 200).then_some(body))
    })
    .await;
    match allowed {
        Ok(b) => b,
        Err(e) => panic!("{e:#}\n{}", manager.log_tail(40)),
    }
}

/// Plain HTTP gets no answer; HTTPS without a token is 401, with a token of a ServiceAccount
/// not bound to `capkr-metrics-reader` 403, with one bound to it 200 and the metrics.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_are_served_over_https_only_to_callers_allowed_to_read_them() {
    let Setup {
        env,
        prometheus,
        stranger,
    } = setup(EnvOptions::new("operability-metrics")).await;
    let (manager, metrics) = start_secure_manager(&env, &[]);
    let body = first_scrape(&manager, metrics, &prometheus).await;
    assert!(body.contains("capkr_"), "the provider's metrics: {body}");
    assert_eq!(scrape(metrics, None, "https").0, 401, "no token");
    assert_eq!(scrape(metrics, Some("not-a-token"), "https").0, 401, "an invalid token");
    assert_eq!(
        scrape(metrics, Some(&stranger), "https").0,
        403,
        "a token without the grant"
    );
    let (code, body) = scrape(metrics, None, "http");
    assert!(
        !body.contains("capkr_"),
        "plain HTTP gets no metrics (status {code}): {body}"
    );
    assert!(manager.is_running());
}

/// A certificate for `/metrics` (`--metrics-cert-dir`) and a TLS client that trusts it.
fn metrics_tls() -> (capkr_testenv::ScratchDir, Arc<rustls::ClientConfig>) {
    let dir = capkr_testenv::ScratchDir::new("metrics-cert").unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path().join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (dir, Arc::new(config))
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// A TLS connection to `/metrics`, handshake done.
async fn connect(port: u16, tls: &Arc<rustls::ClientConfig>) -> std::io::Result<Tls> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp).await
}

/// `GET /metrics` on a connection of its own, within 5 s: the HTTP status, 0 when none came.
async fn get_metrics(port: u16, tls: &Arc<rustls::ClientConfig>, token: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = connect(port, tls).await?;
        let request = format!(
            "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await?;
        let mut rest = vec![];
        // The body, until the server closes; a TLS close without close_notify is fine here.
        let _ = stream.read_to_end(&mut rest).await;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&head[9..12]).parse().unwrap_or(0))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0)
}

/// Distinct tokens no API server issued.
fn random_tokens(n: usize) -> Vec<String> {
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    (0..n)
        .map(|i| {
            // xorshift64*: enough to make every token new to the manager.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            format!("flood{i}.{:016x}.{:016x}", x, x.wrapping_mul(0x2545_f491_4f6c_dd1d))
        })
        .collect()
}

/// Flood: 2,000 random tokens over a bit more than a minute (longer than an answer is reused,
/// so the reader's answer has to be renewed during the flood). The manager asks the API
/// server about them at a bounded rate (TokenReviews counted in the audit log), answers the
/// others with 429 at once, and the reader, scraping every second, is served throughout.
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_random_tokens_causes_a_bounded_number_of_reviews_and_the_reader_keeps_its_access() {
    const FLOOD: usize = 2000;
    const SPACING: Duration = Duration::from_millis(33);
    let Setup { env, prometheus, .. } = setup(
        EnvOptions::new("operability-metrics-flood")
            .audit_policy(capkr_testenv::audit::AUDIT_POLICY_METADATA_RESPONSES),
    )
    .await;
    let (cert_dir, tls) = metrics_tls();
    let (manager, port) = start_secure_manager(&env, &[format!("--metrics-cert-dir={}", cert_dir.path().display())]);
    first_scrape(&manager, port, &prometheus).await;
    let mut audit = capkr_testenv::audit::AuditLog::from_end(env.audit_log_path().unwrap()).unwrap();

    let tokens = Arc::new(random_tokens(FLOOD));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = tokio::time::Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (tokens, next, tls) = (tokens.clone(), next.clone(), tls.clone());
        flood.spawn(async move {
            let mut codes = std::collections::BTreeMap::<u16, usize>::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(token) = tokens.get(i) else { return codes };
                tokio::time::sleep_until(started + SPACING * i as u32).await;
                *codes.entry(get_metrics(port, &tls, token).await).or_default() += 1;
            }
        });
    }
    let reader = {
        let (tls, token) = (tls.clone(), prometheus.clone());
        tokio::spawn(async move {
            let mut scrapes = vec![];
            while started.elapsed() < SPACING * FLOOD as u32 {
                scrapes.push((started.elapsed().as_secs(), get_metrics(port, &tls, &token).await));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            scrapes
        })
    };
    let mut codes = std::collections::BTreeMap::<u16, usize>::new();
    while let Some(c) = flood.join_next().await {
        for (code, n) in c.unwrap() {
            *codes.entry(code).or_default() += n;
        }
    }
    let took = started.elapsed();
    let scrapes = reader.await.unwrap();

    let events = audit.read_new().unwrap();
    let reviews = |resource: &str| {
        events
            .iter()
            .filter(|e| e.counts_request() && e.from_manager(None) && e.resource().as_deref() == Some(resource))
            .count()
    };
    let (token_reviews, access_reviews) = (reviews("tokenreviews"), reviews("subjectaccessreviews"));
    println!(
        "{FLOOD} random tokens in {took:.1?}: answers {codes:?}; {token_reviews} TokenReviews, \
         {access_reviews} SubjectAccessReviews; reader: {scrapes:?}"
    );
    let refused: usize = codes
        .iter()
        .filter(|(c, _)| [401, 429].contains(*c))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        refused, FLOOD,
        "every random token is refused, none errs or hangs: {codes:?}"
    );
    let failed: Vec<_> = scrapes.iter().filter(|(_, code)| *code != 200).collect();
    assert!(
        failed.is_empty() && scrapes.len() >= 30,
        "the reader is served throughout: failed (second, status) {failed:?} of {}\n{}",
        scrapes.len(),
        manager.log_tail(30)
    );
    // The reviews' own client: a burst of 10, then 2 a second (and the reader's renewal).
    let bound = 10 + (2.0 * took.as_secs_f64()).ceil() as usize + 4;
    assert!(
        token_reviews <= bound,
        "{token_reviews} TokenReviews for {FLOOD} random tokens in {took:.1?}: more than {bound}"
    );
    assert!(manager.is_running());
}

/// Idle connections: 500 TLS connections that never send a request are closed within a
/// minute, and a scrape made while they are open is served.
#[tokio::test(flavor = "multi_thread")]
async fn idle_tls_connections_are_closed_within_a_minute_and_do_not_block_a_scrape() {
    const IDLE: usize = 500;
    let Setup { env, prometheus, .. } = setup(EnvOptions::new("operability-metrics-idle")).await;
    let (cert_dir, tls) = metrics_tls();
    let (manager, port) = start_secure_manager(&env, &[format!("--metrics-cert-dir={}", cert_dir.path().display())]);
    first_scrape(&manager, port, &prometheus).await;

    let opened = tokio::time::Instant::now();
    let mut idle = tokio::task::JoinSet::new();
    for _ in 0..IDLE {
        let mut stream = connect(port, &tls).await.expect("an idle connection");
        // Done when the server closes it (EOF or reset); never sends a byte.
        idle.spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 1];
            let _ = stream.read(&mut buf).await;
            opened.elapsed()
        });
    }
    let connected = opened.elapsed();
    let scrape_status = get_metrics(port, &tls, &prometheus).await;

    let deadline = opened + Duration::from_secs(60);
    let mut closed = vec![];
    while let Ok(Some(done)) = tokio::time::timeout_at(deadline, idle.join_next()).await {
        closed.push(done.unwrap());
    }
    let still_open = IDLE - closed.len();
    idle.abort_all();
    println!(
        "{IDLE} idle connections opened in {connected:.1?}; a scrape meanwhile: {scrape_status}; \
         {} closed by the server within 60 s (last after {:.1?}), {still_open} still open",
        closed.len(),
        closed.iter().max().copied().unwrap_or_default()
    );
    assert_eq!(scrape_status, 200, "a scrape while {IDLE} idle connections are open");
    assert_eq!(still_open, 0, "idle connections still open after 60 s");
    assert!(manager.is_running());
}

/// The value of one series line (`name{labels} value`) of a scrape.
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The sum of every series of `name` whose labels include `label`.
fn sum(body: &str, name: &str, label: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Objects of every kind in namespace `ns` for the four controllers to reconcile; with
/// `refused`, only the KaironMachineTemplate whose status writes a ValidatingAdmissionPolicy
/// refuses (its reconciles fail and are retried).
fn objects(ns: &str, refused: bool) -> String {
    let spec = "image:\n      imageRef: ubuntu-2404-kube-v1.36.3\n      diskSize: 20Gi\n    resources:\n      cpu: 2\n      memory: 4Gi";
    let template = |name: &str, labels: &str| {
        format!(
            "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: KaironMachineTemplate\nmetadata:\n  name: {name}\n  namespace: {ns}\n{labels}spec:\n  template:\n    spec:\n      {}\n",
            spec.replace("\n    ", "\n      ")
        )
    };
    if refused {
        return template("t-refused", "  labels:\n    test.capkr.dev/refuse-status: \"true\"\n");
    }
    [
        format!(
            "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: KaironCluster\nmetadata:\n  name: c1\n  namespace: {ns}\nspec:\n  controlPlaneEndpoint:\n    host: 10.20.0.100\n    port: 6443\n"
        ),
        format!(
            "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: KaironMachine\nmetadata:\n  name: m1\n  namespace: {ns}\nspec:\n  {}\n",
            spec.replace("\n    ", "\n  ")
        ),
        format!(
            "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: KaironMachinePool\nmetadata:\n  name: p1\n  namespace: {ns}\nspec:\n  template:\n    {spec}\n"
        ),
        template("t1", ""),
    ]
    .join("---\n")
}

/// Refuses every status write of a KaironMachineTemplate labelled
/// `test.capkr.dev/refuse-status`.
const REFUSE_TEMPLATE_STATUS: &str = "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: refuse-template-status
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [infrastructure.cluster.x-k8s.io]
      apiVersions: ['*']
      operations: [CREATE, UPDATE]
      resources: [kaironmachinetemplates/status]
  validations:
  - expression: 'false'
    message: this test refuses the status of this template
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: refuse-template-status
spec:
  policyName: refuse-template-status
  validationActions: [Deny]
  matchResources:
    objectSelector:
      matchLabels:
        test.capkr.dev/refuse-status: 'true'
";

/// After reconciles of every kind (one of them failing), `/metrics` as shipped has
/// controller-runtime's reconcile and work-queue series under CAPI's controller names, as
/// CAPI's Grafana dashboard `controller-runtime.json` queries them, with values that agree
/// with each other and with ours; the work-queue series kube-runtime cannot show are absent.
#[tokio::test(flavor = "multi_thread")]
async fn reconciles_are_exposed_under_controller_runtimes_standard_names() {
    let Setup { env, prometheus, .. } = setup(EnvOptions::new("operability-metrics-standard")).await;
    env.apply(REFUSE_TEMPLATE_STATUS, None).await.unwrap();
    let ns = "metrics-standard";
    env.create_namespace(ns).await.unwrap();
    // The policy takes a moment to be enforced: the manager starts once it refuses the
    // template's status.
    env.apply(&objects(ns, true), None).await.unwrap();
    let templates: Api<KaironMachineTemplate> = Api::namespaced(env.client(), ns);
    let status = serde_json::json!({"status": {"capacity": {"cpu": "1"}}});
    capkr_testenv::wait_for(
        "the policy to refuse the template's status",
        Duration::from_secs(30),
        || async {
            templates
                .patch_status("t-refused", &PatchParams::default(), &Patch::Merge(&status))
                .await
                .is_err_and(|e| e.to_string().contains("refuses the status"))
        },
    )
    .await
    .unwrap();
    let (manager, port) = start_secure_manager(&env, &[]);
    first_scrape(&manager, port, &prometheus).await;
    env.apply(&objects(ns, false), None).await.unwrap();

    let controllers = [
        ("kaironmachine", 20.0),
        ("kaironcluster", 10.0),
        ("kaironmachinetemplate", 2.0),
        ("kaironmachinepool", 5.0),
    ];
    let reconciled = capkr_testenv::wait_for(
        "a reconcile of every kind, and a failed one of the refused template",
        Duration::from_secs(60),
        || async {
            let (code, body) = scrape(port, Some(&prometheus), "https");
            let done = code == 200
                && controllers.iter().all(|(c, _)| {
                    sum(
                        &body,
                        "controller_runtime_reconcile_total",
                        &format!("controller=\"{c}\""),
                    ) > 0.0
                })
                && value(
                    &body,
                    "controller_runtime_reconcile_errors_total{controller=\"kaironmachinetemplate\"}",
                )
                .is_some_and(|n| n >= 1.0);
            Ok::<_, std::io::Error>(done.then_some(body))
        },
    )
    .await;
    if let Err(e) = reconciled {
        panic!(
            "{e:#}\n{}\n{}",
            scrape(port, Some(&prometheus), "https").1,
            manager.log_tail(40)
        );
    }
    // A scrape reads one series after the other while reconciles end: the values are compared
    // once two scrapes half a second apart agree (the refused template's retries back off, so
    // such a pause comes).
    let counts = |body: &str| -> Vec<String> {
        body.lines()
            .filter(|l| {
                [
                    "controller_runtime_",
                    "workqueue_retries",
                    "workqueue_work_duration_seconds_count",
                ]
                .iter()
                .any(|p| l.starts_with(p))
                    && !l.contains("_bucket")
            })
            .map(str::to_string)
            .collect()
    };
    let settled = capkr_testenv::wait_for("two scrapes that agree", Duration::from_secs(60), || async {
        let (_, first) = scrape(port, Some(&prometheus), "https");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (code, second) = scrape(port, Some(&prometheus), "https");
        Ok::<_, std::io::Error>((code == 200 && counts(&first) == counts(&second)).then_some(second))
    })
    .await;
    let body = settled.unwrap();
    let get = |series: &str| value(&body, series).unwrap_or_else(|| panic!("{series} missing in\n{body}"));
    for (c, places) in controllers {
        let of = format!("{{controller=\"{c}\"}}");
        let queue = format!("{{name=\"{c}\",controller=\"{c}\"}}");
        let result = |r: &str| {
            get(&format!(
                "controller_runtime_reconcile_total{{controller=\"{c}\",result=\"{r}\"}}"
            ))
        };
        let (success, error, requeue, requeue_after) = (
            result("success"),
            result("error"),
            result("requeue"),
            result("requeue_after"),
        );
        let total = success + error + requeue + requeue_after;
        let errors = get(&format!("controller_runtime_reconcile_errors_total{of}"));
        let timeouts = get(&format!("controller_runtime_reconcile_timeouts_total{of}"));
        let timed = get(&format!("controller_runtime_reconcile_time_seconds_count{of}"));
        let worked = get(&format!("workqueue_work_duration_seconds_count{queue}"));
        let active = get(&format!("controller_runtime_active_workers{of}"));
        let max = get(&format!("controller_runtime_max_concurrent_reconciles{of}"));
        let retries = get(&format!("workqueue_retries_total{queue}"));
        let longest = get(&format!("workqueue_longest_running_processor_seconds{queue}"));
        let unfinished = get(&format!("workqueue_unfinished_work_seconds{queue}"));
        let ours = get(&format!("capkr_reconcile_total{of}"));
        println!(
            "{c}: {total} reconciles ({success} success, {error} error, {requeue} requeue, {requeue_after} requeue_after), \
             {retries} retries, {active}/{max} workers, longest running {longest:.3} s, unfinished {unfinished:.3} s"
        );
        assert!(total > 0.0, "{c}: reconciled");
        assert_eq!(errors, error, "{c}: errors are the reconciles with result error");
        assert!(
            timeouts <= errors,
            "{c}: a reconcile dropped at its deadline is an error"
        );
        assert_eq!(
            retries,
            error + requeue + requeue_after,
            "{c}: every result but success is retried"
        );
        assert_eq!(timed, total, "{c}: every reconcile timed once and counted once");
        assert_eq!(
            worked, timed,
            "{c}: work duration and reconcile time observe the same reconciles"
        );
        assert!((0.0..=max).contains(&active), "{c}: {active} active of {max}");
        assert_eq!(max, places, "{c}: the flags' places (KaironMachines: two lanes of 10)");
        assert!(
            longest >= 0.0 && unfinished >= longest,
            "{c}: {longest} longest, {unfinished} unfinished"
        );
        assert!(ours >= timed, "{c}: ours still counted ({ours})");
        for le in ["0.005", "1.0", "60.0", "+Inf"] {
            get(&format!(
                "controller_runtime_reconcile_time_seconds_bucket{{le=\"{le}\",controller=\"{c}\"}}"
            ));
        }
        get(&format!(
            "workqueue_work_duration_seconds_bucket{{le=\"1e-8\",name=\"{c}\",controller=\"{c}\"}}"
        ));
    }
    assert!(
        get("controller_runtime_reconcile_errors_total{controller=\"kaironmachinetemplate\"}") >= 1.0,
        "the refused template's reconciles failed"
    );
    for absent in [
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds",
    ] {
        assert!(
            !body.contains(absent),
            "{absent}: kube-runtime does not show it, so it is not made up"
        );
    }
    assert!(manager.is_running());
}

/// `--sync-period` reconciles every KaironMachine again once a period, whatever its last
/// reconcile asked for: here one that waits for its owner Machine (which asks for nothing), as
/// controller-runtime's informer resync would. Counted from `/metrics` over three periods, with
/// nothing else changing.
#[tokio::test(flavor = "multi_thread")]
async fn every_kaironmachine_is_reconciled_again_once_a_sync_period() {
    let Setup { env, prometheus, .. } = setup(EnvOptions::new("operability-metrics-resync")).await;
    let ns = "metrics-resync";
    env.create_namespace(ns).await.unwrap();
    env.apply(&objects(ns, false), None).await.unwrap();
    let period = Duration::from_secs(3);
    let (manager, port) = start_secure_manager(&env, &[format!("--sync-period={}s", period.as_secs())]);
    first_scrape(&manager, port, &prometheus).await;
    let reconciles = || {
        let (code, body) = scrape(port, Some(&prometheus), "https");
        assert_eq!(code, 200, "{body}");
        sum(
            &body,
            "controller_runtime_reconcile_total",
            "controller=\"kaironmachine\"",
        )
    };
    let first = capkr_testenv::wait_for(
        "the KaironMachine's first reconcile",
        Duration::from_secs(30),
        || async {
            let n = reconciles();
            Ok::<_, std::io::Error>((n >= 1.0).then_some(n))
        },
    )
    .await;
    let first = first.unwrap_or_else(|e| panic!("{e:#}\n{}", manager.log_tail(40)));
    tokio::time::sleep(period * 3 + Duration::from_millis(500)).await;
    let resyncs = reconciles() - first;
    // Three periods: three resyncs (two or four by where the turn falls), and not one a tick.
    assert!(
        (2.0..=5.0).contains(&resyncs),
        "{resyncs} reconciles of one unchanged KaironMachine in three periods of {period:?}\n{}",
        manager.log_tail(40)
    );
}
