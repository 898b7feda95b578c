//! Pause, move-safety and the resilience checks of CAPI's e2e framework, against the real CAPI
//! controllers.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::common::{Rig, RigOptions, km_ready};
use capkr::api::conditions::{self, PAUSED};
use capkr::api::{KaironCluster, KaironMachine};
use capkr::kairon::labels;
use capkr_testenv::Signal;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);

fn paused_status(status: Option<&[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]>) -> Option<String> {
    conditions::get(status?, PAUSED).map(|c| c.status.clone())
}

/// Pause: with `Cluster.spec.paused`, the Paused conditions say so, then nothing of ours
/// is written, and deleting a KaironMachine does not delete its Kairon Machine; unpausing
/// resumes and the deletion completes.
#[tokio::test(flavor = "multi_thread")]
async fn pause_stops_all_writes_and_deletion_until_unpaused() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        audit: true,
        ..RigOptions::new("pause")
    })
    .await;
    let machines = rig.wait_running(2, UP).await;
    rig.set_paused(true).await;
    rig.wait(
        "Paused=True on every KaironMachine and the KaironCluster",
        UP,
        || async {
            let kms = rig.kms().list(&ListParams::default()).await?.items;
            let kc = rig.kcs().get(&rig.cluster).await?;
            let all = kms.iter().all(|k| {
                paused_status(k.status.as_ref().and_then(|s| s.conditions.as_deref())).as_deref() == Some("True")
            }) && paused_status(kc.status.as_ref().and_then(|s| s.conditions.as_deref())).as_deref()
                == Some("True");
            Ok::<_, kube::Error>(all)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let from = rig.audit_len();

    let worker = machines
        .iter()
        .map(|m| m.name_any())
        .find(|n| !n.contains("control-plane"))
        .unwrap();
    rig.kms().delete(&worker, &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let km = rig
        .kms()
        .get(&worker)
        .await
        .expect("the KaironMachine is held by its finalizer");
    assert!(km.metadata.deletion_timestamp.is_some());
    let vm = rig.vms().get(&worker).await.expect("the Kairon Machine still exists");
    assert!(
        vm.metadata.deletion_timestamp.is_none(),
        "no delete was issued while paused"
    );
    let writes = rig.manager_writes(from, None);
    assert!(writes.is_empty(), "the manager wrote while paused: {writes:?}");

    rig.set_paused(false).await;
    rig.wait("the paused deletion to complete after unpausing", UP, || async {
        let km = rig.kms().get_opt(&worker).await?;
        let vm = rig.vms().get_opt(&worker).await?;
        Ok::<_, kube::Error>(km.is_none() && vm.is_none())
    })
    .await;
    let cp = machines
        .iter()
        .map(|m| m.name_any())
        .find(|n| n.contains("control-plane"))
        .unwrap();
    rig.wait("Paused=False again", UP, || async {
        let km = rig.kms().get(&cp).await?;
        Ok::<_, kube::Error>(
            paused_status(km.status.as_ref().and_then(|s| s.conditions.as_deref())).as_deref() == Some("False"),
        )
    })
    .await;
}

/// Move: emulate `clusterctl move` of the infrastructure objects — pause, annotate with
/// delete-for-move, strip finalizers, delete, re-create from spec only (new UIDs, no status).
/// The Kairon Machines survive, are adopted (UID label and providerID), and none is duplicated.
#[tokio::test(flavor = "multi_thread")]
async fn move_keeps_vms_and_the_recreated_objects_adopt_them() {
    let rig = Rig::start(RigOptions {
        workers: 2,
        ..RigOptions::new("move")
    })
    .await;
    rig.wait_running(3, UP).await;
    let before = rig.vm_map().await;
    rig.set_paused(true).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let kms = rig.kms().list(&ListParams::default()).await.unwrap().items;
    let kc = rig.kcs().get(&rig.cluster).await.unwrap();
    let pp = PatchParams::default();
    for km in &kms {
        let name = km.name_any();
        rig.kms()
            .patch(&name, &pp, &Patch::Merge(json!({"metadata": {"annotations": {"clusterctl.cluster.x-k8s.io/delete-for-move": ""}, "finalizers": null}})))
            .await
            .unwrap();
        rig.kms().delete(&name, &DeleteParams::default()).await.unwrap();
    }
    rig.kcs()
        .patch(&rig.cluster, &pp, &Patch::Merge(json!({"metadata": {"annotations": {"clusterctl.cluster.x-k8s.io/delete-for-move": ""}, "finalizers": null}})))
        .await
        .unwrap();
    rig.kcs().delete(&rig.cluster, &DeleteParams::default()).await.unwrap();
    rig.wait("source objects gone", UP, || async {
        Ok::<_, kube::Error>(
            rig.kms().list(&ListParams::default()).await?.items.is_empty()
                && rig.kcs().get_opt(&rig.cluster).await?.is_none(),
        )
    })
    .await;
    assert_eq!(
        rig.vm_map().await.len(),
        before.len(),
        "deleting for move deletes no VM"
    );

    // Re-create as clusterctl does: metadata (labels, annotations, owners) and spec, no status.
    let strip = |meta: &kube::api::ObjectMeta| kube::api::ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        labels: meta.labels.clone(),
        owner_references: meta.owner_references.clone(),
        ..Default::default()
    };
    let mut new_kc = KaironCluster::new(&rig.cluster, kc.spec.clone());
    new_kc.metadata = strip(&kc.metadata);
    rig.kcs().create(&PostParams::default(), &new_kc).await.unwrap();
    let mut new_uids = BTreeSet::new();
    for km in &kms {
        let mut new_km = KaironMachine::new(&km.name_any(), km.spec.clone());
        new_km.metadata = strip(&km.metadata);
        let created = rig.kms().create(&PostParams::default(), &new_km).await.unwrap();
        assert_ne!(
            created.metadata.uid, km.metadata.uid,
            "re-created objects have new UIDs"
        );
        new_uids.insert(created.metadata.uid.unwrap());
    }
    rig.set_paused(false).await;

    rig.wait("re-created KaironMachines Ready on their old VMs", UP, || async {
        let kms = rig.kms().list(&ListParams::default()).await?.items;
        Ok::<_, kube::Error>(
            kms.len() == before.len() && kms.iter().all(|k| km_ready(k).is_some_and(|(s, _)| s == "True")),
        )
    })
    .await;
    rig.wait("KaironCluster provisioned again", UP, || async {
        let kc = rig.kcs().get(&rig.cluster).await?;
        Ok::<_, kube::Error>(kc.status.as_ref().is_some_and(|s| s.is_provisioned()))
    })
    .await;
    let after = rig.vm_map().await;
    assert_eq!(after.len(), before.len(), "no duplicate VM");
    for (name, vm) in &after {
        assert_eq!(vm.metadata.uid, before[name].metadata.uid, "{name}: the same VM");
        let uid_label = vm.labels().get(labels::KAIRONMACHINE_UID).cloned().unwrap_or_default();
        assert!(
            new_uids.contains(&uid_label),
            "{name}: the adoption label names the new KaironMachine"
        );
    }
    rig.assert_one_vm_per_kaironmachine().await;
}

/// Finalizer and owner-reference resilience: CAPI's `ValidateFinalizersResilience` and `ValidateOwnerReferencesResilience`:
/// finalizers and owner references removed from live objects come back.
#[tokio::test(flavor = "multi_thread")]
async fn finalizers_and_owner_references_come_back() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        ..RigOptions::new("resilience")
    })
    .await;
    let machines = rig.wait_running(2, UP).await;
    let pp = PatchParams::default();
    let names: Vec<String> = machines.iter().map(|m| m.name_any()).collect();
    for n in &names {
        rig.kms()
            .patch(
                n,
                &pp,
                &Patch::Merge(json!({"metadata": {"finalizers": null, "ownerReferences": null}})),
            )
            .await
            .unwrap();
    }
    rig.kcs()
        .patch(
            &rig.cluster,
            &pp,
            &Patch::Merge(json!({"metadata": {"finalizers": null, "ownerReferences": null}})),
        )
        .await
        .unwrap();

    rig.wait(
        "finalizers and owner references restored",
        Duration::from_secs(120),
        || async {
            let mut ok = true;
            for n in &names {
                let km = rig.kms().get(n).await?;
                ok &= km.finalizers().iter().any(|f| f == capkr::api::MACHINE_FINALIZER);
                ok &= km
                    .owner_references()
                    .iter()
                    .any(|o| o.kind == "Machine" && o.controller == Some(true));
            }
            let kc = rig.kcs().get(&rig.cluster).await?;
            ok &= kc.finalizers().iter().any(|f| f == capkr::api::CLUSTER_FINALIZER);
            ok &= kc.owner_references().iter().any(|o| o.kind == "Cluster");
            Ok::<_, kube::Error>(ok)
        },
    )
    .await;
    rig.assert_one_vm_per_kaironmachine().await;
}

