//! The KaironMachinePool reconciler's decisions, pure: [`plan`] says what a pool does next
//! with its Kairon MachineSet and the Machines of its instances, [`status`] what it reports,
//! [`instances`] which KaironMachine stands for each VM of its set.

pub mod instances;
pub mod plan;
pub mod status;
