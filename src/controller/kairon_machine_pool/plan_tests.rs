//! Table tests of [`super::plan_pool`]. An instance is written `name:VKM`: its VM (`r`
//! running and current, `o` outdated, `b` failed or stopped, `d` being deleted, `-` none), its
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
    /// set spec.replicas, status.replicas
    set: (i32, Option<i32>),
    instances: &'static str,
    want_replicas: Option<i32>,
    want_create: &'static str,
    want_delete: Vec<(&'static str, Why)>,
}

#[test]
fn plan_pool_table() {
    use Why::*;
    let p = |d| (d, 1, 0, false);
    #[rustfmt::skip]
    let cases = vec![
        Case { name: "an empty pool wanting nothing does nothing", pool: p(0), set: (0, None), instances: "", want_replicas: None, want_create: "", want_delete: vec![] },
        Case { name: "0 -> 3: the set is raised", pool: p(3), set: (0, None), instances: "", want_replicas: Some(3), want_create: "", want_delete: vec![] },
        Case { name: "members get a KaironMachine each", pool: p(3), set: (3, None), instances: "a:r_. b:r_.", want_replicas: None, want_create: "a b", want_delete: vec![] },
        Case { name: "a member being deleted gets none", pool: p(3), set: (3, None), instances: "a:d_. b:r_.", want_replicas: None, want_create: "b", want_delete: vec![] },
        Case { name: "steady state: nothing", pool: p(3), set: (3, Some(3)), instances: "a:rkm b:rkm c:rkm", want_replicas: None, want_create: "", want_delete: vec![] },
        Case { name: "scale-in: oldest first", pool: p(1), set: (3, Some(3)), instances: "a:rkm b:rkm c:rkm", want_replicas: None, want_create: "", want_delete: vec![("a", ScaleIn), ("b", ScaleIn)] },
        Case { name: "scale-in: newest first by policy", pool: (1, 1, 0, true), set: (3, Some(3)), instances: "a:rkm b:rkm c:rkm", want_replicas: None, want_create: "", want_delete: vec![("c", ScaleIn), ("b", ScaleIn)] },
        Case { name: "scale-in: CAPI's mark first", pool: p(2), set: (3, Some(3)), instances: "a:rkm b:rkmx c:rkm", want_replicas: None, want_create: "", want_delete: vec![("b", ScaleIn)] },
        Case { name: "scale-in: the marked one before an unavailable one", pool: p(2), set: (3, None), instances: "a:rku b:rkm c:rkmx", want_replicas: None, want_create: "", want_delete: vec![("c", ScaleIn)] },
        Case { name: "scale-in: not available before older", pool: p(2), set: (3, None), instances: "a:rkm b:rkm c:rku", want_replicas: None, want_create: "", want_delete: vec![("c", ScaleIn)] },
        Case { name: "scale-in: outdated before current", pool: (2, 0, 1, false), set: (3, None), instances: "a:rkm b:okm c:rkm", want_replicas: None, want_create: "", want_delete: vec![("b", ScaleIn)] },
        Case { name: "scale-in waits while CAPI has yet to make a Machine", pool: p(1), set: (2, Some(2)), instances: "a:rkm b:rk.", want_replicas: None, want_create: "", want_delete: vec![] },
        Case { name: "scale-in counts Machines already draining as gone", pool: p(1), set: (3, Some(3)), instances: "a:rkmD b:rkm c:rkm", want_replicas: None, want_create: "", want_delete: vec![("b", ScaleIn)] },
        Case { name: "scale to 0", pool: p(0), set: (2, Some(2)), instances: "a:rkm b:rkm", want_replicas: None, want_create: "", want_delete: vec![("a", ScaleIn), ("b", ScaleIn)] },
        Case { name: "a failed VM's Machine goes", pool: p(2), set: (2, Some(2)), instances: "a:bkm b:rkm", want_replicas: None, want_create: "", want_delete: vec![("a", Broken)] },
        Case { name: "a failed VM without a Machine yet waits", pool: p(2), set: (2, Some(2)), instances: "a:bk. b:rkm", want_replicas: None, want_create: "", want_delete: vec![] },
        Case { name: "remediation asked: that Machine goes", pool: p(2), set: (2, Some(2)), instances: "a:rkmh b:rkm", want_replicas: None, want_create: "", want_delete: vec![("a", Remediation)] },
        Case { name: "remediation of a Machine already deleting: nothing more", pool: p(2), set: (2, Some(2)), instances: "a:rkmhD b:rkm", want_replicas: None, want_create: "", want_delete: vec![] },
        Case { name: "a VM its KaironMachine found gone: the Machine goes", pool: p(2), set: (2, Some(2)), instances: "a:-gm b:rkm", want_replicas: None, want_create: "", want_delete: vec![("a", Vanished)] },
        Case { name: "a Machine with neither VM nor KaironMachine goes", pool: p(1), set: (1, Some(1)), instances: "a:-_m b:rkm", want_replicas: None, want_create: "", want_delete: vec![("a", Vanished)] },
        Case { name: "a member whose KaironMachine went gets one again, its Machine stays", pool: p(1), set: (1, Some(1)), instances: "a:r_m", want_replicas: None, want_create: "a", want_delete: vec![] },
        Case { name: "a VM deleted (scale-in done) lowered the set: raised back", pool: p(3), set: (2, Some(2)), instances: "a:rkm b:rkm", want_replicas: Some(3), want_create: "", want_delete: vec![] },
        Case { name: "lowered while Kairon has not made them", pool: p(2), set: (5, Some(2)), instances: "a:rkm b:rkm", want_replicas: Some(2), want_create: "", want_delete: vec![] },
        Case { name: "never lowered below the members seen", pool: p(2), set: (5, None), instances: "a:rkm b:rkm c:rkm d:rkm", want_replicas: Some(4), want_create: "", want_delete: vec![("a", ScaleIn), ("b", ScaleIn)] },
        Case { name: "never lowered below the members Kairon counts", pool: p(2), set: (5, Some(5)), instances: "a:rkm b:rkm", want_replicas: None, want_create: "", want_delete: vec![] },
        Case { name: "a member deleted by Kairon is not live and not counted", pool: p(2), set: (2, Some(1)), instances: "a:dkm b:rkm", want_replicas: None, want_create: "", want_delete: vec![] },
        Case { name: "rollout 1/0: surge first", pool: p(3), set: (3, Some(3)), instances: "a:okm b:okm c:okm", want_replicas: Some(4), want_create: "", want_delete: vec![] },
        Case { name: "rollout 1/0: the surge member is up, the oldest outdated goes", pool: p(3), set: (4, Some(4)), instances: "a:okm b:okm c:okm d:rkm", want_replicas: None, want_create: "", want_delete: vec![("a", Rollout)] },
        Case { name: "rollout 1/0: the surge member is not available yet, nothing goes", pool: p(3), set: (4, Some(4)), instances: "a:okm b:okm c:okm d:rku", want_replicas: None, want_create: "", want_delete: vec![] },
        Case { name: "rollout 1/0: one draining, one being replaced", pool: p(3), set: (4, Some(4)), instances: "a:okmD b:okm c:okm d:rkm", want_replicas: None, want_create: "", want_delete: vec![] },
        Case { name: "rollout 0/1: one at a time without a surge", pool: (3, 0, 1, false), set: (3, Some(3)), instances: "a:okm b:okm c:okm", want_replicas: None, want_create: "", want_delete: vec![("a", Rollout)] },
        Case { name: "rollout 2/0: two surge members", pool: (3, 2, 0, false), set: (3, Some(3)), instances: "a:okm b:okm c:okm", want_replicas: Some(5), want_create: "", want_delete: vec![] },
        Case { name: "rollout done: the surge is given back as the last outdated VM goes", pool: p(3), set: (4, Some(4)), instances: "a:rkm b:rkm c:rkm d:okmD", want_replicas: None, want_create: "", want_delete: vec![] },
        Case { name: "scale-in and rollout together", pool: p(1), set: (3, Some(3)), instances: "a:okm b:okm c:okm", want_replicas: None, want_create: "", want_delete: vec![("a", ScaleIn), ("b", Rollout)] },
        Case { name: "a broken VM is replaced, not rolled; the surge starts the rollout", pool: p(2), set: (2, Some(2)), instances: "a:bkm b:okm", want_replicas: Some(3), want_create: "", want_delete: vec![("a", Broken)] },
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
            set_status_replicas: c.set.1,
            instances: &insts,
            replicas_managed_externally: false,
        });
        assert_eq!(got.set_replicas, c.want_replicas, "{}: replicas", c.name);
        let created: Vec<&str> = got.create_kaironmachines.iter().map(String::as_str).collect();
        assert_eq!(
            created,
            c.want_create.split_whitespace().collect::<Vec<_>>(),
            "{}: creates",
            c.name
        );
        let deleted: Vec<(&str, Why)> = got.delete_machines.iter().map(|(n, w)| (n.as_str(), *w)).collect();
        assert_eq!(deleted, c.want_delete, "{}: deletes", c.name);
    }
}

