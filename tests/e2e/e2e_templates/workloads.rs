//! Workloads on the default flavor: the simulated control plane runs kube-controller-manager
//! and kube-scheduler, KWOK plays the kubelets, so Pods are scheduled and run, and what a
//! workload owner cares about on day 2 is real: a scale-down drains each Node through the
//! eviction API within the PodDisruptionBudget, a drain a PDB blocks waits for the Machine's
//! `nodeDrainTimeout`, a VM Kairon halts and runs again comes back as the same Node, and a VM
//! that dies has its Pods evicted by the workload cluster's own node lifecycle controller
//! before the MachineHealthCheck replaces it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::templates_support::pods::*;
use crate::templates_support::*;

/// 1 control plane + 3 workers, 6 replicas under `maxUnavailable: 1`; the MachineDeployment
/// goes 3 → 1. Every Pod leaves through the eviction API, never more than one replica is
/// unavailable, each worker's VM is deleted only after its Node is drained, and all 6 run on
/// the last worker. Then a Pod no eviction may touch (`maxUnavailable: 0`) holds up the last
/// worker's deletion until the `nodeDrainTimeoutSeconds` its MachineDeployment gives it, and
/// no longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_down_drains_within_the_disruption_budget_and_a_blocked_drain_times_out() {
    let rig = Rig::start(RigOptions::guests("templates_drain")).await;
    rig.kubectl_apply(&rig.generate("", 1, 3));
    rig.wait_shape(1, 3, UP).await;
    let wc = rig.workload_client().await;
    wait_workers_schedulable(&rig, &wc, 3).await;

    create_workload(&wc, "web", 6, json!({"maxUnavailable": 1})).await;
    wait_running(&rig, &wc, "web", 6, &BTreeSet::new()).await;
    let spread: BTreeSet<String> = pods(&wc, "web").await.iter().map(node_of).collect();
    eprintln!("web runs on {spread:?}");

    let seen = Arc::new(Mutex::new(Seen::default()));
    let watchers = watch(&rig, &wc, "web", seen.clone());
    let before: BTreeSet<String> = worker_machines(&rig).await.into_iter().collect();
    let started = Instant::now();
    rig.patch_replicas(
        &capi("MachineDeployment", "machinedeployments"),
        &md_name(&rig).await,
        1,
    )
    .await;
    rig.wait_shape(1, 1, UP).await;
    let after: BTreeSet<String> = worker_machines(&rig).await.into_iter().collect();
    let removed: BTreeSet<String> = before.difference(&after).cloned().collect();
    wait_running(&rig, &wc, "web", 6, &removed).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for w in &watchers {
        w.abort();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    eprintln!(
        "3 -> 1 in {:.1}s: removed {removed:?}; least ready {:?}; evicted {:?}; gone {:?}",
        started.elapsed().as_secs_f64(),
        seen.min_ready,
        seen.evicted,
        seen.gone
    );
    assert_eq!(removed.len(), 2, "two workers went: {before:?} -> {after:?}");
    assert!(
        seen.min_ready.is_some_and(|r| r >= 5),
        "never more than one replica unavailable (least ready: {:?})",
        seen.min_ready
    );
    let left_removed: Vec<&String> = seen
        .gone
        .iter()
        .filter(|(_, node)| removed.contains(*node))
        .map(|(pod, _)| pod)
        .collect();
    assert!(
        !left_removed.is_empty(),
        "Pods left the removed workers: {:?}",
        seen.gone
    );
    for pod in &left_removed {
        assert!(
            seen.evicted.contains(*pod),
            "{pod} left through the eviction API (evicted: {:?})",
            seen.evicted
        );
    }
    for worker in &removed {
        let vm_deleted = seen
            .vm_deleted_at
            .get(worker)
            .unwrap_or_else(|| panic!("the Kairon Machine {worker} was seen deleted"));
        if let Some(drained) = seen.drained_at.get(worker) {
            assert!(
                drained <= vm_deleted,
                "{worker}'s Node was drained before its VM was deleted"
            );
        } else {
            assert!(
                !spread.contains(worker),
                "{worker} ran web Pods, so its drain was seen ({:?})",
                seen.drained_at
            );
        }
    }
    let on_last: BTreeSet<String> = pods(&wc, "web").await.iter().map(node_of).collect();
    assert_eq!(on_last, after, "all of web runs on the remaining worker");

    blocked_drain_waits_for_the_node_drain_timeout(&rig, &wc).await;
}

