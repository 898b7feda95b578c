//! The rig of the end-to-end tests (`e2e_*.rs`, and the operability tests that need CAPI): the
//! real control plane (`capkr_testenv::Env`), one workload cluster, the Kairon simulator,
//! capkr-manager, and a CAPI cluster made of one control-plane Machine (kubeadm init data) and
//! a MachineDeployment (kubeadm join data). With [`RigOptions::guests`] the simulator runs the
//! control-plane VMs for real instead (their etcd, kube-apiserver, controller manager and
//! scheduler), and the test applies a shipped flavor (`crate::templates_support`'s methods of
//! the rig). An end-to-end test starts with [`Rig::start`]; everything else it needs
//! (versions, API resources, ports, HTTP) comes from `capkr_testenv`.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use capkr::api::conditions::{self, INSTANCE_PROVISIONED, READY};
use capkr::api::{KaironCluster, KaironMachine};
use capkr::kairon;
use capkr_testenv::audit::AuditEvent;
use capkr_testenv::cluster::{ClusterOptions, all_running_with_a_node, cluster_yaml, scale_machine_deployment, states};
use capkr_testenv::faults::FaultProxy;
use capkr_testenv::flavors::{GuestNetwork, guest_simulator_args};
use capkr_testenv::{
    CapiManagers, Env, EnvOptions, Process, SIMULATOR_HOSTS, WorkloadCluster, capi_resource, merged_args, wait_for,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::distribution_support::LocalRepo;

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
    /// The manager talks to the API server through a fault proxy that faults this share of
    /// its requests (`capkr_testenv::faults`). Such a rig has an environment of its own.
    pub api_faults: Option<f64>,
    /// An environment of its own instead of the one the tests of the binary share: for tests
    /// that change the environment itself, watch every namespace, or time what all requests
    /// of the API server cost (`tests/README.md` lists them).
    pub own_env: bool,
    /// The Kairon CRDs of the environment; other than the development ones, the rig has an
    /// environment of its own.
    pub kairon_crds: capkr_testenv::kairon_crds::KaironCrds,
    /// The simulator runs the control-plane VMs' processes (`kairon-sim --guest-bin-dir`) on a
    /// loopback network of the rig's own, in the environment with KubeadmControlPlane's
    /// manager that such rigs of a binary share; no stand-in workload API server and no
    /// cluster objects: the test applies a flavor from `clusterctl generate`.
    pub guests: bool,
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
            api_faults: None,
            own_env: false,
            kairon_crds: Default::default(),
            guests: false,
        }
    }

    /// A rig whose simulator runs the control-plane VMs for real ([`RigOptions::guests`]).
    pub fn guests(name: &'static str) -> Self {
        RigOptions {
            guests: true,
            create: false,
            ..RigOptions::new(name)
        }
    }
}

/// What a rig with [`RigOptions::guests`] has: the guests' loopback network (VMs from
/// `127.<octet>.0.0/20`, the control-plane endpoint `endpoint_ip(1)`; the octet claimed, so
/// parallel tests never share an address), the release assets as a clusterctl repository, and
/// the directory of the VMs' data and logs.
pub struct Guests {
    pub net: GuestNetwork,
    pub repo: LocalRepo,
    pub dir: PathBuf,
}

pub struct Rig {
    pub env: RigEnv,
    pub ns: String,
    pub cluster: String,
    /// The stand-in workload API server; none where the guests run the workload cluster.
    workload: Option<WorkloadCluster>,
    guests: Option<Guests>,
    pub sim: Process,
    pub manager: Process,
    /// The proxy between the manager and the API server, with `api_faults`.
    pub faults: Option<FaultProxy>,
    /// In a shared environment, the manager's identity (`--leader-elect-identity`): the audit
    /// log's requests of this rig's manager are those with it in their User-Agent.
    identity: Option<String>,
}

