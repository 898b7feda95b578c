use capkr::kairon::machineset::{MachineSetSpec, MachineTemplate};
use capkr::kairon::{CloudInit, Image, MachineSpec, MachineStatus, Resources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::*;

fn image(name: &str) -> Option<Image> {
    Some(Image {
        image_ref: Some(name.into()),
        ..Default::default()
    })
}

fn set(replicas: i32) -> MachineSet {
    let mut s = MachineSet::new(
        "pool",
        MachineSetSpec {
            replicas,
            template: MachineTemplate {
                labels: Some([("role".to_string(), "worker".to_string())].into()),
                spec: MachineSpec {
                    resources: Some(Resources {
                        cpu: Some("2".into()),
                        memory: None,
                    }),
                    image: image("img-1"),
                    cloud_init: Some(CloudInit {
                        hostname: "worker".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            },
            strategy: None,
            max_unavailable: None,
        },
    );
    s.metadata.namespace = Some("ns".into());
    s.metadata.finalizers = Some(vec![MACHINESET_FINALIZER.into()]);
    s
}

fn name(n: u32) -> String {
    format!("pool-{n:08x}")
}

fn names(ns: &[u32]) -> Vec<String> {
    ns.iter().map(|n| name(*n)).collect()
}

/// Member `n` of `set` as Kairon made it from its template now, in `phase` (`""`: none yet).
fn made(set: &MachineSet, n: u32, phase: &str) -> Machine {
    let mut m = member(set, &name(n));
    m.metadata.uid = Some(format!("uid-{n}"));
    m.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_000 + i64::from(n)).expect("time")));
    m.status = (!phase.is_empty()).then(|| MachineStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    m
}

fn running(set: &MachineSet, ns: impl IntoIterator<Item = u32>) -> Vec<Machine> {
    ns.into_iter().map(|n| made(set, n, phase::RUNNING)).collect()
}

fn deleted(mut m: Machine) -> Machine {
    m.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(5_000).expect("time")));
    m
}

fn relabelled(mut m: Machine, hash: &str) -> Machine {
    m.labels_mut().insert(TEMPLATE_HASH_LABEL.into(), hash.into());
    m
}

fn refs(members: &[Machine]) -> Vec<&Machine> {
    members.iter().collect()
}

fn step_of(set: &MachineSet, members: &[Machine]) -> SetStep {
    plan(set, &refs(members)).step
}

fn status_of(set: &MachineSet, members: &[Machine]) -> MachineSetStatus {
    plan(set, &refs(members)).status.expect("a status")
}

fn counts(status: &MachineSetStatus) -> (Option<i32>, Option<i32>, Option<i32>) {
    (status.replicas, status.ready_replicas, status.updated_replicas)
}

/// Plays Kairon's ticks until it has nothing to write, with members created Running at once
/// (named from 0x100 up) and deleted ones gone at once. The members left and the steps.
fn settle(set: &mut MachineSet, mut members: Vec<Machine>) -> (Vec<Machine>, Vec<SetStep>) {
    let mut steps = Vec::new();
    let mut next = 0x100;
    for _ in 0..200 {
        let p = plan(set, &refs(&members));
        if p.is_idle(set) {
            return (members, steps);
        }
        if p.add_finalizer {
            set.metadata.finalizers = Some(vec![MACHINESET_FINALIZER.into()]);
        }
        match &p.step {
            SetStep::Create { count } => {
                for _ in 0..*count {
                    members.push(made(set, next, phase::RUNNING));
                    next += 1;
                }
            }
            SetStep::Delete { names } => members.retain(|m| !names.contains(&m.name_any())),
            SetStep::Wait => {}
            SetStep::RemoveFinalizer => panic!("not being deleted"),
        }
        set.status = p.status;
        steps.push(p.step);
    }
    panic!("does not settle: {steps:?}");
}

