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

use crate::hashing::hash_of;
use crate::text::bounded;

/// events.k8s.io rejects a note over 1 KiB, and the event is then lost.
const MAX_NOTE: usize = 1024;
/// Object names (and so event names) are at most 253 characters.
const MAX_NAME: usize = 253;

/// The name of a new event: the object's name (shortened so the whole fits) and a timestamp.
fn event_name(regarding: &str, nanos: i128) -> String {
    let suffix = format!(".{nanos:x}");
    let keep = MAX_NAME.saturating_sub(suffix.len());
    let mut end = regarding.len().min(keep);
    while !regarding.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", regarding[..end].trim_end_matches(['.', '-']))
}

/// Reasons of the events we publish.
pub(crate) mod reason {
    pub(crate) const INSTANCE_PROVISIONED: &str = "InstanceProvisioned";
    pub(crate) const INSTANCE_FAILED: &str = "InstanceFailed";
    /// Warning: the instance ran and no longer does (paused, halted or stopped by Kairon, a
    /// failed runtime, an error).
    pub(crate) const INSTANCE_NOT_RUNNING: &str = "InstanceNotRunning";
    /// Warning: Kairon reports the VM's Kairon node unreachable (`NodeUnreachable=True`).
    pub(crate) const INSTANCE_HOST_UNREACHABLE: &str = "InstanceHostUnreachable";
    /// Warning: an operator fenced the VM off its Kairon node; Kairon places it anew.
    pub(crate) const INSTANCE_FENCED: &str = "InstanceFenced";
    /// Warning: the deletion waits on Kairon's finalizer longer than the grace period.
    pub(crate) const INSTANCE_DELETION_STUCK: &str = "InstanceDeletionStuck";
    pub(crate) const INSTANCE_DELETED: &str = "InstanceDeleted";
    pub(crate) const INSTANCE_ADOPTED: &str = "InstanceAdopted";
    pub(crate) const INSTANCE_CREATE_FAILED: &str = "InstanceCreateFailed";
    pub(crate) const INSTANCE_KEPT: &str = "InstanceKept";
    /// KaironMachinePool: a member's Machine was deleted (scale-in, replacement, rollout).
    pub(crate) const MACHINE_DELETED: &str = "MachineDeleted";
    /// Warning: the pool's VMs keep failing; replacing them backs off.
    pub(crate) const BROKEN_REPLACEMENTS_BACK_OFF: &str = "BrokenReplacementsBackOff";
    /// Normal: a live migration moved the VM to another Kairon host.
    pub(crate) const INSTANCE_MIGRATED: &str = "InstanceMigrated";
    /// Warning: the VM's host no longer satisfies its failure domain's host selector.
    pub(crate) const INSTANCE_OUTSIDE_FAILURE_DOMAIN: &str = "InstanceOutsideFailureDomain";
    /// Normal: Kairon asked for the VM to be taken off a host in maintenance.
    pub(crate) const EVACUATION_REQUESTED: &str = "EvacuationRequested";
    /// Normal: the Machine was marked for remediation (or deleted) to be replaced.
    pub(crate) const REPLACEMENT_REQUESTED: &str = "ReplacementRequested";
    /// Warning: the evacuation cannot go on (no MachineHealthCheck, skip-remediation).
    pub(crate) const EVACUATION_BLOCKED: &str = "EvacuationBlocked";
    pub(crate) const CLUSTER_PROVISIONED: &str = "Provisioned";
    /// Warning: an externally managed KaironCluster's budgets cannot all be kept (a name taken,
    /// a refusal); its status, not ours to write, cannot say so.
    pub(crate) const DISRUPTION_BUDGETS_NOT_KEPT: &str = "DisruptionBudgetsNotKept";
}

/// How long an event is remembered for folding repeats into its series (client-go: 6 min).
pub(crate) const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

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

    /// Whether the event `key` repeats one published within the window; if so, counts the
    /// repeat and returns the namespace, name and new count of the event to patch.
    fn repeat(&mut self, key: u64, now: Instant) -> Option<(String, String, i32)> {
        self.sweep(now);
        match self.by_key.get_mut(&key) {
            Some(p) if now.duration_since(p.last) < SERIES_WINDOW => {
                p.count += 1;
                p.last = now;
                Some((p.namespace.clone(), p.name.clone(), p.count))
            }
            _ => None,
        }
    }

    /// Remembers a newly created event.
    fn remember(&mut self, key: u64, namespace: String, name: String, now: Instant) {
        self.by_key.insert(
            key,
            Published {
                namespace,
                name,
                count: 1,
                last: now,
            },
        );
    }
}

/// Which events are the same: same object, type, reason, action and note.
fn event_key(regarding: &ObjectReference, type_: Type, reason: &str, action: &str, note: &str) -> u64 {
    hash_of(&(
        &regarding.uid,
        &regarding.kind,
        &regarding.namespace,
        &regarding.name,
        type_ == Type::Warning,
        reason,
        action,
        note,
    ))
}

