//! Which Kairon Machine should exist for a KaironMachine. Pure: no I/O.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::types::{Image, ImageSource, Network, Placement, Resources, Term, WeightedTerm};
use super::{
    CloudInit, EVICTION_STRATEGY_ANNOTATION, FAILURE_DOMAIN_ANNOTATION, Machine, MachineSpec, PROVIDER_ID_PREFIX,
    labels,
};
use crate::api::{FailureDomainSpec, KaironMachine, KaironMachineSpec, anti_affinity};

/// Longest value a label can hold.
const MAX_LABEL_VALUE: usize = 63;

/// The KaironMachine a Kairon Machine links back to: the inverse of the labels
/// [`desired_kairon_machine`] writes, or the Kairon Machine's own name and namespace.
pub(crate) fn kaironmachine_for_instance(vm: &Machine) -> Option<ObjectRef<KaironMachine>> {
    let l = vm.labels();
    let ns = l
        .get(labels::KAIRONMACHINE_NAMESPACE)
        .cloned()
        .or_else(|| vm.namespace())?;
    let name = l
        .get(labels::KAIRONMACHINE_NAME)
        .cloned()
        .unwrap_or_else(|| vm.name_any());
    Some(ObjectRef::new(&name).within(&ns))
}

/// The provider ID of a Kairon Machine named `name`: `kairon://<name>`. The guest sees its
/// Machine's name (the cloudInit hostname the provider sets) as its NoCloud `instance-id`, so
/// templates give kubelet `kairon://{{ ds.meta_data.instance_id }}`.
pub fn provider_id(name: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{name}")
}

/// The provider ID the old model gave a Kairon Machine (`kairon://<its uid>`), which a
/// KaironMachine made by an earlier version still carries (a provider ID is write-once), and
/// which a KaironMachinePool's members still get until pools move to Kairon's MachineSet.
pub fn uid_provider_id(kairon_uid: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{kairon_uid}")
}

/// Whether `pid` names `vm`: by its name, or by its uid as the old model did.
pub(crate) fn names_instance(pid: &str, vm: &Machine) -> bool {
    let by_name = vm.metadata.name.as_deref().is_some_and(|n| pid == provider_id(n));
    let by_uid = vm.metadata.uid.as_deref().is_some_and(|u| pid == uid_provider_id(u));
    by_name || by_uid
}

/// Whether `vm` is the instance a KaironMachine with provider ID `pid` provisioned: named by
/// its name (and, when the KaironMachine recorded the instance's uid, with that uid) or by its
/// uid in the old model's form. A Machine re-created under the same name is another instance.
pub(crate) fn is_the_instance(pid: &str, recorded_uid: Option<&str>, vm: &Machine) -> bool {
    let uid = vm.metadata.uid.as_deref();
    if uid.is_some_and(|u| pid == uid_provider_id(u)) {
        return true;
    }
    let by_name = vm.metadata.name.as_deref().is_some_and(|n| pid == provider_id(n));
    by_name && recorded_uid.is_none_or(|r| Some(r) == uid)
}

/// Weight of the soft anti-affinity that spreads a cluster's control planes over Kairon nodes.
const CONTROL_PLANE_SPREAD_WEIGHT: i32 = 100;
/// The topology a control plane's spreading is over: one Kairon node each.
const NODE_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";

