//! Table tests of [`super::plan_pool`]. A member is written `name:KM`: its KaironMachine (`k`
//! current, `o` of an older revision, `b` its VM failed, `g` it found its VM gone, `d` being
//! deleted, `_` none) and its Machine's flags (`.` none; `m` available, `u` not available, then
//! any of `x` marked delete-machine, `h` remediation asked, `D` being deleted). Creation time
//! is the member's position.

use super::*;

fn instances(spec: &str) -> Vec<Instance> {
    spec.split_whitespace()
        .enumerate()
        .map(|(n, s)| {
            let (name, code) = s.split_once(':').expect("name:code");
            let c: Vec<char> = code.chars().collect();
            let km = match c[0] {
                '_' => None,
                k => Some(Km {
                    deleting: k == 'd',
                    vm_gone: k == 'g',
                    broken: k == 'b',
                    outdated: k == 'o',
                }),
            };
            let flags: String = c[1..].iter().collect();
            let machine = (!flags.starts_with('.')).then(|| PoolMachine {
                deleting: flags.contains('D'),
                delete_annotation: flags.contains('x'),
                remediate: flags.contains('h'),
                available: flags.contains('m'),
                created: i64::try_from(n).unwrap(),
            });
            Instance {
                name: name.into(),
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
    instances: &'static str,
    want_create: usize,
    want_delete: Vec<(&'static str, Why)>,
}

#[test]
fn plan_pool_table() {
    use Why::*;
    let p = |d| (d, 1, 0, false);
    #[rustfmt::skip]
    let cases = vec![
        Case { name: "an empty pool wanting nothing does nothing", pool: p(0), instances: "", want_create: 0, want_delete: vec![] },
        Case { name: "0 -> 3: three KaironMachines", pool: p(3), instances: "", want_create: 3, want_delete: vec![] },
        Case { name: "members without a Machine yet count", pool: p(3), instances: "a:k. b:k.", want_create: 1, want_delete: vec![] },
        Case { name: "a member being deleted is made again", pool: p(2), instances: "a:dmD b:km", want_create: 1, want_delete: vec![] },
        Case { name: "steady state: nothing", pool: p(3), instances: "a:km b:km c:km", want_create: 0, want_delete: vec![] },
        Case { name: "scale-in: oldest first", pool: p(1), instances: "a:km b:km c:km", want_create: 0, want_delete: vec![("a", ScaleIn), ("b", ScaleIn)] },
        Case { name: "scale-in: newest first by policy", pool: (1, 1, 0, true), instances: "a:km b:km c:km", want_create: 0, want_delete: vec![("c", ScaleIn), ("b", ScaleIn)] },
        Case { name: "scale-in: CAPI's mark first", pool: p(2), instances: "a:km b:kmx c:km", want_create: 0, want_delete: vec![("b", ScaleIn)] },
        Case { name: "scale-in: the marked one before an unavailable one", pool: p(2), instances: "a:ku b:km c:kmx", want_create: 0, want_delete: vec![("c", ScaleIn)] },
        Case { name: "scale-in: not available before older", pool: p(2), instances: "a:km b:km c:ku", want_create: 0, want_delete: vec![("c", ScaleIn)] },
        Case { name: "scale-in: outdated before current", pool: (2, 0, 1, false), instances: "a:km b:om c:km", want_create: 0, want_delete: vec![("b", ScaleIn)] },
        Case { name: "scale-in waits while CAPI has yet to make a Machine", pool: p(1), instances: "a:km b:k.", want_create: 0, want_delete: vec![] },
        Case { name: "scale-in counts Machines already draining as gone", pool: p(1), instances: "a:kmD b:km c:km", want_create: 0, want_delete: vec![("b", ScaleIn)] },
        Case { name: "scale to 0", pool: p(0), instances: "a:km b:km", want_create: 0, want_delete: vec![("a", ScaleIn), ("b", ScaleIn)] },
        Case { name: "a failed VM's Machine goes", pool: p(2), instances: "a:bm b:km", want_create: 1, want_delete: vec![("a", Broken)] },
        Case { name: "failed VMs are replaced one at a time (maxUnavailable 0)", pool: p(3), instances: "a:bm b:bm c:bm", want_create: 1, want_delete: vec![("a", Broken)] },
        Case { name: "failed VMs: none while one is being replaced", pool: p(3), instances: "a:bmD b:bm c:bm", want_create: 1, want_delete: vec![] },
        Case { name: "failed VMs: maxUnavailable 2 at a time", pool: (3, 1, 2, false), instances: "a:bm b:bm c:bm", want_create: 2, want_delete: vec![("a", Broken), ("b", Broken)] },
        Case { name: "a failed VM without a Machine yet waits", pool: p(2), instances: "a:b. b:km", want_create: 0, want_delete: vec![] },
        Case { name: "remediation asked: that Machine goes", pool: p(2), instances: "a:kmh b:km", want_create: 1, want_delete: vec![("a", Remediation)] },
        Case { name: "remediation of a Machine already deleting: nothing more", pool: p(2), instances: "a:kmhD b:km", want_create: 1, want_delete: vec![] },
        Case { name: "a VM its KaironMachine found gone: the Machine goes", pool: p(2), instances: "a:gm b:km", want_create: 1, want_delete: vec![("a", Vanished)] },
        Case { name: "vanished VMs' Machines all go at once", pool: p(2), instances: "a:gm b:gm", want_create: 2, want_delete: vec![("a", Vanished), ("b", Vanished)] },
        Case { name: "a Machine without a KaironMachine goes", pool: p(1), instances: "a:_m b:km", want_create: 0, want_delete: vec![("a", Vanished)] },
        Case { name: "rollout 1/0: surge first", pool: p(3), instances: "a:om b:om c:om", want_create: 1, want_delete: vec![] },
        Case { name: "rollout 1/0: the surge member is up, the oldest outdated goes", pool: p(3), instances: "a:om b:om c:om d:km", want_create: 0, want_delete: vec![("a", Rollout)] },
        Case { name: "rollout 1/0: the surge member is not available yet, nothing goes", pool: p(3), instances: "a:om b:om c:om d:ku", want_create: 0, want_delete: vec![] },
        Case { name: "rollout 1/0: one draining: the next surge member", pool: p(3), instances: "a:omD b:om c:om d:km", want_create: 1, want_delete: vec![] },
        Case { name: "rollout 0/1: one at a time without a surge", pool: (3, 0, 1, false), instances: "a:om b:om c:om", want_create: 0, want_delete: vec![("a", Rollout)] },
        Case { name: "rollout 2/0: two surge members", pool: (3, 2, 0, false), instances: "a:om b:om c:om", want_create: 2, want_delete: vec![] },
        Case { name: "rollout done: the last outdated VM going, no more surge", pool: p(3), instances: "a:km b:km c:km d:omD", want_create: 0, want_delete: vec![] },
        Case { name: "scale-in and rollout together", pool: p(1), instances: "a:om b:om c:om", want_create: 0, want_delete: vec![("a", ScaleIn), ("b", Rollout)] },
        Case { name: "a broken VM is replaced, not rolled; the surge starts the rollout", pool: p(2), instances: "a:bm b:om", want_create: 2, want_delete: vec![("a", Broken)] },
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
            instances: &insts,
            hold_broken: false,
        });
        assert_eq!(got.create, c.want_create, "{}: creates", c.name);
        let deleted: Vec<(&str, Why)> = got.delete_machines.iter().map(|(n, w)| (n.as_str(), *w)).collect();
        assert_eq!(deleted, c.want_delete, "{}: deletes", c.name);
    }
}

/// A KaironMachine that found its VM gone before CAPI made its Machine goes itself.
#[test]
fn a_kaironmachine_whose_vm_is_gone_without_a_machine_is_deleted() {
    let insts = instances("a:g. b:km");
    let plan = plan_pool(&PlanInput {
        desired: 2,
        max_surge: 1,
        instances: &insts,
        ..Default::default()
    });
    assert_eq!(plan.delete_kaironmachines, vec!["a".to_string()]);
    assert_eq!(plan.create, 1, "and another is made for it");
}

/// 0 → 20 → 5 with 15 Machines marked by CAPI: exactly those 15 go.
#[test]
fn a_pool_of_20_scaled_to_5_removes_exactly_the_15_marked() {
    let up = plan_pool(&PlanInput {
        desired: 20,
        max_surge: 1,
        ..Default::default()
    });
    assert_eq!(up.create, 20);
    let spec: String = (0..20)
        .map(|n| format!("vm{n:02}:km{} ", if n % 4 != 0 { "x" } else { "" }))
        .collect();
    let insts = instances(&spec);
    let down = plan_pool(&PlanInput {
        desired: 5,
        max_surge: 1,
        instances: &insts,
        ..Default::default()
    });
    assert_eq!(down.create, 0);
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
/// member available and none broken.
#[test]
fn broken_vms_wait_while_replacing_them_backs_off() {
    let insts = instances("a:bm b:km");
    let input = PlanInput {
        desired: 2,
        max_surge: 1,
        max_unavailable: 0,
        instances: &insts,
        ..Default::default()
    };
    let now = plan_pool(&input);
    assert_eq!(now.delete_machines, vec![("a".to_string(), Why::Broken)]);
    assert_eq!((now.broken_held, now.whole, now.create), (0, false, 1));
    let held = plan_pool(&PlanInput {
        hold_broken: true,
        ..input.clone()
    });
    assert!(held.delete_machines.is_empty(), "{held:?}");
    assert_eq!((held.broken_held, held.whole, held.create), (1, false, 0));
    let fine = instances("a:km b:km");
    let whole = plan_pool(&PlanInput {
        instances: &fine,
        ..input
    });
    assert!(whole.whole, "{whole:?}");
}
