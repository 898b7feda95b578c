//! What a Kairon Machine's status says about host maintenance: the host it runs on and that
//! host's labels, Kairon's request to take it off its host (`status.evacuation`), and a stop
//! at the request's deadline. Pure: no I/O. Everything is read from plain status fields, the
//! only ones the caches keep ([`super::keep_what_is_read`] keeps the status whole, but
//! [`super::machine_from_value`] drops its conditions).
//!
//! Everything here may come from a tenant's Kairon API: strings are cleaned and bounded
//! before they reach a condition, an event or an annotation.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use super::{Machine, phase};
use crate::text::bounded;

/// A host name as we repeat it (a DNS name is at most 253 characters).
const MAX_HOST: usize = 253;
const MAX_REASON: usize = 64;

/// Kairon's request that the VM's owner take it off its host, cleaned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The host in maintenance.
    pub host: String,
    /// Why (`HostMaintenance`).
    pub reason: String,
    /// When Kairon stops the VM if it still runs there; `None` if Kairon gave none or it does
    /// not parse (then the request waits for nothing but its turn).
    pub deadline: Option<Timestamp>,
}

impl Request {
    /// The deadline as RFC 3339, or "no deadline".
    pub fn deadline_text(&self) -> String {
        self.deadline
            .map_or_else(|| "no deadline".to_string(), |d| d.to_string())
    }
}

/// The VM's evacuation request, if Kairon has one and the VM is not being deleted.
pub fn request(vm: &Machine) -> Option<Request> {
    if vm.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let e = vm.status.as_ref()?.evacuation.as_ref()?;
    Some(Request {
        host: bounded(&e.host_name, MAX_HOST),
        reason: e
            .reason
            .as_deref()
            .filter(|r| !r.is_empty())
            .map_or_else(|| "HostMaintenance".to_string(), |r| bounded(r, MAX_REASON)),
        deadline: e.deadline.as_deref().and_then(|d| d.parse::<Timestamp>().ok()),
    })
}

/// Whether Kairon stopped the VM because it still ran on a host in maintenance at the
/// deadline. Kairon never starts such a VM again: its owner replaces it.
pub fn stopped_at_deadline(vm: &Machine) -> bool {
    let Some(s) = vm.status.as_ref() else {
        return false;
    };
    vm.metadata.deletion_timestamp.is_none()
        && s.phase.as_deref() == Some(phase::STOPPED)
        && s.reason.as_deref() == Some(phase::EVACUATION_DEADLINE_EXCEEDED)
}

/// The host the VM runs on, cleaned (`None`: not placed, or not reported).
pub fn host(vm: &Machine) -> Option<String> {
    vm.status
        .as_ref()?
        .node_name
        .as_deref()
        .filter(|h| !h.is_empty())
        .map(|h| bounded(h, MAX_HOST))
}

/// Whether the VM's current host satisfies `selector` (a failure domain's host selector):
/// `None` when the VM does not report its host's labels (nothing can be said).
pub fn host_satisfies(selector: &BTreeMap<String, String>, vm: &Machine) -> Option<bool> {
    let labels = vm.status.as_ref()?.host_labels.as_ref()?;
    Some(super::maintenance::host_matches(Some(selector), labels))
}

/// The move a live migration made, if the VM now runs on another host than `before` (the
/// host last recorded): `(from, to)`.
pub fn moved(before: Option<&str>, vm: &Machine) -> Option<(String, String)> {
    let before = before.filter(|h| !h.is_empty())?;
    let now = host(vm)?;
    (now != before).then(|| (before.to_string(), now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kairon::{Evacuation, fixtures};

    fn evacuating(deadline: Option<&str>) -> Machine {
        let mut vm = fixtures::vm(Some(phase::RUNNING));
        vm.status.as_mut().unwrap().evacuation = Some(Evacuation {
            host_name: "kairon-node-7".into(),
            reason: Some("HostMaintenance".into()),
            requested_at: Some("2026-01-01T00:00:00Z".into()),
            deadline: deadline.map(Into::into),
        });
        vm
    }

    #[test]
    fn a_request_is_read_with_its_deadline() {
        let r = request(&evacuating(Some("2026-01-01T01:00:00Z"))).unwrap();
        assert_eq!(r.host, "kairon-node-7");
        assert_eq!(r.reason, "HostMaintenance");
        assert_eq!(r.deadline, Some("2026-01-01T01:00:00Z".parse().unwrap()));
        assert_eq!(r.deadline_text(), "2026-01-01T01:00:00Z");
        assert_eq!(request(&fixtures::vm(Some(phase::RUNNING))), None);
    }

    #[test]
    fn an_odd_request_is_cleaned_and_bounded() {
        let mut vm = evacuating(Some("tomorrow"));
        let e = vm.status.as_mut().unwrap().evacuation.as_mut().unwrap();
        e.host_name = format!("h\n{}", "x".repeat(400));
        e.reason = Some(String::new());
        let r = request(&vm).unwrap();
        assert_eq!(r.deadline, None, "an unparsable deadline is none");
        assert!(r.host.len() <= MAX_HOST && !r.host.contains('\n'));
        assert_eq!(r.reason, "HostMaintenance");
    }

    #[test]
    fn a_deleted_vm_has_no_request() {
        let mut vm = evacuating(None);
        vm.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(request(&vm), None);
    }

    #[test]
    fn a_stop_at_the_deadline_is_told_from_other_stops() {
        let mut vm = fixtures::vm(Some(phase::STOPPED));
        assert!(!stopped_at_deadline(&vm));
        vm.status.as_mut().unwrap().reason = Some(phase::EVACUATION_DEADLINE_EXCEEDED.into());
        assert!(stopped_at_deadline(&vm));
        vm.status.as_mut().unwrap().phase = Some(phase::RUNNING.into());
        assert!(!stopped_at_deadline(&vm));
    }

    #[test]
    fn host_labels_against_a_selector() {
        let zone = |z: &str| BTreeMap::from([("topology.kairon.zyvor.dev/zone".to_string(), z.to_string())]);
        let mut vm = fixtures::vm(Some(phase::RUNNING));
        assert_eq!(host_satisfies(&zone("a"), &vm), None, "no labels reported");
        vm.status.as_mut().unwrap().host_labels = Some(zone("a"));
        assert_eq!(host_satisfies(&zone("a"), &vm), Some(true));
        assert_eq!(host_satisfies(&zone("b"), &vm), Some(false));
        assert_eq!(host_satisfies(&BTreeMap::new(), &vm), Some(true));
    }

    #[test]
    fn a_move_is_a_new_host_after_a_known_one() {
        let vm = fixtures::vm(Some(phase::RUNNING));
        assert_eq!(moved(None, &vm), None, "first placement is no move");
        assert_eq!(moved(Some("kairon-node-7"), &vm), None);
        assert_eq!(
            moved(Some("kairon-node-1"), &vm),
            Some(("kairon-node-1".into(), "kairon-node-7".into()))
        );
        let mut unplaced = vm.clone();
        unplaced.status.as_mut().unwrap().node_name = None;
        assert_eq!(moved(Some("kairon-node-1"), &unplaced), None);
    }
}