/// The environment of a rig: the binary's shared one, or its own.
pub enum RigEnv {
    Shared(&'static Env),
    Own(Box<Env>),
}

impl std::ops::Deref for RigEnv {
    type Target = Env;
    fn deref(&self) -> &Env {
        match self {
            RigEnv::Shared(env) => env,
            RigEnv::Own(env) => env,
        }
    }
}

/// The options of the environment the rigs of a test binary share: every rig may read the
/// audit log (its own manager's requests are told apart by identity). A rig's cluster has no
/// control-plane provider (its control-plane Machine is a plain Machine), so no rig's
/// environment runs KubeadmControlPlane's manager.
fn shared_env_options() -> EnvOptions {
    EnvOptions::new("shared")
        .capi_managers(CapiManagers::WITHOUT_CONTROL_PLANE)
        .audit_policy(capkr_testenv::AUDIT_POLICY_METADATA)
}

/// The options of the environment the guest rigs of a test binary share: CAPI's three
/// managers, the flavors' control plane being KubeadmControlPlane.
fn guests_env_options() -> EnvOptions {
    EnvOptions::new("templates")
}

/// Fast simulator delays, hosts in two zones.
pub fn default_sim_args() -> Vec<String> {
    let mut args = capkr_testenv::flavors::guest_delay_args();
    args.extend(["--hosts".to_string(), SIMULATOR_HOSTS.into()]);
    args
}

impl Rig {
    pub async fn start(opts: RigOptions) -> Rig {
        let ns = opts.name.replace('_', "-");
        let own = opts.own_env || opts.api_faults.is_some() || opts.kairon_crds != Default::default();
        let env = if opts.guests {
            RigEnv::Shared(
                Env::shared(guests_env_options())
                    .await
                    .expect("shared test environment"),
            )
        } else if own {
            let mut env_opts = EnvOptions::new(opts.name).capi_managers(CapiManagers::WITHOUT_CONTROL_PLANE);
            env_opts.kairon_crds = opts.kairon_crds.clone();
            if opts.audit {
                env_opts = env_opts.audit_policy(capkr_testenv::AUDIT_POLICY_METADATA);
            }
            RigEnv::Own(Box::new(Env::start(env_opts).await.expect("test environment")))
        } else {
            RigEnv::Shared(
                Env::shared(shared_env_options())
                    .await
                    .expect("shared test environment"),
            )
        };
        let cluster = "c1".to_string();
        env.create_namespace(&ns)
            .await
            .expect("namespace (a name no other test of the binary uses)");
        let (workload, guests) = if opts.guests {
            let guests = Guests {
                net: GuestNetwork::pick(),
                repo: LocalRepo::new(),
                dir: env.dir().join(format!("guests-{ns}")),
            };
            (None, Some(guests))
        } else {
            let workload = env.workload_cluster(&ns, &cluster).await.expect("workload cluster");
            (Some(workload), None)
        };
        // In a shared environment the simulator and the manager keep to the rig's namespace.
        let scope = |defaults: Vec<String>| match own {
            true => defaults,
            false => [defaults, vec!["--namespace".to_string(), ns.clone()]].concat(),
        };
        let identity = (!own).then(|| format!("rig-{ns}"));
        let sim_defaults = match &guests {
            Some(g) => {
                let mut args = capkr_testenv::flavors::guest_delay_args();
                args.extend(guest_simulator_args(env.binaries(), &g.dir, &g.net).expect("simulator flags"));
                args
            }
            None => default_sim_args(),
        };
        let sim_args = merged_args(scope(sim_defaults), &opts.sim_args);
        let sim = env.start_simulator(sim_args).expect("simulator");
        let mut manager_defaults = scope(vec!["-v".to_string(), "1".to_string()]);
        if let Some(id) = &identity {
            manager_defaults.extend(["--leader-elect-identity".to_string(), id.clone()]);
        }
        let mut manager_args = merged_args(manager_defaults, &opts.manager_args);
        let faults = match opts.api_faults {
            Some(share) => {
                let proxy = FaultProxy::start(env.client(), share, 0x5eed, env.dir())
                    .await
                    .expect("fault proxy");
                manager_args.push(format!("--kubeconfig={}", proxy.kubeconfig.display()));
                Some(proxy)
            }
            None => None,
        };
        let manager = env.start_manager(manager_args).expect("manager");
        let rig = Rig {
            env,
            ns,
            cluster,
            workload,
            guests,
            sim,
            manager,
            faults,
            identity,
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
        cluster_yaml(
            &self.ns,
            &self.cluster,
            &self.workload().host,
            self.workload().port,
            &shape,
        )
    }

    pub fn machines(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.env.client(), &self.ns, &capi_resource("Machine", "machines"))
    }

