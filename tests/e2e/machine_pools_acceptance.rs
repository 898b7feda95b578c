//! A MachinePool's whole life on the real control plane (issue 27's acceptance): 0 → 20 → 5
//! with Nodes, the Machines CAPI chose removed and each drained before its VM goes; a VM failed
//! through the simulator replaced; a new image rolling every VM; the Cluster deleted leaving
//! nothing on Kairon.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use super::machine_pools::{
    UP, kmps, mark_for_deletion_held, member_revisions, pool_machines, pool_members, release_pre_drain_hook,
    rig_with_pool, scale_pool, wait_pool_running,
};
use crate::common::Rig;
use capkr_testenv::cluster::pool_selector;

/// The image the pool rolls onto: another OS, the same Kubernetes version (the simulator's
/// kubelet takes its version from the image name).
const NEW_IMAGE: &str = "ubuntu-2204-kube-v1.36.3";

/// When the test first saw something happen to an object, by name.
pub(crate) type Seen = Arc<Mutex<BTreeMap<String, Instant>>>;

/// Watches `api` in the background and records, per object name, when `happened` was first
/// true of it (a watch sees every change, so a short-lived state is not missed as a poll
/// could miss it); a deletion counts as `happened` for `on_delete`.
pub(crate) fn record_first<K>(api: Api<K>, lp: watcher::Config, on_delete: bool, happened: fn(&K) -> bool) -> Seen
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let seen: Seen = Arc::default();
    let out = seen.clone();
    tokio::spawn(async move {
        // With a backoff an error (the workload API server gone when the rig is dropped) waits
        // before the next try: without it the stream fails at once, again and again, the task
        // never yields, and the runtime's shutdown at the test's end waits for it for ever.
        let mut events = watcher(api, lp).default_backoff().boxed();
        while let Some(event) = events.next().await {
            let (obj, deleted) = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => (o, false),
                Ok(watcher::Event::Delete(o)) => (o, true),
                _ => continue,
            };
            if (deleted && on_delete) || happened(&obj) {
                let mut seen = out.lock().unwrap_or_else(|e| e.into_inner());
                seen.entry(obj.name_any()).or_insert_with(Instant::now);
            }
        }
    });
    seen
}

