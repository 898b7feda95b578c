//! Cluster API's own end-to-end specs (`sigs.k8s.io/cluster-api/test/e2e`, unmodified) against
//! the provider: the Go module `tests/capi-e2e` is compiled into a Ginkgo test binary, and run
//! against one management environment shared by every spec — etcd, kube-apiserver, CAPI core
//! (with ClusterTopology), CABPK, KCP, capkr-manager, and the simulator whose guests act out
//! kubeadm with real etcd and kube-apiserver processes. The framework uses that environment as
//! an existing cluster; this file writes the e2e config (providers from the release assets,
//! variables, intervals), the suite creates the clusterctl repository and inventory.
//!
//! Two specs need Machine taints in their flavors; the test writes those flavors
//! (`kcp-md-taints`, `topology-taints`) next to the release assets, from the shipped default and
//! topology flavors, and runs CAPI with the `MachineTaintPropagation` feature gate.
//!
//! The Runtime SDK specs call the test Runtime Extension (`tests/capi-e2e/extension`), which
//! runs here as a process beside the managers; CAPI core (with `RuntimeSDK`) reaches it at the
//! Service address the specs' ExtensionConfigs name through the extension's own proxy.
//!
//! `CAPKR_CAPI_E2E_FOCUS` (a Ginkgo label filter, e.g. `quick-start`) runs a subset;
//! `CAPKR_CAPI_E2E_REPEAT=N` runs the selected specs N more times on the same environment,
//! stopping at the first failure (a loop for a flaky spec); `CAPKR_CAPI_E2E_AUDIT=1` writes the management API server's audit log
//! (every request at Metadata level; or `=<file>`, that audit policy) into the environment's
//! dir, for finding who wrote what.
//! The specs that run and those that cannot here are listed in `docs/capi-e2e.md`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use capkr_testenv::flavors::{ClusterctlRepo, GuestNetwork, VERSION, guest_delay_args, guest_simulator_args};
use capkr_testenv::{
    Env, EnvOptions, KUBERNETES_VERSION, Process, ProcessSpec, SIMULATOR_HOSTS, free_port, workspace_root,
};

/// The test flavors some specs need, derived from the shipped templates and class.
mod flavors;
use flavors::*;

/// The CAPI release of the managers (testbed/tools/capi); the specs are those of the test module
/// v1.14.4, built against this release (tests/capi-e2e/go.mod).
const CAPI_VERSION: &str = "v1.14.2";

/// The versions the upgrade specs go from and to, upstream's own: a minor upgrade (its
/// MachineSet preflight check expects the kubeadm version skew of one), between versions of
/// the kind mapper, where upstream's upgrade-plan handler takes its versions from. The newest
/// v1.36 there is v1.36.4, the only v1.37 is v1.37.0: with [`KUBERNETES_VERSION`] v1.37.2 as
/// the target the handler plans v1.37.0 and CAPI refuses a plan that does not end at the
/// target. The guests report these as their kubelet's version (their image names it); their
/// etcd and kube-apiserver are the binaries of [`KUBERNETES_VERSION`].
const KUBERNETES_VERSION_UPGRADE_FROM: &str = "v1.36.4";
const KUBERNETES_VERSION_UPGRADE_TO: &str = "v1.37.0";

/// Where the Runtime SDK specs' ExtensionConfigs say the test Runtime Extension is: the
/// Service `test-extension-webhook-service` in `test-extension-system`, as upstream deploys it.
const EXTENSION_NAMESPACE: &str = "test-extension-system";
const EXTENSION_SERVICE: &str = "test-extension-webhook-service";

/// Left out unless `CAPKR_CAPI_E2E_FOCUS` (a Ginkgo label filter) names them: the specs that
/// cannot pass here (docs/capi-e2e.md).
const DEFAULT_LABEL_FILTER: &str = "!not-applicable";