/// A Pod that no eviction may touch holds up its Node's drain; the Machine goes once its
/// `nodeDrainTimeoutSeconds` has passed, not before.
async fn blocked_drain_waits_for_the_node_drain_timeout(rig: &Rig, wc: &Client) {
    const DRAIN_TIMEOUT: u64 = 30;
    create_workload(wc, "pinned", 1, json!({"maxUnavailable": 0})).await;
    wait_running(rig, wc, "pinned", 1, &BTreeSet::new()).await;
    let worker = worker_machines(rig).await.pop().expect("the last worker");
    let machines = rig.api(&capi("Machine", "machines"));
    // Set where users set it: the MachineDeployment's template, which CAPI propagates to its
    // Machines in place (a patch of the Machine itself is overwritten by its MachineSet).
    let md = md_name(rig).await;
    rig.api(&capi("MachineDeployment", "machinedeployments"))
        .patch(
            &md,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"template": {"spec": {"deletion": {"nodeDrainTimeoutSeconds": DRAIN_TIMEOUT}}}}}),
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("setting nodeDrainTimeoutSeconds on {md}: {e}"));
    rig.wait_ok(&format!("{worker} takes the drain timeout in place"), UP, || async {
        let m = machines.get(&worker).await.map_err(|e| e.to_string())?;
        let got = m.data["spec"]["deletion"]["nodeDrainTimeoutSeconds"].as_u64();
        match got == Some(DRAIN_TIMEOUT) {
            true => Ok(()),
            false => Err(format!("spec.deletion: {}", m.data["spec"]["deletion"])),
        }
    })
    .await;
    let vms: Api<capkr::kairon::Machine> = Api::namespaced(rig.env.client(), &rig.ns);
    let started = Instant::now();
    machines
        .delete(&worker, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting Machine {worker}: {e}"));

    // While the drain is blocked the VM stays, and the Machine says why.
    let blocked_message = Arc::new(Mutex::new(String::new()));
    rig.wait_ok("the Machine reports its drain blocked by the PDB", UP, || async {
        let m = machines.get(&worker).await.map_err(|e| e.to_string())?;
        let message = condition(&m, "Deleting")
            .and_then(|c| c["message"].as_str())
            .unwrap_or_default()
            .to_string();
        if message.contains("pinned") && message.to_lowercase().contains("disruption budget") {
            *blocked_message.lock().unwrap_or_else(|e| e.into_inner()) = message;
            Ok(())
        } else {
            Err(format!("Deleting: {message:?}"))
        }
    })
    .await;
    rig.wait_ok("the worker's Kairon Machine is deleted", UP, || async {
        match vms.get_opt(&worker).await.map_err(|e| e.to_string())? {
            Some(vm) if vm.metadata.deletion_timestamp.is_none() => Err("still there".to_string()),
            _ => Ok(()),
        }
    })
    .await;
    let vm_deleted = started.elapsed();
    eprintln!(
        "blocked drain: VM deleted {:.1}s after the Machine (nodeDrainTimeoutSeconds {DRAIN_TIMEOUT}); it said {:?}",
        vm_deleted.as_secs_f64(),
        blocked_message.lock().unwrap_or_else(|e| e.into_inner())
    );
    assert!(
        vm_deleted >= Duration::from_secs(DRAIN_TIMEOUT),
        "the VM went only after the drain timeout ({vm_deleted:?})"
    );
    assert!(
        vm_deleted < Duration::from_secs(DRAIN_TIMEOUT + 90),
        "the VM went soon after the drain timeout, not at some later time ({vm_deleted:?})"
    );
}

