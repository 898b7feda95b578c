//! The objects of kubeadm's two addons, as kubeadm v1.37.2 renders them (the same manifests as
//! v1.36's, `cmd/kubeadm/app/phases/addons/{dns,proxy}`): what each object holds, in the order
//! kubeadm creates them. Pure: [`crate::addons`] reads the settings and writes the objects.

use std::net::IpAddr;

use serde_json::{Value, json};

/// kubeadm v1.37.2's `constants.CoreDNSVersion`, the CoreDNS image tag unless `dns.imageTag`.
pub const COREDNS_VERSION: &str = "v1.14.6";
/// kubeadm's default `imageRepository`.
pub const DEFAULT_IMAGE_REPOSITORY: &str = "registry.k8s.io";

/// What the addon phases read from the ClusterConfiguration, kubeadm's defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddonSettings {
    /// `kubernetesVersion`: kube-proxy's image tag.
    pub kubernetes_version: String,
    /// `imageRepository`: where both images come from unless overridden.
    pub image_repository: String,
    /// `dns.imageRepository`: overrides CoreDNS's repository.
    pub dns_image_repository: Option<String>,
    /// `dns.imageTag`: overrides CoreDNS's tag.
    pub dns_image_tag: Option<String>,
    /// `networking.dnsDomain`: the zone in the Corefile.
    pub dns_domain: String,
    /// `networking.podSubnet`: kube-proxy's `clusterCIDR`.
    pub pod_subnet: Option<String>,
    /// `networking.serviceSubnet`: where the `kube-dns` Service's address comes from.
    pub service_subnet: String,
    /// The API server URL in kube-proxy's kubeconfig.
    pub server: String,
    /// `proxy.disabled` (kubeadm v1beta4): the kube-proxy phase is skipped.
    pub proxy_disabled: bool,
    /// `dns.disabled` (kubeadm v1beta4): the CoreDNS phase is skipped.
    pub dns_disabled: bool,
}

impl AddonSettings {
    /// kubeadm's `GetKubernetesImage(kube-proxy)`: the control plane's repository and version,
    /// the version made a valid tag (`+` and the like become `_`).
    pub fn kube_proxy_image(&self) -> String {
        let tag: String = self
            .kubernetes_version
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("{}/kube-proxy:{tag}", self.image_repository)
    }

    /// kubeadm's `GetDNSImage`: `dns.imageRepository` else `imageRepository` (the official
    /// registry's image lives under `coredns/`), `dns.imageTag` else [`COREDNS_VERSION`].
    pub fn coredns_image(&self) -> String {
        let repository = self.dns_image_repository.as_ref().unwrap_or(&self.image_repository);
        let repository = if repository == DEFAULT_IMAGE_REPOSITORY {
            format!("{repository}/coredns")
        } else {
            repository.clone()
        };
        let tag = self.dns_image_tag.as_deref().unwrap_or(COREDNS_VERSION);
        format!("{repository}/coredns:{tag}")
    }
}

const SYSTEM: &str = "kube-system";
/// kubeadm's `constants.LabelNodeRoleControlPlane`, the taint of control-plane nodes.
const CONTROL_PLANE_TAINT: &str = "node-role.kubernetes.io/control-plane";
/// kubeadm's `constants.NodeBootstrapTokenAuthGroup`: joining nodes read kube-proxy's ConfigMap.
const NODE_BOOTSTRAP_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";
const RBAC: &str = "rbac.authorization.k8s.io";

fn meta(name: &str, namespace: Option<&str>, labels: Value) -> Value {
    let mut meta = json!({ "name": name });
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    if labels.as_object().is_some_and(|l| !l.is_empty()) {
        meta["labels"] = labels;
    }
    meta
}

fn service_account(name: &str) -> Value {
    json!({ "apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name, Some(SYSTEM), json!({})) })
}

fn binding(kind: &str, name: &str, namespace: Option<&str>, role: (&str, &str), subject: Value) -> Value {
    json!({
        "apiVersion": format!("{RBAC}/v1"), "kind": kind,
        "metadata": meta(name, namespace, json!({})),
        "roleRef": { "apiGroup": RBAC, "kind": role.0, "name": role.1 },
        "subjects": [subject],
    })
}

fn config_map(name: &str, labels: Value, data: Value) -> Value {
    json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(name, Some(SYSTEM), labels), "data": data })
}

