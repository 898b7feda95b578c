//! kairon-sim: plays Kairon's controller (kairon-controller) and the booting guests, for the
//! tests and the local demo. Behaviour, flags and annotations: `README.md` beside this crate.
//!
//! - [`sim`]: the Machine phase machine (pure);
//! - [`placement`], [`hosts`]: placement, capacity and the address pool (pure bookkeeping);
//! - [`migration`], [`evacuation`]: MachineMigrations (live and cold) and the older model's host
//!   maintenance (pure); [`evacuate`]: the `evacuate` subcommand, as `kaironctl evacuate`;
//! - [`guest`]: what a guest makes of its cloud-init user-data (pure); [`cloud_init`]: the
//!   NoCloud seed Kairon renders from a structured cloudInit (pure);
//! - [`kubelet`]: when the guest's kubelet registers, posts Ready and stops (pure);
//! - [`network`]: the guest's network (`spec.network`): which address Kairon reports, what
//!   reaches what (pure); [`join_reach`]: whether a guest's `kubeadm join` gets through (pure);
//! - [`machines`], [`site_writes`], [`workload`], [`guest_ops`]: writes to the management
//!   and the workload API servers ([`status_patch`]: what a status write sends);
//! - [`kubeadm`], [`fleet`], [`static_pods`], [`procs`], [`endpoint`], [`kubeadm_objects`]:
//!   with `--guest-bin-dir`, what `kubeadm init`/`join --control-plane` start on a
//!   control-plane VM (real etcd, kube-apiserver, kube-controller-manager, kube-scheduler),
//!   the kube-vip endpoint, and what they leave in the workload cluster;
//! - [`kwok`]: the KWOK controller per cluster that plays the kubelets (Leases, Pods);
//! - [`addons`], [`addons_objects`]: the CoreDNS and kube-proxy addons `kubeadm init` installs;
//! - [`scripts`]: with `--guest-scripts-dir`, the guest's cloud-init `runcmd` run for real in
//!   a sandbox (one `sh` script; FluxVM's entries each their own `bash -lc`); kubeadm waits
//!   until the guest calls it;
//! - [`images`]: Kairon's MachineImage resolution of an `imageRef` (pure);
//! - [`reachability`]: Kairon hosts that stop answering: `NodeUnreachable`, a dead node's
//!   Machines left alone, fenced ones placed anew (pure); [`fence`]: the `fence` subcommand, as
//!   `kaironctl fence`;
//! - [`engine`]: the watch-driven event loop tying them together.

mod addons;
mod addons_objects;
mod boot;
mod cloud_init;
mod disruption;
mod endpoint;
mod engine;
mod evacuate;
mod fence;
mod flags;
mod fleet;
mod guest;
mod guest_ops;
mod hosts;
mod images;
mod join_reach;
mod kubeadm;
mod kubeadm_objects;
mod kubelet;
mod kwok;
mod machines;
mod migration;
mod network;
mod placement;
mod procs;
mod reachability;
mod scripts;
mod sim;
mod site_writes;
mod static_pods;
mod status_patch;
mod webhook;
mod workload;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tracing_subscriber::EnvFilter;

use crate::engine::{Engine, Options};
use crate::hosts::{AddressPool, Allocations};
use crate::placement::Placement;
use crate::sim::Delays;

