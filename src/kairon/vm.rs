//! What the provider reads of a Kairon Machine: [`Vm`], the one shape every decision about a
//! Kairon Machine is made from, whether it came from a cache, a read or the answer to a create.
//!
//! A Kairon Machine is written from our model ([`super::Machine`]) and read back as a `Vm`: its
//! identity (name, namespace, uid, deletion), what its network means for the address Kairon
//! reports ([`Attachment`]), Kairon's status, and the few labels and annotations
//! the provider reads, each as a value under its known key. The rest — the spec's disk, cloud-init
//! and placement, other labels and annotations, managedFields, owner references — is not held.
//! At thousands of machines a cached Kairon Machine weighs less than half of what the model
//! did (1.4 KiB against 3.1, heap profile at N=2000): a label or annotation map costs a 0.5 KiB
//! node however few entries it has, and the model's spec 600 bytes inline however much of it
//! was cleared (`docs/benchmarks.md`).
//!
//! Labels and annotations are asked for by key ([`Vm::label`], [`Vm::annotation`]): only the
//! keys in [`READ_LABELS`] and [`READ_ANNOTATIONS`] are kept, and asking for another one is a
//! mistake a debug build stops at. `ResourceExt::labels` of a `Vm` is always empty.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use super::{FAILURE_DOMAIN_ANNOTATION, Machine, MachineSpec, MachineStatus, bootstrap_runtime, labels, maintenance};

/// The labels of a Kairon Machine the provider reads: the link back to its KaironMachine, the
/// management cluster that made it, and a Kairon MachineSet's membership (the rule of
/// [`super::ownership`]).
pub const READ_LABELS: [&str; 5] = [
    labels::KAIRONMACHINE_NAME,
    labels::KAIRONMACHINE_NAMESPACE,
    labels::KAIRONMACHINE_UID,
    labels::MANAGEMENT_CLUSTER,
    labels::KAIRON_MACHINESET,
];

/// The annotations of a Kairon Machine the provider reads: the failure domain it was placed in,
/// the runtime its bootstrap data ran in, and Kairon's marks of a live move.
pub const READ_ANNOTATIONS: [&str; 5] = [
    FAILURE_DOMAIN_ANNOTATION,
    bootstrap_runtime::BOOTSTRAP_RUNTIME_ANNOTATION,
    bootstrap_runtime::BOOTSTRAP_MIGRATION_ANNOTATION,
    maintenance::ADOPT_ONLY_ANNOTATION,
    maintenance::MIGRATION_ANNOTATION,
];

/// How the VM's NIC is attached, as far as it decides whether and how Kairon learns the guest's
/// address ([`super::network::why_no_address`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Attachment {
    /// `spec.network.mode` (`None`: absent, Kairon's `user`).
    pub mode: Option<String>,
    /// `spec.network.netns`.
    pub netns: bool,
    /// `spec.network.learnIP`.
    pub learn_ip: bool,
    /// `spec.guestAgent.enabled`.
    pub guest_agent: bool,
}

impl Attachment {
    /// The attachment `spec` asks for.
    pub fn of(spec: &MachineSpec) -> Attachment {
        let network = spec.network.as_ref();
        let on = |flag: Option<bool>| flag == Some(true);
        Attachment {
            mode: network.and_then(|n| n.mode.clone()),
            netns: network.is_some_and(|n| on(n.netns)),
            learn_ip: network.is_some_and(|n| on(n.learn_ip)),
            guest_agent: spec.guest_agent.as_ref().is_some_and(|g| on(g.enabled)),
        }
    }
}

