//! Host maintenance, the engine's side: for each Host object (with `--host-objects`), the
//! pure plan of [`crate::evacuation`] over the VMs on the host and Kairon's migrations for
//! it, carried out: VM status writes through the engine's write path, migrations created and
//! deleted, the Host's status written when it changes.

use std::collections::BTreeSet;

use capkr::kairon::Machine;
use capkr::kairon::budget::MachineDisruptionBudget;
use capkr::kairon::maintenance::{EVACUATION_LABEL, Host, HostStatus, MachineMigration, host_phase};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::site::{SiteDone, migration_key};
use super::{Done, Engine};
use crate::disruption;
use crate::evacuation::{self, VmAction, evacuation_migration, plan_host};
use crate::migration::{self, is_under_way, parse_time};
use crate::sim::Key;

impl Engine {
    pub(super) fn step_hosts(&mut self, now: Timestamp) {
        let moving: BTreeSet<Key> = self
            .site
            .migrations
            .values()
            .filter(|m| is_under_way(m))
            .map(|m| Key {
                namespace: m.namespace().unwrap_or_default(),
                name: m.spec.machine_name.clone(),
            })
            .collect();
        // Kairon's budgets, over every Machine, once for this pass over the hosts.
        let budgets = self.site.budgets.as_ref().map(|s| s.state()).unwrap_or_default();
        let budget_refs: Vec<&MachineDisruptionBudget> = budgets.iter().map(AsRef::as_ref).collect();
        let all: Vec<&Machine> = self.machines.values().collect();
        let mut allowances = disruption::allowances(&budget_refs, &all, &moving);
        let mut admit = |vm: &Machine| match &mut allowances {
            Ok(a) => disruption::admit(a, vm),
            Err(why) => Err(why.clone()),
        };
        let mut names: Vec<String> = self.site.hosts.keys().cloned().collect();
        names.sort();
        for name in names {
            let Some(host) = self.site.hosts.get(&name) else {
                continue;
            };
            let vms: Vec<&Machine> = self
                .allocations
                .placement
                .machines_on(&name)
                .into_iter()
                .filter_map(|k| self.machines.get(k))
                .collect();
            let ours: Vec<&MachineMigration> = self
                .site
                .migrations
                .values()
                .filter(|m| m.labels().get(EVACUATION_LABEL) == Some(&name))
                .collect();
            let plan = plan_host(host, &vms, &ours, &moving, now, &mut admit);
            let host = host.clone();
            self.carry_out(&name, host, plan, now);
        }
    }

    fn carry_out(&mut self, name: &str, host: Host, plan: evacuation::HostPlan, now: Timestamp) {
        for (key, action) in plan.vm_actions {
            let Some(m) = self.machines.get(&key).filter(|_| !self.busy.contains(&key)).cloned() else {
                continue;
            };
            let status = match action {
                VmAction::RequestEvacuation(e) => {
                    tracing::info!(machine = %key, host = name, deadline = e.deadline.as_deref().unwrap_or("-"), "evacuation requested");
                    evacuation::evacuation_status(&m, Some(e))
                }
                VmAction::ClearEvacuation => {
                    tracing::info!(machine = %key, host = name, "maintenance cancelled: evacuation request withdrawn");
                    evacuation::evacuation_status(&m, None)
                }
                VmAction::Stop { reason, message } => {
                    tracing::info!(machine = %key, host = name, reason = %reason, "Running -> Stopped");
                    evacuation::stopped_status(&m, &reason, &message, now)
                }
            };
            let writer = self.writer.clone();
            self.spawn_write(&key, async move { writer.write_status(&m, &status).await });
        }
        if let Some(vm) = plan.migrate {
            let mig = evacuation_migration(&vm, name);
            let key = migration_key(&mig);
            let writer = self.site.writer.clone();
            match self.site.migrations.get(&key) {
                _ if self.site.busy_migrations.contains(&key) => {}
                None => {
                    tracing::info!(machine = %vm, host = name, migration = %key, "evacuating: migration created");
                    self.spawn_migration_write(key, async move { writer.create_migration(&mig).await });
                }
                // The name is taken by the record of an earlier evacuation (of another host).
                Some(old) if migration::is_finished(old) => {
                    tracing::info!(migration = %key, "deleting the record of an earlier evacuation");
                    let target = key.clone();
                    self.spawn_migration_write(key, async move { writer.delete_migration(&target).await });
                }
                Some(_) => {}
            }
        }
        for key in plan.delete_migrations {
            if !self.site.busy_migrations.contains(&key) {
                tracing::info!(migration = %key, host = name, "deleting Kairon's migration");
                let writer = self.site.writer.clone();
                let target = key.clone();
                self.spawn_migration_write(key, async move { writer.delete_migration(&target).await });
            }
        }
        if host.status.as_ref() != Some(&plan.status) && !self.site.busy_hosts.contains(name) {
            log_emptied(&host, &plan.status);
            let writer = self.site.writer.clone();
            let status = plan.status;
            self.site.busy_hosts.insert(name.to_string());
            let done = self.done_tx.clone();
            let (permits, name) = (self.permits.clone(), name.to_string());
            tokio::spawn(async move {
                let _permit = permits.acquire_owned().await;
                let result = writer.host_status(&host, &status).await;
                let _ = done.send(Done::Site(SiteDone::Host { name, result }));
            });
        }
    }
}

/// One info line when a host in maintenance becomes empty: how long it took.
fn log_emptied(host: &Host, next: &HostStatus) {
    let was = host.status.as_ref().and_then(|s| s.phase.as_deref());
    if next.phase.as_deref() != Some(host_phase::IN_MAINTENANCE) || was == Some(host_phase::IN_MAINTENANCE) {
        return;
    }
    let started = next.maintenance_started_at.as_deref().and_then(parse_time);
    let emptied = next.emptied_at.as_deref().and_then(parse_time);
    if let (Some(started), Some(emptied)) = (started, emptied) {
        let seconds = emptied.duration_since(started).as_secs();
        tracing::info!(host = %host.name_any(), seconds, "host empty: InMaintenance ({seconds}s after maintenance was requested)");
    }
}
