//! MachinePools with the real CAPI controllers: a KaironMachinePool makes one KaironMachine
//! (and so one CAPI Machine) per member, each of which makes its own plain Kairon Machine with
//! the MachinePool's bootstrap data; no Kairon MachineSet anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::{Rig, RigOptions};
use capkr_testenv::cluster::{machine_image, machine_pool_yaml, pool_selector};
use capkr_testenv::{capi_resource, infrastructure_resource};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

pub(crate) const UP: Duration = Duration::from_secs(180);
/// CAPI waits for this annotation to go before it drains a Machine being deleted.
pub(crate) const PRE_DRAIN_HOOK: &str = "pre-drain.delete.hook.machine.cluster.x-k8s.io/test";

pub(crate) fn pools(rig: &Rig) -> Api<DynamicObject> {
    Api::namespaced_with(rig.env.client(), &rig.ns, &capi_resource("MachinePool", "machinepools"))
}

pub(crate) fn kmps(rig: &Rig) -> Api<DynamicObject> {
    Api::namespaced_with(
        rig.env.client(),
        &rig.ns,
        &infrastructure_resource("KaironMachinePool", "kaironmachinepools"),
    )
}

/// The pool's Machines (label `cluster.x-k8s.io/pool-name`).
pub(crate) async fn pool_machines(rig: &Rig, pool: &str) -> Vec<DynamicObject> {
    let lp = ListParams::default().labels(&format!("cluster.x-k8s.io/pool-name={pool}"));
    rig.machines().list(&lp).await.unwrap().items
}

pub(crate) async fn scale_pool(rig: &Rig, pool: &str, replicas: usize) {
    pools(rig)
        .patch(
            pool,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .expect("scale MachinePool");
}

/// The label of the revision a pool member was made for.
pub(crate) const REVISION_LABEL: &str = "infrastructure.cluster.x-k8s.io/kaironmachinepool-revision";
/// Kairon's label on a member of a Kairon MachineSet.
pub(crate) const KAIRON_MACHINESET_LABEL: &str = "kairon.zyvor.dev/machineset";

/// The revisions of the pool's members (their KaironMachines' label), by member name.
pub(crate) async fn member_revisions(rig: &Rig, pool: &str) -> BTreeMap<String, String> {
    rig.kms()
        .list(&ListParams::default().labels(&pool_selector(pool)))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|km| {
            let r = km.labels().get(REVISION_LABEL).cloned().unwrap_or_default();
            (km.name_any(), r)
        })
        .collect()
}

/// The VMs of the pool's members (the pool's label, from their KaironMachines), by name.
pub(crate) async fn pool_members(rig: &Rig, pool: &str) -> BTreeMap<String, capkr::kairon::Machine> {
    rig.vms()
        .list(&ListParams::default().labels(&pool_selector(pool)))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|vm| (vm.name_any(), vm))
        .collect()
}

/// Waits until the pool has `n` Machines, each Running with a Node, and the MachinePool
/// counts them ready.
pub(crate) async fn wait_pool_running(rig: &Rig, pool: &str, n: usize) -> Vec<DynamicObject> {
    rig.wait(&format!("{n} pool Machines Running with a Node"), UP, || async {
        let machines = pool_machines(rig, pool).await;
        let mp = pools(rig).get(pool).await?;
        let ready = mp.data["status"]["readyReplicas"].as_i64().unwrap_or(0) == n as i64;
        let up = capkr_testenv::cluster::all_running_with_a_node(&machines, n);
        Ok::<_, kube::Error>((up && ready).then_some(machines))
    })
    .await
}

/// Marks Machine `name` as CAPI's choice for the next scale-in (`cluster.x-k8s.io/delete-machine`),
/// with a pre-drain hook that holds it, once deleting, before its drain.
pub(crate) async fn mark_for_deletion_held(rig: &Rig, name: &str) {
    rig.machines()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "cluster.x-k8s.io/delete-machine": "yes",
                PRE_DRAIN_HOOK: "",
            }}})),
        )
        .await
        .expect("mark the Machine");
}

/// Removes the pre-drain hook of Machine `name`: CAPI drains it and goes on with its deletion.
pub(crate) async fn release_pre_drain_hook(rig: &Rig, name: &str) {
    let path = format!("/metadata/annotations/{}", PRE_DRAIN_HOOK.replace('/', "~1"));
    let patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "remove", "path": path}])).expect("a JSON patch");
    rig.machines()
        .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .expect("release the pre-drain hook");
}

