//! One watch and one cache per resource, shared by every controller that reads it.
//!
//! Clusters, KaironClusters and KaironMachines are read by more than one controller (the
//! KaironMachine controller, the KaironCluster controller, the template controller, the sweeper
//! of Kairon API endpoints). Each resource is watched once, into one store; each controller
//! subscribes to the objects that watch applies or deletes and filters them with its own
//! trigger (see [`Shared::touched_when`]).
//!
//! kube-runtime's own shared streams (`reflect_shared`, `Writer::subscribe`) pass on applied
//! objects only, not deletions, which the KaironCluster controller waits for; and a subscriber
//! that is handed an object already gone from the store is not woken again. So the fan-out is
//! done here: after the reflector has updated the store, every subscriber gets the store's own
//! `Arc` of the object (no copy), a deleted object is passed on as deleted, and after a full
//! list every object of the store is passed on once, as the per-controller watches did.
//!
//! The first full list is signalled by the fan-out itself ([`Shared::synced`]), not by waiting
//! on the store: kube's `Store::wait_until_ready` wakes only one waiter, and that one is the
//! controller runtime of the controller whose main store it is.

use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::{Future, Stream, StreamExt, TryStreamExt, future};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource};

use super::changed::Triggers;
use super::fresh::Fresher;
use super::runtime::Synced;
use super::runtime::{Telemetry, keep_read_annotations, strip_managed_fields, watch_error};
use super::settings::Settings;
use crate::api::{KaironCluster, KaironMachine};
use crate::capi;

/// The caches more than one controller reads, one watch each.
pub(crate) struct Caches {
    /// Read by every controller (owning Cluster, pause) and mapped to the KaironMachines
    /// and KaironClusters of each Cluster.
    pub clusters: Shared<capi::Cluster>,
    /// The KaironCluster controller's own objects; the KaironMachine controller reads the
    /// identity and the sweeper the identities in use.
    pub kaironclusters: Shared<KaironCluster>,
    /// The KaironMachine controller's own objects; the KaironCluster controller counts the
    /// machines of a cluster being deleted, the sweeper the identities in use.
    pub kaironmachines: Shared<KaironMachine>,
    /// What the KaironMachine controller last wrote, forgotten as the watch follows.
    pub fresh: Fresher<KaironMachine>,
    /// Read by the KaironMachinePool controller (its owner, size and bootstrap data) and the
    /// KaironMachine controller (a pool member's bootstrap data is its MachinePool's).
    pub machine_pools: Shared<capi::MachinePool>,
}

impl Caches {
    /// The caches and the future that drives their watches (for as long as it is polled).
    /// Each cache's first list counts for readiness (`/readyz`).
    pub(crate) fn new(
        client: &Client,
        settings: &Settings,
        telemetry: &Telemetry,
    ) -> (Caches, impl Future<Output = ()> + Send + 'static) {
        let wc = settings.watcher_config();
        let (clusters, clusters_watch) = Shared::new(
            watcher(settings.api::<capi::Cluster>(client), wc.clone())
                .inspect_err(watch_error("clusters.cluster.x-k8s.io", telemetry))
                .default_backoff()
                .modify(strip_managed_fields),
        );
        let (kaironclusters, kc_watch) = Shared::new(
            watcher(settings.api::<KaironCluster>(client), wc.clone())
                .inspect_err(watch_error("kaironclusters.infrastructure.cluster.x-k8s.io", telemetry))
                .default_backoff()
                .modify(keep_read_annotations),
        );
        let fresh = Fresher::default();
        let forgetter = fresh.clone();
        let (kaironmachines, km_watch) = Shared::new(
            watcher(settings.api::<KaironMachine>(client), wc)
                .inspect_err(watch_error("kaironmachines.infrastructure.cluster.x-k8s.io", telemetry))
                .default_backoff()
                .modify(keep_read_annotations)
                .inspect_ok(move |event| forgetter.observe(event)),
        );
        let (machine_pools, mp_watch) = Shared::new(
            watcher(settings.api::<capi::MachinePool>(client), settings.watcher_config())
                .inspect_err(watch_error("machinepools.cluster.x-k8s.io", telemetry))
                .default_backoff()
                .modify(strip_managed_fields),
        );
        for synced in [
            clusters.synced(),
            kaironclusters.synced(),
            kaironmachines.synced(),
            machine_pools.synced(),
        ] {
            telemetry.caches.register(&synced);
        }
        let caches = Caches {
            clusters,
            kaironclusters,
            kaironmachines,
            fresh,
            machine_pools,
        };
        let watches = async move {
            futures::join!(clusters_watch, kc_watch, km_watch, mp_watch);
        };
        (caches, watches)
    }
}

/// What a watch did, as the subscribers are told.
enum Touched<K> {
    Applied(Arc<K>),
    Deleted(Arc<K>),
    /// A full list is passed on: every object of the store follows, then [`Touched::Listed`].
    Listing,
    /// The end of a full list: an object not passed on since [`Touched::Listing`] is gone,
    /// whether or not a delete was seen (none is sent for what went during a watch gap).
    Listed,
}

