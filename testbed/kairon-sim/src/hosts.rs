//! What machines hold: a slot on a host ([`crate::placement`]) and an address from the pool.
//! Pure bookkeeping; the engine keeps it in line with what the Machines' statuses say, so it
//! is rebuilt from the objects after a restart (but for the addresses Kairon does not report,
//! see [`Allocations::observe`]).

use std::collections::HashMap;
use std::net::Ipv4Addr;

use capkr::kairon::{Machine, phase};

use crate::network::{Reported, reports_address};
use crate::placement::Placement;
use crate::sim::Key;

/// An IPv4 pool handing out each address to one machine at a time. Allocation walks forward
/// from the last address handed out, so a released address is not reused at once (a stale
/// Node or ARP entry would otherwise point at the next VM). A machine that gives its address up
/// (stopped, halted) gets the same one back when it runs again, if it is still free, as a
/// DHCP server renews a lease for the same MAC; the lease ends with the machine.
#[derive(Debug)]
pub struct AddressPool {
    first: u32,
    last: u32,
    cursor: u32,
    owner: HashMap<u32, Key>,
    address_of: HashMap<Key, u32>,
    lease: HashMap<Key, u32>,
}

impl AddressPool {
    /// `cidr` like `10.42.0.0/16`. The network and broadcast addresses and the first host
    /// address (the gateway) are never handed out.
    pub fn new(cidr: &str) -> Result<Self, String> {
        let (ip, len) = cidr.split_once('/').ok_or_else(|| format!("{cidr:?} is not a CIDR"))?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| format!("{cidr:?}: not an IPv4 address"))?;
        let len: u32 = len.parse().map_err(|_| format!("{cidr:?}: bad prefix length"))?;
        if !(8..=29).contains(&len) {
            return Err(format!("{cidr:?}: prefix length must be between 8 and 29"));
        }
        let mask = u32::MAX << (32 - len);
        let network = u32::from(ip) & mask;
        let broadcast = network | !mask;
        let first = network + 2;
        Ok(Self {
            first,
            last: broadcast - 1,
            cursor: first,
            owner: HashMap::new(),
            address_of: HashMap::new(),
            lease: HashMap::new(),
        })
    }

    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        (self.first..=self.last).contains(&u32::from(addr))
    }

    /// The address held by `key`, else its last one if free, else the next free one.
    pub fn allocate(&mut self, key: &Key) -> Option<Ipv4Addr> {
        if let Some(addr) = self.address_of.get(key) {
            return Some(Ipv4Addr::from(*addr));
        }
        if let Some(&addr) = self.lease.get(key)
            && !self.owner.contains_key(&addr)
        {
            self.owner.insert(addr, key.clone());
            self.address_of.insert(key.clone(), addr);
            return Some(Ipv4Addr::from(addr));
        }
        let size = self.last - self.first + 1;
        for i in 0..size {
            let candidate = self.first + (self.cursor - self.first + i) % size;
            if !self.owner.contains_key(&candidate) {
                self.cursor = if candidate == self.last {
                    self.first
                } else {
                    candidate + 1
                };
                self.owner.insert(candidate, key.clone());
                self.address_of.insert(key.clone(), candidate);
                self.lease.insert(key.clone(), candidate);
                return Some(Ipv4Addr::from(candidate));
            }
        }
        None
    }

    /// Records an address a Machine already reports (after a restart, or written by us).
    /// Returns the other holder if the address was already taken.
    pub fn claim(&mut self, key: &Key, addr: Ipv4Addr) -> Option<Key> {
        self.release(key);
        let addr = u32::from(addr);
        let previous = self.owner.insert(addr, key.clone()).filter(|k| k != key);
        if let Some(other) = &previous {
            self.address_of.remove(other);
        }
        self.address_of.insert(key.clone(), addr);
        self.lease.insert(key.clone(), addr);
        previous
    }

    /// `key` gives its address up; its lease stays.
    pub fn release(&mut self, key: &Key) {
        if let Some(addr) = self.address_of.remove(key) {
            self.owner.remove(&addr);
        }
    }

    /// `key` is gone: its address and its lease.
    pub fn forget(&mut self, key: &Key) {
        self.release(key);
        self.lease.remove(key);
    }

    /// The address `key` holds, if any.
    #[cfg(test)]
    pub fn address_of(&self, key: &Key) -> Option<Ipv4Addr> {
        self.address_of.get(key).map(|a| Ipv4Addr::from(*a))
    }

    /// Who holds `addr`, if anyone.
    pub fn holder(&self, addr: Ipv4Addr) -> Option<&Key> {
        self.owner.get(&u32::from(addr))
    }

    pub fn in_use(&self) -> usize {
        self.owner.len()
    }
}

/// Host and address bookkeeping, kept in line with the Machines' statuses.
#[derive(Debug)]
pub struct Allocations {
    pub placement: Placement,
    pub pool: AddressPool,
}