/// The VM shape of the test pools.
pub(crate) fn pool_vm_spec(image: &str) -> String {
    format!(
        "  image:\n    imageRef: {image}\n    diskSize: 20Gi\n  resources:\n    cpu: 2\n    memory: 4Gi\n{}",
        capkr_testenv::NETWORK
    )
}

/// A rig (namespace `name`, manager, simulator) whose cluster has its control plane running and
/// a MachinePool `<cluster>-mp-0` of `replicas` on a provisioned KaironMachinePool; returns the
/// rig and the pool's name.
pub(crate) async fn rig_with_pool(name: &'static str, replicas: usize, audit: bool) -> (Rig, String) {
    rig_with_pool_from(
        RigOptions {
            workers: 0,
            audit,
            ..RigOptions::new(name)
        },
        replicas,
    )
    .await
}

/// [`rig_with_pool`] from a rig of the given options (no workers).
pub(crate) async fn rig_with_pool_from(options: RigOptions, replicas: usize) -> (Rig, String) {
    let rig = Rig::start(options).await;
    rig.wait_running(1, UP).await;
    let pool = format!("{}-mp-0", rig.cluster);
    rig.env
        .apply(
            &machine_pool_yaml(&rig.ns, &rig.cluster, replicas, &pool_vm_spec(&machine_image())),
            Some(&rig.ns),
        )
        .await
        .expect("pool objects apply");
    rig.wait("the pool provisioned", UP, || async {
        let kmp = kmps(&rig).get(&pool).await?;
        let ready = kmp.data["status"]["ready"] == true && kmp.data["status"]["initialization"]["provisioned"] == true;
        Ok::<_, kube::Error>(ready.then_some(()))
    })
    .await;
    (rig, pool)
}