#[derive(Parser, Debug)]
#[command(
    name = "kairon-sim",
    version,
    about = "Simulates kairon-controller and booting guests"
)]
struct Args {
    /// Kubeconfig of the management API server (default: KUBECONFIG, then in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig of the API server serving Kairon Machines (default: the management one).
    /// The management API server is still where the workload clusters' kubeconfigs are read.
    #[arg(long, global = true)]
    kairon_kubeconfig: Option<PathBuf>,
    /// Watch Machines in this namespace only (default: all namespaces).
    #[arg(long)]
    namespace: Option<String>,
    /// Pending -> Starting (kairon-controller places it, FluxVM creates it).
    #[arg(long, default_value = "1s", value_parser = flags::parse_duration)]
    provision_delay: Duration,
    /// Starting -> Running.
    #[arg(long, default_value = "2s", value_parser = flags::parse_duration)]
    boot_delay: Duration,
    /// deletionTimestamp -> finalizer removed.
    #[arg(long, default_value = "1s", value_parser = flags::parse_duration)]
    delete_delay: Duration,
    /// +- this fraction applied to each delay.
    #[arg(long, default_value = "0.2", value_parser = flags::parse_fraction)]
    jitter: f64,
    /// Probability that a Machine ends Failed (reason ProvisioningFailed) instead of Running.
    #[arg(long, default_value = "0", value_parser = flags::parse_fraction)]
    failure_rate: f64,
    /// Hosts and their labels: "h1:key=value;key2=value2,h2:key=value,h3"
    /// (default: unlabelled kairon-node-1..3).
    #[arg(long, value_parser = flags::parse_host_list)]
    hosts: Option<flags::HostList>,
    /// Max machines per host; 0 = unlimited.
    #[arg(long, default_value_t = 0)]
    host_capacity: usize,
    /// Write Machine metadata with a full PUT of a model without ownerReferences.
    #[arg(long)]
    full_update: bool,
    /// Do not register Nodes in workload clusters.
    #[arg(long)]
    no_boot_guest: bool,
    /// IPv4 pool for InternalIP addresses.
    #[arg(long, default_value = "10.42.0.0/16")]
    address_pool: String,
    /// Run control-plane VMs for real: a dir holding etcd, kube-apiserver and kairon-guest.
    /// Needs an --address-pool in 127.0.0.0/8 (the VMs' processes bind their address).
    #[arg(long, requires = "guest_dir")]
    guest_bin_dir: Option<PathBuf>,
    /// Where control-plane VMs keep their data and logs.
    #[arg(long, requires = "guest_bin_dir")]
    guest_dir: Option<PathBuf>,
    /// Run the guests' cloud-init `runcmd` for real, as cloud-init runs it, each VM in a
    /// sandbox whose disk is its own dir under this one; kubeadm waits until the guest calls
    /// it. Nothing a guest writes reaches the host.
    #[arg(long)]
    guest_scripts_dir: Option<PathBuf>,
    /// A live migration's Running -> Succeeded (the VM's nodeName changes then).
    #[arg(long, default_value = "1s", value_parser = flags::parse_duration)]
    migration_delay: Duration,
    /// Keep a Node per --hosts entry on the Kairon API server (created or adopted), as Kairon's
    /// hosts are; a cordoned one (`spec.unschedulable`) takes no new VM and no migration. Off
    /// by default: simulators sharing an API server would share node names.
    #[arg(long)]
    host_objects: bool,
    /// Kairon's cordon evacuation (off in Kairon by default): every Machine on a cordoned Node
    /// gets a cold MachineMigration, under the MachineDisruptionBudgets, tried again at most
    /// every 2 minutes.
    #[arg(long, requires = "host_objects")]
    cordon_evacuation: bool,
    /// Kairon's optional admission webhook (off in Kairon by default): a MachineMigration
    /// create a MachineDisruptionBudget of its namespace does not allow is refused. Served on
    /// 127.0.0.1 and registered with the Kairon API server (limited to --namespace if given).
    #[arg(long)]
    admission_webhook: bool,
    /// Play Kairon's MachineImage resolution: a Machine whose `spec.image.imageRef` names no
    /// MachineImage, one of kind iso or an invalid one stays Pending with Kairon's message and
    /// no condition; one that resolves gets the image's source and digest pinned. Off by
    /// default: the image is then taken as resolved (the test clusters name images that no
    /// MachineImage describes).
    #[arg(long)]
    machine_images: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Empty a node by MachineMigrations, as `kaironctl evacuate NODE` does (on the Kairon API
    /// server: --kairon-kubeconfig, else --kubeconfig).
    Evacuate(evacuate::EvacuateArgs),
    /// Fence a Machine off a node that is gone, as `kaironctl fence MACHINE --reason …` does.
    Fence(fence::FenceArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if let Some(Command::Evacuate(evacuate)) = args.command {
        let kubeconfig = args.kairon_kubeconfig.or(args.kubeconfig);
        let client = management_client(kubeconfig.as_deref()).await?;
        return evacuate::run(client, evacuate).await;
    }
    if let Some(Command::Fence(fence)) = args.command {
        let kubeconfig = args.kairon_kubeconfig.or(args.kubeconfig);
        let client = management_client(kubeconfig.as_deref()).await?;
        return fence::run(client, fence).await;
    }
    let pool = AddressPool::new(&args.address_pool).map_err(anyhow::Error::msg)?;
    let hosts = args.hosts.clone().map(|h| h.0).unwrap_or_else(flags::default_hosts);
    let client = management_client(args.kubeconfig.as_deref()).await?;
    let kairon = match args.kairon_kubeconfig.as_deref() {
        Some(path) => management_client(Some(path)).await?,
        None => client.clone(),
    };
    tracing::info!(
        namespace = args.namespace.as_deref().unwrap_or("<all>"),
        hosts = hosts.len(),
        host_capacity = args.host_capacity,
        provision_delay = ?args.provision_delay,
        boot_delay = ?args.boot_delay,
        delete_delay = ?args.delete_delay,
        jitter = args.jitter,
        failure_rate = args.failure_rate,
        full_update = args.full_update,
        boot_guest = !args.no_boot_guest,
        migration_delay = ?args.migration_delay,
        host_objects = args.host_objects,
        "kairon-sim starting"
    );
    let opts = Options {
        namespace: args.namespace,
        delays: Delays {
            provision: args.provision_delay,
            boot: args.boot_delay,
            delete: args.delete_delay,
            jitter: args.jitter,
        },
        failure_rate: args.failure_rate,
        full_update: args.full_update,
        boot_guest: !args.no_boot_guest,
        guest_tools: args
            .guest_bin_dir
            .zip(args.guest_dir)
            .map(|(bin_dir, data_dir)| fleet::GuestTools { bin_dir, data_dir }),
        guest_scripts_dir: args.guest_scripts_dir,
        migration_delay: args.migration_delay,
        host_objects: args.host_objects,
        cordon_evacuation: args.cordon_evacuation,
        machine_images: args.machine_images,
    };
    let allocations = Allocations {
        placement: Placement::new(hosts, args.host_capacity),
        pool,
    };
    let webhook = match args.admission_webhook {
        true => Some(webhook::Webhook::start(kairon.clone(), opts.namespace.as_deref()).await?),
        false => None,
    };
    let engine = Engine::new(kairon, client, opts, allocations);
    let outcome = tokio::select! {
        () = engine.run() => Err(anyhow::anyhow!("the Machine watch ended")),
        signal = shutdown_signal() => signal.map(|s| tracing::info!(signal = s, "shutting down")),
    };
    if let Some(webhook) = webhook {
        webhook.stop().await;
    }
    outcome
}

async fn management_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading {}", path.display()))?
        }
        None => Config::infer()
            .await
            .context("no kubeconfig (KUBECONFIG, ~/.kube/config or in-cluster)")?,
    };
    Client::try_from(config).context("building the management client")
}