pub(crate) fn snapshot(seen: &Seen) -> BTreeMap<String, Instant> {
    seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Kairon Machine UIDs of the pool's members, by name.
async fn member_uids(rig: &Rig, pool: &str) -> BTreeMap<String, String> {
    rig.vms()
        .list(&ListParams::default().labels(&pool_selector(pool)))
        .await
        .expect("list members")
        .items
        .into_iter()
        .filter(|vm| vm.metadata.deletion_timestamp.is_none())
        .map(|vm| (vm.name_any(), vm.metadata.uid.clone().unwrap_or_default()))
        .collect()
}

/// 0 → 20 → 5: the fifteen Machines marked `cluster.x-k8s.io/delete-machine` are exactly the
/// ones whose VMs go (the five others keep their Kairon Machine UIDs); held by a pre-drain
/// hook, a chosen Machine keeps its VM; released, its Node is cordoned and its drain starts
/// before its VM is deleted. Then a VM failed through the simulator is replaced (the four
/// others kept), a new image rolls every VM (no old UID left, never fewer than five
/// available, every old VM drained before it goes), and the Cluster deleted leaves no Kairon
/// Machine.
#[tokio::test(flavor = "multi_thread")]
async fn a_pool_0_20_5_removes_capis_choice_drained_first_replaces_a_failed_vm_rolls_a_new_image_and_leaves_nothing() {
    let test_started = Instant::now();
    let (rig, pool) = rig_with_pool("machine_pool_accept", 0, false).await;

    // 0 → 20.
    let started = Instant::now();
    scale_pool(&rig, &pool, 20).await;
    let machines = wait_pool_running(&rig, &pool, 20).await;
    let up_secs = started.elapsed().as_secs_f64();
    let uids = member_uids(&rig, &pool).await;
    assert_eq!(uids.len(), 20, "twenty members: {uids:?}");
    let mut names: Vec<String> = machines.iter().map(|m| m.name_any()).collect();
    names.sort();
    let node_of: BTreeMap<String, String> = machines
        .iter()
        .filter_map(|m| Some((m.name_any(), m.data["status"]["nodeRef"]["name"].as_str()?.to_string())))
        .collect();
    assert_eq!(node_of.len(), 20, "a Node per Machine");

    // CAPI's choice: fifteen Machines, not the oldest nor the newest, marked and held.
    let kept: BTreeSet<String> = names.iter().step_by(4).cloned().collect();
    let chosen: BTreeSet<String> = names.iter().filter(|n| !kept.contains(*n)).cloned().collect();
    assert_eq!((kept.len(), chosen.len()), (5, 15));
    let machine_deleting = record_first(
        rig.machines(),
        watcher::Config::default().labels(&format!("cluster.x-k8s.io/pool-name={pool}")),
        true,
        |m: &DynamicObject| m.metadata.deletion_timestamp.is_some(),
    );
    let drain_started = record_first(
        rig.machines(),
        watcher::Config::default().labels(&format!("cluster.x-k8s.io/pool-name={pool}")),
        false,
        |m: &DynamicObject| m.data["status"]["deletion"]["nodeDrainStartTime"].is_string(),
    );
    let vm_deleted = record_first(
        rig.vms(),
        watcher::Config::default().labels(&pool_selector(&pool)),
        true,
        |vm: &capkr::kairon::Machine| vm.metadata.deletion_timestamp.is_some(),
    );
    let cordoned = record_first(
        Api::<Node>::all(rig.workload().client()),
        watcher::Config::default(),
        false,
        |n: &Node| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true),
    );
    for name in &chosen {
        mark_for_deletion_held(&rig, name).await;
    }
    let started = Instant::now();
    scale_pool(&rig, &pool, 5).await;
    rig.wait("the fifteen chosen Machines deleting", UP, || async {
        // A VM must not go while its Machine is held before its drain.
        let early = snapshot(&vm_deleted);
        if !early.is_empty() {
            rig.fail(format!("VMs deleted before their Machines were drained: {early:?}"));
        }
        let deleting = snapshot(&machine_deleting);
        Ok::<_, kube::Error>(chosen.iter().all(|n| deleting.contains_key(n)).then_some(()))
    })
    .await;
    // Held before their drain: no VM of theirs may go.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let early = snapshot(&vm_deleted);
    assert!(
        early.is_empty(),
        "VMs deleted before their Machines were drained: {early:?}"
    );
    let drained = snapshot(&drain_started);
    assert!(
        drained.is_empty(),
        "drained while the pre-drain hook holds: {drained:?}"
    );
    for name in &chosen {
        release_pre_drain_hook(&rig, name).await;
    }
    rig.wait("the chosen VMs gone, five Machines left", UP, || async {
        let members = member_uids(&rig, &pool).await;
        let machines = pool_machines(&rig, &pool).await;
        let left: BTreeSet<String> = members.keys().cloned().collect();
        Ok::<_, kube::Error>((left == kept && machines.len() == 5).then_some(()))
    })
    .await;
    let down_secs = started.elapsed().as_secs_f64();
    let (deleting, drained, vms_gone, cordons) = (
        snapshot(&machine_deleting),
        snapshot(&drain_started),
        snapshot(&vm_deleted),
        snapshot(&cordoned),
    );
    let touched: BTreeSet<&String> = deleting.keys().chain(vms_gone.keys()).collect();
    let expected: BTreeSet<&String> = chosen.iter().collect();
    assert_eq!(touched, expected, "exactly CAPI's choice went, Machines and VMs");
    for name in &chosen {
        let vm_at = vms_gone[name];
        let drain_at = drained
            .get(name)
            .unwrap_or_else(|| rig.fail(format!("{name}: its drain never started")));
        let cordon_at = cordons
            .get(&node_of[name])
            .unwrap_or_else(|| rig.fail(format!("{name}: its Node {} was never cordoned", node_of[name])));
        assert!(
            *drain_at <= vm_at,
            "{name}: its VM was deleted before its drain started"
        );
        assert!(
            *cordon_at <= vm_at,
            "{name}: its VM was deleted before its Node was cordoned"
        );
    }
    let left = wait_pool_running(&rig, &pool, 5).await;
    let left_uids = member_uids(&rig, &pool).await;
    for name in &kept {
        assert_eq!(left_uids.get(name), uids.get(name), "{name}: the same Kairon Machine");
    }
    assert!(left.iter().all(|m| kept.contains(&m.name_any())));

    // A VM failed through the simulator: replaced, the four others kept.
    let failed = kept.iter().next().cloned().unwrap_or_default();
    let started = Instant::now();
    rig.vms()
        .patch(
            &failed,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"sim.kairon.zyvor.dev/fail": "Broken"}}})),
        )
        .await
        .unwrap();
    let after_failure = rig
        .wait("the failed VM replaced", UP, || async {
            let machines = pool_machines(&rig, &pool).await;
            let up = capkr_testenv::cluster::all_running_with_a_node(&machines, 5);
            let members = member_uids(&rig, &pool).await;
            let done = up && members.len() == 5 && !members.contains_key(&failed);
            Ok::<_, kube::Error>(done.then_some(members))
        })
        .await;
    let replaced_secs = started.elapsed().as_secs_f64();
    for name in kept.iter().filter(|n| **n != failed) {
        assert_eq!(
            after_failure.get(name),
            uids.get(name),
            "{name}: kept through the replacement"
        );
    }

    // A new image: every VM replaced, surge first.
    let old_uids: BTreeSet<String> = after_failure.values().cloned().collect();
    let started = Instant::now();
    kmps(&rig)
        .patch(
            &pool,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"image": {"imageRef": NEW_IMAGE}}}})),
        )
        .await
        .unwrap();
    let mut fewest_available = usize::MAX;
    let deadline = Instant::now() + UP;
    loop {
        let machines = pool_machines(&rig, &pool).await;
        let available = machines
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter(|m| crate::common::condition(m, "Available").is_some_and(|c| c["status"] == "True"))
            .count();
        fewest_available = fewest_available.min(available);
        let vms = pool_members(&rig, &pool).await;
        let members: Vec<_> = vms.values().collect();
        let all_new = members.len() == 5
            && members.iter().all(|vm| {
                vm.spec.image_ref() == Some(NEW_IMAGE)
                    && !old_uids.contains(vm.metadata.uid.as_deref().unwrap_or_default())
            });
        if all_new && capkr_testenv::cluster::all_running_with_a_node(&machines, 5) {
            break;
        }
        if Instant::now() > deadline {
            rig.fail(format!(
                "the pool did not roll onto {NEW_IMAGE}: {:?}",
                members
                    .iter()
                    .map(|vm| (vm.name_any(), vm.spec.image_ref().map(str::to_string)))
                    .collect::<Vec<_>>()
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let rolled_secs = started.elapsed().as_secs_f64();
    assert!(
        fewest_available >= 5,
        "maxUnavailable 0: never fewer than 5 available, saw {fewest_available}"
    );
    // Every old VM went the CAPI way: its Node's drain started before the VM was deleted
    // (neither Kairon nor the pool deleted one undrained).
    let (drained, vms_gone) = (snapshot(&drain_started), snapshot(&vm_deleted));
    for name in after_failure.keys() {
        let vm_at = vms_gone
            .get(name)
            .unwrap_or_else(|| rig.fail(format!("{name}: an old VM not deleted")));
        let drain_at = drained
            .get(name)
            .unwrap_or_else(|| rig.fail(format!("{name}: an old VM deleted without a drain")));
        assert!(*drain_at <= *vm_at, "{name}: deleted before its drain started");
    }
    let revisions = member_revisions(&rig, &pool).await;
    assert_eq!(revisions.len(), 5, "five members: {revisions:?}");
    assert_eq!(
        revisions.values().collect::<BTreeSet<_>>().len(),
        1,
        "all of the new revision: {revisions:?}"
    );
    rig.assert_one_vm_per_kaironmachine().await;

    // The Cluster deleted with its pool: nothing of it is left on Kairon.
    let started = Instant::now();
    rig.clusters()
        .delete(&rig.cluster, &DeleteParams::default())
        .await
        .unwrap();
    rig.wait("the Cluster gone with its pool, no Kairon Machine left", UP, || async {
        let cluster = rig.clusters().get_opt(&rig.cluster).await?;
        let vms = rig.vms().list(&ListParams::default()).await?.items;
        Ok::<_, kube::Error>((cluster.is_none() && vms.is_empty()).then_some(()))
    })
    .await;
    let deleted_secs = started.elapsed().as_secs_f64();
    eprintln!(
        "machine pool acceptance: 0 -> 20 in {up_secs:.1} s, 20 -> 5 in {down_secs:.1} s, a failed VM replaced in \
         {replaced_secs:.1} s, 5 VMs rolled onto a new image in {rolled_secs:.1} s, the cluster deleted in \
         {deleted_secs:.1} s; the whole test {:.1} s",
        test_started.elapsed().as_secs_f64()
    );
}
