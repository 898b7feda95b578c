//! The periodic resync of every object, without a timer per object.
//!
//! `--sync-period` promises that each object is reconciled again at least once a period, as
//! controller-runtime's does. A reconcile returning `Action::requeue(period)` keeps that
//! promise with one entry per object in kube-runtime's scheduler (its queue and its map,
//! about 1 KiB per machine at N=2000, the largest share of the heap after the caches). The
//! wheel keeps it with none: the period is cut into slots (one a second, at most 3,600), each
//! object has the slot its name and namespace hash to, and at each slot's turn the objects of
//! the cache in that slot are triggered. Resyncs are spread evenly over the period, as the
//! per-object timers were once the objects' creations were; an object created or changed just
//! before its slot's turn is reconciled again sooner than a period, never later.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};

use super::runtime::key_of;

/// At most this many slots: a period of hours turns once every few seconds.
const MAX_SLOTS: u64 = 3_600;

/// How a period is cut: the number of slots, and how long each lasts.
fn slots(period: Duration) -> (u64, Duration) {
    let n = period.as_secs().clamp(1, MAX_SLOTS);
    let n32 = u32::try_from(n).unwrap_or(u32::MAX);
    (n, period / n32)
}

/// The slot of the object named `name` in `namespace`, of `n`: the same in every process (the
/// hasher has fixed keys), so a restart keeps each object's turn.
fn slot_of(namespace: Option<&str>, name: &str, n: u64) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    namespace.hash(&mut h);
    name.hash(&mut h);
    h.finish() % n.max(1)
}

/// The objects of `store` to resync, each once every `period`, for as long as the stream is
/// polled.
pub(crate) fn wheel<K>(store: Store<K>, period: Duration) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let (n, tick) = slots(period);
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
    // A slow turn (a busy runtime) is not made up for in a burst: the next one waits a tick.
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    futures::stream::unfold((interval, 0u64), move |(mut interval, turn)| {
        let store = store.clone();
        async move {
            interval.tick().await;
            let due: Vec<ObjectRef<K>> = store
                .state()
                .iter()
                .filter(|obj| {
                    let meta = obj.meta();
                    slot_of(meta.namespace.as_deref(), meta.name.as_deref().unwrap_or_default(), n) == turn
                })
                .map(|obj| key_of(obj.as_ref()))
                .collect();
            Some((futures::stream::iter(due), (interval, (turn + 1) % n)))
        }
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::KaironMachine;
    use kube::runtime::watcher;

    #[test]
    fn a_period_is_cut_into_seconds_up_to_an_hour_of_them() {
        assert_eq!(slots(Duration::from_secs(600)), (600, Duration::from_secs(1)));
        assert_eq!(slots(Duration::from_millis(500)), (1, Duration::from_millis(500)));
        assert_eq!(slots(Duration::from_secs(36_000)), (3_600, Duration::from_secs(10)));
    }

    #[test]
    fn objects_spread_over_the_slots() {
        let n = 60;
        let mut per_slot = vec![0u32; 60];
        for i in 0..6_000 {
            per_slot[slot_of(Some("ns"), &format!("machine-{i}"), n) as usize] += 1;
        }
        // 100 a slot on average; none empty, none with more than twice its share.
        assert!(per_slot.iter().all(|&c| c > 0 && c < 200), "{per_slot:?}");
        assert_eq!(slot_of(Some("ns"), "m", n), slot_of(Some("ns"), "m", n));
    }

    #[tokio::test(start_paused = true)]
    async fn every_object_is_triggered_once_a_period() {
        let (store, mut writer) = kube::runtime::reflector::store::<KaironMachine>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for i in 0..50 {
            let mut km = KaironMachine::new(&format!("km-{i}"), Default::default());
            km.metadata.namespace = Some("ns".into());
            km.metadata.uid = Some(format!("uid-{i}"));
            writer.apply_watcher_event(&watcher::Event::InitApply(km));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let period = Duration::from_secs(10);
        let mut wheel = std::pin::pin!(wheel(store, period));
        // Two periods, and half a slot for the last turn.
        let end = tokio::time::Instant::now() + period * 2 + Duration::from_millis(500);
        let mut seen = std::collections::BTreeMap::<String, u32>::new();
        while let Ok(Some(key)) = tokio::time::timeout_at(end, wheel.next()).await {
            assert!(key.extra.uid.is_none(), "keys carry no uid");
            *seen.entry(key.name).or_default() += 1;
        }
        assert_eq!(seen.len(), 50, "every object: {seen:?}");
        assert!(seen.values().all(|&c| c == 2), "twice in two periods: {seen:?}");
    }
}
