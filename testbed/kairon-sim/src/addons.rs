//! kubeadm's two addons, CoreDNS and kube-proxy, as `kubeadm init` (v1.37.2) installs them in
//! its `addon/coredns` and `addon/kube-proxy` phases. A simulated control plane runs
//! kube-controller-manager and kube-scheduler, and KWOK plays the kubelets, so these are
//! scheduled and go Running like any workload, and the workload cluster holds what KCP reads
//! and upgrades (the `kube-proxy` DaemonSet's image, the `coredns` Deployment and Corefile).
//!
//! [`AddonSettings`] (`addons_objects`) is what the phases read from the ClusterConfiguration; the objects are
//! built by [`crate::addons_objects`] (pure) and written here, each created if missing.

use std::net::IpAddr;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::core::Status;
use serde_json::Value;

use crate::addons_objects::{AddonSettings, DEFAULT_IMAGE_REPOSITORY, coredns_objects, kube_proxy_objects};
use crate::kubeadm::{ControlPlanePlan, first_service_ip};
use crate::workload::create_if_missing;

/// The Kubernetes version used when the ClusterConfiguration names none (CABPK always
/// writes one; kubeadm itself would look up the latest stable release): kubeadm's own.
pub const KUBEADM_VERSION: &str = "v1.37.2";
/// kubeadm's default `networking.dnsDomain`.
pub const DEFAULT_DNS_DOMAIN: &str = "cluster.local";

impl AddonSettings {
    /// The settings of an init plan's ClusterConfiguration (kubeadm's defaults without one).
    pub fn of_plan(plan: &ControlPlanePlan) -> Self {
        let cc = plan.cluster_configuration.as_ref();
        let text = |pointer: &str| {
            cc.and_then(|c| c.pointer(pointer))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let disabled = |pointer: &str| cc.and_then(|c| c.pointer(pointer)).and_then(Value::as_bool) == Some(true);
        // kubeadm's GetControlPlaneEndpoint: controlPlaneEndpoint (CAPI always sets it), with
        // the API server's bind port if it names none; then the VIP (where init_config_maps
        // looks too), then the `kubernetes` Service, as the node's address is not in the plan.
        let server = text("/controlPlaneEndpoint")
            .or_else(|| plan.vip.as_ref().map(|v| format!("{}:{}", v.address, v.port)))
            .map(|endpoint| server_url(&endpoint, plan.api_port))
            .unwrap_or_else(|| {
                let ip = first_service_ip(&plan.service_subnet).unwrap_or([10, 96, 0, 1].into());
                format!("https://{ip}:443")
            });
        AddonSettings {
            kubernetes_version: text("/kubernetesVersion").unwrap_or_else(|| KUBEADM_VERSION.into()),
            image_repository: text("/imageRepository").unwrap_or_else(|| DEFAULT_IMAGE_REPOSITORY.into()),
            dns_image_repository: text("/dns/imageRepository"),
            dns_image_tag: text("/dns/imageTag"),
            dns_domain: text("/networking/dnsDomain").unwrap_or_else(|| DEFAULT_DNS_DOMAIN.into()),
            pod_subnet: text("/networking/podSubnet"),
            service_subnet: plan.service_subnet.clone(),
            server,
            proxy_disabled: disabled("/proxy/disabled"),
            dns_disabled: disabled("/dns/disabled"),
        }
    }
}

/// `https://host:port` of a `host[:port]` endpoint, the port defaulting to `default_port`.
fn server_url(endpoint: &str, default_port: u16) -> String {
    let (host, port) = match endpoint.parse::<std::net::SocketAddr>() {
        Ok(addr) => (addr.ip().to_string(), addr.port()),
        Err(_) => match endpoint.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') => (host.to_string(), port.parse().unwrap_or(default_port)),
            _ => (endpoint.trim_matches(['[', ']']).to_string(), default_port),
        },
    };
    if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    }
}

/// kubeadm's `GetDNSIP`: the 10th address of the (first) service subnet, which kubeadm also
/// gives the kubelets as `clusterDNS`. `None` if the subnet is unreadable or too small.
pub fn dns_ip(service_subnet: &str) -> Option<IpAddr> {
    let (base, prefix) = service_subnet.split(',').next()?.trim().split_once('/')?;
    let prefix: u32 = prefix.parse().ok()?;
    let tenth = |base: u128, bits: u32| -> Option<u128> {
        let host_bits = bits.checked_sub(prefix)?;
        // The subnet must hold 11 addresses at least.
        if host_bits < 4 {
            return None;
        }
        let network = if host_bits >= 128 {
            0
        } else {
            base >> host_bits << host_bits
        };
        Some(network + 10)
    };
    match base.parse::<IpAddr>().ok()? {
        IpAddr::V4(ip) => Some(IpAddr::V4(u32::try_from(tenth(u32::from(ip).into(), 32)?).ok()?.into())),
        IpAddr::V6(ip) => Some(IpAddr::V6(tenth(u128::from(ip), 128)?.into())),
    }
}

