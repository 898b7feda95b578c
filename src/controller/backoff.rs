//! Per-object backoff of failed reconciles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

/// Per-object exponential backoff after failed reconciles, as controller-runtime's default
/// rate limiter does: an object that keeps failing (a create Kairon rejects, an API that is
/// down) is retried ever more rarely, up to [`Backoff::CAP`], while other objects are not
/// slowed; its first success resets it.
///
/// An object deleted while failing never succeeds, and one deleted during a watch gap sends
/// no delete: so the record is keyed by UID (an object re-created under the same name starts
/// afresh), and swept against the controller's cache whenever it has doubled since the last
/// sweep (an object the cache no longer has, with that UID, is forgotten). It thus holds at
/// most about twice the objects that are failing now.
#[derive(Clone)]
pub(crate) struct Backoff<K: Resource<DynamicType = ()> + Clone + 'static> {
    failures: Arc<Mutex<Failures>>,
    cache: Store<K>,
}

#[derive(Default)]
struct Failures {
    /// Failures in a row, by object.
    by_object: HashMap<ObjectKey, u32>,
    /// How many objects the last sweep left.
    after_sweep: usize,
}

/// Namespace, name and UID.
type ObjectKey = (Option<String>, String, String);

impl<K: Resource<DynamicType = ()> + Clone + 'static> Backoff<K> {
    const BASE: Duration = Duration::from_millis(500);
    const CAP: Duration = Duration::from_secs(300);
    /// Size of the record under which it is never swept.
    const SWEEP_AFTER: usize = 64;

    /// The backoff of the objects of the controller whose cache is `cache`.
    pub(crate) fn new(cache: Store<K>) -> Self {
        Backoff {
            failures: Arc::default(),
            cache,
        }
    }

    /// The wait after the `failures`-th failure in a row (1-based).
    fn delay(failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(20));
        Self::BASE.saturating_mul(factor).min(Self::CAP)
    }

    fn key(obj: &K) -> ObjectKey {
        (obj.namespace(), obj.name_any(), obj.uid().unwrap_or_default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Failures> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a failure of `obj`; returns how long to wait before the next try.
    pub(crate) fn failed(&self, obj: &K) -> Duration {
        let mut failures = self.lock();
        let n = failures.by_object.entry(Self::key(obj)).or_default();
        *n = n.saturating_add(1);
        let delay = Self::delay(*n);
        if failures.by_object.len() > Self::SWEEP_AFTER.max(2 * failures.after_sweep) {
            failures.by_object.retain(|(ns, name, uid), _| {
                let r = ObjectRef::new(name);
                let r = match ns {
                    Some(ns) => r.within(ns),
                    None => r,
                };
                self.cache.get(&r).is_some_and(|o| o.uid().as_ref() == Some(uid))
            });
            failures.after_sweep = failures.by_object.len();
        }
        delay
    }

    /// Objects remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_object.len()
    }

    pub(crate) fn succeeded(&self, obj: &K) {
        let mut failures = self.lock();
        if !failures.by_object.is_empty() {
            failures.by_object.remove(&Self::key(obj));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    type Delays = Backoff<ConfigMap>;

    fn cm(name: &str, uid: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some(uid.into());
        c
    }

    #[test]
    fn backoff_doubles_per_failure_up_to_the_cap_and_resets_on_success() {
        let s = Duration::from_secs_f64;
        assert_eq!(
            (1..=6).map(Delays::delay).collect::<Vec<_>>(),
            [s(0.5), s(1.0), s(2.0), s(4.0), s(8.0), s(16.0)]
        );
        assert_eq!(Delays::delay(10), s(256.0));
        assert_eq!(Delays::delay(11), Delays::CAP);
        assert_eq!(Delays::delay(u32::MAX), Delays::CAP, "no overflow");

        let backoff = Backoff::new(reflector::store().0);
        let (a, b) = (cm("a", "a-1"), cm("b", "b-1"));
        assert_eq!(backoff.failed(&a), s(0.5));
        assert_eq!(backoff.failed(&a), s(1.0));
        assert_eq!(backoff.failed(&b), s(0.5), "per object");
        backoff.succeeded(&a);
        assert_eq!(backoff.failed(&a), s(0.5), "a success resets it");
    }

    /// An object deleted while it kept failing leaves nothing behind: one re-created under
    /// the same name starts afresh, and the record does not grow with objects that are gone.
    #[test]
    fn objects_gone_while_failing_are_forgotten() {
        let s = Duration::from_secs_f64;
        let (cache, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        let backoff = Backoff::new(cache.clone());

        let old = cm("a", "a-1");
        writer.apply_watcher_event(&Event::Apply(old.clone()));
        for _ in 0..5 {
            backoff.failed(&old);
        }
        writer.apply_watcher_event(&Event::Delete(old));
        let new = cm("a", "a-2");
        writer.apply_watcher_event(&Event::Apply(new.clone()));
        assert_eq!(
            backoff.failed(&new),
            s(0.5),
            "a new object of the same name starts afresh"
        );

        // A thousand objects each fail and go (deleted, or during a watch gap: the cache no
        // longer has them either way) while one object stays and keeps failing.
        for i in 0..1000 {
            let gone = cm(&format!("gone-{i}"), &format!("gone-{i}-uid"));
            writer.apply_watcher_event(&Event::Apply(gone.clone()));
            backoff.failed(&gone);
            writer.apply_watcher_event(&Event::Delete(gone));
        }
        assert!(
            backoff.len() <= 2 * Delays::SWEEP_AFTER,
            "{} objects remembered, {} of them still exist",
            backoff.len(),
            cache.len()
        );
        assert_eq!(backoff.failed(&new), s(1.0), "an object still there keeps its count");
    }
}
