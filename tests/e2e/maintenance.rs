//! Kairon host maintenance against the real control plane.
//!
//! - A live migration (a MachineMigration the simulator plays) moves a worker's VM to a host
//!   outside its Machine's failure domain and back. The KaironMachine follows the host, says
//!   `InstanceInFailureDomain=False` (then True again), publishes one `InstanceMigrated` event per
//!   move and a Warning when the VM leaves its failure domain; Ready never flips and nothing is
//!   replaced or marked for remediation.
//! - A host in maintenance with a control-plane VM that cannot move live and no
//!   MachineHealthCheck: the evacuation is blocked (`NoMachineHealthCheck`, a Warning), the
//!   Machine is never deleted by the provider, Kairon stops the VM at the deadline
//!   (`DeadlineExceeded`, a Warning) and the stopped VM is not re-created.
//! - The MachineDisruptionBudget the provider keeps over a MachineDeployment holds a worker's
//!   migration while the deployment's other worker is paused, and lets it go once that one
//!   runs again.

use std::time::Duration;

use crate::common::{Rig, RigOptions};
use capkr::api::KaironMachine;
use capkr::api::conditions::{self, EVACUATION, INSTANCE_IN_FAILURE_DOMAIN, READY, reason};
use k8s_openapi::api::events::v1::Event;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);
const MOVED: Duration = Duration::from_secs(60);
/// A zone-a host of `capkr_testenv::SIMULATOR_HOSTS` (the workers are placed in zone-b).
const OTHER_ZONE_HOST: &str = "kairon-node-1";
const ZONE_B_HOST: &str = "kairon-node-3";

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
        ..RigOptions::new("e2e_maintenance_migration")
    })
    .await;
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
    assert_ne!(first_host, OTHER_ZONE_HOST, "placed in zone-b");
    let ready_since = cond(&before, READY).expect("Ready").last_transition_time.clone();
    assert_eq!(cond(&before, READY).unwrap().status, "True");

    // Out of the failure domain: an operator's explicit target overrides the selector.
    migrate(&rig, "out-of-zone", &worker, OTHER_ZONE_HOST).await;
    let out = wait_moved(&rig, &worker, OTHER_ZONE_HOST, "False").await;
    let fd = cond(&out, INSTANCE_IN_FAILURE_DOMAIN).unwrap();
    assert_eq!(fd.reason, reason::INSTANCE_OUTSIDE_FAILURE_DOMAIN);
    assert!(
        fd.message.contains(OTHER_ZONE_HOST) && fd.message.contains("zone-b"),
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
        note.contains(&format!("from host {first_host} to host {OTHER_ZONE_HOST}")),
        "{note}"
    );
    assert_eq!(migrated[0].type_.as_deref(), Some("Normal"));
    let outside = events(&rig, &worker, "InstanceOutsideFailureDomain").await;
    assert_eq!(outside[0].type_.as_deref(), Some("Warning"));

    // Back into it.
    migrate(&rig, "back-in-zone", &worker, ZONE_B_HOST).await;
    let back = wait_moved(&rig, &worker, ZONE_B_HOST, "True").await;
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
}

/// A VM the simulator will not migrate live: Kairon asks its owner to evacuate it instead.
const NOT_MIGRATABLE: &str = "sim.kairon.zyvor.dev/not-migratable";

