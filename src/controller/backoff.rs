//! Per-object backoff of failed reconciles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::ResourceExt;

/// Per-object exponential backoff after failed reconciles, as controller-runtime's default
/// rate limiter does: an object that keeps failing (a create Kairon rejects, an API that is
/// down) is retried ever more rarely, up to [`Backoff::CAP`], while other objects are not
/// slowed; its first success resets it.
#[derive(Clone, Default)]
pub(crate) struct Backoff {
    failures: Arc<Mutex<HashMap<String, u32>>>,
}

impl Backoff {
    const BASE: Duration = Duration::from_millis(500);
    const CAP: Duration = Duration::from_secs(300);

    /// The wait after the `failures`-th failure in a row (1-based).
    fn delay(failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(20));
        Self::BASE.saturating_mul(factor).min(Self::CAP)
    }

    fn key<K: ResourceExt>(obj: &K) -> String {
        format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
    }

    /// Counts a failure of `obj`; returns how long to wait before the next try.
    pub(crate) fn failed<K: ResourceExt>(&self, obj: &K) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(Self::key(obj)).or_default();
        *n = n.saturating_add(1);
        Self::delay(*n)
    }

    pub(crate) fn succeeded<K: ResourceExt>(&self, obj: &K) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if !failures.is_empty() {
            failures.remove(&Self::key(obj));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_failure_up_to_the_cap_and_resets_on_success() {
        let s = Duration::from_secs_f64;
        assert_eq!(
            (1..=6).map(Backoff::delay).collect::<Vec<_>>(),
            [s(0.5), s(1.0), s(2.0), s(4.0), s(8.0), s(16.0)]
        );
        assert_eq!(Backoff::delay(10), s(256.0));
        assert_eq!(Backoff::delay(11), Backoff::CAP);
        assert_eq!(Backoff::delay(u32::MAX), Backoff::CAP, "no overflow");

        let backoff = Backoff::default();
        let mut a = k8s_openapi::api::core::v1::ConfigMap::default();
        a.metadata.name = Some("a".into());
        a.metadata.namespace = Some("ns".into());
        let mut b = a.clone();
        b.metadata.name = Some("b".into());
        assert_eq!(backoff.failed(&a), s(0.5));
        assert_eq!(backoff.failed(&a), s(1.0));
        assert_eq!(backoff.failed(&b), s(0.5), "per object");
        backoff.succeeded(&a);
        assert_eq!(backoff.failed(&a), s(0.5), "a success resets it");
    }
}
