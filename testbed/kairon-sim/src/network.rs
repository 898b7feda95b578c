//! How a Kairon guest's NIC is attached (`spec.network`), which address Kairon reports for it,
//! and what it can reach, as Kairon's networks behave (Kairon's `docs/guides/machine-network.md`,
//! `internal/agent/network.go` `projectNetworkStatus`). Pure: a reachability check the guest's
//! connect paths consult, not a network stack.
//!
//! The model, and what it simplifies:
//! - `user` (the default): a per-VM slirp NAT. The guest reaches the outside, nothing reaches
//!   it, and it reaches no other guest and no VIP (not even one on another user-mode VM).
//! - `tap` on a `bridge`: the bridge's L2 segment (a bridge name is one segment on every
//!   Kairon host). Guests on one bridge reach each other and a VIP announced there; guests on
//!   different bridges (or on a bridge and a macvtap parent) share nothing and are taken as
//!   unable to reach each other at all.
//! - `tap` with `netns: true`: routed by the host, no shared L2. Reaches and is reached by the
//!   outside, other netns guests and bridged or macvtap guests; a VIP it announces by ARP
//!   reaches nobody but itself.
//! - `macvtap` on `parent`: the parent's external L2; as a bridge, except that in `private`
//!   mode guests on the same parent cannot reach each other (the outside still can).
//! - The outside (the site network, the management cluster on the host) is every address that
//!   is no guest's and no VIP.

use std::fmt;

use capkr::kairon::MachineSpec;

/// The address qemu's slirp gives every user-mode guest, which the guest agent reports.
pub const SLIRP_GUEST_ADDRESS: &str = "10.0.2.15";

/// Where a guest's NIC sits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Attachment {
    /// `mode: user` (or none): slirp NAT of its own.
    User,
    /// `mode: tap` on this host bridge.
    Bridge(String),
    /// `mode: tap`, `netns: true`: a network namespace of its own, routed.
    Netns,
    /// `mode: macvtap` on this host NIC; `private` is `macvtapMode: private`.
    Macvtap { parent: String, private: bool },
    /// A tap on neither a bridge nor a netns, or a macvtap without a parent: Kairon's schema
    /// refuses both; a hand-made Machine may still say so, and such a NIC reaches nothing.
    Unattached,
}

impl Attachment {
    /// Reads `spec.network` as Kairon does. A mode Kairon does not know is read as the
    /// default, `user` (Kairon's schema refuses it; the simulator's development CRD does not).
    pub fn of(spec: &MachineSpec) -> Self {
        let Some(net) = spec.network.as_ref() else {
            return Attachment::User;
        };
        let named = |s: Option<&String>| s.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
        match net.mode.as_deref().map(str::trim) {
            Some("tap") if net.netns == Some(true) => Attachment::Netns,
            Some("tap") => named(net.bridge.as_ref()).map_or(Attachment::Unattached, Attachment::Bridge),
            Some("macvtap") => match named(net.parent.as_ref()) {
                Some(parent) => Attachment::Macvtap {
                    parent,
                    private: net.macvtap_mode.as_deref().map(str::trim) == Some("private"),
                },
                None => Attachment::Unattached,
            },
            _ => Attachment::User,
        }
    }

    /// Guests on the same L2 segment, where an address announced by ARP is seen.
    fn shares_l2(&self, other: &Attachment) -> bool {
        match (self, other) {
            (Attachment::Bridge(a), Attachment::Bridge(b)) => a == b,
            (Attachment::Macvtap { parent: a, private: pa }, Attachment::Macvtap { parent: b, private: pb }) => {
                a == b && !pa && !pb
            }
            _ => false,
        }
    }
}

impl fmt::Display for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attachment::User => write!(f, "user (per-VM NAT)"),
            Attachment::Bridge(bridge) => write!(f, "tap on bridge {bridge}"),
            Attachment::Netns => write!(f, "tap in its own netns"),
            Attachment::Macvtap { parent, private: true } => write!(f, "macvtap on {parent} (private)"),
            Attachment::Macvtap { parent, private: false } => write!(f, "macvtap on {parent}"),
            Attachment::Unattached => write!(f, "a NIC on no network"),
        }
    }
}

