//! `kairon-sim evacuate NODE`: what an operator's `kaironctl evacuate NODE` does to Kairon's
//! objects, against the same API server. Each pass makes one MachineMigration per Machine bound
//! to the node (`spec.nodeName`, not being deleted, whatever its phase), `cold` unless told
//! `auto` (`live` is refused, as Kairon refuses it), named `evacuate-<node>-<machine>-<stamp>`,
//! without a target or labels; a Machine with a migration not finished (one not yet looked at
//! included) is skipped, and so is one a MachineDisruptionBudget holds (every namespace's
//! budgets, as `evacuate` applies them; each Machine let through spends one disruption for the
//! rest of the pass). It never cordons the node. With `--wait` the pass is repeated every
//! `--interval` until no Machine is bound to the node, or fails after `--timeout`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use capkr::kairon::Machine;
use capkr::kairon::budget::MachineDisruptionBudget;
use capkr::kairon::maintenance::{MachineMigration, MachineMigrationSpec, migration_phase, migration_strategy};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::disruption;
use crate::migration::{bound_node, migration_phase_of};
use crate::sim::Key;

#[derive(clap::Args, Debug, Clone)]
pub struct EvacuateArgs {
    /// The node (host) to empty.
    pub node: String,
    /// `cold` or `auto` (taken as cold); `live` is refused.
    #[arg(long, default_value = "cold")]
    pub strategy: String,
    /// Repeat the pass until the node is empty.
    #[arg(long)]
    pub wait: bool,
    /// Time between passes with `--wait`.
    #[arg(long, default_value = "10s", value_parser = crate::flags::parse_duration)]
    pub interval: Duration,
    /// Give up waiting after this long.
    #[arg(long, default_value = "15m", value_parser = crate::flags::parse_duration)]
    pub timeout: Duration,
}

/// What one pass decides.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Machines bound to the node.
    pub on_node: usize,
    /// Machines to migrate now.
    pub migrate: Vec<Key>,
    /// Machines skipped, and why.
    pub skipped: Vec<(Key, String)>,
}

/// One pass over every Machine and migration (all namespaces) and every budget.
pub fn plan_pass(
    node: &str,
    machines: &[Machine],
    migrations: &[MachineMigration],
    budgets: &[MachineDisruptionBudget],
) -> Result<Pass, String> {
    let mut on_node: Vec<&Machine> = machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none() && bound_node(m) == Some(node))
        .collect();
    on_node.sort_by_key(|m| Key::of(m));
    let migration_of = |m: &MachineMigration| Key {
        namespace: m.namespace().unwrap_or_default(),
        name: m.spec.machine_name.clone(),
    };
    // `evacuate` skips a Machine with any migration not final, one without a phase included;
    // the budgets count as disrupted only those a controller has started.
    let unfinished: BTreeSet<Key> = migrations
        .iter()
        .filter(|m| !migration_phase::is_final(migration_phase_of(m)))
        .map(migration_of)
        .collect();
    let moving = disruption::moving(migrations);
    let all: Vec<&Machine> = machines.iter().collect();
    let budgets: Vec<&MachineDisruptionBudget> = budgets.iter().collect();
    let mut allowances = disruption::allowances(&budgets, &all, &moving)?;
    let mut pass = Pass {
        on_node: on_node.len(),
        ..Pass::default()
    };
    for m in on_node {
        let key = Key::of(m);
        if unfinished.contains(&key) {
            pass.skipped
                .push((key, "a migration of it is not finished".to_string()));
            continue;
        }
        match disruption::admit(&mut allowances, m) {
            Ok(()) => pass.migrate.push(key),
            Err(why) => pass.skipped.push((key, why)),
        }
    }
    Ok(pass)
}

/// The migration `evacuate` makes for `machine`.
pub fn evacuation_migration(node: &str, machine: &Key, strategy: &str, now: Timestamp) -> MachineMigration {
    named_migration("evacuate", node, machine, strategy, now)
}

/// On a Machine: when cordon evacuation last made a migration of it (RFC 3339).
pub const CORDON_ATTEMPT_ANNOTATION: &str = "kairon.zyvor.dev/cordon-evacuate-attempted-at";
/// Cordon evacuation tries a Machine again at most this often.
pub const CORDON_RETRY: Duration = Duration::from_secs(120);