impl Allocations {
    /// Makes the bookkeeping for `key` say what the Machine's status says: a host is held
    /// while the VM runs there ([`holds_host`]), an address while the Machine reports one
    /// (Kairon clears it when the VM is halted or stopped; a VM the old model's maintenance
    /// stopped keeps it until it is deleted), so an address never shows on two Machines.
    ///
    /// Kairon reports no address for most networks ([`reports_address`]), yet the guest has
    /// one: a VM that is up ([`keeps_unreported_address`]) and reports none keeps the address
    /// it was given, in memory only (after a restart of the simulator it gets a new one). Only
    /// a reported address of the guest's own is read: slirp's `10.0.2.15`, which every
    /// user-mode guest with the guest agent shows, is no pool address.
    pub fn observe(&mut self, key: &Key, machine: &Machine) -> Option<Key> {
        let status = machine.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref());
        match status.and_then(|s| s.node_name.as_deref()) {
            Some(host) if holds_host(phase) => self.placement.assign(key, host),
            _ => self.placement.release(key),
        }
        // `guestIP`, else the first of `guestIPs`, that is the pool's.
        let reported = (reports_address(&machine.spec) == Reported::Own)
            .then_some(status)
            .flatten()
            .into_iter()
            .flat_map(|s| s.guest_ip.iter().chain(s.guest_ips.iter().flatten()))
            .filter_map(|a| a.parse::<Ipv4Addr>().ok())
            .find(|a| self.pool.contains(*a));
        match reported {
            Some(addr) => self.pool.claim(key, addr),
            None if keeps_unreported_address(phase) => None,
            None => {
                self.pool.release(key);
                None
            }
        }
    }

    /// The Machine is gone.
    pub fn release(&mut self, key: &Key) {
        self.placement.release(key);
        self.pool.forget(key);
    }
}

/// Whether a VM in this phase still has the address it booted with when Kairon shows none:
/// it is up (Running), paused in place, or its runtime failed (Kairon keeps a reported address
/// then too); a halted or stopped VM gave it up, one still booting has none yet.
pub fn keeps_unreported_address(phase: Option<&str>) -> bool {
    matches!(phase, Some(phase::RUNNING | phase::PAUSED | phase::UNKNOWN))
}

