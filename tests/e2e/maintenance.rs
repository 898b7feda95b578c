//! Kairon host maintenance against the real control plane. Kairon's hosts are the Nodes of
//! its cluster (`kairon-sim --host-objects` keeps one per host); every test names its own.
//!
//! - A live migration (an operator's MachineMigration, which the simulator plays as Kairon)
//!   moves a worker's VM to a node outside its Machine's failure domain and back. The
//!   KaironMachine follows the node, says `InstanceInFailureDomain=False` (then True again,
//!   from the Nodes' labels), publishes one `InstanceMigrated` event per move and a Warning
//!   when the VM leaves its failure domain; Ready never flips and nothing is replaced.
//! - A cordoned node with a control-plane VM and no MachineHealthCheck, and another VM of no
//!   cluster beside it, with Kairon's cordon evacuation on: Kairon cold-migrates the other VM
//!   off the node and skips the control plane (its budget allows no disruption), and so does
//!   `kaironctl evacuate` (the simulator's), and so does Kairon's admission webhook refuse an
//!   operator's live migration of it; the evacuation is blocked (`NoMachineHealthCheck`,
//!   a Warning), the Machine is never deleted by the provider; uncordoned, it is over.
//! - A cordoned node with a worker: `evacuate --wait` skips it (its MachineDeployment's
//!   budget) while the provider has CAPI replace its Machine; the node ends empty, no VM was
//!   migrated, and `evacuate --wait` ends.
//! - A cordoned node with members of a MachinePool: the same, the pool making the
//!   replacements on other nodes.
//! - A cordoned node with a worker whose MachineHealthCheck was deleted before (its condition
//!   left on the Machine): the provider deletes the Machine rather than mark it for a check
//!   that is gone, and the node empties.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::common::{Rig, RigOptions};
use capkr::api::KaironMachine;
use capkr::api::conditions::{self, EVACUATION, INSTANCE_IN_FAILURE_DOMAIN, READY, reason};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);
const MOVED: Duration = Duration::from_secs(60);

/// The simulator flags for three Nodes of the test's own, `<ns>-h1` in zone-a and `-h2`, `-h3`
/// in zone-b (Nodes are cluster-scoped and the rigs share the API server).
fn own_nodes(ns: &str) -> Vec<String> {
    let zone = "topology.kairon.zyvor.dev/zone";
    let list = format!("{ns}-h1:{zone}=zone-a,{ns}-h2:{zone}=zone-b,{ns}-h3:{zone}=zone-b");
    vec!["--host-objects".into(), "--hosts".into(), list]
}

fn nodes(rig: &Rig) -> Api<Node> {
    Api::all(rig.env.client())
}

/// Cordons (or uncordons) Kairon's Node `name`, as `kubectl cordon` does.
async fn cordon(rig: &Rig, name: &str, on: bool) {
    nodes(rig)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": on}})),
        )
        .await
        .unwrap_or_else(|e| rig.fail(format!("cordoning Node {name}: {e}")));
}

/// The test's Nodes go with it.
async fn remove_nodes(rig: &Rig) {
    for i in 1..=3 {
        let _ = nodes(rig)
            .delete(&format!("{}-h{i}", rig.ns), &DeleteParams::default())
            .await;
    }
}

fn vm_node(vm: &capkr::kairon::Machine) -> Option<String> {
    vm.status.as_ref().and_then(|s| s.node_name.clone())
}

fn migrations(rig: &Rig) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kairon.zyvor.dev",
        "v1alpha1",
        "MachineMigration",
    ));
    Api::namespaced_with(rig.env.client(), &rig.ns, &ar)
}

async fn migrate(rig: &Rig, name: &str, vm: &str, target: &str) {
    let mm: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineMigration",
        "metadata": {"name": name, "namespace": rig.ns},
        "spec": {"machineName": vm, "strategy": "live", "targetNode": target},
    }))
    .unwrap();
    migrations(rig)
        .create(&PostParams::default(), &mm)
        .await
        .unwrap_or_else(|e| rig.fail(format!("MachineMigration {name}: {e}")));
}