/// The Ginkgo suite compiled by `hack/capi-e2e-suite.sh` (`go test -c`, cached by the
/// module's content outside the source tree; `.ci/run` has it built while cargo builds).
fn build_suite() -> PathBuf {
    let script = workspace_root().join("hack/capi-e2e-suite.sh");
    let output = match Command::new(&script).output() {
        Ok(o) => o,
        Err(e) => panic!("running {}: {e}", script.display()),
    };
    assert!(
        output.status.success(),
        "{} failed (the CAPI e2e suite needs the Go toolchain, go 1.26, on PATH):\n{}{}",
        script.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(path.is_file(), "{} printed no suite binary: {stdout}", script.display());
    path
}

/// The kcp-remediation flavor's guests run its script with these.
fn require_script_tools() {
    for tool in ["sh", "bash", "curl", "jq"] {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "`{tool}` is not on PATH: the KCP remediation spec's guests run upstream's wait-signal script with bash, curl and jq (hack/test-tools.sh installs them)"
        );
    }
}

/// clusterctl's metadata of the CAPI release whose managers run here.
fn capi_metadata() -> String {
    let (major, minor) = {
        let mut it = CAPI_VERSION.trim_start_matches('v').split('.');
        (it.next().unwrap_or("1"), it.next().unwrap_or("0"))
    };
    format!(
        "apiVersion: clusterctl.cluster.x-k8s.io/v1alpha3\nkind: Metadata\nreleaseSeries:\n  - major: {major}\n    minor: {minor}\n    contract: v1beta2\n"
    )
}

/// The e2e config: CAPI's three providers (their managers run as processes; the repository
/// gets their CRDs as components, never installed from there), the Kairon provider from the
/// release assets, the variables the shipped templates need, and the intervals.
fn e2e_config(dir: &Path, assets: &Path, capi_manifests: &Path, endpoint_ip: &str) -> String {
    let mut providers = String::new();
    let metadata = dir.join("capi-metadata.yaml");
    std::fs::write(&metadata, capi_metadata()).expect("writing the CAPI metadata");
    for (name, typ, group) in [
        ("cluster-api", "CoreProvider", "core"),
        ("kubeadm", "BootstrapProvider", "bootstrap-kubeadm"),
        ("kubeadm", "ControlPlaneProvider", "control-plane-kubeadm"),
    ] {
        let components = dir.join(format!("{group}-components.yaml"));
        let mut crds = String::new();
        let crd_dir = capi_manifests.join(group).join("crd");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&crd_dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", crd_dir.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        for f in files {
            crds.push_str("---\n");
            crds.push_str(&std::fs::read_to_string(&f).expect("reading a CAPI CRD"));
        }
        std::fs::write(&components, crds).expect("writing CAPI components");
        providers.push_str(&format!(
            "- name: {name}\n  type: {typ}\n  versions:\n  - name: {CAPI_VERSION}\n    value: {}\n    type: url\n    files:\n    - sourcePath: {}\n      targetName: metadata.yaml\n",
            components.display(),
            metadata.display()
        ));
    }
    let mut files = String::new();
    let mut names: Vec<String> = std::fs::read_dir(assets)
        .expect("reading the release assets")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "infrastructure-components.yaml" && n.ends_with(".yaml"))
        .collect();
    names.sort();
    assert!(
        names.iter().any(|n| n == "metadata.yaml") && names.iter().any(|n| n == "cluster-template.yaml"),
        "release assets lack metadata.yaml or cluster-template.yaml: {names:?}"
    );
    for n in &names {
        files.push_str(&format!(
            "    - sourcePath: {}\n      targetName: {n}\n",
            assets.join(n).display()
        ));
    }
    providers.push_str(&format!(
        "- name: kairon\n  type: InfrastructureProvider\n  versions:\n  - name: {VERSION}\n    value: {}\n    type: url\n    files:\n{files}",
        assets.join("infrastructure-components.yaml").display()
    ));

    format!(
        r#"managementClusterName: capkr-e2e
images: []
providers:
{providers}
variables:
  KUBERNETES_VERSION: "{KUBERNETES_VERSION}"
  KUBERNETES_VERSION_UPGRADE_FROM: "{KUBERNETES_VERSION_UPGRADE_FROM}"
  KUBERNETES_VERSION_UPGRADE_TO: "{KUBERNETES_VERSION_UPGRADE_TO}"
  CONTROL_PLANE_ENDPOINT_IP: "{endpoint_ip}"
  KAIRON_MACHINE_IMAGE: "ubuntu-2404-kube-{KUBERNETES_VERSION}"
  EXP_CLUSTER_RESOURCE_SET: "true"
  CLUSTER_TOPOLOGY: "true"
intervals:
  default/wait-cluster: ["3m", "2s"]
  default/wait-control-plane: ["5m", "2s"]
  default/wait-worker-nodes: ["5m", "2s"]
  default/wait-machine-pool-nodes: ["5m", "2s"]
  default/wait-delete-cluster: ["5m", "2s"]
  default/wait-machine-upgrade: ["10m", "2s"]
  default/wait-machine-pool-upgrade: ["10m", "2s"]
  default/wait-machine-remediation: ["5m", "2s"]
  default/wait-deployment: ["3m", "2s"]
  default/wait-deployment-available: ["3m", "2s"]
  default/wait-machine-deleted: ["5m", "2s"]
  default/wait-nodes-ready: ["5m", "2s"]
  default/wait-control-plane-upgrade: ["10m", "2s"]
  default/wait-machine-deployment-upgrade: ["10m", "2s"]
  default/check-machines-stable: ["30s", "5s"]
  default/wait-machine-provisioned: ["5m", "2s"]
  default/wait-machines: ["5m", "2s"]
  quick-start/wait-resource-versions-become-stable: ["4m", "5s"]
  quick-start/wait-resource-versions-remain-stable: ["20s", "5s"]
  k8s-upgrade-with-runtimesdk/wait-resource-versions-become-stable: ["4m", "5s"]
  k8s-upgrade-with-runtimesdk/wait-resource-versions-remain-stable: ["20s", "5s"]
"#
    )
}

