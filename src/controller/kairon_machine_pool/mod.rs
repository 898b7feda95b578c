//! The KaironMachinePool reconciler's decisions: [`plan`] (pure) says what a pool does next
//! with its Kairon MachineSet and the Machines of its instances.

pub mod plan;