fn cond<'a>(
    km: &'a KaironMachine,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conditions::get(km.status.as_ref()?.conditions.as_deref()?, type_)
}

fn host(km: &KaironMachine) -> Option<&str> {
    km.status.as_ref()?.instance.as_ref()?.host.as_deref()
}

/// Waits for `budget`, cordons `node` and runs `evacuate --wait` on it: it must end with the
/// node empty, having skipped VMs for `budget` (0 disruptions allowed) and migrated none.
/// How long from the cordon to the node empty.
async fn cordon_and_wait_for_empty(rig: &Rig, node: &str, budget: &str) -> Duration {
    let ns = rig.ns.as_str();
    let budgets: Api<capkr::kairon::budget::MachineDisruptionBudget> = Api::namespaced(rig.env.client(), ns);
    rig.wait("the budget", UP, || async {
        Ok::<_, kube::Error>(budgets.get_opt(budget).await?.map(|_| ()))
    })
    .await;
    let started = std::time::Instant::now();
    cordon(rig, node, true).await;
    let said = rig
        .env
        .kairon_evacuate(node, &["--wait", "--interval", "2s", "--timeout", "4m"])
        .await
        .unwrap_or_else(|e| rig.fail(e));
    let emptied = started.elapsed();
    assert!(said.contains(&format!("node {node} is empty")), "evacuate said: {said}");
    assert!(
        said.contains(&format!(
            "MachineDisruptionBudget {ns}/{budget} has 0 disruptions allowed"
        )),
        "skipped for its budget: {said}"
    );
    let made = migrations(rig).list(&ListParams::default()).await.unwrap().items;
    assert!(made.is_empty(), "no VM migrated: {made:?}");
    emptied
}

/// Our events on KaironMachine `km` with `reason`.
async fn events(rig: &Rig, km: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(rig.env.client(), &rig.ns);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(km)
                && e.reporting_controller
                    .as_deref()
                    .is_some_and(|c| c.starts_with("capkr-"))
        })
        .collect()
}