/// kube-proxy's component config as kubeadm defaults and marshals it: the
/// `kubeproxy.config.k8s.io/v1alpha1` struct with every field (zero values included), keys
/// sorted, and only `bindAddress`, `clientConnection.kubeconfig` and `clusterCIDR` set.
pub fn kube_proxy_config(cluster_cidr: &str) -> Value {
    json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        // IPv4 nodes (kubeadm picks "::" for an IPv6 advertise address).
        "bindAddress": "0.0.0.0",
        "bindAddressHardFail": false,
        "clientConnection": {
            "acceptContentTypes": "", "burst": 0, "contentType": "",
            "kubeconfig": "/var/lib/kube-proxy/kubeconfig.conf", "qps": 0,
        },
        "clusterCIDR": cluster_cidr,
        "configSyncPeriod": "0s",
        "conntrack": {
            "maxPerCore": null, "min": null, "tcpBeLiberal": false, "tcpCloseWaitTimeout": null,
            "tcpEstablishedTimeout": null, "udpStreamTimeout": "0s", "udpTimeout": "0s",
        },
        "detectLocal": { "bridgeInterface": "", "interfaceNamePrefix": "" },
        "detectLocalMode": "",
        "enableProfiling": false,
        "healthzBindAddress": "",
        "hostnameOverride": "",
        "iptables": {
            "localhostNodePorts": null, "masqueradeAll": false, "masqueradeBit": null,
            "minSyncPeriod": "0s", "syncPeriod": "0s",
        },
        "ipvs": {
            "excludeCIDRs": null, "minSyncPeriod": "0s", "scheduler": "", "strictARP": false,
            "syncPeriod": "0s", "tcpFinTimeout": "0s", "tcpTimeout": "0s", "udpTimeout": "0s",
        },
        "logging": {
            "flushFrequency": 0,
            "options": { "json": { "infoBufferSize": "0" }, "text": { "infoBufferSize": "0" } },
            "verbosity": 0,
        },
        "metricsBindAddress": "",
        "mode": "",
        "nftables": { "masqueradeAll": false, "masqueradeBit": null, "minSyncPeriod": "0s", "syncPeriod": "0s" },
        "nodePortAddresses": null,
        "oomScoreAdj": null,
        "portRange": "",
        "showHiddenMetricsForVersion": "",
        "winkernel": {
            "enableDSR": false, "forwardHealthCheckVip": false, "networkName": "",
            "rootHnsEndpointName": "", "sourceVip": "",
        },
    })
}

/// The kubeconfig kube-proxy reads from its ConfigMap: the control-plane endpoint, with the
/// Pod's service-account token and CA.
fn kube_proxy_kubeconfig(server: &str) -> String {
    [
        "apiVersion: v1",
        "kind: Config",
        "clusters:",
        "- cluster:",
        "    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
        &format!("    server: {server}"),
        "  name: default",
        "contexts:",
        "- context:",
        "    cluster: default",
        "    namespace: default",
        "    user: default",
        "  name: default",
        "current-context: default",
        "users:",
        "- name: default",
        "  user:",
        "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
    ]
    .join("\n")
}

