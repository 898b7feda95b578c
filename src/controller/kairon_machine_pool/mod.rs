//! The KaironMachinePool reconciler's decisions, pure: [`plan`] says what a pool does next
//! with its Kairon MachineSet and the Machines of its instances, [`status`] what it reports,
//! [`instances`] which KaironMachine stands for each VM of its set, [`gather`] the plan's
//! instances from what the caches hold.

pub mod gather;
pub mod instances;
pub mod plan;
pub mod status;