/// Waits until the worker's KaironMachine runs on `target` and says `status` for
/// InstanceInFailureDomain.
async fn wait_moved(rig: &Rig, name: &str, target: &str, status: &str) -> KaironMachine {
    let kms = rig.kms();
    rig.wait(
        &format!("KaironMachine {name} on host {target} with InstanceInFailureDomain={status}"),
        MOVED,
        || async {
            let km = kms.get(name).await?;
            let done =
                host(&km) == Some(target) && cond(&km, INSTANCE_IN_FAILURE_DOMAIN).is_some_and(|c| c.status == status);
            Ok::<_, kube::Error>(done.then_some(km))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_migration_out_of_the_failure_domain_is_reported_and_nothing_is_replaced() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        md_failure_domain: Some("zone-b"),
        sim_args: own_nodes("e2e-maintenance-migration"),
        ..RigOptions::new("e2e_maintenance_migration")
    })
    .await;
    let other_zone_host = format!("{}-h1", rig.ns);
    let zone_b_host = format!("{}-h3", rig.ns);
    let up = rig.wait_running(2, UP).await;
    let machine_names: Vec<String> = up.iter().map(|m| m.metadata.name.clone().unwrap()).collect();
    let worker = up
        .iter()
        .find(|m| {
            !m.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("cluster.x-k8s.io/control-plane"))
        })
        .and_then(|m| m.metadata.name.clone())
        .expect("a worker Machine");
    let kms = rig.kms();
    let before = rig
        .wait("the worker's KaironMachine in its failure domain", MOVED, || async {
            let km = kms.get(&worker).await?;
            let inside = cond(&km, INSTANCE_IN_FAILURE_DOMAIN).is_some_and(|c| c.status == "True");
            Ok::<_, kube::Error>(inside.then_some(km))
        })
        .await;
    let first_host = host(&before).expect("a host").to_string();
    assert_ne!(first_host, other_zone_host, "placed in zone-b");
    let ready_since = cond(&before, READY).expect("Ready").last_transition_time.clone();
    assert_eq!(cond(&before, READY).unwrap().status, "True");

    // Out of the failure domain: an operator's explicit target overrides the selector.
    migrate(&rig, "out-of-zone", &worker, &other_zone_host).await;
    let out = wait_moved(&rig, &worker, &other_zone_host, "False").await;
    let fd = cond(&out, INSTANCE_IN_FAILURE_DOMAIN).unwrap();
    assert_eq!(fd.reason, reason::INSTANCE_OUTSIDE_FAILURE_DOMAIN);
    assert!(
        fd.message.contains(&other_zone_host) && fd.message.contains("zone-b"),
        "{}",
        fd.message
    );
    rig.wait("an InstanceMigrated event and a Warning", MOVED, || async {
        let migrated = events(&rig, &worker, "InstanceMigrated").await;
        let outside = events(&rig, &worker, "InstanceOutsideFailureDomain").await;
        Ok::<_, kube::Error>((!migrated.is_empty() && !outside.is_empty()).then_some(()))
    })
    .await;
    let migrated = events(&rig, &worker, "InstanceMigrated").await;
    assert_eq!(migrated.len(), 1, "one event per move");
    let note = migrated[0].note.clone().unwrap_or_default();
    assert!(
        note.contains(&format!("from node {first_host} to node {other_zone_host}")),
        "{note}"
    );
    assert_eq!(migrated[0].type_.as_deref(), Some("Normal"));
    let outside = events(&rig, &worker, "InstanceOutsideFailureDomain").await;
    assert_eq!(outside[0].type_.as_deref(), Some("Warning"));

    // Back into it.
    let back_to = if first_host == zone_b_host {
        format!("{}-h2", rig.ns)
    } else {
        zone_b_host.clone()
    };
    migrate(&rig, "back-in-zone", &worker, &back_to).await;
    let back = wait_moved(&rig, &worker, &back_to, "True").await;
    assert_eq!(
        cond(&back, INSTANCE_IN_FAILURE_DOMAIN).unwrap().reason,
        reason::INSTANCE_IN_FAILURE_DOMAIN
    );
    rig.wait("a second InstanceMigrated event", MOVED, || async {
        let n = events(&rig, &worker, "InstanceMigrated").await.len();
        Ok::<_, kube::Error>((n >= 2).then_some(()))
    })
    .await;
    assert_eq!(events(&rig, &worker, "InstanceMigrated").await.len(), 2);

    // Through both moves the machine stayed what it was: Ready since before, never an
    // evacuation, its Machine neither marked nor replaced, the same VM.
    let km = kms.get(&worker).await.unwrap();
    let ready = cond(&km, READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), &ready.last_transition_time),
        ("True", &ready_since),
        "Ready never flipped"
    );
    assert!(cond(&km, EVACUATION).is_none(), "no evacuation");
    assert_eq!(km.spec.provider_id, before.spec.provider_id, "the same VM (same UID)");
    let machines = rig.machines().list(&ListParams::default()).await.unwrap().items;
    let mut names: Vec<String> = machines.iter().map(|m| m.metadata.name.clone().unwrap()).collect();
    names.sort();
    let mut want = machine_names.clone();
    want.sort();
    assert_eq!(names, want, "no Machine replaced");
    for m in &machines {
        assert!(
            m.metadata.deletion_timestamp.is_none(),
            "{:?} not deleted",
            m.metadata.name
        );
        assert!(
            !m.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(capkr::capi::REMEDIATE_MACHINE_ANNOTATION)),
            "{:?} not marked for remediation",
            m.metadata.name
        );
    }
    remove_nodes(&rig).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cordoned_control_plane_without_a_health_check_is_blocked_loudly_and_evacuate_skips_it() {
    let ns = "e2e-maintenance-cordon-cp";
    let mut sim_args = own_nodes(ns);
    sim_args.push("--cordon-evacuation".into());
    sim_args.push("--admission-webhook".into());
    let rig = Rig::start(RigOptions {
        workers: 0,
        sim_args,
        ..RigOptions::new("e2e_maintenance_cordon_cp")
    })
    .await;
    assert_eq!(rig.ns, ns);
    let up = rig.wait_running(1, UP).await;
    let cp = up[0].metadata.name.clone().unwrap();
    let vms = rig.vms();
    let vm = vms.get(&cp).await.unwrap();
    let uid = vm.metadata.uid.clone().unwrap();
    let node = vm_node(&vm).expect("the VM is placed");
    let budget = format!("cp-{}", rig.cluster);
    let budgets: Api<capkr::kairon::budget::MachineDisruptionBudget> = Api::namespaced(rig.env.client(), ns);
    rig.wait("the control plane's budget", UP, || async {
        Ok::<_, kube::Error>(budgets.get_opt(&budget).await?.map(|_| ()))
    })
    .await;
    // A VM of no cluster (no label a budget selects), moved beside the control plane.
    let other: capkr::kairon::Machine = serde_json::from_value(json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "Machine",
        "metadata": {"name": "not-a-node", "namespace": ns},
        "spec": {"resources": {"cpu": "1", "memory": "1Gi"}}}))
    .unwrap();
    vms.create(&PostParams::default(), &other).await.unwrap();
    let placed = rig
        .wait("the other VM running", UP, || async {
            let vm = vms.get("not-a-node").await?;
            let running = vm.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            Ok::<_, kube::Error>(running.then(|| vm_node(&vm)).flatten())
        })
        .await;
    if placed != node {
        migrate(&rig, "beside-the-control-plane", "not-a-node", &node).await;
        rig.wait("the other VM beside the control plane", MOVED, || async {
            let vm = vms.get("not-a-node").await?;
            Ok::<_, kube::Error>((vm_node(&vm).as_deref() == Some(node.as_str())).then_some(()))
        })
        .await;
    }
    cordon(&rig, &node, true).await;
    // Kairon's cordon evacuation moves the other VM, cold, and never the control plane.
    let moved_to = rig
        .wait("the other VM cold-migrated off the cordoned node", UP, || async {
            let vm = vms.get("not-a-node").await?;
            let running = vm.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            Ok::<_, kube::Error>(vm_node(&vm).filter(|n| running && *n != node))
        })
        .await;
    let by_cordon: Vec<DynamicObject> = migrations(&rig)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|m| m.name_any().starts_with(&format!("cordon-evacuate-{node}-")))
        .collect();
    assert_eq!(
        by_cordon
            .iter()
            .map(|m| m.data["spec"]["machineName"].clone())
            .collect::<Vec<_>>(),
        vec![json!("not-a-node")],
        "cordon evacuation migrated the other VM (to {moved_to}) and not the control plane"
    );
    assert_eq!(by_cordon[0].data["spec"]["strategy"], "cold");

    // Blocked, loudly: a single control-plane Machine no MachineHealthCheck selects.
    let kms = rig.kms();
    let blocked = rig
        .wait("Evacuation NoMachineHealthCheck", MOVED, || async {
            let km = kms.get(&cp).await?;
            let r = cond(&km, EVACUATION).map(|c| c.reason.clone());
            Ok::<_, kube::Error>((r.as_deref() == Some(reason::NO_MACHINE_HEALTH_CHECK)).then_some(km))
        })
        .await;
    let evacuation = cond(&blocked, EVACUATION).unwrap();
    assert_eq!(evacuation.status, "True");
    assert!(
        evacuation
            .message
            .starts_with(&format!("Kairon node {node} is cordoned")),
        "{}",
        evacuation.message
    );
    rig.wait("EvacuationRequested and EvacuationBlocked events", MOVED, || async {
        let requested = events(&rig, &cp, "EvacuationRequested").await;
        let warned = events(&rig, &cp, "EvacuationBlocked").await;
        Ok::<_, kube::Error>((!requested.is_empty() && !warned.is_empty()).then_some(()))
    })
    .await;
    assert_eq!(
        events(&rig, &cp, "EvacuationBlocked").await[0].type_.as_deref(),
        Some("Warning")
    );

    // Kairon's evacuation leaves the VM alone: its budget allows no disruption.
    let said = rig
        .env
        .kairon_evacuate(&node, &[])
        .await
        .unwrap_or_else(|e| rig.fail(e));
    let held = format!("machine {ns}/{cp}: skipped: MachineDisruptionBudget {ns}/{budget} has 0 disruptions allowed");
    assert!(said.contains(&held), "evacuate said: {said}");
    let made = migrations(&rig).list(&ListParams::default()).await.unwrap().items;
    let of_cp: Vec<String> = made
        .iter()
        .filter(|m| m.data["spec"]["machineName"] == cp.as_str())
        .map(|m| m.name_any())
        .collect();
    assert!(of_cp.is_empty(), "no migration of the control plane: {of_cp:?}");
    // Kairon's admission webhook refuses an operator's live migration of it for the same
    // reason (the cordon evacuation's migration of the other VM went through it above).
    let live: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineMigration",
        "metadata": {"name": "live-cp", "namespace": ns},
        "spec": {"machineName": cp, "strategy": "live"},
    }))
    .unwrap();
    match migrations(&rig).create(&PostParams::default(), &live).await {
        Err(kube::Error::Api(e)) => assert!(
            e.message.contains(&format!(
                "MachineDisruptionBudget {ns}/{budget} has 0 disruptions allowed"
            )),
            "refused for its budget: {}",
            e.message
        ),
        other => rig.fail(format!(
            "a live migration of the control plane was not refused: {other:?}"
        )),
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let vm = vms.get(&cp).await.unwrap();
    assert_eq!(vm.metadata.uid.as_deref(), Some(uid.as_str()), "the same VM");
    assert_eq!(
        (vm.status.as_ref().and_then(|s| s.phase.as_deref()), vm_node(&vm)),
        (Some("Running"), Some(node.clone())),
        "still running where it was"
    );
    let machine = rig.machines().get(&cp).await.unwrap();
    assert!(machine.metadata.deletion_timestamp.is_none(), "not deleted");
    assert!(
        !machine
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(capkr::capi::REMEDIATE_MACHINE_ANNOTATION)),
        "not marked: no MachineHealthCheck would act on it"
    );

    // Uncordoned: over, nothing replaced.
    cordon(&rig, &node, false).await;
    let over = rig
        .wait("Evacuation False Canceled", MOVED, || async {
            let km = kms.get(&cp).await?;
            let c = cond(&km, EVACUATION).map(|c| (c.status.clone(), c.reason.clone()));
            Ok::<_, kube::Error>((c == Some(("False".into(), reason::CANCELED.into()))).then_some(km))
        })
        .await;
    assert_eq!(cond(&over, READY).map(|c| c.status.as_str()), Some("True"));
    let _ = vms.delete("not-a-node", &DeleteParams::default()).await;
    remove_nodes(&rig).await;
}

