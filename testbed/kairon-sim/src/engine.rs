//! The event loop: a watch on Kairon Machines feeds an in-memory view; the pure phase machine
//! ([`crate::sim`]) and kubelet ([`crate::kubelet`]) decide; writes run as tasks (bounded in
//! number) and report back. One loop owns all state, so there are no locks and no sleeps per
//! machine: timers are deadlines checked by a periodic tick.
//!
//! At most one Machine write and one guest operation are in flight per Machine. Host and
//! address bookkeeping follows the Machines' statuses, and nothing is decided before the
//! first full lists, so a restart picks up where the objects say. Nodes and
//! migrations: [`site`]; a guest's address and whether its join gets
//! through its network: [`joins`].

mod joins;
mod site;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capkr::kairon::Machine;
use capkr::kairon::machine_image::MachineImage;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Semaphore, mpsc};

use crate::fleet::Fleet;
use crate::guest_ops::{post_status, register, remove_node, stop};
use crate::hosts::Allocations;
use crate::kubelet::{Guest, GuestOutcome, KubeletStep, next_kubelet_step};
use crate::machines::{MachineWriter, WriteResult};
use crate::placement::{FORBIDDEN, node_selector, preferred_anti_affinity, required_anti_affinity};
use crate::scripts::GuestScripts;
use crate::sim::{self, BootOutcome, Clock, Delays, Key, Step};
use crate::site_writes::SiteWriter;
use crate::workload::Workloads;
use crate::{images, reachability};
use site::{Site, SiteDone, is_older};

/// Timers are checked at their deadlines, and at least this often.
const TICK: Duration = Duration::from_millis(200);
/// Writes in flight at once, to the management and the workload API servers together.
const MAX_IN_FLIGHT: usize = 64;
/// Back-off after a failed write.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);

pub struct Options {
    pub namespace: Option<String>,
    pub delays: Delays,
    pub failure_rate: f64,
    pub full_update: bool,
    pub boot_guest: bool,
    /// Run control-plane VMs' processes (see [`crate::fleet`]).
    pub guest_tools: Option<crate::fleet::GuestTools>,
    /// Run the guests' runcmd, sandboxed, under this dir (see [`crate::scripts`]).
    pub guest_scripts_dir: Option<std::path::PathBuf>,
    /// A live migration's Running -> Succeeded.
    pub migration_delay: Duration,
    /// Create a Node per host on Kairon's API server and honour its cordon.
    pub host_objects: bool,
    /// Kairon's cordon evacuation: cold migrations off cordoned nodes, under the budgets.
    pub cordon_evacuation: bool,
    /// Resolve `imageRef`s against MachineImages, as kairon-controller (see [`crate::images`]).
    pub machine_images: bool,
}

struct Timer {
    uid: String,
    clock: Clock,
    at: Instant,
}

/// What a finished task reports.
enum Done {
    Machine {
        key: Key,
        result: WriteResult,
    },
    Guest {
        key: Key,
        uid: String,
        outcome: GuestOutcome,
    },
    Site(SiteDone),
}

pub struct Engine {
    client: Client,
    opts: Options,
    writer: MachineWriter,
    workloads: Arc<Workloads>,
    fleet: Option<Arc<Fleet>>,
    scripts: Option<Arc<GuestScripts>>,
    site: Site,
    permits: Arc<Semaphore>,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,

    machines: HashMap<Key, Machine>,
    allocations: Allocations,
    timers: HashMap<Key, Timer>,
    retry_at: HashMap<Key, Instant>,
    busy: HashSet<Key>,
    guests: HashMap<Key, Guest>,
    guests_busy: HashSet<Key>,
    /// Each guest's seed: `spec.cloudInit` as it was when Kairon created the runtime (FluxVM
    /// builds the seed then, and the guest boots from it whatever the Machine holds later).
    /// Taken again when a runtime is made anew (placed, or started after Stopped: a fresh
    /// disk); kept across Paused, Halted and a live move. A simulator that restarted reads the
    /// Machine's spec instead.
    seeds: HashMap<Key, Option<capkr::kairon::CloudInit>>,
    /// What each Machine's user-data says of its kubeadm role, by uid (read once).
    roles: joins::Roles,
    dirty: BTreeSet<Key>,
    /// Keys seen in the current (re)list; `None` outside a list.
    listing: Option<HashSet<Key>>,
    synced: bool,
    /// With `--machine-images`, once listed: the MachineImages by name (cluster-scoped).
    images: Option<HashMap<String, MachineImage>>,
    images_listing: Option<HashMap<String, MachineImage>>,
}

