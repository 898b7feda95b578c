//! The engine's part that plays Kairon's MachineSets: a watch (as wide as the one on
//! Machines) feeds an in-memory view; the pure policy of [`crate::machineset`] plays one
//! Kairon tick per set over the set and the Machines; the tick's writes run as a task, one per
//! set in flight. Sets are decided on every change and at every engine tick (at least every
//! [`super::TICK`]), so a set is looked at again periodically, as Kairon's reconcile loop
//! does every 5 s, only more often. A set is not decided again before the Machine watch has
//! shown the members it just created and no longer shows the ones it just deleted (it would
//! count them wrong: create twice, or delete more than allowed).

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
    /// Per set, what the Machine watch has yet to show of its last writes.
    awaited: HashMap<Key, Vec<Awaited>>,
    retry_at: Option<Instant>,
    /// Something changed: decide again.
    pub dirty: bool,
    /// When kairon-controller's next tick acts on the sets: never sooner, whatever changed
    /// (Kairon lists everything each tick; it does not watch).
    pub next_tick: Instant,
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
            next_tick: Instant::now(),
        }
    }

    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// Machine `key` was deleted (the watch said so): if it was a member a set created, it was
    /// shown, even if it went before the set's next tick could see it.
    pub fn member_deleted(&mut self, key: &Key) {
        for awaited in self.awaited.values_mut() {
            awaited.retain(|a| !matches!(a, Awaited::Created(k) if k == key));
        }
    }

    /// After a re-list of Machines what was awaited is known or gone.
    pub fn relisted(&mut self) {
        self.awaited.clear();
        self.dirty = true;
    }
}

/// A write the Machine watch has yet to show.
enum Awaited {
    /// A member created.
    Created(Key),
    /// A member deleted and gone at once (its uid).
    Gone(Key, Option<String>),
}

impl Awaited {
    fn shown(&self, machines: &HashMap<Key, Machine>) -> bool {
        match self {
            Self::Created(key) => machines.contains_key(key),
            Self::Gone(key, uid) => machines
                .get(key)
                .is_none_or(|m| m.metadata.uid != *uid || m.metadata.deletion_timestamp.is_some()),
        }
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
        let created = outcome.created.iter().map(|m| Awaited::Created(Key::of(m)));
        let gone = outcome
            .vanished
            .iter()
            .map(|m| Awaited::Gone(Key::of(m), m.metadata.uid.clone()));
        let awaited: Vec<Awaited> = created.chain(gone).collect();
        if !awaited.is_empty() {
            self.sets.awaited.entry(key.clone()).or_default().extend(awaited);
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
        if self.sets.retry_at.is_some_and(|t| t > Instant::now()) || self.sets.next_tick > Instant::now() {
            return;
        }
        self.sets.next_tick = Instant::now() + self.opts.machineset_interval;
        self.sets.retry_at = None;
        self.sets.dirty = false;
        let machines = &self.machines;
        self.sets
            .awaited
            .retain(|_, awaited| !awaited.iter().all(|a| a.shown(machines)));
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
            let plan = plan(&set, &members.iter().collect::<Vec<_>>());
            if plan.is_idle(&set) {
                continue;
            }
            if plan.step != SetStep::Wait {
                tracing::info!(machineset = %key, step = ?plan.step, "MachineSet");
            }
            if let Some(message) = plan.status.as_ref().and_then(|s| s.message.as_deref()) {
                tracing::warn!(machineset = %key, %message, "MachineSet cannot be reconciled");
            }
            self.sets.busy.insert(key.clone());
            let (writer, permits, tx) = (self.sets.writer.clone(), self.permits.clone(), self.done_tx.clone());
            tokio::spawn(async move {
                let _permit = permits.acquire_owned().await;
                let outcome = writer.apply(&set, &members, plan).await;
                let _ = tx.send(Done::Set(SetDone { key, outcome }));
            });
        }
    }
}
