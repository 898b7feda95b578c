//! Prometheus metrics of the manager (text exposition on `--metrics-bind-address`).
//!
//! Labels are controller names, error stages, Kairon phases, HTTP verbs and status codes: never
//! object names, and never anything taken from bootstrap data.
//!
//! Besides our own (`capkr_*`), every reconcile is also counted under controller-runtime's
//! names, so that CAPI's dashboards (`hack/observability/grafana/dashboards/controller-runtime.json`)
//! show our controllers as they show CAPI's: `controller_runtime_reconcile_total{controller,result}`,
//! `controller_runtime_reconcile_errors_total`, `controller_runtime_reconcile_timeouts_total`
//! (reconciles dropped at their deadline), `controller_runtime_reconcile_time_seconds`
//! (controller-runtime's buckets), `controller_runtime_active_workers`,
//! `controller_runtime_max_concurrent_reconciles`, and of the work queue what the reconciler
//! wrapper sees truthfully: `workqueue_retries_total`, `workqueue_work_duration_seconds`,
//! `workqueue_longest_running_processor_seconds`, `workqueue_unfinished_work_seconds` (label
//! `name`, and `controller`, both the controller's name, as controller-runtime sets them).
//! kube-runtime's scheduler, which holds the queue, keeps its contents to itself, so
//! `workqueue_depth`, `workqueue_adds_total` and `workqueue_queue_duration_seconds` are not
//! exposed rather than made up.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::controller::Action;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

mod controller_runtime;