/// An error about what the addons were asked to be, as the API server would word it.
fn invalid(message: &str) -> kube::Error {
    kube::Error::Api(Status::failure(message, "Invalid").with_code(422).boxed())
}

/// The addons' objects in the order `kubeadm init` creates them (CoreDNS, then kube-proxy),
/// without the disabled ones.
pub fn addon_objects(s: &AddonSettings) -> Result<Vec<Value>, kube::Error> {
    let mut objects = Vec::new();
    if !s.dns_disabled {
        let ip = dns_ip(&s.service_subnet).ok_or_else(|| {
            invalid(&format!(
                "unable to get the DNS Service's IP from the service subnet {:?}",
                s.service_subnet
            ))
        })?;
        objects.extend(coredns_objects(s, ip));
    }
    if !s.proxy_disabled {
        objects.extend(kube_proxy_objects(s).map_err(kube::Error::SerdeError)?);
    }
    Ok(objects)
}

/// Writes the addons `kubeadm init` installs into a new workload cluster: each object is
/// created if missing (an existing one, say from an earlier attempt, is kept as it is).
pub async fn write_addons(client: &Client, plan: &ControlPlanePlan) -> Result<(), kube::Error> {
    for object in addon_objects(&AddonSettings::of_plan(plan))? {
        let object: DynamicObject = serde_json::from_value(object).map_err(kube::Error::SerdeError)?;
        let resource = api_resource(&object)?;
        let api = match object.metadata.namespace.as_deref() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        create_if_missing(&api, &object).await?;
    }
    Ok(())
}