/// A pool 0 → 3 → 1: each member a KaironMachine of the pool's revision with a Machine with a
/// Node and a plain Kairon Machine of its own; the two Machines marked
/// `cluster.x-k8s.io/delete-machine` are the ones whose VMs go, each drained before its VM is
/// deleted (held by a pre-drain hook, a Machine being deleted keeps its VM); nothing else is
/// replaced or deleted. Then the pool deleted leaves no member, VM or KaironMachine.
#[tokio::test(flavor = "multi_thread")]
async fn a_pool_scales_0_3_1_removing_the_machines_capi_chose_drained_first_then_deletion_leaves_nothing() {
    let (rig, pool) = rig_with_pool("machine_pool", 0, true).await;

    let started = Instant::now();
    let from = rig.audit_len();
    scale_pool(&rig, &pool, 3).await;
    let machines = wait_pool_running(&rig, &pool, 3).await;
    let up_secs = started.elapsed().as_secs_f64();
    let up_writes = rig.manager_writes(from, None);

    // Steady state: once the last status writes settled, the manager writes nothing.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let from = rig.audit_len();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let writes = rig.manager_writes(from, None);
    assert!(writes.is_empty(), "the manager wrote at steady state: {writes:?}");
    let vms = pool_members(&rig, &pool).await;
    let members: BTreeSet<String> = vms.keys().cloned().collect();
    assert_eq!(members.len(), 3, "three members: {members:?}");
    // The pool creates each member's KaironMachine with its finalizer on: the one patch of it
    // is the providerID (its status is applied).
    for m in &members {
        let at = format!("/kaironmachines/{m}");
        let patches = up_writes
            .iter()
            .filter(|w| w.starts_with("patch ") && w.contains(&at) && !w.contains(&format!("{at}/")))
            .count();
        assert_eq!(
            patches, 1,
            "{m}: its KaironMachine patched {patches} times: {up_writes:#?}"
        );
    }
    for (name, vm) in &vms {
        assert!(
            !vm.labels().contains_key(KAIRON_MACHINESET_LABEL),
            "{name}: a plain Kairon Machine, no MachineSet's"
        );
        assert!(vm.owner_references().is_empty(), "{name}: owned by no Kairon object");
    }
    let revisions = member_revisions(&rig, &pool).await;
    assert_eq!(
        revisions.values().collect::<BTreeSet<_>>().len(),
        1,
        "one revision: {revisions:?}"
    );
    let kmp = kmps(&rig).get(&pool).await.unwrap();
    let mut ids: Vec<String> = members.iter().map(|m| format!("kairon://{m}")).collect();
    ids.sort();
    assert_eq!(kmp.data["spec"]["providerIDList"], json!(ids), "providerIDList");
    assert_eq!(kmp.data["status"]["replicas"], 3);
    assert_eq!(kmp.data["status"]["infrastructureMachineKind"], "KaironMachine");
    for m in &machines {
        assert!(
            members.contains(&m.name_any()),
            "{}: a Machine per member",
            m.name_any()
        );
        let km = rig.kms().get(&m.name_any()).await.unwrap();
        assert_eq!(
            km.spec.provider_id.as_deref(),
            Some(format!("kairon://{}", m.name_any()).as_str())
        );
        assert!(
            km.owner_references()
                .iter()
                .any(|o| o.kind == "Machine" && o.controller == Some(true)),
            "{}: the Machine controls its KaironMachine",
            m.name_any()
        );
    }

    // CAPI's choice: two Machines marked, then the pool scaled to one.
    let chosen: Vec<String> = machines.iter().take(2).map(|m| m.name_any()).collect();
    let kept = machines[2].name_any();
    let kept_uid = vms[&kept].metadata.uid.clone();
    for name in &chosen {
        mark_for_deletion_held(&rig, name).await;
    }
    let started = Instant::now();
    scale_pool(&rig, &pool, 1).await;
    // Held by a pre-drain hook, the chosen Machines are deleting but not drained: their VMs
    // must stay.
    rig.wait("the chosen Machines deleting", UP, || async {
        let mut deleting = 0;
        for name in &chosen {
            if rig.machines().get(name).await?.metadata.deletion_timestamp.is_some() {
                deleting += 1;
            }
        }
        Ok::<_, kube::Error>((deleting == chosen.len()).then_some(()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in &chosen {
        let m = rig.machines().get(name).await.unwrap();
        assert!(
            m.data["status"]["deletion"]["nodeDrainStartTime"].is_null(),
            "{name}: held before its drain"
        );
        let vm = rig.vms().get(name).await.unwrap();
        assert!(
            vm.metadata.deletion_timestamp.is_none(),
            "{name}: its VM is kept while the Machine is not drained"
        );
    }
    assert_eq!(pool_machines(&rig, &pool).await.len(), 3, "no other Machine chosen");
    for name in &chosen {
        release_pre_drain_hook(&rig, name).await;
    }
    // Watch each chosen Machine's drain start and its VM's deletion.
    let mut drained: BTreeMap<String, String> = BTreeMap::new();
    let mut vm_deleted: BTreeMap<String, String> = BTreeMap::new();
    let deadline = Instant::now() + UP;
    loop {
        for name in &chosen {
            if let Some(m) = rig.machines().get_opt(name).await.unwrap()
                && let Some(t) = m.data["status"]["deletion"]["nodeDrainStartTime"].as_str()
            {
                drained.entry(name.clone()).or_insert_with(|| t.to_string());
            }
            match rig.vms().get_opt(name).await.unwrap() {
                Some(vm) => {
                    if let Some(t) = &vm.metadata.deletion_timestamp {
                        vm_deleted.entry(name.clone()).or_insert_with(|| t.0.to_string());
                    }
                }
                None => {
                    vm_deleted.entry(name.clone()).or_insert_with(|| "gone".into());
                }
            }
        }
        if vm_deleted.len() == chosen.len() && pool_machines(&rig, &pool).await.len() == 1 {
            break;
        }
        if Instant::now() > deadline {
            rig.fail(format!(
                "the chosen VMs were not deleted in time: drained {drained:?}, VMs deleted {vm_deleted:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let down_secs = started.elapsed().as_secs_f64();
    for name in &chosen {
        let drain = drained
            .get(name)
            .unwrap_or_else(|| rig.fail(format!("{name}: no drain seen before its Machine went")));
        let deleted = &vm_deleted[name];
        assert!(
            deleted == "gone" || drain.as_str() <= deleted.as_str(),
            "{name}: drained at {drain}, VM deleted at {deleted}"
        );
    }
    let left = wait_pool_running(&rig, &pool, 1).await;
    assert_eq!(left[0].name_any(), kept, "the unmarked Machine stays");
    // Long enough for anything to replace a member or pick one of its own.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let vms = pool_members(&rig, &pool).await;
    let members: Vec<&String> = vms.keys().collect();
    assert_eq!(members, [&kept], "no VM replaced, the kept one untouched");
    assert_eq!(vms[&kept].metadata.uid, kept_uid);
    assert!(vms[&kept].metadata.deletion_timestamp.is_none());

    // The pool deleted: nothing of it is left on Kairon.
    let started = Instant::now();
    pools(&rig).delete(&pool, &DeleteParams::default()).await.unwrap();
    rig.wait("no KaironMachinePool, member VM or KaironMachine left", UP, || async {
        let kmp = kmps(&rig).get_opt(&pool).await?;
        let members = pool_members(&rig, &pool).await;
        let kms: Vec<_> = rig
            .kms()
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|km| {
                km.labels()
                    .contains_key("infrastructure.cluster.x-k8s.io/kaironmachinepool-name")
            })
            .collect();
        Ok::<_, kube::Error>((kmp.is_none() && members.is_empty() && kms.is_empty()).then_some(()))
    })
    .await;
    let delete_secs = started.elapsed().as_secs_f64();
    eprintln!(
        "machine pool: the manager's writes from 0 to 3 ({}): {up_writes:#?}",
        up_writes.len()
    );
    eprintln!(
        "machine pool: 0 -> 3 in {up_secs:.1} s, 3 -> 1 in {down_secs:.1} s (drain started {drained:?}, VMs deleted {vm_deleted:?}), deleted in {delete_secs:.1} s"
    );
    rig.assert_one_vm_per_kaironmachine().await;
}

/// The pool's Machines that are Available and not being deleted.
pub(crate) async fn available(rig: &Rig, pool: &str) -> usize {
    pool_machines(rig, pool)
        .await
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .filter(|m| crate::common::condition(m, "Available").is_some_and(|c| c["status"] == "True"))
        .count()
}

/// A MachinePool annotated `cluster.x-k8s.io/replicas-managed-by`, scaled as CAPI's
/// cluster-autoscaler scales one (through the MachinePool's scale subresource, marking the
/// Machine it removes): Kairon has no autoscaler, so the pool follows the MachinePool, removes
/// exactly the marked Machine and never writes the MachinePool's size. A new image then rolls
/// it with never fewer than 2 of 3 available (sampled) and ends with 3 new VMs. (Before, the
/// size was the Kairon MachineSet's, every deletion lowered it, and a rollout's floor sank with
/// it: 3 → 2 → 1 → 0.)
#[tokio::test(flavor = "multi_thread")]
async fn an_autoscaled_pool_follows_its_machine_pool_and_rolls_without_sinking() {
    let (rig, pool) = rig_with_pool("machine_pool_autoscaled", 1, true).await;
    wait_pool_running(&rig, &pool, 1).await;
    pools(&rig)
        .patch(
            &pool,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "cluster.x-k8s.io/replicas-managed-by": "external-autoscaler",
            }}})),
        )
        .await
        .expect("annotate the MachinePool");
    let autoscale = |replicas: i32| {
        let pools = pools(&rig);
        let pool = pool.clone();
        async move {
            pools
                .patch_subresource(
                    "scale",
                    &pool,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": replicas}})),
                )
                .await
                .expect("the autoscaler scales the MachinePool")
        }
    };
    let from = rig.audit_len();
    let started = Instant::now();
    autoscale(3).await;
    let machines = wait_pool_running(&rig, &pool, 3).await;
    let up_secs = started.elapsed().as_secs_f64();

    let chosen = machines[1].name_any();
    rig.machines()
        .patch(
            &chosen,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"cluster.x-k8s.io/delete-machine": "yes"}}})),
        )
        .await
        .expect("the autoscaler marks its choice");
    let started = Instant::now();
    autoscale(2).await;
    let left = wait_pool_running(&rig, &pool, 2).await;
    let down_secs = started.elapsed().as_secs_f64();
    let left: BTreeSet<String> = left.iter().map(|m| m.name_any()).collect();
    let expected: BTreeSet<String> = machines.iter().map(|m| m.name_any()).filter(|n| *n != chosen).collect();
    assert_eq!(left, expected, "exactly the autoscaler's choice went");
    let mp_writes: Vec<String> = rig
        .manager_writes(from, None)
        .into_iter()
        .filter(|w| w.contains("/machinepools/"))
        .collect();
    assert!(mp_writes.is_empty(), "the manager wrote the MachinePool: {mp_writes:?}");

    // Back to 3, then a new image.
    autoscale(3).await;
    let before = wait_pool_running(&rig, &pool, 3).await;
    let old: BTreeSet<String> = before.iter().map(|m| m.name_any()).collect();
    let started = Instant::now();
    kmps(&rig)
        .patch(
            &pool,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"image": {"imageRef": "ubuntu-2204-kube-v1.36.3"}}}})),
        )
        .await
        .unwrap();
    let mut fewest = usize::MAX;
    let deadline = Instant::now() + UP + UP;
    loop {
        fewest = fewest.min(available(&rig, &pool).await);
        let machines = pool_machines(&rig, &pool).await;
        let names: BTreeSet<String> = machines.iter().map(|m| m.name_any()).collect();
        if names.is_disjoint(&old) && capkr_testenv::cluster::all_running_with_a_node(&machines, 3) {
            break;
        }
        if Instant::now() > deadline {
            rig.fail(format!(
                "the autoscaled pool did not roll: {names:?}, fewest available {fewest}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let rolled_secs = started.elapsed().as_secs_f64();
    assert!(fewest >= 2, "never fewer than 2 of 3 available: saw {fewest}");
    let mp = pools(&rig).get(&pool).await.unwrap();
    assert_eq!(mp.data["spec"]["replicas"], 3, "the size is still the autoscaler's");
    eprintln!(
        "machine pool autoscaled: 1 -> 3 in {up_secs:.1} s, 3 -> 2 (its choice) in {down_secs:.1} s, \
         3 VMs rolled in {rolled_secs:.1} s, never fewer than {fewest} available"
    );
}

/// CABPK rotates a pool's join token inside the same bootstrap Secret. A rotation touches no
/// VM and rolls nothing: the members keep their UID and spec, their revision stays, and the
/// member made after it is of the same revision (its KaironMachine reads the Secret as it is
/// then).
#[tokio::test(flavor = "multi_thread")]
async fn a_bootstrap_token_rotation_changes_no_vm_and_rolls_nothing() {
    use k8s_openapi::api::core::v1::Secret;

    let (rig, pool) = rig_with_pool("machine_pool_rotation", 2, false).await;
    wait_pool_running(&rig, &pool, 2).await;
    let before = pool_members(&rig, &pool).await;
    let revisions_before = member_revisions(&rig, &pool).await;

    // The rotation: the same Secret, new content (kept a valid kubeadm cloud-config: a comment
    // is added, which the guest ignores and the digest does not).
    let mp = pools(&rig).get(&pool).await.unwrap();
    let secret_name = mp.data["spec"]["template"]["spec"]["bootstrap"]["dataSecretName"]
        .as_str()
        .expect("the bootstrap Secret")
        .to_string();
    let secrets: Api<Secret> = Api::namespaced(rig.env.client(), &rig.ns);
    let secret = secrets.get(&secret_name).await.unwrap();
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .expect("bootstrap data")
        .0
        .clone();
    let mut rotated = String::from_utf8(value).expect("text");
    rotated.push_str("\n# token rotated\n");
    secrets
        .patch(
            &secret_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": k8s_openapi::ByteString(rotated.into_bytes())}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        member_revisions(&rig, &pool).await,
        revisions_before,
        "the same members, of the same revision"
    );
    let after = pool_members(&rig, &pool).await;
    for (name, vm) in &before {
        let now = after
            .get(name)
            .unwrap_or_else(|| rig.fail(format!("{name}: gone after the rotation")));
        assert_eq!(now.metadata.uid, vm.metadata.uid, "{name}: the same VM");
        assert_eq!(now.spec, vm.spec, "{name}: its spec untouched");
    }

    scale_pool(&rig, &pool, 3).await;
    wait_pool_running(&rig, &pool, 3).await;
    let now = pool_members(&rig, &pool).await;
    let new: Vec<&capkr::kairon::Machine> = now.values().filter(|vm| !before.contains_key(&vm.name_any())).collect();
    assert_eq!(new.len(), 1, "one new VM, the others kept");
    let revisions = member_revisions(&rig, &pool).await;
    assert_eq!(
        revisions.values().collect::<BTreeSet<_>>(),
        revisions_before.values().collect::<BTreeSet<_>>(),
        "the new member is of the same revision: {revisions:?}"
    );
}

/// A pool's deletion removes its own instances and nothing else: a KaironMachine labelled for
/// the pool but owned by a Machine that is not the pool's (here the cluster's control plane: a
/// label, like an ownerReference, can be copied onto anything) is left alone, and that Machine
/// above all. (The deletion used to delete whatever Machine such a KaironMachine's
/// ownerReference named.)
#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_pool_deletes_no_machine_but_its_own() {
    use capkr::api::KaironMachine;
    use kube::api::PostParams;

    let (rig, pool) = rig_with_pool("pool_delete_own", 1, false).await;
    wait_pool_running(&rig, &pool, 1).await;
    let cp = rig
        .machines()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|m| m.labels().contains_key("cluster.x-k8s.io/control-plane"))
        .expect("the control-plane Machine");
    let (cp_name, cp_uid) = (cp.name_any(), cp.uid().unwrap());
    let mut rogue = KaironMachine::new("rogue", crate::common::km_spec());
    rogue.metadata.labels = Some(
        [
            (
                "infrastructure.cluster.x-k8s.io/kaironmachinepool-name".to_string(),
                pool.clone(),
            ),
            ("cluster.x-k8s.io/pool-name".to_string(), pool.clone()),
            ("cluster.x-k8s.io/cluster-name".to_string(), rig.cluster.clone()),
        ]
        .into(),
    );
    rogue.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Machine".into(),
        name: cp_name.clone(),
        uid: cp_uid.clone(),
        ..Default::default()
    }]);
    rig.kms().create(&PostParams::default(), &rogue).await.unwrap();

    pools(&rig).delete(&pool, &DeleteParams::default()).await.unwrap();
    rig.wait("the pool and its members gone", UP, || async {
        let kmp = kmps(&rig).get_opt(&pool).await?;
        let members = pool_members(&rig, &pool).await;
        Ok::<_, kube::Error>((kmp.is_none() && members.is_empty()).then_some(()))
    })
    .await;
    let cp = rig
        .machines()
        .get(&cp_name)
        .await
        .expect("the control-plane Machine is still there");
    assert_eq!(cp.uid().as_deref(), Some(cp_uid.as_str()), "the very same Machine");
    assert!(cp.metadata.deletion_timestamp.is_none(), "and not being deleted");
    let rogue = rig
        .kms()
        .get("rogue")
        .await
        .expect("the copied KaironMachine is left alone");
    assert!(rogue.metadata.deletion_timestamp.is_none());
}

