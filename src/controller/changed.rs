//! Which objects of a watch changed: the last trigger value seen of each object (a hash of
//! what its subscriber reacts to), so that an object passes on only when that changed, when it
//! is new, when it is deleted (the set of objects changed), or when it has no trigger. Used by
//! the shared caches' subscribers (`caches::Shared::touched_when`) and by a watch of its own
//! ([`changed_objects`]).

use std::collections::HashMap;

use futures::{Stream, StreamExt, future};
use kube::Resource;
use kube::runtime::watcher::{self, Event};

/// The objects of a watch's events whose `trigger` differs from the last one seen of the same
/// object, as `caches::Shared::touched_when` passes them on, for a watch that is not shared: kube's
/// `predicate_filter` keeps the whole `ObjectRef` (name, namespace, UID and resourceVersion
/// strings) and a time per object (0.2 KiB a Machine, measured); this keeps 16 bytes, and drops an
/// object's entry when it is deleted or a full list no longer has it.
pub(crate) fn changed_objects<K, S, F>(events: S, trigger: F) -> impl Stream<Item = Result<K, watcher::Error>>
where
    K: Resource,
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
    F: Fn(&K) -> Option<u64>,
{
    let mut last = Triggers::default();
    events.filter_map(move |e| {
        future::ready(match e {
            Err(err) => Some(Err(err)),
            Ok(Event::Init) => {
                last.listing();
                None
            }
            Ok(Event::InitDone) => {
                last.listed();
                None
            }
            Ok(Event::InitApply(o) | Event::Apply(o)) => last.seen(&o, false, &trigger).then_some(Ok(o)),
            Ok(Event::Delete(o)) => last.seen(&o, true, &trigger).then_some(Ok(o)),
        })
    })
}

/// A trigger value, and the full list it was last seen in.
type Seen = (u64, u64);

/// The last trigger value seen per object, and the full list it was last seen in (an object
/// not passed on by the latest full list is gone).
#[derive(Default)]
pub(crate) struct Triggers {
    /// By a hash of namespace, name and UID (an entry is 16 bytes: at thousands of Machines the
    /// strings of the key were most of the filter's weight): the trigger value and the full
    /// list it was last seen in.
    last: HashMap<u64, Seen>,
    /// Full lists begun.
    lists: u64,
}

impl Triggers {
    /// A full list begins.
    pub(crate) fn listing(&mut self) {
        self.lists += 1;
    }

    /// A full list ended: what it did not pass on is gone.
    pub(crate) fn listed(&mut self) {
        let list = self.lists;
        self.last.retain(|_, (_, seen)| *seen == list);
    }

    /// Whether `obj`'s trigger differs from the last one seen of it (or it has none, is new, or
    /// is `deleted`: a subscriber that counts or lists the objects must see one go, even if
    /// what it reacts to of it had not changed since).
    pub(crate) fn seen<K: Resource>(&mut self, obj: &K, deleted: bool, trigger: impl Fn(&K) -> Option<u64>) -> bool {
        let meta = obj.meta();
        let key = || crate::hashing::hash_of(&(&meta.namespace, &meta.name, &meta.uid));
        if deleted {
            self.last.remove(&key());
            return true;
        }
        let Some(value) = trigger(obj) else {
            return true;
        };
        let before = self.last.insert(key(), (value, self.lists));
        before.map(|(v, _)| v) != Some(value)
    }

    /// Objects remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.last.len()
    }
}

/// Objects and a trigger for the tests of the filter and of the shared caches.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    /// A ConfigMap `name` at resourceVersion `rv` whose one value is `data`.
    pub(crate) fn cm(name: &str, rv: &str, data: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some(format!("{name}-uid"));
        c.metadata.resource_version = Some(rv.into());
        c.data = Some([("k".to_string(), data.to_string())].into());
        c
    }

    /// The trigger: a hash of the data.
    pub(crate) fn data(c: &ConfigMap) -> Option<u64> {
        Some(crate::hashing::hash_of(&c.data))
    }

    #[tokio::test]
    async fn a_watchs_objects_pass_when_their_trigger_changed_or_they_are_new() {
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(cm("a", "1", "x"))),
            Ok(Event::InitApply(cm("gap", "1", "x"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(cm("a", "2", "x"))),
            Ok(Event::Apply(cm("a", "3", "y"))),
            Ok(Event::Delete(cm("a", "4", "y"))),
            Ok(Event::Apply(cm("a", "5", "y"))),
            // Relisted: "gap" went during the gap, "a" is unchanged.
            Ok(Event::Init),
            Ok(Event::InitApply(cm("a", "5", "y"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(cm("gap", "9", "x"))),
        ];
        let passed: Vec<String> = changed_objects(futures::stream::iter(events), data)
            .map(|r| {
                let c = r.unwrap();
                format!("{}@{}", c.metadata.name.unwrap(), c.metadata.resource_version.unwrap())
            })
            .collect()
            .await;
        assert_eq!(
            passed,
            [
                "a@1",   // new
                "gap@1", // new
                "a@3",   // data changed; a@2 did not
                "a@4",   // deleted, with the data seen last: passes, and is forgotten
                "a@5",   // after its deletion, new again
                "gap@9", // the relist no longer had it: new again
            ]
        );
    }
}