/// kube-proxy's objects in the order `kubeadm init phase addon kube-proxy` creates them:
/// ConfigMap, DaemonSet, then its ServiceAccount and RBAC (the `system:node-proxier`
/// ClusterRole itself is the API server's bootstrap policy). Fails only if the component
/// config cannot be written as YAML.
pub fn kube_proxy_objects(s: &AddonSettings) -> Result<Vec<Value>, serde_json::Error> {
    let labels = json!({ "k8s-app": "kube-proxy" });
    // kubeadm's template keeps both documents as `|-` blocks: no final newline.
    let config = serde_saphyr::to_string(&kube_proxy_config(s.pod_subnet.as_deref().unwrap_or_default()))
        .map_err(<serde_json::Error as serde::ser::Error>::custom)?
        .trim_end()
        .to_string();
    let daemon_set = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": meta("kube-proxy", Some(SYSTEM), labels.clone()),
        "spec": {
            "selector": { "matchLabels": labels },
            "updateStrategy": { "type": "RollingUpdate" },
            "template": {
                "metadata": { "labels": labels },
                "spec": {
                    "priorityClassName": "system-node-critical",
                    "containers": [{
                        "name": "kube-proxy",
                        "image": s.kube_proxy_image(),
                        "imagePullPolicy": "IfNotPresent",
                        "command": [
                            "/usr/local/bin/kube-proxy",
                            "--config=/var/lib/kube-proxy/config.conf",
                            "--hostname-override=$(NODE_NAME)",
                        ],
                        "securityContext": { "privileged": true },
                        "volumeMounts": [
                            { "mountPath": "/var/lib/kube-proxy", "name": "kube-proxy" },
                            { "mountPath": "/run/xtables.lock", "name": "xtables-lock", "readOnly": false },
                            { "mountPath": "/lib/modules", "name": "lib-modules", "readOnly": true },
                        ],
                        "env": [{ "name": "NODE_NAME", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } }],
                    }],
                    "hostNetwork": true,
                    "serviceAccountName": "kube-proxy",
                    "volumes": [
                        { "name": "kube-proxy", "configMap": { "name": "kube-proxy" } },
                        { "name": "xtables-lock", "hostPath": { "path": "/run/xtables.lock", "type": "FileOrCreate" } },
                        { "name": "lib-modules", "hostPath": { "path": "/lib/modules" } },
                    ],
                    // Every taint: kube-proxy runs on every node, even a not-ready one.
                    "tolerations": [{ "operator": "Exists" }],
                    "nodeSelector": { "kubernetes.io/os": "linux" },
                },
            },
        },
    });
    Ok(vec![
        config_map(
            "kube-proxy",
            json!({ "app": "kube-proxy" }),
            json!({ "kubeconfig.conf": kube_proxy_kubeconfig(&s.server), "config.conf": config }),
        ),
        daemon_set,
        service_account("kube-proxy"),
        binding(
            "ClusterRoleBinding",
            "kubeadm:node-proxier",
            None,
            ("ClusterRole", "system:node-proxier"),
            json!({ "kind": "ServiceAccount", "name": "kube-proxy", "namespace": SYSTEM }),
        ),
        json!({
            "apiVersion": format!("{RBAC}/v1"), "kind": "Role",
            "metadata": meta("kube-proxy", Some(SYSTEM), json!({})),
            "rules": [{ "verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["kube-proxy"] }],
        }),
        binding(
            "RoleBinding",
            "kube-proxy",
            Some(SYSTEM),
            ("Role", "kube-proxy"),
            json!({ "apiGroup": RBAC, "kind": "Group", "name": NODE_BOOTSTRAP_GROUP }),
        ),
    ])
}

/// kubeadm's default Corefile for the cluster's DNS domain.
pub fn corefile(dns_domain: &str) -> String {
    let cache = if dns_domain.is_empty() {
        "cache 30".to_string()
    } else {
        format!("cache 30 {{\n       disable success {dns_domain}\n       disable denial {dns_domain}\n    }}")
    };
    format!(
        ".:53 {{
    errors
    health {{
       lameduck 5s
    }}
    ready
    kubernetes {dns_domain} in-addr.arpa ip6.arpa {{
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }}
    prometheus :9153
    forward . /etc/resolv.conf {{
       max_concurrent 1000
    }}
    {cache}
    loop
    reload
    loadbalance
}}
"
    )
}