/// A KaironMachinePool acts only for a MachinePool that names it: a second KaironMachinePool
/// owned by the same MachinePool (a copy that kept the ownerReference, or the one a MachinePool
/// was repointed away from) says so in `Ready` and makes no member, and the pool the
/// MachinePool names keeps its VMs.
#[tokio::test(flavor = "multi_thread")]
async fn a_pool_acts_only_for_a_machine_pool_that_names_it() {
    let (rig, pool) = rig_with_pool("pool_named", 1, false).await;
    let before = wait_pool_running(&rig, &pool, 1).await;
    let before: BTreeSet<String> = before.iter().map(|m| m.uid().unwrap_or_default()).collect();
    let mp = pools(&rig).get(&pool).await.unwrap();
    let original = kmps(&rig).get(&pool).await.unwrap();
    let copy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironMachinePool",
        "metadata": {
            "name": "copy", "namespace": rig.ns,
            "labels": {"cluster.x-k8s.io/cluster-name": rig.cluster},
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
                                 "name": pool, "uid": mp.uid().unwrap()}],
        },
        "spec": {"template": original.data["spec"]["template"].clone()},
    }))
    .unwrap();
    kmps(&rig).create(&Default::default(), &copy).await.unwrap();
    let message = rig
        .wait("the copy says its MachinePool names another", UP, || async {
            let copy = kmps(&rig).get("copy").await?;
            let ready = copy.data["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned());
            Ok::<_, kube::Error>(
                ready
                    .filter(|c| c["status"] == "False" && c["reason"] == "MachinePoolNamesAnotherPool")
                    .map(|c| c["message"].as_str().unwrap_or_default().to_string()),
            )
        })
        .await;
    assert!(message.contains(&format!("KaironMachinePool {pool}")), "{message}");
    // It touches nothing, for as long as it is there.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let copies: Vec<_> = rig
        .kms()
        .list(&ListParams::default().labels(&pool_selector("copy")))
        .await
        .unwrap()
        .items;
    assert!(copies.is_empty(), "no member made by the copy");
    let after = wait_pool_running(&rig, &pool, 1).await;
    let after: BTreeSet<String> = after.iter().map(|m| m.uid().unwrap_or_default()).collect();
    assert_eq!(after, before, "the named pool's Machines are kept");
}

