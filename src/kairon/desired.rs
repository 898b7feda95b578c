//! Which Kairon Machine should exist for a KaironMachine. Pure: no I/O.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::{
    CloudInit, FAILURE_DOMAIN_ANNOTATION, Machine, MachineSpec, Network, PROVIDER_ID_PREFIX, UserData, labels,
};
use crate::api::{FailureDomainSpec, KaironMachine};

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

/// The provider ID for a Kairon Machine with this uid.
pub fn provider_id(kairon_uid: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{kairon_uid}")
}

/// The Kairon Machine a KaironMachine should have: same name and namespace (deterministic, so
/// a crash between create and status write can never produce a second VM), link-back labels,
/// placement from the Machine's failure domain, and the bootstrap payload as user-data.
///
/// No ownerReference is set on purpose: Kairon may drop it anyway, and a garbage-collected
/// VM during `clusterctl move` (which deletes the source KaironMachines) would destroy a
/// running node. Cleanup is explicit, behind our finalizer.
pub fn desired_kairon_machine(
    km: &KaironMachine,
    cluster_name: &str,
    user_data: impl Into<UserData>,
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
    if !cluster_name.is_empty() && cluster_name.len() <= MAX_LABEL_VALUE {
        l.insert(labels::CLUSTER_NAME.to_string(), cluster_name.to_string());
    }
    l.insert(labels::MANAGED_BY.to_string(), labels::MANAGED_BY_VALUE.to_string());

    let annotations =
        failure_domain.map(|fd| BTreeMap::from([(FAILURE_DOMAIN_ANNOTATION.to_string(), fd.name.clone())]));

    // The failure domain's host selector wins over the template's on a conflicting key: the
    // domain is CAPI's placement decision.
    let mut node_selector = km.spec.node_selector.clone().unwrap_or_default();
    if let Some(sel) = failure_domain.and_then(|fd| fd.node_selector.as_ref()) {
        node_selector.extend(sel.iter().map(|(k, v)| (k.clone(), v.clone())));
    }

    Machine {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            labels: Some(l),
            annotations,
            ..Default::default()
        },
        spec: MachineSpec {
            cpus: km.spec.cpus,
            memory: km.spec.memory.clone(),
            image: km.spec.image.clone(),
            disk_size: km.spec.disk_size.clone(),
            network: km.spec.network.as_ref().map(|n| Network { name: n.name.clone() }),
            node_selector: (!node_selector.is_empty()).then_some(node_selector),
            cloud_init: Some(CloudInit {
                user_data: Some(user_data.into()),
                network_config: None,
            }),
            eviction_strategy: km.spec.eviction_strategy.clone(),
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{KaironMachineSpec, NetworkRef};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn km(name: &str) -> KaironMachine {
        let mut km = KaironMachine::new(
            name,
            KaironMachineSpec {
                cpus: 2,
                memory: Quantity("4Gi".into()),
                image: "ubuntu-2404-kube-v1.36.1".into(),
                disk_size: Quantity("40Gi".into()),
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
        with_sel.spec.node_selector = Some(
            [
                ("disk".to_string(), "ssd".to_string()),
                ("zone".to_string(), "template".to_string()),
            ]
            .into(),
        );
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
                name: "failure domain adds its host selector",
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
            let m = desired_kairon_machine(&c.km, "demo", UserData("#cloud-config\n".into()), c.fd.as_ref());
            assert_eq!(m.metadata.name, c.km.metadata.name, "{}", c.name);
            assert_eq!(m.metadata.namespace.as_deref(), Some("ns"), "{}", c.name);
            assert!(m.metadata.owner_references.is_none(), "{}: no ownerReferences", c.name);
            assert_eq!(label(&m, labels::KAIRONMACHINE_UID), Some("km-uid"), "{}", c.name);
            assert_eq!(label(&m, labels::KAIRONMACHINE_NAMESPACE), Some("ns"), "{}", c.name);
            assert_eq!(label(&m, labels::CLUSTER_NAME), Some("demo"), "{}", c.name);
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
            let sel = m.spec.node_selector.clone().map(|s| s.into_iter().collect::<Vec<_>>());
            let want = c.want_selector.map(|v| {
                v.into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<Vec<_>>()
            });
            assert_eq!(sel, want, "{}", c.name);
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
            assert_eq!(m.spec.cpus, 2);
            assert_eq!(m.spec.memory, Quantity("4Gi".into()));
            assert_eq!(m.spec.disk_size, Quantity("40Gi".into()));
            assert_eq!(m.spec.image, "ubuntu-2404-kube-v1.36.1");
            assert_eq!(
                m.spec.cloud_init.as_ref().unwrap().user_data.as_ref().unwrap().as_str(),
                "#cloud-config\n"
            );
        }
    }

    #[test]
    fn network_is_carried_over() {
        let mut k = km("m");
        k.spec.network = Some(NetworkRef { name: "storage".into() });
        let m = desired_kairon_machine(&k, "demo", UserData::default(), None);
        assert_eq!(m.spec.network, Some(Network { name: "storage".into() }));
    }

    #[test]
    fn user_data_never_shows_in_debug_output() {
        let m = desired_kairon_machine(&km("m"), "demo", UserData("TOP-SECRET-KEY".into()), None);
        let dbg = format!("{m:?}");
        assert!(!dbg.contains("TOP-SECRET-KEY"), "{dbg}");
        assert!(dbg.contains("redacted"));
    }

    #[test]
    fn provider_id_uses_the_kairon_scheme() {
        assert_eq!(provider_id("3f6c"), "kairon://3f6c");
    }
}
