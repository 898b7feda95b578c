//! The KaironMachinePool reconciler: [`plan`] says what a pool does next with its members,
//! [`status`] what it reports, [`instances`] the KaironMachine of a new member, [`gather`] the
//! plan's members from what the caches hold, [`revision`] what makes a member outdated.

pub mod broken_backoff;
mod context;
mod delete;
pub mod gather;
pub mod instances;
mod pending;
pub mod plan;
mod publish;
mod published;
mod reconcile;
pub mod revision;
pub mod status;
mod watches;

pub use context::Context;
pub use reconcile::reconcile;
pub(crate) use watches::controller;
