//! Kairon's hosts as the maintenance tests use them: the simulator with Nodes of the rig's own
//! (names unique to the test's namespace; Kairon's hosts are its cluster's Nodes), cordons,
//! live migrations, MachineHealthChecks over the control plane and the workers, and a watch
//! that records, for every Kairon Machine deleted, how many evictable Pods its Node still had
//! at that moment.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::templates_support::*;

pub fn kairon(kind: &str, plural: &str) -> ApiResource {
    gvk("kairon.zyvor.dev", "v1alpha1", kind, plural)
}

pub fn migrations_resource() -> ApiResource {
    kairon("MachineMigration", "machinemigrations")
}

/// The rig's four hosts, `<ns>-h1..4` (Host objects are cluster-scoped and the rigs share one
/// API server), and the simulator flags that make them.
pub fn rig_hosts(ns: &str) -> (Vec<String>, Vec<String>) {
    let hosts: Vec<String> = (1..=4).map(|i| format!("{ns}-h{i}")).collect();
    let args = vec!["--host-objects".to_string(), "--hosts".to_string(), hosts.join(",")];
    (hosts, args)
}

/// Host of each Kairon Machine (by name) as Kairon reports it.
pub async fn vm_hosts(rig: &Rig) -> BTreeMap<String, String> {
    rig.list(&kairon("Machine", "machines"))
        .await
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .map(|m| (name(m), m.data["status"]["nodeName"].as_str().unwrap_or("").to_string()))
        .collect()
}

/// A live MachineMigration of `vm` (to `target`, or where Kairon chooses), waited for until it
/// succeeded; returns the node the VM is on afterwards.
pub async fn migrate(rig: &Rig, vm: &str, target: Option<&str>) -> String {
    let migrations = migrations_resource();
    let api = rig.api(&migrations);
    let mig_name = format!("move-{vm}-{}", rig_suffix());
    let mut mig = DynamicObject::new(&mig_name, &migrations).within(&rig.ns);
    mig.data = json!({"spec": {"machineName": vm, "strategy": "live"}});
    if let Some(t) = target {
        mig.data["spec"]["targetNode"] = json!(t);
    }
    api.create(&PostParams::default(), &mig)
        .await
        .unwrap_or_else(|e| panic!("creating MachineMigration {mig_name}: {e}"));
    let done = Arc::new(Mutex::new(String::new()));
    rig.wait_ok(
        &format!("MachineMigration {mig_name} succeeded"),
        Duration::from_secs(120),
        || async {
            let m = api.get(&mig_name).await.map_err(|e| e.to_string())?;
            let status = &m.data["status"];
            match status["phase"].as_str() {
                Some("Succeeded") => {
                    *done.lock().unwrap_or_else(|e| e.into_inner()) =
                        status["targetNode"].as_str().unwrap_or("").to_string();
                    Ok(())
                }
                Some(p @ ("Failed" | "Blocked")) => panic!("MachineMigration {mig_name} {p}: {status}"),
                _ => Err(format!("status {status}")),
            }
        },
    )
    .await;
    let host = done.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(!host.is_empty(), "a succeeded migration names its target");
    host
}

fn rig_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// MachineHealthChecks over the control plane and over the MachineDeployment's Machines (a Node
/// Ready Unknown or False for 60 s), waited for until they see all `total` Machines healthy.
pub async fn create_health_checks(rig: &Rig, md: &str, total: u64) {
    let mhcs = capi("MachineHealthCheck", "machinehealthchecks");
    let checks = json!({
        "nodeStartupTimeoutSeconds": 600,
        "unhealthyNodeConditions": [
            {"type": "Ready", "status": "Unknown", "timeoutSeconds": 60},
            {"type": "Ready", "status": "False", "timeoutSeconds": 60},
        ],
    });
    let selectors = [
        ("control-plane", json!({"cluster.x-k8s.io/control-plane": ""})),
        ("workers", json!({"cluster.x-k8s.io/deployment-name": md})),
    ];
    for (suffix, labels) in selectors {
        let mhc_name = format!("{}-{suffix}", rig.cluster);
        let mut mhc = DynamicObject::new(&mhc_name, &mhcs).within(&rig.ns);
        mhc.data = json!({"spec": {
            "clusterName": rig.cluster,
            "selector": {"matchLabels": labels},
            "checks": checks,
        }});
        rig.api(&mhcs)
            .create(&PostParams::default(), &mhc)
            .await
            .unwrap_or_else(|e| panic!("creating MachineHealthCheck {mhc_name}: {e}"));
    }
    rig.wait_ok(
        "the MachineHealthChecks see every Machine healthy",
        Duration::from_secs(120),
        || async {
            let mut healthy = 0;
            for mhc in rig.list(&mhcs).await {
                healthy += mhc.data["status"]["currentHealthy"].as_u64().unwrap_or(0);
            }
            if healthy == total {
                Ok(())
            } else {
                Err(format!("{healthy} of {total} healthy"))
            }
        },
    )
    .await;
}

