//! The KaironMachine of a new pool member ("MachinePool Machines"). Pure but for its name's
//! random suffix.
//!
//! CAPI lists a pool's infrastructure machines by the labels `cluster.x-k8s.io/cluster-name`
//! and `cluster.x-k8s.io/pool-name` (the MachinePool's name through `MustFormatValue`), makes
//! a Machine of the same name for each, and its Machine controller then becomes the
//! KaironMachine's controller owner. Until then a plain owner reference to the pool keeps the
//! KaironMachine from being an orphan (CAPD does the same). From then on it is a KaironMachine
//! like any other: it makes its VM from its own spec with its MachinePool's bootstrap data, and
//! deletes it (behind its finalizer) when CAPI deletes the Machine after draining its Node.
//!
//! The pool creates it with that finalizer already on: the manager that will delete its VM is
//! the one creating it, so the patch a KaironMachine of a MachineSet needs to add it (once
//! CAPI's Machine owns it, as the contract asks of objects CAPI creates) is one write per
//! member saved. Deleted before its Machine exists, it goes through the same deletion as any
//! other: no VM is recorded, none is found under its name, the finalizer goes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use ring::rand::{SecureRandom, SystemRandom};

use super::revision::{REVISION_LABEL, label_value};
use crate::api::{KaironMachine, KaironMachinePool, MACHINE_FINALIZER};
use crate::capi::{CLUSTER_NAME_LABEL, POOL_NAME_LABEL, WATCH_FILTER_LABEL, format_label_value};
use crate::kairon::labels::KAIRONMACHINEPOOL_NAME;

/// Longest name of a member: its VM's name, which is the guest's hostname.
const MAX_NAME: usize = 63;
/// The characters of a name's random suffix (Kubernetes' own for `generateName`: no vowels, no
/// look-alikes).
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
const SUFFIX: usize = 5;

/// Everything a new member's KaironMachine is made of besides the pool's template.
#[derive(Clone, Copy, Debug)]
pub struct MemberOf<'a> {
    pub machine_pool: &'a str,
    pub cluster: &'a str,
    pub revision: &'a str,
    /// The manager's `--watch-filter` value: every object it makes carries it, or its own
    /// watches would never see them.
    pub watch_filter: Option<&'a str>,
}

/// A new member's name: the pool's name (cut to fit) and a random suffix.
pub fn member_name(pool: &str) -> String {
    let mut bytes = [0u8; SUFFIX];
    // The system's randomness never fails on the platforms the manager runs on; were it to,
    // the all-zero suffix only makes a taken name, which the create refuses.
    let _ = SystemRandom::new().fill(&mut bytes);
    let suffix: String = bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect();
    let mut prefix: String = pool.chars().take(MAX_NAME - SUFFIX - 1).collect();
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    format!("{prefix}-{suffix}")
}