#[test]
fn a_new_set_gets_its_finalizer_and_its_members_on_the_same_tick() {
    let mut s = set(3);
    s.metadata.finalizers = None;
    let p = plan(&s, &[]);
    assert!(p.add_finalizer);
    assert_eq!(p.step, SetStep::Create { count: 3 });
    assert_eq!(counts(p.status.as_ref().expect("status")), (Some(0), Some(0), Some(0)));
}

#[test]
fn scale_up_creates_the_gap_whatever_else_is_going_on() {
    let s = set(5);
    let members = running(&s, [1, 2]);
    assert_eq!(step_of(&s, &members), SetStep::Create { count: 3 });

    // Outdated members and Recreate do not delay it.
    let mut changed = s.clone();
    changed.spec.template.spec.image = image("img-2");
    changed.spec.strategy = Some(strategy::RECREATE.into());
    assert_eq!(step_of(&changed, &members), SetStep::Create { count: 3 });
}

#[test]
fn a_member_is_the_template_with_the_two_labels_and_no_owner() {
    let s = set(1);
    let m = member(&s, "pool-0a1b2c3d");
    assert_eq!(m.namespace().as_deref(), Some("ns"));
    assert_eq!(m.labels().get("role").map(String::as_str), Some("worker"));
    assert_eq!(m.labels().get(MACHINESET_LABEL).map(String::as_str), Some("pool"));
    assert_eq!(m.labels().get(TEMPLATE_HASH_LABEL), Some(&template_hash(&s)));
    assert_eq!(m.labels().len(), 3);
    assert_eq!(m.spec, s.spec.template.spec, "the spec as it is, cloudInit included");
    assert!(m.metadata.owner_references.is_none());
    assert!(m.annotations().is_empty());
}

#[test]
fn scales_0_to_20_to_5_and_reports_status() {
    let mut s = set(0);
    let (members, steps) = settle(&mut s, Vec::new());
    assert!(
        members.is_empty() && steps.iter().all(|st| *st == SetStep::Wait),
        "{steps:?}"
    );
    assert_eq!(counts(s.status.as_ref().expect("status")), (Some(0), Some(0), Some(0)));

    s.spec.replicas = 20;
    let (members, steps) = settle(&mut s, members);
    assert_eq!(steps[0], SetStep::Create { count: 20 }, "all of the gap at once");
    assert_eq!(members.len(), 20);
    assert_eq!(
        counts(s.status.as_ref().expect("status")),
        (Some(20), Some(20), Some(20))
    );

    s.spec.replicas = 5;
    let mut sorted = members.iter().map(|m| m.name_any()).collect::<Vec<_>>();
    sorted.sort();
    let (members, _) = settle(&mut s, members);
    assert_eq!(
        members.iter().map(|m| m.name_any()).collect::<Vec<_>>(),
        sorted[15..],
        "the last names stay"
    );
    assert_eq!(s.spec.replicas, 5);
    assert!(plan(&s, &refs(&members)).is_idle(&s), "steady state writes nothing");
}

#[test]
fn a_member_deleted_by_someone_else_is_replaced_and_replicas_stay() {
    let mut s = set(3);
    let mut members = running(&s, [1, 2, 3]);
    members[1] = deleted(members[1].clone());
    let p = plan(&s, &refs(&members));
    assert_eq!(p.step, SetStep::Create { count: 1 });
    assert_eq!(
        counts(p.status.as_ref().expect("status")),
        (Some(2), Some(2), Some(2)),
        "a member being deleted is no member"
    );
    // Gone meanwhile, or still held by a finalizer: the same.
    members.remove(1);
    let (members, _) = settle(&mut s, members);
    assert_eq!(members.len(), 3);
    assert_eq!(s.spec.replicas, 3, "Kairon never changes spec.replicas");
    assert!(members.iter().any(|m| m.name_any() == name(0x100)), "a new member");
}