fn hosts(rig: &Rig) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("kairon.zyvor.dev", "v1alpha1", "Host"));
    Api::all_with(rig.env.client(), &ar)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_evacuation_without_a_health_check_is_blocked_loudly_and_kairon_stops_the_vm_at_the_deadline() {
    // Host objects are cluster-scoped and the environment is shared: names of this test's own.
    let ns = "e2e-maintenance-deadline";
    let zone = "topology.kairon.zyvor.dev/zone";
    let host_list = format!("{ns}-h1:{zone}=zone-a,{ns}-h2:{zone}=zone-b,{ns}-h3:{zone}=zone-b");
    let rig = Rig::start(RigOptions {
        workers: 0,
        sim_args: ["--host-objects", "--hosts", host_list.as_str()]
            .map(String::from)
            .to_vec(),
        ..RigOptions::new("e2e_maintenance_deadline")
    })
    .await;
    assert_eq!(rig.ns, ns);
    let up = rig.wait_running(1, UP).await;
    let cp = up[0].metadata.name.clone().unwrap();
    let vms = rig.vms();
    let vm = vms.get(&cp).await.unwrap();
    let uid = vm.metadata.uid.clone().unwrap();
    let host = vm
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("the VM is placed");
    let pp = PatchParams::default();
    vms.patch(
        &cp,
        &pp,
        &Patch::Merge(json!({"metadata": {"annotations": {NOT_MIGRATABLE: "true"}}})),
    )
    .await
    .unwrap();
    hosts(&rig)
        .patch(
            &host,
            &pp,
            &Patch::Merge(json!({"spec": {"maintenance": {"reason": "e2e", "evacuationGracePeriodSeconds": 15}}})),
        )
        .await
        .unwrap_or_else(|e| rig.fail(format!("Host {host} (the simulator has --host-objects): {e}")));

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
            .starts_with(&format!("Kairon host {host} is in maintenance")),
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

    // The deadline passes: Kairon stops the VM; the condition and a Warning say so.
    let missed = rig
        .wait("Evacuation DeadlineExceeded", Duration::from_secs(90), || async {
            let km = kms.get(&cp).await?;
            let r = cond(&km, EVACUATION).map(|c| c.reason.clone());
            Ok::<_, kube::Error>((r.as_deref() == Some(reason::DEADLINE_EXCEEDED)).then_some(km))
        })
        .await;
    assert_eq!(cond(&missed, READY).map(|c| c.status.as_str()), Some("False"));
    rig.wait("an EvacuationDeadlineExceeded Warning", MOVED, || async {
        let e = events(&rig, &cp, "EvacuationDeadlineExceeded").await;
        Ok::<_, kube::Error>((!e.is_empty()).then_some(()))
    })
    .await;
    // The stopped VM is the same one, not re-created; the Machine is neither deleted nor marked.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = vms.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all.len(), 1, "one VM");
    assert_eq!(all[0].metadata.uid.as_deref(), Some(uid.as_str()), "the same VM");
    let status = all[0].status.clone().unwrap_or_default();
    assert_eq!(
        (status.phase.as_deref(), status.reason.as_deref()),
        (Some("Stopped"), Some("EvacuationDeadlineExceeded"))
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
    // The Host objects are shared by every rig of the environment: this test's go.
    for i in 1..=3 {
        let _ = hosts(&rig)
            .delete(&format!("{ns}-h{i}"), &DeleteParams::default())
            .await;
    }
}

/// Kairon's MachineDisruptionBudgets hold a host's evacuation as Kairon applies them: the
/// provider's budget over a MachineDeployment's VMs allows one disruption (its
/// `maxUnavailable`, at least one). With one of two workers paused, the other's host goes into
/// maintenance: its migration waits, the Host saying which budget holds it, and nothing is
/// migrated; once the paused worker runs again, the migration goes ahead.
#[tokio::test(flavor = "multi_thread")]
async fn a_workers_migration_waits_while_its_deployments_budget_has_no_disruption_left() {
    // Host objects are cluster-scoped and the environment is shared: names of this test's own.
    let ns = "e2e-maintenance-budget";
    let zone = "topology.kairon.zyvor.dev/zone";
    let host_list = format!("{ns}-h1:{zone}=zone-a,{ns}-h2:{zone}=zone-b,{ns}-h3:{zone}=zone-b");
    let rig = Rig::start(RigOptions {
        workers: 2,
        sim_args: ["--host-objects", "--hosts", host_list.as_str()]
            .map(String::from)
            .to_vec(),
        ..RigOptions::new("e2e_maintenance_budget")
    })
    .await;
    assert_eq!(rig.ns, ns);
    rig.wait_running(3, UP).await;
    let vms = rig.vms();
    let node_of = |vm: &capkr::kairon::Machine| vm.status.as_ref().and_then(|s| s.node_name.clone());
    let workers: Vec<capkr::kairon::Machine> = vms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|vm| {
            vm.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("cluster.x-k8s.io/deployment-name"))
        })
        .collect();
    assert_eq!(workers.len(), 2, "two workers labelled with their MachineDeployment");
    let (a, b) = (&workers[0], &workers[1]);
    let (a_name, b_name) = (a.metadata.name.clone().unwrap(), b.metadata.name.clone().unwrap());
    let a_host = node_of(a).expect("placed");
    assert_ne!(Some(a_host.clone()), node_of(b), "the workers on two hosts");
    let budget = format!("md-{}-md-0", rig.cluster);
    let budgets: Api<capkr::kairon::budget::MachineDisruptionBudget> = Api::namespaced(rig.env.client(), ns);
    rig.wait("the deployment's budget", UP, || async {
        Ok::<_, kube::Error>(budgets.get_opt(&budget).await?.map(|_| ()))
    })
    .await;

    let pp = PatchParams::default();
    let power = |state: &'static str| json!({"spec": {"powerState": state}});
    vms.patch(&b_name, &pp, &Patch::Merge(power("Paused"))).await.unwrap();
    rig.wait(&format!("{b_name} paused"), MOVED, || async {
        let vm = vms.get(&b_name).await?;
        Ok::<_, kube::Error>((vm.status.and_then(|s| s.phase).as_deref() == Some("Paused")).then_some(()))
    })
    .await;
    hosts(&rig)
        .patch(
            &a_host,
            &pp,
            &Patch::Merge(json!({"spec": {"maintenance": {"reason": "e2e", "evacuationGracePeriodSeconds": 600}}})),
        )
        .await
        .unwrap_or_else(|e| rig.fail(format!("Host {a_host} (the simulator has --host-objects): {e}")));
    let held = format!("held: MachineDisruptionBudget {ns}/{budget} has 0 disruptions allowed");
    rig.wait("the Host saying the budget holds the migration", MOVED, || async {
        let h = hosts(&rig).get(&a_host).await?;
        let message = h.data["status"]["message"].as_str().unwrap_or_default().to_string();
        Ok::<_, kube::Error>(message.contains(&held).then_some(()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let made = migrations(&rig).list(&ListParams::default()).await.unwrap().items;
    assert!(made.is_empty(), "no migration while the budget holds: {made:?}");
    assert_eq!(node_of(&vms.get(&a_name).await.unwrap()), Some(a_host.clone()));

    // The paused worker runs again: the budget has a disruption to spare, the worker moves.
    let resumed_at = std::time::Instant::now();
    vms.patch(&b_name, &pp, &Patch::Merge(power("Running"))).await.unwrap();
    let to = rig
        .wait(&format!("{a_name} migrated off {a_host}"), UP, || async {
            let vm = vms.get(&a_name).await?;
            let running = vm.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            Ok::<_, kube::Error>(node_of(&vm).filter(|n| *n != a_host && running))
        })
        .await;
    eprintln!(
        "maintenance budget: {a_name} held while {b_name} was paused, moved {a_host} -> {to} {:.1}s after it ran again",
        resumed_at.elapsed().as_secs_f64()
    );
}