/// A worker on a cordoned node is replaced through CAPI (its MachineSet's; no
/// MachineHealthCheck, so the provider deletes the Machine and CAPI drains it first), after a
/// grace period of 5 s, while Kairon's `evacuate --wait` skips it and waits: the node ends
/// empty with no VM migrated.
#[tokio::test(flavor = "multi_thread")]
async fn a_cordoned_nodes_worker_is_replaced_through_capi_while_evacuate_waits() {
    let ns = "e2e-maintenance-cordon-worker";
    let rig = Rig::start(RigOptions {
        workers: 2,
        cp_failure_domain: Some("zone-a"),
        md_failure_domain: Some("zone-b"),
        sim_args: own_nodes(ns),
        manager_args: vec!["--evacuation-grace-period=5s".into()],
        ..RigOptions::new("e2e_maintenance_cordon_worker")
    })
    .await;
    assert_eq!(rig.ns, ns);
    rig.wait_running(3, UP).await;
    let vms = rig.vms();
    let all = vms.list(&ListParams::default()).await.unwrap().items;
    let workers: Vec<&capkr::kairon::Machine> = all
        .iter()
        .filter(|vm| vm.labels().contains_key("cluster.x-k8s.io/deployment-name"))
        .collect();
    assert_eq!(workers.len(), 2, "two workers labelled with their MachineDeployment");
    let node = vm_node(workers[0]).expect("placed");
    let on_node: Vec<String> = all
        .iter()
        .filter(|vm| vm_node(vm).as_deref() == Some(node.as_str()))
        .map(|vm| vm.name_any())
        .collect();
    let uids_before: Vec<String> = all.iter().filter_map(|vm| vm.metadata.uid.clone()).collect();
    let budget = format!("workers-{}", rig.cluster);
    let emptied = cordon_and_wait_for_empty(&rig, &node, &budget).await;
    let now = vms.list(&ListParams::default()).await.unwrap().items;
    for gone in &on_node {
        assert!(
            now.iter()
                .all(|vm| vm.name_any() != *gone || vm.metadata.deletion_timestamp.is_some()),
            "{gone} replaced"
        );
    }
    // As `evacuate` counts them: VMs being deleted (the replaced ones, their finalizer not yet
    // released) are on their way out.
    let left: Vec<String> = now
        .iter()
        .filter(|vm| vm.metadata.deletion_timestamp.is_none() && vm_node(vm).as_deref() == Some(node.as_str()))
        .map(|vm| vm.name_any())
        .collect();
    assert!(left.is_empty(), "nothing placed on the cordoned node: {left:?}");
    rig.wait_running(3, UP).await;
    let after = vms.list(&ListParams::default()).await.unwrap().items;
    let replaced = after
        .iter()
        .filter(|vm| !uids_before.contains(vm.metadata.uid.as_ref().unwrap()))
        .count();
    assert_eq!(
        replaced,
        on_node.len(),
        "each VM on the node replaced once: {on_node:?}"
    );
    eprintln!(
        "cordoned {node} ({} VM(s): {on_node:?}): evacuate --wait ended {:.1}s after the cordon",
        on_node.len(),
        emptied.as_secs_f64()
    );
    remove_nodes(&rig).await;
}

