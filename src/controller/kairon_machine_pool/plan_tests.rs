//! Table tests of [`super::plan_pool`]. An instance is written `name:VKM`: its VM (`r`
//! running and current, `s` current and not started yet, `o` outdated, `b` failed, `d` being
//! deleted or released, `-` none), its
//! KaironMachine (`k`, `g`: it found its VM gone, `_` none) and its Machine's flags (`.` none;
//! `m` available, `u` not available, then any of `x` marked delete-machine, `h` remediation
//! asked, `D` being deleted). Creation time is the instance's position.

use super::*;

fn instances(spec: &str) -> Vec<Instance> {
    spec.split_whitespace()
        .enumerate()
        .map(|(n, s)| {
            let (name, code) = s.split_once(':').expect("name:code");
            let c: Vec<char> = code.chars().collect();
            let vm = match c[0] {
                '-' => None,
                v => Some(Vm {
                    deleting: v == 'd',
                    broken: v == 'b',
                    outdated: v == 'o',
                    awaits_start: v == 's',
                }),
            };
            let km = match c[1] {
                '_' => None,
                k => Some(Km { vm_gone: k == 'g' }),
            };
            let flags: String = c[2..].iter().collect();
            let machine = (!flags.starts_with('.')).then(|| PoolMachine {
                deleting: flags.contains('D'),
                delete_annotation: flags.contains('x'),
                remediate: flags.contains('h'),
                available: flags.contains('m'),
                created: i64::try_from(n).unwrap(),
            });
            Instance {
                name: name.into(),
                vm,
                km,
                machine,
            }
        })
        .collect()
}

