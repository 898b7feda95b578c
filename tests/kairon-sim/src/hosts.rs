//! Kairon hosts and what machines hold on them: placement against `spec.nodeSelector` and
//! host capacity, and the address pool. Pure bookkeeping; the engine keeps it in line with
//! what the Machines' statuses say, so it is rebuilt from the objects after a restart.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

use capkr::kairon::{Machine, phase};

use crate::sim::Key;

/// A Kairon host that can run VMs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// Why a Machine cannot be placed: the `message` of a Failed/Unschedulable status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unschedulable(pub String);

/// Which host runs which machine, and how many each host may run.
#[derive(Debug)]
pub struct Placement {
    hosts: Vec<Host>,
    /// Machines per host; 0 means unlimited.
    capacity: usize,
    host_of: HashMap<Key, String>,
}

impl Placement {
    pub fn new(hosts: Vec<Host>, capacity: usize) -> Self {
        Self {
            hosts,
            capacity,
            host_of: HashMap::new(),
        }
    }

    /// Picks the least-loaded host whose labels satisfy `selector` and that has room (ties go
    /// to the first listed), as a scheduler spreading VMs would.
    pub fn choose(&self, selector: Option<&BTreeMap<String, String>>) -> Result<String, Unschedulable> {
        let matching: Vec<&Host> = self.hosts.iter().filter(|h| selects(selector, &h.labels)).collect();
        if matching.is_empty() {
            return Err(Unschedulable(format!(
                "no host matches nodeSelector {}",
                describe_selector(selector)
            )));
        }
        let mut loads: HashMap<&str, usize> = HashMap::new();
        for host in self.host_of.values() {
            *loads.entry(host.as_str()).or_default() += 1;
        }
        matching
            .iter()
            .map(|h| (loads.get(h.name.as_str()).copied().unwrap_or(0), h))
            .filter(|(load, _)| self.capacity == 0 || *load < self.capacity)
            .min_by_key(|(load, _)| *load)
            .map(|(_, h)| h.name.clone())
            .ok_or_else(|| {
                Unschedulable(format!(
                    "all {} host(s) matching nodeSelector {} are full (capacity {} machines per host)",
                    matching.len(),
                    describe_selector(selector),
                    self.capacity
                ))
            })
    }

    pub fn assign(&mut self, key: &Key, host: &str) {
        self.host_of.insert(key.clone(), host.to_string());
    }

    pub fn release(&mut self, key: &Key) {
        self.host_of.remove(key);
    }
}

