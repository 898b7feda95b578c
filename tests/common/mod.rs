//! A cluster rig for the end-to-end tests: the real control plane (`capkr_testenv::Env`), one
//! workload cluster, the Kairon simulator, capkr-manager, and a CAPI cluster made of one
//! control-plane Machine (kubeadm init data) and a MachineDeployment (kubeadm join data).

#![allow(dead_code)] // each test binary uses part of it

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use capkr::api::conditions::{self, READY};
use capkr::api::{KaironCluster, KaironMachine};
use capkr::kairon;
use capkr_testenv::audit::AuditEvent;
use capkr_testenv::cluster::{ClusterOptions, cluster_yaml};
use capkr_testenv::{Env, EnvOptions, Process, WorkloadCluster, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

#[allow(unused_imports)] // not every test binary uses it
pub use capkr_testenv::cluster::KUBERNETES_VERSION;

/// The simulator's hosts: two failure domains.
pub const HOSTS: &str = "kairon-node-1:topology.kairon.zyvor.dev/zone=zone-a,\
kairon-node-2:topology.kairon.zyvor.dev/zone=zone-b,kairon-node-3:topology.kairon.zyvor.dev/zone=zone-b";

#[derive(Clone)]
pub struct RigOptions {
    pub name: &'static str,
    pub workers: usize,
    /// Failure domain of the control-plane Machine and of the MachineDeployment's Machines.
    pub cp_failure_domain: Option<&'static str>,
    pub md_failure_domain: Option<&'static str>,
    pub sim_args: Vec<String>,
    pub manager_args: Vec<String>,
    pub audit: bool,
    /// A MachineHealthCheck on the MachineDeployment's Machines.
    pub health_check: bool,
    /// Create the cluster objects right away.
    pub create: bool,
}

impl RigOptions {
    pub fn new(name: &'static str) -> Self {
        RigOptions {
            name,
            workers: 2,
            cp_failure_domain: None,
            md_failure_domain: None,
            sim_args: vec![],
            manager_args: vec![],
            audit: false,
            health_check: false,
            create: true,
        }
    }
}

pub struct Rig {
    pub env: Env,
    pub ns: String,
    pub cluster: String,
    pub workload: WorkloadCluster,
    pub sim: Process,
    pub manager: Process,
}

pub fn gvk(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub fn capi(kind: &str, plural: &str) -> ApiResource {
    gvk("cluster.x-k8s.io", "v1beta2", kind, plural)
}

/// Fast simulator delays, hosts in two zones.
pub fn default_sim_args() -> Vec<String> {
    [
        "--provision-delay",
        "200ms",
        "--boot-delay",
        "500ms",
        "--delete-delay",
        "1s",
        "--hosts",
        HOSTS,
    ]
    .map(String::from)
    .to_vec()
}

/// `defaults` with every `--flag value` pair that `extra` also gives dropped, then `extra`:
/// the simulator, like most CLIs, rejects a flag given twice.
pub fn merged_args(defaults: Vec<String>, extra: &[String]) -> Vec<String> {
    let mut out = vec![];
    let mut it = defaults.into_iter().peekable();
    while let Some(a) = it.next() {
        let takes_value = it.peek().is_some_and(|v| !v.starts_with('-'));
        if a.starts_with('-') && extra.contains(&a) {
            if takes_value {
                it.next();
            }
            continue;
        }
        out.push(a);
    }
    out.extend(extra.iter().cloned());
    out
}

impl Rig {
    pub async fn start(opts: RigOptions) -> Rig {
        let mut env_opts = EnvOptions::new(opts.name);
        if opts.audit {
            env_opts = env_opts.audit_policy(capkr_testenv::AUDIT_POLICY_METADATA);
        }
        let env = Env::start(env_opts).await.expect("test environment");
        let ns = opts.name.replace('_', "-");
        let cluster = "c1".to_string();
        env.create_namespace(&ns).await.expect("namespace");
        let workload = env.workload_cluster(&ns, &cluster).await.expect("workload cluster");
        let sim_args = merged_args(default_sim_args(), &opts.sim_args);
        let sim = env.start_simulator(sim_args).expect("simulator");
        let manager_args = merged_args(vec!["-v".to_string(), "1".to_string()], &opts.manager_args);
        let manager = env.start_manager(manager_args).expect("manager");
        let rig = Rig {
            env,
            ns,
            cluster,
            workload,
            sim,
            manager,
        };
        // A process that rejects its flags exits at once; say so instead of timing out later.
        tokio::time::sleep(Duration::from_millis(500)).await;
        for p in [&rig.sim, &rig.manager] {
            if !p.is_running() {
                rig.fail(format!("{} exited right after start (see its log above)", p.name()));
            }
        }
        if opts.create {
            let yaml = rig.manifests(&opts);
            rig.env
                .apply(&yaml, Some(&rig.ns))
                .await
                .expect("cluster objects apply");
        }
        rig
    }

    pub fn manifests(&self, opts: &RigOptions) -> String {
        let shape = ClusterOptions {
            workers: opts.workers,
            cp_failure_domain: opts.cp_failure_domain.map(String::from),
            md_failure_domain: opts.md_failure_domain.map(String::from),
            health_check: opts.health_check,
        };
        cluster_yaml(&self.ns, &self.cluster, &self.workload.host, self.workload.port, &shape)
    }

    pub fn machines(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.env.client(), &self.ns, &capi("Machine", "machines"))
    }

    pub fn machine_deployments(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.env.client(),
            &self.ns,
            &capi("MachineDeployment", "machinedeployments"),
        )
    }

    pub fn clusters(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.env.client(), &self.ns, &capi("Cluster", "clusters"))
    }

    pub fn kms(&self) -> Api<KaironMachine> {
        Api::namespaced(self.env.client(), &self.ns)
    }

    pub fn kcs(&self) -> Api<KaironCluster> {
        Api::namespaced(self.env.client(), &self.ns)
    }

    pub fn vms(&self) -> Api<kairon::Machine> {
        Api::namespaced(self.env.client(), &self.ns)
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.workload.client())
    }

    /// Waits for `check`; on timeout prints the environment (logs, objects) and fails.
    pub async fn wait<T, R, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = R>,
        R: capkr_testenv::Outcome<T>,
    {
        match wait_for(what, timeout, check).await {
            Ok(v) => v,
            Err(e) => {
                self.env.dump();
                panic!("{e:#}");
            }
        }
    }

    /// Fails the test with the environment printed.
    pub fn fail(&self, msg: impl std::fmt::Display) -> ! {
        self.env.dump();
        panic!("{msg}");
    }

    /// Current size of the API server's audit log: an offset for [`Rig::manager_writes`].
    pub fn audit_len(&self) -> u64 {
        std::fs::metadata(self.env.audit_log_path().expect("the rig has an audit log"))
            .unwrap()
            .len()
    }

    /// The audit log's events from byte `from` on.
    fn audit_events(&self, from: u64) -> Vec<AuditEvent> {
        let path = self.env.audit_log_path().expect("the rig has an audit log");
        capkr_testenv::audit::AuditLog::at(path, from)
            .read_new()
            .expect("the audit log reads")
    }

    /// The manager's writes (create, update, patch, delete) in the audit log from byte `from`
    /// on, of one replica `identity` if given; Lease writes (leader election) are left out.
    /// Requests are told apart by the manager's User-Agent, `capkr-manager/<version> (<identity>)`.
    pub fn manager_writes(&self, from: u64, identity: Option<&str>) -> Vec<String> {
        capkr_testenv::audit::manager_writes(&self.audit_events(from), identity)
    }

    /// Every request of the manager (any verb, Leases included) that reached the API server
    /// from byte `from` of the audit log on, in order of arrival.
    pub fn manager_requests(&self, from: u64) -> Vec<AuditEvent> {
        let mut reqs: Vec<AuditEvent> = self
            .audit_events(from)
            .into_iter()
            .filter(|e| e.from_manager(None) && e.counts_request())
            .collect();
        reqs.sort_by(|a, b| a.request_received_timestamp.cmp(&b.request_received_timestamp));
        reqs
    }

    /// Waits until exactly `n` Machines exist and all are Running with a nodeRef.
    pub async fn wait_running(&self, n: usize, timeout: Duration) -> Vec<DynamicObject> {
        let machines = self.machines();
        self.wait(&format!("{n} Machines Running with a nodeRef"), timeout, || async {
            let list = machines.list(&ListParams::default()).await?;
            let ok = list.items.len() == n
                && list.items.iter().all(|m| {
                    m.metadata.deletion_timestamp.is_none()
                        && m.data["status"]["phase"] == "Running"
                        && m.data["status"]["nodeRef"]["name"].is_string()
                });
            Ok::<_, kube::Error>(ok.then_some(list.items))
        })
        .await
    }

    pub async fn scale(&self, replicas: usize) {
        let md = format!("{}-md-0", self.cluster);
        self.machine_deployments()
            .patch(
                &md,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
            .expect("scale MachineDeployment");
    }

    pub async fn set_paused(&self, paused: bool) {
        self.clusters()
            .patch(
                &self.cluster,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"paused": paused}})),
            )
            .await
            .expect("pause Cluster");
    }

    /// Kairon Machines by name.
    pub async fn vm_map(&self) -> BTreeMap<String, kairon::Machine> {
        let list = self
            .vms()
            .list(&ListParams::default())
            .await
            .expect("list Kairon Machines");
        list.items
            .into_iter()
            .map(|v| (v.metadata.name.clone().unwrap_or_default(), v))
            .collect()
    }

    /// Checks the one-to-one link between KaironMachines and Kairon Machines: every
    /// KaironMachine has exactly one Kairon Machine carrying its UID, and no Kairon Machine is
    /// without its KaironMachine.
    pub async fn assert_one_vm_per_kaironmachine(&self) {
        let kms = self
            .kms()
            .list(&ListParams::default())
            .await
            .expect("list KaironMachines")
            .items;
        let vms = self.vm_map().await;
        for km in &kms {
            let uid = km.metadata.uid.clone().unwrap();
            let carrying: Vec<_> = vms
                .values()
                .filter(|v| {
                    v.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(kairon::labels::KAIRONMACHINE_UID))
                        == Some(&uid)
                })
                .collect();
            if carrying.len() != 1 {
                self.fail(format!(
                    "KaironMachine {:?} has {} Kairon Machines",
                    km.metadata.name,
                    carrying.len()
                ));
            }
        }
        for name in vms.keys() {
            if !kms.iter().any(|k| k.metadata.name.as_deref() == Some(name.as_str())) {
                self.fail(format!("Kairon Machine {name} has no KaironMachine (leaked)"));
            }
        }
    }
}

/// Status of the Ready condition of a KaironMachine.
/// The port a started manager serves `flag` on (the test environment picks free ones).
pub fn port_of(p: &Process, flag: &str) -> u16 {
    let line = p.spec().command_line();
    let prefix = format!("{flag}=127.0.0.1:");
    line.split_whitespace()
        .find_map(|a| a.trim_matches('\'').strip_prefix(&prefix).and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| panic!("no {flag} in {line}"))
}

/// `GET http://127.0.0.1:<port><path>`: status code and body.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    Some((
        code,
        buf.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    ))
}

pub fn km_ready(km: &KaironMachine) -> Option<(String, String)> {
    let c = conditions::get(km.status.as_ref()?.conditions.as_deref()?, READY)?;
    Some((c.status.clone(), c.reason.clone()))
}

/// A condition of a dynamic object.
pub fn condition<'a>(obj: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    obj.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

#[test]
fn merged_args_let_extra_flags_win() {
    let d = ["--a", "1", "--b", "2", "--flag", "--c", "3"]
        .map(String::from)
        .to_vec();
    let e = ["--b".to_string(), "9".to_string(), "--flag".to_string()];
    assert_eq!(merged_args(d, &e), ["--a", "1", "--c", "3", "--b", "9", "--flag"]);
}