/// For log lines: "user (per-VM NAT)", "tap on bridge br0", "macvtap on eth1 (private)", …
pub fn describe(attachment: &Attachment) -> String {
    attachment.to_string()
}

/// Which address Kairon writes into `status.guestIP`/`guestIPs` of a Running guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// None: Kairon has no lease to read and was not asked to learn one.
    None,
    /// The guest's own address.
    Own,
    /// [`SLIRP_GUEST_ADDRESS`]: the guest agent of a user-mode guest reports slirp's address.
    SlirpAddress,
}

/// A netns address is FluxVM's own, so always known; on a bridge only FluxVM's learning
/// (`learnIP`, its VM edge) or the guest agent tell it, on a macvtap parent only the guest
/// agent; user mode has nothing but the guest agent, which reports slirp's address
/// (`projectNetworkStatus`).
pub fn reports_address(spec: &MachineSpec) -> Reported {
    let learn_ip = spec.network.as_ref().and_then(|n| n.learn_ip) == Some(true);
    let agent = spec.guest_agent.as_ref().and_then(|a| a.enabled) == Some(true);
    match Attachment::of(spec) {
        Attachment::Netns => Reported::Own,
        Attachment::User if agent => Reported::SlirpAddress,
        Attachment::User => Reported::None,
        // learnIP is FluxVM's VM edge, on a tap only: macvtap has no edge hook.
        Attachment::Bridge(_) if learn_ip || agent => Reported::Own,
        Attachment::Macvtap { .. } if agent => Reported::Own,
        // No network: no lease, nothing to learn.
        Attachment::Bridge(_) | Attachment::Macvtap { .. } | Attachment::Unattached => Reported::None,
    }
}

/// Whether a guest reaches another guest's own address (a guest always reaches itself; this
/// is about two different guests).
pub fn guest_reaches_guest(from: &Attachment, to: &Attachment) -> bool {
    use Attachment::*;
    match (from, to) {
        // Behind its own NAT, a user-mode guest is nobody's peer.
        (User | Unattached, _) | (_, User | Unattached) => false,
        // Routed by the host: netns guests reach and are reached by everything routable.
        (Netns, _) | (_, Netns) => true,
        _ => from.shares_l2(to),
    }
}

/// Whether a guest reaches a VIP the `announcers` put up by ARP: only from their L2 segment (a
/// bridge of the same name, a non-private macvtap on the same parent). `announcers` are guests
/// other than `from`: one that announces the VIP itself reaches it whatever its network
/// (kube-vip puts it on its own interface), which only the caller can tell.
pub fn guest_reaches_vip(from: &Attachment, announcers: &[Attachment]) -> bool {
    announcers.iter().any(|a| from.shares_l2(a))
}

/// Whether the outside (the management cluster, the site network) reaches a VIP the
/// `announcers` put up: an ARP announcement on a bridge or a macvtap parent is on the site's
/// L2; one in a NAT or a netns is seen by nobody outside.
pub fn outside_reaches_vip(announcers: &[Attachment]) -> bool {
    announcers
        .iter()
        .any(|a| matches!(a, Attachment::Bridge(_) | Attachment::Macvtap { .. }))
}

/// Whether the outside reaches a guest's own address.
pub fn outside_reaches_guest(to: &Attachment) -> bool {
    !matches!(to, Attachment::User | Attachment::Unattached)
}

/// Whether a guest reaches the outside (user mode through its NAT).
pub fn guest_reaches_outside(from: &Attachment) -> bool {
    !matches!(from, Attachment::Unattached)
}

#[cfg(test)]
mod tests {
    use super::*;
    use capkr::kairon::{GuestAgent, Network};

    fn spec(network: Option<Network>, agent: Option<bool>) -> MachineSpec {
        MachineSpec {
            network,
            guest_agent: agent.map(|enabled| GuestAgent { enabled: Some(enabled) }),
            ..Default::default()
        }
    }

