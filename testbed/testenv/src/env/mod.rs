//! The management control plane of one test: etcd, kube-apiserver, kube-controller-manager,
//! CAPI's three managers with their webhooks, and our CRDs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::core::ApiResource;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::bins::{Binaries, own_binary, workspace_root};
use crate::certs::{Ca, CertPair, service_account_keys};
use crate::clients::RuntimeClients;
use crate::kube_util::{apply_yaml, config_from_kubeconfig, get_text, render_kubeconfig, resolve_kind};
use crate::manifests::{
    WebhookTarget, prepare_capi_crd, prepare_webhook_configuration, read_yaml_dir, read_yaml_documents,
};
use crate::net::{free_port, http_get};
use crate::process::{Process, ProcessSpec, ready_or_restarted_once, stop_all};
use crate::scratch::{ScratchDir, keep_requested};
use crate::wait::wait_for;

mod options;
mod running;

pub use options::*;

pub(crate) fn write_file(path: &Path, content: &str) -> Result<()> {
    std::fs::write(path, content).with_context(|| format!("writing {}", path.display()))
}

#[derive(Clone, Debug)]
pub(crate) struct WorkloadRecord {
    pub namespace: String,
    pub name: String,
    pub kubeconfig_path: PathBuf,
}

struct CapiManager {
    label: &'static str,
    binary: PathBuf,
    manifests: &'static str,
    webhook_port: u16,
    health_port: u16,
    feature_gates: String,
}

/// A running management cluster. Dropping it stops every process (API servers before etcd)
/// and removes its temp dir (kept with `CAPKR_TEST_KEEP=1`); when dropped during a panic it
/// first prints process logs and the relevant objects.
pub struct Env {
    pub(crate) name: String,
    pub(crate) dir: PathBuf,
    tempdir: Option<ScratchDir>,
    pub(crate) bins: Binaries,
    pub(crate) ca: Ca,
    pub(crate) server_url: String,
    pub(crate) kubeconfig_path: PathBuf,
    clients: RuntimeClients,
    pub(crate) etcd_url: String,
    audit_log: Option<PathBuf>,
    etcd: Mutex<Option<Process>>,
    /// Everything but etcd, in start order.
    pub(crate) procs: Mutex<Vec<Process>>,
    pub(crate) workloads: Mutex<Vec<WorkloadRecord>>,
    counter: AtomicUsize,
    startup: Duration,
    phases: Vec<(&'static str, Duration)>,
}

impl Env {
    /// Starts everything and waits until it is ready (see the crate docs).
    pub async fn start(opts: EnvOptions) -> Result<Env> {
        let t0 = Instant::now();
        let bins = Binaries::locate()?;
        let safe: String = opts
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        sweep_abandoned_dirs();
        let tempdir = ScratchDir::new(&format!("capkr-testenv-{safe}-"))?;
        let dir = tempdir.path().to_path_buf();
        for d in ["logs", "pki", "etcd", "webhook-certs"] {
            std::fs::create_dir_all(dir.join(d)).with_context(|| format!("creating {d}"))?;
        }
        write_file(&dir.join(OWNER_FILE), &std::process::id().to_string())?;
        {
            use std::os::unix::fs::PermissionsExt;
            // etcd warns about (and future versions refuse) a data dir readable by others.
            let _ = std::fs::set_permissions(dir.join("etcd"), std::fs::Permissions::from_mode(0o700));
        }

        let ca = Ca::new("capkr-testenv-ca")?;
        let admin = ca.client_cert("capkr-admin", &["system:masters"])?;
        let api_port = free_port()?;
        let server_url = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = render_kubeconfig(&safe, &server_url, &ca.pair.cert_pem, &admin);
        let kubeconfig_path = dir.join("admin.kubeconfig");
        write_file(&kubeconfig_path, &kubeconfig)?;
        let config = config_from_kubeconfig(&kubeconfig).await?;

        let mut env = Env {
            name: opts.name.clone(),
            dir: dir.clone(),
            tempdir: Some(tempdir),
            bins,
            ca,
            server_url,
            kubeconfig_path,
            clients: RuntimeClients::new(config),
            etcd_url: String::new(),
            audit_log: None,
            etcd: Mutex::new(None),
            procs: Mutex::new(Vec::new()),
            workloads: Mutex::new(Vec::new()),
            counter: AtomicUsize::new(0),
            startup: Duration::ZERO,
            phases: Vec::new(),
        };
        match env.boot(&opts, api_port, t0).await {
            Ok(()) => {
                env.startup = t0.elapsed();
                crate::tally::record(if opts.capi == CapiManagers::default() {
                    crate::tally::Started::FullEnvironment
                } else {
                    crate::tally::Started::ApiServerEnvironment
                });
                let phases: Vec<String> = env
                    .phases
                    .iter()
                    .map(|(n, d)| format!("{n} {:.1}s", d.as_secs_f64()))
                    .collect();
                eprintln!(
                    "capkr-testenv[{}]: up in {:.1}s ({}) at {}",
                    env.name,
                    env.startup.as_secs_f64(),
                    phases.join(", "),
                    env.dir.display()
                );
                Ok(env)
            }
            Err(e) => {
                env.dump_logs(40);
                Err(e.context(format!("starting the test environment {:?}", env.name)))
            }
        }
    }

