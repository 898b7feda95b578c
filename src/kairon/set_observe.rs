//! What a Kairon MachineSet and its members mean for a KaironMachinePool. Pure: no I/O.

use kube::ResourceExt;

use super::machineset::{MACHINESET_LABEL, MachineSet, TEMPLATE_HASH_LABEL};
use super::ownership::{Holder, Ownership};
use super::set_desired::{POOL_ID_ANNOTATION, PoolLink, machine_set_provider_id};
use super::{Machine, Owner, labels};

/// Whether `vm` is a member of `set` (Kairon labels each member with its set's name; members
/// live in the set's namespace).
pub fn is_member_of(vm: &Machine, set: &MachineSet) -> bool {
    vm.namespace() == set.namespace() && vm.labels().get(MACHINESET_LABEL) == set.metadata.name.as_ref()
}

/// The name of the set `vm` is a member of, if any.
pub fn set_of(vm: &Machine) -> Option<&str> {
    vm.labels().get(MACHINESET_LABEL).map(String::as_str)
}

/// The value a pool gives a member's template-hash label when it releases the member (its
/// Machine was drained and deleted): no template has that hash, so Kairon counts the member as
/// outdated and, whatever it does next, removes that one rather than a member of its choice.
pub const RELEASED: &str = "released";

/// Whether the pool released `vm` from its set ([`RELEASED`]).
pub fn is_released(vm: &Machine) -> bool {
    vm.labels().get(TEMPLATE_HASH_LABEL).map(String::as_str) == Some(RELEASED)
}

/// Whether `vm`, a member of a pool's set, has never been started by the pool: Stopped as the
/// template makes it, without the digest of the bootstrap data the pool starts a member with
/// (cloudInit itself is never read back).
pub fn awaits_start(vm: &Machine) -> bool {
    vm.spec.power_state.as_deref() == Some(super::types::power_state::STOPPED)
        && !vm.annotations().contains_key(super::BOOTSTRAP_DATA_HASH_ANNOTATION)
        && vm.metadata.deletion_timestamp.is_none()
}

/// The pool a member's labels (copied from its set's template) name: (namespace, name).
pub fn pool_of_member(vm: &Machine) -> Option<(String, String)> {
    set_of(vm)?;
    let l = vm.labels();
    let name = l.get(labels::KAIRONMACHINEPOOL_NAME)?;
    let ns = l
        .get(labels::KAIRONMACHINEPOOL_NAMESPACE)
        .cloned()
        .or_else(|| vm.namespace())?;
    Some((ns, name.clone()))
}

/// Whose set this is, from the pool's point of view: the one rule for adoption, scaling and
/// deletion of a set, the same as [`super::ownership`] for a VM. The pool's `spec.providerID`
/// (`kairon://machinesets/<uid of its first set>`, also carried by each later set) alone proves nothing: the set must also have been made by
/// this management cluster or one it adopts from.
pub fn set_ownership(set: &MachineSet, pool: &PoolLink, pool_provider_id: Option<&str>, owner: &Owner) -> Ownership {
    let l = set.labels();
    let uid_label = l.get(labels::KAIRONMACHINEPOOL_UID);
    if uid_label.is_some_and(|u| !u.is_empty() && *u == pool.uid) {
        return Ownership::Ours;
    }
    // The pool's provider ID names its first set by UID; every later set carries it.
    let annotated = set.annotations().get(POOL_ID_ANNOTATION).map(String::as_str);
    let named = match (pool_provider_id, set.metadata.uid.as_deref()) {
        (Some(pid), Some(uid)) => pid == machine_set_provider_id(uid) || annotated == Some(pid),
        _ => false,
    };
    if !named {
        return Ownership::Foreign(match uid_label {
            Some(_) => "its labels name another KaironMachinePool".into(),
            None => "no label names this KaironMachinePool and spec.providerID does not name it".into(),
        });
    }
    if let Err(why) = owner.may_adopt(l.get(labels::MANAGEMENT_CLUSTER).map(String::as_str)) {
        return Ownership::Foreign(why);
    }
    Ownership::OursBeforeMove {
        holder: uid_label.map(|uid| Holder {
            namespace: l.get(labels::KAIRONMACHINEPOOL_NAMESPACE).cloned().unwrap_or_default(),
            name: l.get(labels::KAIRONMACHINEPOOL_NAME).cloned().unwrap_or_default(),
            uid: uid.clone(),
        }),
    }
}

