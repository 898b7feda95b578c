//! What the controllers report besides their writes: metrics, events, cache readiness, and a
//! tracing span per reconcile.

use std::future::Future;
use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::Instrument;

use crate::capi;
use crate::controller::Error;
use crate::events::Events;
use crate::metrics::Metrics;

/// Shared by the three controllers.
#[derive(Clone)]
pub struct Telemetry {
    pub metrics: Arc<Metrics>,
    pub caches: CacheReadiness,
    /// Events are published when set (the manager's identity is the reporting instance).
    pub client_for_events: Option<(kube::Client, String)>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            metrics: Metrics::new(),
            caches: CacheReadiness::default(),
            client_for_events: None,
        }
    }
}

impl Telemetry {
    /// The event recorder of one controller.
    pub fn events(&self, controller: &str) -> Events {
        match &self.client_for_events {
            Some((client, instance)) => Events::new(client.clone(), controller, instance),
            None => Events::disabled(),
        }
    }
}

/// Whether every cache a controller registered has done its first list.
#[derive(Clone, Default)]
pub struct CacheReadiness {
    caches: Arc<std::sync::Mutex<Vec<crate::controller::Synced>>>,
}

impl CacheReadiness {
    /// Counts `cache` until its first list completed.
    pub fn register(&self, cache: &crate::controller::Synced) {
        if let Ok(mut c) = self.caches.lock() {
            c.push(cache.clone());
        }
    }

    /// True once caches were registered and all of them synced.
    pub fn synced(&self) -> bool {
        self.caches
            .lock()
            .is_ok_and(|c| !c.is_empty() && c.iter().all(|s| s.is_synced()))
    }
}

pub type ReconcileFuture = std::pin::Pin<Box<dyn Future<Output = Result<Action, Error>> + Send>>;

/// Wraps a reconcile function: a span carrying the object's namespace, name and cluster (so
/// every log line of the reconcile has them), and the reconcile metrics.
pub fn instrumented<K, C, F, Fut>(
    controller: &'static str,
    metrics: Arc<Metrics>,
    reconcile: F,
) -> impl FnMut(Arc<K>, Arc<C>) -> ReconcileFuture
where
    K: ResourceExt + Send + Sync + 'static,
    C: Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<C>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    move |obj, ctx| {
        let span = tracing::info_span!(
            "reconcile",
            controller,
            namespace = %obj.namespace().unwrap_or_default(),
            // Not `name`: JSON logs put the span's own name under that key.
            object = %obj.name_any(),
            cluster = %capi::label(obj.meta(), capi::CLUSTER_NAME_LABEL).unwrap_or_default(),
        );
        let timer = metrics.reconcile_started(controller);
        let fut = reconcile(obj, ctx);
        Box::pin(
            async move {
                let res = fut.await;
                if let Err(e) = &res {
                    timer.failed(e.stage());
                }
                drop(timer);
                res
            }
            .instrument(span),
        )
    }
}
