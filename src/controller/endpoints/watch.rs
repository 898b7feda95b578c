//! The Kairon Machine watch of one endpoint: its reflector, bounded by the endpoint's budget
//! ([`super::budget`]), and what it reports as the endpoint's health ([`super::health`]).

use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use kube::runtime::reflector;

use super::budget::within_budget;
use kube::Client;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::warn;

use super::health::Endpoint;
use super::health::MAX_PROBLEM;
use super::{Endpoints, IdentityKey, kaironmachine_in, trust};
use crate::controller::runtime::Synced;
use crate::kairon::{self, Instances, labels};
use crate::text::bounded;

impl Endpoints {
    /// Starts the watch of the Kairon Machines of namespace `key.namespace` on `client`: a store, and a
    /// reconcile of the KaironMachine of every Kairon Machine that changes, if it is of that
    /// namespace ([`kaironmachine_in`]).
    pub(super) fn start(
        &self,
        key: &IdentityKey,
        client: Client,
        fingerprint: String,
    ) -> (Endpoint, tokio::task::AbortHandle) {
        // Which versions the API serves is asked first, by the endpoint's task (a reconcile
        // never waits on it); once per kubeconfig: a Kairon upgraded under a running endpoint
        // is seen when the identity's Secret changes or the manager restarts.
        let instances = Instances::undiscovered(client)
            .with_owner(self.owner.clone())
            .with_write_gate();
        let (store, writer) = reflector::store();
        let problem: Arc<Mutex<Option<String>>> = Arc::default();
        let cut_off: Arc<Mutex<Option<String>>> = Arc::default();
        // Pages small enough for the client's response limit; watches the server ends before
        // the client's read timeout would.
        let wc = watcher::Config::default()
            .page_size(trust::LIST_PAGE)
            .timeout(trust::WATCH_TIMEOUT_SECS)
            .labels(&labels::managed_selector());
        let set_problem = problem.clone();
        let clear_problem = problem.clone();
        let metrics = self.telemetry.metrics.clone();
        let identity = key.to_string();
        let trigger = self.trigger.clone();
        let on_problem = self.trigger.clone();
        let known = store.clone();
        let (served, served_on_problem) = (key.namespace.clone(), key.namespace.clone());
        let discovered = Self::discover_versions(
            instances.clone(),
            key.to_string(),
            problem.clone(),
            self.telemetry.metrics.clone(),
        );
        let (watched, watched_ns) = (instances.clone(), key.namespace.clone());
        let events = futures::stream::once(discovered)
            .flat_map(move |()| watcher(watched.api(Some(&watched_ns)), wc.clone()))
            .inspect_err(move |e| {
                let e = bounded(&e.to_string(), MAX_PROBLEM);
                warn!(identity = %identity, error = %e, "Kairon endpoint watch failed; retrying with backoff");
                metrics
                    .watch_errors
                    .get_or_create(&crate::metrics::WatchLabels {
                        resource: "machines.kairon.zyvor.dev",
                    })
                    .inc();
                let first = set_problem
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .replace(format!("the Kairon API cannot be watched: {e}"))
                    .is_none();
                if first {
                    // The machines on this endpoint say so at once, not at their next resync.
                    for vm in known.state() {
                        if let Some(km) = kaironmachine_in(&vm, &served_on_problem) {
                            let _ = on_problem.unbounded_send(km);
                        }
                    }
                }
            })
            .default_backoff()
            .map_ok(kairon::read_event);
        let served_cut = key.namespace.clone();
        let on_cut = self.trigger.clone();
        let (cut_key, clusters_cut) = (key.clone(), self.cut_offs.clone());
        let events = within_budget(
            events,
            writer,
            store.clone(),
            cut_off.clone(),
            key.to_string(),
            self.ledger.claim(&key.namespace),
            move |vms| {
                // Its machines and clusters say so at once.
                for vm in vms {
                    if let Some(km) = kaironmachine_in(&vm, &served_cut) {
                        let _ = on_cut.unbounded_send(km);
                    }
                }
                if let Some(clusters) = &clusters_cut {
                    let _ = clusters.unbounded_send(cut_key.clone());
                }
            },
        );
        let task = tokio::spawn(events.for_each(move |event| {
            if let Ok(event) = event {
                *clear_problem.lock().unwrap_or_else(|e| e.into_inner()) = None;
                use kube::runtime::watcher::Event;
                let vm = match event {
                    Event::Apply(vm) | Event::Delete(vm) | Event::InitApply(vm) => Some(vm),
                    Event::Init | Event::InitDone => None,
                };
                if let Some(km) = vm.as_ref().and_then(|vm| kaironmachine_in(vm, &served)) {
                    let _ = trigger.unbounded_send(km);
                }
            }
            futures::future::ready(())
        }));
        let synced = Synced::of(&store);
        let endpoint =
            Endpoint::new(instances, store, synced, key.namespace.clone(), fingerprint, problem).with_cut_off(cut_off);
        (endpoint, task.abort_handle())
    }
}
