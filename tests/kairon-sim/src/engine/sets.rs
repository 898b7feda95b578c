//! The engine's part that plays Kairon's MachineSets: a watch (as wide as the one on
//! Machines) feeds an in-memory view; the pure policy of [`crate::machineset`] decides one step
//! per set over the set and its members; the step's writes run as a task, one per set in
//! flight. A set whose created members the Machine watch has not shown yet is not decided
//! again (it would create them twice).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use capkr::kairon::Machine;
use capkr::kairon::machineset::MachineSet;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};

use super::site::{Events, is_older};
use super::{Done, Engine, RETRY_AFTER_ERROR};
use crate::machineset::{SetStep, is_member, plan};
use crate::machineset_writes::{SetOutcome, SetWriter};
use crate::sim::Key;
use crate::site_writes::Written;

/// What a finished set step reports.
pub(super) struct SetDone {
    key: Key,
    outcome: SetOutcome,
}

/// Kairon's view of its MachineSets.
pub(super) struct Sets {
    writer: SetWriter,
    sets: HashMap<Key, MachineSet>,
    listing: Option<HashSet<Key>>,
    synced: bool,
    busy: HashSet<Key>,
    /// Members created per set that the Machine watch has not shown yet.
    awaited: HashMap<Key, Vec<Key>>,
    retry_at: Option<Instant>,
    /// Something changed: decide again.
    pub dirty: bool,
}

impl Sets {
    pub fn new(writer: SetWriter) -> Self {
        Self {
            writer,
            sets: HashMap::new(),
            listing: None,
            synced: false,
            busy: HashSet::new(),
            awaited: HashMap::new(),
            retry_at: None,
            dirty: true,
        }
    }

    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// After a re-list of Machines what was awaited is known or gone.
    pub fn relisted(&mut self) {
        self.awaited.clear();
        self.dirty = true;
    }
}

fn set_key(s: &MachineSet) -> Key {
    Key {
        namespace: s.namespace().unwrap_or_default(),
        name: s.name_any(),
    }
}

impl Engine {
    pub(super) fn set_watch(&self) -> Events<MachineSet> {
        let sets: Api<MachineSet> = match &self.opts.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        watcher(sets, watcher::Config::default()).default_backoff().boxed()
    }

    pub(super) fn on_set_event(&mut self, event: watcher::Event<MachineSet>) {
        let sets = &mut self.sets;
        match event {
            watcher::Event::Init => sets.listing = Some(HashSet::new()),
            watcher::Event::InitApply(s) => {
                if let Some(seen) = sets.listing.as_mut() {
                    seen.insert(set_key(&s));
                }
                self.store_set(s);
            }
            watcher::Event::InitDone => {
                let seen = sets.listing.take().unwrap_or_default();
                sets.sets.retain(|key, _| seen.contains(key));
                sets.synced = true;
            }
            watcher::Event::Apply(s) => self.store_set(s),
            watcher::Event::Delete(s) => {
                let key = set_key(&s);
                sets.sets.remove(&key);
                sets.awaited.remove(&key);
            }
        }
        self.sets.dirty = true;
    }

    fn store_set(&mut self, s: MachineSet) {
        let key = set_key(&s);
        if let Some(current) = self.sets.sets.get(&key)
            && is_older(&s, current)
        {
            return;
        }
        self.sets.sets.insert(key, s);
    }

    pub(super) fn on_set_done(&mut self, done: SetDone) {
        let SetDone { key, outcome } = done;
        self.sets.busy.remove(&key);
        self.sets.dirty = true;
        let mut failed = outcome.error;
        match outcome.set {
            Some(Written::Object(s)) if self.sets.sets.contains_key(&key) => self.store_set(*s),
            Some(Written::Gone) => {
                self.sets.sets.remove(&key);
            }
            Some(Written::Failed(e)) => failed = Some(e),
            _ => {}
        }
        if !outcome.created.is_empty() {
            let created = outcome.created.iter().map(Key::of);
            self.sets.awaited.entry(key.clone()).or_default().extend(created);
        }
        for m in outcome.removed {
            self.store_if_known(m);
        }
        if let Some(e) = failed {
            tracing::warn!(machineset = %key, error = %e, "writing failed; will retry");
            self.sets.retry_at = Some(Instant::now() + RETRY_AFTER_ERROR);
        }
    }

    // --- decisions ------------------------------------------------------------------------

    pub(super) fn process_sets(&mut self) {
        if !self.synced || !self.sets.synced || !self.sets.dirty {
            return;
        }
        if self.sets.retry_at.is_some_and(|t| t > Instant::now()) {
            return;
        }
        self.sets.retry_at = None;
        self.sets.dirty = false;
        let machines = &self.machines;
        self.sets
            .awaited
            .retain(|_, created| !created.iter().all(|k| machines.contains_key(k)));
        let mut keys: Vec<Key> = self
            .sets
            .sets
            .keys()
            .filter(|k| !self.sets.busy.contains(*k) && !self.sets.awaited.contains_key(*k))
            .cloned()
            .collect();
        keys.sort();
        for key in keys {
            let Some(set) = self.sets.sets.get(&key).cloned() else {
                continue;
            };
            let members: Vec<Machine> = self.machines.values().filter(|m| is_member(&set, m)).cloned().collect();
            let step = plan(&set, &members.iter().collect::<Vec<_>>());
            match &step {
                SetStep::Wait => continue,
                SetStep::Status(_) | SetStep::AddFinalizer => {}
                step => tracing::info!(machineset = %key, ?step, "MachineSet"),
            }
            self.sets.busy.insert(key.clone());
            let (writer, permits, tx) = (self.sets.writer.clone(), self.permits.clone(), self.done_tx.clone());
            tokio::spawn(async move {
                let _permit = permits.acquire_owned().await;
                let outcome = writer.apply(&set, &members, step).await;
                let _ = tx.send(Done::Set(SetDone { key, outcome }));
            });
        }
    }
}