#[test]
fn scale_down_deletes_the_first_names_in_list_order() {
    let mut s = set(5);
    // Listed in any order, of any age and phase: only the names count.
    let members = vec![
        made(&s, 4, phase::RUNNING),
        made(&s, 0x30, ""),
        made(&s, 1, phase::RUNNING),
        made(&s, 3, phase::UNKNOWN),
        made(&s, 2, phase::RUNNING),
        made(&s, 0x20, phase::PENDING),
    ];
    s.spec.replicas = 6;
    assert_eq!(step_of(&s, &members), SetStep::Wait);
    s.spec.replicas = 3;
    assert_eq!(
        step_of(&s, &members),
        SetStep::Delete {
            names: names(&[1, 2, 3])
        }
    );
    s.spec.replicas = -1;
    assert_eq!(
        step_of(&s, &members),
        SetStep::Delete {
            names: names(&[1, 2, 3, 4, 0x20, 0x30])
        },
        "below 0 is 0"
    );
}

#[test]
fn rolling_update_replaces_outdated_within_max_unavailable_counting_running_current_ones() {
    let mut s = set(3);
    let mut members = running(&s, [1, 2, 3]);
    s.spec.template.spec.image = image("img-2");

    // available 0 Running current + 3 outdated, at least 2 must stay: one goes, the first.
    let p = plan(&s, &refs(&members));
    assert_eq!(p.step, SetStep::Delete { names: names(&[1]) });
    assert_eq!(counts(p.status.as_ref().expect("status")), (Some(3), Some(0), Some(0)));
    members[0] = deleted(members[0].clone());
    // It is no member any more: a replacement from the new template, on the next tick.
    assert_eq!(step_of(&s, &members), SetStep::Create { count: 1 });
    members.remove(0);
    members.push(made(&s, 0x10, phase::PENDING));
    // A new member not Running yet is not available: 0 + 2 outdated, nothing more goes.
    let p = plan(&s, &refs(&members));
    assert_eq!(p.step, SetStep::Wait);
    assert_eq!(counts(p.status.as_ref().expect("status")), (Some(3), Some(0), Some(1)));
    // Running: 1 + 2 available, one more outdated goes.
    members[2] = made(&s, 0x10, phase::RUNNING);
    assert_eq!(step_of(&s, &members), SetStep::Delete { names: names(&[2]) });

    let (members, _) = settle(&mut s, members);
    assert_eq!(members.len(), 3);
    let hash = template_hash(&s);
    assert!(
        members
            .iter()
            .all(|m| m.labels().get(TEMPLATE_HASH_LABEL) == Some(&hash))
    );
    assert!(members.iter().all(|m| m.spec.image_ref() == Some("img-2")));
    assert_eq!(counts(s.status.as_ref().expect("status")), (Some(3), Some(3), Some(3)));
    assert_eq!(s.spec.replicas, 3, "no surge, no change of replicas");
}

#[test]
fn rolling_update_takes_max_unavailable_as_an_integer_or_a_percentage() {
    let old = set(4);
    let members = running(&old, [1, 2, 3, 4]);
    let mut s = old.clone();
    s.spec.template.spec.image = image("img-2");
    s.spec.max_unavailable = Some("2".into());
    assert_eq!(step_of(&s, &members), SetStep::Delete { names: names(&[1, 2]) });
    s.spec.max_unavailable = Some("75%".into());
    assert_eq!(
        step_of(&s, &members),
        SetStep::Delete {
            names: names(&[1, 2, 3])
        }
    );
    s.spec.max_unavailable = Some("0".into());
    assert_eq!(
        step_of(&s, &members),
        SetStep::Delete { names: names(&[1]) },
        "0 counts as 1"
    );
    // Outdated members not Running still count as available.
    let mut failing = members.clone();
    failing[3] = made(&old, 4, phase::UNKNOWN);
    s.spec.max_unavailable = None;
    assert_eq!(step_of(&s, &failing), SetStep::Delete { names: names(&[1]) });
}