/// A pool scaled to 0, then its Cluster deleted (what CAPI's MachinePool spec does last): the
/// MachinePool and the KaironMachinePool go.
#[tokio::test(flavor = "multi_thread")]
async fn a_pool_scaled_to_0_goes_with_its_cluster() {
    let (rig, pool) = rig_with_pool("machine_pool_zero", 1, false).await;
    wait_pool_running(&rig, &pool, 1).await;
    scale_pool(&rig, &pool, 0).await;
    rig.wait("the pool at 0", UP, || async {
        let machines = pool_machines(&rig, &pool).await;
        let members = pool_members(&rig, &pool).await;
        Ok::<_, kube::Error>((machines.is_empty() && members.is_empty()).then_some(()))
    })
    .await;
    let started = Instant::now();
    rig.clusters()
        .delete(&rig.cluster, &DeleteParams::default())
        .await
        .unwrap();
    rig.wait("the Cluster and its pool gone", UP, || async {
        let cluster = rig.clusters().get_opt(&rig.cluster).await?;
        let kmp = kmps(&rig).get_opt(&pool).await?;
        Ok::<_, kube::Error>((cluster.is_none() && kmp.is_none()).then_some(()))
    })
    .await;
    eprintln!(
        "machine pool at 0: deleted with its Cluster in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// A pool whose VMs keep failing (each new member's runtime fails as soon as it runs, as with
/// a bad image) replaces them ever more slowly: the first at once, then after 10 s, 20 s, …
/// (issue 40, finding 4), not create, fail, delete without end.
#[tokio::test(flavor = "multi_thread")]
async fn a_pool_whose_vms_keep_failing_replaces_them_ever_more_slowly() {
    let (rig, pool) = rig_with_pool("e2e_pool_backoff", 1, false).await;
    wait_pool_running(&rig, &pool, 1).await;
    let vms = rig.vms();
    let fail = json!({"metadata": {"annotations": {"sim.kairon.zyvor.dev/fail": "BadImage"}}});
    let started = Instant::now();
    // When each member was made to fail, by UID.
    let mut failed: BTreeMap<String, f64> = BTreeMap::new();
    while started.elapsed() < Duration::from_secs(75) {
        for (name, vm) in pool_members(&rig, &pool).await {
            let uid = vm.metadata.uid.clone().unwrap_or_default();
            let running = vm.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if running && vm.metadata.deletion_timestamp.is_none() && !failed.contains_key(&uid) {
                vms.patch(&name, &PatchParams::default(), &Patch::Merge(&fail))
                    .await
                    .unwrap_or_else(|e| rig.fail(format!("failing {name}: {e}")));
                failed.insert(uid, started.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut at: Vec<f64> = failed.into_values().collect();
    at.sort_by(f64::total_cmp);
    let gaps: Vec<f64> = at.windows(2).map(|w| w[1] - w[0]).collect();
    eprintln!("pool VMs failed at {at:.1?} s (gaps {gaps:.1?})");
    assert!(at.len() >= 3, "the failed VMs were replaced: {at:.1?}");
    assert!(
        at.len() <= 6,
        "replacing failed VMs backs off: {} failed VMs in 75 s ({at:.1?})",
        at.len()
    );
    assert!(
        gaps.last().is_some_and(|g| *g >= 15.0),
        "each replacement waits longer than the one before: gaps {gaps:.1?}"
    );
    let events = rig.env.client();
    let warned = Api::<k8s_openapi::api::events::v1::Event>::namespaced(events, &rig.ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .any(|e| e.reason.as_deref() == Some("BrokenReplacementsBackOff"));
    assert!(warned, "a Warning says the pool backs off");
}
