//! The engine's part that plays Kairon's hosts: MachineMigrations (always) and, with
//! `--host-objects`, a Node per host whose cordon (`spec.unschedulable`) keeps new VMs and
//! migrations off it. Watches feed in-memory views; the pure decisions of [`crate::migration`]
//! run over the whole site after every change and at every tick; writes run as tasks, at most
//! one in flight per object (a Machine's go through the engine's own write path, so they never
//! race its phase machine).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use capkr::kairon::budget::MachineDisruptionBudget;
use capkr::kairon::maintenance::{MachineMigration, migration_phase};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::{Done, Engine, RETRY_AFTER_ERROR};
use crate::evacuate;
use crate::migration::{self, MachineChange, MigrationStep, after, is_under_way, next_migration_step};
use crate::sim::Key;
use crate::site_writes::{SiteWriter, Written};

/// What a finished site write reports.
pub(super) enum SiteDone {
    Migration {
        key: Key,
        result: Written<MachineMigration>,
    },
}

/// Kairon's view of its hosts and migrations.
pub(super) struct Site {
    pub host_objects: bool,
    pub migration_delay: Duration,
    pub writer: SiteWriter,
    pub(super) migrations: HashMap<Key, MachineMigration>,
    /// Kairon's cordon evacuation (`--cordon-evacuation`): its budgets (every namespace's, a
    /// watch's cache) and when it last looked.
    pub(super) cordon_evacuation: Option<Store<MachineDisruptionBudget>>,
    last_cordon_pass: Option<Instant>,
    migrations_listing: Option<HashSet<Key>>,
    migrations_synced: bool,
    /// Nodes with `spec.unschedulable` (cordoned), and those of a listing under way.
    pub(super) cordoned_nodes: HashSet<String>,
    nodes_listing: Option<HashSet<String>>,
    /// With `--host-objects`, once listed: the Nodes that exist and are `Ready` (kairon-node
    /// answers there), and those of a listing under way.
    pub(super) ready_nodes: Option<HashSet<String>>,
    ready_listing: Option<HashSet<String>>,
    pub(super) busy_migrations: HashSet<Key>,
    /// When the migrations this process started began, to the sub-second (`startTimestamp`
    /// is to the second; after a restart it is what there is).
    started: HashMap<Key, Timestamp>,
    retry_at: Option<Instant>,
    /// Something changed: decide again.
    pub dirty: bool,
}

impl Site {
    pub fn new(writer: SiteWriter, host_objects: bool, migration_delay: Duration) -> Self {
        Self {
            host_objects,
            migration_delay,
            writer,
            migrations: HashMap::new(),
            cordon_evacuation: None,
            last_cordon_pass: None,
            migrations_listing: None,
            migrations_synced: false,
            cordoned_nodes: HashSet::new(),
            nodes_listing: None,
            ready_nodes: None,
            ready_listing: None,
            busy_migrations: HashSet::new(),
            started: HashMap::new(),
            retry_at: None,
            dirty: true,
        }
    }

    /// Turns Kairon's cordon evacuation on: the budgets it applies are watched from now on.
    pub fn evacuate_cordoned(&mut self, client: kube::Client) {
        let (store, writer) = reflector::store::<MachineDisruptionBudget>();
        let stream = reflector(writer, watcher(Api::all(client), watcher::Config::default()))
            .default_backoff()
            .for_each(|_| std::future::ready(()));
        tokio::spawn(stream);
        self.cordon_evacuation = Some(store);
    }

    /// Nothing is decided before the first full lists, so a restart starts from the objects.
    pub fn synced(&self) -> bool {
        self.migrations_synced
    }

    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }
}

/// A Node's `Ready` condition is True.
fn is_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

pub(super) fn migration_key(m: &MachineMigration) -> Key {
    Key {
        namespace: m.namespace().unwrap_or_default(),
        name: m.name_any(),
    }
}

/// Whether `candidate` is an older version of `current` (a write's result that a watch event
/// overtook, or the reverse).
pub(super) fn is_older<K: Resource>(candidate: &K, current: &K) -> bool {
    let rv = |k: &K| k.meta().resource_version.as_deref().and_then(|v| v.parse::<u64>().ok());
    current.meta().uid == candidate.meta().uid && matches!((rv(candidate), rv(current)), (Some(a), Some(b)) if a < b)
}

