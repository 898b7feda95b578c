//! Smoke test against the real control plane: real CAPI core, kubeadm bootstrap and control
//! plane managers, the Kairon simulator and capkr-manager. A cluster of one control-plane
//! Machine and a MachineDeployment comes up — every Machine `Running` with a nodeRef, its
//! KaironMachine provisioned and Ready with the Node's providerID, its Kairon Machine Running —
//! and deleting the Cluster leaves no Kairon Machine behind.

use std::time::Duration;

use capkr::api::conditions::{self, READY};
use capkr::api::{KaironCluster, KaironMachine};
use capkr::kairon;
use capkr_testenv::demo::cluster_manifests;
use capkr_testenv::{Env, EnvOptions, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};

const NS: &str = "smoke";
const CLUSTER: &str = "smoke";

fn capi(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind), plural)
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_comes_up_with_real_capi_and_deleting_it_leaves_no_kairon_machine() {
    let env = Env::start(EnvOptions::new("e2e-smoke"))
        .await
        .expect("test environment");
    env.create_namespace(NS).await.unwrap();
    let workload = env.workload_cluster(NS, CLUSTER).await.unwrap();
    let _sim = env
        .start_simulator([
            "--provision-delay",
            "300ms",
            "--boot-delay",
            "700ms",
            "--delete-delay",
            "1s",
            "--hosts",
            "kairon-node-1:topology.kairon.zyvor.dev/zone=zone-a,kairon-node-2:topology.kairon.zyvor.dev/zone=zone-b",
        ])
        .unwrap();
    let _manager = env.start_manager(["-v", "1"]).unwrap();
    env.apply(&cluster_manifests(NS, CLUSTER, &workload.host, workload.port), Some(NS))
        .await
        .unwrap();

    let client = env.client();
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &capi("Machine", "machines"));
    let kms: Api<KaironMachine> = Api::namespaced(client.clone(), NS);
    let vms: Api<kairon::Machine> = Api::namespaced(client.clone(), NS);
    let nodes: Api<Node> = Api::all(workload.client());

    let up = wait_for(
        "every Machine Running with a nodeRef",
        Duration::from_secs(180),
        || async {
            let list = machines.list(&ListParams::default()).await?;
            let running = list
                .items
                .iter()
                .filter(|m| m.data["status"]["phase"] == "Running" && m.data["status"]["nodeRef"]["name"].is_string())
                .count();
            Ok::<_, kube::Error>((list.items.len() == 3 && running == 3).then_some(list.items))
        },
    )
    .await;
    let up = match up {
        Ok(up) => up,
        Err(e) => {
            env.dump();
            panic!("{e:#}");
        }
    };

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
            format!("kairon://{}", vm.metadata.uid.clone().unwrap()),
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
        let infra_ready = m.data["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "InfrastructureReady")
            .cloned();
        assert_eq!(infra_ready.map(|c| c["status"].clone()), Some("True".into()), "{name}");
    }
    assert_eq!(
        vms.list(&ListParams::default()).await.unwrap().items.len(),
        3,
        "exactly one Kairon Machine per Machine"
    );

    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &capi("Cluster", "clusters"));
    clusters.delete(CLUSTER, &DeleteParams::background()).await.unwrap();
    let kcs: Api<KaironCluster> = Api::namespaced(client.clone(), NS);
    let gone = wait_for(
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
    if let Err(e) = gone {
        env.dump();
        panic!("{e:#}");
    }
}