/// What cordon evacuation (`--cordon-evacuation`) does in one pass over a cordoned node: the
/// Machines [`plan_pass`] lets through, but none it tried less than [`CORDON_RETRY`] ago.
pub fn cordon_candidates(pass: &Pass, machines: &[Machine], now: Timestamp) -> Vec<Key> {
    let recent = |key: &Key| {
        machines
            .iter()
            .find(|m| Key::of(m) == *key)
            .and_then(|m| m.annotations().get(CORDON_ATTEMPT_ANNOTATION).cloned())
            .and_then(|t| t.parse::<Timestamp>().ok())
            .is_some_and(|t| crate::migration::after(t, CORDON_RETRY) > now)
    };
    pass.migrate.iter().filter(|k| !recent(k)).cloned().collect()
}

/// The migration cordon evacuation makes for `machine`.
pub fn cordon_migration(node: &str, machine: &Key, now: Timestamp) -> MachineMigration {
    named_migration("cordon-evacuate", node, machine, migration_strategy::COLD, now)
}

fn named_migration(prefix: &str, node: &str, machine: &Key, strategy: &str, now: Timestamp) -> MachineMigration {
    let stamp = now.strftime("%Y%m%d%H%M%S");
    let mut mig = MachineMigration::new(
        &format!("{prefix}-{node}-{}-{stamp}", machine.name),
        MachineMigrationSpec {
            machine_name: machine.name.clone(),
            strategy: Some(strategy.to_string()),
            target_node: None,
        },
    );
    mig.metadata.namespace = Some(machine.namespace.clone());
    mig
}

