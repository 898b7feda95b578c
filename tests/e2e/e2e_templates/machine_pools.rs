//! A MachinePool through the ClusterClass: a Cluster of the shipped `topology-machinepool`
//! flavor has its workers in a MachinePool of the class's pool class `default-worker-pool`.
//! CAPI's topology controller clones the class's KaironMachinePoolTemplate into the pool's
//! KaironMachinePool, the class's patches give it the worker size and the image of the
//! MachinePool's version, and the provider makes one KaironMachine (so one Machine, one Node,
//! one plain Kairon Machine) per member, labelled with the pool's revision.

use std::collections::BTreeSet;
use std::time::Duration;

use capkr::api::{MACHINE_FINALIZER, MACHINE_POOL_FINALIZER};
use capkr_testenv::cluster::pool_selector;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};

use crate::templates_support::*;

pub fn machinepools() -> kube::api::ApiResource {
    capi("MachinePool", "machinepools")
}

pub fn kaironmachinepools() -> kube::api::ApiResource {
    gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1alpha1",
        "KaironMachinePool",
        "kaironmachinepools",
    )
}

/// An owner reference as `(kind, name, uid, controller)`.
fn owners(obj: &DynamicObject) -> BTreeSet<(String, String, String, bool)> {
    obj.owner_references()
        .iter()
        .map(|o| {
            (
                o.kind.clone(),
                o.name.clone(),
                o.uid.clone(),
                o.controller == Some(true),
            )
        })
        .collect()
}

fn owner(kind: &str, obj: &DynamicObject, controller: bool) -> (String, String, String, bool) {
    (kind.to_string(), name(obj), obj.uid().unwrap_or_default(), controller)
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(-1)
}

/// What was seen of the pool once it matched: the revision its members were made for and the
/// pool's VMs (KaironMachine names).
pub struct PoolSeen {
    pub revision: String,
    pub vms: BTreeSet<String>,
}

/// The label of the revision a pool member was made for.
const REVISION_LABEL: &str = "infrastructure.cluster.x-k8s.io/kaironmachinepool-revision";

