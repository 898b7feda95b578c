//! The KaironMachine reconciler: one Kairon Machine per KaironMachine, its status mapped back.
//!
//! Order of a reconcile, as the contract asks ([`reconcile`]):
//! 1. dereference the owner Machine and the Cluster (from caches), and the Kairon API the VM
//!    lives on ([`context`]);
//! 2. pause (Cluster `spec.paused` or the annotation) — before deletion, so that
//!    `clusterctl move` never destroys a VM;
//! 3. deletion: delete the Kairon Machine if it is provably ours ([`ownership`]), keep the
//!    finalizer until it is gone ([`delete`]);
//! 4. no owner Machine yet: do nothing, not even add the finalizer;
//! 5. finalizer, then wait for cluster infrastructure and bootstrap data, create the Kairon
//!    Machine (deterministic name, [`create`]; adopt only what is provably ours), write
//!    `spec.providerID`;
//! 6. host maintenance ([`evacuate`]): a live migration is followed (event, failure-domain
//!    check); Kairon's request to evacuate the VM gets its Machine replaced by CAPI, one
//!    Machine of the cluster at a time ([`evacuation`]);
//! 7. status from what Kairon reports ([`status`]), written only when it differs, by the one
//!    exit every path returns through ([`finish`]).
//!
//! The finalizer is handled by hand rather than with `kube::runtime::finalizer`, because the
//! contract puts two steps before it that the helper cannot express: pause is checked before
//! deletion, and nothing (not even the finalizer) is written before CAPI sets the owner.
//!
//! What triggers a reconcile, and the caches it reads, are in [`watches`]; every request to
//! Kairon goes through [`crate::kairon::Instances`]; every reconcile has a deadline
//! ([`deadline`]).

pub mod bootstrap_configs;
pub mod checked_configs;
mod context;
mod create;
mod deadline;
mod delete;
mod evacuate;
mod evacuation;
mod finish;
mod lanes;
mod ownership;
mod reconcile;
pub(crate) mod status;
mod triggers;
mod watches;

pub use context::{Context, Evacuating};
pub use reconcile::reconcile;
pub use status::{Observed, StatusInput, next_status};
pub(crate) use watches::{Remote, controller};