    fn net(mode: &str) -> Network {
        Network {
            mode: Some(mode.into()),
            ..Default::default()
        }
    }

    fn bridge(name: &str) -> Attachment {
        Attachment::Bridge(name.into())
    }

    fn macvtap(parent: &str, private: bool) -> Attachment {
        Attachment::Macvtap {
            parent: parent.into(),
            private,
        }
    }

    #[test]
    fn attachments_are_read_from_the_spec() {
        let cases: Vec<(&str, Option<Network>, Attachment)> = vec![
            ("no network: user", None, Attachment::User),
            ("no mode: user", Some(Network::default()), Attachment::User),
            ("user", Some(net("user")), Attachment::User),
            ("unknown mode: the default", Some(net("vde")), Attachment::User),
            (
                "tap on a bridge",
                Some(Network {
                    bridge: Some("br0".into()),
                    ..net("tap")
                }),
                bridge("br0"),
            ),
            (
                "tap with netns, a bridge named or not",
                Some(Network {
                    bridge: Some("br0".into()),
                    netns: Some(true),
                    ..net("tap")
                }),
                Attachment::Netns,
            ),
            (
                "tap, netns false, no bridge",
                Some(Network {
                    netns: Some(false),
                    ..net("tap")
                }),
                Attachment::Unattached,
            ),
            (
                "macvtap, no mode",
                Some(Network {
                    parent: Some("eth1".into()),
                    ..net("macvtap")
                }),
                macvtap("eth1", false),
            ),
            (
                "macvtap private",
                Some(Network {
                    parent: Some("eth1".into()),
                    macvtap_mode: Some("private".into()),
                    ..net("macvtap")
                }),
                macvtap("eth1", true),
            ),
            (
                "macvtap vepa",
                Some(Network {
                    parent: Some("eth1".into()),
                    macvtap_mode: Some("vepa".into()),
                    ..net("macvtap")
                }),
                macvtap("eth1", false),
            ),
            ("macvtap without parent", Some(net("macvtap")), Attachment::Unattached),
        ];
        for (name, network, want) in cases {
            assert_eq!(Attachment::of(&spec(network, None)), want, "{name}");
        }
    }

    #[test]
    fn kairon_reports_an_address_only_when_it_knows_one() {
        let learn = |mut n: Network| {
            n.learn_ip = Some(true);
            n
        };
        let tap = Network {
            bridge: Some("br0".into()),
            ..net("tap")
        };
        let netns = Network {
            netns: Some(true),
            ..net("tap")
        };
        let mvt = Network {
            parent: Some("eth1".into()),
            ..net("macvtap")
        };
        let cases: Vec<(&str, Option<Network>, Option<bool>, Reported)> = vec![
            ("user: no lease to read", None, None, Reported::None),
            ("user, agent off", None, Some(false), Reported::None),
            (
                "user + agent: slirp's address",
                None,
                Some(true),
                Reported::SlirpAddress,
            ),
            (
                "explicit user + agent",
                Some(net("user")),
                Some(true),
                Reported::SlirpAddress,
            ),
            ("bridge: not learned", Some(tap.clone()), None, Reported::None),
            ("bridge + learnIP", Some(learn(tap.clone())), None, Reported::Own),
            ("bridge + agent", Some(tap), Some(true), Reported::Own),
            ("netns: always", Some(netns.clone()), None, Reported::Own),
            ("netns, agent off", Some(netns), Some(false), Reported::Own),
            ("macvtap: not learned", Some(mvt.clone()), None, Reported::None),
            (
                "macvtap + learnIP: no edge hook",
                Some(learn(mvt.clone())),
                None,
                Reported::None,
            ),
            ("macvtap + agent", Some(mvt), Some(true), Reported::Own),
        ];
        for (name, network, agent, want) in cases {
            assert_eq!(reports_address(&spec(network, agent)), want, "{name}");
        }
    }

