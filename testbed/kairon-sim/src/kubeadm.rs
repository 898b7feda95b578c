//! What `kubeadm init` / `kubeadm join --control-plane` would do on a control-plane VM, read
//! from the files CABPK/KCP put into its cloud-init `write_files`: the cluster's CAs and
//! service-account keys (never made up here), the ClusterConfiguration, and the kube-vip
//! static pod that announces the control-plane endpoint. Pure.

use serde_json::Value;

use crate::guest::kubeadm_documents_of;

/// Where kubeadm keeps the cluster's certificates on a node.
pub const PKI_DIR: &str = "/etc/kubernetes/pki/";
/// The CAs and keys a control-plane node must have been given (kubeadm's "external CA"
/// files that KCP writes for every control-plane machine).
pub const REQUIRED_PKI: [&str; 8] = [
    "ca.crt",
    "ca.key",
    "etcd/ca.crt",
    "etcd/ca.key",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "sa.key",
    "sa.pub",
];
/// kubeadm's defaults.
pub const DEFAULT_SERVICE_SUBNET: &str = "10.96.0.0/12";
pub const DEFAULT_API_PORT: u16 = 6443;

/// The address kube-vip announces (its static pod's `address` and `port`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vip {
    pub address: String,
    pub port: u16,
}

/// A control-plane node as kubeadm would set it up.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlPlanePlan {
    /// `kubeadm init` (a new cluster) rather than a control-plane join.
    pub init: bool,
    /// Files under [`PKI_DIR`], relative to it.
    pub pki: Vec<(String, String)>,
    /// The ClusterConfiguration document (init only: join data carries none).
    pub cluster_configuration: Option<Value>,
    pub service_subnet: String,
    pub api_port: u16,
    pub vip: Option<Vip>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("control-plane bootstrap data lacks {0} (KCP writes the cluster CAs into write_files)")]
    MissingPki(&'static str),
}

