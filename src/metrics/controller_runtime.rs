//! controller-runtime's metrics of reconciles and work queues, under its names and buckets,
//! so that CAPI's dashboards show our controllers as they show CAPI's (see [`super`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::{ControllerLabels, HistogramFamily, SecondsGauge};

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
    pub(super) fn of(controller: &'static str) -> Self {
        QueueLabels {
            name: controller,
            controller,
        }
    }
}

/// controller-runtime's results, in its words.
pub(super) const RESULTS: [&str; 4] = ["success", "error", "requeue", "requeue_after"];

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
pub(super) struct ControllerState {
    pub(super) resync: Option<Duration>,
    pub(super) running: HashMap<u64, Instant>,
}

/// controller-runtime's metrics of reconciles and work queues.
pub(super) struct ControllerRuntime {
    pub(super) reconciles: Family<ResultLabels, Counter>,
    pub(super) errors: Family<ControllerLabels, Counter>,
    /// Reconciles dropped at their deadline (KaironMachines': [`DEADLINE_STAGE`]).
    pub(super) timeouts: Family<ControllerLabels, Counter>,
    pub(super) time: HistogramFamily<ControllerLabels>,
    pub(super) active_workers: Family<ControllerLabels, Gauge>,
    pub(super) max_concurrent: Family<ControllerLabels, Gauge>,
    pub(super) retries: Family<QueueLabels, Counter>,
    pub(super) work_duration: HistogramFamily<QueueLabels>,
    pub(super) longest_running: Family<QueueLabels, SecondsGauge>,
    pub(super) unfinished: Family<QueueLabels, SecondsGauge>,
}

impl ControllerRuntime {
    pub(super) fn register(registry: &mut Registry) -> Self {
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
