//! What of the objects a KaironMachine reconcile reads makes it run again: of its Machine, its
//! Cluster. Each is a hash of exactly what a reconcile decides from, so that status churn of
//! CAPI's objects does not reconcile every machine.

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use crate::api::{self, KaironMachine};
use crate::capi;
use crate::hashing::hash_of;

/// The KaironMachine for a CAPI Machine: its `spec.infrastructureRef`.
pub(crate) fn kaironmachine_for_machine(m: &capi::MachineView) -> Option<ObjectRef<KaironMachine>> {
    let r = m
        .spec
        .infrastructure_ref
        .as_ref()
        .filter(|r| r.is(api::GROUP, "KaironMachine"))?;
    Some(ObjectRef::new(&r.name).within(&m.namespace()?))
}

/// What of a Cluster a KaironMachine reacts to: pause, provisioning state, deletion. Cluster
/// status changes all the time while a cluster comes up; without this every change would
/// reconcile every machine of the cluster.
pub(crate) fn cluster_trigger(c: &capi::Cluster) -> Option<u64> {
    Some(hash_of(&(
        c.spec.paused,
        c.infrastructure_provisioned(),
        c.control_plane_initialized(),
        c.metadata.deletion_timestamp.is_some(),
        &c.spec.infrastructure_ref,
    )))
}

/// Whether a Cluster has all the Machines it wants available: what an evacuation waiting for
/// its turn reacts to.
pub(crate) fn cluster_whole_trigger(c: &capi::Cluster) -> Option<u64> {
    Some(hash_of(&c.machines_short().is_none()))
}

/// What of a Machine a KaironMachine reacts to: bootstrap data, references, placement, role.
pub(crate) fn machine_trigger(m: &capi::MachineView) -> Option<u64> {
    Some(hash_of(&(
        m.data_secret_name(),
        &m.spec.infrastructure_ref,
        m.failure_domain(),
        m.is_control_plane(),
        &m.spec.cluster_name,
        m.metadata.deletion_timestamp.is_some(),
        // An evacuation waits for these (see `evacuation`).
        m.has_node(),
        m.never_gets_a_node(k8s_openapi::jiff::Timestamp::now()),
        m.is_marked_for_remediation(),
        m.skips_remediation(),
        m.controller_kind(),
    )))
}
