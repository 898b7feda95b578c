//! The objects CAPI would make, made by the benchmark while CAPI's managers are not running: a
//! Cluster whose status says the infrastructure is provisioned and the control plane
//! initialized, its KaironCluster (endpoint set, owned by the Cluster), and per machine a
//! bootstrap data Secret, a Machine naming it, and the KaironMachine owned by that Machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use capkr::api::KaironMachine;
use capkr_testenv::{api_resource, capi_resource};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// The cluster every benchmark namespace holds.
pub const CLUSTER: &str = "bench";

/// Kubernetes version written on the Machines (nothing runs it).
const VERSION: &str = capkr_testenv::cluster::KUBERNETES_VERSION;

/// Name of the `i`th machine: sorts in creation order.
pub fn machine_name(i: usize) -> String {
    format!("{CLUSTER}-m-{i:05}")
}

/// Creates namespace `ns` with Cluster `bench` (status as CAPI sets it once the infrastructure
/// is provisioned and the control plane initialized) and its KaironCluster.
pub async fn create_cluster(client: &Client, ns: &str) -> Result<()> {
    let nss: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    nss.create(&PostParams::default(), &namespace)
        .await
        .with_context(|| format!("creating namespace {ns}"))?;

    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &capi_resource("Cluster", "clusters"));
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": ns},
        "spec": {
            "clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}},
            "controlPlaneEndpoint": {"host": "127.0.0.1", "port": 6443},
            "infrastructureRef": {
                "apiGroup": capkr::api::GROUP,
                "kind": "KaironCluster",
                "name": CLUSTER,
            },
        },
    }))?;
    let cluster = clusters
        .create(&PostParams::default(), &cluster)
        .await
        .context("creating the Cluster")?;
    let status = json!({"status": {"initialization": {
        "infrastructureProvisioned": true,
        "controlPlaneInitialized": true,
    }}});
    clusters
        .patch_status(CLUSTER, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("writing the Cluster's status")?;

    let kcs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &api_resource(
            capkr::api::GROUP,
            capkr::api::VERSION,
            "KaironCluster",
            "kaironclusters",
        ),
    );
    let kc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{}/{}", capkr::api::GROUP, capkr::api::VERSION),
        "kind": "KaironCluster",
        "metadata": {
            "name": CLUSTER,
            "namespace": ns,
            "labels": {capkr::capi::CLUSTER_NAME_LABEL: CLUSTER},
            "ownerReferences": [owner("Cluster", CLUSTER, &cluster.uid().unwrap_or_default())],
        },
        "spec": {"controlPlaneEndpoint": {"host": "127.0.0.1", "port": 6443}},
    }))?;
    kcs.create(&PostParams::default(), &kc)
        .await
        .context("creating the KaironCluster")?;
    Ok(())
}

fn owner(kind: &str, name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// A worker's cloud-config of the size CABPK writes for a kubeadm join (about 2.5 KiB). The
/// token and hashes are made up; the simulator runs without guests here, so nothing reads it.
fn cloud_config(name: &str) -> String {
    let ca_hash = "0".repeat(64);
    let filler: String = (0..24)
        .map(|i| format!("    # padding line {i:02} to the size of a real join config\n"))
        .collect();
    format!(
        "## template: jinja\n#cloud-config\nwrite_files:\n- path: /run/kubeadm/kubeadm-join-config.yaml\n  owner: root:root\n  \
         permissions: '0640'\n  content: |\n    apiVersion: kubeadm.k8s.io/v1beta4\n    kind: JoinConfiguration\n    discovery:\n      \
         bootstrapToken:\n        apiServerEndpoint: 127.0.0.1:6443\n        caCertHashes:\n        - sha256:{ca_hash}\n        \
         token: abcdef.0123456789abcdef\n    nodeRegistration:\n      name: '{name}'\n      kubeletExtraArgs:\n      - name: provider-id\n        \
         value: 'kairon://{{{{ ds.meta_data.instance_id }}}}'\n{filler}- path: /run/cluster-api/placeholder\n  content: bench\nruncmd:\n\
         - kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml\n- mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\n"
    )
}

/// Creates machine `i`: its bootstrap Secret, the Machine, then the KaironMachine owned by the
/// Machine. Returns the KaironMachine's name and when its create returned.
async fn create_machine(client: &Client, ns: &str, i: usize) -> Result<(String, Instant)> {
    let name = machine_name(i);
    let secret_name = format!("{name}-bootstrap");
    let labels = json!({capkr::capi::CLUSTER_NAME_LABEL: CLUSTER});

    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = Secret {
        metadata: serde_json::from_value(json!({"name": secret_name, "namespace": ns, "labels": labels}))?,
        type_: Some("cluster.x-k8s.io/secret".into()),
        data: Some(
            [
                ("value".to_string(), ByteString(cloud_config(&name).into_bytes())),
                ("format".to_string(), ByteString(b"cloud-config".to_vec())),
            ]
            .into(),
        ),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .with_context(|| format!("creating Secret {secret_name}"))?;

    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &capi_resource("Machine", "machines"));
    let machine: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "clusterName": CLUSTER,
            "version": VERSION,
            "bootstrap": {"dataSecretName": secret_name},
            "infrastructureRef": {"apiGroup": capkr::api::GROUP, "kind": "KaironMachine", "name": name},
        },
    }))?;
    let machine = machines
        .create(&PostParams::default(), &machine)
        .await
        .with_context(|| format!("creating Machine {name}"))?;

    let kms: Api<KaironMachine> = Api::namespaced(client.clone(), ns);
    let owner: OwnerReference = serde_json::from_value(owner("Machine", &name, &machine.uid().unwrap_or_default()))?;
    let km: KaironMachine = serde_json::from_value(json!({
        "apiVersion": format!("{}/{}", capkr::api::GROUP, capkr::api::VERSION),
        "kind": "KaironMachine",
        "metadata": {"name": name, "namespace": ns, "labels": labels, "ownerReferences": [owner]},
        "spec": {
            "image": {"imageRef": format!("ubuntu-2404-kube-{VERSION}"), "diskSize": "20Gi"},
            "resources": {"cpu": 2, "memory": "4Gi"},
            "network": {"mode": "tap", "bridge": "br0", "learnIP": true},
        },
    }))?;
    kms.create(&PostParams::default(), &km)
        .await
        .with_context(|| format!("creating KaironMachine {name}"))?;
    Ok((name, Instant::now()))
}

/// Creates machines `0..n` with at most `concurrency` in flight; `created` is told when each
/// KaironMachine's create returned. Returns how long it took.
pub async fn create_machines(
    client: &Client,
    ns: &str,
    n: usize,
    concurrency: usize,
    created: Arc<dyn Fn(String, Instant) + Send + Sync>,
) -> Result<Duration> {
    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let created = created.clone();
            async move {
                let (name, at) = create_machine(client, ns, i).await?;
                created(name, at);
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<()>()
        .await?;
    Ok(start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cloud_config_is_a_join_config_of_realistic_size() {
        let c = cloud_config("bench-m-00001");
        assert!(c.starts_with("## template: jinja\n#cloud-config\n"));
        assert!(c.contains("kind: JoinConfiguration"));
        assert!((2000..4096).contains(&c.len()), "{}", c.len());
        assert_eq!(machine_name(7), "bench-m-00007");
    }
}