/// The Kairon Machine a KaironMachine should have: same name and namespace (deterministic, so
/// a crash between create and status write can never produce a second VM), link-back labels,
/// Kairon's image, resources and placement from the KaironMachine and its Machine's failure
/// domain, and the bootstrap data as Kairon's structured cloudInit (already translated, its
/// hostname the Machine's name).
///
/// No ownerReference is set on purpose: Kairon may drop it anyway, and a garbage-collected
/// VM during `clusterctl move` (which deletes the source KaironMachines) would destroy a
/// running node. Cleanup is explicit, behind our finalizer.
pub fn desired_kairon_machine(
    km: &KaironMachine,
    cluster_name: &str,
    control_plane: bool,
    cloud_init: CloudInit,
    failure_domain: Option<&FailureDomainSpec>,
) -> Machine {
    let name = km.name_any();
    let namespace = km.namespace().unwrap_or_default();

    let mut l = BTreeMap::new();
    // Label values are limited to 63 characters; a longer name is still found through the
    // Kairon Machine's own name, which equals the KaironMachine's.
    if name.len() <= MAX_LABEL_VALUE {
        l.insert(labels::KAIRONMACHINE_NAME.to_string(), name.clone());
    }
    l.insert(labels::KAIRONMACHINE_NAMESPACE.to_string(), namespace.clone());
    l.insert(labels::KAIRONMACHINE_UID.to_string(), km.uid().unwrap_or_default());
    let cluster_labelled = !cluster_name.is_empty() && cluster_name.len() <= MAX_LABEL_VALUE;
    if cluster_labelled {
        l.insert(labels::CLUSTER_NAME.to_string(), cluster_name.to_string());
    }
    if control_plane {
        l.insert(labels::CONTROL_PLANE.to_string(), String::new());
    }
    l.insert(labels::MANAGED_BY.to_string(), labels::MANAGED_BY_VALUE.to_string());

    let mut annotations = BTreeMap::new();
    if let Some(fd) = failure_domain {
        annotations.insert(FAILURE_DOMAIN_ANNOTATION.to_string(), fd.name.clone());
    }
    if let Some(strategy) = &km.spec.eviction_strategy {
        annotations.insert(EVICTION_STRATEGY_ANNOTATION.to_string(), strategy.clone());
    }

    // The failure domain's node selector wins over the template's on a conflicting key: the
    // domain is CAPI's placement decision.
    let mut node_selector = km.spec.node_selector().cloned().unwrap_or_default();
    if let Some(sel) = failure_domain.and_then(|fd| fd.node_selector.as_ref()) {
        node_selector.extend(sel.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let mut placement = Placement {
        node_selector: (!node_selector.is_empty()).then_some(node_selector),
        ..Default::default()
    };
    // A cluster's control planes on different Kairon nodes, so one node lost takes at most
    // one etcd member: soft by default, so that a cluster with more control planes than Kairon
    // nodes still schedules. The selector needs the cluster's label on every control plane.
    if control_plane && cluster_labelled {
        let others = BTreeMap::from([
            (labels::CLUSTER_NAME.to_string(), cluster_name.to_string()),
            (labels::CONTROL_PLANE.to_string(), String::new()),
        ]);
        match km.spec.control_plane_anti_affinity() {
            anti_affinity::NONE => {}
            anti_affinity::REQUIRED => {
                placement.anti_affinity = Some(vec![Term {
                    label_selector: others,
                    topology_key: NODE_TOPOLOGY_KEY.to_string(),
                }])
            }
            _ => {
                placement.preferred_anti_affinity = Some(vec![WeightedTerm {
                    weight: CONTROL_PLANE_SPREAD_WEIGHT,
                    label_selector: others,
                    topology_key: NODE_TOPOLOGY_KEY.to_string(),
                }])
            }
        }
    }

    Machine {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            labels: Some(l),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        },
        spec: kairon_spec(&km.spec, placement, Some(cloud_init)),
        status: None,
    }
}

/// Kairon's spec for a VM of this shape: the KaironMachine's image, resources (or instance
/// type) and network are already in Kairon's shapes and go over field by field; memory is
/// written in a form Kairon's parser reads.
pub(crate) fn kairon_spec(
    shape: &KaironMachineSpec,
    placement: Placement,
    cloud_init: Option<CloudInit>,
) -> MachineSpec {
    let image = &shape.image;
    MachineSpec {
        image: Some(Image {
            image_ref: image.image_ref.clone(),
            path: image.path.clone(),
            source: image.http_url.as_ref().map(|url| ImageSource {
                http_url: Some(url.clone()),
            }),
            digest: image.digest.clone(),
            disk_size: image.disk_size.as_ref().map(|q| q.0.clone()),
        }),
        resources: shape.resources.as_ref().map(|r| Resources {
            cpu: Some(r.cpu.0.clone()),
            memory: Some(kairon_memory(&r.memory.0)),
        }),
        instance_type_name: shape.instance_type_name.clone(),
        network: shape.network.as_ref().map(|n| Network {
            mode: n.mode.clone(),
            bridge: n.bridge.clone(),
        }),
        placement: (placement != Placement::default()).then_some(placement),
        cloud_init,
        ..Default::default()
    }
}

/// A Kubernetes memory quantity as Kairon parses one (`internal/model/quantity.go`: a number
/// with one of `Ti Gi Mi Ki T G M K`, or plain bytes). The CRD has already checked that it is a
/// quantity of at least 512Mi; a form Kairon does not read (`Pi`, `E`, `k`, an exponent) is
/// written as whole MiB, rounded up.
pub(crate) fn kairon_memory(q: &str) -> String {
    const KAIRONS: [&str; 8] = ["Ti", "Gi", "Mi", "Ki", "T", "G", "M", "K"];
    let q = q.trim();
    let plain =
        |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit() || b == b'.') && n.parse::<f64>().is_ok();
    for suffix in KAIRONS {
        if let Some(n) = q.strip_suffix(suffix) {
            if plain(n) {
                return q.to_string();
            }
            break;
        }
    }
    if plain(q) {
        return q.to_string();
    }
    match quantity_bytes(q) {
        Some(bytes) => format!("{}Mi", (bytes / (1024.0 * 1024.0)).ceil() as u64),
        None => q.to_string(),
    }
}

