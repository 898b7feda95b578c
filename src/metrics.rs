//! Prometheus metrics of the manager (text exposition on `--metrics-bind-address`).
//!
//! Labels are controller names, error stages, Kairon phases, HTTP verbs and status codes: never
//! object names, and never anything taken from bootstrap data.

use std::sync::{Arc, Mutex};
use std::time::Instant;

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

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

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
    pub(crate) instance_migrations: Counter,
    pub(crate) evacuations: Gauge,
    pub(crate) evacuation_replacements: Family<ReplacementLabels, Counter>,
    pub(crate) evacuation_deadlines_missed: Counter,
    /// Feeds `kairon_machines` at scrape time: counts of managed Kairon Machines by phase.
    phase_counts: Mutex<Option<PhaseCounter>>,
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
        let instance_migrations = Counter::default();
        let evacuations = Gauge::default();
        let evacuation_replacements = Family::<ReplacementLabels, Counter>::default();
        let evacuation_deadlines_missed = Counter::default();

        let mut registry = Registry::with_prefix("capkr");
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
            "Machines marked for remediation (mark) or deleted (delete) because Kairon asked to evacuate their VM",
            evacuation_replacements.clone(),
        );
        registry.register(
            "evacuation_deadlines_missed",
            "Kairon Machines Kairon stopped because they were still on a host in maintenance at the deadline",
            evacuation_deadlines_missed.clone(),
        );
        Metrics {
            instance_migrations,
            evacuations,
            evacuation_replacements,
            evacuation_deadlines_missed,
            registry,
            watch_errors,
            instances_kept,
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

    /// What the by-phase gauge is computed from at scrape time.
    pub(crate) fn count_phases_with(&self, counter: PhaseCounter) {
        *self.phase_counts.lock().unwrap_or_else(|e| e.into_inner()) = Some(counter);
    }

    /// Starts timing one reconcile; the guard records it when dropped.
    pub(crate) fn reconcile_started(self: &Arc<Self>, controller: &'static str) -> ReconcileTimer {
        let labels = ControllerLabels { controller };
        self.reconciles.get_or_create(&labels).inc();
        self.reconciles_in_flight.get_or_create(&labels).inc();
        ReconcileTimer {
            metrics: self.clone(),
            controller,
            start: Instant::now(),
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
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Records duration and in-flight count of one reconcile.
pub(crate) struct ReconcileTimer {
    metrics: Arc<Metrics>,
    controller: &'static str,
    start: Instant,
}

impl ReconcileTimer {
    pub(crate) fn failed(&self, stage: &'static str) {
        self.metrics
            .reconcile_errors
            .get_or_create(&ErrorLabels {
                controller: self.controller,
                stage,
            })
            .inc();
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        let labels = ControllerLabels {
            controller: self.controller,
        };
        self.metrics
            .reconcile_duration
            .get_or_create(&labels)
            .observe(self.start.elapsed().as_secs_f64());
        self.metrics.reconciles_in_flight.get_or_create(&labels).dec();
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
            "capkr_evacuation_deadlines_missed_total 0",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
    }
}