/// The KaironMachine of a new member of `pool`, named `name`.
pub fn kaironmachine_for_member(pool: &KaironMachinePool, name: &str, of: MemberOf<'_>) -> KaironMachine {
    let mut labels: std::collections::BTreeMap<String, String> = [
        (CLUSTER_NAME_LABEL.to_string(), of.cluster.to_string()),
        (POOL_NAME_LABEL.to_string(), format_label_value(of.machine_pool)),
        (KAIRONMACHINEPOOL_NAME.to_string(), label_value(&pool.name_any())),
        (REVISION_LABEL.to_string(), of.revision.to_string()),
    ]
    .into();
    if let Some(v) = of.watch_filter {
        labels.insert(WATCH_FILTER_LABEL.to_string(), v.to_string());
    }
    let owner = OwnerReference {
        api_version: KaironMachinePool::api_version(&()).into_owned(),
        kind: KaironMachinePool::kind(&()).into_owned(),
        name: pool.name_any(),
        uid: pool.uid().unwrap_or_default(),
        controller: None,
        block_owner_deletion: None,
    };
    let mut spec = pool.spec.template.clone();
    spec.provider_id = None;
    KaironMachine {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: pool.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            finalizers: Some(vec![MACHINE_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec,
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{KaironMachinePoolSpec, KaironMachineSpec, MachineImage, MachineResources};

    fn pool() -> KaironMachinePool {
        let mut p = KaironMachinePool::new(
            "demo-mp-0",
            KaironMachinePoolSpec {
                template: KaironMachineSpec {
                    resources: Some(MachineResources::new(2, "4Gi")),
                    image: MachineImage::from_image_ref("img", Some("20Gi")),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some("pool-uid".into());
        p
    }

    fn of<'a>(mp: &'a str, filter: Option<&'a str>) -> MemberOf<'a> {
        MemberOf {
            machine_pool: mp,
            cluster: "demo",
            revision: "0123456789abcdef",
            watch_filter: filter,
        }
    }

    #[test]
    fn a_members_kaironmachine_is_found_by_capi_and_makes_its_own_vm() {
        let km = kaironmachine_for_member(&pool(), "demo-mp-0-x7k2q", of("demo-mp-0", None));
        assert_eq!(km.metadata.name.as_deref(), Some("demo-mp-0-x7k2q"));
        assert_eq!(km.metadata.namespace.as_deref(), Some("ns"));
        let l = km.metadata.labels.as_ref().expect("labels");
        assert_eq!(l.get(CLUSTER_NAME_LABEL).map(String::as_str), Some("demo"));
        assert_eq!(l.get(POOL_NAME_LABEL).map(String::as_str), Some("demo-mp-0"));
        assert_eq!(l.get(KAIRONMACHINEPOOL_NAME).map(String::as_str), Some("demo-mp-0"));
        assert_eq!(l.get(REVISION_LABEL).map(String::as_str), Some("0123456789abcdef"));
        assert!(!l.contains_key(WATCH_FILTER_LABEL));
        assert_eq!(
            km.spec.provider_id, None,
            "the KaironMachine sets it once its VM exists"
        );
        assert_eq!(km.spec.image.image_ref.as_deref(), Some("img"));
        let owners = km.metadata.owner_references.as_ref().expect("owner");
        assert_eq!(owners.len(), 1);
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].uid.as_str()),
            ("KaironMachinePool", "pool-uid")
        );
        assert_eq!(owners[0].controller, None, "the Machine becomes its controller");
        assert_eq!(
            km.metadata.finalizers,
            Some(vec![MACHINE_FINALIZER.to_string()]),
            "created with the finalizer its VM needs: no patch to add it"
        );
    }

    #[test]
    fn under_a_watch_filter_every_member_carries_it() {
        let km = kaironmachine_for_member(&pool(), "m", of("demo-mp-0", Some("team-a")));
        let l = km.metadata.labels.expect("labels");
        assert_eq!(l.get(WATCH_FILTER_LABEL).map(String::as_str), Some("team-a"));
    }

    #[test]
    fn a_long_machinepool_name_is_labelled_as_capi_looks_it_up() {
        let long = "machineSetName".repeat(12);
        let km = kaironmachine_for_member(&pool(), "m", of(&long, None));
        let l = km.metadata.labels.expect("labels");
        assert_eq!(l.get(POOL_NAME_LABEL).map(String::as_str), Some("hash_FR_ghQ_z"));
    }

    #[test]
    fn member_names_fit_a_host_name_and_differ() {
        let a = member_name("demo-mp-0");
        assert!(
            a.starts_with("demo-mp-0-") && a.len() == "demo-mp-0-".len() + SUFFIX,
            "{a}"
        );
        assert!(a.bytes().skip("demo-mp-0-".len()).all(|b| ALPHABET.contains(&b)));
        let names: std::collections::BTreeSet<String> = (0..50).map(|_| member_name("p")).collect();
        assert!(names.len() > 45, "random suffixes: {names:?}");
        let long = member_name(&format!("{}-x", "a".repeat(56)));
        assert!(long.len() <= MAX_NAME, "{long}");
        assert!(!long.contains("--"), "{long}");
    }
}
