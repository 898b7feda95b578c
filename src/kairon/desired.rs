//! Which Kairon Machine should exist for a KaironMachine. Pure: no I/O.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::types::{GuestAgent, Image, ImageSource, Network, Placement, Resources, Term, WeightedTerm};
use super::{CloudInit, FAILURE_DOMAIN_ANNOTATION, Machine, MachineSpec, PROVIDER_ID_PREFIX, Vm, labels};
use crate::api::{FailureDomainSpec, KaironMachine, KaironMachineSpec, anti_affinity};

/// Longest value a label can hold.
const MAX_LABEL_VALUE: usize = 63;

/// The KaironMachine a Kairon Machine links back to: the inverse of the labels
/// [`desired_kairon_machine`] writes, or the Kairon Machine's own name and namespace.
pub(crate) fn kaironmachine_for_instance(vm: &Vm) -> Option<ObjectRef<KaironMachine>> {
    let ns = vm
        .label(labels::KAIRONMACHINE_NAMESPACE)
        .map(str::to_string)
        .or_else(|| vm.namespace())?;
    let name = vm
        .label(labels::KAIRONMACHINE_NAME)
        .map_or_else(|| vm.name_any(), str::to_string);
    Some(ObjectRef::new(&name).within(&ns))
}

/// The provider ID of a Kairon Machine named `name`: `kairon://<name>`. The guest sees its
/// Machine's name (the cloudInit hostname the provider sets) as its NoCloud `instance-id`, so
/// templates give kubelet `kairon://{{ ds.meta_data.instance_id }}`.
pub fn provider_id(name: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{name}")
}

/// The provider ID the old model gave a Kairon Machine (`kairon://<its uid>`), which a
/// KaironMachine made by an earlier version still carries (a provider ID is write-once).
pub fn uid_provider_id(kairon_uid: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{kairon_uid}")
}

/// Whether `pid` names `vm`: by its name, or by its uid as the old model did.
pub(crate) fn names_instance(pid: &str, vm: &Vm) -> bool {
    let by_name = vm.metadata.name.as_deref().is_some_and(|n| pid == provider_id(n));
    let by_uid = vm.metadata.uid.as_deref().is_some_and(|u| pid == uid_provider_id(u));
    by_name || by_uid
}

/// Whether `vm` is the instance a KaironMachine with provider ID `pid` provisioned: named by
/// its name (and, when the KaironMachine recorded the instance's uid, with that uid) or by its
/// uid in the old model's form. A Machine re-created under the same name is another instance.
pub(crate) fn is_the_instance(pid: &str, recorded_uid: Option<&str>, vm: &Vm) -> bool {
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
        l.insert(labels::ROLE.to_string(), labels::ROLE_CONTROL_PLANE.to_string());
    }
    // A MachineDeployment's VMs carry its name as its Machines do: what its disruption budget
    // selects (`budget`).
    if let Some(md) = km
        .labels()
        .get(crate::capi::DEPLOYMENT_NAME_LABEL)
        .filter(|v| !v.is_empty())
    {
        l.insert(crate::capi::DEPLOYMENT_NAME_LABEL.to_string(), md.clone());
    }
    // A pool member's VM carries its pool's name, for whoever lists a pool's VMs.
    if let Some(pool) = km
        .labels()
        .get(labels::KAIRONMACHINEPOOL_NAME)
        .filter(|v| !v.is_empty())
    {
        l.insert(labels::KAIRONMACHINEPOOL_NAME.to_string(), pool.clone());
    }
    l.insert(labels::MANAGED_BY.to_string(), labels::MANAGED_BY_VALUE.to_string());

    let mut annotations = BTreeMap::new();
    if let Some(fd) = failure_domain {
        annotations.insert(FAILURE_DOMAIN_ANNOTATION.to_string(), fd.name.clone());
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
        // The role label, not CAPI's control-plane label: that one's value is empty, and
        // Kairon matches `key: ""` on every Machine without the key (the cluster's workers).
        let others = BTreeMap::from([
            (labels::CLUSTER_NAME.to_string(), cluster_name.to_string()),
            (labels::ROLE.to_string(), labels::ROLE_CONTROL_PLANE.to_string()),
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
        // What the user wrote, field by field; what Kairon derives (a netns MAC, a tap
        // name) is left to Kairon.
        network: shape.network.as_ref().map(|n| Network {
            mode: n.mode.clone(),
            bridge: n.bridge.clone(),
            netns: n.netns,
            static_network: n.static_network,
            mac: n.mac.clone(),
            learn_ip: n.learn_ip,
            parent: n.parent.clone(),
            macvtap_mode: n.macvtap_mode.clone(),
        }),
        guest_agent: shape.guest_agent.as_ref().map(|g| GuestAgent { enabled: g.enabled }),
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
mod tests;