use controller_runtime::{ControllerRuntime, ControllerState, QueueLabels, RESULTS, ResultLabels};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ControllerLabels {
    pub controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ErrorLabels {
    pub controller: &'static str,
    pub stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PhaseLabels {
    pub phase: String,
}

/// Which version of a Kairon kind is spoken on a Kairon API (`manager`: the manager's own;
/// otherwise an identity's `namespace/name`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KaironVersionLabels {
    pub api: String,
    pub kind: &'static str,
    pub version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WatchLabels {
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReplacementLabels {
    /// `mark` (remediate-machine) or `delete` (no MachineHealthCheck).
    pub action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub verb: &'static str,
    pub code: String,
}

/// The stage of a reconcile dropped at its deadline (controller-runtime's reconcile timeout).
const DEADLINE_STAGE: &str = "deadline";

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;
type SecondsGauge = Gauge<f64, AtomicU64>;

fn reconcile_buckets() -> Histogram {
    // 1 ms .. ~16 s
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Every metric of the manager, registered once.
pub struct Metrics {
    registry: Registry,
    pub(crate) reconciles: Family<ControllerLabels, Counter>,
    pub(crate) reconcile_errors: Family<ErrorLabels, Counter>,
    pub(crate) reconcile_duration: HistogramFamily<ControllerLabels>,
    pub(crate) reconciles_in_flight: Family<ControllerLabels, Gauge>,
    pub(crate) kairon_machines: Family<PhaseLabels, Gauge>,
    pub(crate) provision_duration: Histogram,
    pub(crate) api_requests: Family<RequestLabels, Counter>,
    pub(crate) leader: Gauge,
    pub(crate) watch_errors: Family<WatchLabels, Counter>,
    pub(crate) instances_kept: Counter,
    pub(crate) kairon_api_versions: Family<KaironVersionLabels, Gauge>,
    pub(crate) instance_migrations: Counter,
    pub(crate) evacuations: Gauge,
    pub(crate) evacuation_replacements: Family<ReplacementLabels, Counter>,
    /// Feeds `kairon_machines` at scrape time: counts of managed Kairon Machines by phase.
    phase_counts: Mutex<Option<PhaseCounter>>,
    /// The same reconciles under controller-runtime's names.
    runtime: ControllerRuntime,
    /// Per controller, what the work-queue gauges are computed from at scrape time.
    controllers: Mutex<BTreeMap<&'static str, ControllerState>>,
    next_reconcile: AtomicU64,
}

/// Counts managed Kairon Machines by phase (whoever holds them knows how).
pub(crate) type PhaseCounter = Box<dyn Fn() -> std::collections::BTreeMap<String, i64> + Send + Sync>;

impl Default for Metrics {
    fn default() -> Self {
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration: HistogramFamily<ControllerLabels> = Family::new_with_constructor(reconcile_buckets);
        let reconciles_in_flight = Family::<ControllerLabels, Gauge>::default();
        let kairon_machines = Family::<PhaseLabels, Gauge>::default();
        // 1 s .. ~68 min
        let provision_duration = Histogram::new(exponential_buckets(1.0, 2.0, 13));
        let api_requests = Family::<RequestLabels, Counter>::default();
        let leader = Gauge::default();
        let watch_errors = Family::<WatchLabels, Counter>::default();
        let instances_kept = Counter::default();
        let kairon_api_versions = Family::<KaironVersionLabels, Gauge>::default();
        let instance_migrations = Counter::default();
        let evacuations = Gauge::default();
        let evacuation_replacements = Family::<ReplacementLabels, Counter>::default();

        let mut root = Registry::default();
        let runtime = ControllerRuntime::register(&mut root);
        let registry = root.sub_registry_with_prefix("capkr");
        registry.register("reconcile", "Reconciles run, per controller", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, per controller and stage of the failure",
            reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of reconciles, per controller",
            reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_in_flight",
            "Reconciles running now, per controller",
            reconciles_in_flight.clone(),
        );
        registry.register(
            "kairon_machines",
            "Kairon Machines managed by this provider, by phase (leader only)",
            kairon_machines.clone(),
        );
        registry.register(
            "kaironmachine_provision_duration_seconds",
            "Time from KaironMachine creation until it is provisioned",
            provision_duration.clone(),
        );
        registry.register(
            "api_requests",
            "Requests to the Kubernetes API, by verb and HTTP status code (error: no response)",
            api_requests.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease (or runs without leader election)",
            leader.clone(),
        );
        registry.register(
            "watch_errors",
            "Errors of the watches feeding the caches, by resource (each is retried with backoff)",
            watch_errors.clone(),
        );
        registry.register(
            "kairon_machines_kept",
            "Kairon Machines kept when their KaironMachine was deleted after its Cluster was gone",
            instances_kept.clone(),
        );
        registry.register(
            "kairon_api_version",
            "1 for the version of each Kairon kind spoken on each Kairon API (none: not served there)",
            kairon_api_versions.clone(),
        );
        registry.register(
            "instance_migrations",
            "Live migrations of Kairon Machines to another host, as seen by their KaironMachines",
            instance_migrations.clone(),
        );
        registry.register(
            "evacuations",
            "KaironMachines whose Kairon host is in maintenance and which are being replaced (or wait to be)",
            evacuations.clone(),
        );
        registry.register(
            "evacuation_replacements",
            "Machines marked for remediation (mark) or deleted (delete) because their VM's Kairon node is cordoned",
            evacuation_replacements.clone(),
        );
        Metrics {
            registry: root,
            runtime,
            controllers: Mutex::default(),
            next_reconcile: AtomicU64::new(0),
            instance_migrations,
            evacuations,
            evacuation_replacements,
            watch_errors,
            instances_kept,
            kairon_api_versions,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            reconciles_in_flight,
            kairon_machines,
            provision_duration,
            api_requests,
            leader,
            phase_counts: Mutex::new(None),
        }
    }
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        Arc::new(Metrics::default())
    }

    /// Records the versions spoken on Kairon API `api`: each Kairon kind with its version
    /// (`none`: not served there).
    pub(crate) fn kairon_versions(&self, api: &str, versions: impl IntoIterator<Item = (&'static str, &'static str)>) {
        for (kind, version) in versions {
            let labels = KaironVersionLabels {
                api: api.to_string(),
                kind,
                version,
            };
            self.kairon_api_versions.get_or_create(&labels).set(1);
        }
    }

    /// What the by-phase gauge is computed from at scrape time.
    pub(crate) fn count_phases_with(&self, counter: PhaseCounter) {
        *self.phase_counts.lock().unwrap_or_else(|e| e.into_inner()) = Some(counter);
    }

    fn controllers(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, ControllerState>> {
        self.controllers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A controller starts: its series exist from now on (at 0, as controller-runtime makes
    /// them when its controller starts), with `places` reconciles at once, and `resync` the
    /// requeue its reconciles end with when all is done.
    pub(crate) fn controller_started(&self, controller: &'static str, places: u32, resync: Duration) {
        let labels = ControllerLabels { controller };
        let rt = &self.runtime;
        // Created at 0 (the guards `get_or_create` returns are let go at once).
        for result in RESULTS {
            let _ = rt.reconciles.get_or_create(&ResultLabels { controller, result });
        }
        let _ = rt.errors.get_or_create(&labels);
        let _ = rt.timeouts.get_or_create(&labels);
        let _ = rt.time.get_or_create(&labels);
        let _ = rt.active_workers.get_or_create(&labels);
        rt.max_concurrent.get_or_create(&labels).set(i64::from(places));
        let queue = QueueLabels::of(controller);
        let _ = rt.retries.get_or_create(&queue);
        let _ = rt.work_duration.get_or_create(&queue);
        let _ = rt.longest_running.get_or_create(&queue);
        let _ = rt.unfinished.get_or_create(&queue);
        self.controllers().entry(controller).or_default().resync = Some(resync);
    }

    /// Starts timing one reconcile; the guard records it when dropped.
    pub(crate) fn reconcile_started(self: &Arc<Self>, controller: &'static str) -> ReconcileTimer {
        let labels = ControllerLabels { controller };
        self.reconciles.get_or_create(&labels).inc();
        self.reconciles_in_flight.get_or_create(&labels).inc();
        self.runtime.active_workers.get_or_create(&labels).inc();
        let id = self.next_reconcile.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        self.controllers()
            .entry(controller)
            .or_default()
            .running
            .insert(id, start);
        ReconcileTimer {
            metrics: self.clone(),
            controller,
            id,
            start,
        }
    }

    /// The work-queue gauges, from the reconciles running now.
    fn observe_running(&self) {
        let now = Instant::now();
        for (controller, state) in self.controllers().iter() {
            let running = state
                .running
                .values()
                .map(|start| now.duration_since(*start).as_secs_f64());
            let (sum, longest) = running.fold((0.0, 0.0_f64), |(sum, max), s| (sum + s, max.max(s)));
            let queue = QueueLabels::of(controller);
            self.runtime.unfinished.get_or_create(&queue).set(sum);
            self.runtime.longest_running.get_or_create(&queue).set(longest);
        }
    }

    /// The Prometheus text exposition.
    pub(crate) fn encode(&self) -> String {
        if let Some(count) = self.phase_counts.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let counts = count();
            self.kairon_machines.clear();
            for (phase, n) in counts {
                self.kairon_machines.get_or_create(&PhaseLabels { phase }).set(n);
            }
        }
        self.observe_running();
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Records one reconcile: its result, duration and the workers it held.
pub(crate) struct ReconcileTimer {
    metrics: Arc<Metrics>,
    controller: &'static str,
    id: u64,
    start: Instant,
}

impl ReconcileTimer {
    /// The reconcile failed at `stage`; it is retried after its backoff.
    pub(crate) fn failed(&self, stage: &'static str) {
        self.metrics
            .reconcile_errors
            .get_or_create(&ErrorLabels {
                controller: self.controller,
                stage,
            })
            .inc();
        let rt = &self.metrics.runtime;
        let labels = ControllerLabels {
            controller: self.controller,
        };
        rt.errors.get_or_create(&labels).inc();
        if stage == DEADLINE_STAGE {
            rt.timeouts.get_or_create(&labels).inc();
        }
        self.result("error");
    }

    /// The reconcile succeeded and ended with `action`.
    pub(crate) fn succeeded(&self, action: &Action) {
        let resync = self.metrics.controllers().get(self.controller).and_then(|s| s.resync);
        self.result(result_of(action, resync));
    }

    fn result(&self, result: &'static str) {
        let rt = &self.metrics.runtime;
        rt.reconciles
            .get_or_create(&ResultLabels {
                controller: self.controller,
                result,
            })
            .inc();
        if result != "success" {
            rt.retries.get_or_create(&QueueLabels::of(self.controller)).inc();
        }
    }
}

/// controller-runtime's result of a reconcile that ended with `action`: waiting for a change,
/// or the resync, is a success (controller-runtime resyncs through its informers, and its
/// reconcile returns an empty result); a requeue at once is `requeue`, any other
/// `requeue_after`.
fn result_of(action: &Action, resync: Option<Duration>) -> &'static str {
    if *action == Action::await_change() || resync.is_some_and(|r| *action == Action::requeue(r)) {
        "success"
    } else if *action == Action::requeue(Duration::ZERO) {
        "requeue"
    } else {
        "requeue_after"
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        let labels = ControllerLabels {
            controller: self.controller,
        };
        let took = self.start.elapsed().as_secs_f64();
        let m = &self.metrics;
        m.reconcile_duration.get_or_create(&labels).observe(took);
        m.reconciles_in_flight.get_or_create(&labels).dec();
        m.runtime.time.get_or_create(&labels).observe(took);
        m.runtime
            .work_duration
            .get_or_create(&QueueLabels::of(self.controller))
            .observe(took);
        m.runtime.active_workers.get_or_create(&labels).dec();
        if let Some(state) = m.controllers().get_mut(self.controller) {
            state.running.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests;
