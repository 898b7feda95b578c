//! Kairon's MachineDisruptionBudgets as Kairon applies them before it migrates a Machine
//! (`kaironctl evacuate`, an evacuating cordon), as pure functions: every budget, of any
//! namespace, whose selector matches the Machine (Kairon's match: a missing label reads as
//! `""`, an empty selector matches nothing) counts the Machines it matches and, among them, the
//! healthy ones (`Running` and not the subject of a migration under way); a Machine is held
//! back when one of its budgets has no disruption left, and each one let through spends one
//! from every budget it matches, for the rest of the pass. A budget whose bounds cannot be
//! read stops the whole pass, as in Kairon.

use std::collections::BTreeSet;

use capkr::kairon::Machine;
use capkr::kairon::budget::{MachineDisruptionBudget, desired_healthy, selects};
use capkr::kairon::maintenance::{MachineMigration, migration_phase};
use kube::ResourceExt;

use crate::migration::migration_phase_of;
use crate::sim::{Key, phase_of};

/// The Machines a migration is moving: one a controller has started (it has a phase) and not
/// finished. The budgets count these as disrupted.
pub fn moving(migrations: &[MachineMigration]) -> BTreeSet<Key> {
    migrations
        .iter()
        .filter(|m| migration_phase_of(m).is_some() && !migration_phase::is_final(migration_phase_of(m)))
        .map(|m| Key {
            namespace: m.namespace().unwrap_or_default(),
            name: m.spec.machine_name.clone(),
        })
        .collect()
}

/// The admission webhook's decision on a new migration of `machine`: the budgets, Machines and
/// migrations given are those of the Machine's namespace only (the webhook reads no other).
/// `Err`: the refusal, in Kairon's words.
pub fn admit_migration(
    budgets: &[MachineDisruptionBudget],
    machines: &[Machine],
    migrations: &[MachineMigration],
    machine: &Machine,
) -> Result<(), String> {
    let budgets: Vec<&MachineDisruptionBudget> = budgets.iter().collect();
    let machines: Vec<&Machine> = machines.iter().collect();
    let mut allowances = allowances(&budgets, &machines, &moving(migrations))?;
    admit(&mut allowances, machine)
}

/// One budget's allowance for one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Allowance {
    name: String,
    budget: MachineDisruptionBudget,
    allowed: i64,
}

/// The allowances of `budgets` over `machines` (all of them, every namespace); `moving`: the
/// Machines with a migration under way. `Err`: a budget Kairon cannot read (the message).
pub fn allowances(
    budgets: &[&MachineDisruptionBudget],
    machines: &[&Machine],
    moving: &BTreeSet<Key>,
) -> Result<Vec<Allowance>, String> {
    budgets
        .iter()
        .map(|b| {
            let name = format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any());
            let matching: Vec<&&Machine> = machines
                .iter()
                .filter(|m| selects(&b.spec.selector, m.metadata.labels.as_ref()))
                .collect();
            let healthy = matching
                .iter()
                .filter(|m| phase_of(m) == Some("Running") && !moving.contains(&Key::of(m)))
                .count();
            let total = i32::try_from(matching.len()).unwrap_or(i32::MAX);
            let desired = desired_healthy(&b.spec, total).ok_or_else(|| {
                format!("MachineDisruptionBudget {name}: exactly one of minAvailable or maxUnavailable, an integer or a percentage, must be set")
            })?;
            let healthy = i64::try_from(healthy).unwrap_or(i64::MAX);
            Ok(Allowance {
                name,
                budget: (*b).clone(),
                allowed: (healthy - i64::from(desired)).max(0),
            })
        })
        .collect()
}

