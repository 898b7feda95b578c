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

use std::collections::{BTreeMap, HashMap};
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

/// controller-runtime's `result` of a reconcile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    pub controller: &'static str,
    pub result: &'static str,
}

/// controller-runtime's labels of a work queue: its name and its controller's, both the
/// controller's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QueueLabels {
    pub name: &'static str,
    pub controller: &'static str,
}

impl QueueLabels {
    fn of(controller: &'static str) -> Self {
        QueueLabels {
            name: controller,
            controller,
        }
    }
}

/// The stage of a reconcile dropped at its deadline (controller-runtime's reconcile timeout).
const DEADLINE_STAGE: &str = "deadline";

/// controller-runtime's results, in its words.
const RESULTS: [&str; 4] = ["success", "error", "requeue", "requeue_after"];

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;
type SecondsGauge = Gauge<f64, AtomicU64>;

fn reconcile_buckets() -> Histogram {
    // 1 ms .. ~16 s
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// `controller_runtime_reconcile_time_seconds`' buckets (controller-runtime v0.24).
fn controller_runtime_buckets() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5,
        1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0,
    ])
}

/// The work queue's duration buckets (controller-runtime's `ExponentialBuckets(10e-9, 10, 12)`).
fn workqueue_buckets() -> Histogram {
    Histogram::new(exponential_buckets(1e-8, 10.0, 12))
}

/// What is known of one controller: its resync (a reconcile that ends with it succeeded, as
/// controller-runtime's informers resync and its reconcile returns an empty result), and its
/// reconciles running now, by when they started.
#[derive(Default)]
struct ControllerState {
    resync: Option<Duration>,
    running: HashMap<u64, Instant>,
}

/// controller-runtime's metrics of reconciles and work queues.
struct ControllerRuntime {
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<ControllerLabels, Counter>,
    /// Reconciles dropped at their deadline (KaironMachines': [`DEADLINE_STAGE`]).
    timeouts: Family<ControllerLabels, Counter>,
    time: HistogramFamily<ControllerLabels>,
    active_workers: Family<ControllerLabels, Gauge>,
    max_concurrent: Family<ControllerLabels, Gauge>,
    retries: Family<QueueLabels, Counter>,
    work_duration: HistogramFamily<QueueLabels>,
    longest_running: Family<QueueLabels, SecondsGauge>,
    unfinished: Family<QueueLabels, SecondsGauge>,
}

