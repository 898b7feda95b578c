//! What a Kairon Machine means for its KaironMachine. Pure: no I/O.

use kube::ResourceExt;

use super::{FAILURE_DOMAIN_ANNOTATION, Machine, Owner, labels, phase, provider_id};
use crate::api::conditions::{Decided, INSTANCE_PROVISIONED, Status, reason};
use crate::api::{InstanceRef, KaironMachine, MachineAddress};
use crate::text::bounded;

pub use super::ownership::{Holder, Ownership};

/// Bounds for what Kairon reports in free text, before it reaches our status (whose CRD limits
/// a write must respect, or every status write fails) and our events (events.k8s.io rejects
/// notes over 1 KiB, and the event is then lost).
const MAX_KAIRON_REASON: usize = 64;
const MAX_KAIRON_MESSAGE: usize = 512;
/// `status.addresses` holds at most this many (CRD `maxItems`), each at most 256 characters.
const MAX_ADDRESSES: usize = 256;
const MAX_ADDRESS: usize = 256;
/// `status.failureDomain` is at most this long (CRD `maxLength`).
const MAX_FAILURE_DOMAIN: usize = 256;
/// What `status.instance` repeats of a Kairon Machine: its name, namespace and UID (an object
/// name is at most 253 characters; a tenant's API server may send anything), its phase and its
/// host (a DNS name, at most 253).
const MAX_NAME: usize = 253;
const MAX_PHASE: usize = 64;

/// Decides whether `vm` belongs to `km`, for the manager speaking for management cluster
/// `owner`.
///
/// `spec.providerID` can be set by whoever creates a KaironMachine, so it alone proves
/// nothing: a VM it names is this KaironMachine's only when this management cluster (or one it
/// adopts from) labelled it as its own. A plain Kairon VM, or another installation's, is never
/// adopted and never deleted through a providerID.
///
/// A member of a Kairon MachineSet is a pool's: only a KaironMachine of that pool may claim
/// it, and a pool's KaironMachine claims nothing else ([`super::set_observe::member_rule`]).
pub(crate) fn ownership(vm: &Machine, km: &KaironMachine, owner: &Owner) -> Ownership {
    let km_pool = km.labels().get(labels::KAIRONMACHINEPOOL_NAME);
    let km_ns = km.namespace().unwrap_or_default();
    if let Some(verdict) = super::set_observe::member_rule(vm, km_pool.map(|p| (km_ns.as_str(), p.as_str()))) {
        return verdict;
    }
    let uid_label = vm.labels().get(labels::KAIRONMACHINE_UID);
    if uid_label.is_some() && uid_label == km.metadata.uid.as_ref() {
        return Ownership::Ours;
    }
    let named = match (km.spec.provider_id.as_deref(), vm.metadata.uid.as_deref()) {
        (Some(pid), Some(uid)) => pid == provider_id(uid),
        _ => false,
    };
    if !named {
        return Ownership::Foreign(match uid_label {
            Some(_) => "its labels name another KaironMachine".into(),
            None => "no label names this KaironMachine and spec.providerID does not name it".into(),
        });
    }
    if let Err(why) = owner.may_adopt(vm.labels().get(labels::MANAGEMENT_CLUSTER).map(String::as_str)) {
        return Ownership::Foreign(why);
    }
    Ownership::OursBeforeMove { holder: holder(vm) }
}

/// The KaironMachine `vm`'s labels name, if they name one by UID: the inverse of the labels
/// [`super::desired_kairon_machine`] writes.
pub(crate) fn holder(vm: &Machine) -> Option<Holder> {
    let l = vm.labels();
    let uid = l.get(labels::KAIRONMACHINE_UID)?;
    Some(Holder {
        namespace: l
            .get(labels::KAIRONMACHINE_NAMESPACE)
            .cloned()
            .or_else(|| vm.namespace())
            .unwrap_or_default(),
        name: l
            .get(labels::KAIRONMACHINE_NAME)
            .cloned()
            .unwrap_or_else(|| vm.name_any()),
        uid: uid.clone(),
    })
}

