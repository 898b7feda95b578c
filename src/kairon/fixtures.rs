//! The Kairon Machine of every unit test that needs one (`m1` in `ns`, uid `vm-uid`, placed in
//! `zone-a` on host `kairon-node-7`).

use super::{FAILURE_DOMAIN_ANNOTATION, Machine, MachineStatus};

/// A Kairon Machine in `phase` (`None`: Kairon has not reported one yet). Running machines
/// report a guest IP; those in Error Kairon's message.
pub(crate) fn vm(phase: Option<&str>) -> Machine {
    let mut m = Machine::new("m1", Default::default());
    m.metadata.namespace = Some("ns".into());
    m.metadata.uid = Some("vm-uid".into());
    m.metadata.annotations = Some([(FAILURE_DOMAIN_ANNOTATION.to_string(), "zone-a".to_string())].into());
    m.status = Some(MachineStatus {
        phase: phase.map(Into::into),
        node_name: Some("kairon-node-7".into()),
        guest_ip: (phase == Some("Running")).then(|| "10.42.0.17".into()),
        guest_ips: (phase == Some("Running")).then(|| vec!["10.42.0.17".into()]),
        message: (phase == Some("Error")).then(|| "image \"ubuntu\": download failed".into()),
        ..Default::default()
    });
    m
}