async fn shutdown_signal() -> anyhow::Result<&'static str> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => Ok("SIGTERM"),
        r = tokio::signal::ctrl_c() => r.map(|()| "SIGINT").map_err(Into::into),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_contract_parses() {
        let args = Args::try_parse_from([
            "kairon-sim",
            "--kubeconfig",
            "/tmp/kc",
            "--namespace",
            "ns",
            "--provision-delay",
            "0s",
            "--boot-delay",
            "500ms",
            "--delete-delay",
            "1m",
            "--jitter",
            "0",
            "--failure-rate",
            "0.5",
            "--hosts",
            "kairon-node-1:topology.kairon.zyvor.dev/zone=zone-a,kairon-node-2:topology.kairon.zyvor.dev/zone=zone-b",
            "--host-capacity",
            "2",
            "--full-update",
            "--no-boot-guest",
            "--address-pool",
            "10.0.0.0/24",
            "--migration-delay",
            "3s",
            "--host-objects",
        ])
        .unwrap();
        assert_eq!(args.boot_delay, Duration::from_millis(500));
        assert_eq!(args.hosts.map(|h| h.0.len()), Some(2));
        assert!(args.full_update && args.no_boot_guest && args.host_objects);
        assert_eq!(args.migration_delay, Duration::from_secs(3));
        let defaults = Args::try_parse_from(["kairon-sim"]).unwrap();
        assert_eq!(
            (defaults.provision_delay, defaults.boot_delay, defaults.delete_delay),
            (Duration::from_secs(1), Duration::from_secs(2), Duration::from_secs(1))
        );
        assert_eq!(
            (defaults.jitter, defaults.failure_rate, defaults.host_capacity),
            (0.2, 0.0, 0)
        );
        assert_eq!(defaults.migration_delay, Duration::from_secs(1));
        assert!(!defaults.host_objects);
        let evacuate =
            Args::try_parse_from(["kairon-sim", "evacuate", "h1", "--wait", "--kubeconfig", "/tmp/kc"]).unwrap();
        assert_eq!(evacuate.kubeconfig, Some(PathBuf::from("/tmp/kc")));
        match evacuate.command {
            Some(Command::Evacuate(e)) => {
                assert_eq!((e.node.as_str(), e.strategy.as_str(), e.wait), ("h1", "cold", true));
                assert_eq!(
                    (e.interval, e.timeout),
                    (Duration::from_secs(10), Duration::from_secs(900))
                );
            }
            _ => panic!("no evacuate subcommand"),
        }
    }
}
