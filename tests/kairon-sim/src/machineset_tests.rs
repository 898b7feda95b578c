use capkr::kairon::machineset::{
    MACHINESET_FINALIZER, MachineSetSpec, MachineTemplate, RollingUpdate, TemplateMetadata, UpdateStrategy,
    update_strategy,
};
use capkr::kairon::{CloudInit, Image, MachineSpec, MachineStatus, Resources, UserData};
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
                metadata: Some(TemplateMetadata {
                    labels: Some([("role".to_string(), "worker".to_string())].into()),
                }),
                spec: MachineSpec {
                    resources: Some(Resources {
                        cpu: Some("2".into()),
                        memory: None,
                    }),
                    image: image("img-1"),
                    legacy_user_data: Some(UserData("#cloud-config token-1".into())),
                    ..Default::default()
                },
            },
            update_strategy: None,
        },
    );
    s.metadata.namespace = Some("ns".into());
    s.metadata.generation = Some(1);
    s.metadata.finalizers = Some(vec![MACHINESET_FINALIZER.into()]);
    s
}

/// Member `n` of `set` as Kairon made it, created at second `n`, in `phase`.
fn made(set: &MachineSet, n: i64, phase: &str) -> Machine {
    let mut m = member(set, &format!("pool-{n:05}"));
    m.metadata.uid = Some(format!("uid-{n}"));
    m.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_000 + n).expect("time")));
    m.status = Some(MachineStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    m
}

fn deleted(mut m: Machine) -> Machine {
    m.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(5_000).expect("time")));
    m
}

fn removed(mut m: Machine) -> Machine {
    m.annotations_mut()
        .insert(REMOVED_BY_ANNOTATION.into(), REMOVED_BY_MACHINESET.into());
    m
}

fn running(set: &MachineSet, range: std::ops::Range<i64>) -> Vec<Machine> {
    range.map(|n| made(set, n, phase::RUNNING)).collect()
}

fn refs(members: &[Machine]) -> Vec<&Machine> {
    members.iter().collect()
}

fn names(ns: &[i64]) -> Vec<String> {
    ns.iter().map(|n| format!("pool-{n:05}")).collect()
}

/// Applies a plan's creates and removals the way the API server and Kairon's own finalizer
/// would end them at once (members created Running, removed ones gone), step by step, until
/// Kairon waits or writes status. Returns the members and the steps taken.
fn settle(set: &mut MachineSet, mut members: Vec<Machine>) -> (Vec<Machine>, Vec<SetStep>) {
    let mut steps = Vec::new();
    let mut next = 100;
    for _ in 0..100 {
        let step = plan(set, &refs(&members));
        steps.push(step.clone());
        match step {
            SetStep::Create { count } => {
                for _ in 0..count {
                    members.push(made(set, next, phase::RUNNING));
                    next += 1;
                }
            }
            SetStep::Remove { names } => members.retain(|m| !names.contains(&m.name_any())),
            SetStep::Status(status) => set.status = Some(status),
            SetStep::Wait => return (members, steps),
            other => panic!("unexpected {other:?}"),
        }
    }
    panic!("does not settle: {steps:?}");
}

#[test]
fn a_set_gets_its_finalizer_first() {
    let mut s = set(3);
    s.metadata.finalizers = None;
    assert_eq!(plan(&s, &[]), SetStep::AddFinalizer);
}

#[test]
fn scales_0_to_20_to_5_and_reports_status() {
    let mut s = set(0);
    let (members, _) = settle(&mut s, Vec::new());
    assert!(members.is_empty());
    assert_eq!(s.status.as_ref().and_then(|st| st.replicas), Some(0));

    s.spec.replicas = 20;
    assert_eq!(plan(&s, &[]), SetStep::Create { count: 20 });
    let (members, _) = settle(&mut s, members);
    assert_eq!(members.len(), 20);
    let status = s.status.clone().expect("status");
    assert_eq!(
        (status.replicas, status.ready_replicas, status.updated_replicas),
        (Some(20), Some(20), Some(20))
    );
    assert_eq!(status.template_hash.as_deref(), Some(template_hash(&s).as_str()));
    assert_eq!(status.observed_generation, Some(1));

    s.spec.replicas = 5;
    let (members, _) = settle(&mut s, members);
    assert_eq!(members.len(), 5);
    assert_eq!(s.status.as_ref().and_then(|st| st.replicas), Some(5));
    assert_eq!(plan(&s, &refs(&members)), SetStep::Wait, "steady state writes nothing");
}

#[test]
fn a_member_copies_the_template_labels_and_spec_with_user_data() {
    let s = set(1);
    let m = member(&s, "pool-abcde");
    assert_eq!(m.namespace().as_deref(), Some("ns"));
    assert_eq!(m.labels().get("role").map(String::as_str), Some("worker"));
    assert_eq!(m.labels().get(MACHINESET_LABEL).map(String::as_str), Some("pool"));
    assert_eq!(m.labels().get(TEMPLATE_HASH_LABEL), Some(&template_hash(&s)));
    assert_eq!(m.spec, s.spec.template.spec, "cloudInit included");
    assert!(m.metadata.owner_references.is_none());
}