/// The phase, with a missing one read as Pending and a deleted Machine as Terminating.
pub(crate) fn effective_phase(vm: &Machine) -> &str {
    if vm.metadata.deletion_timestamp.is_some() {
        return phase::TERMINATING;
    }
    vm.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or(phase::PENDING)
}

/// Whether the VM runs.
pub(crate) fn is_running(vm: &Machine) -> bool {
    effective_phase(vm) == phase::RUNNING
}

/// Kairon's reason and message when the VM failed (terminal for that Kairon Machine).
pub(crate) fn failure(vm: &Machine) -> Option<(String, String)> {
    if effective_phase(vm) != phase::FAILED {
        return None;
    }
    let status = vm.status.as_ref();
    let reason = status
        .and_then(|s| s.reason.as_deref())
        .filter(|r| !r.is_empty())
        .map_or_else(|| "Unknown".into(), |r| bounded(r, MAX_KAIRON_REASON));
    let message = status
        .and_then(|s| s.message.as_deref())
        .map(|m| bounded(m, MAX_KAIRON_MESSAGE))
        .unwrap_or_default();
    Some((reason, message))
}

/// CAPI's v1beta1 MachineStatusError for a Kairon failure reason.
pub(crate) fn failure_reason_v1beta1(kairon_reason: &str) -> &'static str {
    match kairon_reason {
        "Unschedulable" | "InsufficientCapacity" => "InsufficientResources",
        "ImageNotFound" | "InvalidSpec" | "NetworkNotFound" => "InvalidConfiguration",
        _ => "CreateError",
    }
}

/// The `InstanceProvisioned` condition for the VM's current phase.
pub(crate) fn instance_condition(vm: &Machine) -> Decided {
    let name = bounded(&vm.name_any(), MAX_NAME);
    if effective_phase(vm) == phase::UNREADABLE {
        let why = vm
            .status
            .as_ref()
            .and_then(|s| s.message.as_deref())
            .unwrap_or_default();
        return Decided::new(
            INSTANCE_PROVISIONED,
            Status::Unknown,
            reason::INSTANCE_UNREADABLE,
            format!("Kairon Machine {name} could not be read: {why}"),
        );
    }
    let (status, r, message) = match effective_phase(vm) {
        phase::RUNNING => (
            Status::True,
            reason::PROVISIONED,
            format!("Kairon Machine {name} is running"),
        ),
        // One state for the KaironMachine: Kairon is bringing the machine up (see
        // `status_phase`).
        // Kairon's Starting, and Blocked (an incoming migration not yet arrived), are steps of
        // the same bringing-up.
        phase::PENDING | phase::PROVISIONING | phase::STARTING | phase::BLOCKED => (
            Status::False,
            reason::INSTANCE_PROVISIONING,
            format!("Kairon Machine {name} is being provisioned"),
        ),
        // Kairon's power states short of Stopped: the VM is there but does not run.
        phase::PAUSED | phase::HALTED => (
            Status::False,
            reason::INSTANCE_STOPPED,
            format!("Kairon Machine {name} is {}", phase_word(effective_phase(vm))),
        ),
        // Kairon's Error is not terminal: Kairon retries the VM, and so the KaironMachine waits,
        // saying why.
        phase::ERROR => (
            Status::False,
            reason::INSTANCE_ERROR,
            match kairon_message(vm) {
                Some(m) => format!("Kairon Machine {name} reports an error, which Kairon retries: {m}"),
                None => format!("Kairon Machine {name} reports an error, which Kairon retries"),
            },
        ),
        phase::STOPPED => (
            Status::False,
            reason::INSTANCE_STOPPED,
            // Kairon says why when it stopped the VM itself (EvacuationDeadlineExceeded).
            match vm
                .status
                .as_ref()
                .and_then(|s| s.reason.as_deref())
                .filter(|r| !r.is_empty())
            {
                Some(r) => format!("Kairon Machine {name} is stopped: {}", bounded(r, MAX_KAIRON_REASON)),
                None => format!("Kairon Machine {name} is stopped"),
            },
        ),
        phase::TERMINATING => (
            Status::False,
            reason::INSTANCE_TERMINATING,
            format!("Kairon Machine {name} is being deleted"),
        ),
        phase::FAILED => {
            let (kr, km) = failure(vm).unwrap_or_default();
            let detail = if km.is_empty() { kr } else { format!("{kr}: {km}") };
            (
                Status::False,
                reason::INSTANCE_FAILED,
                format!("Kairon Machine {name} failed: {detail}"),
            )
        }
        other => (
            Status::Unknown,
            reason::INSTANCE_PENDING,
            format!(
                "Kairon Machine {name} is in unknown phase {}",
                bounded(other, MAX_KAIRON_REASON)
            ),
        ),
    };
    Decided::new(INSTANCE_PROVISIONED, status, r, message)
}