/// The plan for a control-plane node, or `None` if the files make a worker.
pub fn control_plane_plan(files: &[(String, String)]) -> Result<Option<ControlPlanePlan>, PlanError> {
    let docs = kubeadm_documents_of(files);
    let kind = |d: &Value| d.get("kind").and_then(Value::as_str).map(str::to_string);
    let init = docs.iter().find(|d| kind(d).as_deref() == Some("InitConfiguration"));
    let join_cp = docs
        .iter()
        .find(|d| kind(d).as_deref() == Some("JoinConfiguration"))
        .and_then(|j| j.get("controlPlane"))
        .filter(|c| !c.is_null());
    let node_config = match (init, join_cp) {
        (Some(i), _) => i,
        (None, Some(c)) => c,
        (None, None) => return Ok(None),
    };
    let pki: Vec<(String, String)> = files
        .iter()
        .filter_map(|(p, c)| Some((p.strip_prefix(PKI_DIR)?.to_string(), c.clone())))
        .collect();
    for required in REQUIRED_PKI {
        if !pki.iter().any(|(p, _)| p == required) {
            return Err(PlanError::MissingPki(required));
        }
    }
    let cluster_configuration = docs
        .iter()
        .find(|d| kind(d).as_deref() == Some("ClusterConfiguration"))
        .cloned();
    let service_subnet = cluster_configuration
        .as_ref()
        .and_then(|c| c.pointer("/networking/serviceSubnet"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_SERVICE_SUBNET)
        .to_string();
    let api_port = node_config
        .pointer("/localAPIEndpoint/bindPort")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .unwrap_or(DEFAULT_API_PORT);
    Ok(Some(ControlPlanePlan {
        init: init.is_some(),
        pki,
        cluster_configuration,
        service_subnet,
        api_port,
        vip: files.iter().find_map(|(p, c)| kube_vip(p, c)),
    }))
}

/// kube-vip's static pod, if this file is one: the `address`/`vip_address` and `port` it
/// announces.
fn kube_vip(path: &str, content: &str) -> Option<Vip> {
    if !path.starts_with("/etc/kubernetes/manifests/") || !content.contains("kube-vip") {
        return None;
    }
    let pod: Value = serde_saphyr::from_str(content).ok()?;
    let containers = pod.pointer("/spec/containers")?.as_array()?;
    let container = containers.iter().find(|c| {
        c.get("image")
            .and_then(Value::as_str)
            .is_some_and(|i| i.contains("kube-vip"))
    })?;
    let env = container.get("env")?.as_array()?;
    let var = |name: &str| {
        env.iter()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
            .and_then(|e| e.get("value"))
            .and_then(|v| match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
    };
    let address = var("address").or_else(|| var("vip_address"))?;
    let port = var("port").and_then(|p| p.parse().ok()).unwrap_or(DEFAULT_API_PORT);
    Some(Vip { address, port })
}

/// The first address of a service CIDR: the `kubernetes` Service's ClusterIP, which the API
/// server's certificate names.
pub fn first_service_ip(cidr: &str) -> Option<std::net::Ipv4Addr> {
    let (base, _) = cidr.split(',').next()?.trim().split_once('/')?;
    let base: std::net::Ipv4Addr = base.parse().ok()?;
    Some(std::net::Ipv4Addr::from(u32::from(base).checked_add(1)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut f: Vec<(String, String)> = REQUIRED_PKI
            .iter()
            .map(|p| (format!("{PKI_DIR}{p}"), format!("pem of {p}")))
            .collect();
        f.extend(extra.iter().map(|(p, c)| (p.to_string(), c.to_string())));
        f
    }

    const INIT: &str = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nnetworking:\n  serviceSubnet: 10.128.0.0/12\n---\napiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nlocalAPIEndpoint:\n  bindPort: 7443\n";
    const JOIN_CP: &str =
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ncontrolPlane:\n  localAPIEndpoint: {}\n";
    const JOIN_WORKER: &str = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\n";
    const KUBE_VIP: &str = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: kube-vip\n    image: ghcr.io/kube-vip/kube-vip:v0.8.9\n    env:\n    - name: cp_enable\n      value: \"true\"\n    - name: address\n      value: \"127.77.100.1\"\n    - name: port\n      value: \"6443\"\n";

    #[test]
    fn plans_follow_the_kubeadm_command() {
        let init = control_plane_plan(&files(&[
            ("/run/kubeadm/kubeadm.yaml", INIT),
            ("/etc/kubernetes/manifests/kube-vip.yaml", KUBE_VIP),
        ]))
        .unwrap()
        .unwrap();
        assert!(init.init);
        assert_eq!(init.service_subnet, "10.128.0.0/12");
        assert_eq!(init.api_port, 7443);
        assert_eq!(
            init.vip,
            Some(Vip {
                address: "127.77.100.1".into(),
                port: 6443
            })
        );
        assert_eq!(init.pki.len(), REQUIRED_PKI.len());
        assert!(init.pki.iter().any(|(p, _)| p == "etcd/ca.key"));
        assert!(init.cluster_configuration.is_some());

        let join = control_plane_plan(&files(&[("/run/kubeadm/kubeadm-join-config.yaml", JOIN_CP)]))
            .unwrap()
            .unwrap();
        assert!(!join.init);
        assert_eq!(
            (join.service_subnet.as_str(), join.api_port, join.vip),
            (DEFAULT_SERVICE_SUBNET, 6443, None)
        );

        let worker = control_plane_plan(&[("/run/kubeadm/kubeadm-join-config.yaml".into(), JOIN_WORKER.into())]);
        assert_eq!(worker, Ok(None));
    }

    #[test]
    fn a_control_plane_without_its_cas_is_refused() {
        let f = vec![("/run/kubeadm/kubeadm.yaml".to_string(), INIT.to_string())];
        assert_eq!(control_plane_plan(&f), Err(PlanError::MissingPki("ca.crt")));
    }

    #[test]
    fn first_service_ips() {
        assert_eq!(first_service_ip("10.96.0.0/12"), Some([10, 96, 0, 1].into()));
        assert_eq!(
            first_service_ip("10.128.0.0/12,fd00::/108"),
            Some([10, 128, 0, 1].into())
        );
        assert_eq!(first_service_ip("nonsense"), None);
    }
}
