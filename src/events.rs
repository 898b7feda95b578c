//! Kubernetes events (events.k8s.io/v1) for the transitions an operator cares about. One
//! [`Events`] per controller.
//!
//! Repeats are folded into a series, as client-go's recorder does: an event equal to one
//! published in the last [`SERIES_WINDOW`] patches that event's `series` instead of creating a
//! new object. What is remembered for that is small on purpose (a hash, the event's name and
//! a count: about 100 bytes per event, not the whole event object), so that a manager with
//! thousands of machines does not hold thousands of events in memory.
//!
//! Notes are built from names, phases and condition messages only, never from bootstrap data.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tracing::debug;

/// Reasons of the events we publish.
pub mod reason {
    pub const INSTANCE_CREATED: &str = "InstanceCreated";
    pub const INSTANCE_PROVISIONED: &str = "InstanceProvisioned";
    pub const INSTANCE_FAILED: &str = "InstanceFailed";
    pub const INSTANCE_DELETED: &str = "InstanceDeleted";
    pub const INSTANCE_ADOPTED: &str = "InstanceAdopted";
    pub const CLUSTER_PROVISIONED: &str = "Provisioned";
}

/// How long an event is remembered for folding repeats into its series (client-go: 6 min).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Type {
    Normal,
    Warning,
}

/// An event published recently: enough to patch its series.
struct Published {
    namespace: String,
    name: String,
    count: i32,
    last: Instant,
}

struct Recorder {
    client: kube::Client,
    controller: String,
    instance: String,
    recent: Mutex<Recent>,
}

#[derive(Default)]
struct Recent {
    by_key: HashMap<u64, Published>,
    last_sweep: Option<Instant>,
}

impl Recent {
    /// Drops what is older than the window, at most once a minute (not on every event).
    fn sweep(&mut self, now: Instant) {
        if self
            .last_sweep
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(60))
        {
            return;
        }
        self.last_sweep = Some(now);
        self.by_key.retain(|_, p| now.duration_since(p.last) < SERIES_WINDOW);
    }
}

#[derive(Clone, Default)]
pub struct Events {
    recorder: Option<std::sync::Arc<Recorder>>,
}

impl Events {
    /// No events (tests that mock the API server).
    pub fn disabled() -> Self {
        Events { recorder: None }
    }

    /// `controller` becomes `reportingController`, `instance` the `reportingInstance`.
    pub fn new(client: kube::Client, controller: &str, instance: &str) -> Self {
        Events {
            recorder: Some(std::sync::Arc::new(Recorder {
                client,
                controller: controller.to_string(),
                instance: instance.to_string(),
                recent: Mutex::new(Recent::default()),
            })),
        }
    }

    pub async fn normal<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, action: &str, note: String) {
        self.publish(obj, Type::Normal, reason, action, note).await;
    }

    pub async fn warning<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, action: &str, note: String) {
        self.publish(obj, Type::Warning, reason, action, note).await;
    }

    /// Events remembered for series (for tests).
    pub fn remembered(&self) -> usize {
        self.recorder
            .as_ref()
            .map(|r| r.recent.lock().unwrap_or_else(|e| e.into_inner()).by_key.len())
            .unwrap_or(0)
    }

    async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: Type,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let Some(r) = &self.recorder else { return };
        let regarding = obj.object_ref(&());
        // An event is best effort: failing to record one must not fail the reconcile.
        if let Err(e) = r.publish(regarding, type_, reason, action, note).await {
            debug!(reason, error = %e, "could not publish event");
        }
    }
}

impl Recorder {
    async fn publish(
        &self,
        regarding: ObjectReference,
        type_: Type,
        reason: &str,
        action: &str,
        note: String,
    ) -> Result<(), kube::Error> {
        let key = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (
                &regarding.uid,
                &regarding.kind,
                &regarding.namespace,
                &regarding.name,
                type_ == Type::Warning,
                reason,
                action,
                &note,
            )
                .hash(&mut h);
            h.finish()
        };
        let now = Instant::now();
        let repeat = {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            recent.sweep(now);
            match recent.by_key.get_mut(&key) {
                Some(p) if now.duration_since(p.last) < SERIES_WINDOW => {
                    p.count += 1;
                    p.last = now;
                    Some((p.namespace.clone(), p.name.clone(), p.count))
                }
                _ => None,
            }
        };
        if let Some((namespace, name, count)) = repeat {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let body = json!({"series": {"count": count, "lastObservedTime": MicroTime(Timestamp::now())}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&body)).await?;
            return Ok(());
        }

        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let stamp = Timestamp::now();
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or(&self.controller),
            stamp.as_nanosecond()
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(stamp)),
            action: Some(action.into()),
            reason: Some(reason.into()),
            note: Some(note),
            regarding: Some(regarding),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(
                match type_ {
                    Type::Normal => "Normal",
                    Type::Warning => "Warning",
                }
                .into(),
            ),
            series: None::<EventSeries>,
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &event).await?;
        self.recent.lock().unwrap_or_else(|e| e.into_inner()).by_key.insert(
            key,
            Published {
                namespace,
                name,
                count: 1,
                last: now,
            },
        );
        Ok(())
    }
}
