//! What runs the reconcilers, the same for all three: cache readiness, the shape of cached
//! objects, the steps every reconcile starts with (caches, owning Cluster, pause), a span and
//! metrics per reconcile, and the error policy.

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use tracing::Instrument;

pub(crate) use super::backoff::Backoff;
use super::error::Error;
use crate::api::conditions;
use crate::capi;
use crate::events::{EventSource, Events};
use crate::metrics::Metrics;

/// What the controllers report besides their writes, shared by all of them.
#[derive(Clone)]
pub(crate) struct Telemetry {
    pub metrics: Arc<Metrics>,
    pub caches: CacheReadiness,
    /// Where events go; none are published without it.
    pub events: Option<EventSource>,
}

impl Telemetry {
    /// The event recorder of one controller.
    pub(crate) fn recorder(&self, controller: &str) -> Events {
        match &self.events {
            Some(source) => source.recorder(controller),
            None => Events::disabled(),
        }
    }
}

/// That a cache has done its first full list, for any number of waiters.
///
/// kube's `Store::wait_until_ready` keeps one waker: of several tasks waiting at once, only the
/// last one polled is woken, and the others (possibly the controller runtime itself, which
/// waits on its main store) hang for ever. So each store gets exactly one waiter, the task
/// started here, and everyone else waits on this watch channel. Controllers' main stores are
/// never given to it: the runtime already waits on them.
#[derive(Clone, Debug)]
pub struct Synced(tokio::sync::watch::Receiver<bool>);

impl Synced {
    /// Starts the one waiter of `store`. Call once per store.
    pub(crate) fn of<K>(store: &Store<K>) -> Synced
    where
        K: Resource + Clone + Send + Sync + 'static,
        K::DynamicType: std::hash::Hash + Eq + Clone + Send + Sync,
    {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let store = store.clone();
        tokio::spawn(async move {
            if store.wait_until_ready().await.is_ok() {
                let _ = tx.send(true);
                tracing::debug!(cache = std::any::type_name::<K>(), "cache synced");
            }
        });
        Synced(rx)
    }

    /// A `Synced` set by whoever holds the sender (the fan-out of a shared cache, which sees
    /// the end of the first list itself).
    pub(crate) fn channel() -> (tokio::sync::watch::Sender<bool>, Synced) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (tx, Synced(rx))
    }

    /// Already synced (for tests that fill stores by hand).
    pub fn ready() -> Synced {
        Synced(tokio::sync::watch::channel(true).1)
    }

    pub(crate) fn is_synced(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits for the first full list.
    pub(crate) async fn wait(&self) -> Result<(), Error> {
        let mut rx = self.0.clone();
        rx.wait_for(|synced| *synced)
            .await
            .map(|_| ())
            .map_err(|_| Error::Cache("a cache stopped before its first list".into()))
    }

    /// The first step of every reconcile: waits until all of `caches` have done their first
    /// list, so that nothing is decided from a partial view.
    pub(crate) async fn all(caches: &[Synced]) -> Result<(), Error> {
        for c in caches {
            c.wait().await?;
        }
        Ok(())
    }
}

/// Whether every cache a controller registered has done its first list (`/readyz`).
#[derive(Clone, Default)]
pub(crate) struct CacheReadiness {
    caches: Arc<std::sync::Mutex<Vec<Synced>>>,
}

impl CacheReadiness {
    /// Counts `cache` until its first list completed.
    pub(crate) fn register(&self, cache: &Synced) {
        if let Ok(mut c) = self.caches.lock() {
            c.push(cache.clone());
        }
    }

    /// True once caches were registered and all of them synced.
    pub(crate) fn synced(&self) -> bool {
        self.caches
            .lock()
            .is_ok_and(|c| !c.is_empty() && c.iter().all(Synced::is_synced))
    }
}

/// The Cluster an object belongs to, from the Cluster cache, by the name
/// [`capi::cluster_name`] (or, for a KaironMachine, its Machine) gives.
pub(crate) fn owning_cluster(
    clusters: &Store<capi::Cluster>,
    ns: &str,
    name: Option<&str>,
) -> Option<Arc<capi::Cluster>> {
    clusters.get(&ObjectRef::new(name?).within(ns))
}

