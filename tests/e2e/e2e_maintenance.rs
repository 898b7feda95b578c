//! Kairon host maintenance with Pods running in the workload cluster (3 control planes + 2
//! workers of the default flavor, a Deployment of 6 under a PodDisruptionBudget,
//! MachineHealthChecks over every Machine):
//! - live migrations (an operator's MachineMigrations, as Kairon runs them) of every VM, one
//!   after another, then of every VM of a cordoned node at once, are followed (the node in
//!   each KaironMachine's status, an `InstanceMigrated` event) and change nothing else: no
//!   Machine replaced, no `Ready` flip, no remediation, no Pod disturbed;
//! - a node with a control-plane VM and both workers on it, cordoned while the Cluster is
//!   paused, and `kaironctl evacuate` (the simulator's): Kairon skips every VM (the provider's
//!   budgets allow no cold migration) and nothing happens until the Cluster is unpaused and
//!   the KaironMachines say they wait; then CAPI replaces each Machine, one at a time, each VM
//!   deleted only once its Node has no evictable Pod left, the Deployment never below its
//!   budget, etcd keeping quorum, the Cluster Available throughout, no VM migrated, and
//!   `evacuate --wait` ends with the node empty.

mod hosts;
use crate::templates_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::{Client, ResourceExt};
use serde_json::json;

use hosts::*;
use templates_support::control_plane_watch::{Watch, look};
use templates_support::pods::*;
use templates_support::*;

/// Up, with a workload under its budget and MachineHealthChecks on every Machine.
async fn cluster_with_workload(rig: &Rig, vars: &[(&str, &str)]) -> (Client, String) {
    rig.kubectl_apply(&rig.generate_with("", 3, 2, vars));
    let md = md_name(rig).await;
    // One worker may be unavailable while it is replaced (the MachineDeployment's default, 0,
    // turns WorkersAvailable, and the Cluster's Available, False during any replacement).
    merge_patch(
        rig,
        &capi("MachineDeployment", "machinedeployments"),
        &md,
        json!({"spec": {"rollout": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}}}}}),
    )
    .await;
    rig.wait_shape(3, 2, UP).await;
    let wc = rig.workload_client().await;
    create_workload(&wc, "web", 6, json!({"maxUnavailable": 1})).await;
    wait_running(rig, &wc, "web", 6, &BTreeSet::new()).await;
    create_health_checks(rig, &md, 5).await;
    (wc, md)
}

