//! A Kubernetes upgrade through the ClusterClass: `spec.topology.version` of a Cluster of the
//! shipped topology flavor goes to the next patch version; the class's patches give each
//! machine the image of its own version (the control plane's first, then the
//! MachineDeployment's), so every KaironMachineTemplate of the Cluster names the new image,
//! every Machine made after the change boots it, and every Node reports the new version.
//!
//! A MachinePool may make one VM more than it has workers: CAPI's topology controller writes
//! the KaironMachinePool's new image before the MachinePool's new version, and the pool rolls
//! on each (its set's template names both), so with `maxSurge` 1 one VM of the new image and
//! the old version can be made, then replaced in turn.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::templates_support::*;

/// `pool_surplus`: how many VMs beyond one per machine may be made (a MachinePool's, above).
pub async fn upgrade_the_topology(rig: &Rig, control_planes: usize, workers: usize, pool_surplus: usize) {
    let clusters = capi("Cluster", "clusters");
    let cluster = rig.api(&clusters).get(&rig.cluster).await.expect("the Cluster");
    let from = cluster.data["spec"]["topology"]["version"]
        .as_str()
        .expect("a topology version")
        .to_string();
    let to = next_patch_version(&from);
    let (old_image, new_image) = (machine_image_for(&from), machine_image_for(&to));
    let image_of = |km: &kube::api::DynamicObject| {
        km.data["spec"]["image"]["imageRef"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let before: BTreeMap<String, String> = rig
        .list(&kaironmachines())
        .await
        .iter()
        .map(|k| (name(k), image_of(k)))
        .collect();
    assert!(
        before.values().all(|i| *i == old_image),
        "the machines boot {old_image} before: {before:?}"
    );
    let started = Instant::now();
    rig.api(&clusters)
        .patch(
            &rig.cluster,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"topology": {"version": to}}})),
        )
        .await
        .expect("changing the Cluster's topology version");

    // Every KaironMachine made after the change, with its image, as sampled throughout.
    let made = Mutex::new(BTreeMap::<String, String>::new());
    let label = format!("cluster.x-k8s.io/cluster-name={}", rig.cluster);
    rig.wait_ok(
        &format!("the Cluster upgraded to {to}"),
        Duration::from_secs(900),
        || async {
            let kms = rig.list(&kaironmachines()).await;
            {
                let mut made = made.lock().unwrap_or_else(|e| e.into_inner());
                made.extend(
                    kms.iter()
                        .filter(|k| !before.contains_key(&name(k)))
                        .map(|k| (name(k), image_of(k))),
                );
                // A machine of the old image made after the change never becomes what is
                // asked: say so now rather than at the timeout.
                let old: Vec<_> = made.iter().filter(|(_, i)| **i != new_image).collect();
                assert!(
                    old.is_empty(),
                    "machines made after the change boot another image than {new_image}: {old:?}"
                );
            }
            let machines = rig.machine_list().await;
            cluster_ready(&machines, rig.kcp().await.as_ref(), control_planes, workers)?;
            for m in &machines {
                let spec = m.data["spec"]["version"].as_str().unwrap_or_default();
                let kubelet = m.data["status"]["nodeInfo"]["kubeletVersion"]
                    .as_str()
                    .unwrap_or_default();
                if spec != to || kubelet != to {
                    return Err(format!("{}: spec.version {spec}, kubelet {kubelet}", name(m)));
                }
            }
            let templates = rig
                .api(&kaironmachinetemplates())
                .list(&ListParams::default().labels(&label))
                .await
                .map_err(|e| e.to_string())?
                .items;
            let stale: Vec<String> = templates
                .iter()
                .filter(|t| t.data["spec"]["template"]["spec"]["image"]["imageRef"] != new_image.as_str())
                .map(name)
                .collect();
            if templates.is_empty() || !stale.is_empty() {
                return Err(format!(
                    "KaironMachineTemplates not naming {new_image}: {stale:?} of {}",
                    templates.len()
                ));
            }
            // A replaced machine's Node is deleted by CAPI after its Machine goes: wait for it
            // rather than racing it (the asserts below still say which Nodes are left).
            let nodes = workload_nodes(rig).await?;
            if nodes.len() != control_planes + workers || nodes.iter().any(|(_, v)| *v != to) {
                return Err(format!("Nodes not yet one per machine at {to}: {nodes:?}"));
            }
            Ok(())
        },
    )
    .await;
    let made = made.into_inner().unwrap_or_else(|e| e.into_inner());
    let nodes = workload_nodes(rig).await.expect("the workload cluster's Nodes");
    eprintln!(
        "topology {from} -> {to}: {:.1}s; {} machines made: {made:?}; Nodes {nodes:?}",
        started.elapsed().as_secs_f64(),
        made.len()
    );
    let old_made: BTreeSet<&String> = made.iter().filter(|(_, i)| **i != new_image).map(|(n, _)| n).collect();
    assert!(
        old_made.is_empty(),
        "every machine made after the change boots {new_image}: {made:?}"
    );
    let replaced = control_planes + workers;
    assert!(
        (replaced..=replaced + pool_surplus).contains(&made.len()),
        "every machine replaced once ({pool_surplus} more allowed): {made:?}"
    );
    assert_eq!(nodes.len(), control_planes + workers, "one Node per machine: {nodes:?}");
    assert!(
        nodes.iter().all(|(_, v)| *v == to),
        "every Node reports {to}: {nodes:?}"
    );
}

/// The workload cluster's Nodes, each with its kubelet's version.
async fn workload_nodes(rig: &Rig) -> Result<Vec<(String, String)>, String> {
    Ok(Api::<Node>::all(rig.workload_client().await)
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("the workload cluster's Nodes: {e}"))?
        .items
        .into_iter()
        .map(|n| {
            let version = n
                .status
                .and_then(|s| s.node_info)
                .map(|i| i.kubelet_version)
                .unwrap_or_default();
            (n.metadata.name.unwrap_or_default(), version)
        })
        .collect())
}