impl ControllerRuntime {
    fn register(registry: &mut Registry) -> Self {
        let m = ControllerRuntime {
            reconciles: Family::default(),
            errors: Family::default(),
            timeouts: Family::default(),
            time: Family::new_with_constructor(controller_runtime_buckets),
            active_workers: Family::default(),
            max_concurrent: Family::default(),
            retries: Family::default(),
            work_duration: Family::new_with_constructor(workqueue_buckets),
            longest_running: Family::default(),
            unfinished: Family::default(),
        };
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            m.reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            m.errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_timeouts",
            "Total number of reconciliation timeouts per controller",
            m.timeouts.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            m.time.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            m.active_workers.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            m.max_concurrent.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue: reconciles that ended with an error or a requeue other than the resync",
            m.retries.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            m.work_duration.clone(),
        );
        registry.register(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            m.longest_running.clone(),
        );
        registry.register(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads.",
            m.unfinished.clone(),
        );
        m
    }
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

    /// Records the versions spoken on Kairon API `api`.
    pub(crate) fn kairon_versions(&self, api: &str, served: &crate::kairon::served::Served) {
        for kind in crate::kairon::served::KaironKind::ALL {
            let labels = KaironVersionLabels {
                api: api.to_string(),
                kind: kind.kind(),
                version: served.version(kind).unwrap_or("none"),
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
mod tests {
    use super::*;

    #[test]
    fn series_are_exposed_with_their_names() {
        let m = Metrics::new();
        {
            let t = m.reconcile_started("kaironmachine");
            t.failed("write");
        }
        m.provision_duration.observe(3.0);
        m.count_phases_with(Box::new(|| {
            [("Running".to_string(), 2), ("Pending".to_string(), 1)].into()
        }));
        let text = m.encode();
        for want in [
            "capkr_reconcile_total{controller=\"kaironmachine\"} 1",
            "capkr_reconcile_errors_total{controller=\"kaironmachine\",stage=\"write\"} 1",
            "capkr_reconcile_in_flight{controller=\"kaironmachine\"} 0",
            "capkr_reconcile_duration_seconds_count{controller=\"kaironmachine\"} 1",
            "capkr_kaironmachine_provision_duration_seconds_count 1",
            "capkr_kairon_machines{phase=\"Running\"} 2",
            "capkr_kairon_machines{phase=\"Pending\"} 1",
            "capkr_instance_migrations_total 0",
            "capkr_evacuations 0",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
    }

    #[test]
    fn results_are_named_as_controller_runtime_names_them() {
        let resync = Some(Duration::from_secs(600));
        let cases = [
            (Action::await_change(), resync, "success"),
            (Action::requeue(Duration::from_secs(600)), resync, "success"),
            (Action::requeue(Duration::from_secs(600)), None, "requeue_after"),
            (Action::requeue(Duration::from_secs(30)), resync, "requeue_after"),
            (Action::requeue(Duration::ZERO), resync, "requeue"),
        ];
        for (action, resync, want) in cases {
            assert_eq!(result_of(&action, resync), want, "{action:?} with resync {resync:?}");
        }
    }

    #[test]
    fn controller_runtime_series_follow_the_reconciles() {
        let m = Metrics::new();
        m.controller_started("kaironmachine", 20, Duration::from_secs(600));
        let text = m.encode();
        for want in [
            "controller_runtime_reconcile_total{controller=\"kaironmachine\",result=\"success\"} 0",
            "controller_runtime_reconcile_total{controller=\"kaironmachine\",result=\"requeue_after\"} 0",
            "controller_runtime_reconcile_errors_total{controller=\"kaironmachine\"} 0",
            "controller_runtime_reconcile_timeouts_total{controller=\"kaironmachine\"} 0",
            "controller_runtime_max_concurrent_reconciles{controller=\"kaironmachine\"} 20",
            "controller_runtime_active_workers{controller=\"kaironmachine\"} 0",
            "controller_runtime_reconcile_time_seconds_count{controller=\"kaironmachine\"} 0",
            "workqueue_retries_total{name=\"kaironmachine\",controller=\"kaironmachine\"} 0",
            "workqueue_work_duration_seconds_count{name=\"kaironmachine\",controller=\"kaironmachine\"} 0",
            "workqueue_unfinished_work_seconds{name=\"kaironmachine\",controller=\"kaironmachine\"} 0.0",
            "workqueue_longest_running_processor_seconds{name=\"kaironmachine\",controller=\"kaironmachine\"} 0.0",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
        assert!(
            !text.contains("workqueue_depth") && !text.contains("workqueue_adds") && !text.contains("queue_duration"),
            "what kube-runtime does not show is not made up"
        );

        let running = m.reconcile_started("kaironmachine");
        {
            let t = m.reconcile_started("kaironmachine");
            t.succeeded(&Action::requeue(Duration::from_secs(600)));
        }
        {
            let t = m.reconcile_started("kaironmachine");
            t.failed("write");
        }
        {
            let t = m.reconcile_started("kaironmachine");
            t.succeeded(&Action::requeue(Duration::from_secs(5)));
        }
        {
            let t = m.reconcile_started("kaironmachine");
            t.failed("deadline");
        }
        std::thread::sleep(Duration::from_millis(20));
        let text = m.encode();
        let value = |series: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("{series} missing in\n{text}"))
        };
        let km = "{controller=\"kaironmachine\"}";
        let q = "{name=\"kaironmachine\",controller=\"kaironmachine\"}";
        let result = |r: &str| {
            value(&format!(
                "controller_runtime_reconcile_total{{controller=\"kaironmachine\",result=\"{r}\"}}"
            ))
        };
        assert_eq!(
            (result("success"), result("error"), result("requeue_after")),
            (1.0, 2.0, 1.0)
        );
        assert_eq!(value(&format!("controller_runtime_reconcile_errors_total{km}")), 2.0);
        assert_eq!(value(&format!("controller_runtime_reconcile_timeouts_total{km}")), 1.0);
        assert_eq!(
            value(&format!("workqueue_retries_total{q}")),
            3.0,
            "the errors and the requeue"
        );
        assert_eq!(
            value(&format!("controller_runtime_active_workers{km}")),
            1.0,
            "one still running"
        );
        assert_eq!(
            value(&format!("controller_runtime_reconcile_time_seconds_count{km}")),
            4.0
        );
        assert_eq!(value(&format!("workqueue_work_duration_seconds_count{q}")), 4.0);
        let longest = value(&format!("workqueue_longest_running_processor_seconds{q}"));
        let unfinished = value(&format!("workqueue_unfinished_work_seconds{q}"));
        assert!(longest >= 0.02 && unfinished >= longest, "{longest} {unfinished}");
        assert_eq!(value(&format!("capkr_reconcile_total{km}")), 5.0, "ours are kept");

        drop(running);
        let text = m.encode();
        assert!(
            text.contains(&format!("controller_runtime_active_workers{km} 0")),
            "{text}"
        );
        assert!(
            text.contains(&format!("workqueue_longest_running_processor_seconds{q} 0.0")),
            "{text}"
        );
    }
}
