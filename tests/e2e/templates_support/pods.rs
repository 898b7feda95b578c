//! The workload the day-2 tests run in the workload cluster, and what a watch of it sees: a
//! Deployment of pause Pods under a PodDisruptionBudget, its ready count at every event, the
//! Pods that left through the eviction API, when each Node lost its last Pod and when each
//! Kairon Machine was deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::*;

pub const NS: &str = "default";
pub const UP: Duration = Duration::from_secs(600);

/// A Deployment of `replicas` pause Pods labelled `app=<name>`, spread over the workers, that
/// leave a Node the workload cluster finds unreachable or NotReady after 10 s (not the
/// default 300 s).
pub fn deployment(name: &str, replicas: i32) -> Deployment {
    let toleration =
        |key: &str| json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10});
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
                    "terminationGracePeriodSeconds": 5,
                    "tolerations": [
                        toleration("node.kubernetes.io/unreachable"),
                        toleration("node.kubernetes.io/not-ready"),
                    ],
                    "topologySpreadConstraints": [{
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": {"app": name}},
                    }],
                },
            },
        },
    }))
    .expect("a Deployment")
}

pub fn pdb(name: &str, spec: serde_json::Value) -> PodDisruptionBudget {
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": name}});
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": NS}, "spec": spec})).expect("a PDB")
}

pub fn ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn node_of(p: &Pod) -> String {
    p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()
}

pub async fn pods(wc: &Client, app: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(wc.clone(), NS)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

pub async fn create_workload(wc: &Client, name: &str, replicas: i32, budget: serde_json::Value) {
    Api::<Deployment>::namespaced(wc.clone(), NS)
        .create(&PostParams::default(), &deployment(name, replicas))
        .await
        .unwrap_or_else(|e| panic!("creating Deployment {name}: {e}"));
    Api::<PodDisruptionBudget>::namespaced(wc.clone(), NS)
        .create(&PostParams::default(), &pdb(name, budget))
        .await
        .unwrap_or_else(|e| panic!("creating PodDisruptionBudget {name}: {e}"));
}

/// Waits until `workers` worker Nodes (no control-plane role) are Ready and carry no taint
/// that keeps new Pods off (KWOK may post a Node's first Ready status a moment after CAPI
/// sets the Machine's nodeRef): a workload created before then lands on the Nodes ready so
/// far, and a test of how it spreads or drains would start from the wrong place.
pub async fn wait_workers_schedulable(rig: &Rig, wc: &Client, workers: usize) {
    rig.wait_ok(&format!("{workers} worker Nodes Ready and untainted"), UP, || async {
        let nodes = Api::<Node>::all(wc.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let schedulable = nodes
            .iter()
            .filter(|n| !n.labels().contains_key("node-role.kubernetes.io/control-plane"))
            .filter(|n| {
                let spec = n.spec.as_ref();
                let ready = n
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                ready
                    && !spec.and_then(|s| s.unschedulable).unwrap_or(false)
                    && spec
                        .and_then(|s| s.taints.as_ref())
                        .is_none_or(|t| t.iter().all(|t| t.effect == "PreferNoSchedule"))
            })
            .count();
        match schedulable == workers {
            true => Ok(()),
            false => Err(format!("{schedulable} of {} Nodes schedulable workers", nodes.len())),
        }
    })
    .await;
}

pub async fn wait_running(rig: &Rig, wc: &Client, app: &str, replicas: usize, avoid: &BTreeSet<String>) {
    rig.wait_ok(
        &format!("{replicas} Pods of {app} Running and Ready, none on {avoid:?}"),
        UP,
        || async {
            let pods = pods(wc, app).await;
            let ready: Vec<&Pod> = pods.iter().filter(|p| ready(p)).collect();
            let on_avoided: Vec<String> = pods
                .iter()
                .filter(|p| avoid.contains(&node_of(p)))
                .map(|p| p.name_any())
                .collect();
            if ready.len() == replicas && pods.len() == replicas && on_avoided.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "{} of {} Pods ready; on avoided Nodes: {on_avoided:?}",
                    ready.len(),
                    pods.len()
                ))
            }
        },
    )
    .await;
}