    pub fn machine_deployments(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.env.client(),
            &self.ns,
            &capi_resource("MachineDeployment", "machinedeployments"),
        )
    }

    pub fn clusters(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.env.client(), &self.ns, &capi_resource("Cluster", "clusters"))
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
        Api::all(self.workload().client())
    }

    /// The stand-in workload cluster (a rig without [`RigOptions::guests`]).
    pub fn workload(&self) -> &WorkloadCluster {
        self.workload
            .as_ref()
            .expect("a rig whose guests run the workload cluster has no stand-in for it")
    }

    /// The guests' network, repository and directory (a rig with [`RigOptions::guests`]).
    pub fn guests(&self) -> &Guests {
        self.guests.as_ref().expect("a rig with RigOptions::guests")
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
                self.dump();
                panic!("{e:#}");
            }
        }
    }

    /// Fails the test with the environment printed.
    pub fn fail(&self, msg: impl std::fmt::Display) -> ! {
        self.dump();
        panic!("{msg}");
    }

    /// Prints the environment (process logs, objects) and the tails of the guests' logs.
    pub fn dump(&self) {
        self.env.dump();
        let Some(g) = &self.guests else {
            return;
        };
        for log in std::fs::read_dir(g.dir.join("logs")).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(log.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            eprintln!("--- {} (tail)", log.path().display());
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
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
    /// In a shared environment `None` means this rig's manager, not every test's.
    pub fn manager_writes(&self, from: u64, identity: Option<&str>) -> Vec<String> {
        capkr_testenv::audit::manager_writes(&self.audit_events(from), identity.or(self.identity.as_deref()))
    }

    /// Every request of the manager (any verb, Leases included) that reached the API server
    /// from byte `from` of the audit log on, in order of arrival.
    pub fn manager_requests(&self, from: u64) -> Vec<AuditEvent> {
        let mut reqs: Vec<AuditEvent> = self
            .audit_events(from)
            .into_iter()
            .filter(|e| e.from_manager(self.identity.as_deref()) && e.counts_request())
            .collect();
        reqs.sort_by(|a, b| a.request_received_timestamp.cmp(&b.request_received_timestamp));
        reqs
    }

    /// Waits until exactly `n` Machines exist and all are Running with a nodeRef.
    pub async fn wait_running(&self, n: usize, timeout: Duration) -> Vec<DynamicObject> {
        let machines = self.machines();
        let waited = wait_for(format!("{n} Machines Running with a nodeRef"), timeout, || async {
            let list = machines.list(&ListParams::default()).await?;
            Ok::<_, kube::Error>(all_running_with_a_node(&list.items, n).then_some(list.items))
        })
        .await;
        match waited {
            Ok(v) => v,
            Err(e) => {
                let states = self.states().await;
                self.fail(format!("{e:#}\n{states}"))
            }
        }
    }

    /// Each Machine's, KaironMachine's and Kairon Machine's phase, node and conditions not
    /// True, a line each (see [`capkr_testenv::cluster::states`]): what a failed wait reports
    /// in its message, which the test runner's digest shows.
    pub async fn states(&self) -> String {
        async fn listed<K>(api: Api<K>) -> Vec<DynamicObject>
        where
            K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
        {
            let items = api
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            items
                .into_iter()
                .filter_map(|o| serde_json::from_value(serde_json::to_value(o).ok()?).ok())
                .collect()
        }
        let (machines, kms, vms) = (
            listed(self.machines()).await,
            listed(self.kms()).await,
            listed(self.vms()).await,
        );
        format!(
            "Machines:\n{}\nKaironMachines:\n{}\nKairon Machines:\n{}",
            states(&machines),
            states(&kms),
            states(&vms)
        )
    }

    pub async fn scale(&self, replicas: usize) {
        let md = format!("{}-md-0", self.cluster);
        scale_machine_deployment(&self.env.client(), &self.ns, &md, replicas)
            .await
            .expect("scale MachineDeployment");
    }

    /// Scales the MachineDeployment to `workers` and waits until the control plane and
    /// `workers` Machines run and exactly as many Kairon Machines are left, one per
    /// KaironMachine (scaling down removes the VMs of the deleted Machines, none leaks).
    pub async fn scale_and_settle(&self, workers: usize, timeout: Duration) {
        self.scale(workers).await;
        self.wait_running(workers + 1, timeout).await;
        let vms = self.vms();
        self.wait(&format!("{workers} worker VMs left"), timeout, || async {
            Ok::<_, kube::Error>(vms.list(&ListParams::default()).await?.items.len() == workers + 1)
        })
        .await;
        self.assert_one_vm_per_kaironmachine().await;
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

/// A rig of the shared environment leaves it as it found it for the tests still running: its
/// Clusters paused (CAPI's controllers leave them alone), its workload API server stopped; its
/// simulator and manager stop with it. On a failure it prints the environment first.
impl Drop for Rig {
    fn drop(&mut self) {
        let env: &'static Env = match &self.env {
            RigEnv::Shared(env) => env,
            RigEnv::Own(_) => return,
        };
        env.leave_namespace(&self.ns);
        if let Some(workload) = &self.workload {
            env.stop_workload(workload);
        }
    }
}

/// The port a process started by the environment serves `flag` on (`--health-addr`,
/// `--metrics-bind-address`: the environment picks free ones).
/// The smallest KaironMachine spec the tests create by hand (1 CPU, 1Gi, image `img`, 10Gi disk),
/// on the shipped flavors' network (a tap device on bridge `br0`, learning its address).
pub fn km_spec() -> capkr::api::KaironMachineSpec {
    capkr::api::KaironMachineSpec {
        image: capkr::api::MachineImage::from_image_ref("img", Some("10Gi")),
        resources: Some(capkr::api::MachineResources::new(1, "1Gi")),
        network: Some(capkr::api::MachineNetwork {
            mode: Some(capkr::api::network_mode::TAP.into()),
            bridge: Some("br0".into()),
            learn_ip: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn port_of(p: &Process, flag: &str) -> u16 {
    p.spec()
        .loopback_port(flag)
        .unwrap_or_else(|| panic!("no {flag}=127.0.0.1:<port> in {}", p.spec().command_line()))
}

/// Status and reason of the Ready condition of a KaironMachine.
pub fn km_ready(km: &KaironMachine) -> Option<(String, String)> {
    let c = conditions::get(km.status.as_ref()?.conditions.as_deref()?, READY)?;
    Some((c.status.clone(), c.reason.clone()))
}

/// Reason and message of the InstanceProvisioned condition of a KaironMachine.
pub fn km_instance(km: &KaironMachine) -> Option<(String, String)> {
    let c = conditions::get(km.status.as_ref()?.conditions.as_deref()?, INSTANCE_PROVISIONED)?;
    Some((c.reason.clone(), c.message.clone()))
}

/// A condition of a dynamic object.
pub fn condition<'a>(obj: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    obj.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// A Cluster and its KaironCluster at endpoint `host`, nothing else (no control plane, no
/// Machine), naming the identity `(kind, name)` if given: enough for the KaironCluster
/// reconciler to use, and protect, the identity.
pub fn bare_cluster_yaml(name: &str, host: &str, identity: Option<(&str, &str)>) -> String {
    let identity = identity.map_or(String::new(), |(kind, name)| {
        format!("\n  identityRef:\n    kind: {kind}\n    name: {name}")
    });
    format!(
        r#"apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata:
  name: {name}
spec:
  infrastructureRef:
    apiGroup: infrastructure.cluster.x-k8s.io
    kind: KaironCluster
    name: {name}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KaironCluster
metadata:
  name: {name}
spec:
  controlPlaneEndpoint:
    host: {host}
    port: 6443{identity}"#
    )
}