/// The members of a MachinePool (no MachineHealthCheck) on a cordoned node are replaced
/// through CAPI as a MachineDeployment's are: the provider deletes their Machines, CAPI drains
/// them, the KaironMachinePool releases each VM from its Kairon MachineSet and makes another
/// on an uncordoned node; `evacuate --wait` skips them (the pool's budget) and ends with the
/// node empty; the members elsewhere are untouched.
#[tokio::test(flavor = "multi_thread")]
async fn a_cordoned_nodes_pool_members_are_replaced_by_their_pool() {
    use crate::machine_pools::{pool_machines, pool_members, rig_with_pool_from, wait_pool_running};
    let ns = "e2e-maintenance-cordon-pool";
    let (rig, pool) = rig_with_pool_from(
        RigOptions {
            workers: 0,
            cp_failure_domain: Some("zone-a"),
            sim_args: own_nodes(ns),
            manager_args: vec!["--evacuation-grace-period=5s".into()],
            ..RigOptions::new("e2e_maintenance_cordon_pool")
        },
        3,
    )
    .await;
    assert_eq!(rig.ns, ns);
    let machines_before: Vec<String> = wait_pool_running(&rig, &pool, 3)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    let members = pool_members(&rig, &pool).await;
    let cp_node = format!("{ns}-h1");
    let Some(node) = members.values().filter_map(vm_node).find(|n| *n != cp_node) else {
        rig.fail(format!("every pool member is on the control plane's node {cp_node}"))
    };
    let on_node: BTreeSet<String> = members
        .iter()
        .filter(|(_, vm)| vm_node(vm).as_deref() == Some(node.as_str()))
        .map(|(name, _)| name.clone())
        .collect();
    let elsewhere: BTreeMap<String, String> = members
        .iter()
        .filter(|(name, _)| !on_node.contains(*name))
        .map(|(name, vm)| (name.clone(), vm.metadata.uid.clone().unwrap()))
        .collect();
    let emptied = cordon_and_wait_for_empty(&rig, &node, &format!("workers-{}", rig.cluster)).await;

    let machines_after: Vec<String> = wait_pool_running(&rig, &pool, 3)
        .await
        .iter()
        .map(|m| m.name_any())
        .collect();
    let after = pool_members(&rig, &pool).await;
    for (name, vm) in &after {
        assert_ne!(
            vm_node(vm).as_deref(),
            Some(node.as_str()),
            "{name} placed on the cordoned node"
        );
    }
    for (name, uid) in &elsewhere {
        assert_eq!(
            after.get(name).and_then(|vm| vm.metadata.uid.as_ref()),
            Some(uid),
            "{name}, not on the cordoned node, untouched"
        );
    }
    for gone in &on_node {
        assert!(!after.contains_key(gone), "{gone} replaced");
    }
    assert_eq!(after.len(), 3, "the pool whole again: {:?}", after.keys());
    let kept = machines_after.iter().filter(|m| machines_before.contains(m)).count();
    assert_eq!(
        kept,
        elsewhere.len(),
        "only the Machines of the cordoned node's members replaced: before {machines_before:?}, after {machines_after:?}"
    );
    assert_eq!(pool_machines(&rig, &pool).await.len(), 3);
    eprintln!(
        "cordoned {node} ({} pool member(s): {on_node:?}): evacuate --wait ended {:.1}s after the cordon",
        on_node.len(),
        emptied.as_secs_f64()
    );
    remove_nodes(&rig).await;
}

