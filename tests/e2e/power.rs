//! Kairon's power states and a cold migration against the real control plane and CAPI, as
//! Kairon does them (`docs/kairon-api.md`, "Bootstrap data, once"):
//! - once Kairon reports a VM's runtime, its Kairon Machine holds no bootstrap data any more;
//! - `spec.powerState` Paused or Halted keeps the runtime and its disk: Running brings back the
//!   same VM and the same Machine;
//! - Stopped deletes the runtime and its disk, and so does a cold MachineMigration: Running
//!   makes a new runtime on a fresh disk. That is a new machine, not the one CAPI bootstrapped:
//!   the KaironMachine says so (`InstanceRecreated`, not Ready) and a MachineHealthCheck
//!   replaces it.
//!
//! (This rig's workload cluster has no node lifecycle controller, so its Nodes stay Ready
//! whatever the kubelet does; the MachineHealthCheck here acts on `InfrastructureReady`.)

use std::time::Duration;

use crate::common::{Rig, RigOptions, km_instance};
use capkr::api::conditions::{self, READY, reason};
use capkr::kairon;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);

fn runtime(vm: &kairon::Machine) -> Option<String> {
    vm.status
        .as_ref()
        .and_then(|s| s.runtime_id.clone())
        .filter(|r| !r.is_empty())
}

/// Whether the Kairon Machine still holds bootstrap data (files or commands of its cloudInit).
fn holds_bootstrap_data(vm: &kairon::Machine) -> bool {
    vm.spec
        .cloud_init
        .as_ref()
        .is_some_and(|c| !c.write_files.is_empty() || !c.run_cmd.is_empty())
}

/// The workload cluster's Node of Machine `name` (by its providerID), if any.
async fn node_of(rig: &Rig, name: &str) -> Result<Option<Node>, kube::Error> {
    let want = capkr::kairon::provider_id(name);
    let nodes = rig.nodes().list(&ListParams::default()).await?;
    Ok(nodes
        .items
        .into_iter()
        .find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(want.as_str())))
}

async fn delete_node(rig: &Rig, name: &str) {
    let node = node_of(rig, name)
        .await
        .unwrap()
        .unwrap_or_else(|| rig.fail(format!("no Node of {name}")));
    rig.nodes()
        .delete(&node.name_any(), &Default::default())
        .await
        .unwrap_or_else(|e| rig.fail(format!("deleting Node {}: {e}", node.name_any())));
    rig.wait(&format!("the Node of {name} gone"), Duration::from_secs(30), || async {
        Ok::<_, kube::Error>(node_of(rig, name).await?.is_none())
    })
    .await;
}

fn api(rig: &Rig, group: &str, version: &str, kind: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    Api::namespaced_with(rig.env.client(), &rig.ns, &ar)
}