/// The member rule of [`super::ownership`]: a VM of a Kairon MachineSet belongs only to a
/// KaironMachine of that set's pool, and a KaironMachine of a pool only to a member of its
/// pool's set. `None`: neither is about a pool; the general rule decides.
pub(crate) fn member_rule(vm: &Machine, km_pool: Option<(&str, &str)>) -> Option<Ownership> {
    match (pool_of_member(vm), set_of(vm), km_pool) {
        (_, None, None) => None,
        (_, None, Some(_)) => Some(Ownership::Foreign(
            "it is no member of a Kairon MachineSet, and this KaironMachine is an instance of a pool".into(),
        )),
        (_, Some(set), None) => Some(Ownership::Foreign(format!(
            "it is a member of Kairon MachineSet {}: only a KaironMachine of that set's pool may claim it",
            crate::text::bounded(set, 63)
        ))),
        (Some((ns, name)), Some(_), Some((km_ns, km_name))) if ns == km_ns && name == km_name => None,
        (_, Some(set), Some(_)) => Some(Ownership::Foreign(format!(
            "it is a member of Kairon MachineSet {}, which backs another pool",
            crate::text::bounded(set, 63)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kairon::fixtures::vm;

    type Labels = Vec<(&'static str, &'static str)>;
    type PoolKey = (&'static str, &'static str);

    fn set(labels: &[(&str, &str)]) -> MachineSet {
        let mut s = MachineSet::new("pool", Default::default());
        s.metadata.namespace = Some("ns".into());
        s.metadata.uid = Some("set-uid".into());
        s.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        s
    }

    fn member(labels: &[(&str, &str)]) -> Machine {
        let mut m = vm(Some("Running"));
        m.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        m
    }

    #[test]
    fn members_released_members_and_members_awaiting_their_start() {
        let s = set(&[]);
        #[rustfmt::skip]
        let cases = [
            ("a member", vec![(MACHINESET_LABEL, "pool"), (TEMPLATE_HASH_LABEL, "h2")], true, false),
            ("a released member", vec![(MACHINESET_LABEL, "pool"), (TEMPLATE_HASH_LABEL, RELEASED)], true, true),
            ("another set's", vec![(MACHINESET_LABEL, "other"), (TEMPLATE_HASH_LABEL, "h2")], false, false),
            ("a plain VM", vec![], false, false),
        ];
        for (name, l, is_member, released) in cases {
            let m = member(&l);
            assert_eq!(is_member_of(&m, &s), is_member, "{name}");
            assert_eq!(is_released(&m), released, "{name}");
        }
        let mut fresh = member(&[(MACHINESET_LABEL, "pool")]);
        fresh.spec.power_state = Some("Stopped".into());
        assert!(awaits_start(&fresh));
        let mut started = fresh.clone();
        started.metadata.annotations = Some(
            [(
                crate::kairon::BOOTSTRAP_DATA_HASH_ANNOTATION.to_string(),
                "sha256:ab".to_string(),
            )]
            .into(),
        );
        assert!(
            !awaits_start(&started),
            "stopped after its start: not the pool's to start again"
        );
        let mut running = fresh.clone();
        running.spec.power_state = Some("Running".into());
        assert!(!awaits_start(&running));
        let mut deleting = fresh;
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
        assert!(!awaits_start(&deleting));
    }

    #[test]
    fn which_sets_are_this_pools() {
        let owner = Owner {
            id: "mc-a".into(),
            adopt_from: vec!["mc-old".into()],
        };
        let pool = PoolLink {
            name: "pool".into(),
            namespace: "ns".into(),
            uid: "pool-uid".into(),
        };
        let uid = labels::KAIRONMACHINEPOOL_UID;
        let mc = labels::MANAGEMENT_CLUSTER;
        let this = Some("kairon://machinesets/set-uid");
        let foreign = |why: &str| Ownership::Foreign(why.into());
        #[rustfmt::skip]
        let cases: Vec<(&str, Labels, Option<&str>, Ownership)> = vec![
            ("its UID label names us", vec![(uid, "pool-uid"), (mc, "mc-a")], None, Ownership::Ours),
            ("no label, no providerID", vec![], None, foreign("no label names this KaironMachinePool")),
            ("another pool's", vec![(uid, "other"), (mc, "mc-a")], None, foreign("another KaironMachinePool")),
            ("an empty UID label", vec![(uid, "")], None, foreign("another KaironMachinePool")),
            ("providerID names a plain Kairon set", vec![], this, foreign("no management-cluster label")),
            ("providerID names another installation's", vec![(uid, "x"), (mc, "mc-b")], this, foreign("mc-b")),
            ("providerID names another set", vec![(mc, "mc-a")], Some("kairon://machinesets/other"), foreign("does not name it")),
            ("moved: the source's set", vec![(uid, "old"), (mc, "mc-old"), (labels::KAIRONMACHINEPOOL_NAME, "pool")], this,
                Ownership::OursBeforeMove { holder: Some(Holder { namespace: String::new(), name: "pool".into(), uid: "old".into() }) }),
        ];
        for (name, l, pid, want) in cases {
            let got = set_ownership(&set(&l), &pool, pid, &owner);
            match (&got, &want) {
                (Ownership::Foreign(why), Ownership::Foreign(part)) => {
                    assert!(why.contains(part.as_str()), "{name}: {why}")
                }
                _ => assert_eq!(got, want, "{name}"),
            }
        }
        // A later set of a moved pool: its annotation carries the pool's provider ID.
        let mut later = set(&[(uid, "old"), (mc, "mc-old")]);
        later.metadata.uid = Some("later-uid".into());
        let first = "kairon://machinesets/first-uid";
        assert!(matches!(
            set_ownership(&later, &pool, Some(first), &owner),
            Ownership::Foreign(_)
        ));
        later.metadata.annotations = Some([(POOL_ID_ANNOTATION.to_string(), first.to_string())].into());
        assert!(matches!(
            set_ownership(&later, &pool, Some(first), &owner),
            Ownership::OursBeforeMove { .. }
        ));
    }

    #[test]
    fn a_member_belongs_only_to_a_kaironmachine_of_its_pool() {
        let ms = MACHINESET_LABEL;
        let pn = labels::KAIRONMACHINEPOOL_NAME;
        let pns = labels::KAIRONMACHINEPOOL_NAMESPACE;
        #[rustfmt::skip]
        let cases: Vec<(&str, Labels, Option<PoolKey>, Option<&str>)> = vec![
            ("a plain VM, a standalone KaironMachine", vec![], None, None),
            ("a member, its pool's KaironMachine", vec![(ms, "pool"), (pn, "pool"), (pns, "ns")], Some(("ns", "pool")), None),
            ("a member without a namespace label reads the VM's", vec![(ms, "pool"), (pn, "pool")], Some(("ns", "pool")), None),
            ("a member, a standalone KaironMachine", vec![(ms, "pool"), (pn, "pool")], None, Some("only a KaironMachine of that set's pool")),
            ("a member, another pool's KaironMachine", vec![(ms, "pool"), (pn, "pool")], Some(("ns", "other")), Some("backs another pool")),
            ("a member, a same-named pool elsewhere", vec![(ms, "pool"), (pn, "pool"), (pns, "ns")], Some(("ns2", "pool")), Some("backs another pool")),
            ("a member of a set not ours", vec![(ms, "theirs")], Some(("ns", "pool")), Some("backs another pool")),
            ("a plain VM, a pool's KaironMachine", vec![], Some(("ns", "pool")), Some("no member")),
        ];
        for (name, l, km_pool, want) in cases {
            match (member_rule(&member(&l), km_pool), want) {
                (None, None) => {}
                (Some(Ownership::Foreign(why)), Some(part)) => assert!(why.contains(part), "{name}: {why}"),
                (got, _) => panic!("{name}: {got:?}"),
            }
        }
    }
}