struct Case {
    name: &'static str,
    /// desired, maxSurge, maxUnavailable, newest first
    pool: (i32, i32, i32, bool),
    /// the current set's spec.replicas, the sum over all the pool's sets
    set: (i32, i32),
    instances: &'static str,
    want_replicas: Option<i32>,
    want_create: &'static str,
    want_start: &'static str,
    want_delete: Vec<(&'static str, Why)>,
}

#[test]
fn plan_pool_table() {
    use Why::*;
    let p = |d| (d, 1, 0, false);
    #[rustfmt::skip]
    let cases = vec![
        Case { name: "an empty pool wanting nothing does nothing", pool: p(0), set: (0, 0), instances: "", want_replicas: None, want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "0 -> 3: the set is raised", pool: p(3), set: (0, 0), instances: "", want_replicas: Some(3), want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "members get a KaironMachine each", pool: p(3), set: (3, 3), instances: "a:s_. b:s_.", want_replicas: None, want_create: "a b", want_start: "", want_delete: vec![] },
        Case { name: "a member with its KaironMachine is started", pool: p(3), set: (3, 3), instances: "a:sk. b:s_. c:rk.", want_replicas: None, want_create: "b", want_start: "a", want_delete: vec![] },
        Case { name: "a member being deleted gets none", pool: p(3), set: (3, 3), instances: "a:d_. b:r_.", want_replicas: None, want_create: "b", want_start: "", want_delete: vec![] },
        Case { name: "steady state: nothing", pool: p(3), set: (3, 3), instances: "a:rkm b:rkm c:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "scale-in: oldest first", pool: p(1), set: (3, 3), instances: "a:rkm b:rkm c:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", ScaleIn), ("b", ScaleIn)] },
        Case { name: "scale-in: newest first by policy", pool: (1, 1, 0, true), set: (3, 3), instances: "a:rkm b:rkm c:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("c", ScaleIn), ("b", ScaleIn)] },
        Case { name: "scale-in: CAPI's mark first", pool: p(2), set: (3, 3), instances: "a:rkm b:rkmx c:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("b", ScaleIn)] },
        Case { name: "scale-in: the marked one before an unavailable one", pool: p(2), set: (3, 3), instances: "a:rku b:rkm c:rkmx", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("c", ScaleIn)] },
        Case { name: "scale-in: not available before older", pool: p(2), set: (3, 3), instances: "a:rkm b:rkm c:rku", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("c", ScaleIn)] },
        Case { name: "scale-in: outdated before current", pool: (2, 0, 1, false), set: (2, 3), instances: "a:rkm b:okm c:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("b", ScaleIn)] },
        Case { name: "scale-in waits while CAPI has yet to make a Machine", pool: p(1), set: (2, 2), instances: "a:rkm b:rk.", want_replicas: None, want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "scale-in counts Machines already draining as gone", pool: p(1), set: (3, 3), instances: "a:rkmD b:rkm c:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("b", ScaleIn)] },
        Case { name: "scale to 0", pool: p(0), set: (2, 2), instances: "a:rkm b:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", ScaleIn), ("b", ScaleIn)] },
        Case { name: "a failed VM's Machine goes", pool: p(2), set: (2, 2), instances: "a:bkm b:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", Broken)] },
        Case { name: "failed VMs are replaced one at a time (maxUnavailable 0)", pool: p(3), set: (3, 3), instances: "a:bkm b:bkm c:bkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", Broken)] },
        Case { name: "failed VMs: none while one is being replaced", pool: p(3), set: (3, 3), instances: "a:bkmD b:bkm c:bkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "failed VMs: maxUnavailable 2 at a time", pool: (3, 1, 2, false), set: (3, 3), instances: "a:bkm b:bkm c:bkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", Broken), ("b", Broken)] },
        Case { name: "a failed VM without a Machine yet waits", pool: p(2), set: (2, 2), instances: "a:bk. b:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "remediation asked: that Machine goes", pool: p(2), set: (2, 2), instances: "a:rkmh b:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", Remediation)] },
        Case { name: "remediation of a Machine already deleting: nothing more", pool: p(2), set: (2, 2), instances: "a:rkmhD b:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "a VM its KaironMachine found gone: the Machine goes", pool: p(2), set: (2, 2), instances: "a:-gm b:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", Vanished)] },
        Case { name: "vanished VMs' Machines all go at once", pool: p(2), set: (2, 2), instances: "a:-gm b:-gm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", Vanished), ("b", Vanished)] },
        Case { name: "a Machine with neither VM nor KaironMachine goes", pool: p(1), set: (1, 1), instances: "a:-_m b:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", Vanished)] },
        Case { name: "a member whose KaironMachine went gets one again, its Machine stays", pool: p(1), set: (1, 1), instances: "a:r_m", want_replicas: None, want_create: "a", want_start: "", want_delete: vec![] },
        Case { name: "a released member (the set lowered for it): raised back for the target", pool: p(3), set: (2, 2), instances: "a:rkm b:rkm c:dkm", want_replicas: Some(3), want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "never lowered, even above the target", pool: p(2), set: (5, 5), instances: "a:rkm b:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "members Kairon made over the target are scaled in through CAPI", pool: p(2), set: (4, 4), instances: "a:rkm b:rkm c:rkm d:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", ScaleIn), ("b", ScaleIn)] },
        Case { name: "a member deleted by someone else: Kairon replaces it, the set stays", pool: p(2), set: (2, 2), instances: "a:dkm b:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "rollout 1/0: surge first, into the new set", pool: p(3), set: (0, 3), instances: "a:okm b:okm c:okm", want_replicas: Some(1), want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "rollout 1/0: the surge member is up, the oldest outdated goes", pool: p(3), set: (1, 4), instances: "a:okm b:okm c:okm d:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", Rollout)] },
        Case { name: "rollout 1/0: the surge member is not available yet, nothing goes", pool: p(3), set: (1, 4), instances: "a:okm b:okm c:okm d:rku", want_replicas: None, want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "rollout 1/0: one draining, not released yet: nothing", pool: p(3), set: (1, 4), instances: "a:okmD b:okm c:okm d:rkm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "rollout 1/0: one released, the next surge member", pool: p(3), set: (1, 3), instances: "a:dkmD b:okm c:okm d:rkm", want_replicas: Some(2), want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "rollout 0/1: one at a time without a surge", pool: (3, 0, 1, false), set: (0, 3), instances: "a:okm b:okm c:okm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", Rollout)] },
        Case { name: "rollout 2/0: two surge members", pool: (3, 2, 0, false), set: (0, 3), instances: "a:okm b:okm c:okm", want_replicas: Some(2), want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "rollout done: the last outdated VM going, no more surge", pool: p(3), set: (3, 4), instances: "a:rkm b:rkm c:rkm d:okmD", want_replicas: None, want_create: "", want_start: "", want_delete: vec![] },
        Case { name: "scale-in and rollout together", pool: p(1), set: (0, 3), instances: "a:okm b:okm c:okm", want_replicas: None, want_create: "", want_start: "", want_delete: vec![("a", ScaleIn), ("b", Rollout)] },
        Case { name: "a broken VM is replaced, not rolled; the surge starts the rollout", pool: p(2), set: (0, 2), instances: "a:bkm b:okm", want_replicas: Some(1), want_create: "", want_start: "", want_delete: vec![("a", Broken)] },
    ];
    assert!(cases.len() >= 25);
    for c in cases {
        let insts = instances(c.instances);
        let (desired, max_surge, max_unavailable, newest_first) = c.pool;
        let got = plan_pool(&PlanInput {
            desired,
            max_surge,
            max_unavailable,
            newest_first,
            set_replicas: c.set.0,
            all_replicas: c.set.1,
            instances: &insts,
            hold_broken: false,
        });
        assert_eq!(got.set_replicas, c.want_replicas, "{}: replicas", c.name);
        let created: Vec<&str> = got.create_kaironmachines.iter().map(String::as_str).collect();
        assert_eq!(
            created,
            c.want_create.split_whitespace().collect::<Vec<_>>(),
            "{}: creates",
            c.name
        );
        let started: Vec<&str> = got.start.iter().map(String::as_str).collect();
        assert_eq!(
            started,
            c.want_start.split_whitespace().collect::<Vec<_>>(),
            "{}: starts",
            c.name
        );
        let deleted: Vec<(&str, Why)> = got.delete_machines.iter().map(|(n, w)| (n.as_str(), *w)).collect();
        assert_eq!(deleted, c.want_delete, "{}: deletes", c.name);
    }
}

/// 0 → 20 → 5 with 15 Machines marked by CAPI: exactly those 15 go, and no set is lowered
/// (each release lowers its set by its own member: Kairon picks no victim of its own).
#[test]
fn a_pool_of_20_scaled_to_5_removes_exactly_the_15_marked() {
    let up = plan_pool(&PlanInput {
        desired: 20,
        max_surge: 1,
        set_replicas: 0,
        ..Default::default()
    });
    assert_eq!(up.set_replicas, Some(20));
    let spec: String = (0..20)
        .map(|n| format!("vm{n:02}:rkm{} ", if n % 4 != 0 { "x" } else { "" }))
        .collect();
    let insts = instances(&spec);
    let down = plan_pool(&PlanInput {
        desired: 5,
        max_surge: 1,
        set_replicas: 20,
        all_replicas: 20,
        instances: &insts,
        ..Default::default()
    });
    assert_eq!(down.set_replicas, None, "each release lowers the set by its member");
    let mut gone: Vec<&str> = down.delete_machines.iter().map(|(n, _)| n.as_str()).collect();
    gone.sort_unstable();
    let marked: Vec<String> = (0..20).filter(|n| n % 4 != 0).map(|n| format!("vm{n:02}")).collect();
    assert_eq!(gone, marked.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(down.delete_machines.iter().all(|(_, w)| *w == Why::ScaleIn));
}

#[test]
fn the_autoscaler_annotation_counts_unless_it_is_false() {
    let with = |v: &str| Some([(REPLICAS_MANAGED_BY_ANNOTATION.to_string(), v.to_string())].into());
    assert!(replicas_managed_externally(with("").as_ref()));
    assert!(replicas_managed_externally(with("external-autoscaler").as_ref()));
    assert!(!replicas_managed_externally(with("false").as_ref()));
    assert!(!replicas_managed_externally(None));
}

/// Backing off, a broken VM waits and the plan says so; the pool is whole only with every
/// instance available and none broken.
#[test]
fn broken_vms_wait_while_replacing_them_backs_off() {
    let insts = instances("a:bkm b:rkm");
    let input = PlanInput {
        desired: 2,
        max_surge: 1,
        max_unavailable: 0,
        set_replicas: 2,
        all_replicas: 2,
        instances: &insts,
        ..Default::default()
    };
    let now = plan_pool(&input);
    assert_eq!(now.delete_machines, vec![("a".to_string(), Why::Broken)]);
    assert_eq!((now.broken_held, now.whole), (0, false));
    let held = plan_pool(&PlanInput {
        hold_broken: true,
        ..input.clone()
    });
    assert!(held.delete_machines.is_empty(), "{held:?}");
    assert_eq!((held.broken_held, held.whole), (1, false));
    let fine = instances("a:rkm b:rkm");
    let whole = plan_pool(&PlanInput {
        instances: &fine,
        ..input
    });
    assert!(whole.whole, "{whole:?}");
}