    async fn boot(&mut self, opts: &EnvOptions, api_port: u16, t0: Instant) -> Result<()> {
        let mut mark = t0;
        let mut phase = |phases: &mut Vec<(&'static str, Duration)>, name: &'static str| {
            let now = Instant::now();
            phases.push((name, now - mark));
            mark = now;
        };
        let pki = self.dir.join("pki");
        let logs = self.log_dir();

        // etcd
        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        self.etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let etcd = ProcessSpec::new("etcd", &self.bins.etcd, &logs)
            .args([
                "--name=default".to_string(),
                format!("--data-dir={}", self.dir.join("etcd").display()),
                format!("--listen-client-urls={}", self.etcd_url),
                format!("--advertise-client-urls={}", self.etcd_url),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ])
            .test_go_runtime();
        *self.etcd.lock().unwrap_or_else(|e| e.into_inner()) = Some(Process::spawn(etcd)?);
        self.wait_http("etcd", etcd_port, "/health", Duration::from_secs(20))
            .await?;
        phase(&mut self.phases, "etcd");

        // kube-apiserver
        let serving = self.ca.serving_cert(
            "kube-apiserver",
            &["10.0.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
        )?;
        let mut args = apiserver_args(
            &pki,
            "",
            api_port,
            &self.etcd_url,
            "/registry",
            &self.ca.pair,
            &serving,
            "10.0.0.0/24",
        )?;
        if let Some(policy) = &opts.audit_policy {
            let policy_path = self.dir.join("audit-policy.yaml");
            write_file(&policy_path, policy)?;
            let log = self.dir.join("audit.log");
            args.push(format!("--audit-policy-file={}", policy_path.display()));
            args.push(format!("--audit-log-path={}", log.display()));
            args.push("--audit-log-format=json".into());
            args.push("--audit-log-mode=blocking".into());
            // The default (0) means 100 MB to the log rotation underneath: a rotated log would
            // lose requests from under the tests and the benchmark, so never rotate.
            args.push("--audit-log-maxsize=1048576".into());
            self.audit_log = Some(log);
        }
        // The admission plugins Cluster API's own e2e management cluster enables besides the
        // defaults: the shipped RBAC must work under them.
        args.push(CAPI_E2E_ADMISSION_PLUGINS.into());
        args.extend(opts.apiserver_args.iter().cloned());
        let apiserver = ProcessSpec::new("kube-apiserver", &self.bins.kube_apiserver, &logs)
            .args(args)
            .test_go_runtime();
        self.push(Process::spawn(apiserver)?);
        let client = self.client();
        self.wait_apiserver("kube-apiserver", &client).await?;
        phase(&mut self.phases, "kube-apiserver");

        // CRDs and webhook configurations, before the managers (they watch these types).
        let webhook_cert = self.ca.serving_cert("capi-webhooks", &[])?;
        let wh_dir = self.dir.join("webhook-certs");
        write_file(&wh_dir.join("tls.crt"), &webhook_cert.cert_pem)?;
        write_file(&wh_dir.join("tls.key"), &webhook_cert.key_pem)?;
        let managers = self.capi_managers(opts)?;
        let crd_names = self.install_crds(&managers, &opts.kairon_crds).await?;

        self.wait_established(crd_names).await?;
        phase(&mut self.phases, "crds");

        // kube-controller-manager: garbage collection and namespace deletion only. Started
        // after the CRDs are served: the garbage collector re-reads discovery only every 30 s.
        let kcm = ProcessSpec::new("kube-controller-manager", &self.bins.kube_controller_manager, &logs)
            .args([
                format!("--kubeconfig={}", self.kubeconfig_path.display()),
                "--leader-elect=false".into(),
                "--controllers=garbage-collector-controller,namespace-controller".into(),
                "--use-service-account-credentials=false".into(),
                "--secure-port=0".into(),
            ])
            .test_go_runtime();
        self.push(Process::spawn(kcm)?);

        // CAPI's managers index their types at setup: they need the CRDs served.
        for m in &managers {
            let mut args = vec![
                format!("--kubeconfig={}", self.kubeconfig_path.display()),
                "--leader-elect=false".into(),
                format!("--webhook-port={}", m.webhook_port),
                format!("--webhook-cert-dir={}", wh_dir.display()),
                format!("--health-addr=127.0.0.1:{}", m.health_port),
                "--diagnostics-address=0".into(),
                format!("--feature-gates={}", m.feature_gates),
            ];
            args.extend(opts.capi_args.iter().cloned());
            let mut spec = ProcessSpec::new(m.label, &m.binary, &logs).args(args).test_go_runtime();
            for (k, v) in &opts.capi_env {
                spec = spec.env(k, v);
            }
            self.push(Process::spawn(spec)?);
        }
        let waits = managers.iter().map(|m| self.wait_manager_ready(m));
        futures::future::try_join_all(waits).await?;
        self.ensure_running("kube-controller-manager")?;
        phase(&mut self.phases, "capi-managers");

        if opts.check_webhooks && opts.capi.core {
            self.check_machinedeployment_defaulting().await?;
            phase(&mut self.phases, "webhooks");
        }
        Ok(())
    }

    /// Waits for a CAPI manager's `/readyz`. One that exits first is started once more, as
    /// the kubelet restarts a crashed manager's Pod; what made it exit is printed (its first
    /// error lines). On a loaded machine CAPI core has exited while starting, its controllers
    /// shut down with "failed waiting for … Informer to sync".
    async fn wait_manager_ready(&self, m: &CapiManager) -> Result<()> {
        let ready = || self.wait_http(m.label, m.health_port, "/readyz", Duration::from_secs(60));
        ready_or_restarted_once(&self.procs, m.label, &self.name, ready).await
    }

    fn capi_managers(&self, opts: &EnvOptions) -> Result<Vec<CapiManager>> {
        let mut v = Vec::new();
        let fg = opts.capi_feature_gates.clone();
        if opts.capi.core {
            v.push(CapiManager {
                label: "capi-core",
                binary: self.bins.capi_core.clone(),
                manifests: "core",
                webhook_port: free_port()?,
                health_port: free_port()?,
                feature_gates: fg.clone(),
            });
        }
        if opts.capi.bootstrap {
            v.push(CapiManager {
                label: "capi-kubeadm-bootstrap",
                binary: self.bins.capi_bootstrap.clone(),
                manifests: "bootstrap-kubeadm",
                webhook_port: free_port()?,
                health_port: free_port()?,
                // CABPK knows no ClusterTopology gate.
                feature_gates: "MachinePool=true".into(),
            });
        }
        if opts.capi.control_plane {
            v.push(CapiManager {
                label: "capi-kubeadm-control-plane",
                binary: self.bins.capi_control_plane.clone(),
                manifests: "control-plane-kubeadm",
                webhook_port: free_port()?,
                health_port: free_port()?,
                feature_gates: fg,
            });
        }
        Ok(v)
    }

    /// Creates all CRDs and webhook configurations; returns the CRD names.
    async fn install_crds(
        &self,
        managers: &[CapiManager],
        kairon: &crate::kairon_crds::KaironCrds,
    ) -> Result<Vec<String>> {
        let mut docs: Vec<Value> = Vec::new();
        for group in ["core", "bootstrap-kubeadm", "control-plane-kubeadm"] {
            let m = managers.iter().find(|m| m.manifests == group);
            let target = m.map(|m| WebhookTarget {
                port: m.webhook_port,
                ca_pem: self.ca.pair.cert_pem.clone(),
            });
            let base = self.bins.capi_manifests.join(group);
            for crd in read_yaml_dir(&base.join("crd"))? {
                docs.push(prepare_capi_crd(crd, target.as_ref())?);
            }
            // Without its manager a webhook (failurePolicy Fail) would block every write.
            if let Some(target) = &target {
                for cfg in read_yaml_documents(&base.join("webhook/manifests.yaml"))? {
                    docs.push(prepare_webhook_configuration(cfg, group, target)?);
                }
            }
        }
        let root = workspace_root();
        docs.extend(read_yaml_dir(&root.join("config/crd/bases"))?);
        docs.extend(
            read_yaml_dir(&root.join("config/kairon"))?
                .into_iter()
                .map(|d| kairon.apply(d)),
        );

        let crd_names: Vec<String> = docs
            .iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
            .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        let creates = docs.into_iter().map(|doc| {
            let client = self.client();
            async move { create_value(&client, doc).await }
        });
        futures::future::try_join_all(creates).await?;
        Ok(crd_names)
    }

    async fn wait_established(&self, crd_names: Vec<String>) -> Result<()> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client());
        // Generous: on a loaded machine (a release build beside it) a fresh API server takes
        // tens of seconds per list.
        wait_for("CRDs to be Established", Duration::from_secs(90), || {
            let crds = crds.clone();
            let names = crd_names.clone();
            async move {
                let list = crds.list(&ListParams::default()).await?;
                let established: HashSet<String> = list
                    .items
                    .iter()
                    .filter(|c| {
                        c.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
                    })
                    .filter_map(|c| c.metadata.name.clone())
                    .collect();
                Ok::<_, kube::Error>(names.iter().all(|n| established.contains(n)))
            }
        })
        .await
    }