/// Where the controllers' events go: a client of their own and the reporting instance (the
/// manager's identity).
#[derive(Clone)]
pub(crate) struct EventSource {
    client: kube::Client,
    reporting_instance: String,
}

impl EventSource {
    pub fn new(client: kube::Client, reporting_instance: String) -> Self {
        EventSource {
            client,
            reporting_instance,
        }
    }

    /// The recorder of one controller.
    pub(crate) fn recorder(&self, controller: &str) -> Events {
        Events::new(self.client.clone(), controller, &self.reporting_instance)
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
        let note = bounded(&note, MAX_NOTE);
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
        let key = event_key(&regarding, type_, reason, action, &note);
        let now = Instant::now();
        let repeat = self.recent.lock().unwrap_or_else(|e| e.into_inner()).repeat(key, now);
        if let Some((namespace, name, count)) = repeat {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let body = json!({"series": {"count": count, "lastObservedTime": MicroTime(Timestamp::now())}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&body)).await?;
            return Ok(());
        }

        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let stamp = Timestamp::now();
        let name = event_name(
            regarding.name.as_deref().unwrap_or(&self.controller),
            stamp.as_nanosecond(),
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
        self.recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remember(key, namespace, name, now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regarding(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("KaironMachine".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("{name}-uid")),
            ..Default::default()
        }
    }

    #[test]
    fn event_names_fit_whatever_the_object_name() {
        let nanos = 1_700_000_000_123_456_789i128;
        assert_eq!(event_name("m1", nanos), format!("m1.{nanos:x}"));
        let long = "a".repeat(253);
        let name = event_name(&long, nanos);
        assert!(name.len() <= MAX_NAME, "{}", name.len());
        assert!(name.ends_with(&format!(".{nanos:x}")));
        // A cut that would end on a separator drops it: names must end alphanumeric.
        let dotted = format!("{}.{}", "b".repeat(233), "c".repeat(19));
        let name = event_name(&dotted, nanos);
        assert!(name.len() <= MAX_NAME && !name.contains(".."), "{name}");
    }

    #[test]
    fn the_same_event_has_the_same_key_and_any_difference_a_new_one() {
        let key =
            |name: &str, t: Type, reason: &str, note: &str| event_key(&regarding(name), t, reason, "Create", note);
        let base = key("m1", Type::Normal, "InstanceCreated", "created");
        assert_eq!(base, key("m1", Type::Normal, "InstanceCreated", "created"));
        for (what, other) in [
            ("object", key("m2", Type::Normal, "InstanceCreated", "created")),
            ("type", key("m1", Type::Warning, "InstanceCreated", "created")),
            ("reason", key("m1", Type::Normal, "InstanceFailed", "created")),
            ("note", key("m1", Type::Normal, "InstanceCreated", "created again")),
        ] {
            assert_ne!(base, other, "a different {what} is a different event");
        }
    }

    #[test]
    fn repeats_within_the_window_count_up_and_later_ones_start_a_new_event() {
        let t0 = Instant::now();
        let mut recent = Recent::default();
        assert_eq!(recent.repeat(1, t0), None, "never published");
        recent.remember(1, "ns".into(), "m1.abc".into(), t0);
        assert_eq!(
            recent.repeat(1, t0 + Duration::from_secs(1)),
            Some(("ns".into(), "m1.abc".into(), 2))
        );
        assert_eq!(
            recent.repeat(1, t0 + Duration::from_secs(2)),
            Some(("ns".into(), "m1.abc".into(), 3))
        );
        assert_eq!(recent.repeat(2, t0 + Duration::from_secs(2)), None, "another event");
        // The window counts from the last repeat.
        let last = t0 + Duration::from_secs(2);
        assert_eq!(
            recent
                .repeat(1, last + SERIES_WINDOW - Duration::from_secs(1))
                .map(|r| r.2),
            Some(4)
        );
        let after = last + SERIES_WINDOW * 3;
        assert_eq!(recent.repeat(1, after), None, "older than the window: a new event");
    }

    #[test]
    fn old_events_are_forgotten_at_most_once_a_minute() {
        let t0 = Instant::now();
        let mut recent = Recent::default();
        recent.remember(1, "ns".into(), "a".into(), t0);
        recent.remember(2, "ns".into(), "b".into(), t0 + Duration::from_secs(30));
        recent.sweep(t0);
        assert_eq!(recent.by_key.len(), 2, "young events stay");
        let t1 = t0 + SERIES_WINDOW + Duration::from_secs(1);
        recent.sweep(t1);
        assert_eq!(
            recent.by_key.keys().copied().collect::<Vec<_>>(),
            [2],
            "the event older than the window is dropped"
        );
        recent.sweep(t1 + Duration::from_secs(30));
        assert_eq!(recent.by_key.len(), 1, "no second sweep within a minute of the last");
        recent.sweep(t1 + Duration::from_secs(61));
        assert!(recent.by_key.is_empty(), "a minute later the second one goes too");
    }
}
