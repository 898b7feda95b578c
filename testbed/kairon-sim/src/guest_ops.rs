//! What the simulated guest does against its workload cluster's API server, run as tasks by
//! the engine: register the Node, post its status, stop its kubelet, remove it. Errors become a retry after a
//! while, never a failure of the Machine, as a kubelet would keep trying.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use capkr::kairon::{Machine, labels};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::boot::{BootInput, boot_input, guest_ran, node_facts};
use crate::fleet::{ClusterRef, Fleet, FleetError, Stopped};
use crate::guest;
use crate::kubeadm::control_plane_plan;
use crate::kubeadm_objects::delete_mirror_pods;
use crate::kubelet::{GuestOutcome, RegisteredNode};
use crate::scripts::{GuestScripts, Progress};
use crate::sim::Key;
use crate::workload::{NodeFacts, WorkloadError, Workloads, desired_node, node_status};

/// Back-off after a failed workload API call.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(5);
/// How often to look again at a guest's pre-kubeadm commands that have not exited.
const RETRY_SCRIPTS_RUNNING: Duration = Duration::from_secs(1);
/// How often to look for a workload cluster's kubeconfig Secret that does not exist yet.
const RETRY_NO_KUBECONFIG: Duration = Duration::from_secs(2);

fn cluster_of(m: &Machine) -> Option<String> {
    m.labels().get(labels::CLUSTER_NAME).cloned()
}

/// What the booting guest reads; empty user-data if none (it then runs and writes nothing).
fn boot_of(m: &Machine) -> BootInput {
    boot_input(m).unwrap_or_else(|| BootInput {
        user_data: String::new(),
        meta: guest::MetaData {
            instance_id: String::new(),
            local_hostname: m.name_any(),
        },
    })
}

/// With real control-plane VMs: runs what `kubeadm init`/`join --control-plane` would start
/// on this VM before its kubelet registers. `Err` is the outcome to report instead.
async fn boot_control_plane(fleet: &Fleet, m: &Machine, facts: &NodeFacts, cluster: &str) -> Result<(), GuestOutcome> {
    let key = Key::of(m);
    let boot = boot_of(m);
    let plan = guest::written_files(&boot.user_data, &boot.meta)
        .ok()
        .map(|files| control_plane_plan(&files));
    let plan = match plan {
        Some(Ok(Some(plan))) => plan,
        Some(Ok(None)) | None => return Ok(()),
        Some(Err(e)) => {
            tracing::warn!(machine = %key, error = %e, "control-plane VM cannot run kubeadm");
            return Err(GuestOutcome::Unbootable);
        }
    };
    let cluster = ClusterRef {
        namespace: key.namespace.clone(),
        name: cluster.to_string(),
    };
    match fleet
        .ensure(&facts.machine_uid, &key.name, &cluster, facts, &plan)
        .await
    {
        Ok(()) => Ok(()),
        Err(e @ (FleetError::NoPeer | FleetError::NoAddress)) => {
            tracing::info!(machine = %key, "{e}; retrying");
            Err(GuestOutcome::RetryAfter(RETRY_NO_KUBECONFIG))
        }
        Err(e) => {
            tracing::warn!(machine = %key, error = %e, "booting the control plane failed; retrying");
            Err(GuestOutcome::RetryAfter(RETRY_AFTER_ERROR))
        }
    }
}