/// CoreDNS's objects in the order `kubeadm init phase addon coredns` creates them: ConfigMap,
/// ClusterRole, ClusterRoleBinding, ServiceAccount, Deployment, and the `kube-dns` Service at
/// `dns_ip` (the 10th address of the service subnet, the kubelets' `clusterDNS`).
pub fn coredns_objects(s: &AddonSettings, dns_ip: IpAddr) -> Vec<Value> {
    let labels = json!({ "k8s-app": "kube-dns" });
    let port =
        |name: &str, port: u16, protocol: &str| json!({ "containerPort": port, "name": name, "protocol": protocol });
    let service_port = |name: &str, port: u16, protocol: &str| json!({ "name": name, "port": port, "protocol": protocol, "targetPort": port });
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta("coredns", Some(SYSTEM), labels.clone()),
        "spec": {
            "replicas": 2,
            "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": 1 } },
            "selector": { "matchLabels": labels },
            "template": {
                "metadata": { "labels": labels },
                "spec": {
                    "priorityClassName": "system-cluster-critical",
                    "serviceAccountName": "coredns",
                    "affinity": { "podAntiAffinity": { "preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": { "matchExpressions": [{ "key": "k8s-app", "operator": "In", "values": ["kube-dns"] }] },
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }] } },
                    "tolerations": [
                        { "key": "CriticalAddonsOnly", "operator": "Exists" },
                        { "key": CONTROL_PLANE_TAINT, "effect": "NoSchedule" },
                    ],
                    "nodeSelector": { "kubernetes.io/os": "linux" },
                    "containers": [{
                        "name": "coredns",
                        "image": s.coredns_image(),
                        "imagePullPolicy": "IfNotPresent",
                        "resources": { "limits": { "memory": "170Mi" }, "requests": { "cpu": "100m", "memory": "70Mi" } },
                        "args": ["-conf", "/etc/coredns/Corefile"],
                        "volumeMounts": [{ "name": "config-volume", "mountPath": "/etc/coredns", "readOnly": true }],
                        "ports": [
                            port("dns", 53, "UDP"),
                            port("dns-tcp", 53, "TCP"),
                            port("metrics", 9153, "TCP"),
                            port("liveness-probe", 8080, "TCP"),
                            port("readiness-probe", 8181, "TCP"),
                        ],
                        "livenessProbe": {
                            "httpGet": { "path": "/health", "port": "liveness-probe", "scheme": "HTTP" },
                            "initialDelaySeconds": 60, "timeoutSeconds": 5, "successThreshold": 1, "failureThreshold": 5,
                        },
                        "readinessProbe": { "httpGet": { "path": "/ready", "port": "readiness-probe", "scheme": "HTTP" } },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "capabilities": { "add": ["NET_BIND_SERVICE"], "drop": ["ALL"] },
                            "readOnlyRootFilesystem": true,
                        },
                    }],
                    "dnsPolicy": "Default",
                    "volumes": [{
                        "name": "config-volume",
                        "configMap": { "name": "coredns", "items": [{ "key": "Corefile", "path": "Corefile" }] },
                    }],
                },
            },
        },
    });
    let mut service_meta = meta(
        "kube-dns",
        Some(SYSTEM),
        json!({ "k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS" }),
    );
    service_meta["annotations"] = json!({ "prometheus.io/port": "9153", "prometheus.io/scrape": "true" });
    let list_watch = json!(["list", "watch"]);
    vec![
        config_map("coredns", json!({}), json!({ "Corefile": corefile(&s.dns_domain) })),
        json!({
            "apiVersion": format!("{RBAC}/v1"), "kind": "ClusterRole",
            "metadata": meta("system:coredns", None, json!({})),
            "rules": [
                { "apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": list_watch },
                { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": list_watch },
            ],
        }),
        binding(
            "ClusterRoleBinding",
            "system:coredns",
            None,
            ("ClusterRole", "system:coredns"),
            json!({ "kind": "ServiceAccount", "name": "coredns", "namespace": SYSTEM }),
        ),
        service_account("coredns"),
        deployment,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": service_meta,
            "spec": {
                "clusterIP": dns_ip.to_string(),
                "ports": [service_port("dns", 53, "UDP"), service_port("dns-tcp", 53, "TCP"), service_port("metrics", 9153, "TCP")],
                "selector": labels,
            },
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What kubeadm v1.37.2 writes as `config.conf` (its defaulted KubeProxyConfiguration
    /// marshalled by sigs.k8s.io/yaml), but for serde-saphyr quoting `"0.0.0.0"`.
    const KUBEADM_CONFIG_CONF: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: "0.0.0.0"
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 192.168.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: """#;

    #[test]
    fn kube_proxy_config_is_kubeadms() {
        let settings = AddonSettings {
            kubernetes_version: "v1.37.2".into(),
            image_repository: "registry.k8s.io".into(),
            dns_image_repository: None,
            dns_image_tag: None,
            dns_domain: "cluster.local".into(),
            pod_subnet: Some("192.168.0.0/16".into()),
            service_subnet: "10.96.0.0/12".into(),
            server: "https://10.0.0.1:6443".into(),
            proxy_disabled: false,
            dns_disabled: false,
        };
        let objects = kube_proxy_objects(&settings).unwrap();
        assert_eq!(objects[0]["data"]["config.conf"], KUBEADM_CONFIG_CONF);
        assert_eq!(objects[0]["metadata"]["labels"], json!({"app": "kube-proxy"}));
        let kubeconfig = objects[0]["data"]["kubeconfig.conf"].as_str().unwrap();
        assert!(kubeconfig.starts_with("apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n"));
        assert!(kubeconfig.ends_with("tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"));
    }

    #[test]
    fn corefile_is_kubeadms() {
        let corefile = corefile("cluster.local");
        assert!(corefile.starts_with(".:53 {\n    errors\n    health {\n       lameduck 5s\n    }\n    ready\n"));
        assert!(corefile.contains(
            "    cache 30 {\n       disable success cluster.local\n       disable denial cluster.local\n    }\n    loop\n"
        ));
        assert!(corefile.ends_with("    loadbalance\n}\n"));
        assert!(self::corefile("").contains("    cache 30\n    loop\n"));
    }
}
