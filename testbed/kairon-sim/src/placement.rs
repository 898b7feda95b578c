//! Kairon hosts and which VM runs on which: placement of new VMs and of live-migration
//! targets against `spec.placement.nodeSelector`, host capacity and cordoned hosts (a Host
//! object's `spec.unschedulable`, or a host in maintenance), and new VMs spread by
//! `spec.placement.preferredAntiAffinity` (and kept apart by the hard `antiAffinity`). Pure bookkeeping; the engine keeps it in
//! line with the Machines' and MachineMigrations' statuses and the Host objects, so it is
//! rebuilt from the objects after a restart.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use capkr::kairon::budget::selects;
use capkr::kairon::{MachineSpec, Term, WeightedTerm};

use crate::sim::Key;

/// A Kairon host that can run VMs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// Whether a host's labels satisfy a Machine's `nodeSelector` (none: every host does).
pub fn host_matches(selector: Option<&BTreeMap<String, String>>, host_labels: &BTreeMap<String, String>) -> bool {
    selector.is_none_or(|s| s.iter().all(|(k, v)| host_labels.get(k) == Some(v)))
}

/// `spec.placement.nodeSelector`: the labels a host must have.
pub fn node_selector(spec: &MachineSpec) -> Option<&BTreeMap<String, String>> {
    spec.placement.as_ref().and_then(|p| p.node_selector.as_ref())
}

/// `spec.placement.preferredAntiAffinity`.
pub fn preferred_anti_affinity(spec: &MachineSpec) -> &[WeightedTerm] {
    spec.placement
        .as_ref()
        .and_then(|p| p.preferred_anti_affinity.as_deref())
        .unwrap_or_default()
}

/// `spec.placement.antiAffinity`: hard terms, as weighted ones of [`FORBIDDEN`] weight.
pub fn required_anti_affinity(spec: &MachineSpec) -> Vec<WeightedTerm> {
    let terms: &[Term] = spec
        .placement
        .as_ref()
        .and_then(|p| p.anti_affinity.as_deref())
        .unwrap_or_default();
    terms
        .iter()
        .map(|t| WeightedTerm {
            weight: 1,
            label_selector: t.label_selector.clone(),
            topology_key: t.topology_key.clone(),
        })
        .collect()
}

/// What a host broken by a hard anti-affinity term weighs in `avoid`: never chosen.
pub const FORBIDDEN: i64 = i64::MAX / 4;

/// The topology key whose value is a host's name when its labels do not give one.
pub const HOSTNAME_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";

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

    /// Picks a schedulable host whose labels satisfy `selector` and that has room: the one
    /// `avoid` weighs least (see [`Self::anti_affinity`]; absent: 0), then the least loaded
    /// (ties go to the first listed), as a scheduler spreading VMs would.
    pub fn choose(
        &self,
        selector: Option<&BTreeMap<String, String>>,
        avoid: &HashMap<String, i64>,
    ) -> Result<String, Unschedulable> {
        self.choose_among(selector, None, avoid)
    }

    /// How much the VM `me` would rather not go to each host, by its soft anti-affinity
    /// `terms`: per host, the summed weight of the terms another VM breaks there. A term is
    /// broken on a host when a VM other than `me` that holds a slot (or a migration target)
    /// in the same topology domain matches the term's `labelSelector` as Kairon matches (its
    /// labels by `labels_of`; a missing label reads as `""`). A domain is the value of the term's `topologyKey` among the host's
    /// labels; [`HOSTNAME_TOPOLOGY_KEY`] is the host's name unless its labels say otherwise.
    /// Hosts without the key are not weighed.
    pub fn anti_affinity<'a>(
        &self,
        me: &Key,
        terms: &[WeightedTerm],
        labels_of: impl Fn(&Key) -> Option<&'a BTreeMap<String, String>>,
    ) -> HashMap<String, i64> {
        let mut avoid: HashMap<String, i64> = HashMap::new();
        for term in terms.iter().filter(|t| t.weight > 0) {
            // Kairon's match: an empty selector matches nothing, and `key: ""` holds on a VM
            // without the key.
            let matches = |labels: &BTreeMap<String, String>| selects(&term.label_selector, Some(labels));
            let taken: BTreeSet<String> = self
                .host_of
                .iter()
                .chain(self.reserved.iter())
                .filter(|(k, _)| *k != me && labels_of(k).is_some_and(matches))
                .filter_map(|(_, host)| self.domain(host, &term.topology_key))
                .collect();
            for host in &self.hosts {
                if self
                    .domain(&host.name, &term.topology_key)
                    .is_some_and(|d| taken.contains(&d))
                {
                    *avoid.entry(host.name.clone()).or_default() += i64::from(term.weight);
                }
            }
        }
        avoid
    }

    /// The topology domain of `host` for `key`.
    fn domain(&self, host: &str, key: &str) -> Option<String> {
        match self.labels_of(host).and_then(|l| l.get(key)) {
            Some(value) => Some(value.clone()),
            None => (key == HOSTNAME_TOPOLOGY_KEY).then(|| host.to_string()),
        }
    }

    /// Where a live migration of a VM on `source` goes when no target is named: as
    /// [`Self::choose`], among the other hosts.
    pub fn choose_target(
        &self,
        selector: Option<&BTreeMap<String, String>>,
        source: &str,
    ) -> Result<String, Unschedulable> {
        self.choose_among(selector, Some(source), &HashMap::new())
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
        avoid: &HashMap<String, i64>,
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
        let allowed: Vec<&Host> = candidates
            .iter()
            .filter(|h| avoid.get(&h.name).copied().unwrap_or(0) < FORBIDDEN)
            .copied()
            .collect();
        if allowed.is_empty() {
            return Err(Unschedulable(format!(
                "every host matching nodeSelector {} breaks the Machine's antiAffinity",
                describe_selector(selector)
            )));
        }
        let loads = self.loads();
        allowed
            .iter()
            .filter(|h| self.has_room(&loads, &h.name))
            .min_by_key(|h| {
                (
                    avoid.get(&h.name).copied().unwrap_or(0),
                    loads.get(h.name.as_str()).copied().unwrap_or(0),
                )
            })
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
#[path = "placement_tests.rs"]
mod tests;