#[test]
fn with_outdated_members_a_rolling_update_deletes_only_outdated_ones_on_that_tick() {
    let mut s = set(2);
    let mut members = running(&s, [1, 2, 3]);
    members.push(relabelled(made(&s, 4, phase::RUNNING), "old"));
    // 3 current for 2 replicas, but the outdated one goes first; the surplus on a later tick.
    assert_eq!(step_of(&s, &members), SetStep::Delete { names: names(&[4]) });
    members.pop();
    assert_eq!(step_of(&s, &members), SetStep::Delete { names: names(&[1]) });
    s.spec.replicas = 3;
    assert_eq!(step_of(&s, &members), SetStep::Wait);
}

#[test]
fn a_released_member_is_outdated_and_goes_first_when_replicas_drop_by_one() {
    let mut s = set(3);
    let mut members = running(&s, [1, 2, 3]);
    // Released last in list order, so Kairon's own pick would have been another.
    members[2] = relabelled(members[2].clone(), "released");
    let status = status_of(&s, &members);
    assert_eq!(counts(&status), (Some(3), Some(2), Some(2)), "released is not updated");
    s.spec.replicas = 2;
    assert_eq!(step_of(&s, &members), SetStep::Delete { names: names(&[3]) });
    let (left, steps) = settle(&mut s, members);
    assert_eq!(
        steps.iter().filter(|st| matches!(st, SetStep::Delete { .. })).count(),
        1
    );
    assert_eq!(
        left.iter().map(|m| m.name_any()).collect::<Vec<_>>(),
        names(&[1, 2]),
        "no other member"
    );
    assert!(
        steps.iter().all(|st| !matches!(st, SetStep::Create { .. })),
        "{steps:?}"
    );
}

#[test]
fn recreate_deletes_every_outdated_member_at_once_then_creates() {
    let mut s = set(3);
    s.spec.strategy = Some(strategy::RECREATE.into());
    let members = running(&s, [1, 2, 3]);
    s.spec.template.spec.image = image("img-2");
    assert_eq!(
        step_of(&s, &members),
        SetStep::Delete {
            names: names(&[1, 2, 3])
        }
    );
    assert_eq!(step_of(&s, &[]), SetStep::Create { count: 3 });
    let (members, steps) = settle(&mut s, members);
    assert_eq!(
        steps[..2],
        [
            SetStep::Delete {
                names: names(&[1, 2, 3])
            },
            SetStep::Create { count: 3 }
        ]
    );
    assert!(members.iter().all(|m| m.spec.image_ref() == Some("img-2")));
    // Nothing outdated: the surplus goes, first names first.
    s.spec.replicas = 1;
    assert_eq!(
        step_of(&s, &members),
        SetStep::Delete {
            names: names(&[0x100, 0x101])
        }
    );
}

#[test]
fn an_unreadable_max_unavailable_is_reported_and_nothing_is_done() {
    let mut s = set(3);
    let members = running(&s, [1, 2, 3]);
    s.spec.max_unavailable = Some("lots".into());
    assert!(
        plan(&s, &refs(&members)).status.expect("status").message.is_none(),
        "read only in a rollout"
    );
    s.spec.template.spec.image = image("img-2");
    let p = plan(&s, &refs(&members));
    assert_eq!(p.step, SetStep::Wait);
    let status = p.status.expect("status");
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("spec.maxUnavailable: ")),
        "{status:?}"
    );
    assert_eq!(counts(&status), (Some(3), Some(0), Some(0)), "counted all the same");
    s.status = Some(status);
    assert!(plan(&s, &refs(&members)).is_idle(&s), "written once");
    // Below replicas, members are still created.
    assert_eq!(step_of(&s, &members[..1]), SetStep::Create { count: 2 });
    // Fixed: the message goes.
    s.spec.max_unavailable = Some("1".into());
    let p = plan(&s, &refs(&members));
    assert_eq!(p.step, SetStep::Delete { names: names(&[1]) });
    assert_eq!(p.status.expect("status").message, None);
}