/// The pause step every reconciler takes before anything else, deletion included (so that
/// `clusterctl move`, which pauses and then deletes the source objects, never destroys a VM).
/// Paused means no writes: the Paused condition is written once through `write_paused`, and
/// not refreshed for a new generation (a deletion bumps it) while the pause lasts. Returns the
/// action to end the reconcile with when paused.
pub(crate) async fn pause_step<F, Fut>(
    why: Option<&'static str>,
    current: Option<&[Condition]>,
    write_paused: F,
) -> Result<Option<Action>, Error>
where
    F: FnOnce(&'static str) -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    pause_step_with(why, current, &[], write_paused).await
}

/// [`pause_step`], for an object that also says why something waits for the unpause
/// (`also`: conditions written with the Paused one, once, like it).
pub(crate) async fn pause_step_with<F, Fut>(
    why: Option<&'static str>,
    current: Option<&[Condition]>,
    also: &[conditions::Decided],
    write_paused: F,
) -> Result<Option<Action>, Error>
where
    F: FnOnce(&'static str) -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    let Some(why) = why else { return Ok(None) };
    if !paused_said(why, current, also) {
        write_paused(why).await?;
    }
    Ok(Some(Action::await_change()))
}

/// Whether the conditions already say the object is paused for `why`, with `also`: then a
/// pause step writes nothing.
pub(crate) fn paused_said(why: &str, current: Option<&[Condition]>, also: &[conditions::Decided]) -> bool {
    conditions::says(current, &conditions::paused(Some(why))) && also.iter().all(|d| conditions::says(current, d))
}

/// Logs a watch error at warn and counts it (`capkr_watch_errors_total`): a watch that keeps
/// failing (RBAC, an object that does not parse) leaves its cache stale or never synced, and
/// must be seen rather than hidden at debug.
pub(crate) fn watch_error(
    resource: &'static str,
    telemetry: &Telemetry,
) -> impl FnMut(&kube::runtime::watcher::Error) + Send + 'static {
    let metrics = telemetry.metrics.clone();
    move |e| {
        let e = crate::text::bounded(&e.to_string(), MAX_LOGGED_ERROR);
        tracing::warn!(resource, error = %e, "watch failed; retrying with backoff");
        metrics
            .watch_errors
            .get_or_create(&crate::metrics::WatchLabels { resource })
            .inc();
    }
}

/// `obj`'s key in a queue or a map: its name and namespace only. kube's `ObjectRef::from_obj`
/// also copies the resourceVersion and uid, which neither equality nor hashing reads, and which
/// every queued reconcile would hold twice (in the scheduler's queue and in its map).
pub(crate) fn key_of<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectRef<K> {
    let mut key = ObjectRef::from_obj(obj);
    key.extra = Default::default();
    key
}

/// Drops what the caches never need: managedFields are most of an object's size.
pub(crate) fn strip_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// For the caches of our own objects: managedFields and every annotation the provider does not
/// read ([`capi::READ_ANNOTATIONS`]) go before the object is stored. CAPI's cloned-from
/// annotations alone are about 0.7 KiB of every cached KaironMachine.
pub(crate) fn keep_read_annotations<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    capi::retain_keys(&mut meta.annotations, &capi::READ_ANNOTATIONS);
}

pub(crate) type ReconcileFuture = std::pin::Pin<Box<dyn Future<Output = Result<Action, Error>> + Send>>;

/// Wraps a reconcile function: a span carrying the object's namespace, name and cluster (so
/// every log line of the reconcile has them), and the reconcile metrics (ours, and
/// controller-runtime's: the result, the duration, the worker it holds).
pub(crate) fn instrumented<K, C, F, Fut>(
    controller: &'static str,
    metrics: Arc<Metrics>,
    backoff: Backoff<K>,
    reconcile: F,
) -> impl Fn(Arc<K>, Arc<C>) -> ReconcileFuture + Send + Sync + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    C: Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
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
        let fut = reconcile(obj.clone(), ctx);
        let backoff = backoff.clone();
        Box::pin(
            async move {
                let res = fut.await;
                match &res {
                    Err(e) => timer.failed(e.stage()),
                    Ok(action) => {
                        timer.succeeded(action);
                        backoff.succeeded(obj.as_ref());
                    }
                }
                drop(timer);
                res
            }
            .instrument(span),
        )
    }
}