/// The guest's kubelet registers its Node (with `address`, the guest's own, as its
/// InternalIP), after what runs before it: its runcmd up to kubeadm, and on a control-plane VM
/// with `--guest-bin-dir` the control plane's processes. Whether its `kubeadm join` gets
/// through its network is the engine's to decide before (see [`crate::join_reach`]).
pub async fn register(
    workloads: Arc<Workloads>,
    fleet: Option<Arc<Fleet>>,
    scripts: Option<Arc<GuestScripts>>,
    m: Machine,
    address: Option<Ipv4Addr>,
    ready: bool,
) -> GuestOutcome {
    let key = Key::of(&m);
    let Some(facts) = node_facts(&m, address) else {
        return GuestOutcome::Unbootable;
    };
    // cloud-init's runcmd: the commands before kubeadm first; kubeadm (and so everything
    // below) waits until the guest calls it.
    if let Some(scripts) = &scripts {
        let boot = boot_of(&m);
        if scripts
            .advance(&facts.machine_uid, &key.to_string(), &boot.user_data, &boot.meta)
            .await
            == Progress::Running
        {
            return GuestOutcome::RetryAfter(RETRY_SCRIPTS_RUNNING);
        }
    }
    let Some(cluster) = cluster_of(&m) else {
        tracing::warn!(machine = %key, label = labels::CLUSTER_NAME, "no cluster label: no workload cluster to register in");
        return GuestOutcome::Unbootable;
    };
    if let Some(fleet) = &fleet
        && facts.identity.control_plane
        && let Err(outcome) = boot_control_plane(fleet, &m, &facts, &cluster).await
    {
        return outcome;
    }
    let client = match workloads.client(&key.namespace, &cluster).await {
        Ok(c) => c,
        Err(e @ WorkloadError::NoKubeconfig(_)) => {
            tracing::debug!(machine = %key, "{e}; retrying");
            return GuestOutcome::RetryAfter(RETRY_NO_KUBECONFIG);
        }
        Err(e) => {
            tracing::warn!(machine = %key, error = %e, "workload cluster not reachable; retrying");
            return GuestOutcome::RetryAfter(RETRY_AFTER_ERROR);
        }
    };
    let now = Timestamp::now();
    let node = desired_node(&facts);
    let status = node_status(&facts, ready, now, now);
    match workloads.register_node(&client, &node, &status).await {
        Ok(_) => {
            tracing::info!(
                machine = %key, cluster = %cluster, node = %facts.identity.node_name,
                provider_id = facts.identity.provider_id.as_deref().unwrap_or("<none>"), ready,
                "Node registered"
            );
            GuestOutcome::Registered(
                RegisteredNode {
                    cluster,
                    facts: Arc::new(facts),
                },
                ready,
            )
        }
        Err(e) => {
            tracing::warn!(machine = %key, node = %facts.identity.node_name, error = %e, "registering Node failed; retrying");
            GuestOutcome::RetryAfter(RETRY_AFTER_ERROR)
        }
    }
}

pub async fn post_status(
    workloads: Arc<Workloads>,
    m: Machine,
    node: Option<RegisteredNode>,
    ready: bool,
    since: Timestamp,
) -> GuestOutcome {
    let key = Key::of(&m);
    let Some(node) = node else {
        return GuestOutcome::NodeMissing;
    };
    let client = match workloads.client(&key.namespace, &node.cluster).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(machine = %key, error = %e, "workload cluster not reachable; retrying");
            return GuestOutcome::RetryAfter(RETRY_AFTER_ERROR);
        }
    };
    let status = node_status(&node.facts, ready, since, Timestamp::now());
    match workloads.set_node_status(&client, node.name(), &status).await {
        Ok(_) => GuestOutcome::StatusPosted(ready),
        Err(WorkloadError::NodeMissing(name)) => {
            tracing::info!(machine = %key, node = %name, "Node was deleted; kubelet registers it again");
            GuestOutcome::NodeMissing
        }
        Err(e) => {
            tracing::warn!(machine = %key, error = %e, "posting Node status failed; retrying");
            GuestOutcome::RetryAfter(RETRY_AFTER_ERROR)
        }
    }
}

/// Stops what ran in the VM: its runcmd and a control plane's processes; what
/// the fleet stopped, if it ran any.
async fn stop_processes(fleet: Option<&Fleet>, scripts: Option<&GuestScripts>, m: &Machine) -> Option<Stopped> {
    let uid = m.uid()?;
    if let Some(scripts) = scripts {
        scripts.stop(&uid).await;
    }
    fleet?.stop(&uid).await
}

