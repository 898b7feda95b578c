//! kubeadm's addons in a workload cluster of the shipped flavors: the kube-proxy DaemonSet and
//! the CoreDNS Deployment and Service that the simulated `kubeadm init` leaves, scheduled by the
//! cluster's own kube-scheduler and run by KWOK like any workload.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod, core::v1::Service};
use kube::api::ListParams;

use crate::common::Rig;

/// kubeadm's addons run in the workload cluster as in a kubeadm cluster: a kube-proxy Pod
/// Running on each of its `nodes` Nodes, every replica of the CoreDNS Deployment Running, and
/// the kube-dns Service at the tenth address of the service subnet.
pub async fn wait_addons_running(rig: &Rig, nodes: usize) {
    let client = rig.workload_client().await;
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "kube-system");
    let deployments: kube::Api<Deployment> = kube::Api::namespaced(client.clone(), "kube-system");
    let services: kube::Api<Service> = kube::Api::namespaced(client, "kube-system");
    let running_on = |list: Vec<Pod>| -> BTreeSet<String> {
        list.into_iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .filter_map(|p| p.spec.and_then(|s| s.node_name))
            .collect()
    };
    let took = rig
        .wait_ok("kube-proxy and CoreDNS Running", Duration::from_secs(180), || async {
            let proxies = pods
                .list(&ListParams::default().labels("k8s-app=kube-proxy"))
                .await
                .map_err(|e| e.to_string())?
                .items;
            let proxy_nodes = running_on(proxies.clone());
            let dns = pods
                .list(&ListParams::default().labels("k8s-app=kube-dns"))
                .await
                .map_err(|e| e.to_string())?
                .items;
            let dns_running = dns
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            let want_dns = deployments
                .get("coredns")
                .await
                .map_err(|e| format!("Deployment coredns: {e}"))?
                .spec
                .and_then(|s| s.replicas)
                .unwrap_or(1) as usize;
            let ip = services
                .get("kube-dns")
                .await
                .map_err(|e| format!("Service kube-dns: {e}"))?
                .spec
                .and_then(|s| s.cluster_ip)
                .unwrap_or_default();
            if proxy_nodes.len() == nodes && proxies.len() == nodes && dns_running == want_dns && ip.ends_with(".10") {
                Ok(())
            } else {
                Err(format!(
                    "kube-proxy Running on {} of {nodes} Nodes ({} Pods), CoreDNS {dns_running} of {want_dns} \
                     Running, kube-dns at {ip:?}",
                    proxy_nodes.len(),
                    proxies.len()
                ))
            }
        })
        .await;
    eprintln!(
        "kube-proxy on {nodes} Nodes and CoreDNS Running {:.1}s later",
        took.as_secs_f64()
    );
}
