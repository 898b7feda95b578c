//! What `kubeadm init` and `kubeadm join --control-plane` leave in the workload cluster, and
//! the mirror Pods kubelet posts for the static pods, which is what KubeadmControlPlane reads:
//! `kube-system/kubeadm-config` says the control plane is initialized, the mirror Pods'
//! phase and Ready condition make the static-pod conditions of each Machine.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::kubeadm::ControlPlanePlan;
use crate::sim::FIELD_MANAGER;
use crate::workload::create_if_missing;

/// kubeadm's static pods, in the order kubeadm writes them.
pub const STATIC_PODS: [&str; 4] = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"];

fn config_map(namespace: &str, name: &str, data: BTreeMap<String, String>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}

/// The ConfigMaps `kubeadm init` uploads (phase upload-config, bootstrap-token cluster-info).
pub fn init_config_maps(plan: &ControlPlanePlan, ca_pem: &str) -> Vec<ConfigMap> {
    let cluster_configuration = plan.cluster_configuration.clone().unwrap_or_else(|| json!({}));
    let endpoint = cluster_configuration
        .get("controlPlaneEndpoint")
        .and_then(Value::as_str)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .or_else(|| plan.vip.as_ref().map(|v| format!("{}:{}", v.address, v.port)))
        .unwrap_or_default();
    let yaml = serde_saphyr::to_string(&cluster_configuration).unwrap_or_default();
    let kubelet = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\nclusterDNS:\n- 10.96.0.10\nclusterDomain: cluster.local\nrotateCertificates: true\nstaticPodPath: /etc/kubernetes/manifests\n";
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let cluster_info = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: https://{endpoint}\n  name: \"\"\ncontexts: null\ncurrent-context: \"\"\npreferences: {{}}\nusers: null\n"
    );
    vec![
        config_map(
            "kube-system",
            "kubeadm-config",
            [("ClusterConfiguration".to_string(), yaml)].into(),
        ),
        config_map(
            "kube-system",
            "kubelet-config",
            [("kubelet".to_string(), kubelet.to_string())].into(),
        ),
        config_map(
            "kube-public",
            "cluster-info",
            [("kubeconfig".to_string(), cluster_info)].into(),
        ),
    ]
}

pub async fn write_init_objects(client: &Client, plan: &ControlPlanePlan, pki: &Path) -> Result<(), kube::Error> {
    let ca = std::fs::read_to_string(pki.join("ca.crt")).unwrap_or_default();
    for cm in init_config_maps(plan, &ca) {
        let ns = cm.metadata.namespace.clone().unwrap_or_default();
        create_if_missing(&Api::<ConfigMap>::namespaced(client.clone(), &ns), &cm).await?;
    }
    crate::addons::write_addons(client, plan).await?;
    Ok(())
}

/// `kubernetesVersion` of the ClusterConfiguration in `kube-system/kubeadm-config`, which
/// `kubeadm join --control-plane` downloads to write its static pods.
pub async fn cluster_kubernetes_version(client: &Client) -> Result<Option<String>, kube::Error> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    Ok(cms
        .get_opt("kubeadm-config")
        .await?
        .and_then(|cm| cm.data?.remove("ClusterConfiguration"))
        .and_then(|yaml| kubernetes_version_of(&yaml)))
}

