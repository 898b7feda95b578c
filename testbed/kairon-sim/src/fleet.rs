//! The processes of simulated control-plane VMs: for each, a real etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler bound to the VM's own loopback address (the
//! pool's, whatever Kairon reports: a user-mode VM's stands in for slirp's `10.0.2.15`), with
//! certificates signed by the cluster's CAs from its bootstrap data (`kairon-guest certs`),
//! plus kubelet's port-forward endpoint (`kairon-guest kubelet`); and per cluster the kube-vip
//! endpoint ([`crate::endpoint`]) and the KWOK controller that plays its kubelets
//! ([`crate::kwok`]). What `kubeadm init` leaves in the cluster is written once the API server
//! answers; see [`crate::kubeadm_objects`].
//!
//! Children are killed when their VM stops, when the simulator exits (kill on drop) and when
//! it dies (`PR_SET_PDEATHSIG`). A VM's data lives under `--guest-dir`, its logs under
//! `<guest-dir>/logs`.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use tokio::process::Child;
use tokio::sync::Mutex;

use crate::endpoint::Endpoint;
use crate::kubeadm::{ControlPlanePlan, first_service_ip};
use crate::kubeadm_objects;
use crate::kwok::{self, ClusterKwok};
use crate::network::{describe, outside_reaches_guest};
use crate::procs::{ProcessError, Supervised, run, spawn, tally_guest_api_server};
use crate::static_pods::{
    ETCD_CLIENT_PORT, ETCD_PEER_PORT, admin_kubeconfig, apiserver_args, controller_manager_args, scheduler_args,
    write_kubeconfig, write_pki,
};
use crate::workload::{KUBELET_PORT, NodeFacts, client_from_kubeconfig};