/// A crash during provisioning: the manager is SIGKILLed at random points while 10 workers provision and
/// restarted each time: in the end every Machine runs, with exactly one Kairon Machine each,
/// and no Kairon Machine is leaked.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_during_provisioning_leaves_no_duplicate_or_leak() {
    let rig = Rig::start(RigOptions {
        workers: 0,
        ..RigOptions::new("sigkill")
    })
    .await;
    rig.wait_running(1, UP).await;
    rig.scale(10).await;
    // A small xorshift seeded from the clock: random kill points, printed for reproduction.
    let mut seed = Instant::now().elapsed().as_nanos() as u64 | 1;
    seed ^= std::process::id() as u64;
    eprintln!("kill-point seed: {seed}");
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut kills = 0;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(150 + next() % 1200)).await;
        rig.manager.kill(Signal::Kill).await.unwrap();
        kills += 1;
        rig.manager.restart().await.unwrap();
        let vms = rig.vm_map().await;
        let kms = rig.kms().list(&ListParams::default()).await.unwrap().items.len();
        assert!(
            vms.len() <= kms,
            "never more Kairon Machines ({}) than KaironMachines ({kms})",
            vms.len()
        );
    }
    eprintln!("killed the manager {kills} times");
    rig.wait_running(11, UP).await;
    assert_eq!(rig.vm_map().await.len(), 11);
    rig.assert_one_vm_per_kaironmachine().await;
}
