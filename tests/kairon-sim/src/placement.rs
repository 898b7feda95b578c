//! Kairon hosts and which VM runs on which: placement of new VMs and of live-migration
//! targets against `spec.nodeSelector`, host capacity and cordoned hosts (a Host object's
//! `spec.unschedulable`, or a host in maintenance). Pure bookkeeping; the engine keeps it in
//! line with the Machines' and MachineMigrations' statuses and the Host objects, so it is
//! rebuilt from the objects after a restart.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use capkr::kairon::maintenance::host_matches;

use crate::sim::Key;

/// A Kairon host that can run VMs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// Why a Machine cannot be placed (or moved): the `message` of a Failed/Unschedulable status
/// or of a Failed/NoTargetHost migration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unschedulable(pub String);

/// Which host runs which machine, and how many each host may run.
#[derive(Debug)]
pub struct Placement {
    hosts: Vec<Host>,
    /// Machines per host; 0 means unlimited.
    capacity: usize,
    host_of: HashMap<Key, String>,
    /// Hosts no VM is placed on or migrated to.
    cordoned: BTreeSet<String>,
    /// Targets of live migrations under way: the VM holds a slot there too until it has moved.
    reserved: HashMap<Key, String>,
}

impl Placement {
    pub fn new(hosts: Vec<Host>, capacity: usize) -> Self {
        Self {
            hosts,
            capacity,
            host_of: HashMap::new(),
            cordoned: BTreeSet::new(),
            reserved: HashMap::new(),
        }
    }

    /// Picks the least-loaded schedulable host whose labels satisfy `selector` and that has
    /// room (ties go to the first listed), as a scheduler spreading VMs would.
    pub fn choose(&self, selector: Option<&BTreeMap<String, String>>) -> Result<String, Unschedulable> {
        self.choose_among(selector, None)
    }

    /// Where a live migration of a VM on `source` goes when no target is named: as
    /// [`Self::choose`], among the other hosts.
    pub fn choose_target(
        &self,
        selector: Option<&BTreeMap<String, String>>,
        source: &str,
    ) -> Result<String, Unschedulable> {
        self.choose_among(selector, Some(source))
    }

    /// Whether a migration may go to the named `target` (an operator's choice: the VM's
    /// selector is not checked, but the host must exist, be schedulable and have room).
    pub fn check_target(&self, target: &str, source: &str) -> Result<(), Unschedulable> {
        if target == source {
            return Err(Unschedulable(format!("the VM already runs on host {target}")));
        }
        if self.labels_of(target).is_none() {
            return Err(Unschedulable(format!("no host named {target}")));
        }
        if self.cordoned.contains(target) {
            return Err(Unschedulable(format!("host {target} is unschedulable")));
        }
        if !self.has_room(&self.loads(), target) {
            return Err(Unschedulable(format!(
                "host {target} is full (capacity {} machines per host)",
                self.capacity
            )));
        }
        Ok(())
    }

    fn choose_among(
        &self,
        selector: Option<&BTreeMap<String, String>>,
        excluded: Option<&str>,
    ) -> Result<String, Unschedulable> {
        let matching: Vec<&Host> = self
            .hosts
            .iter()
            .filter(|h| host_matches(selector, &h.labels))
            .collect();
        if matching.is_empty() {
            return Err(Unschedulable(format!(
                "no host matches nodeSelector {}",
                describe_selector(selector)
            )));
        }
        let candidates: Vec<&Host> = matching
            .iter()
            .filter(|h| !self.cordoned.contains(&h.name) && Some(h.name.as_str()) != excluded)
            .copied()
            .collect();
        if candidates.is_empty() {
            let (other, why) = match excluded {
                Some(_) => (" other than the VM's", "the VM's own or unschedulable"),
                None => ("", "all unschedulable"),
            };
            return Err(Unschedulable(format!(
                "no schedulable host{other} matches nodeSelector {} ({} matching, {why})",
                describe_selector(selector),
                matching.len()
            )));
        }
        let loads = self.loads();
        candidates
            .iter()
            .filter(|h| self.has_room(&loads, &h.name))
            .min_by_key(|h| loads.get(h.name.as_str()).copied().unwrap_or(0))
            .map(|h| h.name.clone())
            .ok_or_else(|| {
                Unschedulable(format!(
                    "all {} host(s) matching nodeSelector {} are full (capacity {} machines per host)",
                    candidates.len(),
                    describe_selector(selector),
                    self.capacity
                ))
            })
    }

    fn loads(&self) -> HashMap<&str, usize> {
        let mut loads: HashMap<&str, usize> = HashMap::new();
        for host in self.host_of.values().chain(self.reserved.values()) {
            *loads.entry(host.as_str()).or_default() += 1;
        }
        loads
    }