/// A Kairon Machine as the provider reads it (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Vm {
    /// Name, namespace, uid, resourceVersion, generation, timestamps and deletion; finalizers
    /// when read from the API server, not from a cache. No labels, annotations, managedFields
    /// or owner references.
    pub metadata: ObjectMeta,
    pub attachment: Attachment,
    pub status: Option<MachineStatus>,
    /// The values of [`READ_LABELS`] it has.
    labels: Box<[(&'static str, String)]>,
    /// The values of [`READ_ANNOTATIONS`] it has.
    annotations: Box<[(&'static str, String)]>,
}

/// The values of `keys` in `map`, under the keys' own static names.
fn kept(
    map: Option<std::collections::BTreeMap<String, String>>,
    keys: &[&'static str],
) -> Box<[(&'static str, String)]> {
    let Some(mut map) = map else { return Box::default() };
    keys.iter().filter_map(|k| map.remove(*k).map(|v| (*k, v))).collect()
}

impl Vm {
    /// `vm` as read from the API server (a get, the answer to a create): finalizers kept.
    pub fn read(vm: Machine) -> Vm {
        let Machine {
            mut metadata,
            spec,
            status,
        } = vm;
        let labels = kept(metadata.labels.take(), &READ_LABELS);
        let annotations = kept(metadata.annotations.take(), &READ_ANNOTATIONS);
        metadata.managed_fields = None;
        metadata.owner_references = None;
        Vm {
            metadata,
            attachment: Attachment::of(&spec),
            status,
            labels,
            annotations,
        }
    }

    /// `vm` as a cache keeps it: [`Vm::read`] without finalizers (a deletion's wait on them
    /// is judged from a read) and without its resourceVersion (no write of a Kairon Machine is
    /// conditional on it: deletes and patches name the uid), which the cache's key would
    /// otherwise hold once more.
    pub fn cached(vm: Machine) -> Vm {
        let mut vm = Vm::read(vm);
        vm.metadata.finalizers = None;
        vm.metadata.resource_version = None;
        vm
    }

    /// The value of label `key`, one of [`READ_LABELS`].
    pub fn label(&self, key: &str) -> Option<&str> {
        debug_assert!(READ_LABELS.contains(&key), "label {key} is not kept");
        self.labels.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str())
    }

    /// The value of annotation `key`, one of [`READ_ANNOTATIONS`].
    pub fn annotation(&self, key: &str) -> Option<&str> {
        debug_assert!(READ_ANNOTATIONS.contains(&key), "annotation {key} is not kept");
        self.annotations
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl From<Machine> for Vm {
    fn from(vm: Machine) -> Vm {
        Vm::read(vm)
    }
}

// A `Vm` is kept in kube's reflector stores under the Kairon Machine's own kind.
crate::view_of!(Vm, Machine);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kairon::{GuestAgent, Network, fixtures};

    #[test]
    fn a_vm_keeps_the_labels_and_annotations_read_and_nothing_else() {
        let mut m = fixtures::vm(Some("Running"));
        m.metadata.labels = Some(
            [
                (labels::KAIRONMACHINE_NAME, "km1"),
                (labels::KAIRONMACHINE_UID, "km-uid"),
                (labels::MANAGED_BY, labels::MANAGED_BY_VALUE),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        );
        m.metadata
            .annotations
            .get_or_insert_default()
            .insert("kairon.zyvor.dev/scheduled-at".into(), "t".into());
        m.metadata.finalizers = Some(vec!["kairon.zyvor.dev/runtime-cleanup".into()]);
        m.metadata.resource_version = Some("42".into());
        let vm = Vm::read(m.clone());
        assert_eq!(vm.label(labels::KAIRONMACHINE_NAME), Some("km1"));
        assert_eq!(vm.label(labels::KAIRONMACHINE_UID), Some("km-uid"));
        assert_eq!(vm.label(labels::KAIRONMACHINE_NAMESPACE), None);
        assert_eq!(vm.annotation(FAILURE_DOMAIN_ANNOTATION), Some("zone-a"));
        assert_eq!((vm.labels.len(), vm.annotations.len()), (2, 1), "{vm:?}");
        assert!(vm.metadata.labels.is_none() && vm.metadata.annotations.is_none());
        assert_eq!(vm.metadata.finalizers, m.metadata.finalizers, "a read keeps finalizers");
        assert_eq!(vm.status, m.status);
        let cached = Vm::cached(m);
        assert_eq!(cached.metadata.finalizers, None, "a cache does not");
        assert_eq!(cached.metadata.resource_version, None);
        assert_eq!(cached.metadata.uid, vm.metadata.uid);
    }

    #[test]
    fn the_attachment_is_what_the_spec_asks_for() {
        let mut m = fixtures::vm(Some("Running"));
        assert_eq!(Vm::read(m.clone()).attachment, Attachment::default(), "user mode");
        m.spec.network = Some(Network {
            mode: Some("tap".into()),
            bridge: Some("br0".into()),
            learn_ip: Some(true),
            netns: Some(false),
            ..Default::default()
        });
        m.spec.guest_agent = Some(GuestAgent { enabled: Some(true) });
        let vm = Vm::cached(m);
        assert_eq!(
            vm.attachment,
            Attachment {
                mode: Some("tap".into()),
                netns: false,
                learn_ip: true,
                guest_agent: true,
            }
        );
    }

    #[test]
    #[should_panic(expected = "is not kept")]
    #[cfg(debug_assertions)]
    fn asking_for_a_label_not_kept_is_a_mistake() {
        Vm::read(fixtures::vm(None)).label(labels::MANAGED_BY);
    }
}