/// Whether `machine` may be disrupted now; if so, it spends one disruption of every budget
/// that matches it. `Err`: why not, in Kairon's words.
pub fn admit(allowances: &mut [Allowance], machine: &Machine) -> Result<(), String> {
    let labels = machine.metadata.labels.as_ref();
    let matching: Vec<usize> = allowances
        .iter()
        .enumerate()
        .filter(|(_, a)| selects(&a.budget.spec.selector, labels))
        .map(|(i, _)| i)
        .collect();
    if let Some(&i) = matching.iter().find(|&&i| allowances[i].allowed <= 0) {
        return Err(format!(
            "MachineDisruptionBudget {} has 0 disruptions allowed",
            allowances[i].name
        ));
    }
    for i in matching {
        allowances[i].allowed -= 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use capkr::kairon::MachineStatus;
    use capkr::kairon::budget::MachineDisruptionBudgetSpec;
    use std::collections::BTreeMap;

    fn vm(name: &str, labels: &[(&str, &str)], phase: &str) -> Machine {
        let mut m = Machine::new(name, Default::default());
        m.metadata.namespace = Some("ns".into());
        m.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        m.status = Some(MachineStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        m
    }

    fn budget(name: &str, selector: &[(&str, &str)], max_unavailable: &str) -> MachineDisruptionBudget {
        let mut b = MachineDisruptionBudget::new(
            name,
            MachineDisruptionBudgetSpec {
                selector: selector
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
                min_available: None,
                max_unavailable: Some(max_unavailable.into()),
            },
        );
        b.metadata.namespace = Some("other".into());
        b
    }

    #[test]
    fn one_disruption_at_a_time_and_none_while_one_is_down() {
        let (a, b, c) = (
            vm("a", &[("md", "x")], "Running"),
            vm("b", &[("md", "x")], "Running"),
            vm("c", &[("md", "x")], "Paused"),
        );
        let one = budget("one", &[("md", "x")], "1");
        // Another namespace's budget applies all the same.
        let mut all = allowances(&[&one], &[&a, &b], &BTreeSet::new()).unwrap();
        assert_eq!(admit(&mut all, &a), Ok(()));
        let held = admit(&mut all, &b).unwrap_err();
        assert_eq!(held, "MachineDisruptionBudget other/one has 0 disruptions allowed");

        let mut down = allowances(&[&one], &[&a, &b, &c], &BTreeSet::new()).unwrap();
        assert!(admit(&mut down, &a).is_err(), "c is not Running: nothing left");
        let moving = BTreeSet::from([Key::of(&b)]);
        let mut migrating = allowances(&[&one], &[&a, &b], &moving).unwrap();
        assert!(admit(&mut migrating, &a).is_err(), "b is being migrated: nothing left");
    }

    #[test]
    fn a_machine_no_budget_selects_is_never_held_and_a_bad_budget_stops_the_pass() {
        let a = vm("a", &[("md", "x")], "Running");
        let other = budget("other", &[("md", "y")], "0");
        let mut all = allowances(&[&other], &[&a], &BTreeSet::new()).unwrap();
        assert_eq!(admit(&mut all, &a), Ok(()));
        let bad = budget("bad", &[("md", "x")], "lots");
        assert!(allowances(&[&bad], &[&a], &BTreeSet::new()).is_err());
    }

    #[test]
    fn an_empty_value_selects_machines_without_the_key() {
        let (cp, worker) = (
            vm("cp", &[("c", "1"), ("cp", "")], "Running"),
            vm("w", &[("c", "1")], "Running"),
        );
        let b = budget("cp", &[("c", "1"), ("cp", "")], "1");
        let mut all = allowances(&[&b], &[&cp, &worker], &BTreeSet::new()).unwrap();
        assert_eq!(admit(&mut all, &cp), Ok(()));
        assert!(
            admit(&mut all, &worker).is_err(),
            "the worker counts as the budget's too"
        );
    }

    #[test]
    fn the_webhook_counts_a_started_migration_as_a_disruption() {
        use capkr::kairon::maintenance::{MachineMigrationSpec, MachineMigrationStatus};
        let (a, b) = (vm("a", &[("md", "x")], "Running"), vm("b", &[("md", "x")], "Running"));
        let one = budget("one", &[("md", "x")], "1");
        let mig = |phase: Option<&str>| {
            let mut m = MachineMigration::new(
                "move-b",
                MachineMigrationSpec {
                    machine_name: "b".into(),
                    ..Default::default()
                },
            );
            m.metadata.namespace = Some("ns".into());
            m.status = phase.map(|p| MachineMigrationStatus {
                phase: Some(p.into()),
                ..Default::default()
            });
            m
        };
        let (vms, budgets) = ([a.clone(), b.clone()], [one]);
        assert_eq!(admit_migration(&budgets, &vms, &[], &a), Ok(()));
        assert_eq!(
            admit_migration(&budgets, &vms, &[mig(None)], &a),
            Ok(()),
            "not started yet"
        );
        assert!(admit_migration(&budgets, &vms, &[mig(Some("Running"))], &a).is_err());
        assert_eq!(
            admit_migration(&budgets, &vms, &[mig(Some("Succeeded"))], &a),
            Ok(()),
            "finished"
        );
    }
}