    fn has_room(&self, loads: &HashMap<&str, usize>, host: &str) -> bool {
        self.capacity == 0 || loads.get(host).copied().unwrap_or(0) < self.capacity
    }

    pub fn assign(&mut self, key: &Key, host: &str) {
        self.host_of.insert(key.clone(), host.to_string());
    }

    pub fn release(&mut self, key: &Key) {
        self.host_of.remove(key);
    }

    /// The VMs that hold a slot on `host`, in name order.
    pub fn machines_on(&self, host: &str) -> Vec<&Key> {
        let mut keys: Vec<&Key> = self
            .host_of
            .iter()
            .filter(|(_, h)| h.as_str() == host)
            .map(|(k, _)| k)
            .collect();
        keys.sort();
        keys
    }

    pub fn labels_of(&self, host: &str) -> Option<&BTreeMap<String, String>> {
        self.hosts.iter().find(|h| h.name == host).map(|h| &h.labels)
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Replaces the set of hosts nothing is placed on.
    pub fn set_cordoned(&mut self, cordoned: BTreeSet<String>) {
        self.cordoned = cordoned;
    }

    /// The VM holds a slot on `host` too, as the target of its migration.
    pub fn reserve(&mut self, key: &Key, host: &str) {
        self.reserved.insert(key.clone(), host.to_string());
    }

    /// Replaces the migration targets held (VM → target host).
    pub fn set_reserved(&mut self, reserved: HashMap<Key, String>) {
        self.reserved = reserved;
    }
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

    fn three_hosts(capacity: usize) -> Placement {
        Placement::new(
            vec![
                host("h1", &[(ZONE, "zone-a")]),
                host("h2", &[(ZONE, "zone-b")]),
                host("h3", &[(ZONE, "zone-b")]),
            ],
            capacity,
        )
    }

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
    fn cordoned_hosts_get_no_new_vms() {
        let mut placement = three_hosts(0);
        placement.set_cordoned(["h2".to_string()].into());
        let zone_b = selector(&[(ZONE, "zone-b")]);
        assert_eq!(placement.choose(Some(&zone_b)), Ok("h3".to_string()));
        placement.set_cordoned(["h2".to_string(), "h3".to_string()].into());
        let err = placement.choose(Some(&zone_b)).unwrap_err();
        assert!(err.0.contains("no schedulable host matches"), "{}", err.0);
        assert_eq!(placement.choose(None), Ok("h1".to_string()));
    }

    #[test]
    fn migration_targets_exclude_the_source_and_cordoned_hosts() {
        let mut placement = three_hosts(0);
        placement.assign(&key("m1"), "h2");
        let zone_b = selector(&[(ZONE, "zone-b")]);
        assert_eq!(placement.choose_target(Some(&zone_b), "h2"), Ok("h3".to_string()));
        placement.set_cordoned(["h3".to_string()].into());
        let err = placement.choose_target(Some(&zone_b), "h2").unwrap_err();
        assert!(err.0.contains("other than the VM's"), "{}", err.0);
        // Without a selector, any other schedulable host.
        assert_eq!(placement.choose_target(None, "h2"), Ok("h1".to_string()));
    }

    #[test]
    fn migrations_under_way_hold_their_target() {
        let mut placement = three_hosts(1);
        placement.assign(&key("m1"), "h2");
        placement.set_reserved([(key("m1"), "h3".to_string())].into());
        let zone_b = selector(&[(ZONE, "zone-b")]);
        assert!(placement.choose(Some(&zone_b)).is_err());
        assert!(placement.check_target("h3", "h1").is_err());
        placement.set_reserved(HashMap::new());
        assert_eq!(placement.choose(Some(&zone_b)), Ok("h3".to_string()));
    }

    #[test]
    fn named_targets_must_be_known_schedulable_other_and_have_room() {
        let mut placement = three_hosts(1);
        placement.assign(&key("m1"), "h1");
        placement.assign(&key("m2"), "h2");
        placement.set_cordoned(["h3".to_string()].into());
        let cases = [
            ("h1", "no: the source", false),
            ("hx", "no: unknown", false),
            ("h3", "no: cordoned", false),
            ("h2", "no: full", false),
        ];
        for (target, name, ok) in cases {
            assert_eq!(placement.check_target(target, "h1").is_ok(), ok, "{name}");
        }
        placement.set_cordoned(BTreeSet::new());
        // The selector is not checked: zone-a's VM may go to zone-b's h3 when named.
        assert_eq!(placement.check_target("h3", "h1"), Ok(()));
    }

    #[test]
    fn machines_on_a_host_are_listed_in_order() {
        let mut placement = three_hosts(0);
        placement.assign(&key("b"), "h1");
        placement.assign(&key("a"), "h1");
        placement.assign(&key("c"), "h2");
        assert_eq!(placement.machines_on("h1"), vec![&key("a"), &key("b")]);
        assert!(placement.machines_on("h3").is_empty());
    }
}
