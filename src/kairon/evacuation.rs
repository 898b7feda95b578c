//! What Kairon shows of host maintenance for a Kairon Machine: the node (host) it runs on, that
//! node's labels, and whether the node is cordoned (`spec.unschedulable` on the Node of
//! Kairon's cluster), which is how an operator says the node is to be emptied. Pure: no I/O;
//! the Node comes from the manager's cache of Kairon's Nodes ([`super::nodes`]).
//!
//! Everything here may come from a tenant's Kairon API: strings are cleaned and bounded
//! before they reach a condition, an event or an annotation.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::Vm;
use crate::text::bounded;

/// A host name as we repeat it (a DNS name is at most 253 characters).
const MAX_HOST: usize = 253;

/// The VM's node is to be emptied: it is cordoned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The cordoned node.
    pub host: String,
}

/// The VM's evacuation request: its node is cordoned and the VM is not being deleted. `node`
/// is the Kairon Node the VM runs on, if known.
pub fn request(vm: &Vm, node: Option<&Node>) -> Option<Request> {
    if vm.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let host = host(vm)?;
    let node = node.filter(|n| n.name_any() == host)?;
    super::nodes::is_cordoned(node).then_some(Request { host })
}

/// The node the VM runs on, cleaned (`None`: not placed, or not reported).
pub fn host(vm: &Vm) -> Option<String> {
    vm.status
        .as_ref()?
        .node_name
        .as_deref()
        .filter(|h| !h.is_empty())
        .map(|h| bounded(h, MAX_HOST))
}

/// Whether the VM's node satisfies `selector` (a failure domain's node selector): `None` when
/// the node is not known (nothing can be said).
pub fn host_satisfies(selector: &BTreeMap<String, String>, node: Option<&Node>) -> Option<bool> {
    let labels = node?.metadata.labels.clone().unwrap_or_default();
    Some(selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The move a migration made, if the VM now runs on another node than `before` (the node last
/// recorded): `(from, to)`.
pub fn moved(before: Option<&str>, vm: &Vm) -> Option<(String, String)> {
    let before = before.filter(|h| !h.is_empty())?;
    let now = host(vm)?;
    (now != before).then(|| (before.to_string(), now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kairon::{fixtures, phase};
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn node(name: &str, cordoned: bool, zone: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([("topology.kairon.zyvor.dev/zone".to_string(), zone.to_string())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable: cordoned.then_some(true),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_vm_on_a_cordoned_node_is_asked_off_it() {
        let vm = fixtures::vm(Some(phase::RUNNING));
        let host = host(&Vm::from(vm.clone())).unwrap();
        assert_eq!(
            request(&Vm::from(vm.clone()), Some(&node(&host, true, "a"))),
            Some(Request { host: host.clone() })
        );
        assert_eq!(
            request(&Vm::from(vm.clone()), Some(&node(&host, false, "a"))),
            None,
            "not cordoned"
        );
        assert_eq!(
            request(&Vm::from(vm.clone()), Some(&node("another", true, "a"))),
            None,
            "another node"
        );
        assert_eq!(request(&Vm::from(vm.clone()), None), None, "node unknown");
        let mut deleting = vm.clone();
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(
            request(&Vm::from(deleting.clone()), Some(&node(&host, true, "a"))),
            None
        );
    }

    #[test]
    fn an_odd_node_name_is_cleaned_and_bounded() {
        let mut vm = fixtures::vm(Some(phase::RUNNING));
        vm.status.as_mut().unwrap().node_name = Some(format!("h\n{}", "x".repeat(400)));
        let h = host(&Vm::from(vm.clone())).unwrap();
        assert!(h.len() <= MAX_HOST && !h.contains('\n'));
    }

    #[test]
    fn node_labels_against_a_selector() {
        let zone = |z: &str| BTreeMap::from([("topology.kairon.zyvor.dev/zone".to_string(), z.to_string())]);
        assert_eq!(host_satisfies(&zone("a"), None), None, "node unknown");
        let n = node("h", false, "a");
        assert_eq!(host_satisfies(&zone("a"), Some(&n)), Some(true));
        assert_eq!(host_satisfies(&zone("b"), Some(&n)), Some(false));
        assert_eq!(host_satisfies(&BTreeMap::new(), Some(&n)), Some(true));
    }

    #[test]
    fn a_move_is_a_new_host_after_a_known_one() {
        let vm = fixtures::vm(Some(phase::RUNNING));
        assert_eq!(moved(None, &Vm::from(vm.clone())), None, "first placement is no move");
        assert_eq!(moved(Some("kairon-node-7"), &Vm::from(vm.clone())), None);
        assert_eq!(
            moved(Some("kairon-node-1"), &Vm::from(vm.clone())),
            Some(("kairon-node-1".into(), "kairon-node-7".into()))
        );
        let mut unplaced = vm.clone();
        unplaced.status.as_mut().unwrap().node_name = None;
        assert_eq!(moved(Some("kairon-node-1"), &Vm::from(unplaced.clone())), None);
    }
}