pub async fn run(client: Client, args: EvacuateArgs) -> anyhow::Result<()> {
    let strategy = match args.strategy.as_str() {
        migration_strategy::COLD | migration_strategy::AUTO => args.strategy.clone(),
        migration_strategy::LIVE => anyhow::bail!("evacuate does not migrate live: use --strategy cold or auto"),
        other => anyhow::bail!("unknown strategy {other:?}: cold or auto"),
    };
    let started = Instant::now();
    loop {
        let machines = Api::<Machine>::all(client.clone())
            .list(&ListParams::default())
            .await
            .context("listing Machines")?
            .items;
        let migrations = Api::<MachineMigration>::all(client.clone())
            .list(&ListParams::default())
            .await
            .context("listing MachineMigrations")?
            .items;
        let budgets = match Api::<MachineDisruptionBudget>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
            Err(e) => return Err(e).context("listing MachineDisruptionBudgets"),
        };
        let pass = plan_pass(&args.node, &machines, &migrations, &budgets).map_err(anyhow::Error::msg)?;
        if pass.on_node == 0 {
            println!("node {} is empty", args.node);
            return Ok(());
        }
        for key in &pass.migrate {
            let mig = evacuation_migration(&args.node, key, &strategy, Timestamp::now());
            Api::<MachineMigration>::namespaced(client.clone(), &key.namespace)
                .create(&PostParams::default(), &mig)
                .await
                .with_context(|| format!("creating a MachineMigration for {key}"))?;
            println!("machine {key}: migration {} created ({strategy})", mig.name_any());
        }
        for (key, why) in &pass.skipped {
            println!("machine {key}: skipped: {why}");
        }
        if !args.wait {
            return Ok(());
        }
        if started.elapsed() >= args.timeout {
            anyhow::bail!(
                "node {} still has {} machine(s) after {:?}",
                args.node,
                pass.on_node,
                args.timeout
            );
        }
        tokio::time::sleep(args.interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capkr::kairon::MachineStatus;
    use capkr::kairon::budget::MachineDisruptionBudgetSpec;
    use capkr::kairon::maintenance::MachineMigrationStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn vm(name: &str, node: &str, phase: &str, role: &str) -> Machine {
        Machine {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                labels: Some([("role".to_string(), role.to_string())].into()),
                ..Default::default()
            },
            spec: capkr::kairon::MachineSpec {
                node_name: Some(node.into()),
                ..Default::default()
            },
            status: Some(MachineStatus {
                phase: Some(phase.into()),
                node_name: Some(node.into()),
                ..Default::default()
            }),
        }
    }

    fn mig(machine: &str, phase: Option<&str>) -> MachineMigration {
        let mut m = evacuation_migration("h1", &key(machine), "cold", Timestamp::UNIX_EPOCH);
        m.status = phase.map(|p| MachineMigrationStatus {
            phase: Some(p.into()),
            ..Default::default()
        });
        m
    }

    fn budget(role: &str, max_unavailable: &str) -> MachineDisruptionBudget {
        let mut b = MachineDisruptionBudget::new(
            role,
            MachineDisruptionBudgetSpec {
                selector: [("role".to_string(), role.to_string())].into(),
                max_unavailable: Some(max_unavailable.into()),
                min_available: None,
            },
        );
        b.metadata.namespace = Some("other-namespace".into());
        b
    }

    fn key(name: &str) -> Key {
        Key {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_pass_migrates_what_its_budgets_allow_and_skips_what_moves_already() {
        let machines = vec![
            vm("cp-1", "h1", "Running", "cp"),
            vm("cp-2", "h1", "Running", "cp"),
            vm("cp-3", "h2", "Running", "cp"),
            vm("w-1", "h1", "Running", "w"),
            vm("w-2", "h1", "Running", "w"),
            vm("w-3", "h2", "Running", "w"),
        ];
        let budgets = [budget("cp", "1"), budget("w", "1")];
        let pass = plan_pass("h1", &machines, &[], &budgets).unwrap();
        assert_eq!(pass.on_node, 4);
        assert_eq!(pass.migrate, vec![key("cp-1"), key("w-1")]);
        let skipped: Vec<&str> = pass.skipped.iter().map(|(k, _)| k.name.as_str()).collect();
        assert_eq!(skipped, ["cp-2", "w-2"]);
        assert!(
            pass.skipped[0]
                .1
                .contains("other-namespace/cp has 0 disruptions allowed")
        );

        // cp-1 moving (started) spends the control-plane budget; a migration with no phase
        // yet does not count for the budgets but is skipped all the same.
        let migrations = [mig("cp-1", Some("Stopping")), mig("w-2", None)];
        let pass = plan_pass("h1", &machines, &migrations, &budgets).unwrap();
        assert_eq!(pass.migrate, vec![key("w-1")]);
        let skipped: Vec<&str> = pass.skipped.iter().map(|(k, _)| k.name.as_str()).collect();
        assert_eq!(skipped, ["cp-1", "cp-2", "w-2"]);

        // Finished migrations count for nothing.
        let migrations = [mig("cp-1", Some("Succeeded")), mig("w-2", Some("Blocked"))];
        let pass = plan_pass("h1", &machines, &migrations, &[]).unwrap();
        assert_eq!(pass.migrate.len(), 4, "no budget: everything goes");
    }

    #[test]
    fn an_empty_node_and_machines_being_deleted() {
        let mut gone = vm("a", "h1", "Running", "w");
        gone.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let pass = plan_pass("h1", &[gone, vm("b", "h2", "Running", "w")], &[], &[]).unwrap();
        assert_eq!(pass, Pass::default());
    }

    #[test]
    fn a_budget_kairon_cannot_read_stops_the_pass() {
        let mut b = budget("w", "1");
        b.spec.max_unavailable = None;
        assert!(plan_pass("h1", &[vm("a", "h1", "Running", "w")], &[], &[b]).is_err());
    }

    #[test]
    fn cordon_evacuation_tries_a_machine_again_only_after_a_while() {
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        let mut tried = vm("a", "h1", "Running", "w");
        tried
            .annotations_mut()
            .insert(CORDON_ATTEMPT_ANNOTATION.into(), "2026-01-01T00:00:00Z".into());
        let machines = vec![tried, vm("b", "h1", "Running", "w")];
        let pass = plan_pass("h1", &machines, &[], &[]).unwrap();
        assert_eq!(
            cordon_candidates(&pass, &machines, t("2026-01-01T00:01:00Z")),
            vec![key("b")],
            "a tried a minute ago"
        );
        assert_eq!(
            cordon_candidates(&pass, &machines, t("2026-01-01T00:02:00Z")),
            vec![key("a"), key("b")]
        );
        let m = cordon_migration("h1", &key("a"), t("2026-01-01T00:02:00Z"));
        assert_eq!(m.name_any(), "cordon-evacuate-h1-a-20260101000200");
        assert_eq!(m.spec.strategy.as_deref(), Some("cold"));
    }

    #[test]
    fn the_migration_is_named_as_kaironctl_names_it() {
        let m = evacuation_migration("h1", &key("vm"), "cold", "2026-12-05T06:07:08Z".parse().unwrap());
        assert_eq!(m.name_any(), "evacuate-h1-vm-20261205060708");
        assert_eq!(m.namespace().as_deref(), Some("ns"));
        assert_eq!(m.spec.strategy.as_deref(), Some("cold"));
        assert_eq!(m.spec.target_node, None);
        assert!(m.metadata.labels.is_none());
    }
}