/// Machines whose MachineHealthCheck found them unhealthy, or that carry the remediation
/// request.
fn unhealthy(machines: &[kube::api::DynamicObject]) -> Vec<String> {
    machines
        .iter()
        .filter(|m| {
            condition(m, "HealthCheckSucceeded").is_some_and(|c| c["status"] == "False")
                || m.annotations().contains_key("cluster.x-k8s.io/remediate-machine")
        })
        .map(name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_migrations_are_followed_without_replacement() {
    let (_, sim_args) = rig_hosts("templates-migrate");
    let rig = Rig::start(RigOptions {
        sim_args,
        ..RigOptions::guests("templates_migrate")
    })
    .await;
    let (wc, _) = cluster_with_workload(&rig, &[]).await;

    let machines_before: BTreeSet<String> = rig.machine_list().await.iter().map(name).collect();
    let machines_ready = ready_since(&rig.machine_list().await);
    let kms_ready = ready_since(&rig.list(&kaironmachines()).await);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watchers = watch(&rig, &wc, "web", seen.clone());
    let started = Instant::now();
    let mut moves = BTreeMap::new();
    let remediations = Mutex::new(BTreeSet::new());
    let hosts_before = vm_hosts(&rig).await;
    for (vm, from) in &hosts_before {
        let to = migrate(&rig, vm, None).await;
        assert_ne!(&to, from, "{vm} moved");
        rig.wait_ok(
            &format!("KaironMachine {vm} reports host {to} and an InstanceMigrated event"),
            Duration::from_secs(60),
            || async {
                let km = rig.api(&kaironmachines()).get(vm).await.map_err(|e| e.to_string())?;
                let host = km.data["status"]["instance"]["host"].as_str().unwrap_or("");
                let events = event_reasons(&rig, vm).await;
                let sick = unhealthy(&rig.machine_list().await);
                remediations.lock().unwrap_or_else(|e| e.into_inner()).extend(sick);
                if host == to && events.iter().any(|(r, m)| r == "InstanceMigrated" && m.contains(&to)) {
                    Ok(())
                } else {
                    Err(format!("host {host:?}, events {events:?}"))
                }
            },
        )
        .await;
        moves.insert(vm.clone(), (from.clone(), to));
    }
    // An operator's evacuation by live migrations: the busiest node cordoned, every VM on it
    // migrated live at once.
    let placed = vm_hosts(&rig).await;
    let mut per_node: BTreeMap<&String, Vec<&String>> = BTreeMap::new();
    for (vm, node) in &placed {
        per_node.entry(node).or_default().push(vm);
    }
    let (busiest, on_it) = per_node
        .iter()
        .max_by_key(|(_, vms)| vms.len())
        .map(|(n, vms)| ((*n).clone(), vms.iter().map(|v| (*v).clone()).collect::<Vec<String>>()))
        .expect("placed VMs");
    cordon(&rig, &busiest, true).await;
    let requested = Instant::now();
    let migrations: Vec<_> = on_it.iter().map(|vm| migrate(&rig, vm, None)).collect();
    let landed = futures::future::join_all(migrations).await;
    let live_empty = requested.elapsed();
    assert!(
        landed.iter().all(|to| *to != busiest),
        "nothing went to the cordoned node: {landed:?}"
    );
    let after_evacuation = vm_hosts(&rig).await;
    assert!(
        after_evacuation.values().all(|n| *n != busiest),
        "{busiest} empty: {after_evacuation:?}"
    );
    cordon(&rig, &busiest, false).await;
    rig.wait_ok(
        "every KaironMachine reports the node its VM was evacuated to",
        Duration::from_secs(60),
        || async {
            let kms = rig.list(&kaironmachines()).await;
            let reported: BTreeMap<String, String> = kms
                .iter()
                .map(|k| {
                    (
                        name(k),
                        k.data["status"]["instance"]["host"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
            if reported == after_evacuation {
                Ok(())
            } else {
                Err(format!("reported {reported:?}"))
            }
        },
    )
    .await;
    eprintln!(
        "live evacuation of {busiest} ({} VM(s)): requested -> node empty {:.1}s",
        on_it.len(),
        live_empty.as_secs_f64()
    );
    // Long enough for a Node whose kubelet had gone quiet to be marked NotReady (40 s lease).
    tokio::time::sleep(Duration::from_secs(45)).await;
    let mut remediations = remediations.into_inner().unwrap_or_else(|e| e.into_inner());
    remediations.extend(unhealthy(&rig.machine_list().await));
    for w in &watchers {
        w.abort();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    eprintln!(
        "{} live migrations in {:.1}s: {moves:?}; least ready web Pods {:?}",
        moves.len(),
        started.elapsed().as_secs_f64(),
        seen.min_ready
    );
    assert_eq!(moves.len(), 5, "every VM moved once");

    let machines_after: BTreeSet<String> = rig.machine_list().await.iter().map(name).collect();
    assert_eq!(machines_after, machines_before, "no Machine replaced");
    assert_eq!(
        ready_since(&rig.machine_list().await),
        machines_ready,
        "no Machine's Ready moved"
    );
    assert_eq!(
        ready_since(&rig.list(&kaironmachines()).await),
        kms_ready,
        "no KaironMachine's Ready moved"
    );
    assert!(remediations.is_empty(), "no Machine found unhealthy: {remediations:?}");
    assert_eq!(seen.min_ready, Some(6), "no Pod of web disturbed");
    assert!(seen.gone.is_empty(), "no Pod of web went: {:?}", seen.gone);
    let hosts_after = vm_hosts(&rig).await;
    assert_eq!(hosts_after, after_evacuation, "every VM is still where it moved last");
}

/// Machines of the cluster being deleted, and whether the Cluster is Available.
async fn cluster_sample(rig: &Rig) -> Result<(), String> {
    let machines = rig.machine_list().await;
    let deleting: Vec<String> = machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_some())
        .map(name)
        .collect();
    if deleting.len() > 1 {
        return Err(format!("{} Machines deleting at once: {deleting:?}", deleting.len()));
    }
    let cluster = rig
        .api(&capi("Cluster", "clusters"))
        .get(&rig.cluster)
        .await
        .map_err(|e| format!("Cluster: {e}"))?;
    if !is_true(&cluster, "Available") {
        return Err(format!(
            "Cluster not Available: {:?} (deleting {deleting:?})",
            condition(&cluster, "Available")
        ));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cordoned_node_waits_while_paused_then_its_machines_are_replaced_one_at_a_time() {
    let (hosts, sim_args) = rig_hosts("templates-maintenance");
    let rig = Rig::start(RigOptions {
        sim_args,
        ..RigOptions::guests("templates_maintenance")
    })
    .await;
    let (wc, _) = cluster_with_workload(&rig, &[]).await;
    let etcd = EtcdProbe::new(&rig);

    // One control plane and both workers on the host to be maintained, nothing else.
    let target = hosts[0].clone();
    let cps: Vec<String> = rig.control_plane_machines().await.iter().map(name).collect();
    let workers: Vec<String> = rig
        .machine_list()
        .await
        .iter()
        .filter(|m| !is_control_plane(m))
        .map(name)
        .collect();
    let victims: BTreeSet<String> = workers.iter().chain(cps.first()).cloned().collect();
    for (vm, host) in vm_hosts(&rig).await {
        if victims.contains(&vm) && host != target {
            migrate(&rig, &vm, Some(&target)).await;
        } else if !victims.contains(&vm) && host == target {
            migrate(&rig, &vm, Some(&hosts[1])).await;
        }
    }
    let placed = vm_hosts(&rig).await;
    let on_target: BTreeSet<String> = placed
        .iter()
        .filter(|(_, h)| **h == target)
        .map(|(v, _)| v.clone())
        .collect();
    assert_eq!(
        on_target, victims,
        "one control plane and both workers on {target}: {placed:?}"
    );

    // Paused: the node is cordoned and Kairon's evacuation run, which skips every VM (the
    // budgets allow no cold migration); the KaironMachines say they wait, nothing is replaced.
    merge_patch(
        &rig,
        &capi("Cluster", "clusters"),
        &rig.cluster,
        json!({"spec": {"paused": true}}),
    )
    .await;
    rig.wait_ok(
        "the KaironMachines report the pause",
        Duration::from_secs(60),
        || async {
            let kms = rig.list(&kaironmachines()).await;
            let not_paused: Vec<String> = kms.iter().filter(|k| !is_true(k, "Paused")).map(name).collect();
            if not_paused.is_empty() {
                Ok(())
            } else {
                Err(format!("not Paused: {not_paused:?}"))
            }
        },
    )
    .await;
    let requested = Instant::now();
    cordon(&rig, &target, true).await;
    let said = rig
        .env
        .kairon_evacuate(&target, &[])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ns = &rig.ns;
    for (vm, budget) in victims.iter().map(|v| {
        let b = if cps.contains(v) {
            format!("cp-{}", rig.cluster)
        } else {
            format!("workers-{}", rig.cluster)
        };
        (v, b)
    }) {
        let held =
            format!("machine {ns}/{vm}: skipped: MachineDisruptionBudget {ns}/{budget} has 0 disruptions allowed");
        assert!(said.contains(&held), "evacuate skipped {vm}: {said}");
    }
    let waiting = |reason: &'static str| {
        let rig = &rig;
        let victims = &victims;
        async move {
            let kms = rig.list(&kaironmachines()).await;
            let reasons: BTreeMap<String, String> = kms
                .iter()
                .filter(|k| victims.contains(&name(k)))
                .map(|k| {
                    (
                        name(k),
                        condition(k, "Evacuation")
                            .map(|c| c["reason"].to_string())
                            .unwrap_or_default(),
                    )
                })
                .collect();
            if reasons.len() == victims.len() && reasons.values().all(|r| r.trim_matches('"') == reason) {
                Ok(())
            } else {
                Err(format!("Evacuation reasons {reasons:?}"))
            }
        }
    };
    rig.wait_ok(
        "the evacuated KaironMachines wait for the unpause",
        Duration::from_secs(60),
        || waiting("WaitingForUnpause"),
    )
    .await;
    let paused_until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < paused_until {
        let machines = rig.machine_list().await;
        let touched: Vec<String> = machines
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_some() || !unhealthy(std::slice::from_ref(*m)).is_empty())
            .map(name)
            .collect();
        assert!(touched.is_empty(), "nothing is replaced while paused: {touched:?}");
        assert_eq!(machines.len(), 5, "no Machine added while paused");
        waiting("WaitingForUnpause").await.expect("still waiting while paused");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    // Unpaused: each replaced in turn, drained first, while `evacuate --wait` waits.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watchers = watch(&rig, &wc, "web", seen.clone());
    let drains = Arc::new(Mutex::new(Drains::default()));
    let drain_watch = watch_drains(&rig, &wc, drains.clone());
    let watch_cp = Mutex::new(Watch::new());
    let cluster_violations = Mutex::new(Vec::<String>::new());
    let unpaused = Instant::now();
    merge_patch(
        &rig,
        &capi("Cluster", "clusters"),
        &rig.cluster,
        json!({"spec": {"paused": false}}),
    )
    .await;
    let evacuate = rig
        .env
        .kairon_evacuate(&target, &["--wait", "--interval", "5s", "--timeout", "14m"]);
    let quorum = |healthy: usize, members: usize| 2 * healthy > members;
    let node_empty = Mutex::new(None::<Duration>);
    let what = format!("{target} emptied and the cluster back to 3 + 2");
    let replaced = rig.wait_ok(&what, Duration::from_secs(900), || async {
        let sample = look(&rig, &etcd, 4, &quorum).await;
        watch_cp.lock().unwrap_or_else(|e| e.into_inner()).record(sample);
        if let Err(why) = cluster_sample(&rig).await {
            cluster_violations.lock().unwrap_or_else(|e| e.into_inner()).push(why);
        }
        let on_target: Vec<String> = vm_hosts(&rig)
            .await
            .into_iter()
            .filter(|(_, h)| *h == target)
            .map(|(v, _)| v)
            .collect();
        if !on_target.is_empty() {
            return Err(format!("{target} still runs {on_target:?}"));
        }
        node_empty
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(|| requested.elapsed());
        let machines = rig.machine_list().await;
        cluster_ready(&machines, rig.kcp().await.as_ref(), 3, 2)?;
        Ok(())
    });
    let (said, _) = tokio::join!(evacuate, replaced);
    let emptied = node_empty
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .expect("the node was seen empty");
    let said = said.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        said.contains(&format!("node {target} is empty")),
        "evacuate --wait said: {said}"
    );
    let made = rig.list(&migrations_resource()).await;
    let cold: Vec<String> = made
        .iter()
        .filter(|m| m.data["spec"]["strategy"] != "live")
        .map(name)
        .collect();
    assert!(cold.is_empty(), "no VM cold-migrated: {cold:?}");
    rig.wait_shape(3, 2, UP).await;
    wait_running(&rig, &wc, "web", 6, &victims).await;
    for w in watchers.iter().chain([&drain_watch]) {
        w.abort();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    let drains = std::mem::take(&mut *drains.lock().unwrap_or_else(|e| e.into_inner()));
    let w = watch_cp.into_inner().unwrap_or_else(|e| e.into_inner());
    let cluster_violations = cluster_violations.into_inner().unwrap_or_else(|e| e.into_inner());
    eprintln!(
        "cordon and evacuate of {target}: requested -> node empty {:.1}s ({:.1}s after the unpause); control plane: {}; \
         least ready web Pods {:?}; evicted {:?}; VM deletions {:?}; cluster samples not available/one-at-a-time: {cluster_violations:?}",
        emptied.as_secs_f64(),
        unpaused.elapsed().as_secs_f64(),
        w.summary(),
        seen.min_ready,
        seen.evicted,
        drains.at_vm_deletion,
    );

    let after: BTreeSet<String> = rig.machine_list().await.iter().map(name).collect();
    assert!(
        after.is_disjoint(&victims),
        "every evacuated Machine replaced: {after:?}"
    );
    assert!(
        w.violations.is_empty(),
        "etcd quorum and one control-plane Machine at a time: {:#?}",
        w.violations
    );
    assert!(
        cluster_violations.is_empty(),
        "the Cluster Available, one Machine deleted at a time: {cluster_violations:#?}"
    );
    assert!(
        seen.min_ready.is_some_and(|r| r >= 5),
        "web never below its budget (least ready {:?})",
        seen.min_ready
    );
    for vm in &victims {
        let (_, left) = drains
            .at_vm_deletion
            .get(vm)
            .unwrap_or_else(|| panic!("{vm}'s Kairon Machine was seen deleted: {drains:?}"));
        assert!(
            left.is_empty(),
            "{vm}'s Node was drained before its VM was deleted; left: {left:?}"
        );
    }
    let drained_with_pods: Vec<&String> = victims.iter().filter(|v| drains.had_pods.contains(*v)).collect();
    assert!(
        !drained_with_pods.is_empty(),
        "the drains had Pods to move: {:?}",
        drains.had_pods
    );
}