#[test]
fn scale_down_removes_not_running_then_outdated_then_newest() {
    let s = set(2);
    let mut old = made(&s, 1, phase::RUNNING);
    old.labels_mut().insert(TEMPLATE_HASH_LABEL.into(), "outdated".into());
    let members = vec![
        made(&s, 0, phase::RUNNING),
        old,
        made(&s, 2, phase::RUNNING),
        made(&s, 3, phase::UNKNOWN),
        made(&s, 4, phase::RUNNING),
    ];
    // OnDelete, so the outdated member is no rollout.
    let mut s = s;
    s.spec.update_strategy = Some(UpdateStrategy {
        type_: update_strategy::ON_DELETE.into(),
        rolling_update: None,
    });
    assert_eq!(
        plan(&s, &refs(&members)),
        SetStep::Remove {
            names: names(&[3, 1, 4])
        }
    );
}

#[test]
fn a_member_deleted_by_someone_else_lowers_replicas_once_and_is_not_replaced() {
    let mut s = set(3);
    let mut members = running(&s, 0..3);
    members[1] = deleted(members[1].clone());
    let step = plan(&s, &refs(&members));
    assert_eq!(
        step,
        SetStep::ScaleIn {
            uids: vec!["uid-1".into()],
            replicas: 2
        }
    );
    // Kairon's write: spec.replicas and the record, in one patch.
    s.spec.replicas = 2;
    s.annotations_mut()
        .extend(scale_in_records(&["uid-1".into()], &refs(&members)));
    assert_eq!(
        s.annotations()
            .get("scaled-in.kairon.zyvor.dev/uid-1")
            .map(String::as_str),
        Some("pool-00001")
    );
    // The same objects again (a restart, a re-list): no second decrement, no replacement.
    let step = plan(&s, &refs(&members));
    assert!(matches!(step, SetStep::Status(_)), "{step:?}");
    s.status = match step {
        SetStep::Status(st) => Some(st),
        _ => None,
    };
    assert_eq!(s.status.as_ref().and_then(|st| st.replicas), Some(2));
    assert_eq!(plan(&s, &refs(&members)), SetStep::Wait);
    // The member is gone: the record goes, still nothing created.
    members.remove(1);
    assert_eq!(
        plan(&s, &refs(&members)),
        SetStep::ForgetScaledIn {
            uids: vec!["uid-1".into()]
        }
    );
    s.annotations_mut().clear();
    assert_eq!(plan(&s, &refs(&members)), SetStep::Wait);
}

#[test]
fn members_kairon_removes_itself_do_not_scale_in() {
    let s = set(2);
    let mut members = running(&s, 0..3);
    members[2] = deleted(removed(members[2].clone()));
    let step = plan(&s, &refs(&members));
    assert!(matches!(step, SetStep::Status(_)), "{step:?}");
    // Marked but not deleted yet (a restart between the two writes): the deletion is finished.
    members[2] = removed(made(&s, 2, phase::RUNNING));
    assert_eq!(plan(&s, &refs(&members)), SetStep::Remove { names: names(&[2]) });
}

#[test]
fn rolling_update_surges_first_and_removes_outdated_only_when_the_new_runs() {
    let mut s = set(3);
    let members = running(&s, 0..3);
    s.spec.template.spec.image = image("img-2");
    assert_eq!(plan(&s, &refs(&members)), SetStep::Create { count: 1 });

    let mut members = members;
    let mut fresh = made(&s, 10, phase::PENDING);
    members.push(fresh.clone());
    let step = plan(&s, &refs(&members));
    assert!(matches!(step, SetStep::Status(_)), "waits for the new member: {step:?}");

    fresh.status.as_mut().expect("status").phase = Some(phase::RUNNING.into());
    members[3] = fresh;
    assert_eq!(
        plan(&s, &refs(&members)),
        SetStep::Remove { names: names(&[2]) },
        "the newest outdated member"
    );

    let (members, _) = settle(&mut s, members);
    assert_eq!(members.len(), 3);
    let hash = template_hash(&s);
    assert!(
        members
            .iter()
            .all(|m| m.labels().get(TEMPLATE_HASH_LABEL) == Some(&hash))
    );
    assert!(members.iter().all(|m| m.spec.image_ref() == Some("img-2")));
    assert_eq!(s.status.as_ref().and_then(|st| st.updated_replicas), Some(3));
}

#[test]
fn rolling_update_without_surge_removes_first() {
    let mut s = set(3);
    let members = running(&s, 0..3);
    s.spec.template.spec.image = image("img-2");
    s.spec.update_strategy = Some(UpdateStrategy {
        type_: update_strategy::ROLLING_UPDATE.into(),
        rolling_update: Some(RollingUpdate {
            max_surge: Some(0),
            max_unavailable: Some(1),
        }),
    });
    assert_eq!(plan(&s, &refs(&members)), SetStep::Remove { names: names(&[2]) });
    let (members, steps) = settle(&mut s, members);
    assert_eq!(members.len(), 3);
    assert!(
        steps
            .iter()
            .all(|st| !matches!(st, SetStep::Create { count } if *count > 1)),
        "{steps:?}"
    );
}

