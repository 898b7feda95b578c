//! A Kairon host that stops answering, against the real control plane. Kairon's hosts are the
//! Nodes of its cluster (`kairon-sim --host-objects`); the test names its own and turns one's
//! `Ready` condition False, as the node's kubelet going silent would (the environment runs no
//! node lifecycle controller, so nothing else writes it).
//!
//! - Kairon (the simulator, as `internal/controller/fencing.go`) sets `NodeUnreachable=True` on
//!   the worker's Kairon Machine and leaves its phase Running; the KaironMachine says
//!   `InstanceHostUnreachable`, naming the node and `kaironctl fence`, with one Warning event.
//! - The worker's Machine deleted: kairon-node on the dead node never removes its finalizer,
//!   so the Kairon Machine stays; past `--kairon-deletion-grace-period` the KaironMachine says
//!   `InstanceDeletionStuck`, naming the finalizer. The node back, the deletion finishes.
//! - An operator fences a Machine (`kairon-sim fence`, as `kaironctl fence`): refused while
//!   its node is Ready; once the node is dead, Kairon places it anew on a Ready node; the KaironMachine says `InstanceFenced` meanwhile and is
//!   provisioned again once the new VM runs.

use std::time::Duration;

use crate::common::{Rig, RigOptions};
use capkr::api::KaironMachine;
use capkr::api::conditions::{self, INSTANCE_PROVISIONED, READY, reason};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);
/// One simulator pass and one reconcile, under load.
const SEEN: Duration = Duration::from_secs(45);

/// Two Nodes of the test's own (Nodes are cluster-scoped and the rigs share the API server).
fn own_nodes(ns: &str) -> Vec<String> {
    vec!["--host-objects".into(), "--hosts".into(), format!("{ns}-h1,{ns}-h2")]
}

fn nodes(rig: &Rig) -> Api<Node> {
    Api::all(rig.env.client())
}

/// Sets Kairon's Node `name` Ready or not, as its kubelet reporting (or not) would.
async fn set_node_ready(rig: &Rig, name: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": status,
        "reason": if ready { "KubeletReady" } else { "NodeStatusUnknown" },
        "message": "set by the test", "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
    nodes(rig)
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap_or_else(|e| rig.fail(format!("Node {name} Ready={status}: {e}")));
}

async fn remove_nodes(rig: &Rig) {
    for i in 1..=2 {
        let _ = nodes(rig)
            .delete(&format!("{}-h{i}", rig.ns), &DeleteParams::default())
            .await;
    }
}

fn instance(km: &KaironMachine) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conditions::get(km.status.as_ref()?.conditions.as_deref()?, INSTANCE_PROVISIONED)
}

fn host(km: &KaironMachine) -> Option<String> {
    km.status.as_ref()?.instance.as_ref()?.host.clone()
}

/// Our Warning events on KaironMachine `km` with `reason`.
async fn warnings(rig: &Rig, km: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(rig.env.client(), &rig.ns);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(km)
        })
        .collect()
}

/// The Kairon Machine's condition `type_`, as Kairon wrote it.
async fn vm_condition(rig: &Rig, name: &str, type_: &str) -> Option<(String, String)> {
    let vm = rig.vms().get_opt(name).await.ok()??;
    let c = vm.status?.conditions?.into_iter().find(|c| c.type_ == type_)?;
    Some((c.status, c.reason))
}