    #[test]
    fn guests_reach_each_other_on_a_shared_segment_or_routed() {
        use Attachment::*;
        let cases: Vec<(Attachment, Attachment, bool)> = vec![
            (User, User, false),
            (User, bridge("br0"), false),
            (bridge("br0"), User, false),
            (User, Netns, false),
            (Netns, User, false),
            (bridge("br0"), bridge("br0"), true),
            (bridge("br0"), bridge("br1"), false),
            (bridge("br0"), Netns, true),
            (Netns, bridge("br0"), true),
            (Netns, Netns, true),
            (macvtap("eth1", false), Netns, true),
            (Netns, macvtap("eth1", true), true),
            (macvtap("eth1", false), macvtap("eth1", false), true),
            (macvtap("eth1", true), macvtap("eth1", true), false),
            (macvtap("eth1", false), macvtap("eth1", true), false),
            (macvtap("eth1", false), macvtap("eth2", false), false),
            (bridge("eth1"), macvtap("eth1", false), false),
            (Unattached, bridge("br0"), false),
            (Netns, Unattached, false),
        ];
        for (from, to, want) in cases {
            assert_eq!(guest_reaches_guest(&from, &to), want, "{from} -> {to}");
        }
    }

    #[test]
    fn a_vip_is_seen_on_its_announcers_l2_only() {
        use Attachment::*;
        let cases: Vec<(Attachment, Vec<Attachment>, bool)> = vec![
            (bridge("br0"), vec![bridge("br0")], true),
            (bridge("br0"), vec![bridge("br1")], false),
            (bridge("br0"), vec![bridge("br1"), bridge("br0")], true),
            (bridge("br0"), vec![], false),
            (User, vec![User], false),
            (User, vec![bridge("br0")], false),
            (Netns, vec![Netns], false),
            (Netns, vec![bridge("br0")], false),
            (bridge("br0"), vec![Netns], false),
            (macvtap("eth1", false), vec![macvtap("eth1", false)], true),
            (macvtap("eth1", false), vec![macvtap("eth1", true)], false),
            (macvtap("eth1", true), vec![macvtap("eth1", false)], false),
            (macvtap("eth2", false), vec![macvtap("eth1", false)], false),
        ];
        for (from, announcers, want) in cases {
            assert_eq!(
                guest_reaches_vip(&from, &announcers),
                want,
                "{from} -> VIP on {announcers:?}"
            );
        }
    }

    #[test]
    fn the_outside_reaches_vips_and_guests_on_the_site_network() {
        use Attachment::*;
        let vips: Vec<(Vec<Attachment>, bool)> = vec![
            (vec![], false),
            (vec![User], false),
            (vec![Netns], false),
            (vec![Netns, User], false),
            (vec![bridge("br0")], true),
            (vec![macvtap("eth1", true)], true),
            (vec![User, macvtap("eth1", false)], true),
        ];
        for (announcers, want) in vips {
            assert_eq!(outside_reaches_vip(&announcers), want, "{announcers:?}");
        }
        let guests: Vec<(Attachment, bool, bool)> = vec![
            (User, false, true),
            (bridge("br0"), true, true),
            (Netns, true, true),
            (macvtap("eth1", true), true, true),
            (Unattached, false, false),
        ];
        for (a, reached, reaches) in guests {
            assert_eq!(
                (outside_reaches_guest(&a), guest_reaches_outside(&a)),
                (reached, reaches),
                "{a}"
            );
        }
    }

    #[test]
    fn descriptions_name_the_attachment() {
        let cases = [
            (Attachment::User, "user (per-VM NAT)"),
            (bridge("br0"), "tap on bridge br0"),
            (Attachment::Netns, "tap in its own netns"),
            (macvtap("eth1", true), "macvtap on eth1 (private)"),
            (macvtap("eth1", false), "macvtap on eth1"),
            (Attachment::Unattached, "a NIC on no network"),
        ];
        for (a, want) in cases {
            assert_eq!(describe(&a), want);
        }
    }
}
