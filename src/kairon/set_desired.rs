//! Which Kairon MachineSets should back a KaironMachinePool. Pure: no I/O.
//!
//! Kairon replaces a set's members by itself, undrained, as soon as its template changes, and
//! copies the template, cloudInit included, into every member. So a pool never changes a set's
//! template: it keeps **one set per revision** of what its VMs are made of, named
//! `<pool>-<revision>`, and moves from one to the next itself, CAPI draining each Node on the
//! way ([`super::super::controller`]'s pool plan):
//! - the revision is a digest of the template: the VM shape, the bootstrap Secret's name and the
//!   Kubernetes version (as labels), nothing that changes on `clusterctl move` (UIDs, the
//!   management cluster);
//! - the template makes members **Stopped**, without cloudInit: no VM boots from it. The pool
//!   gives each new member its own cloudInit (the bootstrap data translated for that member's
//!   name, which is its hostname) and starts it. New content in the same Secret (CABPK rotates a
//!   pool's join token in place) reaches the members started after it and changes no set.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use ring::digest::{SHA256, digest};

use super::desired::kairon_spec;
use super::machineset::{MachineSet, MachineSetSpec, MachineTemplate};
use super::types::{Placement, power_state};
use super::{PROVIDER_ID_PREFIX, UserData, labels};
use crate::api::KaironMachineSpec;

/// Longest value a label can hold.
const MAX_LABEL_VALUE: usize = 63;

/// Annotation on each set of a pool: the pool's `spec.providerID`, which a pool keeps across
/// `clusterctl move` (its UID changes): the key of adoption.
pub const POOL_ID_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/kaironmachinepool-id";
/// Prefix of the annotation a pool puts on a set for each member it released,
/// `<prefix><member uid>`, in the same write that lowers `spec.replicas` for it.
pub const RELEASE_RECORD_PREFIX: &str = "released.kaironmachinepool.infrastructure.cluster.x-k8s.io/";
/// Label on each set of a pool: the revision its template is.
pub const REVISION_LABEL: &str = "infrastructure.cluster.x-k8s.io/kaironmachinepool-revision";

/// The KaironMachinePool a set is for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolLink {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

/// Everything the set's template is made of besides the pool's VM shape.
#[derive(Clone, Debug)]
pub struct SetInputs<'a> {
    pub pool: &'a PoolLink,
    pub cluster_name: &'a str,
    /// The pool's `spec.template`.
    pub template: &'a KaironMachineSpec,
    /// `MachinePool.spec.template.spec.bootstrap.dataSecretName`.
    pub bootstrap_secret: &'a str,
    /// `MachinePool.spec.template.spec.version`.
    pub version: Option<&'a str>,
}

/// The provider ID a KaironMachinePool records, once, for its first set:
/// `kairon://machinesets/<set uid>`. Every later set carries it ([`POOL_ID_ANNOTATION`]).
pub fn machine_set_provider_id(set_uid: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}machinesets/{set_uid}")
}

/// The set of the current revision, with `replicas` members. `pool_id`: the pool's
/// `spec.providerID`, if it has one yet. No ownerReference, as for VMs: cleanup is explicit,
/// behind the pool's finalizer.
pub fn desired_machine_set(inputs: &SetInputs<'_>, pool_id: Option<&str>, replicas: i32) -> MachineSet {
    let pool = inputs.pool;
    let template = desired_template(inputs);
    let rev = revision(&template);
    let mut l = link_labels(pool, inputs.cluster_name);
    l.insert(labels::KAIRONMACHINEPOOL_UID.to_string(), pool.uid.clone());
    l.insert(REVISION_LABEL.to_string(), rev.clone());
    let annotations = pool_id.map(|id| BTreeMap::from([(POOL_ID_ANNOTATION.to_string(), id.to_string())]));
    MachineSet {
        metadata: ObjectMeta {
            name: Some(set_name(&pool.name, &rev)),
            namespace: Some(pool.namespace.clone()),
            labels: Some(l),
            annotations,
            ..Default::default()
        },
        spec: MachineSetSpec {
            replicas,
            template,
            strategy: None,
            max_unavailable: None,
        },
        status: None,
    }
}

/// The name of a pool's set of revision `rev`.
pub fn set_name(pool: &str, rev: &str) -> String {
    format!("{pool}-{rev}")
}

/// The template of the current revision: the VM shape, Stopped, without cloudInit.
pub fn desired_template(inputs: &SetInputs<'_>) -> MachineTemplate {
    let mut l = link_labels(inputs.pool, inputs.cluster_name);
    l.insert(
        labels::BOOTSTRAP_SECRET.to_string(),
        label_value(inputs.bootstrap_secret),
    );
    if let Some(v) = inputs.version.filter(|v| !v.is_empty()) {
        l.insert(labels::KUBERNETES_VERSION.to_string(), label_value(v));
    }
    let t = inputs.template;
    let placement = Placement {
        node_selector: t.node_selector().filter(|s| !s.is_empty()).cloned(),
        ..Default::default()
    };
    let mut spec = kairon_spec(t, placement, None);
    spec.power_state = Some(power_state::STOPPED.to_string());
    if spec.placement.as_ref().is_some_and(|p| *p == Placement::default()) {
        spec.placement = None;
    }
    MachineTemplate { labels: Some(l), spec }
}

/// The revision a template is: 6 hex digits of its digest. Stable across processes (the JSON
/// form of our own types).
pub fn revision(template: &MachineTemplate) -> String {
    let json = serde_json::to_string(template).unwrap_or_default();
    let d = digest(&SHA256, json.as_bytes());
    d.as_ref()[..3].iter().map(|b| format!("{b:02x}")).collect()
}

/// The revision a set of a pool says it is (its label).
pub fn revision_of(set: &MachineSet) -> Option<&str> {
    set.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(REVISION_LABEL))
        .map(String::as_str)
}

/// A digest of bootstrap data: `sha256:<hex>`. Safe to show (it cannot be turned back into the
/// data); only compared.
pub fn bootstrap_data_hash(user_data: &UserData) -> String {
    let d = digest(&SHA256, user_data.as_str().as_bytes());
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The labels both the set and its members carry: what links a VM back to its pool.
fn link_labels(pool: &PoolLink, cluster_name: &str) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(labels::KAIRONMACHINEPOOL_NAME.to_string(), label_value(&pool.name));
    l.insert(labels::KAIRONMACHINEPOOL_NAMESPACE.to_string(), pool.namespace.clone());
    if !cluster_name.is_empty() && cluster_name.len() <= MAX_LABEL_VALUE {
        l.insert(labels::CLUSTER_NAME.to_string(), cluster_name.to_string());
    }
    l.insert(labels::MANAGED_BY.to_string(), labels::MANAGED_BY_VALUE.to_string());
    l
}

/// `value` if it fits a label, else a stable digest of it that does (object names run to 253
/// characters, label values to 63).
pub(crate) fn label_value(value: &str) -> String {
    if value.len() <= MAX_LABEL_VALUE {
        return value.to_string();
    }
    let d = digest(&SHA256, value.as_bytes());
    let hex: String = d.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256_{hex}")
}

#[cfg(test)]
#[path = "set_desired_tests.rs"]
mod tests;
