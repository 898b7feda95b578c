//! The KaironMachinePool reconciler's decisions, pure: [`plan`] says what a pool does next
//! with its Kairon MachineSet and the Machines of its instances, [`status`] what it reports,
//! [`instances`] which KaironMachine stands for each VM of its set, [`gather`] the plan's
//! instances from what the caches hold.

pub mod broken_backoff;
mod context;
mod delete;
pub mod gather;
pub mod instances;
pub mod plan;
mod publish;
mod reconcile;
mod sets;
pub mod status;
mod unavailable;
mod watches;

pub use context::Context;
pub use reconcile::reconcile;
pub(crate) use unavailable::{controller as unavailable, machine_sets_refused};
pub(crate) use watches::controller;