pub async fn merge_patch(rig: &Rig, r: &ApiResource, name: &str, patch: Value) {
    rig.api(r)
        .patch(name, &PatchParams::default(), &Patch::Merge(patch.clone()))
        .await
        .unwrap_or_else(|e| panic!("patching {} {name} with {patch}: {e}", r.kind));
}

/// Cordons (or uncordons) Kairon's Node `node`, as `kubectl cordon` does.
pub async fn cordon(rig: &Rig, node: &str, on: bool) {
    Api::<k8s_openapi::api::core::v1::Node>::all(rig.env.client())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": on}})),
        )
        .await
        .unwrap_or_else(|e| panic!("cordoning Node {node}: {e}"));
}

/// `lastTransitionTime` of the `Ready` condition of each object, by name.
pub fn ready_since(objs: &[DynamicObject]) -> BTreeMap<String, String> {
    objs.iter()
        .map(|o| {
            let since = condition(o, "Ready")
                .map(|c| format!("{} since {}", c["status"], c["lastTransitionTime"]))
                .unwrap_or_default();
            (name(o), since)
        })
        .collect()
}

/// The reasons of Events on `object` in the rig's namespace.
pub async fn event_reasons(rig: &Rig, object: &str) -> Vec<(String, String)> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(rig.env.client(), &rig.ns);
    events
        .list(&kube::api::ListParams::default().fields(&format!("involvedObject.name={object}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

/// A Pod a drain evicts: not a mirror Pod, not a DaemonSet's, not finished.
fn evictable(p: &Pod) -> bool {
    let mirror = p.annotations().contains_key("kubernetes.io/config.mirror");
    let daemon = p.owner_references().iter().any(|o| o.kind == "DaemonSet");
    let finished = matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    !mirror && !daemon && !finished
}

/// What the drain watch saw.
#[derive(Default, Debug)]
pub struct Drains {
    /// For each Kairon Machine seen deleted: when, and the evictable Pods its Node still had.
    pub at_vm_deletion: BTreeMap<String, (Instant, Vec<String>)>,
    /// Nodes that had evictable Pods at some point of the watch.
    pub had_pods: BTreeSet<String>,
}

enum Seen {
    Pod(Box<Event<Pod>>),
    Vm(Box<Event<DynamicObject>>),
}

/// Watches every Pod of the workload cluster and the rig's Kairon Machines; when a Kairon
/// Machine's deletion is first seen, records the evictable Pods then bound to its Node (the
/// Node is named after the VM).
pub fn watch_drains(rig: &Rig, wc: &Client, drains: Arc<Mutex<Drains>>) -> tokio::task::JoinHandle<()> {
    let pods: Api<Pod> = Api::all(wc.clone());
    let vms: Api<DynamicObject> = rig.api(&kairon("Machine", "machines"));
    tokio::spawn(async move {
        let pod_events = watcher::watcher(pods, watcher::Config::default()).map(|e| e.map(|e| Seen::Pod(Box::new(e))));
        let vm_events = watcher::watcher(vms, watcher::Config::default()).map(|e| e.map(|e| Seen::Vm(Box::new(e))));
        let mut events = futures::stream::select(pod_events.boxed(), vm_events.boxed());
        let mut live: BTreeMap<String, Pod> = BTreeMap::new();
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            match event {
                Seen::Pod(e) => match *e {
                    Event::Init => live.clear(),
                    Event::Apply(p) | Event::InitApply(p) => {
                        let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
                        if evictable(&p)
                            && let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone())
                        {
                            drains.lock().unwrap_or_else(|e| e.into_inner()).had_pods.insert(node);
                        }
                        live.insert(key, p);
                    }
                    Event::Delete(p) => {
                        live.remove(&format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()));
                    }
                    Event::InitDone => {}
                },
                Seen::Vm(e) => {
                    let (Event::Apply(m) | Event::InitApply(m) | Event::Delete(m)) = *e else {
                        continue;
                    };
                    if m.metadata.deletion_timestamp.is_none() {
                        continue;
                    }
                    let vm = m.name_any();
                    let mut d = drains.lock().unwrap_or_else(|e| e.into_inner());
                    if d.at_vm_deletion.contains_key(&vm) {
                        continue;
                    }
                    let left: Vec<String> = live
                        .iter()
                        .filter(|(_, p)| {
                            evictable(p) && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&vm)
                        })
                        .map(|(k, _)| k.clone())
                        .collect();
                    d.at_vm_deletion.insert(vm, (Instant::now(), left));
                }
            }
        }
    })
}
