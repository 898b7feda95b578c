//! What a Kairon network mode means for a cluster (`docs/kairon-api.md`, "Networks"). Pure.
//!
//! - `user` (Kairon's default, also when `spec.network` is absent): a NAT of the VM's own.
//!   The VM reaches out, nothing reaches it, and Kairon reports no address (the guest agent
//!   would report the NAT's own, the same on every VM).
//! - `tap` on a bridge: VMs on bridges of one name share a network, so a kube-vip address
//!   announced there reaches them; Kairon reports an address only with `learnIP` or the guest
//!   agent.
//! - `tap` with `netns`: routed through a namespace of the VM's own, with an address Kairon
//!   assigns and always reports; no shared network, so no kube-vip address reaches other VMs.
//! - `macvtap` on a parent NIC: on that NIC's network; an address only with the guest agent.

use super::vm::Attachment;
use crate::api::{MachineNetwork, network_mode};

/// Why a control-plane machine on this network cannot serve a cluster, if it cannot: a VM in
/// user mode is reachable by no peer, no worker and no load balancer, and a kube-vip address
/// it announces stays inside its own NAT. Checked before a VM is made.
pub fn control_plane_unreachable(network: Option<&MachineNetwork>) -> Option<String> {
    let mode = network.and_then(|n| n.mode.as_deref()).unwrap_or(network_mode::USER);
    (mode == network_mode::USER).then(|| {
        "spec.network is Kairon's user mode (a NAT of each VM's own, also when spec.network is absent): \
         no other VM, no worker and no load balancer can reach a control plane there, nor a kube-vip address it announces. \
         Use network mode tap on a bridge shared by the cluster's VMs (with learnIP: true), or macvtap, \
         in a new KaironMachineTemplate, and roll the control plane out to it"
            .to_string()
    })
}

/// What a running VM without an address needs, by its network, as Kairon's spec says it:
/// which modes report none at all, and what makes Kairon report one.
pub fn why_no_address(attached: &Attachment) -> String {
    let mode = attached.mode.as_deref().unwrap_or(network_mode::USER);
    let agent = attached.guest_agent;
    let agent_wait =
        "Kairon asks the guest agent for it (spec.guestAgent.enabled): does the image run qemu-guest-agent?";
    match mode {
        network_mode::TAP if attached.netns => {
            "Kairon has not reported the address of its network namespace yet".to_string()
        }
        network_mode::TAP if attached.learn_ip => format!(
            "Kairon has not learnt its address from the guest's ARP, neighbour advertisements or DHCP lease yet (network.learnIP; Kairon's eBPF dataplane learns it){}",
            if agent {
                format!("; {agent_wait}")
            } else {
                String::new()
            }
        ),
        _ if agent => agent_wait.to_string(),
        network_mode::TAP => "on a bridged tap device Kairon learns no address by itself: set network.learnIP: true \
             (or network.netns: true, or spec.guestAgent.enabled: true with an image running qemu-guest-agent) \
             in a new KaironMachineTemplate and roll out"
            .to_string(),
        network_mode::MACVTAP => "on macvtap Kairon learns no address by itself: set spec.guestAgent.enabled: true \
             (an image running qemu-guest-agent) in a new KaironMachineTemplate and roll out"
            .to_string(),
        _ => "it is in network mode user (Kairon's default when spec.network is absent: a NAT of its own), \
             where Kairon reports no address and no other VM can reach it: use network mode tap on a bridge \
             shared by the cluster's VMs with learnIP: true in a new KaironMachineTemplate and roll out"
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kairon::{GuestAgent, MachineSpec, Network};

    fn api(mode: Option<&str>) -> MachineNetwork {
        MachineNetwork {
            mode: mode.map(str::to_string),
            bridge: (mode == Some("tap")).then(|| "br0".to_string()),
            parent: (mode == Some("macvtap")).then(|| "eth1".to_string()),
            ..Default::default()
        }
    }

    #[test]
    fn only_user_mode_cannot_carry_a_control_plane() {
        assert!(control_plane_unreachable(None).is_some(), "no network is user mode");
        assert!(control_plane_unreachable(Some(&MachineNetwork::default())).is_some());
        let user = control_plane_unreachable(Some(&api(Some("user")))).unwrap_or_default();
        assert!(user.contains("spec.network") && user.contains("tap"), "{user}");
        assert_eq!(control_plane_unreachable(Some(&api(Some("tap")))), None);
        assert_eq!(control_plane_unreachable(Some(&api(Some("macvtap")))), None);
    }

    fn spec(network: Option<Network>, agent: bool) -> MachineSpec {
        MachineSpec {
            network,
            guest_agent: agent.then_some(GuestAgent { enabled: Some(true) }),
            ..Default::default()
        }
    }

    fn net(mode: &str, netns: bool, learn_ip: bool) -> Option<Network> {
        Some(Network {
            mode: Some(mode.into()),
            netns: netns.then_some(true),
            learn_ip: learn_ip.then_some(true),
            ..Default::default()
        })
    }

    #[test]
    fn the_fix_named_depends_on_the_network() {
        #[rustfmt::skip]
        let cases: [(&str, MachineSpec, &str); 8] = [
            ("no network", spec(None, false), "network mode user"),
            ("user", spec(net("user", false, false), false), "network mode user"),
            ("user with the agent", spec(net("user", false, false), true), "qemu-guest-agent"),
            ("bridged tap", spec(net("tap", false, false), false), "set network.learnIP: true"),
            ("bridged tap learning", spec(net("tap", false, true), false), "has not learnt its address"),
            ("netns", spec(net("tap", true, false), false), "network namespace"),
            ("macvtap", spec(net("macvtap", false, false), false), "spec.guestAgent.enabled: true"),
            ("macvtap with the agent", spec(net("macvtap", false, false), true), "does the image run qemu-guest-agent"),
        ];
        for (name, spec, want) in cases {
            let got = why_no_address(&Attachment::of(&spec));
            assert!(got.contains(want), "{name}: {got}");
        }
    }
}