/// The resource of an object from its apiVersion and kind (the plurals of the addons' kinds
/// are all regular).
fn api_resource(object: &DynamicObject) -> Result<ApiResource, kube::Error> {
    let types = object
        .types
        .as_ref()
        .ok_or_else(|| invalid("an addon object lacks apiVersion/kind"))?;
    let gvk = GroupVersionKind::try_from(types).map_err(|e| invalid(&e.to_string()))?;
    Ok(ApiResource::from_gvk(&gvk))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
    use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use serde_json::json;

    use super::*;
    use crate::kubeadm::Vip;

    fn plan(cluster_configuration: Option<Value>) -> ControlPlanePlan {
        ControlPlanePlan {
            init: true,
            pki: vec![],
            cluster_configuration,
            service_subnet: "10.96.0.0/12".into(),
            api_port: 6443,
            vip: None,
        }
    }

    fn objects(cluster_configuration: Value) -> Vec<Value> {
        addon_objects(&AddonSettings::of_plan(&plan(Some(cluster_configuration)))).unwrap()
    }

    fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind}/{name}"))
    }

    #[test]
    fn images_follow_the_version_and_the_repositories() {
        let cases = [
            (
                "defaults",
                json!({}),
                "registry.k8s.io/kube-proxy:v1.37.2",
                "registry.k8s.io/coredns/coredns:v1.14.6",
            ),
            (
                "version",
                json!({"kubernetesVersion": "v1.35.2"}),
                "registry.k8s.io/kube-proxy:v1.35.2",
                "registry.k8s.io/coredns/coredns:v1.14.6",
            ),
            (
                "version made a tag",
                json!({"kubernetesVersion": "v1.36.3+build.1"}),
                "registry.k8s.io/kube-proxy:v1.36.3_build.1",
                "registry.k8s.io/coredns/coredns:v1.14.6",
            ),
            (
                "mirror: no coredns/ path",
                json!({"imageRepository": "mirror.example/k8s", "kubernetesVersion": "v1.36.1"}),
                "mirror.example/k8s/kube-proxy:v1.36.1",
                "mirror.example/k8s/coredns:v1.14.6",
            ),
            (
                "dns overrides",
                json!({"imageRepository": "mirror.example/k8s", "dns": {"imageRepository": "dns.example", "imageTag": "v1.12.1"}}),
                "mirror.example/k8s/kube-proxy:v1.37.2",
                "dns.example/coredns:v1.12.1",
            ),
            (
                "dns back on the official registry",
                json!({"imageRepository": "mirror.example/k8s", "dns": {"imageRepository": "registry.k8s.io"}}),
                "mirror.example/k8s/kube-proxy:v1.37.2",
                "registry.k8s.io/coredns/coredns:v1.14.6",
            ),
        ];
        for (name, cc, proxy, coredns) in cases {
            let objects = objects(cc);
            let ds = find(&objects, "DaemonSet", "kube-proxy");
            assert_eq!(
                ds["spec"]["template"]["spec"]["containers"][0]["image"], proxy,
                "{name}"
            );
            let deployment = find(&objects, "Deployment", "coredns");
            assert_eq!(
                deployment["spec"]["template"]["spec"]["containers"][0]["image"], coredns,
                "{name}"
            );
        }
    }

    #[test]
    fn kube_dns_is_the_tenth_address_of_the_service_subnet() {
        let cases = [
            ("10.96.0.0/12", Some("10.96.0.10")),
            ("10.128.0.0/12,fd00::/108", Some("10.128.0.10")),
            ("192.168.7.5/24", Some("192.168.7.10")),
            ("10.0.0.0/28", Some("10.0.0.10")),
            ("fd00:10:96::/108", Some("fd00:10:96::a")),
            ("10.0.0.0/29", None),
            ("10.0.0.0/33", None),
            ("nonsense", None),
        ];
        for (subnet, want) in cases {
            assert_eq!(dns_ip(subnet).map(|ip| ip.to_string()).as_deref(), want, "{subnet}");
            let mut p = plan(None);
            p.service_subnet = subnet.into();
            match (addon_objects(&AddonSettings::of_plan(&p)), want) {
                (Ok(objects), Some(ip)) => assert_eq!(find(&objects, "Service", "kube-dns")["spec"]["clusterIP"], ip),
                (Err(kube::Error::Api(s)), None) => assert!(s.is_invalid(), "{subnet}"),
                (got, _) => panic!("{subnet}: {got:?}"),
            }
        }
        let objects = objects(json!({}));
        let ports: Vec<_> = find(&objects, "Service", "kube-dns")["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap()))
            .collect();
        assert_eq!(ports, ["53/UDP", "53/TCP", "9153/TCP"]);
    }

    #[test]
    fn disabled_addons_are_skipped() {
        let coredns = [
            "ConfigMap/coredns",
            "ClusterRole/system:coredns",
            "ClusterRoleBinding/system:coredns",
            "ServiceAccount/coredns",
            "Deployment/coredns",
            "Service/kube-dns",
        ];
        let proxy = [
            "ConfigMap/kube-proxy",
            "DaemonSet/kube-proxy",
            "ServiceAccount/kube-proxy",
            "ClusterRoleBinding/kubeadm:node-proxier",
            "Role/kube-proxy",
            "RoleBinding/kube-proxy",
        ];
        let both: Vec<&str> = coredns.iter().chain(&proxy).copied().collect();
        let cases: [(Value, &[&str]); 5] = [
            (json!({}), &both),
            (json!({"proxy": {"disabled": false}, "dns": {"disabled": false}}), &both),
            (json!({"proxy": {"disabled": true}}), &coredns),
            (json!({"dns": {"disabled": true}}), &proxy),
            (json!({"proxy": {"disabled": true}, "dns": {"disabled": true}}), &[]),
        ];
        for (cc, want) in cases {
            let got: Vec<String> = objects(cc.clone())
                .iter()
                .map(|o| {
                    format!(
                        "{}/{}",
                        o["kind"].as_str().unwrap(),
                        o["metadata"]["name"].as_str().unwrap()
                    )
                })
                .collect();
            assert_eq!(got, want, "{cc}");
        }
    }

    #[test]
    fn kube_proxy_runs_on_every_node_and_coredns_on_control_planes_too() {
        let objects = objects(json!({}));
        let proxy = &find(&objects, "DaemonSet", "kube-proxy")["spec"]["template"]["spec"];
        assert_eq!(proxy["tolerations"], json!([{"operator": "Exists"}]));
        assert_eq!(proxy["hostNetwork"], true);
        assert_eq!(proxy["priorityClassName"], "system-node-critical");
        assert_eq!(proxy["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
        assert_eq!(proxy["serviceAccountName"], "kube-proxy");
        let coredns = &find(&objects, "Deployment", "coredns")["spec"];
        assert_eq!(coredns["replicas"], 2);
        assert_eq!(
            coredns["template"]["metadata"]["labels"],
            json!({"k8s-app": "kube-dns"})
        );
        let pod = &coredns["template"]["spec"];
        assert_eq!(
            pod["tolerations"],
            json!([{"key": "CriticalAddonsOnly", "operator": "Exists"}, {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}])
        );
        assert_eq!(pod["priorityClassName"], "system-cluster-critical");
        let anti = &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(anti["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname");
    }

    #[test]
    fn kube_proxy_config_and_corefile_follow_the_cluster() {
        let cases = [
            (
                "defaults, the VIP",
                plan(None),
                "https://127.77.100.1:6443",
                "",
                "cluster.local",
            ),
            (
                "endpoint without a port: the bind port",
                plan(Some(
                    json!({"controlPlaneEndpoint": "cp.example", "networking": {"podSubnet": "192.168.0.0/16", "dnsDomain": "corp.internal"}}),
                )),
                "https://cp.example:7443",
                "192.168.0.0/16",
                "corp.internal",
            ),
            (
                "IPv6 endpoint",
                plan(Some(json!({"controlPlaneEndpoint": "[fd00::1]:6443"}))),
                "https://[fd00::1]:6443",
                "",
                "cluster.local",
            ),
        ];
        for (name, mut p, server, cluster_cidr, domain) in cases {
            p.api_port = 7443;
            if p.cluster_configuration.is_none() {
                p.vip = Some(Vip {
                    address: "127.77.100.1".into(),
                    port: 6443,
                });
            }
            let objects = addon_objects(&AddonSettings::of_plan(&p)).unwrap();
            let data = &find(&objects, "ConfigMap", "kube-proxy")["data"];
            let kubeconfig = data["kubeconfig.conf"].as_str().unwrap();
            assert!(
                kubeconfig.contains(&format!("\n    server: {server}\n")),
                "{name}: {kubeconfig}"
            );
            let config: Value = serde_saphyr::from_str(data["config.conf"].as_str().unwrap()).unwrap();
            assert_eq!(config["clusterCIDR"], cluster_cidr, "{name}");
            assert_eq!(
                config["clientConnection"]["kubeconfig"],
                "/var/lib/kube-proxy/kubeconfig.conf"
            );
            let corefile = find(&objects, "ConfigMap", "coredns")["data"]["Corefile"]
                .as_str()
                .unwrap();
            assert!(
                corefile.contains(&format!("kubernetes {domain} in-addr.arpa ip6.arpa {{")),
                "{name}"
            );
            assert!(corefile.contains(&format!("disable denial {domain}\n")), "{name}");
        }
        // No endpoint at all: the `kubernetes` Service.
        assert_eq!(AddonSettings::of_plan(&plan(None)).server, "https://10.96.0.1:443");
    }

    /// Each object is a valid object of its kind (k8s-openapi reads every field back), and
    /// the writer finds its resource.
    #[test]
    fn objects_are_valid_and_map_to_their_resources() {
        fn same<K: serde::de::DeserializeOwned + serde::Serialize>(o: &Value) -> bool {
            serde_json::to_value(serde_json::from_value::<K>(o.clone()).unwrap()).unwrap() == *o
        }
        for o in objects(json!({"networking": {"podSubnet": "10.244.0.0/16"}})) {
            let (valid, plural) = match o["kind"].as_str().unwrap() {
                "ServiceAccount" => (same::<ServiceAccount>(&o), "serviceaccounts"),
                "ConfigMap" => (same::<ConfigMap>(&o), "configmaps"),
                "Service" => (same::<Service>(&o), "services"),
                "DaemonSet" => (same::<DaemonSet>(&o), "daemonsets"),
                "Deployment" => (same::<Deployment>(&o), "deployments"),
                "ClusterRole" => (same::<ClusterRole>(&o), "clusterroles"),
                "ClusterRoleBinding" => (same::<ClusterRoleBinding>(&o), "clusterrolebindings"),
                "Role" => (same::<Role>(&o), "roles"),
                "RoleBinding" => (same::<RoleBinding>(&o), "rolebindings"),
                other => panic!("unexpected kind {other}"),
            };
            assert!(valid, "{o}");
            let resource = api_resource(&serde_json::from_value(o.clone()).unwrap()).unwrap();
            assert_eq!(resource.plural, plural);
            assert_eq!(resource.api_version, o["apiVersion"]);
            let cluster_scoped = o["kind"].as_str().unwrap().starts_with("Cluster");
            assert_eq!(o["metadata"].get("namespace").is_none(), cluster_scoped, "{o}");
        }
    }
}
