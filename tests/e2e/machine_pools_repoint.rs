//! A MachinePool repointed to another KaironMachinePool, with the real CAPI controllers: the
//! new pool takes the members over (they are its MachinePool's), and replaces them only as a
//! rollout does, within `maxUnavailable`, each through its Machine, drained before its Node
//! and its VM go.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;

use super::machine_pools::{UP, kmps, pool_machines, pools, rig_with_pool, wait_pool_running};
use super::machine_pools_acceptance::{record_first, snapshot};
use capkr_testenv::KUBERNETES_VERSION;

/// The pool's Machines that are Available and not being deleted.
fn available(machines: &[DynamicObject]) -> usize {
    machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .filter(|m| crate::common::condition(m, "Available").is_some_and(|c| c["status"] == "True"))
        .count()
}

/// MachinePool `c1-mp-0` of three, repointed from its KaironMachinePool to a new one of another
/// image (`maxSurge` 1, `maxUnavailable` 0): never fewer than three members available, every
/// old member replaced through its Machine, its drain started before its Node and its VM were
/// deleted; the old pool says it is no longer named and touches nothing. (The new pool used to
/// delete every old Machine at once, as vanished, and publish a providerIDList without their
/// Nodes.)
#[tokio::test(flavor = "multi_thread")]
async fn a_repointed_machine_pool_rolls_onto_the_new_pool_within_max_unavailable_drained_first() {
    let (rig, pool) = rig_with_pool("pool_repoint", 3, false).await;
    let before = wait_pool_running(&rig, &pool, 3).await;
    let old: BTreeSet<String> = before.iter().map(|m| m.name_any()).collect();
    let by_pool = || watcher::Config::default().labels(&format!("cluster.x-k8s.io/pool-name={pool}"));
    let drain_started = record_first(rig.machines(), by_pool(), false, |m: &DynamicObject| {
        m.data["status"]["deletion"]["nodeDrainStartTime"].is_string()
    });
    let node_deleted = record_first(
        kube::Api::<Node>::all(rig.workload().client()),
        watcher::Config::default(),
        true,
        |n: &Node| n.metadata.deletion_timestamp.is_some(),
    );
    let vm_deleted = record_first(
        rig.vms(),
        watcher::Config::default(),
        true,
        |vm: &capkr::kairon::Machine| vm.metadata.deletion_timestamp.is_some(),
    );

    let original = kmps(&rig).get(&pool).await.unwrap();
    let mut template = original.data["spec"]["template"].clone();
    template["image"]["imageRef"] = json!(format!("ubuntu-2204-kube-{KUBERNETES_VERSION}"));
    let new_pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironMachinePool",
        "metadata": {"name": "pool-b", "namespace": rig.ns,
                     "labels": {"cluster.x-k8s.io/cluster-name": rig.cluster}},
        "spec": {"template": template},
    }))
    .unwrap();
    kmps(&rig).create(&Default::default(), &new_pool).await.unwrap();
    let started = Instant::now();
    pools(&rig)
        .patch(
            &pool,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"infrastructureRef": {"name": "pool-b"}}}}})),
        )
        .await
        .expect("repoint the MachinePool");

    let mut fewest = usize::MAX;
    let deadline = Instant::now() + UP + UP;
    loop {
        let machines = pool_machines(&rig, &pool).await;
        fewest = fewest.min(available(&machines));
        let names: BTreeSet<String> = machines.iter().map(|m| m.name_any()).collect();
        if names.is_disjoint(&old) && capkr_testenv::cluster::all_running_with_a_node(&machines, 3) {
            break;
        }
        if Instant::now() > deadline {
            rig.fail(format!(
                "the repointed pool did not roll onto pool-b: {names:?}, fewest available {fewest}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rolled_secs = started.elapsed().as_secs_f64();
    let (drained, nodes_gone, vms_gone) = (snapshot(&drain_started), snapshot(&node_deleted), snapshot(&vm_deleted));
    eprintln!(
        "repoint: 3 members rolled onto pool-b in {rolled_secs:.1} s, never fewer than {fewest} available; \
         drains {:?}, Nodes deleted {:?}, VMs deleted {:?}",
        drained.keys().collect::<Vec<_>>(),
        nodes_gone.keys().collect::<Vec<_>>(),
        vms_gone.keys().collect::<Vec<_>>()
    );
    assert!(
        fewest >= 3,
        "maxUnavailable 0: never fewer than 3 available, saw {fewest}"
    );
    for name in &old {
        let drain_at = drained
            .get(name)
            .unwrap_or_else(|| rig.fail(format!("{name}: replaced without a drain")));
        if let Some(node_at) = nodes_gone.get(name) {
            assert!(
                drain_at <= node_at,
                "{name}: its Node was deleted before its drain started"
            );
        }
        let vm_at = vms_gone
            .get(name)
            .unwrap_or_else(|| rig.fail(format!("{name}: its VM was not deleted")));
        assert!(drain_at <= vm_at, "{name}: its VM was deleted before its drain started");
    }
    let members = rig
        .kms()
        .list(&ListParams::default().labels(&format!("cluster.x-k8s.io/pool-name={pool}")))
        .await
        .unwrap()
        .items;
    assert_eq!(members.len(), 3, "three members");
    assert!(
        members.iter().all(
            |k| k.labels().get("infrastructure.cluster.x-k8s.io/kaironmachinepool-name") == Some(&"pool-b".to_string())
        ),
        "every member made by pool-b"
    );
    let old_pool = kmps(&rig).get(&pool).await.unwrap();
    let ready = old_pool.data["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
        .unwrap_or_default();
    assert_eq!(
        ready["reason"], "MachinePoolNamesAnotherPool",
        "the old pool says it is not named: {ready}"
    );
    rig.assert_one_vm_per_kaironmachine().await;
}
