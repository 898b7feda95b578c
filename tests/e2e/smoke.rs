//! Smoke test against the real control plane: real CAPI core and kubeadm bootstrap managers,
//! the Kairon simulator and capkr-manager. A cluster of one control-plane
//! Machine and a MachineDeployment comes up — every Machine `Running` with a nodeRef, its
//! KaironMachine provisioned and Ready with the Node's providerID, its Kairon Machine Running —
//! and deleting the Cluster leaves no Kairon Machine behind.

use std::time::Duration;

use crate::common::{Rig, RigOptions, condition};
use capkr::api::conditions::{self, READY};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};

#[tokio::test(flavor = "multi_thread")]
async fn cluster_comes_up_with_real_capi_and_deleting_it_leaves_no_kairon_machine() {
    let rig = Rig::start(RigOptions {
        workers: 2,
        sim_args: ["--provision-delay", "300ms", "--boot-delay", "700ms"]
            .map(String::from)
            .to_vec(),
        ..RigOptions::new("e2e_smoke")
    })
    .await;
    let machines = rig.machines();
    let kms = rig.kms();
    let vms = rig.vms();
    let nodes = rig.nodes();

    let up = rig
        .wait(
            "every Machine Running with a nodeRef",
            Duration::from_secs(180),
            || async {
                let list = machines.list(&ListParams::default()).await?;
                let running = list
                    .items
                    .iter()
                    .filter(|m| {
                        m.data["status"]["phase"] == "Running" && m.data["status"]["nodeRef"]["name"].is_string()
                    })
                    .count();
                Ok::<_, kube::Error>((list.items.len() == 3 && running == 3).then_some(list.items))
            },
        )
        .await;

    let node_list = nodes.list(&ListParams::default()).await.unwrap();
    for m in &up {
        let name = m.metadata.name.clone().unwrap();
        let provider_id = m.data["spec"]["providerID"].as_str().unwrap_or_default().to_string();
        let km = kms.get(&name).await.unwrap();
        assert_eq!(
            km.spec.provider_id.as_deref(),
            Some(provider_id.as_str()),
            "{name}: Machine and KaironMachine agree"
        );
        let status = km.status.clone().unwrap();
        assert!(status.is_provisioned(), "{name}");
        assert_eq!(
            conditions::get(status.conditions.as_deref().unwrap(), READY)
                .unwrap()
                .status,
            "True",
            "{name}"
        );
        assert!(
            status
                .addresses
                .as_ref()
                .is_some_and(|a| a.iter().any(|a| a.type_ == "InternalIP")),
            "{name}: addresses"
        );
        let vm = vms.get(&name).await.unwrap();
        assert_eq!(
            provider_id,
            format!("kairon://{}", vm.name_any()),
            "{name}: providerID names the VM"
        );
        assert_eq!(vm.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
        let node = m.data["status"]["nodeRef"]["name"].as_str().unwrap();
        let node = node_list
            .items
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(node))
            .expect("Node exists");
        assert_eq!(
            node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
            Some(provider_id.as_str()),
            "{name}: Node agrees"
        );
        // CAPI mirrors our Ready into the Machine's InfrastructureReady.
        let infra_ready = condition(m, "InfrastructureReady");
        assert_eq!(infra_ready.map(|c| c["status"].clone()), Some("True".into()), "{name}");
    }
    assert_eq!(
        vms.list(&ListParams::default()).await.unwrap().items.len(),
        3,
        "exactly one Kairon Machine per Machine"
    );

    let clusters = rig.clusters();
    clusters
        .delete(&rig.cluster, &DeleteParams::background())
        .await
        .unwrap();
    let kcs = rig.kcs();
    rig.wait(
        "the Cluster and everything of it gone",
        Duration::from_secs(180),
        || async {
            let left = (
                clusters.list(&ListParams::default()).await?.items.len(),
                kcs.list(&ListParams::default()).await?.items.len(),
                kms.list(&ListParams::default()).await?.items.len(),
                vms.list(&ListParams::default()).await?.items.len(),
            );
            Ok::<_, kube::Error>(left == (0, 0, 0, 0))
        },
    )
    .await;
}