fn node_ready(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

/// Waits for Node `name` to be Ready (`what`: why it should be, for the failure).
async fn wait_node_ready(rig: &Rig, nodes: &Api<Node>, name: &str, what: &str) {
    rig.wait_ok(&format!("{name} {what}: its Node Ready"), UP, || async {
        let node = nodes.get(name).await.map_err(|e| e.to_string())?;
        match node_ready(&node).as_str() {
            "True" => Ok(()),
            other => Err(format!("Ready={other}")),
        }
    })
    .await;
}

/// A worker's Kairon Machine halted and then Running again: its Node NotReady, then Ready, on
/// the same Machine and the same Kairon Machine.
async fn halt_and_run_again(rig: &Rig, wc: &Client) {
    let worker = worker_machines(rig).await.into_iter().next().expect("a worker");
    let vms: Api<capkr::kairon::Machine> = Api::namespaced(rig.env.client(), &rig.ns);
    let uid = vms.get(&worker).await.expect("the worker's Kairon Machine").uid();
    let power = |state: &'static str| {
        let (vms, worker) = (vms.clone(), worker.clone());
        async move {
            vms.patch(
                &worker,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"powerState": state}})),
            )
            .await
            .unwrap_or_else(|e| panic!("powerState {state} on {worker}: {e}"));
        }
    };
    let nodes: Api<Node> = Api::all(wc.clone());
    let started = Instant::now();
    power("Halted").await;
    rig.wait_ok(&format!("halted {worker}: its Node no longer Ready"), UP, || async {
        let node = nodes.get(&worker).await.map_err(|e| e.to_string())?;
        match node_ready(&node).as_str() {
            "True" => Err("Ready=True".to_string()),
            _ => Ok(()),
        }
    })
    .await;
    let not_ready = started.elapsed();
    power("Running").await;
    wait_node_ready(rig, &nodes, &worker, "running again").await;
    eprintln!(
        "halted {worker}: Node not Ready after {:.1}s, Ready again {:.1}s after",
        not_ready.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(worker_machines(rig).await.contains(&worker), "the same Machine");
    assert_eq!(vms.get(&worker).await.unwrap().uid(), uid, "the same Kairon Machine");
}

/// A worker's kubelet whose beats lapsed (a slow API server, say): the node lifecycle
/// controller marks its Node's Ready Unknown, as written here; the kubelet, still running,
/// posts its status on its next sync and the Node is Ready again.
async fn beats_lapse_and_resume(rig: &Rig, wc: &Client) {
    let worker = worker_machines(rig).await.into_iter().next().expect("a worker");
    let nodes: Api<Node> = Api::all(wc.clone());
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let unknown = json!({"status": {"conditions": [{
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastTransitionTime": now,
    }]}});
    nodes
        .patch_status(&worker, &PatchParams::default(), &Patch::Strategic(&unknown))
        .await
        .unwrap_or_else(|e| panic!("marking Node {worker} Ready Unknown: {e}"));
    let started = Instant::now();
    wait_node_ready(rig, &nodes, &worker, "its kubelet posting again").await;
    eprintln!(
        "{worker} marked Ready Unknown: Ready again {:.1}s after",
        started.elapsed().as_secs_f64()
    );
}