#[tokio::test(flavor = "multi_thread")]
async fn paused_or_halted_runs_again_as_the_same_machine_stopped_or_cold_migrated_is_replaced() {
    let rig = Rig::start(RigOptions {
        workers: 2,
        ..RigOptions::new("power")
    })
    .await;
    let machines = rig.wait_running(3, UP).await;
    let names: Vec<String> = machines.iter().map(|m| m.name_any()).collect();
    let workers: Vec<String> = names.iter().filter(|n| !n.contains("control-plane")).cloned().collect();
    let (stopped, moved) = (workers[0].clone(), workers[1].clone());

    // Kairon built each guest's seed when it created the runtime: the bootstrap data is gone
    // from every Kairon Machine (control plane included), the hostname kept.
    for name in &names {
        rig.wait(
            &format!("Kairon Machine {name}: a runtime and no bootstrap data left"),
            Duration::from_secs(60),
            || async {
                let vm = rig.vms().get(name).await?;
                Ok::<_, kube::Error>(runtime(&vm).is_some() && !holds_bootstrap_data(&vm))
            },
        )
        .await;
        let vm = rig.vms().get(name).await.unwrap();
        assert_eq!(
            vm.spec.cloud_init.as_ref().map(|c| c.hostname.as_str()),
            Some(name.as_str())
        );
    }

    let vm_uid = rig.vms().get(&stopped).await.unwrap().uid();
    let machine_uid = rig.machines().get(&stopped).await.unwrap().uid();
    let set_power = |state: &'static str| {
        let (vms, worker) = (rig.vms(), stopped.clone());
        async move {
            vms.patch(
                &worker,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"powerState": state}})),
            )
            .await
            .unwrap_or_else(|e| panic!("powerState {state}: {e}"));
        }
    };
    let says_stopped = |said: &'static str| {
        let (kms, worker) = (rig.kms(), stopped.clone());
        async move {
            let km = kms.get(&worker).await?;
            Ok::<_, kube::Error>(
                km_instance(&km).is_some_and(|(r, m)| r == reason::INSTANCE_STOPPED && m.ends_with(said)),
            )
        }
    };

    // Paused and Halted keep the runtime (and so the disk the guest was bootstrapped on).
    for (state, said) in [("Paused", "is paused"), ("Halted", "is halted")] {
        let before = runtime(&rig.vms().get(&stopped).await.unwrap());
        set_power(state).await;
        rig.wait(&format!("{state}: the KaironMachine says so"), UP, || {
            says_stopped(said)
        })
        .await;
        if state == "Halted" {
            // The guest's Node removed while it is off: its kubelet, configured on the kept
            // disk, registers it again when it runs.
            delete_node(&rig, &stopped).await;
        }
        let km = rig.kms().get(&stopped).await.unwrap();
        assert!(
            km.status.as_ref().unwrap().is_provisioned(),
            "{state}: provisioned stays true"
        );
        set_power("Running").await;
        rig.wait(&format!("{state} -> Running: provisioned again"), UP, || async {
            let km = rig.kms().get(&stopped).await?;
            Ok::<_, kube::Error>(km_instance(&km).is_some_and(|(r, _)| r == reason::PROVISIONED))
        })
        .await;
        let vm = rig.vms().get(&stopped).await.unwrap();
        assert_eq!(runtime(&vm), before, "{state}: the same runtime");
        assert_eq!(vm.uid(), vm_uid, "{state}: the same Kairon Machine");
        assert_eq!(rig.machines().get(&stopped).await.unwrap().uid(), machine_uid);
        if state == "Halted" {
            rig.wait(
                "Halted -> Running: the guest's kubelet registers its Node again",
                UP,
                || async { Ok::<_, kube::Error>(node_of(&rig, &stopped).await?.is_some()) },
            )
            .await;
        }
    }

    // Stopped deletes the runtime and its disk; Running makes a new one on a fresh disk.
    let bootstrapped = runtime(&rig.vms().get(&stopped).await.unwrap());
    set_power("Stopped").await;
    rig.wait("Stopped: the KaironMachine says so", UP, || says_stopped("is stopped"))
        .await;
    delete_node(&rig, &stopped).await;
    set_power("Running").await;
    // A cold migration (no strategy: Kairon's `auto`, taken as cold) of the other worker.
    let mm: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineMigration",
        "metadata": {"name": "cold", "namespace": rig.ns},
        "spec": {"machineName": moved},
    }))
    .unwrap();
    let migrations = api(&rig, "kairon.zyvor.dev", "v1alpha1", "MachineMigration");
    let moved_runtime = runtime(&rig.vms().get(&moved).await.unwrap());
    migrations
        .create(&PostParams::default(), &mm)
        .await
        .unwrap_or_else(|e| rig.fail(format!("MachineMigration: {e}")));

    for name in [&stopped, &moved] {
        rig.wait(
            &format!("{name}: running again, the KaironMachine says its VM is a new machine"),
            UP,
            || async {
                let km = rig.kms().get(name).await?;
                let vm = rig.vms().get(name).await?;
                Ok::<_, kube::Error>(
                    km_instance(&km).is_some_and(|(r, _)| r == reason::INSTANCE_RECREATED)
                        && vm.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
                )
            },
        )
        .await;
        let km = rig.kms().get(name).await.unwrap();
        let conds = km
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let ready = conditions::get(conds, READY).expect("Ready");
        assert_eq!(ready.status, "False", "{name}: not Ready: {ready:?}");
        assert_eq!(ready.reason, reason::INSTANCE_RECREATED);
        let vm = rig.vms().get(name).await.unwrap();
        assert!(!holds_bootstrap_data(&vm), "{name}: no bootstrap data came back");
    }
    // The fresh disk booted without bootstrap data: no kubeadm, no kubelet, no Node.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        node_of(&rig, &stopped).await.unwrap().map(|n| n.name_any()),
        None,
        "a guest on a fresh disk without bootstrap data registers no Node"
    );
    assert_ne!(runtime(&rig.vms().get(&stopped).await.unwrap()), bootstrapped);
    assert_ne!(runtime(&rig.vms().get(&moved).await.unwrap()), moved_runtime);
    let mig = migrations.get("cold").await.unwrap();
    assert_eq!(mig.data["status"]["phase"], "Succeeded");
    assert_eq!(mig.data["status"]["effectiveStrategy"], "cold");

    // A Warning each time the bootstrapped VM stopped running, saying how.
    let events: Api<Event> = Api::namespaced(rig.env.client(), &rig.ns);
    let mut notes: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("InstanceNotRunning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(stopped.as_str())
        })
        .filter_map(|e| e.note)
        .collect();
    notes.sort();
    let want: Vec<String> = ["halted", "paused", "stopped"]
        .iter()
        .map(|how| format!("InstanceStopped: Kairon Machine {stopped} is {how}"))
        .collect();
    assert_eq!(notes, want);

    // A MachineHealthCheck replaces both: new Machines, new VMs, the old ones deleted.
    let mhc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck",
        "metadata": {"name": "workers", "namespace": rig.ns},
        "spec": {
            "clusterName": rig.cluster,
            "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": format!("{}-md-0", rig.cluster)}},
            "checks": {"unhealthyMachineConditions": [
                {"type": "InfrastructureReady", "status": "False", "timeoutSeconds": 5},
            ]},
        },
    }))
    .unwrap();
    api(&rig, "cluster.x-k8s.io", "v1beta2", "MachineHealthCheck")
        .create(&PostParams::default(), &mhc)
        .await
        .unwrap_or_else(|e| rig.fail(format!("MachineHealthCheck: {e}")));
    rig.wait("both workers replaced by new Machines", UP, || async {
        let list = rig.machines().list(&ListParams::default()).await?;
        let now: Vec<String> = list.items.iter().map(|m| m.name_any()).collect();
        let vms = rig.vms().list(&ListParams::default()).await?;
        Ok::<_, kube::Error>(
            !now.contains(&stopped)
                && !now.contains(&moved)
                && !vms
                    .items
                    .iter()
                    .any(|v| v.name_any() == stopped || v.name_any() == moved),
        )
    })
    .await;
    let after = rig.wait_running(3, UP).await;
    assert!(after.iter().all(|m| m.name_any() != stopped && m.name_any() != moved));
    rig.assert_one_vm_per_kaironmachine().await;
}
