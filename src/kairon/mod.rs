//! Everything the provider assumes about Kairon's Machine API (`kairon.zyvor.dev/v1alpha1`,
//! kind `Machine`) lives in this module, so that following Kairon's real schema is a change in
//! one place.
//!
//! - [`Machine`]: our model of a Kairon Machine (also the source of the development CRD);
//! - [`desired`]: which Kairon Machine should exist for a KaironMachine (pure);
//! - [`observe`]: what a Kairon Machine's status means for the KaironMachine (pure);
//! - [`client`]: how Kairon is spoken to — the only place that reads, creates, relabels and
//!   deletes Kairon Machines.

mod client;
pub mod desired;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod observe;
mod types;

pub use client::{Created, Deletion, Instances, KaironError};
pub use desired::{desired_kairon_machine, provider_id};
pub(crate) use observe::{Ownership, ownership};
pub use types::{Address, CloudInit, Machine, MachineSpec, MachineStatus, Network, UserData, phase};

/// Scheme of provider IDs: `kairon://<uid of the Kairon Machine>`. The guest sees the uid as
/// its NoCloud `instance-id`, so kubelet can be given the same provider ID.
pub(crate) const PROVIDER_ID_PREFIX: &str = "kairon://";

/// Links back from a Kairon Machine to the KaironMachine that created it. Labels, because
/// Kairon's controller can drop ownerReferences when it writes a Machine back.
pub mod labels {
    pub(crate) const KAIRONMACHINE_NAME: &str = "infrastructure.cluster.x-k8s.io/kaironmachine-name";
    pub(crate) const KAIRONMACHINE_NAMESPACE: &str = "infrastructure.cluster.x-k8s.io/kaironmachine-namespace";
    /// The adoption key: only a Kairon Machine carrying our UID is ours.
    pub const KAIRONMACHINE_UID: &str = "infrastructure.cluster.x-k8s.io/kaironmachine-uid";
    pub const CLUSTER_NAME: &str = crate::capi::CLUSTER_NAME_LABEL;
    pub(crate) const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub(crate) const MANAGED_BY_VALUE: &str = "cluster-api-provider-kairon";

    /// The label selector of every Kairon Machine this provider manages.
    pub(crate) fn managed_selector() -> String {
        format!("{MANAGED_BY}={MANAGED_BY_VALUE}")
    }
}

/// Annotation recording the failure domain a Kairon Machine was placed in, so placement can be
/// reported again after status is lost (status is never moved by `clusterctl move`).
pub(crate) const FAILURE_DOMAIN_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/failure-domain";