impl<K> Clone for Touched<K> {
    fn clone(&self) -> Self {
        match self {
            Touched::Applied(obj) => Touched::Applied(obj.clone()),
            Touched::Deleted(obj) => Touched::Deleted(obj.clone()),
            Touched::Listing => Touched::Listing,
            Touched::Listed => Touched::Listed,
        }
    }
}

impl<K> Touched<K> {
    /// The object applied or deleted, if this is one.
    fn object(self) -> Option<Arc<K>> {
        match self {
            Touched::Applied(obj) | Touched::Deleted(obj) => Some(obj),
            Touched::Listing | Touched::Listed => None,
        }
    }
}

type Subscribers<K> = Arc<Mutex<Vec<mpsc::UnboundedSender<Touched<K>>>>>;

/// The one cache of a resource and the subscriptions to its watch.
pub(crate) struct Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    synced: Synced,
    subscribers: Subscribers<K>,
}

impl<K> Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// The cache filled by `events` (a watch, already trimmed of what is never read), and the
    /// future that drives the watch; it runs until `events` ends. Subscribe before driving it:
    /// a subscription sees what the watch does from then on.
    pub(crate) fn new(
        events: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (store, writer) = reflector::store::<K>();
        let (ready, synced) = Synced::channel();
        let subscribers: Subscribers<K> = Arc::default();
        let shared = Shared {
            store: store.clone(),
            synced,
            subscribers: subscribers.clone(),
        };
        let driver = events.reflect(writer).for_each(move |event| {
            match event {
                Ok(Event::Apply(obj)) => {
                    if let Some(obj) = store.get(&ObjectRef::from_obj(&obj)) {
                        dispatch(&subscribers, &Touched::Applied(obj));
                    }
                }
                Ok(Event::Delete(obj)) => dispatch(&subscribers, &Touched::Deleted(Arc::new(obj))),
                Ok(Event::InitDone) => {
                    let _ = ready.send(true);
                    dispatch(&subscribers, &Touched::Listing);
                    for obj in store.state() {
                        dispatch(&subscribers, &Touched::Applied(obj));
                    }
                    dispatch(&subscribers, &Touched::Listed);
                }
                // Objects of a list go into the store at its end (InitDone); errors are
                // reported and retried by the watch itself.
                Ok(Event::Init | Event::InitApply(_)) | Err(_) => {}
            }
            future::ready(())
        });
        (shared, driver)
    }

    /// The store, for reads.
    pub(crate) fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Whether the first full list is in the store, for any number of waiters.
    pub(crate) fn synced(&self) -> Synced {
        self.synced.clone()
    }

    fn subscribe(&self) -> mpsc::UnboundedReceiver<Touched<K>> {
        let (tx, rx) = mpsc::unbounded();
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).push(tx);
        rx
    }

    /// Every object applied (created or changed, and all of them after each full list).
    pub(crate) fn applied(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.subscribe().filter_map(|t| {
            future::ready(match t {
                Touched::Applied(obj) => Some(obj),
                _ => None,
            })
        })
    }

    /// Every object deleted (as the watch saw it go; not one that went during a watch gap).
    pub(crate) fn deleted(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.subscribe().filter_map(|t| {
            future::ready(match t {
                Touched::Deleted(obj) => Some(obj),
                _ => None,
            })
        })
    }

    /// Every object applied or deleted.
    pub(crate) fn touched(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.subscribe().filter_map(|t| future::ready(t.object()))
    }

    /// Objects applied or deleted, but only those whose `trigger` differs from the last one
    /// seen of the same object (name and UID): what the subscriber reacts to changed. An object
    /// seen for the first time always passes, and so does a deletion. Like kube's `predicate_filter`, with the entry of
    /// an object dropped when it is deleted, or when a full list no longer has it (it went
    /// during a watch gap).
    pub(crate) fn touched_when<F>(&self, trigger: F) -> impl Stream<Item = Arc<K>> + Send + 'static
    where
        F: Fn(&K) -> Option<u64> + Send + 'static,
    {
        let mut last = Triggers::default();
        self.subscribe().filter_map(move |t| {
            let pass = passes(&mut last, &t, &trigger);
            future::ready(t.object().filter(|_| pass))
        })
    }
}

fn dispatch<K>(subscribers: &Subscribers<K>, touched: &Touched<K>) {
    // A subscriber whose stream was dropped (its controller stopped) is let go.
    subscribers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|s| s.unbounded_send(touched.clone()).is_ok());
}