/// How much of an error a log line repeats: errors can quote what a server answered, and a
/// tenant's Kairon API may answer anything.
pub(crate) const MAX_LOGGED_ERROR: usize = 1024;

/// Every controller's error policy: log where it failed, try again after the object's backoff.
pub(crate) fn error_policy<K: Resource<DynamicType = ()> + Clone + 'static, C>(
    backoff: Backoff<K>,
) -> impl Fn(Arc<K>, &Error, Arc<C>) -> Action {
    move |obj, error, _ctx| {
        let wait = backoff.failed(obj.as_ref());
        let stage = error.stage();
        let error = crate::text::bounded(&error.to_string(), MAX_LOGGED_ERROR);
        tracing::warn!(name = %obj.name_any(), namespace = ?obj.namespace(), stage, %error, retry_in = ?wait, "reconcile failed");
        Action::requeue(wait)
    }
}

/// Logs what the controller runtime reports after each reconcile (errors are already logged by
/// [`error_policy`]; these are the runtime's own, e.g. an object gone before its reconcile).
pub(crate) async fn log_outcome<K: Resource, E: std::fmt::Display>(res: Result<(ObjectRef<K>, Action), E>) {
    match res {
        Ok((obj, _)) => tracing::debug!(%obj, "reconciled"),
        Err(e) => tracing::debug!(error = %e, "reconcile not run"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_objects_keep_the_annotations_that_are_read() {
        let mut km = crate::api::KaironMachine::new("km1", Default::default());
        km.metadata.annotations = Some(
            [
                ("cluster.x-k8s.io/cloned-from-name", "tpl"),
                (
                    "cluster.x-k8s.io/cloned-from-groupkind",
                    "KaironMachineTemplate.infrastructure.cluster.x-k8s.io",
                ),
                (capi::PAUSED_ANNOTATION, ""),
                (capi::DELETE_FOR_MOVE_ANNOTATION, ""),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        );
        let mut cached = km.clone();
        keep_read_annotations(&mut cached);
        for a in capi::READ_ANNOTATIONS {
            assert_eq!(
                capi::has_annotation(&cached.metadata, a),
                capi::has_annotation(&km.metadata, a),
                "{a}"
            );
        }
        assert_eq!(cached.metadata.annotations.as_ref().map(|a| a.len()), Some(2));
        let mut plain = crate::api::KaironMachine::new("km2", Default::default());
        plain.metadata.annotations =
            Some([("cluster.x-k8s.io/cloned-from-name".to_string(), "tpl".to_string())].into());
        keep_read_annotations(&mut plain);
        assert_eq!(plain.metadata.annotations, None, "no empty map is kept");
    }

    #[tokio::test]
    async fn pause_writes_the_condition_once_and_stops_the_reconcile() {
        let writes = std::sync::atomic::AtomicUsize::new(0);
        let write = |_why: &'static str| async {
            writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        };
        assert!(pause_step(None, None, write).await.unwrap().is_none(), "not paused");
        assert_eq!(writes.load(std::sync::atomic::Ordering::SeqCst), 0);

        let why = "the cluster.x-k8s.io/paused annotation is set";
        let action = pause_step(Some(why), None, write).await.unwrap();
        assert_eq!(action, Some(Action::await_change()));
        assert_eq!(
            writes.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "first time: written"
        );

        let mut already = vec![];
        conditions::set(&mut already, conditions::paused(Some(why)), Some(1), &conditions::now());
        let action = pause_step(Some(why), Some(&already), write).await.unwrap();
        assert_eq!(action, Some(Action::await_change()));
        assert_eq!(
            writes.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "already said: not written again"
        );
    }

    #[test]
    fn cache_readiness_needs_every_registered_cache() {
        let readiness = CacheReadiness::default();
        assert!(!readiness.synced(), "nothing registered yet");
        readiness.register(&Synced::ready());
        assert!(readiness.synced());
        let (tx, rx) = tokio::sync::watch::channel(false);
        readiness.register(&Synced(rx));
        assert!(!readiness.synced(), "one cache still listing");
        tx.send(true).unwrap();
        assert!(readiness.synced());
    }
}