/// A watch's events, boxed.
pub(super) type Events<K> = BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

impl Engine {
    /// The watches on MachineMigrations (as wide as the one on Machines) and, with
    /// `--host-objects`, on Nodes, once a Node exists per host (retried until it works).
    pub(super) async fn site_watches(&self) -> (Events<MachineMigration>, Events<Node>) {
        let migrations: Api<MachineMigration> = match &self.opts.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let migrations = watcher(migrations, watcher::Config::default())
            .default_backoff()
            .boxed();
        if !self.site.host_objects {
            return (migrations, futures::stream::pending().boxed());
        }
        let hosts = self.allocations.placement.hosts().to_vec();
        while let Err(e) = self.site.writer.ensure_nodes(&hosts).await {
            tracing::warn!(error = %e, "creating Nodes; retrying");
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let nodes = Api::<Node>::all(self.client.clone());
        (
            migrations,
            watcher(nodes, watcher::Config::default()).default_backoff().boxed(),
        )
    }

    /// A Node's `spec.unschedulable` (a cordon) keeps new VMs and migrations off its host; a
    /// Node that is not `Ready` (or gone) takes none either, and its Machines are unreachable
    /// (see [`crate::reachability`]).
    pub(super) fn on_node_event(&mut self, event: watcher::Event<Node>) {
        let cordoned = |n: &Node| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
        let site = &mut self.site;
        match event {
            watcher::Event::Init => {
                site.nodes_listing = Some(HashSet::new());
                site.ready_listing = Some(HashSet::new());
            }
            watcher::Event::InitApply(n) => {
                if cordoned(&n) {
                    site.nodes_listing.get_or_insert_with(HashSet::new).insert(n.name_any());
                }
                if is_ready(&n) {
                    site.ready_listing.get_or_insert_with(HashSet::new).insert(n.name_any());
                }
            }
            watcher::Event::InitDone => {
                site.cordoned_nodes = site.nodes_listing.take().unwrap_or_default();
                site.ready_nodes = Some(site.ready_listing.take().unwrap_or_default());
            }
            watcher::Event::Apply(n) => {
                if cordoned(&n) {
                    site.cordoned_nodes.insert(n.name_any());
                } else {
                    site.cordoned_nodes.remove(&n.name_any());
                }
                if let Some(ready) = site.ready_nodes.as_mut() {
                    if is_ready(&n) {
                        ready.insert(n.name_any());
                    } else {
                        ready.remove(&n.name_any());
                    }
                }
            }
            watcher::Event::Delete(n) => {
                site.cordoned_nodes.remove(&n.name_any());
                if let Some(ready) = site.ready_nodes.as_mut() {
                    ready.remove(&n.name_any());
                }
            }
        }
        self.site.dirty = true;
        // Every Machine's reachability is decided again.
        self.dirty.extend(self.machines.keys().cloned());
        self.refresh_cordoned();
    }

    pub(super) fn on_migration_event(&mut self, event: watcher::Event<MachineMigration>) {
        let site = &mut self.site;
        match event {
            watcher::Event::Init => site.migrations_listing = Some(HashSet::new()),
            watcher::Event::InitApply(m) => {
                if let Some(seen) = site.migrations_listing.as_mut() {
                    seen.insert(migration_key(&m));
                }
                self.store_migration(m);
            }
            watcher::Event::InitDone => {
                let seen = site.migrations_listing.take().unwrap_or_default();
                site.migrations.retain(|key, _| seen.contains(key));
                site.migrations_synced = true;
            }
            watcher::Event::Apply(m) => self.store_migration(m),
            watcher::Event::Delete(m) => {
                site.migrations.remove(&migration_key(&m));
            }
        }
        self.site.dirty = true;
    }

    fn store_migration(&mut self, m: MachineMigration) {
        let key = migration_key(&m);
        if let Some(current) = self.site.migrations.get(&key)
            && is_older(&m, current)
        {
            return;
        }
        self.site.migrations.insert(key, m);
    }

    pub(super) fn on_site_done(&mut self, done: SiteDone) {
        self.site.dirty = true;
        match done {
            SiteDone::Migration { key, result } => {
                self.site.busy_migrations.remove(&key);
                match result {
                    Written::Object(m) => self.store_migration(*m),
                    Written::Gone => {
                        self.site.migrations.remove(&key);
                    }
                    Written::Failed(e) => self.site_write_failed(&format!("MachineMigration {key}"), &e),
                }
            }
        }
    }

    fn site_write_failed(&mut self, what: &str, e: &kube::Error) {
        tracing::warn!(object = what, error = %e, "writing failed; will retry");
        self.site.retry_at = Some(Instant::now() + RETRY_AFTER_ERROR);
    }

    /// Hosts nothing new goes to: cordoned Nodes.
    fn refresh_cordoned(&mut self) {
        // As Kairon's scheduler (`internal/scheduler/scheduler.go`, `eligible`): neither a
        // cordoned nor a not-Ready node takes a new VM.
        let down = self
            .allocations
            .placement
            .hosts()
            .iter()
            .map(|h| h.name.clone())
            .filter(|h| self.site.ready_nodes.as_ref().is_some_and(|ready| !ready.contains(h)));
        let cordoned: BTreeSet<String> = self.site.cordoned_nodes.iter().cloned().chain(down).collect();
        self.allocations.placement.set_cordoned(cordoned);
    }

    /// The targets of migrations under way hold a slot on their node.
    fn refresh_reserved(&mut self) {
        let reserved: HashMap<Key, String> = self
            .site
            .migrations
            .values()
            .filter(|m| migration::is_started(m))
            .filter_map(|m| {
                let target = m.status.as_ref()?.target_node.clone()?;
                let vm = Key {
                    namespace: m.namespace().unwrap_or_default(),
                    name: m.spec.machine_name.clone(),
                };
                Some((vm, target))
            })
            .collect();
        self.allocations.placement.set_reserved(reserved);
    }

    // --- decisions ------------------------------------------------------------------------

    pub(super) fn process_site(&mut self) {
        if !self.synced || !self.site.synced() || !self.site.dirty {
            return;
        }
        if self.site.retry_at.is_some_and(|t| t > Instant::now()) {
            return;
        }
        self.site.retry_at = None;
        self.site.dirty = false;
        let now = Timestamp::now();
        self.refresh_cordoned();
        self.refresh_reserved();
        self.step_migrations(now);
        self.step_cordon_evacuation(now);
    }

    /// Kairon's cordon evacuation, at most once a second: every cordoned node is evacuated as
    /// `evacuate` does it (cold, every namespace's budgets), each Machine tried again at most
    /// every two minutes (the annotation [`evacuate::CORDON_ATTEMPT_ANNOTATION`]).
    fn step_cordon_evacuation(&mut self, now: Timestamp) {
        let Some(budgets) = self.site.cordon_evacuation.clone() else {
            return;
        };
        if self
            .site
            .last_cordon_pass
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.site.last_cordon_pass = Some(Instant::now());
        let mut nodes: Vec<String> = self.site.cordoned_nodes.iter().cloned().collect();
        nodes.sort();
        let machines: Vec<capkr::kairon::Machine> = self.machines.values().cloned().collect();
        let migrations: Vec<MachineMigration> = self.site.migrations.values().cloned().collect();
        let budgets: Vec<MachineDisruptionBudget> = budgets.state().iter().map(|b| (**b).clone()).collect();
        for node in nodes {
            let pass = match evacuate::plan_pass(&node, &machines, &migrations, &budgets) {
                Ok(pass) => pass,
                Err(why) => {
                    tracing::warn!(node = %node, why = %why, "cordon evacuation: pass stopped");
                    continue;
                }
            };
            for key in evacuate::cordon_candidates(&pass, &machines, now) {
                if self.busy.contains(&key) {
                    continue;
                }
                let Some(m) = self.machines.get(&key).cloned() else {
                    continue;
                };
                let mig = evacuate::cordon_migration(&node, &key, now);
                tracing::info!(machine = %key, node = %node, migration = %mig.name_any(), "cordon evacuation: migration made");
                let (site, writer) = (self.site.writer.clone(), self.writer.clone());
                let stamp =
                    json!({"metadata": {"annotations": {evacuate::CORDON_ATTEMPT_ANNOTATION: now.to_string()}}});
                self.spawn_write(&key, async move {
                    if let Err(e) = site.create_migration(&mig).await {
                        return crate::machines::WriteResult::Failed(e);
                    }
                    writer.patch_machine(&m, &stamp, None).await
                });
            }
        }
    }

    fn step_migrations(&mut self, now: Timestamp) {
        let mut keys: Vec<Key> = self
            .site
            .migrations
            .iter()
            .filter(|(k, m)| is_under_way(m) && !self.site.busy_migrations.contains(*k))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        for key in keys {
            let Some(mig) = self.site.migrations.get(&key).cloned() else {
                continue;
            };
            let vm_key = Key {
                namespace: key.namespace.clone(),
                name: mig.spec.machine_name.clone(),
            };
            let vm = self.machines.get(&vm_key);
            let other_started = self.site.migrations.iter().any(|(k, m)| {
                *k != key
                    && k.namespace == key.namespace
                    && m.spec.machine_name == mig.spec.machine_name
                    && migration::is_started(m)
            });
            let delay = self.site.migration_delay;
            let transfer_done = self.site.started.get(&key).is_none_or(|t| after(*t, delay) <= now);
            let step = next_migration_step(&mig, vm, &self.allocations.placement, other_started, transfer_done);
            let status = match step {
                MigrationStep::Wait => continue,
                MigrationStep::Queue => migration::queued_status(&mig),
                MigrationStep::Start {
                    strategy,
                    source,
                    target,
                } => {
                    tracing::info!(migration = %key, machine = %vm_key, strategy, from = %source, to = %target, "migration started");
                    // Held at once, so that the next migration decided now sees it.
                    self.allocations.placement.reserve(&vm_key, &target);
                    migration::started_status(&mig, strategy, &source, &target)
                }
                MigrationStep::Advance(phase) => {
                    if phase == migration_phase::RUNNING {
                        self.site.started.insert(key.clone(), now);
                    }
                    tracing::info!(migration = %key, machine = %vm_key, phase, "migration phase");
                    migration::phase_status(&mig, phase)
                }
                MigrationStep::Complete { runtime_id } => {
                    self.site.started.remove(&key);
                    tracing::info!(migration = %key, machine = %vm_key, "migration Succeeded");
                    migration::succeeded_status(&mig, runtime_id)
                }
                MigrationStep::End { phase, message } => {
                    self.site.started.remove(&key);
                    tracing::info!(migration = %key, machine = %vm_key, phase, message = %message, "migration ended");
                    migration::ended_status(&mig, phase, &message)
                }
                MigrationStep::Machine(change) => {
                    if let Some(m) = vm.filter(|_| !self.busy.contains(&vm_key)).cloned() {
                        tracing::info!(machine = %vm_key, migration = %key, change = ?change, "migration writes its Machine");
                        let patch = migration::machine_patch(&mig, &change);
                        let adopted = match &change {
                            MachineChange::Adopt { target } => Some(migration::adopted_status(&m, target, now)),
                            _ => None,
                        };
                        let writer = self.writer.clone();
                        self.spawn_write(&vm_key, async move {
                            writer.patch_machine(&m, &patch, adopted.as_ref()).await
                        });
                    }
                    continue;
                }
            };
            let writer = self.site.writer.clone();
            self.spawn_migration_write(key, async move { writer.migration_status(&mig, &status).await });
        }
    }

    pub(super) fn spawn_migration_write(
        &mut self,
        key: Key,
        write: impl Future<Output = Written<MachineMigration>> + Send + 'static,
    ) {
        self.site.busy_migrations.insert(key.clone());
        let (permits, done) = (self.permits.clone(), self.done_tx.clone());
        tokio::spawn(async move {
            let _permit = permits.acquire_owned().await;
            let result = write.await;
            let _ = done.send(Done::Site(SiteDone::Migration { key, result }));
        });
    }
}