/// Waits until the cluster's one MachinePool has `replicas` workers of Kubernetes `version`,
/// then checks what the class and the provider made of it:
/// - the KaironMachinePool: controlled by the MachinePool, owned by the Cluster (topology),
///   with the provider's finalizer, the `workerMachine` defaults and the image of `version`,
///   `spec.providerIDList` naming exactly its KaironMachines' VMs;
/// - its VMs are exactly its KaironMachines' (plain Kairon Machines, no MachineSet's member),
///   all of one revision;
/// - per VM a KaironMachine (the pool's template, its own providerID) controlled by the Machine
///   of its name and owned by the pool, and that Machine controlled by the MachinePool, with a
///   Node of the same providerID reporting `version`.
pub async fn pool_is_as_the_class_says(rig: &Rig, replicas: usize, version: &str) -> PoolSeen {
    let image = machine_image_for(version);
    let n = replicas as i64;
    rig.wait_ok(
        &format!("the MachinePool's {replicas} workers of {version} ready"),
        Duration::from_secs(300),
        || async {
            let mps = rig.list(&machinepools()).await;
            let [mp] = mps.as_slice() else {
                return Err(format!("{} MachinePools", mps.len()));
            };
            let st = &mp.data["status"];
            let counts = ["replicas", "readyReplicas", "availableReplicas", "upToDateReplicas"].map(|f| int(&st[f]));
            if counts != [n; 4] || st["phase"] != "Running" || mp.data["spec"]["template"]["spec"]["version"] != version
            {
                return Err(format!("MachinePool status {st}"));
            }
            let kmps = rig.list(&kaironmachinepools()).await;
            let [kmp] = kmps.as_slice() else {
                return Err(format!("{} KaironMachinePools", kmps.len()));
            };
            let st = &kmp.data["status"];
            if int(&st["replicas"]) != n
                || int(&st["readyReplicas"]) != n
                || kmp.data["spec"]["template"]["image"]["imageRef"] != image.as_str()
            {
                return Err(format!("KaironMachinePool {} {st}", kmp.data["spec"]));
            }
            let vms: Vec<capkr::kairon::Machine> = Api::namespaced(rig.env.client(), &rig.ns)
                .list(&ListParams::default().labels(&pool_selector(&name(kmp))))
                .await
                .map_err(|e| e.to_string())?
                .items;
            if vms.len() != replicas {
                return Err(format!("{} VMs of the pool", vms.len()));
            }
            Ok(())
        },
    )
    .await;

    let cluster = rig
        .api(&capi("Cluster", "clusters"))
        .get(&rig.cluster)
        .await
        .expect("the Cluster");
    let mp = rig.list(&machinepools()).await.remove(0);
    let kmp = rig.list(&kaironmachinepools()).await.remove(0);
    let kmp_name = name(&kmp);
    assert_eq!(
        mp.data["spec"]["template"]["spec"]["infrastructureRef"]["name"], kmp_name,
        "the MachinePool names the KaironMachinePool"
    );
    assert_eq!(
        owners(&kmp),
        BTreeSet::from([owner("MachinePool", &mp, true), owner("Cluster", &cluster, false)]),
        "the KaironMachinePool: controlled by its MachinePool, owned by the Cluster"
    );
    assert_eq!(kmp.finalizers(), [MACHINE_POOL_FINALIZER.to_string()]);
    let template = &kmp.data["spec"]["template"];
    assert_eq!(
        (
            template["resources"]["cpu"].clone(),
            template["resources"]["memory"].clone(),
            template["image"]["diskSize"].clone()
        ),
        (json!(2), json!("4Gi"), json!("20Gi")),
        "the workerMachine variable's defaults: {template}"
    );
    assert_eq!(kmp.data["status"]["ready"], true);
    assert_eq!(kmp.data["status"]["initialization"]["provisioned"], true);
    assert_eq!(kmp.data["status"]["infrastructureMachineKind"], "KaironMachine");

    let vms: Vec<capkr::kairon::Machine> = Api::namespaced(rig.env.client(), &rig.ns)
        .list(&ListParams::default().labels(&pool_selector(&kmp_name)))
        .await
        .expect("the pool's VMs")
        .items;
    for vm in &vms {
        assert_eq!(
            vm.spec.image_ref(),
            Some(image.as_str()),
            "{}: a VM of {image}",
            vm.name_any()
        );
        assert!(
            !vm.labels().contains_key("kairon.zyvor.dev/machineset"),
            "{}: a plain Kairon Machine, no MachineSet's member",
            vm.name_any()
        );
    }
    let members: BTreeSet<String> = vms.iter().map(|v| v.name_any()).collect();

    let pool_kms: Vec<DynamicObject> = rig
        .list(&kaironmachines())
        .await
        .into_iter()
        .filter(|k| k.owner_references().iter().any(|o| o.kind == "KaironMachinePool"))
        .collect();
    let machines = rig.machine_list().await;
    let nodes = Api::<Node>::all(rig.workload_client().await)
        .list(&ListParams::default())
        .await
        .expect("the workload cluster's Nodes")
        .items;
    let km_names: BTreeSet<String> = pool_kms.iter().map(name).collect();
    assert_eq!(
        km_names, members,
        "one KaironMachine per VM of the pool, named as its VM"
    );
    assert_eq!(members.len(), replicas, "the pool's VMs: {members:?}");
    let revisions: BTreeSet<String> = pool_kms
        .iter()
        .map(|k| k.labels().get(REVISION_LABEL).cloned().unwrap_or_default())
        .collect();
    assert_eq!(revisions.len(), 1, "every member of one revision: {revisions:?}");
    let mut ids: Vec<String> = vec![];
    for km in &pool_kms {
        let km_name = name(km);
        let vm = vms.iter().find(|v| v.name_any() == km_name).expect("its VM");
        let id = format!("kairon://{}", vm.name_any());
        assert_eq!(km.data["spec"]["providerID"], id.as_str(), "{km_name} names its VM");
        assert_eq!(
            km.data["spec"]["image"]["imageRef"],
            image.as_str(),
            "{km_name} boots {image}"
        );
        assert_eq!(km.finalizers(), [MACHINE_FINALIZER.to_string()], "{km_name}");
        let machine = machines
            .iter()
            .find(|m| name(m) == km_name)
            .unwrap_or_else(|| panic!("a Machine for {km_name}"));
        assert_eq!(
            owners(km),
            BTreeSet::from([owner("Machine", machine, true), owner("KaironMachinePool", &kmp, false)]),
            "{km_name}: controlled by its Machine, owned by its pool"
        );
        assert_eq!(
            owners(machine),
            BTreeSet::from([owner("MachinePool", &mp, true)]),
            "Machine {km_name}: controlled by the MachinePool"
        );
        assert_eq!(machine.data["spec"]["providerID"], id.as_str());
        let node_name = machine.data["status"]["nodeRef"]["name"].as_str().unwrap_or_default();
        let node = nodes
            .iter()
            .find(|n| n.name_any() == node_name)
            .unwrap_or_else(|| panic!("Machine {km_name}'s Node {node_name:?}"));
        assert_eq!(
            node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
            Some(id.as_str()),
            "the Node of {km_name}"
        );
        let kubelet = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.kubelet_version.as_str());
        assert_eq!(kubelet, Some(version), "the Node of {km_name}");
        ids.push(id);
    }
    ids.sort();
    assert_eq!(kmp.data["spec"]["providerIDList"], json!(ids), "providerIDList");
    PoolSeen {
        revision: revisions.into_iter().next().unwrap_or_default(),
        vms: members,
    }
}