impl Engine {
    /// Kairon Machines on `client`'s API server; workload cluster kubeconfigs on `management`'s.
    pub fn new(client: Client, management: Client, opts: Options, allocations: Allocations) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            writer: MachineWriter::new(client.clone(), opts.full_update),
            workloads: Arc::new(Workloads::new(management)),
            fleet: opts.guest_tools.clone().map(|t| Arc::new(Fleet::new(t))),
            scripts: opts.guest_scripts_dir.clone().map(|d| Arc::new(GuestScripts::new(d))),
            site: Site::new(SiteWriter::new(client.clone()), opts.host_objects, opts.migration_delay),
            client,
            opts,
            permits: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            done_tx,
            done_rx,
            machines: HashMap::new(),
            allocations,
            timers: HashMap::new(),
            retry_at: HashMap::new(),
            busy: HashSet::new(),
            guests: HashMap::new(),
            guests_busy: HashSet::new(),
            seeds: HashMap::new(),
            roles: HashMap::new(),
            dirty: BTreeSet::new(),
            listing: None,
            synced: false,
            images: None,
            images_listing: None,
        }
    }

    pub async fn run(mut self) {
        if self.opts.cordon_evacuation {
            self.site.evacuate_cordoned(self.client.clone());
        }
        let api: Api<Machine> = match &self.opts.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
        let (mut migration_events, mut node_events) = self.site_watches().await;
        let mut image_events = match self.opts.machine_images {
            true => watcher(
                Api::<MachineImage>::all(self.client.clone()),
                watcher::Config::default(),
            )
            .default_backoff()
            .boxed(),
            false => futures::stream::pending().boxed(),
        };
        let mut wake = Instant::now() + TICK;
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(event)) => self.on_event(event),
                    Some(Err(e)) => tracing::warn!(error = %e, "watching Kairon Machines"),
                    None => return,
                },
                Some(event) = migration_events.next() => match event {
                    Ok(event) => self.on_migration_event(event),
                    Err(e) => tracing::warn!(error = %e, "watching Kairon MachineMigrations"),
                },
                Some(event) = node_events.next() => match event {
                    Ok(event) => self.on_node_event(event),
                    Err(e) => tracing::warn!(error = %e, "watching Kairon's Nodes"),
                },
                Some(event) = image_events.next() => match event {
                    Ok(event) => self.on_image_event(event),
                    Err(e) => tracing::warn!(error = %e, "watching Kairon MachineImages"),
                },
                Some(done) = self.done_rx.recv() => self.on_done(done),
                () = tokio::time::sleep_until(wake.into()) => self.on_tick(),
            }
            self.process_dirty();
            self.process_site();
            wake = self.next_wake();
        }
    }

    // --- inputs ---------------------------------------------------------------------------

    fn on_event(&mut self, event: watcher::Event<Machine>) {
        match event {
            watcher::Event::Init => self.listing = Some(HashSet::new()),
            watcher::Event::InitApply(m) => {
                if let Some(seen) = self.listing.as_mut() {
                    seen.insert(Key::of(&m));
                }
                self.store(m);
            }
            watcher::Event::InitDone => {
                let seen = self.listing.take().unwrap_or_default();
                let vanished: Vec<Key> = self.machines.keys().filter(|k| !seen.contains(*k)).cloned().collect();
                for key in vanished {
                    self.forget(&key);
                }
                if !self.synced {
                    self.synced = true;
                    tracing::info!(
                        machines = self.machines.len(),
                        addresses_in_use = self.allocations.pool.in_use(),
                        "initial list done; simulating"
                    );
                    self.dirty.extend(self.machines.keys().cloned());
                }
            }
            watcher::Event::Apply(m) => self.store(m),
            watcher::Event::Delete(m) => self.forget(&Key::of(&m)),
        }
        self.site.dirty = true;
    }

    /// MachineImages by name; every Machine is looked at again on a change.
    fn on_image_event(&mut self, event: watcher::Event<MachineImage>) {
        match event {
            watcher::Event::Init => self.images_listing = Some(HashMap::new()),
            watcher::Event::InitApply(i) => {
                self.images_listing
                    .get_or_insert_with(HashMap::new)
                    .insert(i.name_any(), i);
            }
            watcher::Event::InitDone => self.images = Some(self.images_listing.take().unwrap_or_default()),
            watcher::Event::Apply(i) => {
                self.images.get_or_insert_with(HashMap::new).insert(i.name_any(), i);
            }
            watcher::Event::Delete(i) => {
                if let Some(images) = self.images.as_mut() {
                    images.remove(&i.name_any());
                }
            }
        }
        self.dirty.extend(self.machines.keys().cloned());
    }

    /// Keeps the newest version of a Machine and, unless a write of ours is in flight, brings
    /// the host and address books in line with it.
    fn store(&mut self, m: Machine) {
        let key = Key::of(&m);
        if let Some(current) = self.machines.get(&key)
            && current.metadata.uid == m.metadata.uid
            && is_older(&m, current)
        {
            return;
        }
        self.machines.insert(key.clone(), m);
        if !self.busy.contains(&key) {
            self.observe(&key);
        }
        self.dirty.insert(key);
    }

    fn observe(&mut self, key: &Key) {
        let Some(m) = self.machines.get(key) else {
            self.allocations.release(key);
            return;
        };
        if let Some(other) = self.allocations.observe(key, m) {
            tracing::warn!(machine = %key, other = %other, "two Machines report the same address");
        }
    }

    fn forget(&mut self, key: &Key) {
        let Some(m) = self.machines.remove(key) else { return };
        self.allocations.release(key);
        if let Some(uid) = m.uid() {
            self.roles.remove(&uid);
        }
        self.timers.remove(key);
        self.retry_at.remove(key);
        self.seeds.remove(key);
        tracing::info!(machine = %key, "Machine deleted");
        // A Node left behind (our finalizer was bypassed) goes with the VM.
        if let Some(guest) = self.guests.remove(key)
            && guest.node.is_some()
        {
            let (workloads, fleet, scripts, permits) = (
                self.workloads.clone(),
                self.fleet.clone(),
                self.scripts.clone(),
                self.permits.clone(),
            );
            tokio::spawn(async move {
                let _permit = permits.acquire_owned().await;
                remove_node(workloads, fleet, scripts, m, guest.node).await;
            });
        } else if let (Some(scripts), Some(uid)) = (self.scripts.clone(), m.uid()) {
            tokio::spawn(async move { scripts.stop(&uid).await });
        }
    }

    fn on_done(&mut self, done: Done) {
        match done {
            Done::Machine { key, result } => {
                self.busy.remove(&key);
                match result {
                    WriteResult::Written(m) => self.store_if_known(*m),
                    WriteResult::Conflict(fresh) => {
                        tracing::debug!(machine = %key, "write conflict; deciding again");
                        if let Some(m) = fresh {
                            self.store_if_known(*m);
                        }
                    }
                    WriteResult::Gone => {}
                    WriteResult::Failed(e) => {
                        tracing::warn!(machine = %key, error = %e, "writing Machine failed; will retry");
                        self.retry_at.insert(key.clone(), Instant::now() + RETRY_AFTER_ERROR);
                    }
                }
                self.observe(&key);
                self.dirty.insert(key);
                self.site.dirty = true;
            }
            Done::Guest { key, uid, outcome } => {
                self.guests_busy.remove(&key);
                if let Some(guest) = self.guests.get_mut(&key).filter(|g| g.uid == uid) {
                    guest.apply(outcome);
                }
                self.dirty.insert(key);
            }
            Done::Site(done) => self.on_site_done(done),
        }
    }

    /// A write's result, unless the Machine was deleted (or replaced by a namesake)
    /// meanwhile: it must not come back.
    fn store_if_known(&mut self, m: Machine) {
        if self
            .machines
            .get(&Key::of(&m))
            .is_some_and(|c| c.metadata.uid == m.metadata.uid)
        {
            self.store(m);
        }
    }

    /// The earliest deadline to come (timer, retry), but at least every [`TICK`].
    /// Deadlines already past belong to Machines that were just processed or have an
    /// operation in flight, whose completion makes them due again.
    fn next_wake(&self) -> Instant {
        let now = Instant::now();
        let timers = self.timers.values().map(|t| t.at);
        let retries = self.retry_at.values().copied();
        let guests = self.guests.values().filter_map(|g| g.retry_at);
        timers
            .chain(retries)
            .chain(guests)
            .chain(self.site.retry_at())
            .filter(|t| *t > now)
            .fold(now + TICK, Instant::min)
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        let due_timers = self.timers.iter().filter(|(_, t)| t.at <= now).map(|(k, _)| k);
        let due_retries = self.retry_at.iter().filter(|(_, t)| **t <= now).map(|(k, _)| k);
        let due_guests = self
            .guests
            .iter()
            .filter(|(_, g)| g.retry_at.is_some_and(|t| t <= now))
            .map(|(k, _)| k);
        let due: Vec<Key> = due_timers.chain(due_retries).chain(due_guests).cloned().collect();
        self.dirty.extend(due);
        // Migration delays and evacuation deadlines are wall-clock times in the objects.
        self.site.dirty = true;
    }

    // --- decisions ------------------------------------------------------------------------

    fn process_dirty(&mut self) {
        if !self.synced || !self.site.synced() {
            return;
        }
        let now = Instant::now();
        for key in std::mem::take(&mut self.dirty) {
            let Some(m) = self.machines.get(&key).cloned() else {
                continue;
            };
            if self.retry_at.get(&key).is_some_and(|t| *t > now) {
                continue;
            }
            self.retry_at.remove(&key);
            if self.opts.machine_images && images::needs_resolution(&m) {
                // As kairon-controller: an unresolved imageRef keeps the Machine out of
                // scheduling; nothing is decided before the MachineImages are listed.
                let Some(found) = self.images.as_ref() else { continue };
                if self.busy.contains(&key) {
                    continue;
                }
                let writer = self.writer.clone();
                match images::resolve(&m, found) {
                    Some(images::Resolution::Wait(why)) => {
                        if let Some(status) = images::waiting_status(&m, &why) {
                            tracing::info!(machine = %key, why, "waiting for its MachineImage");
                            self.spawn_write(&key, async move { writer.write_status(&m, &status).await });
                        }
                        continue;
                    }
                    Some(images::Resolution::Pin(patch)) => {
                        tracing::info!(machine = %key, "MachineImage resolved: source and digest pinned");
                        self.spawn_write(&key, async move { writer.patch_machine(&m, &patch, None).await });
                        continue;
                    }
                    None => {}
                }
            }
            if let Some(ready) = self.site.ready_nodes.as_ref() {
                // kairon-controller keeps NodeUnreachable; kairon-node on a dead node does
                // nothing (the VM's guest is left as it was: a partition, as far as it knows).
                if let Some(status) = reachability::reachability_status(&m, ready, Timestamp::now()) {
                    if !self.busy.contains(&key) {
                        let node = m.spec.node_name.clone().unwrap_or_default();
                        tracing::info!(machine = %key, node, "NodeUnreachable changes");
                        let writer = self.writer.clone();
                        let m = m.clone();
                        self.spawn_write(&key, async move { writer.write_status(&m, &status).await });
                    }
                    continue;
                }
                if reachability::on_a_dead_node(&m, ready) {
                    self.timers.remove(&key);
                    continue;
                }
            }
            if !self.busy.contains(&key) {
                let due = self.timer_due(&key, &m, now);
                self.act(&key, m.clone(), sim::next_step(&m, due));
            }
            if self.opts.boot_guest && !self.guests_busy.contains(&key) {
                self.act_kubelet(&key, m, now);
            }
        }
    }

    /// Starts the timer of the Machine's current phase if it is not running yet; whether it
    /// has run out.
    fn timer_due(&mut self, key: &Key, m: &Machine, now: Instant) -> bool {
        let Some(clock) = sim::clock_of(m) else {
            self.timers.remove(key);
            return false;
        };
        let uid = m.uid().unwrap_or_default();
        let delays = self.opts.delays;
        let timer = self.timers.entry(key.clone()).or_insert_with(|| Timer {
            uid: uid.clone(),
            clock,
            at: now + delays.jittered(clock, fastrand::f64()),
        });
        if timer.uid != uid || timer.clock != clock {
            *timer = Timer {
                uid,
                clock,
                at: now + delays.jittered(clock, fastrand::f64()),
            };
        }
        timer.at <= now
    }

    fn act(&mut self, key: &Key, m: Machine, step: Step) {
        let now = Timestamp::now();
        let writer = self.writer.clone();
        let from = sim::phase_of(&m).unwrap_or("-").to_string();
        match step {
            Step::Wait => {}
            Step::AddFinalizer => {
                tracing::debug!(machine = %key, "adding finalizer");
                self.spawn_write(key, async move { writer.add_finalizer(&m).await });
            }
            Step::Accept => {
                tracing::info!(machine = %key, "accepted: Pending");
                let status = sim::accepted_status(&m);
                self.spawn_write(key, async move { writer.write_status(&m, &status).await });
            }
            Step::Place => {
                let machines = &self.machines;
                let placement = &self.allocations.placement;
                let labels_of = |k: &Key| machines.get(k).map(|m| m.labels());
                let mut avoid = placement.anti_affinity(key, preferred_anti_affinity(&m.spec), labels_of);
                for host in placement
                    .anti_affinity(key, &required_anti_affinity(&m.spec), labels_of)
                    .into_keys()
                {
                    avoid.insert(host, FORBIDDEN);
                }
                let status = match placement.choose(node_selector(&m.spec), &avoid) {
                    Ok(host) => {
                        tracing::info!(machine = %key, host = %host, "{from} -> Starting");
                        self.allocations.placement.assign(key, &host);
                        let status = sim::starting_status(&m, &host, sim::new_runtime_id());
                        self.take_seed(key, &m);
                        // As kairon-controller: bound to the node (`spec.nodeName` and its
                        // label), then started there by the node's agent.
                        let bind = sim::binding(&host);
                        self.spawn_write(key, async move { writer.patch_machine(&m, &bind, Some(&status)).await });
                        return;
                    }
                    Err(unschedulable) => {
                        tracing::info!(machine = %key, why = %unschedulable.0, "{from}: not scheduled (Unschedulable), tried again later");
                        // Tried again after another placement delay, as kairon-controller
                        // requeues a Machine it could not place.
                        let again = Instant::now() + self.opts.delays.jittered(sim::Clock::Provision, fastrand::f64());
                        if let Some(timer) = self.timers.get_mut(key) {
                            timer.at = again;
                        }
                        sim::unschedulable_status(&m, &unschedulable.0, now)
                    }
                };
                self.spawn_write(key, async move { writer.write_status(&m, &status).await });
            }
            Step::Boot => {
                let outcome = sim::boot_outcome(&m, self.opts.failure_rate, fastrand::f64());
                let status = match outcome {
                    BootOutcome::Running => match self.allocations.pool.allocate(key) {
                        Some(ip) => {
                            tracing::info!(machine = %key, address = %ip, "{from} -> Running");
                            sim::running_status(&m, &ip.to_string(), now)
                        }
                        None => {
                            tracing::warn!(machine = %key, "address pool exhausted: {from} -> Error, retried");
                            sim::error_status(&m, "no free address in the pool", now)
                        }
                    },
                    BootOutcome::Error(error) => {
                        tracing::info!(machine = %key, "{from} -> Error, retried");
                        sim::error_status(&m, &error, now)
                    }
                };
                if status.phase.as_deref() == Some(capkr::kairon::phase::ERROR) {
                    // Tried again after another boot delay (Starting and Error share the
                    // clock, so its timer is re-armed here).
                    let again = Instant::now() + self.opts.delays.jittered(sim::Clock::Boot, fastrand::f64());
                    if let Some(timer) = self.timers.get_mut(key) {
                        timer.at = again;
                    }
                }
                self.spawn_write(key, async move { writer.write_status(&m, &status).await });
            }
            Step::Fail => {
                tracing::info!(machine = %key, "{from} -> Unknown: the runtime failed");
                let status = sim::runtime_failed_status(&m, now);
                self.spawn_write(key, async move { writer.write_status(&m, &status).await });
            }
            Step::PowerOff(wanted) => {
                tracing::info!(machine = %key, "{from} -> {wanted} (spec.powerState)");
                let status = sim::powered_off_status(&m, wanted, now);
                self.spawn_write(key, async move { writer.write_status(&m, &status).await });
            }
            Step::PowerOn => {
                let mut status = sim::powered_on_status(&m, now);
                if sim::creates_runtime(&Step::PowerOn, &m) {
                    // Stopped deleted the runtime and its disk: a new one, seeded from the
                    // Machine's cloudInit as it is now.
                    self.take_seed(key, &m);
                }
                // A Stopped VM bound to another node meanwhile (a cold migration) starts there.
                if let Some(node) = m.spec.node_name.as_deref().filter(|n| !n.is_empty())
                    && status.phase.as_deref() == Some(capkr::kairon::phase::STARTING)
                    && status.node_name.as_deref() != Some(node)
                {
                    tracing::info!(machine = %key, node, "starting on the node it is bound to now");
                    self.allocations.placement.assign(key, node);
                    status.node_name = Some(node.to_string());
                }
                tracing::info!(
                    machine = %key,
                    "{from} -> {} (spec.powerState Running)",
                    status.phase.as_deref().unwrap_or_default()
                );
                self.spawn_write(key, async move { writer.write_status(&m, &status).await });
            }
            Step::ReleaseFinalizer => {
                // Taken: the Node goes here, not again when the Machine is forgotten.
                let node = self.guests.get_mut(key).and_then(|g| g.node.take());
                let boot_guest = self.opts.boot_guest;
                let (workloads, fleet, scripts) = (self.workloads.clone(), self.fleet.clone(), self.scripts.clone());
                tracing::info!(machine = %key, "VM gone: removing finalizer");
                self.spawn_write(key, async move {
                    if boot_guest {
                        remove_node(workloads, fleet, scripts, m.clone(), node).await;
                    }
                    writer.remove_finalizer(&m).await
                });
            }
        }
    }

    /// Kairon creates `m`'s runtime: its guest's seed is `m`'s cloudInit now.
    fn take_seed(&mut self, key: &Key, m: &Machine) {
        self.seeds.insert(key.clone(), m.spec.cloud_init.clone());
        if let Some(uid) = m.uid() {
            self.roles.remove(&uid);
        }
    }

    /// `m` as its guest sees it: with the seed its runtime was created from.
    fn seeded(&self, key: &Key, m: &Machine) -> Machine {
        let mut m = m.clone();
        if let Some(seed) = self.seeds.get(key) {
            m.spec.cloud_init = seed.clone();
        }
        m
    }

    fn act_kubelet(&mut self, key: &Key, m: Machine, now: Instant) {
        let m = self.seeded(key, &m);
        let uid = m.uid().unwrap_or_default();
        let guest = self
            .guests
            .entry(key.clone())
            .or_insert_with(|| Guest::new(uid.clone()));
        if guest.uid != uid {
            *guest = Guest::new(uid.clone());
        }
        let step = next_kubelet_step(&m, guest, now);
        let node = guest.node.clone();
        let (workloads, fleet, scripts) = (self.workloads.clone(), self.fleet.clone(), self.scripts.clone());
        match step {
            KubeletStep::Idle => {}
            KubeletStep::PowerOn | KubeletStep::Register => {
                // kubeadm (on a first boot) and kubelet go through the guest's network: no
                // Node while what they must reach is out of its reach.
                let address = self.guest_address(key);
                if !self.join_gets_through(key, &m, address) {
                    return;
                }
                if step == KubeletStep::PowerOn {
                    tracing::info!(machine = %key, "the VM runs again: its kubelet starts");
                    self.guests.insert(key.clone(), Guest::new(uid.clone()));
                }
                let ready = sim::node_should_be_ready(&m);
                self.spawn_guest(key.clone(), uid, register(workloads, fleet, scripts, m, address, ready));
            }
            KubeletStep::SetReady(ready) => {
                let since = Timestamp::now();
                tracing::info!(machine = %key, ready, "Node Ready changes");
                self.spawn_guest(key.clone(), uid, post_status(workloads, m, node, ready, since));
            }
            KubeletStep::Stop => {
                self.spawn_guest(key.clone(), uid, stop(workloads, fleet, scripts, m, node));
            }
        }
    }

    fn spawn_write(&mut self, key: &Key, write: impl Future<Output = WriteResult> + Send + 'static) {
        self.busy.insert(key.clone());
        let (permits, tx, key) = (self.permits.clone(), self.done_tx.clone(), key.clone());
        tokio::spawn(async move {
            let _permit = permits.acquire_owned().await;
            let result = write.await;
            let _ = tx.send(Done::Machine { key, result });
        });
    }

    fn spawn_guest(&mut self, key: Key, uid: String, op: impl Future<Output = GuestOutcome> + Send + 'static) {
        self.guests_busy.insert(key.clone());
        let (permits, tx) = (self.permits.clone(), self.done_tx.clone());
        tokio::spawn(async move {
            let _permit = permits.acquire_owned().await;
            let outcome = op.await;
            let _ = tx.send(Done::Guest { key, uid, outcome });
        });
    }
}