/// Every test flavor the specs need, derived from the release assets in `assets`.
fn write_test_flavors(assets: &Path) {
    write_taint_flavors(assets);
    write_kcp_remediation_flavor(assets);
    write_md_remediation_flavor(assets);
    write_kcp_adoption_flavor(assets);
    write_kcp_only_flavor(assets);
    write_runtimesdk_flavor(assets);
    write_upgrade_flavors(assets);
}

/// The suite binary, found or compiled once per test process (every part uses it).
fn suite_binary() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.as_ref() {
        return p.clone();
    }
    let started = Instant::now();
    let suite = build_suite();
    eprintln!(
        "CAPI e2e suite binary in {:.1}s: {}",
        started.elapsed().as_secs_f64(),
        suite.display()
    );
    *built = Some(suite.clone());
    suite
}

/// The enabled specs in three parts of about equal length (their times alone, in
/// docs/capi-e2e.md: 1419, 1496 and 1444 s), each a Ginkgo run of its own on the one
/// environment all share, so that `make test` runs them side by side. The runs wait on
/// controllers much more than they compute (one takes about half a core), so three at once
/// take little longer than one.
const PARTS: [&str; 3] = [
    "runtimesdk-upgrade-cross-ns || kcp-remediation || clusterclass-rollout || quick-start || kcp-adoption \
     || quick-start-kcp-only || kairon-conflict-retry",
    "runtimesdk-upgrade || node-drain || k8s-upgrade-scale-in || in-place-update || md-scale || md-remediation \
     || cluster-deletion",
    "k8s-upgrade-ha || k8s-upgrade || clusterclass-changes || kcp-infra-adoption || scale || kairon-in-place \
     || machine-pool || quick-start-runtimesdk-v1beta1 || kcp-md-rollout",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capi_e2e_runtimesdk_cross_ns_kcp_remediation_clusterclass_rollout_quick_starts_and_kcp_adoption_pass() {
    run_specs(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capi_e2e_runtimesdk_upgrade_node_drain_scale_in_in_place_md_scale_remediation_and_deletion_pass() {
    run_specs(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capi_e2e_upgrades_clusterclass_changes_infra_adoption_scale_machine_pool_and_rollout_pass() {
    run_specs(2).await;
}

/// The guest network of the shared environment's simulator.
static NETWORK: OnceLock<GuestNetwork> = OnceLock::new();

/// The port of the test Runtime Extension's proxy: CAPI core of the shared environment is
/// started with it, whichever part starts the environment, and the extension listens on it.
static PROXY_PORT: OnceLock<u16> = OnceLock::new();

/// The management environment every part shares, as upstream's parallel Ginkgo nodes share
/// one management cluster: CAPI with the feature gates the specs need
/// (MachineTaintPropagation: the rollout specs check Machine taints reaching the Nodes;
/// RuntimeSDK; InPlaceUpdates, in core and KCP), one simulator whose guests run etcd and kube-apiserver, one manager, and the
/// test Runtime Extension.
async fn suite_env() -> (&'static Env, GuestNetwork) {
    let mut opts = EnvOptions::new("capi_e2e_suite");
    opts.capi_feature_gates =
        "MachinePool=true,ClusterTopology=true,MachineTaintPropagation=true,RuntimeSDK=true,InPlaceUpdates=true".into();
    // CAPI core and KCP call the test Runtime Extension at its Service's address through this
    // proxy (the extension's own); they never proxy loopback, where every API server listens.
    let proxy_port = *PROXY_PORT.get_or_init(|| free_port().expect("a free port for the extension's proxy"));
    opts.capi_env = vec![("HTTPS_PROXY".into(), format!("http://127.0.0.1:{proxy_port}"))];
    match std::env::var("CAPKR_CAPI_E2E_AUDIT").ok().filter(|v| !v.is_empty()) {
        // A file: that audit policy (e.g. request bodies of some resources).
        Some(path) if std::path::Path::new(&path).is_file() => {
            let policy = std::fs::read_to_string(&path).expect("reading CAPKR_CAPI_E2E_AUDIT's policy");
            opts = opts.audit_policy(policy);
        }
        Some(_) => opts = opts.audit_policy(capkr_testenv::audit::AUDIT_POLICY_METADATA_RESPONSES),
        None => {}
    }
    let env = Env::shared_with(opts, |env| async move {
        let net = *NETWORK.get_or_init(GuestNetwork::pick);
        let guest_dir = env.dir().join("guests");
        let mut sim_args = guest_delay_args();
        // Labelled hosts: the ClusterClass-changes spec moves workers to zone-b.
        sim_args.extend(["--hosts".to_string(), SIMULATOR_HOSTS.into()]);
        sim_args.extend(guest_simulator_args(env.binaries(), &guest_dir, &net)?);
        // The kcp-remediation flavor's pre-kubeadm signal script.
        require_script_tools();
        sim_args.push("--guest-scripts-dir".into());
        sim_args.push(env.dir().join("guest-scripts").display().to_string());
        let sim = env.start_simulator(sim_args)?;
        let manager = env.start_manager(["-v", "1"])?;
        let extension = start_test_extension(env, proxy_port).await?;
        for p in [&sim, &manager, &extension] {
            anyhow::ensure!(p.is_running(), "{} exited right after start", p.name());
        }
        env.keep(sim);
        env.keep(manager);
        env.keep(extension);
        Ok(())
    })
    .await
    .expect("test environment");
    let net = *NETWORK.get().expect("the shared environment's setup picked a network");
    (env, net)
}

/// Starts the test Runtime Extension (`tests/capi-e2e/extension`, built next to the suite)
/// with its CONNECT proxy on `proxy_port`, and does what upstream's deployment of it leaves
/// for CAPI to find: the Secret `<service>-cert` in its namespace whose `ca.crt`, named by the
/// ExtensionConfigs' inject-ca annotation, CAPI takes as the extension's CA bundle.
async fn start_test_extension(env: &Env, proxy_port: u16) -> anyhow::Result<Process> {
    let host = format!("{EXTENSION_SERVICE}.{EXTENSION_NAMESPACE}.svc");
    let cert_dir = env.dir().join("test-extension-certs");
    env.write_serving_cert(&cert_dir, &host, &[&host])?;
    env.create_namespace(EXTENSION_NAMESPACE).await?;
    let secret = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": format!("{EXTENSION_SERVICE}-cert"), "namespace": EXTENSION_NAMESPACE},
        "stringData": {"ca.crt": env.ca_pem()},
    });
    env.apply(&secret.to_string(), None).await?;
    let binary = suite_binary().with_file_name("capi-e2e-extension");
    let spec = ProcessSpec::new("capi-e2e-extension", binary, &env.log_dir()).args([
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--webhook-port={}", free_port()?),
        format!("--webhook-cert-dir={}", cert_dir.display()),
        format!("--proxy-address=127.0.0.1:{proxy_port}"),
        format!("--service-host={host}"),
    ]);
    Process::spawn(spec)
}

/// Runs the specs part `part` of [`PARTS`] selects (and `CAPKR_CAPI_E2E_FOCUS`, when set) on
/// the shared environment, with the part's own control-plane endpoints and output dirs.
async fn run_specs(part: usize) {
    let labels = PARTS[part];
    let suite = suite_binary();
    // The last run's output of each part, for a look after the fact.
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi-e2e");
    std::fs::create_dir_all(&work).expect("creating the suite's output dir");

    let (env, net) = suite_env().await;
    let dir = env.dir().join(format!("capi-e2e-{part}"));
    let repo = ClusterctlRepo::create(&dir, env.binaries()).expect("release assets");
    let assets = repo.dir.join("repo").join("infrastructure-kairon").join(VERSION);
    write_test_flavors(&assets);
    let config = dir.join("e2e-config.yaml");
    std::fs::write(
        &config,
        e2e_config(&dir, &assets, &env.binaries().capi_manifests, &endpoint_ip(&net, part)),
    )
    .expect("writing the e2e config");
    let artifacts = dir.join("artifacts");

    let mut cmd = Command::new(&suite);
    cmd.current_dir(&dir)
        .arg("-test.v")
        .arg("-test.timeout=45m")
        .arg("-ginkgo.v")
        .arg("-ginkgo.timeout=45m")
        .arg("-ginkgo.no-color")
        .arg(format!(
            "-ginkgo.junit-report={}",
            artifacts.join("junit.xml").display()
        ))
        .arg(format!("-e2e.config={}", config.display()))
        .arg(format!("-e2e.artifacts-folder={}", artifacts.display()))
        .arg(format!("-e2e.kubeconfig={}", env.kubeconfig_path().display()))
        // The framework's clusterctl client must never reach GitHub or read the user's config.
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .env("GOPROXY", "off")
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .env("HOME", &dir);
    let focus = std::env::var("CAPKR_CAPI_E2E_FOCUS").ok().filter(|f| !f.is_empty());
    let filter = match &focus {
        // A focus may name specs of any part; those left out by default run in the first.
        Some(f) if part == 0 => format!("({f}) && ({labels} || not-applicable)"),
        Some(f) => format!("({f}) && ({labels}) && {DEFAULT_LABEL_FILTER}"),
        None => format!("({labels}) && {DEFAULT_LABEL_FILTER}"),
    };
    cmd.arg(format!("-ginkgo.label-filter={filter}"));
    // Ginkgo's own --repeat is its CLI's, not the test binary's: the loop is ours, each round
    // a fresh Ginkgo run on the same environment, stopping at the first failure.
    let rounds = 1 + std::env::var("CAPKR_CAPI_E2E_REPEAT")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    let mut text = String::new();
    for round in 1..=rounds {
        let started = Instant::now();
        let out = cmd.output().expect("running the CAPI e2e suite");
        text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = std::fs::write(work.join(format!("last-run-{part}.txt")), &text);
        eprintln!("{text}");
        eprintln!(
            "CAPI e2e suite (round {round} of {rounds}): {:.1}s, {}",
            started.elapsed().as_secs_f64(),
            out.status
        );
        if !out.status.success() {
            env.dump();
            let capi_core = std::fs::read_to_string(env.log_dir().join("capi-core.log")).unwrap_or_default();
            panic!(
                "the CAPI e2e suite failed ({}, round {round} of {rounds}); artifacts in {} (CAPKR_TEST_KEEP=1 keeps them)\n{}",
                out.status,
                artifacts.display(),
                with_controller_lines(&failure_summary(&text), topology_lines(&capi_core, 4))
            );
        }
    }
    assert!(text.contains("SUCCESS!"), "no Ginkgo summary in the output");
    // A focus may select nothing of this part; without one, every part runs specs.
    assert!(
        focus.is_some() || !text.contains("-- 0 Passed"),
        "the Ginkgo run passed no spec"
    );
}

/// The first control-plane endpoint of a part's clusters: 127.<octet>.<100 + part>.1, so the
/// parts' addresses never meet (the scale spec numbers its clusters' endpoints up from it).
fn endpoint_ip(net: &GuestNetwork, part: usize) -> String {
    format!("127.{}.{}.1", net.octet, 100 + part)
}

/// Ginkgo's closing summary of the failed specs (from "Summarizing" on, at most 60 lines),
/// after the first lines of each spec's own failure (from its `[FAILED]` on, at most 40
/// lines, at most 3 specs): the summary names the spec and the line, the failure says what
/// was expected and what was found there (which objects kept changing, which condition was
/// false), so that the panic message, which CI shows, is enough to start from.
fn failure_summary(text: &str) -> String {
    let summary_at = text.rfind("Summarizing ");
    let before = &text[..summary_at.unwrap_or(text.len())];
    let starts: Vec<usize> = before
        .match_indices("[FAILED]")
        .map(|(at, _)| at)
        // The failure starts a line; Ginkgo's timeline marks where it happened with a line
        // "[FAILED] in [It] - file:line", which is not a failure of its own.
        .filter(|&at| {
            before[..at].rsplit('\n').next().is_some_and(|l| l.trim().is_empty())
                && !before[at..].starts_with("[FAILED] in [")
        })
        .collect();
    let mut parts: Vec<String> = starts
        .iter()
        .enumerate()
        .take(3)
        .map(|(i, &at)| {
            let end = starts.get(i + 1).copied().unwrap_or(before.len());
            before[at..end].lines().take(40).collect::<Vec<_>>().join("\n")
        })
        .collect();
    match summary_at {
        Some(at) => parts.push(text[at..].lines().take(60).collect::<Vec<_>>().join("\n")),
        None if parts.is_empty() => return "(no Ginkgo failure summary in the output)".to_string(),
        None => {}
    }
    parts.join("\n…\n")
}

/// What CAPI core's ClusterTopology controller logged last: its last `n` errors (klog `E`
/// lines: a failed reconcile, whose error replaces a hook's blocking message in the Cluster's
/// TopologyReconciled condition), or its last `n` lines if it logged no error; each shortened
/// to time, message, Cluster and error, so that the digest's cut at 240 characters keeps the
/// error. A failed spec's own artifacts are gone after a CI run.
fn topology_lines(capi_core_log: &str, n: usize) -> (&'static str, Vec<String>) {
    let topology: Vec<&str> = capi_core_log
        .lines()
        .filter(|l| l.contains("controller=\"topology/cluster\""))
        .collect();
    let errors: Vec<&str> = topology.iter().copied().filter(|l| l.starts_with('E')).collect();
    let (what, chosen) = if errors.is_empty() {
        ("lines", topology)
    } else {
        ("errors", errors)
    };
    let from = chosen.len().saturating_sub(n);
    (what, chosen[from..].iter().map(|l| short_klog_line(l)).collect())
}

/// A klog line (`E1207 17:03:44.349535 21769 file.go:1] "message" key="value" …`) as its
/// time, message, and its `Cluster` and `err` values.
fn short_klog_line(line: &str) -> String {
    let time = line.split_whitespace().nth(1).unwrap_or_default();
    let message = line.split_once("] ").map(|(_, rest)| quoted(rest)).unwrap_or_default();
    let mut out = format!("{time} {message}");
    for key in ["Cluster", "err"] {
        if let Some((_, rest)) = line.split_once(&format!(" {key}=")) {
            out.push_str(&format!(" {key}={}", quoted(rest)));
        }
    }
    out
}

/// The Go-quoted string `text` starts with, unquoted (`\"` and `\\` only), or `text`'s first
/// word if it starts with no quote.
fn quoted(text: &str) -> String {
    let Some(body) = text.strip_prefix('"') else {
        return text.split_whitespace().next().unwrap_or_default().to_string();
    };
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => break,
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// `summary` with `lines` (CAPI core's) right after its first failure's opening lines, so
/// that the first lines of the message, which the test runner's closing digest shows, carry
/// both.
fn with_controller_lines(summary: &str, (what, lines): (&str, Vec<String>)) -> String {
    if lines.is_empty() {
        return summary.to_string();
    }
    let all: Vec<&str> = summary.lines().collect();
    let (head, rest) = all.split_at(FIRST_FAILURE_LINES.min(all.len()));
    let mut out = head.join("\n");
    out.push_str(&format!("\nCAPI core's ClusterTopology controller, its last {what}:\n"));
    for l in lines {
        out.push_str("  ");
        out.push_str(&l);
        out.push('\n');
    }
    out.push_str(&rest.join("\n"));
    out
}

/// How many lines of a Ginkgo failure say what failed: `[FAILED]`, the message, and
/// Gomega's expected and actual values.
const FIRST_FAILURE_LINES: usize = 5;

#[test]
fn the_topology_controllers_last_errors_follow_the_first_failure() {
    let log = "I1207 17:00:01.1 9 a.go:1] \"A\" controller=\"machine\"\n\
               I1207 17:00:02.1 9 a.go:1] \"Patching Cluster\" controller=\"topology/cluster\" controllerKind=\"Cluster\" Cluster=\"ns/c1\" patch=\"{}\"\n\
               E1207 17:00:03.1 9 c.go:1] \"Reconciler error\" err=\"failed to call \\\"x\\\": timeout\" controller=\"topology/cluster\" controllerKind=\"Cluster\" Cluster=\"ns/c1\"\n\
               I1207 17:00:04.1 9 a.go:1] \"Creating MachineDeployment\" controller=\"topology/cluster\" Cluster=\"ns/c2\"\n";
    let (what, errors) = topology_lines(log, 4);
    assert_eq!(what, "errors");
    assert_eq!(
        errors,
        ["17:00:03.1 Reconciler error Cluster=ns/c1 err=failed to call \"x\": timeout"]
    );
    let no_errors: String = log
        .lines()
        .filter(|l| !l.starts_with('E'))
        .map(|l| format!("{l}\n"))
        .collect();
    let (what, last) = topology_lines(&no_errors, 1);
    assert_eq!(what, "lines");
    assert_eq!(last, ["17:00:04.1 Creating MachineDeployment Cluster=ns/c2"]);

    let summary = "[FAILED] Timed out after 20s.\n  did not block\n  Expected\n  <bool>: false\n  to be true\nSummarizing 1 Failure:";
    let out = with_controller_lines(summary, ("errors", errors));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[4], "  to be true", "{out}");
    assert_eq!(
        lines[5], "CAPI core's ClusterTopology controller, its last errors:",
        "{out}"
    );
    assert!(lines[6].starts_with("  17:00:03.1 Reconciler error"), "{out}");
    assert_eq!(lines[7], "Summarizing 1 Failure:", "{out}");
    assert_eq!(with_controller_lines(summary, ("lines", vec![])), summary);
}

#[test]
fn the_failure_summary_is_ginkgos_and_says_so_when_there_is_none() {
    let out = "spec output\n  [FAILED] Timed out after 60s.\n  resourceVersions never became stable\n  -  \"KaironMachine/a\": \"1\",\n  [FAILED] in [It] - x.go:64 @ 12/06/26\nmore\nSummarizing 1 Failure:\n  [FAIL] kcp-adoption [It] x\n  /path/kcp_adoption.go:203\n\nRan 7 of 13 Specs\n";
    let summary = failure_summary(out);
    assert!(summary.starts_with("[FAILED] Timed out after 60s."), "{summary}");
    assert!(summary.contains("KaironMachine/a"), "{summary}");
    assert!(summary.contains("Summarizing 1 Failure:"), "{summary}");
    assert!(summary.contains("kcp_adoption.go:203"), "{summary}");
    assert!(!summary.contains("spec output"), "{summary}");
    // The end marker's repetition is not a failure of its own.
    assert_eq!(summary.matches("[FAILED] in [It]").count(), 1, "{summary}");
    let no_summary = failure_summary("panic: no ginkgo at all\n");
    assert_eq!(no_summary, "(no Ginkgo failure summary in the output)");
    let long = format!("Summarizing 2 Failures:\n{}", "x\n".repeat(200));
    assert_eq!(failure_summary(&long).lines().count(), 60);
    let many = format!("{}Summarizing 5 Failures:\n", "[FAILED] one\nline\n".repeat(5));
    assert_eq!(failure_summary(&many).matches("[FAILED] one").count(), 3);
}

/// Every Describe of `tests/capi-e2e` is in exactly one part: a label in none would run in no
/// `make test` (Ginkgo reports "Ran 0 specs", a success), a label in two would run twice.
#[test]
fn every_spec_label_is_in_exactly_one_part() {
    let dir = workspace_root().join("tests/capi-e2e");
    let mut labels = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("reading tests/capi-e2e").flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "go") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("reading a Go file");
        for line in text.lines().filter(|l| l.starts_with("var _ = Describe(")) {
            let (_, rest) = line.split_once("Label(\"").expect("every Describe has a label");
            let label = rest.split('"').next().unwrap_or_default().to_string();
            if !line.contains("\"not-applicable\"") {
                labels.push(label);
            }
        }
    }
    assert!(labels.len() >= 20, "found only {labels:?} in {}", dir.display());
    let in_parts: Vec<&str> = PARTS.iter().flat_map(|p| p.split("||")).map(str::trim).collect();
    for label in &labels {
        let times = in_parts.iter().filter(|l| *l == label).count();
        assert_eq!(times, 1, "spec label {label:?} is in {times} parts of PARTS");
    }
    for label in &in_parts {
        assert!(
            labels.iter().any(|l| l == label),
            "PARTS names {label:?}, which no Describe has"
        );
    }
}

/// A temp dir (named after `tag`) holding a copy of `templates/`, as the release assets hold
/// them, and the test flavors written from it.
fn flavors_from_shipped_templates(tag: &str) -> PathBuf {
    let assets = std::env::temp_dir().join(format!("capkr-capi-e2e-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&assets).expect("a temp dir");
    let templates = workspace_root().join("templates");
    for entry in std::fs::read_dir(&templates).expect("reading templates/").flatten() {
        std::fs::copy(entry.path(), assets.join(entry.file_name())).expect("copying a template");
    }
    write_test_flavors(&assets);
    assets
}

/// The test flavors are derived from the shipped templates by text edits that assert what
/// they expect to find: run them all on a copy of `templates/` (as the release assets hold
/// them), so a template change that breaks one fails here in a second, not in the suite.
#[test]
fn every_test_flavor_derives_from_the_shipped_templates() {
    let assets = flavors_from_shipped_templates("flavors");
    let v1beta1 = std::fs::read_to_string(assets.join("clusterclass-kairon-runtimesdk-v1beta1.yaml")).expect("written");
    let (class, _) = v1beta1.split_once("\n---\n").expect("class and templates");
    // Every worker class of either kind sits at the same depth, its templates under `template`.
    for kind in ["\n    machineDeployments:\n", "\n    machinePools:\n"] {
        assert!(class.contains(kind), "no {kind:?} in {class}");
        if let Some((_, rest)) = class.split_once(kind) {
            let first = rest.lines().next().unwrap_or_default();
            assert!(
                first.starts_with("      - class: "),
                "{kind:?} is followed by {first:?}"
            );
            assert!(rest.contains("        template:\n          bootstrap:"), "{class}");
        }
    }
    let _ = std::fs::remove_dir_all(&assets);
}

/// CAPI's KCP adoption spec applies step 2 in file order and gives the KubeadmControlPlane 5 s
/// to carry the cluster-name label, which only the Cluster controller sets. A Cluster pointed
/// at a control plane that does not exist yet is looked at again only 30 s later (CAPI's
/// `externalReadyWait`), so the flavor creates everything the Cluster refers to before it
/// updates the Cluster.
#[test]
fn kcp_adoption_flavor_creates_what_the_cluster_refers_to_before_the_cluster() {
    let assets = flavors_from_shipped_templates("adoption");
    let flavor = std::fs::read_to_string(assets.join("cluster-template-kcp-adoption.yaml")).expect("written");
    let _ = std::fs::remove_dir_all(&assets);
    for step in ["kcp-adoption.step1", "kcp-adoption.step2"] {
        let kinds: Vec<&str> = flavor
            .split("\n---\n")
            .filter(|doc| doc.contains(step))
            .map(|doc| {
                doc.lines()
                    .find_map(|l| l.strip_prefix("kind: "))
                    .expect("every document has a kind")
            })
            .collect();
        let cluster = kinds
            .iter()
            .position(|k| *k == "Cluster")
            .expect("each step has the Cluster");
        for referred in ["KaironCluster", "KubeadmControlPlane"] {
            if let Some(at) = kinds.iter().position(|k| *k == referred) {
                assert!(
                    at < cluster,
                    "{step} applies the {referred} after the Cluster: {kinds:?}"
                );
            }
        }
    }
}