/// The VM failed or was stopped: what ran in it stops (its runcmd, a control plane's
/// processes) and so does its kubelet, so KWOK no longer beats for its Node. The Node stays;
/// the workload cluster's node lifecycle controller notices, as for a real VM that died.
pub async fn stop(
    workloads: Arc<Workloads>,
    fleet: Option<Arc<Fleet>>,
    scripts: Option<Arc<GuestScripts>>,
    m: Machine,
    known: Option<RegisteredNode>,
) -> GuestOutcome {
    let key = Key::of(&m);
    stop_processes(fleet.as_deref(), scripts.as_deref(), &m).await;
    let (cluster, name) = match known {
        Some(node) => (node.cluster.clone(), node.name().to_string()),
        // Not registered by this process (it restarted since): the Node the guest had, if any.
        None => match (cluster_of(&m), guest_ran(&m)) {
            (Some(cluster), true) => match node_facts(&m, None) {
                Some(facts) => (cluster, facts.identity.node_name),
                None => return GuestOutcome::Stopped,
            },
            _ => return GuestOutcome::Stopped,
        },
    };
    let client = match workloads.client(&key.namespace, &cluster).await {
        Ok(c) => c,
        Err(WorkloadError::NoKubeconfig(_)) => return GuestOutcome::Stopped,
        Err(e) => {
            tracing::warn!(machine = %key, error = %e, "workload cluster not reachable; retrying");
            return GuestOutcome::RetryAfter(RETRY_AFTER_ERROR);
        }
    };
    match workloads.stop_kubelet(&client, &name).await {
        Ok(()) => {
            tracing::info!(machine = %key, node = %name, "VM down: its kubelet stopped");
            GuestOutcome::Stopped
        }
        Err(e) => {
            tracing::warn!(machine = %key, node = %name, error = %e, "stopping the kubelet failed; retrying");
            GuestOutcome::RetryAfter(RETRY_AFTER_ERROR)
        }
    }
}

/// Best effort: a Node that cannot be removed (cluster gone, API down) must not keep the
/// Machine from going away, as the real kairon-controller knows nothing of Nodes.
pub async fn remove_node(
    workloads: Arc<Workloads>,
    fleet: Option<Arc<Fleet>>,
    scripts: Option<Arc<GuestScripts>>,
    m: Machine,
    known: Option<RegisteredNode>,
) {
    let key = Key::of(&m);
    // The VM is gone, and its processes with it (etcd membership is KCP's business: it
    // removes the member before deleting the Machine).
    let stopped = stop_processes(fleet.as_deref(), scripts.as_deref(), &m).await;
    if let Some(stopped) = &stopped
        && let Ok(client) = workloads.client(&key.namespace, &stopped.cluster.name).await
    {
        delete_mirror_pods(&client, &stopped.node).await;
    }
    let (cluster, name, provider_id) = match known {
        Some(node) => (
            node.cluster.clone(),
            node.name().to_string(),
            node.provider_id().map(str::to_string),
        ),
        None => {
            // Not registered by this process (e.g. after a restart): resolve it again,
            // quietly, unless the Machine ever ran.
            let Some(cluster) = cluster_of(&m) else { return };
            if !guest_ran(&m) {
                return;
            }
            let Some(facts) = node_facts(&m, None) else { return };
            (cluster, facts.identity.node_name, facts.identity.provider_id)
        }
    };
    let client = match workloads.client(&key.namespace, &cluster).await {
        Ok(c) => c,
        Err(WorkloadError::NoKubeconfig(_)) => return,
        Err(e) => {
            tracing::warn!(machine = %key, node = %name, error = %e, "cannot reach workload cluster to remove Node");
            return;
        }
    };
    match workloads.delete_node(&client, &name, provider_id.as_deref()).await {
        Ok(true) => tracing::info!(machine = %key, node = %name, "Node removed"),
        Ok(false) => {}
        Err(e) => tracing::warn!(machine = %key, node = %name, error = %e, "removing Node failed"),
    }
}