/// How long an API server may take to answer after it was started.
const API_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Where the binaries are and where VM data goes.
#[derive(Clone, Debug)]
pub struct GuestTools {
    /// Holds `etcd`, `kube-apiserver`, `kube-controller-manager`, `kube-scheduler`, `kwok` and
    /// `kairon-guest`; `../manifests/kwok/stages.yaml` beside it.
    pub bin_dir: PathBuf,
    pub data_dir: PathBuf,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterRef {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("the VM has no InternalIP yet")]
    NoAddress,
    #[error("no running control-plane VM of the cluster to join")]
    NoPeer,
    #[error("preparing the VM's files: {0}")]
    Files(#[source] std::io::Error),
    #[error("{0} failed: {1}")]
    Command(&'static str, String),
    #[error("{0} exited early; see {1}")]
    Exited(&'static str, String),
    #[error("{0} did not become ready within {1:?}; see {2}")]
    NotReady(&'static str, Duration, String),
    #[error("serving the control-plane endpoint {0}: {1}")]
    Endpoint(String, #[source] std::io::Error),
    #[error("writing what kubeadm leaves: {0}")]
    Objects(#[source] kube::Error),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("starting KWOK: {0}")]
    Kwok(#[from] kwok::KwokError),
}

struct Vm {
    cluster: ClusterRef,
    node: String,
    ip: Ipv4Addr,
    etcd_url: String,
    dir: PathBuf,
    children: Vec<(&'static str, Child)>,
    /// kube-controller-manager and kube-scheduler, started again when they exit.
    supervised: Vec<Supervised>,
    /// kubeadm's admin.conf identity against this VM's own API server.
    client: Option<Client>,
    /// What kubeadm leaves in the cluster has been written (retried until it is).
    settled: bool,
}

impl Vm {
    fn alive(&mut self) -> bool {
        self.children.iter_mut().all(|(_, c)| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a stopped VM was, for cleaning up after it.
pub struct Stopped {
    pub cluster: ClusterRef,
    pub node: String,
}

pub struct Fleet {
    tools: GuestTools,
    vms: Mutex<HashMap<String, Vm>>,
    endpoints: Mutex<HashMap<ClusterRef, Endpoint>>,
    kwoks: Mutex<HashMap<ClusterRef, ClusterKwok>>,
    /// One VM boots at a time: etcd adds one member at a time, and kubeadm joins wait for
    /// each other in the same way.
    boot: Mutex<()>,
}

impl Fleet {
    pub fn new(tools: GuestTools) -> Self {
        Self {
            tools,
            vms: Mutex::default(),
            endpoints: Mutex::default(),
            kwoks: Mutex::default(),
            boot: Mutex::default(),
        }
    }

    /// Makes sure the control-plane VM `uid` runs: boots it (init or join) if it does not,
    /// or if one of its processes died. Idempotent; errors mean "try again later".
    pub async fn ensure(
        &self,
        uid: &str,
        vm_name: &str,
        cluster: &ClusterRef,
        facts: &NodeFacts,
        plan: &ControlPlanePlan,
    ) -> Result<(), FleetError> {
        let _boot = self.boot.lock().await;
        let ip: Ipv4Addr = facts
            .internal_ip
            .as_deref()
            .and_then(|a| a.parse().ok())
            .ok_or(FleetError::NoAddress)?;
        let api = SocketAddr::from((ip, plan.api_port));
        {
            let mut vms = self.vms.lock().await;
            match vms.get_mut(uid).map(Vm::alive) {
                Some(true) => {
                    if let Some(vm) = vms.get_mut(uid) {
                        settle(vm, facts, plan).await?;
                    }
                    drop(vms);
                    self.serve_endpoint(uid, cluster, facts, plan, api).await?;
                    return self.ensure_kwok(uid, cluster, plan, api).await;
                }
                Some(false) => {
                    tracing::warn!(vm = vm_name, "a process of the VM died; booting it again");
                    vms.remove(uid);
                }
                None => {}
            }
        }
        let peers: Vec<String> = {
            let vms = self.vms.lock().await;
            vms.values()
                .filter(|v| &v.cluster == cluster)
                .map(|v| v.etcd_url.clone())
                .collect()
        };
        if !plan.init && peers.is_empty() {
            return Err(FleetError::NoPeer);
        }
        let started = Instant::now();
        let mut vm = self.boot_vm(uid, vm_name, cluster, facts, plan, ip, &peers).await?;
        // The processes run from here on, whatever happens to the objects: keep the VM.
        let settled = settle(&mut vm, facts, plan).await;
        self.vms.lock().await.insert(uid.to_string(), vm);
        settled?;
        tracing::info!(
            vm = vm_name, node = %facts.identity.node_name, address = %ip, init = plan.init,
            took = ?started.elapsed(),
            "control plane up (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet endpoint)"
        );
        if plan.vip.is_none() && !outside_reaches_guest(&facts.attachment) {
            // Without kube-vip nothing stands between the outside and the VM's loopback
            // address, so this is not played, only said.
            tracing::info!(
                vm = vm_name, address = %ip,
                "no kube-vip: the API server is served on the VM's address, which in Kairon the outside would not reach from {}",
                describe(&facts.attachment)
            );
        }
        self.serve_endpoint(uid, cluster, facts, plan, api).await?;
        self.ensure_kwok(uid, cluster, plan, api).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn boot_vm(
        &self,
        uid: &str,
        vm_name: &str,
        cluster: &ClusterRef,
        facts: &NodeFacts,
        plan: &ControlPlanePlan,
        ip: Ipv4Addr,
        peers: &[String],
    ) -> Result<Vm, FleetError> {
        let node = facts.identity.node_name.clone();
        let short_uid: String = uid.chars().take(8).collect();
        let dir = self.tools.data_dir.join(format!("{vm_name}-{short_uid}"));
        let logs = self.tools.data_dir.join("logs");
        let pki = dir.join("pki");
        let _ = std::fs::remove_dir_all(&dir);
        write_pki(&pki, &plan.pki).map_err(FleetError::Files)?;
        std::fs::create_dir_all(&logs).map_err(FleetError::Files)?;
        let mut vm = Vm {
            cluster: cluster.clone(),
            node: node.clone(),
            ip,
            client: None,
            settled: false,
            etcd_url: format!("https://{ip}:{ETCD_CLIENT_PORT}"),
            dir: dir.clone(),
            children: Vec::new(),
            supervised: Vec::new(),
        };
        let guest_bin = self.tools.bin_dir.join("kairon-guest");
        let p = |rel: &str| pki.join(rel).display().to_string();

        // kubeadm init phase certs: everything signed by the CAs from the bootstrap data.
        let service_ip = first_service_ip(&plan.service_subnet).unwrap_or(Ipv4Addr::new(10, 96, 0, 1));
        let mut certs = vec![
            "certs".to_string(),
            format!("--pki={}", pki.display()),
            format!("--node={node}"),
            format!("--ip={ip}"),
            format!("--service-ip={service_ip}"),
        ];
        if let Some(vip) = &plan.vip {
            certs.push(format!("--san={}", vip.address));
        }
        run(&guest_bin, &certs, "kairon-guest certs").await?;

        // etcd: a new cluster of one, or a member added to the existing one.
        let peer_url = format!("https://{ip}:{ETCD_PEER_PORT}");
        let (initial_cluster, state) = if plan.init {
            (format!("{node}={peer_url}"), "new")
        } else {
            let mut args = vec![
                "etcd-member-add".to_string(),
                format!("--pki={}", pki.display()),
                format!("--name={node}"),
                format!("--peer-url={peer_url}"),
            ];
            args.extend(peers.iter().map(|e| format!("--endpoint={e}")));
            let out = run(&guest_bin, &args, "etcd member add").await?;
            (out.trim().to_string(), "existing")
        };
        let etcd_args = vec![
            format!("--name={node}"),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls=https://{ip}:{ETCD_CLIENT_PORT}"),
            format!("--advertise-client-urls=https://{ip}:{ETCD_CLIENT_PORT}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster={initial_cluster}"),
            format!("--initial-cluster-state={state}"),
            format!("--listen-metrics-urls=http://{ip}:2381"),
            format!("--cert-file={}", p("etcd/server.crt")),
            format!("--key-file={}", p("etcd/server.key")),
            "--client-cert-auth=true".into(),
            format!("--trusted-ca-file={}", p("etcd/ca.crt")),
            format!("--peer-cert-file={}", p("etcd/peer.crt")),
            format!("--peer-key-file={}", p("etcd/peer.key")),
            "--peer-client-cert-auth=true".into(),
            format!("--peer-trusted-ca-file={}", p("etcd/ca.crt")),
            "--snapshot-count=10000".into(),
            // Test VMs: durability is not what is being simulated.
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        let etcd_log = logs.join(format!("{vm_name}-etcd.log"));
        vm.children
            .push(("etcd", spawn(&self.tools.bin_dir.join("etcd"), &etcd_args, &etcd_log)?));
        wait_tcp(&mut vm, SocketAddr::from((ip, ETCD_CLIENT_PORT)), "etcd", &etcd_log).await?;

        let api_args = apiserver_args(&pki, ip, plan);
        let api_log = logs.join(format!("{vm_name}-kube-apiserver.log"));
        vm.children.push((
            "kube-apiserver",
            spawn(&self.tools.bin_dir.join("kube-apiserver"), &api_args, &api_log)?,
        ));
        tally_guest_api_server();
        let client = admin_client(&pki, &format!("https://{ip}:{}", plan.api_port)).await?;
        wait_api(&mut vm, &client, &api_log).await?;

        let kubelet_log = logs.join(format!("{vm_name}-kubelet.log"));
        let kubelet_args = vec![
            "kubelet".to_string(),
            format!("--pki={}", pki.display()),
            format!("--address={ip}"),
            format!("--port={KUBELET_PORT}"),
        ];
        vm.children
            .push(("kubelet", spawn(&guest_bin, &kubelet_args, &kubelet_log)?));
        wait_tcp(&mut vm, SocketAddr::from((ip, KUBELET_PORT)), "kubelet", &kubelet_log).await?;

        // kube-controller-manager and kube-scheduler, each with kubeadm's kubeconfig of its own
        // against this VM's API server; they elect their leaders across the VMs.
        let server = format!("https://{ip}:{}", plan.api_port);
        let kcm_conf = write_kubeconfig(&pki, &dir, "controller-manager", &server).map_err(FleetError::Files)?;
        let scheduler_conf = write_kubeconfig(&pki, &dir, "scheduler", &server).map_err(FleetError::Files)?;
        vm.supervised.push(Supervised::start(
            "kube-controller-manager",
            self.tools.bin_dir.join("kube-controller-manager"),
            controller_manager_args(&pki, &kcm_conf, ip, &cluster.name),
            logs.join(format!("{vm_name}-kube-controller-manager.log")),
        )?);
        vm.supervised.push(Supervised::start(
            "kube-scheduler",
            self.tools.bin_dir.join("kube-scheduler"),
            scheduler_args(&scheduler_conf, ip),
            logs.join(format!("{vm_name}-kube-scheduler.log")),
        )?);

        vm.client = Some(client);
        Ok(vm)
    }

    /// Makes sure the cluster's KWOK controller runs, against the control-plane endpoint
    /// (or, without kube-vip, this VM's API server) with the admin identity of VM `uid`.
    async fn ensure_kwok(
        &self,
        uid: &str,
        cluster: &ClusterRef,
        plan: &ControlPlanePlan,
        api: SocketAddr,
    ) -> Result<(), FleetError> {
        let pki = {
            let vms = self.vms.lock().await;
            vms.get(uid).map(|v| v.dir.join("pki"))
        };
        let Some(pki) = pki else { return Ok(()) };
        let mut kwoks = self.kwoks.lock().await;
        if kwoks.get(cluster).is_some_and(ClusterKwok::kept) {
            return Ok(());
        }
        kwoks.remove(cluster);
        let server = match &plan.vip {
            Some(vip) => format!("https://{}:{}", vip.address, vip.port),
            None => format!("https://{api}"),
        };
        let pod_cidr = kwok::pod_cidr_of(plan.cluster_configuration.as_ref())
            .unwrap_or_else(|| kwok::DEFAULT_POD_CIDR.to_string());
        let name = format!("kwok-{}-{}", cluster.namespace, cluster.name);
        let kwok = ClusterKwok::start(
            &self.tools.bin_dir,
            &self.tools.data_dir,
            &name,
            &pki,
            &server,
            &pod_cidr,
        )?;
        tracing::info!(cluster = %cluster.name, namespace = %cluster.namespace, %server, "KWOK plays the cluster's kubelets");
        kwoks.insert(cluster.clone(), kwok);
        Ok(())
    }

    /// kube-vip of VM `uid` announces the VIP: its API server becomes a backend of the
    /// cluster's endpoint, which forwards to it only if its network (`facts.attachment`) lets
    /// the outside see the VIP.
    async fn serve_endpoint(
        &self,
        uid: &str,
        cluster: &ClusterRef,
        facts: &NodeFacts,
        plan: &ControlPlanePlan,
        api: SocketAddr,
    ) -> Result<(), FleetError> {
        let Some(vip) = &plan.vip else { return Ok(()) };
        let mut endpoints = self.endpoints.lock().await;
        if !endpoints.contains_key(cluster) {
            let text = format!("{}:{}", vip.address, vip.port);
            let address: SocketAddr = text
                .parse()
                .map_err(|_| FleetError::Endpoint(text.clone(), std::io::ErrorKind::InvalidInput.into()))?;
            let endpoint = Endpoint::listen(address)
                .await
                .map_err(|e| FleetError::Endpoint(text, e))?;
            endpoints.insert(cluster.clone(), endpoint);
        }
        if let Some(endpoint) = endpoints.get(cluster) {
            endpoint.add_backend(uid, api, &facts.attachment);
        }
        Ok(())
    }

    /// Stops the VM's processes and removes its data; the endpoint closes with the cluster's
    /// last VM.
    pub async fn stop(&self, uid: &str) -> Option<Stopped> {
        let vm = self.vms.lock().await.remove(uid)?;
        let stopped = Stopped {
            cluster: vm.cluster.clone(),
            node: vm.node.clone(),
        };
        drop(vm);
        let others = self.vms.lock().await.values().any(|v| v.cluster == stopped.cluster);
        let mut endpoints = self.endpoints.lock().await;
        if let Some(endpoint) = endpoints.get(&stopped.cluster)
            && endpoint.remove_backend(uid) == 0
            && !others
        {
            endpoints.remove(&stopped.cluster);
        }
        drop(endpoints);
        if !others {
            self.kwoks.lock().await.remove(&stopped.cluster);
        }
        tracing::info!(node = %stopped.node, "control-plane VM stopped: its processes killed");
        Some(stopped)
    }
}

/// Writes what `kubeadm init` leaves (init only) and the VM's mirror Pods, once.
async fn settle(vm: &mut Vm, facts: &NodeFacts, plan: &ControlPlanePlan) -> Result<(), FleetError> {
    let Some(client) = vm.client.clone().filter(|_| !vm.settled) else {
        return Ok(());
    };
    // The static pods' images are the control plane's version, which kubeadm takes from the
    // ClusterConfiguration: the bootstrap data's on init, the cluster's `kubeadm-config` on
    // join (KCP updates it before rolling out a new version). kubelet's own version is the
    // image's (see `guest::kubelet_version`); they differ only if the image does not match.
    let version = if plan.init {
        facts.identity.kubernetes_version.clone()
    } else {
        kubeadm_objects::cluster_kubernetes_version(&client)
            .await
            .map_err(FleetError::Objects)?
    }
    .unwrap_or_else(|| facts.kubelet_version.clone());
    if plan.init {
        kubeadm_objects::write_init_objects(&client, plan, &vm.dir.join("pki"))
            .await
            .map_err(FleetError::Objects)?;
    }
    kubeadm_objects::write_mirror_pods(&client, &vm.node, &vm.ip.to_string(), plan.api_port, &version)
        .await
        .map_err(FleetError::Objects)?;
    vm.settled = true;
    Ok(())
}

/// A client with kubeadm's admin.conf identity (certificate from `kairon-guest certs`).
async fn admin_client(pki: &Path, server: &str) -> Result<Client, FleetError> {
    let text = admin_kubeconfig(pki, server).map_err(FleetError::Files)?;
    client_from_kubeconfig(text.as_bytes())
        .await
        .ok_or_else(|| FleetError::Command("admin client", "unusable admin kubeconfig".into()))
}

async fn wait_tcp(vm: &mut Vm, addr: SocketAddr, what: &'static str, log: &Path) -> Result<(), FleetError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        check_alive(vm, log)?;
        if Instant::now() > deadline {
            return Err(FleetError::NotReady(
                what,
                Duration::from_secs(30),
                log.display().to_string(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_api(vm: &mut Vm, client: &Client, log: &Path) -> Result<(), FleetError> {
    let deadline = Instant::now() + API_READY_TIMEOUT;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    loop {
        // kube-system exists once the API server's bootstrap has run.
        if namespaces.get_opt("kube-system").await.ok().flatten().is_some() {
            return Ok(());
        }
        check_alive(vm, log)?;
        if Instant::now() > deadline {
            return Err(FleetError::NotReady(
                "kube-apiserver",
                API_READY_TIMEOUT,
                log.display().to_string(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn check_alive(vm: &mut Vm, log: &Path) -> Result<(), FleetError> {
    for (name, child) in &mut vm.children {
        if !matches!(child.try_wait(), Ok(None)) {
            return Err(FleetError::Exited(name, log.display().to_string()));
        }
    }
    Ok(())
}