pub async fn worker_machines(rig: &Rig) -> Vec<String> {
    rig.machine_list()
        .await
        .iter()
        .filter(|m| !is_control_plane(m))
        .map(name)
        .collect()
}

/// What a watch of the workload cluster saw while the MachineDeployment scaled down.
#[derive(Default)]
pub struct Seen {
    /// The least number of ready Pods of the Deployment at any event.
    pub min_ready: Option<usize>,
    /// Pods the PDB recorded as disrupted through the eviction API.
    pub evicted: BTreeSet<String>,
    /// Pods that went away, with the Node they were on.
    pub gone: BTreeMap<String, String>,
    /// When the last Pod of the Deployment left each Node.
    pub drained_at: BTreeMap<String, Instant>,
    /// When each Kairon Machine was marked for deletion.
    pub vm_deleted_at: BTreeMap<String, Instant>,
}

/// Watches the Deployment's Pods and PDB in the workload cluster and the Kairon Machines on
/// the management cluster, recording into `seen` until aborted.
pub fn watch(rig: &Rig, wc: &Client, app: &str, seen: Arc<Mutex<Seen>>) -> Vec<tokio::task::JoinHandle<()>> {
    let pods_api: Api<Pod> = Api::namespaced(wc.clone(), NS);
    let pdb_api: Api<PodDisruptionBudget> = Api::namespaced(wc.clone(), NS);
    let vms: Api<capkr::kairon::Machine> = Api::namespaced(rig.env.client(), &rig.ns);
    let selector = format!("app={app}");
    let s = seen.clone();
    let pods_task = tokio::spawn(async move {
        let mut live: BTreeMap<String, Pod> = BTreeMap::new();
        // Counted only once the watch has listed every Pod (and again after a relist).
        let mut listed = false;
        let mut stream = watcher::watcher(pods_api, watcher::Config::default().labels(&selector)).boxed();
        while let Some(Ok(event)) = stream.next().await {
            let now = Instant::now();
            match event {
                Event::Init => {
                    listed = false;
                    live.clear();
                }
                Event::InitDone => listed = true,
                Event::Apply(p) | Event::InitApply(p) => {
                    live.insert(p.name_any(), p);
                }
                Event::Delete(p) => {
                    let node = node_of(&p);
                    live.remove(&p.name_any());
                    let mut seen = s.lock().unwrap_or_else(|e| e.into_inner());
                    seen.gone.insert(p.name_any(), node.clone());
                    if !node.is_empty() && !live.values().any(|q| node_of(q) == node) {
                        seen.drained_at.insert(node, now);
                    }
                }
            }
            if !listed {
                continue;
            }
            let ready = live.values().filter(|p| ready(p)).count();
            let mut seen = s.lock().unwrap_or_else(|e| e.into_inner());
            seen.min_ready = Some(seen.min_ready.map_or(ready, |m| m.min(ready)));
        }
    });
    let s = seen.clone();
    let pdb_task = tokio::spawn(async move {
        let mut stream = watcher::watcher(pdb_api, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = stream.next().await {
            if let Event::Apply(b) | Event::InitApply(b) = event {
                let disrupted = b.status.and_then(|s| s.disrupted_pods).unwrap_or_default();
                s.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .evicted
                    .extend(disrupted.into_keys());
            }
        }
    });
    let s = seen;
    let vm_task = tokio::spawn(async move {
        let mut stream = watcher::watcher(vms, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = stream.next().await {
            if let Event::Apply(m) | Event::InitApply(m) | Event::Delete(m) = event
                && m.metadata.deletion_timestamp.is_some()
            {
                s.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .vm_deleted_at
                    .entry(m.name_any())
                    .or_insert_with(Instant::now);
            }
        }
    });
    vec![pods_task, pdb_task, vm_task]
}

pub async fn md_name(rig: &Rig) -> String {
    rig.list(&capi("MachineDeployment", "machinedeployments"))
        .await
        .first()
        .map(name)
        .expect("a MachineDeployment")
}
