//! Kairon's hosts as the provider reads them: the Nodes of Kairon's own cluster (on the API
//! server that serves Kairon Machines). Read only: their names, labels (a failure domain's
//! node selector is checked against them) and `spec.unschedulable` (a cordon: the operator is
//! emptying the node). Kept small in the cache: nothing else of a Node is held.

use k8s_openapi::api::core::v1::{Node, NodeSpec};

use crate::hashing::hash_of;

/// Whether the node is cordoned.
pub fn is_cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// Drops everything of a Node the provider never reads.
pub(crate) fn keep_what_is_read(node: &mut Node) {
    let cordoned = is_cordoned(node);
    node.status = None;
    node.spec = cordoned.then(|| NodeSpec {
        unschedulable: Some(true),
        ..NodeSpec::default()
    });
    let meta = &mut node.metadata;
    meta.annotations = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
}

/// What of a Node the KaironMachines on it react to: its cordon and its labels.
pub(crate) fn trigger(node: &Node) -> Option<u64> {
    Some(hash_of(&(is_cordoned(node), &node.metadata.labels)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(cordoned: bool) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("h1".into()),
                labels: Some([("zone".to_string(), "a".to_string())].into()),
                annotations: Some([("big".to_string(), "x".repeat(1000))].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable: cordoned.then_some(true),
                pod_cidr: Some("10.0.0.0/24".into()),
                ..Default::default()
            }),
            status: Some(NodeStatus::default()),
        }
    }

    #[test]
    fn only_the_cordon_and_the_labels_are_kept() {
        let mut n = node(true);
        keep_what_is_read(&mut n);
        assert!(is_cordoned(&n));
        assert_eq!(n.spec.as_ref().and_then(|s| s.pod_cidr.clone()), None);
        assert_eq!((n.status, n.metadata.annotations), (None, None));
        assert_eq!(n.metadata.labels.map(|l| l.len()), Some(1));
        let mut n = node(false);
        keep_what_is_read(&mut n);
        assert!(!is_cordoned(&n) && n.spec.is_none());
    }

    #[test]
    fn a_cordon_or_a_label_change_triggers_nothing_else_does() {
        let (a, b) = (node(false), node(true));
        assert_ne!(trigger(&a), trigger(&b));
        let mut c = a.clone();
        c.status = None;
        assert_eq!(trigger(&a), trigger(&c));
        c.metadata.labels = None;
        assert_ne!(trigger(&a), trigger(&c));
    }
}