fn selects(selector: Option<&BTreeMap<String, String>>, labels: &BTreeMap<String, String>) -> bool {
    selector.is_none_or(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

fn describe_selector(selector: Option<&BTreeMap<String, String>>) -> String {
    match selector {
        Some(sel) if !sel.is_empty() => {
            let pairs: Vec<String> = sel.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{{{}}}", pairs.join(","))
        }
        _ => "{}".to_string(),
    }
}

/// An IPv4 pool handing out each address to one machine at a time. Allocation walks forward
/// from the last address handed out, so a released address is not reused at once (a stale
/// Node or ARP entry would otherwise point at the next VM).
#[derive(Debug)]
pub struct AddressPool {
    first: u32,
    last: u32,
    cursor: u32,
    owner: HashMap<u32, Key>,
    address_of: HashMap<Key, u32>,
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
        })
    }

    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        (self.first..=self.last).contains(&u32::from(addr))
    }

    /// The address held by `key`, or the next free one.
    pub fn allocate(&mut self, key: &Key) -> Option<Ipv4Addr> {
        if let Some(addr) = self.address_of.get(key) {
            return Some(Ipv4Addr::from(*addr));
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
        previous
    }

    pub fn release(&mut self, key: &Key) {
        if let Some(addr) = self.address_of.remove(key) {
            self.owner.remove(&addr);
        }
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
    /// while the VM exists (Provisioning, Running, Stopped, Terminating), an address while the
    /// Machine reports one (a Failed Machine keeps its address until it is deleted, so the
    /// address never shows on two Machines).
    pub fn observe(&mut self, key: &Key, machine: &Machine) -> Option<Key> {
        let status = machine.status.as_ref();
        let holds_host = matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some(phase::PROVISIONING | phase::RUNNING | phase::STOPPED | phase::TERMINATING)
        );
        match status.and_then(|s| s.host_name.as_deref()) {
            Some(host) if holds_host => self.placement.assign(key, host),
            _ => self.placement.release(key),
        }
        let address = status
            .and_then(|s| s.addresses.as_ref())
            .and_then(|addrs| addrs.iter().find(|a| a.type_ == "InternalIP"))
            .and_then(|a| a.address.parse::<Ipv4Addr>().ok())
            .filter(|a| self.pool.contains(*a));
        match address {
            Some(addr) => self.pool.claim(key, addr),
            None => {
                self.pool.release(key);
                None
            }
        }
    }

    pub fn release(&mut self, key: &Key) {
        self.placement.release(key);
        self.pool.release(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        Key {
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn host(name: &str, labels: &[(&str, &str)]) -> Host {
        Host {
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    fn selector(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const ZONE: &str = "topology.kairon.zyvor.dev/zone";

    #[test]
    fn placement_honours_node_selector_and_capacity() {
        struct Case {
            name: &'static str,
            capacity: usize,
            placed: &'static [(&'static str, &'static str)],
            selector: Option<&'static [(&'static str, &'static str)]>,
            want: Result<&'static str, &'static str>,
        }
        let cases = [
            Case {
                name: "no selector, empty hosts",
                capacity: 0,
                placed: &[],
                selector: None,
                want: Ok("h1"),
            },
            Case {
                name: "spreads to least loaded",
                capacity: 0,
                placed: &[("m1", "h1")],
                selector: None,
                want: Ok("h2"),
            },
            Case {
                name: "selector picks zone",
                capacity: 0,
                placed: &[],
                selector: Some(&[(ZONE, "zone-b")]),
                want: Ok("h2"),
            },
            Case {
                name: "empty selector matches all",
                capacity: 0,
                placed: &[],
                selector: Some(&[]),
                want: Ok("h1"),
            },
            Case {
                name: "unknown zone",
                capacity: 0,
                placed: &[],
                selector: Some(&[(ZONE, "zone-x")]),
                want: Err("no host matches nodeSelector {topology.kairon.zyvor.dev/zone=zone-x}"),
            },
            Case {
                name: "zone full",
                capacity: 1,
                placed: &[("m1", "h1")],
                selector: Some(&[(ZONE, "zone-a")]),
                want: Err(
                    "all 1 host(s) matching nodeSelector {topology.kairon.zyvor.dev/zone=zone-a} are full (capacity 1 machines per host)",
                ),
            },
            Case {
                name: "capacity skips full host",
                capacity: 2,
                placed: &[("m1", "h1"), ("m2", "h1"), ("m3", "h2"), ("m4", "h3"), ("m5", "h3")],
                selector: None,
                want: Ok("h2"),
            },
            Case {
                name: "all full",
                capacity: 1,
                placed: &[("m1", "h1"), ("m2", "h2"), ("m3", "h3")],
                selector: None,
                want: Err("all 3 host(s) matching nodeSelector {} are full (capacity 1 machines per host)"),
            },
            Case {
                name: "unlimited",
                capacity: 0,
                placed: &[("m1", "h1"), ("m2", "h2"), ("m3", "h3")],
                selector: None,
                want: Ok("h1"),
            },
        ];
        for case in cases {
            let mut placement = Placement::new(
                vec![
                    host("h1", &[(ZONE, "zone-a")]),
                    host("h2", &[(ZONE, "zone-b")]),
                    host("h3", &[]),
                ],
                case.capacity,
            );
            for (m, h) in case.placed {
                placement.assign(&key(m), h);
            }
            let sel = case.selector.map(selector);
            let got = placement.choose(sel.as_ref());
            let want = case.want.map(str::to_string).map_err(|m| Unschedulable(m.to_string()));
            assert_eq!(got, want, "{}", case.name);
        }
    }

    #[test]
    fn releasing_a_machine_frees_its_slot() {
        let mut placement = Placement::new(vec![host("h1", &[])], 1);
        placement.assign(&key("m1"), "h1");
        assert!(placement.choose(None).is_err());
        placement.release(&key("m1"));
        assert_eq!(placement.choose(None), Ok("h1".to_string()));
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
    fn claiming_an_address_held_by_another_machine_reports_it() {
        let mut pool = AddressPool::new("10.0.0.0/24").unwrap();
        pool.claim(&key("a"), "10.0.0.9".parse().unwrap());
        assert_eq!(pool.claim(&key("b"), "10.0.0.9".parse().unwrap()), Some(key("a")));
    }

    #[test]
    fn rejects_bad_pools() {
        for cidr in ["10.0.0.0", "10.0.0.0/31", "x/16", "10.0.0.0/x", "::1/64"] {
            assert!(AddressPool::new(cidr).is_err(), "{cidr}");
        }
    }
}