/// A worker on a cordoned node whose MachineHealthCheck was deleted before (CAPI leaves its
/// `HealthCheckSucceeded` condition on the Machine): no check will act on a
/// `remediate-machine` mark, so the provider deletes the Machine (CAPI drains it, its
/// MachineSet replaces it) and `evacuate --wait` ends with the node empty, instead of the
/// worker being marked and the node never emptied.
#[tokio::test(flavor = "multi_thread")]
async fn a_cordoned_nodes_worker_whose_health_check_is_gone_is_still_replaced() {
    let ns = "e2e-maintenance-mhc-gone";
    let rig = Rig::start(RigOptions {
        workers: 1,
        health_check: true,
        cp_failure_domain: Some("zone-a"),
        md_failure_domain: Some("zone-b"),
        sim_args: own_nodes(ns),
        manager_args: vec!["--evacuation-grace-period=5s".into()],
        ..RigOptions::new("e2e_maintenance_mhc_gone")
    })
    .await;
    assert_eq!(rig.ns, ns);
    let machines = rig.wait_running(2, UP).await;
    let worker = machines
        .iter()
        .map(|m| m.name_any())
        .find(|n| !n.contains("control-plane"))
        .expect("a worker Machine");
    rig.wait("the MachineHealthCheck covers the worker", UP, || async {
        let m = rig.machines().get(&worker).await?;
        Ok::<_, kube::Error>(crate::common::condition(&m, "HealthCheckSucceeded").map(|_| ()))
    })
    .await;
    let mhcs: Api<DynamicObject> = Api::namespaced_with(
        rig.env.client(),
        &rig.ns,
        &capkr_testenv::capi_resource("MachineHealthCheck", "machinehealthchecks"),
    );
    mhcs.delete(&format!("{}-md-0", rig.cluster), &DeleteParams::default())
        .await
        .unwrap_or_else(|e| rig.fail(format!("deleting the MachineHealthCheck: {e}")));
    rig.wait("the MachineHealthCheck gone", UP, || async {
        Ok::<_, kube::Error>(mhcs.list(&ListParams::default()).await?.items.is_empty().then_some(()))
    })
    .await;
    let m = rig.machines().get(&worker).await.unwrap();
    assert!(
        crate::common::condition(&m, "HealthCheckSucceeded").is_some(),
        "CAPI leaves the condition behind: {}",
        m.data["status"]
    );
    let vm = rig.vms().get(&worker).await.unwrap();
    let node = vm_node(&vm).expect("placed");
    cordon_and_wait_for_empty(&rig, &node, &format!("workers-{}", rig.cluster)).await;
    let deleted = events(&rig, &worker, "ReplacementRequested").await;
    assert!(
        deleted.iter().any(|e| e
            .note
            .as_deref()
            .is_some_and(|n| n.contains("which no MachineHealthCheck selects"))),
        "the provider deleted the Machine, not marked it: {deleted:?}"
    );
    rig.wait_running(2, UP).await;
    remove_nodes(&rig).await;
}
