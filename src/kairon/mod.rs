//! Everything the provider assumes about Kairon's Machine API (`kairon.zyvor.dev/v1alpha1`,
//! kind `Machine`) lives in this module, so that following Kairon's real schema is a change in
//! one place.
//!
//! - [`Machine`]: our model of a Kairon Machine (also the source of the development CRD);
//! - [`desired`]: which Kairon Machine should exist for a KaironMachine (pure);
//! - [`observe`]: what a Kairon Machine's status means for the KaironMachine (pure).

pub mod desired;
pub mod observe;
mod types;

pub use desired::{desired_kairon_machine, provider_id};
pub use observe::{Ownership, ownership};
pub use types::{Address, CloudInit, Machine, MachineSpec, MachineStatus, Network, UserData, phase};

/// Kairon's API group.
pub const GROUP: &str = "kairon.zyvor.dev";
/// The Kairon Machine API version we target.
pub const VERSION: &str = "v1alpha1";

/// Scheme of provider IDs: `kairon://<uid of the Kairon Machine>`. The guest sees the uid as
/// its NoCloud `instance-id`, so kubelet can be given the same provider ID.
pub const PROVIDER_ID_PREFIX: &str = "kairon://";

/// Links back from a Kairon Machine to the KaironMachine that created it. Labels, because
/// Kairon's controller can drop ownerReferences when it writes a Machine back.
pub mod labels {
    pub const KAIRONMACHINE_NAME: &str = "infrastructure.cluster.x-k8s.io/kaironmachine-name";
    pub const KAIRONMACHINE_NAMESPACE: &str = "infrastructure.cluster.x-k8s.io/kaironmachine-namespace";
    /// The adoption key: only a Kairon Machine carrying our UID is ours.
    pub const KAIRONMACHINE_UID: &str = "infrastructure.cluster.x-k8s.io/kaironmachine-uid";
    pub const CLUSTER_NAME: &str = crate::capi::CLUSTER_NAME_LABEL;
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub const MANAGED_BY_VALUE: &str = "cluster-api-provider-kairon";
}

/// Annotation recording the failure domain a Kairon Machine was placed in, so placement can be
/// reported again after status is lost (status is never moved by `clusterctl move`).
pub const FAILURE_DOMAIN_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/failure-domain";