#[test]
fn on_delete_never_touches_existing_members_and_replacements_are_new() {
    let mut s = set(3);
    let mut members = running(&s, 0..3);
    s.spec.template.spec.image = image("img-2");
    s.spec.update_strategy = Some(UpdateStrategy {
        type_: update_strategy::ON_DELETE.into(),
        rolling_update: None,
    });
    let step = plan(&s, &refs(&members));
    let SetStep::Status(status) = step else {
        panic!("{step:?}")
    };
    assert_eq!((status.replicas, status.updated_replicas), (Some(3), Some(0)));
    s.status = Some(status);
    assert_eq!(plan(&s, &refs(&members)), SetStep::Wait);

    // Its owner deletes an outdated member and, as for any deletion by someone else, the set
    // is scaled in; raising replicas again brings a member of the new template.
    members[0] = deleted(members[0].clone());
    assert!(matches!(
        plan(&s, &refs(&members)),
        SetStep::ScaleIn { replicas: 2, .. }
    ));
    members.remove(0);
    s.spec.replicas = 3;
    assert_eq!(plan(&s, &refs(&members)), SetStep::Create { count: 1 });
    let created = member(&s, "pool-zzzzz");
    assert_eq!(created.spec.image_ref(), Some("img-2"));
}

#[test]
fn the_template_hash_covers_labels_and_spec_but_not_user_data() {
    let s = set(1);
    let hash = template_hash(&s);
    assert_eq!(hash.len(), 10);
    assert_eq!(hash, template_hash(&s.clone()), "stable");

    let mut user_data = s.clone();
    user_data.spec.template.spec.legacy_user_data = Some(UserData("#cloud-config token-2".into()));
    user_data.spec.template.spec.cloud_init = Some(CloudInit {
        hostname: "pool-member".into(),
        ..Default::default()
    });
    assert_eq!(
        template_hash(&user_data),
        hash,
        "new user-data reaches new members only"
    );
    let members = running(&s, 0..1);
    let mut fresh_status = user_data.clone();
    fresh_status.status = match plan(&user_data, &refs(&members)) {
        SetStep::Status(st) => Some(st),
        other => panic!("{other:?}"),
    };
    assert_eq!(plan(&fresh_status, &refs(&members)), SetStep::Wait, "does not roll");
    assert_eq!(
        (
            member(&user_data, "pool-x").spec.legacy_user_data,
            member(&user_data, "pool-x").spec.cloud_init
        ),
        (
            user_data.spec.template.spec.legacy_user_data.clone(),
            user_data.spec.template.spec.cloud_init.clone()
        ),
        "but a new member gets it"
    );

    let mut labels = s.clone();
    labels
        .spec
        .template
        .metadata
        .as_mut()
        .and_then(|m| m.labels.as_mut())
        .expect("labels")
        .insert("pool".into(), "b".into());
    assert_ne!(template_hash(&labels), hash, "a template label rolls");

    let mut spec = s.clone();
    spec.spec.template.spec.resources = Some(Resources {
        cpu: Some("4".into()),
        memory: None,
    });
    assert_ne!(template_hash(&spec), hash);
}

#[test]
fn a_failed_member_is_kept_and_counted_but_not_ready() {
    let s = set(3);
    let mut members = running(&s, 0..2);
    members.push(made(&s, 2, phase::UNKNOWN));
    let step = plan(&s, &refs(&members));
    let SetStep::Status(status) = step else {
        panic!("{step:?}")
    };
    assert_eq!((status.replicas, status.ready_replicas), (Some(3), Some(2)));
}

#[test]
fn labels_added_to_a_member_later_are_kept_and_do_not_roll() {
    let mut s = set(1);
    let mut members = running(&s, 0..1);
    members[0].labels_mut().insert("extra".into(), "yes".into());
    let (after, _) = settle(&mut s, members.clone());
    assert_eq!(after, members);
}

#[test]
fn a_deleted_set_removes_every_member_then_its_finalizer() {
    let mut s = set(3);
    s.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(9_000).expect("time")));
    let mut members = running(&s, 0..3);
    members[0] = deleted(members[0].clone());
    assert_eq!(plan(&s, &refs(&members)), SetStep::Remove { names: names(&[1, 2]) });
    let terminating: Vec<Machine> = members.into_iter().map(deleted).collect();
    assert_eq!(
        plan(&s, &refs(&terminating)),
        SetStep::Wait,
        "no scale-in while deleting"
    );
    assert_eq!(plan(&s, &[]), SetStep::RemoveFinalizer);
    s.metadata.finalizers = None;
    assert_eq!(plan(&s, &[]), SetStep::Wait);
}

#[test]
fn membership_is_the_label_in_the_sets_namespace() {
    let s = set(1);
    let m = member(&s, "pool-a");
    assert!(is_member(&s, &m));
    let mut elsewhere = m.clone();
    elsewhere.metadata.namespace = Some("other".into());
    assert!(!is_member(&s, &elsewhere));
    let mut other = m;
    other.labels_mut().insert(MACHINESET_LABEL.into(), "pool2".into());
    assert!(!is_member(&s, &other));
}