/// Runs `kairon-sim fence` on Kairon Machine `name`: its output, or why it refused.
async fn fence(rig: &Rig, name: &str) -> Result<String, String> {
    let bin = capkr_testenv::own_binary("kairon-sim", "KAIRON_SIM_BIN").expect("kairon-sim");
    let out = tokio::process::Command::new(bin)
        .arg("--kubeconfig")
        .arg(rig.env.kubeconfig_path())
        .args(["fence", name, "--namespace", &rig.ns, "--reason", "powered off"])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("running kairon-sim fence");
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// The worker's KaironMachine name (the Machine's infrastructureRef: same name).
async fn worker(rig: &Rig) -> (String, String) {
    let up = rig.wait_running(2, UP).await;
    let m = up
        .iter()
        .find(|m| !m.labels().contains_key("cluster.x-k8s.io/control-plane"))
        .expect("a worker Machine");
    let km = m.data["spec"]["infrastructureRef"]["name"]
        .as_str()
        .expect("an infrastructureRef")
        .to_string();
    (m.name_any(), km)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_kairon_node_is_said_and_a_deletion_stuck_on_it_too() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        sim_args: own_nodes("e2e-unreachable-node"),
        manager_args: vec!["--kairon-deletion-grace-period=5s".into()],
        ..RigOptions::new("e2e_unreachable_node")
    })
    .await;
    let (machine, name) = worker(&rig).await;
    let kms = rig.kms();
    let km = kms.get(&name).await.unwrap();
    let node = host(&km).expect("the worker's Kairon node");
    assert_eq!(instance(&km).map(|c| c.status.as_str()), Some("True"));

    set_node_ready(&rig, &node, false).await;
    let km = rig
        .wait(
            "the KaironMachine saying its Kairon node is unreachable",
            SEEN,
            || async {
                let km = kms.get(&name).await?;
                let said = instance(&km).is_some_and(|c| c.reason == reason::INSTANCE_HOST_UNREACHABLE);
                Ok::<_, kube::Error>(said.then_some(km))
            },
        )
        .await;
    let c = instance(&km).unwrap();
    assert_eq!(c.status, "False");
    for said in [node.as_str(), "NodeNotReadyOrMissing", "kaironctl fence"] {
        assert!(c.message.contains(said), "{said}: {}", c.message);
    }
    let ready = conditions::get(km.status.as_ref().unwrap().conditions.as_deref().unwrap(), READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reason::INSTANCE_HOST_UNREACHABLE)
    );
    assert_eq!(
        vm_condition(&rig, &name, "NodeUnreachable").await,
        Some(("True".into(), "NodeNotReadyOrMissing".into()))
    );
    let phase = rig.vms().get(&name).await.unwrap().status.unwrap().phase;
    assert_eq!(phase.as_deref(), Some("Running"), "Kairon leaves the phase");
    let events = rig
        .wait("one Warning InstanceHostUnreachable", SEEN, || async {
            let e = warnings(&rig, &name, "InstanceHostUnreachable").await;
            Ok::<_, kube::Error>((!e.is_empty()).then_some(e))
        })
        .await;
    assert_eq!(events.len(), 1, "one event per transition");

    // The Machine deleted: the Kairon Machine's finalizer is the dead node's to remove.
    rig.machines().delete(&machine, &DeleteParams::default()).await.unwrap();
    rig.wait("the KaironMachine saying its deletion is stuck", SEEN + UP, || async {
        let km = kms.get_opt(&name).await?;
        let stuck = km.as_ref().and_then(instance).is_some_and(|c| {
            c.reason == reason::INSTANCE_DELETION_STUCK && c.message.contains("kairon.zyvor.dev/runtime-cleanup")
        });
        Ok::<_, kube::Error>(stuck.then_some(()))
    })
    .await;
    assert!(rig.vms().get_opt(&name).await.unwrap().is_some(), "the VM is held");
    assert!(!warnings(&rig, &name, "InstanceDeletionStuck").await.is_empty());

    // The node back: kairon-node removes its finalizer, and everything goes.
    set_node_ready(&rig, &node, true).await;
    rig.wait("the KaironMachine gone", UP, || async {
        Ok::<_, kube::Error>(kms.get_opt(&name).await?.is_none().then_some(()))
    })
    .await;
    remove_nodes(&rig).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fenced_machine_is_placed_anew_as_a_new_machine() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        sim_args: own_nodes("e2e-fenced-node"),
        ..RigOptions::new("e2e_fenced_node")
    })
    .await;
    let (_, name) = worker(&rig).await;
    let kms = rig.kms();
    let node = host(&kms.get(&name).await.unwrap()).expect("the worker's Kairon node");
    let refused = fence(&rig, &name)
        .await
        .expect_err("nothing to fence while the node is Ready");
    assert!(refused.contains("NodeUnreachable=True"), "{refused}");
    set_node_ready(&rig, &node, false).await;
    rig.wait("Kairon's NodeUnreachable=True", SEEN, || async {
        let c = vm_condition(&rig, &name, "NodeUnreachable").await;
        Ok::<_, kube::Error>((c.map(|c| c.0).as_deref() == Some("True")).then_some(()))
    })
    .await;

    // `kaironctl fence` (the simulator's), once the node is confirmed gone.
    let said = fence(&rig, &name).await.expect("fenced");
    assert!(said.contains("spec.nodeName cleared"), "{said}");

    // Placed anew, Kairon boots a new runtime on a fresh disk on the other node: the bootstrap
    // data was removed once the first runtime was up, so it is a new machine under the old
    // name, not Ready, for a MachineHealthCheck to replace.
    rig.wait("the KaironMachine on the other node, a new machine", UP, || async {
        let km = kms.get(&name).await?;
        let anew = instance(&km).is_some_and(|c| c.status == "False" && c.reason == reason::INSTANCE_RECREATED)
            && host(&km).is_some_and(|h| h != node);
        Ok::<_, kube::Error>(anew.then_some(()))
    })
    .await;
    assert!(
        !warnings(&rig, &name, "InstanceFenced").await.is_empty(),
        "the fence was said"
    );
    remove_nodes(&rig).await;
}