/// 1 control plane + 2 workers. First Kairon halts a worker's VM (`spec.powerState: Halted`, as
/// its preemption does) and runs it again: the Node goes NotReady and comes back Ready, the
/// same Machine. A worker's Node marked Ready Unknown while its kubelet runs is Ready again.
/// Then a worker's runtime fails (the simulator's `fail` annotation; Kairon's
/// phase Unknown): its kubelet stops, the workload cluster's node lifecycle controller marks
/// its Node Ready Unknown and evicts its Pods, which run again on the other worker; then the
/// MachineHealthCheck replaces the Machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_worker_vm_has_its_pods_evicted_and_is_replaced() {
    let rig = Rig::start(RigOptions::guests("templates_failed_vm")).await;
    rig.kubectl_apply(&rig.generate("", 1, 2));
    rig.wait_shape(1, 2, UP).await;
    let wc = rig.workload_client().await;
    wait_workers_schedulable(&rig, &wc, 2).await;
    create_workload(&wc, "web", 4, json!({"maxUnavailable": 1})).await;
    wait_running(&rig, &wc, "web", 4, &BTreeSet::new()).await;
    halt_and_run_again(&rig, &wc).await;
    beats_lapse_and_resume(&rig, &wc).await;
    wait_running(&rig, &wc, "web", 4, &BTreeSet::new()).await;

    // The MHC stays paused until the workload cluster has acted on its own.
    let mhcs = capi("MachineHealthCheck", "machinehealthchecks");
    let mhc_name = format!("{}-md-0", rig.cluster);
    let mut mhc = kube::api::DynamicObject::new(&mhc_name, &mhcs).within(&rig.ns);
    mhc.metadata.annotations = Some([("cluster.x-k8s.io/paused".to_string(), String::new())].into());
    mhc.data = json!({"spec": {
        "clusterName": rig.cluster,
        "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": md_name(&rig).await}},
        "checks": {"unhealthyNodeConditions": [
            {"type": "Ready", "status": "Unknown", "timeoutSeconds": 30},
            {"type": "Ready", "status": "False", "timeoutSeconds": 30},
        ]},
    }});
    rig.api(&mhcs)
        .create(&PostParams::default(), &mhc)
        .await
        .expect("creating the workers' MachineHealthCheck");

    let web = pods(&wc, "web").await;
    let victim = node_of(&web[0]);
    let victim_pods: BTreeSet<String> = web
        .iter()
        .filter(|p| node_of(p) == victim)
        .map(|p| p.name_any())
        .collect();
    let before: BTreeSet<String> = worker_machines(&rig).await.into_iter().collect();
    let vms: Api<capkr::kairon::Machine> = Api::namespaced(rig.env.client(), &rig.ns);
    vms.patch(
        &victim,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"sim.kairon.zyvor.dev/fail": "HostLost"}}})),
    )
    .await
    .unwrap_or_else(|e| panic!("failing Kairon Machine {victim}: {e}"));
    let started = Instant::now();

    let nodes: Api<Node> = Api::all(wc.clone());
    let not_ready = rig
        .wait_ok(&format!("Node {victim} no longer Ready"), UP, || async {
            let node = nodes.get(&victim).await.map_err(|e| e.to_string())?;
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.status)
                .unwrap_or_default();
            if ready == "True" {
                Err(format!("Ready={ready}"))
            } else {
                Ok(())
            }
        })
        .await;
    let avoid: BTreeSet<String> = [victim.clone()].into();
    // The Pods on the dead Node stay Terminating (no kubelet confirms); their replacements run.
    rig.wait_ok("web's replacements Running on the other worker", UP, || async {
        let pods = pods(&wc, "web").await;
        let running_elsewhere = pods.iter().filter(|p| ready(p) && node_of(p) != victim).count();
        let victims_evicted = pods
            .iter()
            .filter(|p| victim_pods.contains(&p.name_any()))
            .all(|p| p.metadata.deletion_timestamp.is_some());
        if running_elsewhere == 4 && victims_evicted {
            Ok(())
        } else {
            Err(format!(
                "{running_elsewhere} ready elsewhere; the victim's Pods evicted: {victims_evicted}"
            ))
        }
    })
    .await;
    let evicted = started.elapsed();

    rig.api(&mhcs)
        .patch(
            &mhc_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": null}}})),
        )
        .await
        .expect("unpausing the MachineHealthCheck");
    rig.wait_ok(&format!("the MachineHealthCheck remediates {victim}"), UP, || async {
        match worker_machines(&rig).await.contains(&victim) {
            true => Err("still there".to_string()),
            false => Ok(()),
        }
    })
    .await;
    rig.wait_shape(1, 2, UP).await;
    let after: BTreeSet<String> = worker_machines(&rig).await.into_iter().collect();
    wait_running(&rig, &wc, "web", 4, &avoid).await;
    eprintln!(
        "failed VM {victim}: Node not Ready after {:.1}s, Pods running elsewhere after {:.1}s, replaced after {:.1}s ({before:?} -> {after:?})",
        not_ready.as_secs_f64(),
        evicted.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(!after.contains(&victim), "the failed worker's Machine was replaced");
    assert_eq!(after.len(), 2);
    assert!(
        nodes.get_opt(&victim).await.expect("reading Nodes").is_none(),
        "its Node is gone with it"
    );
}