/// Whether a VM in this phase occupies its host: a paused VM keeps its VMM process (and so its
/// share of the host), as kairon-controller counts it; a halted or stopped one does not.
pub fn holds_host(phase: Option<&str>) -> bool {
    matches!(
        phase,
        Some(phase::STARTING | phase::RUNNING | phase::PAUSED | phase::TERMINATING)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use capkr::kairon::{GuestAgent, MachineSpec, MachineStatus, Network};

    fn key(name: &str) -> Key {
        Key {
            namespace: "default".into(),
            name: name.into(),
        }
    }

    #[test]
    fn pool_hands_out_each_address_once_and_skips_gateway() {
        let mut pool = AddressPool::new("10.42.0.0/16").unwrap();
        assert_eq!(pool.allocate(&key("a")), Some("10.42.0.2".parse().unwrap()));
        assert_eq!(pool.allocate(&key("b")), Some("10.42.0.3".parse().unwrap()));
        // The same machine asking again keeps its address.
        assert_eq!(pool.allocate(&key("a")), Some("10.42.0.2".parse().unwrap()));
        pool.release(&key("a"));
        // Released addresses are not reused at once.
        assert_eq!(pool.allocate(&key("c")), Some("10.42.0.4".parse().unwrap()));
        assert_eq!(pool.in_use(), 2);
    }

    #[test]
    fn pool_skips_claimed_addresses_and_wraps_around() {
        let mut pool = AddressPool::new("192.168.1.0/29").unwrap(); // .2 ..= .6
        assert_eq!(pool.claim(&key("old"), "192.168.1.3".parse().unwrap()), None);
        let got: Vec<Option<Ipv4Addr>> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| pool.allocate(&key(n)))
            .collect();
        let want: Vec<Option<Ipv4Addr>> = vec![
            Some([192, 168, 1, 2].into()),
            Some([192, 168, 1, 4].into()),
            Some([192, 168, 1, 5].into()),
            Some([192, 168, 1, 6].into()),
            None,
        ];
        assert_eq!(got, want);
        pool.release(&key("a"));
        assert_eq!(pool.allocate(&key("e")), Some([192, 168, 1, 2].into()));
    }

    #[test]
    fn a_vm_running_again_gets_its_address_back_while_it_is_free() {
        let mut pool = AddressPool::new("10.42.0.0/16").unwrap();
        let a = pool.allocate(&key("a"));
        pool.allocate(&key("b"));
        pool.release(&key("a"));
        assert_eq!(pool.allocate(&key("c")), Some("10.42.0.4".parse().unwrap()));
        assert_eq!(pool.allocate(&key("a")), a, "stopped and started: the same address");
        pool.release(&key("a"));
        pool.claim(&key("d"), a.unwrap());
        assert_ne!(pool.allocate(&key("a")), a, "taken meanwhile: another one");
        pool.forget(&key("a"));
        pool.release(&key("d"));
        assert_ne!(pool.allocate(&key("a")), a, "a machine gone has no lease");
    }

    #[test]
    fn claiming_an_address_held_by_another_machine_reports_it() {
        let mut pool = AddressPool::new("10.0.0.0/24").unwrap();
        pool.claim(&key("a"), "10.0.0.9".parse().unwrap());
        assert_eq!(pool.claim(&key("b"), "10.0.0.9".parse().unwrap()), Some(key("a")));
    }

    #[test]
    fn a_stopped_vm_no_longer_holds_its_host() {
        let cases = [
            (None, false),
            (Some(phase::PENDING), false),
            (Some(phase::STARTING), true),
            (Some(phase::RUNNING), true),
            (Some(phase::TERMINATING), true),
            (Some(phase::STOPPED), false),
            (Some(phase::PAUSED), true),
            (Some(phase::HALTED), false),
            (Some(phase::UNKNOWN), false),
        ];
        for (p, want) in cases {
            assert_eq!(holds_host(p), want, "{p:?}");
        }
    }

    fn machine(phase: &str, network: Option<Network>, agent: bool, guest_ip: Option<&str>) -> Machine {
        let mut m = Machine::new(
            "m",
            MachineSpec {
                network,
                guest_agent: agent.then_some(GuestAgent { enabled: Some(true) }),
                ..Default::default()
            },
        );
        m.status = Some(MachineStatus {
            phase: Some(phase.into()),
            node_name: Some("kairon-node-1".into()),
            guest_ip: guest_ip.map(str::to_string),
            guest_ips: guest_ip.map(|a| vec![a.to_string()]),
            ..Default::default()
        });
        m
    }

    #[test]
    fn an_unreported_address_is_kept_while_the_vm_is_up() {
        let netns = Network {
            mode: Some("tap".into()),
            netns: Some(true),
            ..Default::default()
        };
        // What the status shows of the address allocated at boot (10.0.0.2), and whether the
        // books keep it for the Machine afterwards.
        let cases: Vec<(&str, Machine, bool)> = vec![
            (
                "user mode, Running: nothing shown, kept",
                machine(phase::RUNNING, None, false, None),
                true,
            ),
            (
                "user mode, Paused: kept",
                machine(phase::PAUSED, None, false, None),
                true,
            ),
            (
                "user mode, runtime failed: kept",
                machine(phase::UNKNOWN, None, false, None),
                true,
            ),
            (
                "user mode, Halted: given up",
                machine(phase::HALTED, None, false, None),
                false,
            ),
            (
                "user mode, Stopped: given up",
                machine(phase::STOPPED, None, false, None),
                false,
            ),
            (
                "user mode, booting again after an error: none yet",
                machine(phase::ERROR, None, false, None),
                false,
            ),
            (
                "user mode + agent: slirp's address is none of the pool's, the VM's kept",
                machine(phase::RUNNING, None, true, Some("10.0.2.15")),
                true,
            ),
            (
                "netns, Running, reported",
                machine(phase::RUNNING, Some(netns.clone()), false, Some("10.0.0.2")),
                true,
            ),
            (
                "netns, Halted: cleared",
                machine(phase::HALTED, Some(netns), false, None),
                false,
            ),
        ];
        for (name, m, kept) in cases {
            // A pool holding slirp's address too: it must still not be read as the guest's.
            let mut books = Allocations {
                placement: Placement::new(crate::flags::default_hosts(), 0),
                pool: AddressPool::new("10.0.0.0/8").unwrap(),
            };
            let a = books.pool.allocate(&key("m"));
            assert_eq!(a, Some("10.0.0.2".parse().unwrap()));
            assert_eq!(books.observe(&key("m"), &m), None, "{name}");
            let want = kept.then(|| "10.0.0.2".parse().unwrap());
            assert_eq!(books.pool.address_of(&key("m")), want, "{name}");
            assert_eq!(books.pool.holder("10.0.2.15".parse().unwrap()), None, "{name}");
        }
    }

    #[test]
    fn a_reported_address_is_claimed_after_a_restart() {
        let mut books = Allocations {
            placement: Placement::new(crate::flags::default_hosts(), 0),
            pool: AddressPool::new("10.42.0.0/16").unwrap(),
        };
        let learned = Network {
            mode: Some("tap".into()),
            bridge: Some("br0".into()),
            learn_ip: Some(true),
            ..Default::default()
        };
        let m = machine(phase::RUNNING, Some(learned), false, Some("10.42.0.9"));
        books.observe(&key("m"), &m);
        assert_eq!(books.pool.holder("10.42.0.9".parse().unwrap()), Some(&key("m")));
        // Not reported: nothing to rebuild from; the guest gets an address when it needs one.
        books.observe(&key("n"), &machine(phase::RUNNING, None, false, None));
        assert_eq!(books.pool.address_of(&key("n")), None);
    }

    #[test]
    fn rejects_bad_pools() {
        for cidr in ["10.0.0.0", "10.0.0.0/31", "x/16", "10.0.0.0/x", "::1/64"] {
            assert!(AddressPool::new(cidr).is_err(), "{cidr}");
        }
    }
}