#[test]
fn the_template_hash_covers_the_whole_template() {
    let s = set(1);
    let hash = template_hash(&s);
    assert_eq!(hash.len(), 12);
    assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()), "{hash}");
    assert_eq!(hash, template_hash(&s.clone()), "stable");
    let mut other_name = s.clone();
    other_name.metadata.name = Some("other".into());
    other_name.spec.replicas = 7;
    assert_eq!(template_hash(&other_name), hash, "the template only");

    type Change = fn(&mut MachineTemplate);
    let changes: Vec<(&str, Change)> = vec![
        ("cloudInit", |t| {
            t.spec.cloud_init.as_mut().expect("cloudInit").hostname = "other".into()
        }),
        ("cloudInit removed", |t| t.spec.cloud_init = None),
        ("a label", |t| {
            t.labels.as_mut().expect("labels").insert("pool".into(), "b".into());
        }),
        ("the image", |t| t.spec.image = image("img-2")),
        ("the power state", |t| t.spec.power_state = Some("Stopped".into())),
    ];
    for (what, change) in changes {
        let mut changed = s.clone();
        change(&mut changed.spec.template);
        assert_ne!(template_hash(&changed), hash, "{what}");
        assert_eq!(
            step_of(&changed, &running(&s, [1])),
            SetStep::Delete { names: names(&[1]) },
            "{what}: the member is outdated"
        );
    }
}

#[test]
fn ready_counts_running_members_of_the_current_template_only() {
    let s = set(4);
    let members = vec![
        made(&s, 1, phase::RUNNING),
        made(&s, 2, phase::UNKNOWN),
        made(&s, 3, ""),
        relabelled(made(&s, 4, phase::RUNNING), "old"),
        deleted(made(&s, 5, phase::RUNNING)),
    ];
    assert_eq!(counts(&status_of(&s, &members)), (Some(4), Some(1), Some(3)));
}

#[test]
fn labels_added_to_a_member_later_are_kept_and_do_not_roll() {
    let mut s = set(1);
    let mut members = running(&s, [1]);
    members[0].labels_mut().insert("extra".into(), "yes".into());
    let (after, steps) = settle(&mut s, members.clone());
    assert_eq!(after, members);
    assert!(steps.iter().all(|st| *st == SetStep::Wait), "{steps:?}");
}

#[test]
fn a_deleted_set_deletes_every_labelled_machine_then_drops_its_finalizer() {
    let mut s = set(3);
    s.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(9_000).expect("time")));
    let mut members = running(&s, [3, 1, 2]);
    members[1] = deleted(members[1].clone());
    // An outdated one too: it carries the label.
    members.push(relabelled(made(&s, 4, phase::RUNNING), "released"));
    let p = plan(&s, &refs(&members));
    assert_eq!(
        p,
        SetPlan {
            add_finalizer: false,
            step: SetStep::Delete {
                names: names(&[2, 3, 4])
            },
            status: None
        }
    );
    let terminating: Vec<Machine> = members.into_iter().map(deleted).collect();
    assert!(plan(&s, &refs(&terminating)).is_idle(&s), "waits for them to go");
    assert_eq!(plan(&s, &[]).step, SetStep::RemoveFinalizer);
    s.metadata.finalizers = None;
    assert!(plan(&s, &[]).is_idle(&s));
    assert!(
        plan(&s, &refs(&running(&s, [1]))).is_idle(&s),
        "without the finalizer, left alone"
    );
}

#[test]
fn membership_is_the_label_in_the_sets_namespace() {
    let s = set(1);
    let m = member(&s, "pool-a");
    assert!(is_member(&s, &m));
    let mut elsewhere = m.clone();
    elsewhere.metadata.namespace = Some("other".into());
    assert!(!is_member(&s, &elsewhere));
    let mut other = m.clone();
    other.labels_mut().insert(MACHINESET_LABEL.into(), "pool2".into());
    assert!(!is_member(&s, &other));
    // Others' Machines are no members, however many.
    assert_eq!(plan(&s, &[&elsewhere, &other]).step, SetStep::Create { count: 1 });
}
