//! KaironMachines left behind without their Cluster, against the real API server and CAPI: what
//! a `clusterctl move` that did not know our kinds leaves on the source (it removes the
//! Cluster and the Machines, and the garbage collector then deletes the KaironMachines the
//! Machines owned). The VMs live on for the moved cluster: the provider keeps them, lets the
//! KaironMachines go, and says so.

use std::time::Duration;

use crate::common::{Rig, RigOptions};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread")]
async fn kaironmachines_deleted_after_their_cluster_is_gone_keep_their_vms() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        ..RigOptions::new("left_behind")
    })
    .await;
    rig.wait_running(2, UP).await;
    let before = rig.vm_map().await;
    assert_eq!(before.len(), 2);

    // As clusterctl move does on the source: paused, finalizers removed, deleted.
    rig.set_paused(true).await;
    let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    rig.clusters()
        .patch(&rig.cluster, &PatchParams::default(), &strip)
        .await
        .unwrap();
    rig.clusters().delete(&rig.cluster, &Default::default()).await.unwrap();
    rig.wait("the Cluster gone", UP, || async {
        Ok::<_, kube::Error>(rig.clusters().get_opt(&rig.cluster).await?.is_none())
    })
    .await;
    for m in rig.machines().list(&ListParams::default()).await.unwrap().items {
        let name = m.name_any();
        let _ = rig.machines().patch(&name, &PatchParams::default(), &strip).await;
        let _ = rig.machines().delete(&name, &Default::default()).await;
    }
    // The garbage collector deletes the KaironMachines the Machines owned.
    rig.wait("every KaironMachine gone", UP, || async {
        Ok::<_, kube::Error>(rig.kms().list(&ListParams::default()).await?.items.is_empty())
    })
    .await;

    // Give a deletion time to start if one were coming, then look.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rig.vm_map().await;
    for (name, vm) in &before {
        let now = after
            .get(name)
            .unwrap_or_else(|| rig.fail(format!("Kairon Machine {name} was deleted")));
        assert_eq!(now.uid(), vm.uid(), "{name}: the same VM");
        assert!(now.metadata.deletion_timestamp.is_none(), "{name}: not being deleted");
    }
    let events: Api<Event> = Api::namespaced(rig.env.client(), &rig.ns);
    let kept = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("InstanceKept") && e.type_.as_deref() == Some("Warning"))
        .count();
    assert_eq!(kept, 2, "one Warning event per KaironMachine");
    let port = crate::common::port_of(&rig.manager, "--metrics-bind-address");
    let metrics = capkr_testenv::http_get(port, "/metrics")
        .await
        .expect("metrics served")
        .body;
    assert!(
        metrics.contains("capkr_kairon_machines_kept_total 2"),
        "the metric counts them: {}",
        metrics
            .lines()
            .filter(|l| l.contains("kept"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