/// Whether `t` passes `last`'s filter by `trigger` (a marker of a full list never does).
fn passes<K: Resource>(last: &mut Triggers, t: &Touched<K>, trigger: impl Fn(&K) -> Option<u64>) -> bool {
    match t {
        Touched::Applied(obj) => last.seen(obj.as_ref(), false, trigger),
        Touched::Deleted(obj) => last.seen(obj.as_ref(), true, trigger),
        Touched::Listing => {
            last.listing();
            false
        }
        Touched::Listed => {
            last.listed();
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use k8s_openapi::api::core::v1::ConfigMap;

    use crate::controller::changed::tests::{cm, data};

    /// Everything a stream has ready now, by name.
    fn drain(s: &mut (impl Stream<Item = Arc<ConfigMap>> + Unpin)) -> Vec<String> {
        let mut names = vec![];
        while let Some(Some(c)) = s.next().now_or_never() {
            names.push(c.metadata.name.clone().unwrap());
        }
        names
    }

    #[tokio::test]
    async fn one_watch_feeds_every_subscriber_with_its_own_trigger_and_deletions() {
        let (tx, rx) = mpsc::unbounded::<Result<Event<ConfigMap>, watcher::Error>>();
        let (shared, driver) = Shared::new(rx);
        let mut applied = Box::pin(shared.applied());
        let mut touched = Box::pin(shared.touched());
        let mut on_data = Box::pin(shared.touched_when(data));
        let synced = shared.synced();
        let driver = tokio::spawn(driver);
        let settle = || async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        };

        for e in [
            Event::Init,
            Event::InitApply(cm("a", "1", "x")),
            Event::InitApply(cm("b", "1", "x")),
        ] {
            tx.unbounded_send(Ok(e)).unwrap();
        }
        settle().await;
        assert!(!synced.is_synced(), "not before the list is complete");
        assert_eq!(
            drain(&mut touched),
            Vec::<String>::new(),
            "nothing before the list ends"
        );
        tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        settle().await;
        assert!(synced.is_synced());
        assert_eq!(shared.store().len(), 2);
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        assert_eq!(sorted(drain(&mut applied)), ["a", "b"]);
        assert_eq!(sorted(drain(&mut touched)), ["a", "b"]);
        assert_eq!(sorted(drain(&mut on_data)), ["a", "b"], "first sight always passes");

        // A change the trigger does not look at: only the unfiltered subscribers see it, and
        // all of them get the very object the store holds.
        tx.unbounded_send(Ok(Event::Apply(cm("a", "2", "x")))).unwrap();
        settle().await;
        let got = applied.next().now_or_never().flatten().unwrap();
        let stored = shared.store().get(&ObjectRef::new("a").within("ns")).unwrap();
        assert!(Arc::ptr_eq(&got, &stored), "no copy per subscriber");
        assert_eq!(drain(&mut touched), ["a"]);
        assert_eq!(drain(&mut on_data), Vec::<String>::new(), "trigger unchanged");

        tx.unbounded_send(Ok(Event::Apply(cm("a", "3", "y")))).unwrap();
        settle().await;
        assert_eq!(drain(&mut on_data), ["a"], "trigger changed");
        drain(&mut applied);
        drain(&mut touched);

        // A deletion: not "applied", but touched; the filtered subscriber sees it too (with
        // the trigger last seen: the set changed) and forgets the object, so that one
        // re-created under the same name passes again.
        tx.unbounded_send(Ok(Event::Delete(cm("b", "2", "x")))).unwrap();
        settle().await;
        assert_eq!(drain(&mut applied), Vec::<String>::new());
        assert_eq!(drain(&mut touched), ["b"]);
        assert_eq!(drain(&mut on_data), ["b"], "a deletion passes, trigger unchanged");
        assert_eq!(shared.store().len(), 1);
        tx.unbounded_send(Ok(Event::Apply(cm("b", "3", "x")))).unwrap();
        settle().await;
        assert_eq!(drain(&mut on_data), ["b"], "seen afresh after its deletion");

        // A subscriber that goes away does not stop the others.
        drop(touched);
        tx.unbounded_send(Ok(Event::Apply(cm("c", "1", "x")))).unwrap();
        settle().await;
        assert_eq!(drain(&mut applied), ["b", "c"]);
        drop(tx);
        driver.await.unwrap();
    }

    /// Objects deleted during a watch gap send no delete; the relist that follows leaves them
    /// out, and the trigger filter forgets them then.
    #[tokio::test]
    async fn a_relist_forgets_the_triggers_of_objects_gone_during_a_watch_gap() {
        let mut triggers = Triggers::default();
        let mut pass = |t: Touched<ConfigMap>| passes(&mut triggers, &t, data);
        assert!(!pass(Touched::Listing), "a marker is no object");
        for i in 0..100 {
            assert!(
                pass(Touched::Applied(Arc::new(cm(&format!("o{i}"), "1", "x")))),
                "first sight"
            );
        }
        assert!(!pass(Touched::Listed), "a marker is no object");
        // A watch gap: all but one are deleted meanwhile; the relist has only that one.
        assert!(!pass(Touched::Listing));
        assert!(
            !pass(Touched::Applied(Arc::new(cm("o7", "1", "x")))),
            "unchanged: filtered"
        );
        assert!(!pass(Touched::Listed));
        assert_eq!(triggers.len(), 1, "only the object still there is remembered");
    }
}