/// `kubernetesVersion` of a ClusterConfiguration document.
pub fn kubernetes_version_of(cluster_configuration: &str) -> Option<String> {
    let doc: Value = serde_saphyr::from_str(cluster_configuration).ok()?;
    doc.get("kubernetesVersion")?
        .as_str()
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// The mirror Pod kubelet creates for a static pod of `node`.
pub fn mirror_pod(component: &str, node: &str, ip: &str, api_port: u16, version: &str) -> Pod {
    let (image, mut annotations) = match component {
        "etcd" => (
            "registry.k8s.io/etcd:3.6.16-0".to_string(),
            BTreeMap::from([(
                "kubeadm.kubernetes.io/etcd.advertise-client-urls".to_string(),
                format!("https://{ip}:2379"),
            )]),
        ),
        "kube-apiserver" => (
            format!("registry.k8s.io/{component}:{version}"),
            BTreeMap::from([(
                "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint".to_string(),
                format!("{ip}:{api_port}"),
            )]),
        ),
        _ => (format!("registry.k8s.io/{component}:{version}"), BTreeMap::new()),
    };
    let hash = format!("{:x}", fingerprint(&format!("{component}/{node}/{ip}/{version}")));
    annotations.insert("kubernetes.io/config.hash".into(), hash.clone());
    annotations.insert("kubernetes.io/config.mirror".into(), hash);
    annotations.insert("kubernetes.io/config.source".into(), "file".into());
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("{component}-{node}")),
            namespace: Some("kube-system".into()),
            labels: Some(BTreeMap::from([
                ("component".to_string(), component.to_string()),
                ("tier".to_string(), "control-plane".to_string()),
            ])),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            host_network: Some(true),
            priority_class_name: Some("system-node-critical".into()),
            containers: vec![Container {
                name: component.into(),
                image: Some(image),
                command: Some(vec![component.into()]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

fn fingerprint(s: &str) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// The status kubelet posts for a running, ready static pod.
pub fn running_status(component: &str, image: &str) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    json!({"status": {
        "phase": "Running",
        "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")],
        "startTime": now,
        "containerStatuses": [{
            "name": component, "ready": true, "started": true, "restartCount": 0,
            "image": image, "imageID": "", "containerID": format!("containerd://{:x}", fingerprint(&now)),
            "state": {"running": {"startedAt": now}},
        }],
    }})
}

pub async fn write_mirror_pods(
    client: &Client,
    node: &str,
    ip: &str,
    api_port: u16,
    version: &str,
) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    };
    for component in STATIC_PODS {
        let pod = mirror_pod(component, node, ip, api_port, version);
        let name = pod.metadata.name.clone().unwrap_or_default();
        // A mirror pod from an earlier boot of a namesake node is replaced, as kubelet does.
        if let Some(old) = pods.get_opt(&name).await? {
            let same = old
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubernetes.io/config.hash"))
                == pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("kubernetes.io/config.hash"));
            if !same {
                let _ = pods.delete(&name, &DeleteParams::default().grace_period(0)).await;
            }
        }
        create_if_missing(&pods, &pod).await?;
        let image = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].image.clone())
            .unwrap_or_default();
        pods.patch_status(&name, &pp, &Patch::Merge(running_status(component, &image)))
            .await?;
    }
    Ok(())
}

/// Best effort: the Pod garbage collector of a real cluster would remove these with the Node.
pub async fn delete_mirror_pods(client: &Client, node: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    for component in STATIC_PODS {
        let _ = pods
            .delete(&format!("{component}-{node}"), &DeleteParams::default().grace_period(0))
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_pods_are_named_as_kcp_looks_them_up() {
        let pod = mirror_pod("etcd", "c1-cp-abc", "127.9.0.2", 6443, "v1.36.3");
        assert_eq!(pod.metadata.name.as_deref(), Some("etcd-c1-cp-abc"));
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("c1-cp-abc"));
        assert_eq!(spec.host_network, Some(true));
        let annotations = pod.metadata.annotations.unwrap();
        assert!(annotations.contains_key("kubernetes.io/config.mirror"));
        assert_eq!(
            annotations
                .get("kubeadm.kubernetes.io/etcd.advertise-client-urls")
                .map(String::as_str),
            Some("https://127.9.0.2:2379")
        );
        let status = running_status("etcd", "img");
        assert_eq!(status["status"]["phase"], "Running");
        assert!(
            status["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        );
    }

    #[test]
    fn init_uploads_the_cluster_configuration() {
        let plan = ControlPlanePlan {
            init: true,
            pki: vec![],
            cluster_configuration: Some(json!({
                "apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
                "controlPlaneEndpoint": "127.9.100.1:6443", "kubernetesVersion": "v1.36.3"
            })),
            service_subnet: "10.96.0.0/12".into(),
            api_port: 6443,
            vip: None,
        };
        let cms = init_config_maps(&plan, "PEM");
        let names: Vec<_> = cms
            .iter()
            .map(|c| {
                format!(
                    "{}/{}",
                    c.metadata.namespace.as_deref().unwrap(),
                    c.metadata.name.as_deref().unwrap()
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                "kube-system/kubeadm-config",
                "kube-system/kubelet-config",
                "kube-public/cluster-info"
            ]
        );
        let cc = &cms[0].data.as_ref().unwrap()["ClusterConfiguration"];
        let parsed: Value = serde_saphyr::from_str(cc).unwrap();
        assert_eq!(parsed["kubernetesVersion"], "v1.36.3");
        assert_eq!(kubernetes_version_of(cc).as_deref(), Some("v1.36.3"));
        assert_eq!(kubernetes_version_of("kind: ClusterConfiguration\n"), None);
        assert_eq!(kubernetes_version_of("{not yaml"), None);
        assert!(cms[2].data.as_ref().unwrap()["kubeconfig"].contains("server: https://127.9.100.1:6443"));
    }
}