/// Kairon's `status.message`, bounded and cleaned, when it says anything.
fn kairon_message(vm: &Machine) -> Option<String> {
    vm.status
        .as_ref()
        .and_then(|s| s.message.as_deref())
        .map(|m| bounded(m, MAX_KAIRON_MESSAGE))
        .filter(|m| !m.trim().is_empty())
}

fn phase_word(p: &str) -> &'static str {
    match p {
        phase::PAUSED => "paused",
        _ => "halted",
    }
}

/// Addresses in CAPI's vocabulary; anything else Kairon reports is left out.
pub(crate) fn addresses(vm: &Machine) -> Vec<MachineAddress> {
    const TYPES: [&str; 5] = ["Hostname", "ExternalIP", "InternalIP", "ExternalDNS", "InternalDNS"];
    vm.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| TYPES.contains(&a.type_.as_str()) && is_clean(&a.address, MAX_ADDRESS))
        .take(MAX_ADDRESSES)
        .map(|a| MachineAddress {
            type_: a.type_.clone(),
            address: a.address.clone(),
        })
        .collect()
}

/// The failure domain the VM was placed in.
pub(crate) fn failure_domain(vm: &Machine) -> Option<String> {
    vm.annotations()
        .get(FAILURE_DOMAIN_ANNOTATION)
        .filter(|f| is_clean(f, MAX_FAILURE_DOMAIN))
        .cloned()
}

/// Whether `value` (an address, a failure domain: a value others act on, which a cut or a
/// replaced character would make wrong) can be reported as it is: not empty, at most `max`
/// bytes, no control characters. Otherwise it is not reported at all.
fn is_clean(value: &str, max: usize) -> bool {
    !value.is_empty() && value.len() <= max && !value.chars().any(char::is_control)
}

/// `status.instance` of the KaironMachine.
///
/// A Kairon Machine that is being brought up (Kairon's Pending, then Provisioning with a host
/// chosen) is recorded as one state: phase `Provisioning`, no host. Nothing the contract reads
/// changes between the two, and without this the status written depended on how many of the
/// steps a reconcile happened to see (all of them without a client limit, none under it, as the
/// reconciles queue): one more status write per machine exactly when the API server is busiest.
///
/// Everything in it comes from the Kairon API, which a tenant's identity can name: each string
/// is cleaned of control characters and bounded, as Kairon's free text is.
pub(crate) fn instance_ref(vm: &Machine) -> InstanceRef {
    let phase = status_phase(vm);
    InstanceRef {
        name: bounded(&vm.name_any(), MAX_NAME),
        namespace: bounded(&vm.namespace().unwrap_or_default(), MAX_NAME),
        uid: vm.metadata.uid.as_deref().map(|u| bounded(u, MAX_NAME)),
        phase: Some(bounded(phase, MAX_PHASE)),
        host: vm
            .status
            .as_ref()
            .and_then(|s| s.host_name.as_deref())
            .filter(|h| !h.is_empty() && phase != phase::PROVISIONING)
            .map(|h| bounded(h, MAX_NAME)),
        identity_ref: None,
        endpoint: None,
    }
}