/// The bytes of a Kubernetes quantity (binary and decimal suffixes, decimal exponents).
fn quantity_bytes(q: &str) -> Option<f64> {
    const SUFFIXES: [(&str, f64); 13] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("Ei", 1152921504606846976.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
        ("m", 1e-3),
    ];
    for (suffix, mult) in SUFFIXES {
        if let Some(n) = q.strip_suffix(suffix)
            && let Ok(v) = n.parse::<f64>()
        {
            return Some(v * mult);
        }
    }
    q.parse::<f64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{KaironMachineSpec, MachineImage, MachineNetwork, MachinePlacement, MachineResources};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn km(name: &str) -> KaironMachine {
        let mut km = KaironMachine::new(
            name,
            KaironMachineSpec {
                resources: Some(MachineResources::new(2, "4Gi")),
                image: MachineImage::from_image_ref("ubuntu-2404-kube-v1.36.1", Some("40Gi")),
                ..Default::default()
            },
        );
        km.metadata.namespace = Some("ns".into());
        km.metadata.uid = Some("km-uid".into());
        km
    }

    fn fd(name: &str, sel: &[(&str, &str)]) -> FailureDomainSpec {
        FailureDomainSpec {
            name: name.into(),
            control_plane: Some(true),
            node_selector: Some(sel.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        }
    }

    fn label<'a>(m: &'a Machine, k: &str) -> Option<&'a str> {
        m.metadata.labels.as_ref().unwrap().get(k).map(String::as_str)
    }

    fn cloud_init(hostname: &str) -> CloudInit {
        CloudInit {
            hostname: hostname.into(),
            run_cmd: vec!["kubeadm join".into()],
            ..Default::default()
        }
    }

    struct Case {
        name: &'static str,
        km: KaironMachine,
        fd: Option<FailureDomainSpec>,
        want_selector: Option<Vec<(&'static str, &'static str)>>,
        want_fd_annotation: Option<&'static str>,
        want_name_label: bool,
    }

    #[test]
    fn desired_kairon_machine_table() {
        let mut with_sel = km("m-sel");
        with_sel.spec.placement = Some(MachinePlacement {
            node_selector: Some(
                [
                    ("disk".to_string(), "ssd".to_string()),
                    ("zone".to_string(), "template".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        });
        let cases = vec![
            Case {
                name: "plain",
                km: km("m1"),
                fd: None,
                want_selector: None,
                want_fd_annotation: None,
                want_name_label: true,
            },
            Case {
                name: "failure domain adds its node selector",
                km: km("m2"),
                fd: Some(fd("zone-a", &[("zone", "a")])),
                want_selector: Some(vec![("zone", "a")]),
                want_fd_annotation: Some("zone-a"),
                want_name_label: true,
            },
            Case {
                name: "failure domain wins a conflicting key, template keys stay",
                km: with_sel,
                fd: Some(fd("zone-b", &[("zone", "b")])),
                want_selector: Some(vec![("disk", "ssd"), ("zone", "b")]),
                want_fd_annotation: Some("zone-b"),
                want_name_label: true,
            },
            Case {
                name: "name too long for a label value",
                km: km(&"x".repeat(64)),
                fd: None,
                want_selector: None,
                want_fd_annotation: None,
                want_name_label: false,
            },
        ];
        for c in cases {
            let m = desired_kairon_machine(&c.km, "demo", false, cloud_init("h"), c.fd.as_ref());
            assert_eq!(m.metadata.name, c.km.metadata.name, "{}", c.name);
            assert_eq!(m.metadata.namespace.as_deref(), Some("ns"), "{}", c.name);
            assert!(m.metadata.owner_references.is_none(), "{}: no ownerReferences", c.name);
            assert_eq!(label(&m, labels::KAIRONMACHINE_UID), Some("km-uid"), "{}", c.name);
            assert_eq!(label(&m, labels::KAIRONMACHINE_NAMESPACE), Some("ns"), "{}", c.name);
            assert_eq!(label(&m, labels::CLUSTER_NAME), Some("demo"), "{}", c.name);
            assert_eq!(label(&m, labels::CONTROL_PLANE), None, "{}", c.name);
            assert_eq!(
                label(&m, labels::MANAGED_BY),
                Some("cluster-api-provider-kairon"),
                "{}",
                c.name
            );
            assert_eq!(
                label(&m, labels::KAIRONMACHINE_NAME).is_some(),
                c.want_name_label,
                "{}",
                c.name
            );
            let placement = m.spec.placement.clone();
            let sel = placement
                .as_ref()
                .and_then(|p| p.node_selector.clone())
                .map(|s| s.into_iter().collect::<Vec<_>>());
            let want = c.want_selector.map(|v| {
                v.into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<Vec<_>>()
            });
            assert_eq!(sel, want, "{}", c.name);
            assert!(
                placement.is_none_or(|p| p.preferred_anti_affinity.is_none()),
                "{}: a worker is not spread",
                c.name
            );
            assert_eq!(
                m.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(FAILURE_DOMAIN_ANNOTATION))
                    .map(String::as_str),
                c.want_fd_annotation,
                "{}",
                c.name
            );
            assert_eq!(
                m.spec.resources,
                Some(Resources {
                    cpu: Some("2".into()),
                    memory: Some("4Gi".into())
                })
            );
            let image = m.spec.image.as_ref().expect("image");
            assert_eq!(image.image_ref.as_deref(), Some("ubuntu-2404-kube-v1.36.1"));
            assert_eq!(image.disk_size.as_deref(), Some("40Gi"));
            assert_eq!(m.spec.cloud_init, Some(cloud_init("h")));
            assert_eq!(m.spec.legacy_user_data, None);
            assert_eq!(m.spec.node_name, None, "{}: Kairon schedules", c.name);
        }
    }

    /// What the provider writes is Kairon's shape: no field of the old model's spec.
    #[test]
    fn the_spec_serializes_in_kairons_shape() {
        let mut k = km("m");
        k.spec.eviction_strategy = Some("External".into());
        let m = desired_kairon_machine(&k, "demo", true, cloud_init("m"), Some(&fd("zone-a", &[("zone", "a")])));
        let spec = serde_json::to_value(&m.spec).unwrap();
        assert_eq!(
            spec,
            serde_json::json!({
                "image": {"imageRef": "ubuntu-2404-kube-v1.36.1", "diskSize": "40Gi"},
                "resources": {"cpu": "2", "memory": "4Gi"},
                "placement": {
                    "nodeSelector": {"zone": "a"},
                    "preferredAntiAffinity": [{"weight": 100, "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"cluster.x-k8s.io/cluster-name": "demo", "cluster.x-k8s.io/control-plane": ""}}]
                },
                "cloudInit": {"hostname": "m", "runCmd": ["kubeadm join"]}
            })
        );
        assert_eq!(label(&m, labels::CONTROL_PLANE), Some(""));
        assert_eq!(
            m.metadata
                .annotations
                .as_ref()
                .unwrap()
                .get(EVICTION_STRATEGY_ANNOTATION)
                .map(String::as_str),
            Some("External"),
            "the old model's strategy is an annotation, never a spec field"
        );
    }

    #[test]
    fn control_planes_are_spread_as_the_spec_asks() {
        let spread = |how: Option<&str>| {
            let mut k = km("m");
            k.spec.placement = how.map(|h| MachinePlacement {
                control_plane_anti_affinity: Some(h.into()),
                ..Default::default()
            });
            let m = desired_kairon_machine(&k, "demo", true, CloudInit::default(), None);
            let p = m.spec.placement.unwrap_or_default();
            (p.preferred_anti_affinity.is_some(), p.anti_affinity)
        };
        let others = BTreeMap::from([
            (labels::CLUSTER_NAME.to_string(), "demo".to_string()),
            (labels::CONTROL_PLANE.to_string(), String::new()),
        ]);
        assert_eq!(spread(None), (true, None), "soft by default");
        assert_eq!(spread(Some("Preferred")), (true, None));
        assert_eq!(
            spread(Some("Required")),
            (
                false,
                Some(vec![Term {
                    label_selector: others,
                    topology_key: "kubernetes.io/hostname".into()
                }])
            ),
            "Kairon's hard antiAffinity"
        );
        assert_eq!(spread(Some("None")), (false, None));
    }

    #[test]
    fn every_image_source_and_an_instance_type_go_over_in_kairons_shape() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let mut k = km("m");
        k.spec.image = MachineImage {
            http_url: Some("https://images.example/u.qcow2".into()),
            digest: Some(digest.clone()),
            ..Default::default()
        };
        k.spec.resources = None;
        k.spec.instance_type_name = Some("m.large".into());
        let spec =
            serde_json::to_value(desired_kairon_machine(&k, "demo", false, CloudInit::default(), None).spec).unwrap();
        assert_eq!(
            spec["image"],
            serde_json::json!({"source": {"httpURL": "https://images.example/u.qcow2"}, "digest": digest})
        );
        assert_eq!(spec["instanceTypeName"], "m.large");
        assert!(spec.get("resources").is_none(), "Kairon fills resources from the type");
        k.spec.image = MachineImage {
            path: Some("/var/lib/kairon/images/u.qcow2".into()),
            disk_size: Some(Quantity("30Gi".into())),
            ..Default::default()
        };
        let spec =
            serde_json::to_value(desired_kairon_machine(&k, "demo", false, CloudInit::default(), None).spec).unwrap();
        assert_eq!(
            spec["image"],
            serde_json::json!({"path": "/var/lib/kairon/images/u.qcow2", "diskSize": "30Gi"})
        );
    }

    #[test]
    fn a_tap_network_is_a_tap_on_that_bridge() {
        let mut k = km("m");
        k.spec.network = Some(MachineNetwork {
            mode: Some("tap".into()),
            bridge: Some("br-storage".into()),
        });
        let m = desired_kairon_machine(&k, "demo", false, CloudInit::default(), None);
        assert_eq!(
            m.spec.network,
            Some(Network {
                mode: Some("tap".into()),
                bridge: Some("br-storage".into())
            })
        );
    }

    #[test]
    fn memory_is_written_in_a_form_kairon_parses() {
        for (given, want) in [
            ("4Gi", "4Gi"),
            ("512Mi", "512Mi"),
            ("1.5Gi", "1.5Gi"),
            ("8G", "8G"),
            ("4294967296", "4294967296"),
            ("1Pi", "1073741824Mi"),
            ("600000k", "573Mi"),
            ("4e9", "3815Mi"),
        ] {
            assert_eq!(kairon_memory(given), want, "{given}");
        }
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let ci = CloudInit {
            run_cmd: vec!["kubeadm join --token TOP-SECRET-KEY".into()],
            ..Default::default()
        };
        let m = desired_kairon_machine(&km("m"), "demo", false, ci, None);
        let dbg = format!("{m:?}");
        assert!(!dbg.contains("TOP-SECRET-KEY"), "{dbg}");
        assert!(dbg.contains("redacted"));
    }

    #[test]
    fn provider_ids_use_the_kairon_scheme() {
        assert_eq!(provider_id("demo-md-0-x7k2p"), "kairon://demo-md-0-x7k2p");
        let mut vm = Machine::new("demo-md-0-x7k2p", MachineSpec::default());
        vm.metadata.uid = Some("3f6c".into());
        assert!(names_instance("kairon://demo-md-0-x7k2p", &vm));
        assert!(names_instance("kairon://3f6c", &vm), "the old model's uid form");
        assert!(!names_instance("kairon://other", &vm));
        assert!(is_the_instance("kairon://demo-md-0-x7k2p", None, &vm));
        assert!(is_the_instance("kairon://demo-md-0-x7k2p", Some("3f6c"), &vm));
        assert!(
            !is_the_instance("kairon://demo-md-0-x7k2p", Some("an-earlier-uid"), &vm),
            "a Machine re-created under the name is another instance"
        );
        assert!(is_the_instance("kairon://3f6c", Some("3f6c"), &vm));
        assert!(!is_the_instance("kairon://an-earlier-uid", None, &vm));
    }
}