/// 0 → 20 → 5 with 15 Machines marked by CAPI: exactly those 15 go, and the set is never
/// lowered under its members (Kairon picks no victim of its own).
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
        set_status_replicas: Some(20),
        instances: &insts,
        ..Default::default()
    });
    assert_eq!(down.set_replicas, None, "Kairon lowers it as each VM goes");
    let mut gone: Vec<&str> = down.delete_machines.iter().map(|(n, _)| n.as_str()).collect();
    gone.sort_unstable();
    let marked: Vec<String> = (0..20).filter(|n| n % 4 != 0).map(|n| format!("vm{n:02}")).collect();
    assert_eq!(gone, marked.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(down.delete_machines.iter().all(|(_, w)| *w == Why::ScaleIn));
}

/// name, (maxSurge, maxUnavailable), the set's replicas, instances, Machines deleted.
type AutoscaledCase = (&'static str, (i32, i32), i32, &'static str, Vec<(&'static str, Why)>);

/// An autoscaler owns the set's size (`cluster.x-k8s.io/replicas-managed-by`): the pool's
/// desired count is the set's `spec.replicas`; it never writes it, picks no Machine to scale in
/// (Kairon picks, for the autoscaler), rolls without a surge, and still replaces a failed VM.
#[test]
fn an_autoscaled_pool_never_writes_the_size_nor_scales_in() {
    use Why::*;
    #[rustfmt::skip]
    let cases: Vec<AutoscaledCase> = vec![
        ("raised by the autoscaler: Kairon makes the members", (1, 0), 5, "a:rkm b:rkm", vec![]),
        ("lowered by the autoscaler: Kairon picks, the pool does not", (1, 0), 2, "a:rkm b:rkm c:rkm", vec![]),
        ("a failed VM is still replaced", (1, 0), 2, "a:bkm b:rkm", vec![("a", Broken)]),
        ("a rollout has no surge: with maxUnavailable 0 nothing goes", (1, 0), 2, "a:okm b:okm", vec![]),
        ("a rollout by maxUnavailable", (1, 1), 2, "a:okm b:okm", vec![("a", Rollout)]),
    ];
    for (name, (max_surge, max_unavailable), set_replicas, spec, want) in cases {
        let insts = instances(spec);
        let got = plan_pool(&PlanInput {
            desired: set_replicas,
            max_surge,
            max_unavailable,
            set_replicas,
            set_status_replicas: Some(set_replicas),
            instances: &insts,
            replicas_managed_externally: true,
            ..Default::default()
        });
        assert_eq!(got.set_replicas, None, "{name}: the size is never written");
        let deleted: Vec<(&str, Why)> = got.delete_machines.iter().map(|(n, w)| (n.as_str(), *w)).collect();
        assert_eq!(deleted, want, "{name}: deletes");
    }
}

#[test]
fn the_autoscaler_annotation_counts_unless_it_is_false() {
    let with = |v: &str| Some([(REPLICAS_MANAGED_BY_ANNOTATION.to_string(), v.to_string())].into());
    assert!(replicas_managed_externally(with("").as_ref()));
    assert!(replicas_managed_externally(with("external-autoscaler").as_ref()));
    assert!(!replicas_managed_externally(with("false").as_ref()));
    assert!(!replicas_managed_externally(None));
}