/// The phase as the KaironMachine records it: [`effective_phase`], with Pending recorded as
/// Provisioning.
pub(crate) fn status_phase(vm: &Machine) -> &str {
    match effective_phase(vm) {
        phase::PENDING | phase::STARTING | phase::BLOCKED => phase::PROVISIONING,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kairon::Address;
    use crate::kairon::fixtures::vm;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn instance_condition_for_every_phase() {
        let cases = [
            (None, Status::False, reason::INSTANCE_PROVISIONING),
            (Some("Pending"), Status::False, reason::INSTANCE_PROVISIONING),
            (Some("Provisioning"), Status::False, reason::INSTANCE_PROVISIONING),
            (Some("Running"), Status::True, reason::PROVISIONED),
            (Some("Stopped"), Status::False, reason::INSTANCE_STOPPED),
            (Some("Failed"), Status::False, reason::INSTANCE_FAILED),
            (Some("Terminating"), Status::False, reason::INSTANCE_TERMINATING),
            (Some("Hibernating"), Status::Unknown, reason::INSTANCE_PENDING),
            // Kairon's own phases (kairon-node, kairon-controller).
            (Some("Starting"), Status::False, reason::INSTANCE_PROVISIONING),
            (Some("Blocked"), Status::False, reason::INSTANCE_PROVISIONING),
            (Some("Paused"), Status::False, reason::INSTANCE_STOPPED),
            (Some("Halted"), Status::False, reason::INSTANCE_STOPPED),
            (Some("Error"), Status::False, reason::INSTANCE_ERROR),
            (Some("Unknown"), Status::Unknown, reason::INSTANCE_PENDING),
        ];
        for (phase, status, r) in cases {
            let d = instance_condition(&vm(phase));
            assert_eq!((d.status, d.reason), (status, r), "phase {phase:?}");
            assert_eq!(d.type_, INSTANCE_PROVISIONED);
            assert!(d.message.contains("m1"), "{phase:?}: {}", d.message);
        }
    }

    /// None of Kairon's phases is terminal: Error is reported with Kairon's message and waited
    /// on, an unknown phase is named; the steps of bringing a VM up are recorded as one.
    #[test]
    fn kairons_phases_are_never_a_failure() {
        for p in [
            "Pending", "Starting", "Running", "Paused", "Halted", "Stopped", "Error", "Unknown", "Blocked",
        ] {
            assert_eq!(failure(&vm(Some(p))), None, "{p}");
        }
        let mut err = vm(Some("Error"));
        err.status.as_mut().unwrap().message = Some("image \"ubuntu\": download failed:\n 404".into());
        let d = instance_condition(&err);
        assert_eq!(d.reason, reason::INSTANCE_ERROR);
        assert!(d.message.contains("which Kairon retries: image"), "{}", d.message);
        assert!(!d.message.contains('\n'), "{}", d.message);
        err.status.as_mut().unwrap().message = Some("  ".into());
        assert!(
            instance_condition(&err)
                .message
                .ends_with("reports an error, which Kairon retries"),
            "{}",
            instance_condition(&err).message
        );
        assert!(
            instance_condition(&vm(Some("Unknown")))
                .message
                .contains("unknown phase Unknown")
        );
        assert!(instance_condition(&vm(Some("Halted"))).message.ends_with("is halted"));
        assert!(instance_condition(&vm(Some("Paused"))).message.ends_with("is paused"));
        for p in ["Pending", "Starting", "Blocked"] {
            assert_eq!(status_phase(&vm(Some(p))), phase::PROVISIONING, "{p}");
        }
        assert_eq!(status_phase(&vm(Some("Error"))), "Error");
    }

    #[test]
    fn failed_message_carries_kairons_reason_and_message() {
        let d = instance_condition(&vm(Some("Failed")));
        assert!(
            d.message.contains("Unschedulable: no host has 64 CPUs"),
            "{}",
            d.message
        );
        assert_eq!(
            failure(&vm(Some("Failed"))),
            Some(("Unschedulable".into(), "no host has 64 CPUs".into()))
        );
        assert_eq!(failure(&vm(Some("Running"))), None);
    }

    #[test]
    fn deletion_timestamp_means_terminating_whatever_the_phase() {
        let mut m = vm(Some("Running"));
        m.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(effective_phase(&m), "Terminating");
        assert!(!is_running(&m));
    }

    #[test]
    fn addresses_keep_only_capi_types() {
        let a = addresses(&vm(Some("Running")));
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].type_, "InternalIP");
        assert_eq!(a[1].type_, "Hostname");
    }

    #[test]
    fn kairons_free_text_is_bounded_and_cleaned_before_it_reaches_status_or_events() {
        let mut m = vm(Some("Failed"));
        let st = m.status.as_mut().unwrap();
        st.reason = Some(format!("Disk\nError{}", "R".repeat(500)));
        st.message = Some(format!("cloud-init: \u{1b}[31m{}", "user-data line\n".repeat(1000)));
        let (r, msg) = failure(&m).unwrap();
        assert!(r.len() <= MAX_KAIRON_REASON && !r.contains('\n'), "{r}");
        assert!(msg.len() <= MAX_KAIRON_MESSAGE && !msg.contains('\n') && !msg.contains('\u{1b}'));
        let d = instance_condition(&m);
        assert!(d.message.len() < 1024, "fits an event note: {}", d.message.len());

        let many: Vec<Address> = (0..300)
            .map(|i| Address {
                type_: "InternalIP".into(),
                address: format!("10.0.{}.{}", i / 256, i % 256),
            })
            .collect();
        let mut m = vm(Some("Running"));
        m.status.as_mut().unwrap().addresses = Some(many);
        assert_eq!(addresses(&m).len(), MAX_ADDRESSES, "the CRD's maxItems");

        m.metadata.annotations = Some([(FAILURE_DOMAIN_ANNOTATION.to_string(), "z".repeat(300))].into());
        assert_eq!(failure_domain(&m), None, "longer than the CRD allows: not reported");
        m.metadata.annotations = Some([(FAILURE_DOMAIN_ANNOTATION.to_string(), "zone-a\nzone-b".into())].into());
        assert_eq!(failure_domain(&m), None, "a control character: not reported");
    }

    /// What a tenant's Kairon API says of a VM (its phase, host, name, addresses) reaches
    /// `status.instance`, `status.addresses` and events cleaned and bounded.
    #[test]
    fn everything_a_kairon_api_sends_is_cleaned_and_bounded() {
        let long = |c: &str| format!("{c}\n\u{1b}[31m{}", c.repeat(100_000));
        let mut m = vm(Some("Running"));
        m.metadata.name = Some(long("n"));
        m.metadata.namespace = Some(long("s"));
        m.metadata.uid = Some(long("u"));
        let st = m.status.as_mut().unwrap();
        st.host_name = Some(long("h"));
        st.addresses = Some(vec![
            Address {
                type_: "InternalIP".into(),
                address: "10.0.0.1\n10.0.0.2".into(),
            },
            Address {
                type_: "InternalIP".into(),
                address: "10.0.0.3".into(),
            },
        ]);
        let r = instance_ref(&m);
        let fields = [Some(r.name), Some(r.namespace), r.uid, r.host];
        for f in fields {
            let f = f.expect("reported");
            assert!(f.len() <= MAX_NAME, "{}", f.len());
            assert!(!f.chars().any(char::is_control), "{f:?}");
        }
        let a = addresses(&m);
        assert_eq!(a.len(), 1, "an address with a newline is left out: {a:?}");
        assert_eq!(a[0].address, "10.0.0.3");
        let d = instance_condition(&m);
        assert!(d.message.len() < 1024, "{}", d.message.len());

        let mut odd = vm(Some("Running"));
        odd.status.as_mut().unwrap().phase = Some(long("p"));
        let r = instance_ref(&odd);
        let phase = r.phase.expect("a phase");
        assert!(
            phase.len() <= MAX_PHASE && !phase.chars().any(char::is_control),
            "{phase:?}"
        );
        assert!(instance_condition(&odd).message.len() < 1024);
    }

    #[test]
    fn v1beta1_failure_reasons() {
        assert_eq!(failure_reason_v1beta1("Unschedulable"), "InsufficientResources");
        assert_eq!(failure_reason_v1beta1("ImageNotFound"), "InvalidConfiguration");
        assert_eq!(failure_reason_v1beta1("DiskError"), "CreateError");
    }

    /// A case: its name, the VM's labels, the KaironMachine's providerID, the manager's
    /// management cluster, the answer.
    type OwnershipCase<'a> = (&'a str, Vec<(&'a str, &'a str)>, Option<&'a str>, &'a Owner, Ownership);

    #[test]
    fn which_vms_are_this_kaironmachines() {
        let owner = Owner {
            id: "mc-a".into(),
            adopt_from: vec!["mc-old".into()],
        };
        let uid = labels::KAIRONMACHINE_UID;
        let mc = labels::MANAGEMENT_CLUSTER;
        let holder = |name: &str, uid: &str| {
            Some(Holder {
                namespace: "ns".into(),
                name: name.into(),
                uid: uid.into(),
            })
        };
        let foreign = |why: &str| Ownership::Foreign(why.into());
        let this_vm = Some("kairon://vm-uid");
        let no_id = Owner::default();
        #[rustfmt::skip]
        let cases: Vec<OwnershipCase> = vec![
            ("its UID label names us", vec![(uid, "km-uid")], None, &owner, Ownership::Ours),
            ("its UID label names us, whatever else", vec![(uid, "km-uid"), (mc, "mc-b")], Some("kairon://x"), &owner, Ownership::Ours),
            ("no label, no providerID", vec![], None, &owner, foreign("no label names this KaironMachine")),
            ("another KaironMachine's", vec![(uid, "other")], None, &owner, foreign("its labels name another KaironMachine")),
            ("providerID names another VM", vec![(mc, "mc-a")], Some("kairon://another-vm"), &owner, foreign("no label names this KaironMachine")),
            ("providerID names a plain Kairon VM", vec![], this_vm, &owner, foreign("no management-cluster label")),
            ("providerID names another installation's VM", vec![(mc, "mc-b"), (uid, "other")], this_vm, &owner, foreign("management cluster mc-b")),
            ("providerID names a VM of ours no KaironMachine claims", vec![(mc, "mc-a")], this_vm, &owner, Ownership::OursBeforeMove { holder: None }),
            ("providerID names a VM of ours another KaironMachine claims", vec![(mc, "mc-a"), (uid, "old-uid"), (labels::KAIRONMACHINE_NAME, "m0")], this_vm, &owner, Ownership::OursBeforeMove { holder: holder("m0", "old-uid") }),
            ("providerID names a VM of the cluster moved from", vec![(mc, "mc-old"), (uid, "old-uid")], this_vm, &owner, Ownership::OursBeforeMove { holder: holder("m1", "old-uid") }),
            ("a member of a Kairon MachineSet is no standalone KaironMachine's, whatever its labels", vec![(uid, "km-uid"), (mc, "mc-a"), (crate::kairon::machineset::MACHINESET_LABEL, "pool")], this_vm, &owner, foreign("member of Kairon MachineSet pool")),
            ("no management-cluster id (request-sequence tests)", vec![], this_vm, &no_id, Ownership::OursBeforeMove { holder: None }),
        ];
        for (name, vm_labels, pid, owner, want) in cases {
            let mut km = KaironMachine::new("m1", Default::default());
            km.metadata.uid = Some("km-uid".into());
            km.spec.provider_id = pid.map(Into::into);
            let mut m = vm(Some("Running"));
            m.metadata.labels = Some(vm_labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
            let got = ownership(&m, &km, owner);
            match (&got, &want) {
                (Ownership::Foreign(why), Ownership::Foreign(part)) => {
                    assert!(why.contains(part.as_str()), "{name}: {why}")
                }
                _ => assert_eq!(got, want, "{name}"),
            }
        }
    }

    #[test]
    fn instance_ref_and_failure_domain() {
        let m = vm(Some("Running"));
        let r = instance_ref(&m);
        assert_eq!(r.name, "m1");
        assert_eq!(r.namespace, "ns");
        assert_eq!(r.uid.as_deref(), Some("vm-uid"));
        assert_eq!(r.phase.as_deref(), Some("Running"));
        assert_eq!(r.host.as_deref(), Some("kairon-node-7"));
        assert_eq!(failure_domain(&m).as_deref(), Some("zone-a"));
    }
}
