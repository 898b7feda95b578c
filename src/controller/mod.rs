//! The reconcilers, one per kind of ours, and what they share.
//!
//! - [`kairon_machine`] (a folder: the reconcile workflow, the status mapping, the watches),
//!   [`kairon_cluster`], [`kairon_machine_template`]: one reconciler each;
//! - [`kairon_machine_pool`]: what a KaironMachinePool does next (its plan, pure);
//! - `run`: the controllers wired together (endpoints, caches, channels) until shutdown;
//! - [`runtime`]: what runs them — cache readiness, the first steps of every reconcile (caches,
//!   owning Cluster, pause), a span and metrics per reconcile, the error policy, and
//!   `backoff`, its per-object delays;
//! - `endpoints::protection`: what keeps an identity (`spec.identityRef`) until its cluster's
//!   VMs are gone, and takes it along on `clusterctl move`;
//! - [`endpoints`] (the Kairon APIs of identities), `endpoints::health` (one of them as the
//!   reconcilers use it, and whether it can be used now), `endpoints::trust` (what an
//!   identity's kubeconfig may name, and the bounds of its client), `endpoints::budget` (what one
//!   of them may make the manager hold) and `endpoints::ledger` (what all of them may, together,
//!   and how many a namespace opens);
//! - `write` and `fresh`: every write a reconciler makes, and the record of it for the next
//!   reconcile;
//! - `resync`: every KaironMachine reconciled again once a `--sync-period`, without a timer
//!   per object;
//! - `caches`: one watch and cache per kind that several controllers read; `changed`: which
//!   objects of a watch changed for a subscriber (a 16-byte entry per object);
//! - [`Error`]: what can fail, by stage; [`Settings`]: how the manager was asked to run.

mod backoff;
mod budgets;
pub(crate) mod caches;
pub(crate) mod changed;
pub mod endpoints;
pub(crate) mod error;
pub(crate) mod fresh;
pub mod kairon_cluster;
pub mod kairon_machine;
pub mod kairon_machine_pool;
pub(crate) mod kairon_machine_template;
mod resync;
pub(crate) mod run;
pub(crate) mod runtime;
pub(crate) mod settings;
pub mod tenant_share;
mod write;

pub use endpoints::Endpoints;
pub use endpoints::ledger::EndpointCaps;
pub(crate) use endpoints::trust::AllowedServers;
pub use error::Error;
pub use fresh::Fresher;
pub use runtime::Synced;
pub(crate) use runtime::{CacheReadiness, Telemetry};
pub use settings::Settings;
