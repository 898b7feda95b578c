//! What a reconciler last wrote, for the next reconcile of the same object while the cache
//! still shows the object from before that write.
//!
//! A controller's cache lags behind its own writes by a watch event. A reconcile that runs in
//! that gap (triggered, say, by the Kairon Machine changing phase) would see the old object and
//! write again what was just written: the same providerID patch, the same status, the same
//! event. [`Fresher`] remembers, per object, the resource versions a reconcile replaced and the
//! object its last write returned. When the cache still holds one of those replaced versions,
//! the written object is newer than the cache and is used instead. Resource versions are only
//! compared for equality (they are opaque): a cached version that is not one we replaced is
//! either our write or something newer, and the cache wins.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Resource;

struct Written<K> {
    /// Versions our writes replaced, oldest first.
    replaced: Vec<String>,
    /// What the last write returned.
    object: Arc<K>,
}

/// Per-object record of our last write, keyed by UID. Clones share the record.
pub struct Fresher<K> {
    written: Arc<Mutex<HashMap<String, Written<K>>>>,
}

impl<K> Default for Fresher<K> {
    fn default() -> Self {
        Fresher {
            written: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

impl<K> Clone for Fresher<K> {
    fn clone(&self) -> Self {
        Fresher {
            written: self.written.clone(),
        }
    }
}

impl<K: Resource> Fresher<K> {
    /// `cached`, or what we last wrote of it if the cache has not caught up with that yet.
    pub(crate) fn freshest(&self, cached: Arc<K>) -> Arc<K> {
        let (Some(uid), Some(rv)) = (cached.meta().uid.as_deref(), cached.meta().resource_version.as_deref()) else {
            return cached;
        };
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        match written.get(uid) {
            Some(w) if w.replaced.iter().any(|r| r == rv) => w.object.clone(),
            Some(_) => {
                // The cache caught up (or moved past us): it is the truth again.
                written.remove(uid);
                cached
            }
            None => cached,
        }
    }

    /// What we last wrote of `obj`, if that write replaced `obj`'s version; else `obj`. For a
    /// second look within one reconcile, after its own writes: unlike [`Fresher::freshest`] it
    /// never forgets the record.
    pub(crate) fn after_our_writes(&self, obj: Arc<K>) -> Arc<K> {
        let (Some(uid), Some(rv)) = (obj.meta().uid.as_deref(), obj.meta().resource_version.as_deref()) else {
            return obj;
        };
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        match written.get(uid) {
            Some(w) if w.replaced.iter().any(|r| r == rv) => w.object.clone(),
            _ => obj,
        }
    }

    /// Records that a write replaced `before` (the version it was made against, as far as we
    /// know) with `after`.
    pub(crate) fn wrote(&self, before: &K, mut after: K) {
        // As in the caches: managedFields are never read.
        after.meta_mut().managed_fields = None;
        let (Some(uid), Some(rv)) = (before.meta().uid.clone(), before.meta().resource_version.clone()) else {
            return;
        };
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let mut replaced = vec![];
        if let Some(w) = written.remove(&uid) {
            replaced = w.replaced;
            // A second write of the same reconcile also replaced the first write's result.
            replaced.extend(w.object.meta().resource_version.clone());
        }
        replaced.push(rv);
        replaced.retain(|r| after.meta().resource_version.as_ref() != Some(r));
        replaced.dedup();
        written.insert(
            uid,
            Written {
                replaced,
                object: Arc::new(after),
            },
        );
    }

    /// Follows the object's watch: an object deleted is forgotten (a record would otherwise
    /// stay for ever when the object goes without another reconcile), and a relist starts
    /// afresh (objects gone meanwhile send no delete).
    pub(crate) fn observe(&self, event: &kube::runtime::watcher::Event<K>) {
        use kube::runtime::watcher::Event;
        match event {
            Event::Delete(obj) => self.forget(obj),
            Event::Init => self.written.lock().unwrap_or_else(|e| e.into_inner()).clear(),
            _ => {}
        }
    }

    /// Forgets the object (it is gone, or we let go of it).
    pub(crate) fn forget(&self, obj: &K) {
        if let Some(uid) = obj.meta().uid.as_deref() {
            self.written.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
        }
    }

    /// Objects remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.written.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(rv: &str, data: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.uid = Some("u1".into());
        c.metadata.resource_version = Some(rv.into());
        c.data = Some([("k".to_string(), data.to_string())].into());
        c
    }

    fn data(c: &ConfigMap) -> &str {
        &c.data.as_ref().unwrap()["k"]
    }

    #[test]
    fn a_stale_cache_gives_way_to_our_writes_until_it_catches_up() {
        let f = Fresher::<ConfigMap>::default();
        let cached = Arc::new(cm("1", "old"));
        assert_eq!(data(&f.freshest(cached.clone())), "old", "nothing written yet");

        // Two writes in one reconcile: 1 -> 2 -> 3.
        f.wrote(&*cached, cm("2", "finalizer"));
        f.wrote(&*cached, cm("3", "status"));
        assert_eq!(data(&f.freshest(cached.clone())), "status", "cache at 1: stale");
        assert_eq!(
            data(&f.freshest(Arc::new(cm("2", "finalizer")))),
            "status",
            "cache at 2: stale"
        );
        assert_eq!(f.len(), 1);

        // The cache reaches our write: it wins, and the record is dropped.
        assert_eq!(data(&f.freshest(Arc::new(cm("3", "status")))), "status");
        assert!(f.is_empty());
        assert_eq!(data(&f.freshest(cached.clone())), "old", "no record left");
    }

    #[test]
    fn a_newer_write_by_someone_else_wins_over_ours() {
        let f = Fresher::<ConfigMap>::default();
        let cached = Arc::new(cm("1", "old"));
        f.wrote(&*cached, cm("2", "ours"));
        assert_eq!(data(&f.freshest(Arc::new(cm("7", "theirs")))), "theirs");
        assert!(f.is_empty());
    }

    #[test]
    fn records_go_with_the_object_and_with_a_relist() {
        use kube::runtime::watcher::Event;
        let f = Fresher::<ConfigMap>::default();
        let watch = f.clone();
        let cached = Arc::new(cm("1", "old"));
        f.wrote(&*cached, cm("2", "ours"));
        watch.observe(&Event::Apply(cm("1", "old")));
        assert_eq!(f.len(), 1, "an update keeps it");
        watch.observe(&Event::Delete(cm("1", "old")));
        assert!(f.is_empty(), "deleted: forgotten, by any clone");
        f.wrote(&*cached, cm("2", "ours"));
        watch.observe(&Event::Init);
        assert!(f.is_empty(), "relist: forgotten");
    }

    #[test]
    fn forget_drops_the_record() {
        let f = Fresher::<ConfigMap>::default();
        let cached = Arc::new(cm("1", "old"));
        f.wrote(&*cached, cm("2", "ours"));
        f.forget(&cached);
        assert_eq!(data(&f.freshest(cached)), "old");
    }
}