    /// A server-side dry-run create of a MachineDeployment must come back defaulted by CAPI's
    /// webhook (`spec.replicas`); without the webhook it stays nil.
    async fn check_machinedeployment_defaulting(&self) -> Result<()> {
        let md = machine_deployment_probe("default");
        let (ar, caps) = resolve_kind(&self.client(), "cluster.x-k8s.io/v1beta2", "MachineDeployment").await?;
        let api = crate::kube_util::dynamic_api(&self.client(), &ar, &caps, Some("default"));
        let pp = PostParams {
            dry_run: true,
            field_manager: None,
        };
        let got = wait_for(
            "the MachineDeployment defaulting webhook",
            Duration::from_secs(30),
            || {
                let api = api.clone();
                let md = md.clone();
                let pp = pp.clone();
                async move { api.create(&pp, &md).await.map(Some) }
            },
        )
        .await?;
        if got.data["spec"]["replicas"].is_null() {
            bail!("a dry-run MachineDeployment was not defaulted (spec.replicas is nil): CAPI's webhook is not wired");
        }
        Ok(())
    }

    async fn wait_http(&self, name: &str, port: u16, path: &str, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            self.ensure_running(name)?;
            match http_get(port, path).await.map(|r| r.status) {
                Ok(200) => return Ok(()),
                Ok(_) | Err(_) if start.elapsed() < timeout => {}
                Ok(code) => bail!("{name}: GET {path} answered {code} after {timeout:?}"),
                Err(e) => bail!("{name}: GET {path} failed after {timeout:?}: {e:#}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn wait_apiserver(&self, name: &str, client: &Client) -> Result<()> {
        let start = Instant::now();
        let timeout = Duration::from_secs(60);
        loop {
            self.ensure_running(name)?;
            match get_text(client, "/readyz").await {
                Ok(t) if t.trim() == "ok" => return Ok(()),
                Ok(_) | Err(_) if start.elapsed() < timeout => {}
                Ok(t) => bail!("{name}: /readyz answered {t:?} after {timeout:?}"),
                Err(e) => bail!("{name}: /readyz failed after {timeout:?}: {e:#}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// An error with the log tail if the named process has exited.
    pub(crate) fn ensure_running(&self, name: &str) -> Result<()> {
        let check = |p: &Process| -> Result<()> {
            if let Some(status) = p.try_exit_status() {
                bail!("{}", p.exit_report(status, 30));
            }
            Ok(())
        };
        if let Some(p) = self.etcd.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
            && p.name() == name
        {
            return check(p);
        }
        let procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        match procs.iter().find(|p| p.name() == name) {
            Some(p) => check(p),
            None => Err(anyhow!("no process named {name}")),
        }
    }

    /// Every process of the environment that has exited: its name, exit status and last
    /// `lines` log lines; empty while all run. A failure whose cause is a webhook or an API
    /// server that is gone (a refused connection) names that cause with it.
    pub fn exited(&self, lines: usize) -> String {
        let mut out = String::new();
        let mut one = |p: &Process| {
            if let Some(status) = p.try_exit_status() {
                out.push_str(&p.exit_report(status, lines));
                out.push('\n');
            }
        };
        if let Some(p) = self.etcd.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            one(p);
        }
        for p in self.procs.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            one(p);
        }
        out
    }

    /// Hands a process the test started (a simulator, a manager) to the environment, which
    /// stops it with its own: what a shared environment's setup starts lives as long as it.
    pub fn keep(&self, p: Process) {
        self.push(p);
    }

    pub(crate) fn push(&self, p: Process) {
        self.procs.lock().unwrap_or_else(|e| e.into_inner()).push(p);
    }

    pub(crate) fn next_id(&self) -> usize {
        self.counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    // ----- accessors -------------------------------------------------------------------

    /// An admin (`system:masters`) client of the management cluster.
    pub fn client(&self) -> Client {
        self.clients.get()
    }
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }
    /// Writes `tls.crt` and `tls.key` into `dir`: a serving certificate of this environment's
    /// CA for `common_name`, loopback and `sans` (a webhook server's certificate directory).
    pub fn write_serving_cert(&self, dir: &Path, common_name: &str, sans: &[&str]) -> Result<()> {
        let pair = self.ca.serving_cert(common_name, sans)?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_file(&dir.join("tls.crt"), &pair.cert_pem)?;
        write_file(&dir.join("tls.key"), &pair.key_pem)
    }
    /// The PEM of the test CA (signs the API server, webhook and admin certificates).
    pub fn ca_pem(&self) -> &str {
        &self.ca.pair.cert_pem
    }
    pub fn server_url(&self) -> &str {
        &self.server_url
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn binaries(&self) -> &Binaries {
        &self.bins
    }
    /// Writes `<dir>/<file>`: the admin kubeconfig acting as `user` (`as:` impersonation), e.g.
    /// `system:serviceaccount:capkr-system:capkr-manager`, so that a process run with it has
    /// exactly that user's RBAC.
    pub fn impersonating_kubeconfig(&self, user: &str, file: &str) -> Result<PathBuf> {
        let admin = std::fs::read_to_string(&self.kubeconfig_path)
            .with_context(|| format!("reading {}", self.kubeconfig_path.display()))?;
        let impersonating = admin.replace("    client-key-data:", &format!("    as: {user}\n    client-key-data:"));
        if impersonating == admin {
            bail!("the admin kubeconfig has no client key to add `as: {user}` next to");
        }
        let path = self.dir.join(file);
        write_file(&path, &impersonating)?;
        Ok(path)
    }
    /// The audit log, when [`EnvOptions::audit_policy`] was set.
    pub fn audit_log_path(&self) -> Option<&Path> {
        self.audit_log.as_deref()
    }
    /// How long [`Env::start`] took.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }
    /// Pids of every process the environment runs (etcd, API servers, managers).
    pub fn pids(&self) -> Vec<(String, u32)> {
        let mut v = Vec::new();
        if let Some(p) = self.etcd.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            v.extend(p.pid().map(|pid| (p.name().to_string(), pid)));
        }
        for p in self.procs.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            v.extend(p.pid().map(|pid| (p.name().to_string(), pid)));
        }
        v
    }
}

/// Holds the pid of the test process that owns an environment dir.
const OWNER_FILE: &str = "owner.pid";

/// Removes environment dirs left behind by test processes that were killed (SIGKILL, abort:
/// no destructor ran). Their children died with them (`PR_SET_PDEATHSIG`).
fn sweep_abandoned_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let is_ours = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("capkr-testenv-"));
        if !is_ours {
            continue;
        }
        let owner = std::fs::read_to_string(path.join(OWNER_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        if let Some(pid) = owner
            && !crate::process::pid_alive(pid)
        {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::thread::panicking() && self.tempdir.is_some() {
            self.dump();
        }
        self.shutdown();
    }
}

/// Flags shared by the management and workload API servers.
#[allow(clippy::too_many_arguments)]
pub(crate) fn apiserver_args(
    pki: &Path,
    prefix: &str,
    port: u16,
    etcd_url: &str,
    etcd_prefix: &str,
    ca: &CertPair,
    serving: &CertPair,
    service_range: &str,
) -> Result<Vec<String>> {
    let (sa_pub, sa_key) = service_account_keys()?;
    let f = |n: &str| pki.join(format!("{prefix}{n}"));
    write_file(&f("ca.crt"), &ca.cert_pem)?;
    write_file(&f("apiserver.crt"), &serving.cert_pem)?;
    write_file(&f("apiserver.key"), &serving.key_pem)?;
    write_file(&f("sa.pub"), &sa_pub)?;
    write_file(&f("sa.key"), &sa_key)?;
    Ok(vec![
        format!("--etcd-servers={etcd_url}"),
        format!("--etcd-prefix={etcd_prefix}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", pki.display()),
        format!("--tls-cert-file={}", f("apiserver.crt").display()),
        format!("--tls-private-key-file={}", f("apiserver.key").display()),
        format!("--client-ca-file={}", f("ca.crt").display()),
        "--authorization-mode=RBAC".into(),
        format!("--service-cluster-ip-range={service_range}"),
        format!("--service-account-issuer=https://127.0.0.1:{port}"),
        format!("--service-account-key-file={}", f("sa.pub").display()),
        format!("--service-account-signing-key-file={}", f("sa.key").display()),
        // No service-account controller runs, so no default ServiceAccount exists.
        "--disable-admission-plugins=ServiceAccount".into(),
        "--allow-privileged=true".into(),
        "--endpoint-reconciler-type=none".into(),
        // API priority and fairness is the API server's own queueing, which no test exercises
        // (the fault proxy answers 429s itself): without it an API server is ready about twice
        // as soon and spends about a third less CPU starting (it writes no bootstrap
        // FlowSchemas and PriorityLevelConfigurations; docs/development.md).
        "--enable-priority-and-fairness=false".into(),
        // `CAPKR_TEST_PROFILING=1` serves /debug/pprof (for `kubectl get --raw`), to see
        // where the API servers' CPU goes.
        format!(
            "--profiling={}",
            std::env::var("CAPKR_TEST_PROFILING").is_ok_and(|v| v == "1")
        ),
    ])
}

async fn create_value(client: &Client, doc: Value) -> Result<()> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default().to_string();
    let kind = doc["kind"].as_str().unwrap_or_default().to_string();
    let name = doc["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    let plural = match kind.as_str() {
        "CustomResourceDefinition" => "customresourcedefinitions",
        "MutatingWebhookConfiguration" => "mutatingwebhookconfigurations",
        "ValidatingWebhookConfiguration" => "validatingwebhookconfigurations",
        other => bail!("unexpected kind {other} in the install manifests"),
    };
    let ar = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.clone(),
        kind: kind.clone(),
        plural: plural.into(),
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let obj: DynamicObject = serde_json::from_value(doc).with_context(|| format!("{kind} {name}"))?;
    api.create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating {kind} {name}"))?;
    Ok(())
}

/// A MachineDeployment that only a defaulting webhook makes complete.
pub(crate) fn machine_deployment_probe(namespace: &str) -> DynamicObject {
    let v = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineDeployment",
        "metadata": {"name": "capkr-testenv-webhook-probe", "namespace": namespace},
        "spec": {
            "clusterName": "probe",
            "template": {"spec": {
                "clusterName": "probe",
                "version": crate::cluster::KUBERNETES_VERSION,
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfigTemplate", "name": "probe"}},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironMachineTemplate", "name": "probe"},
            }},
        },
    });
    // A literal of a valid object always deserializes.
    serde_json::from_value(v).unwrap_or_else(|_| DynamicObject {
        types: None,
        metadata: Default::default(),
        data: Value::Null,
    })
}
