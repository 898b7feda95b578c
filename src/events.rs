//! Kubernetes events (events.k8s.io) for the transitions an operator cares about. One
//! [`Events`] per controller: its recorder deduplicates repeats into a series.
//!
//! Notes are built from names, phases and condition messages only, never from bootstrap data.

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
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

#[derive(Clone, Default)]
pub struct Events {
    recorder: Option<Recorder>,
}

impl Events {
    /// No events (tests that mock the API server).
    pub fn disabled() -> Self {
        Events { recorder: None }
    }

    /// `controller` becomes `reportingController`, `instance` the `reportingInstance`.
    pub fn new(client: kube::Client, controller: &str, instance: &str) -> Self {
        let reporter = Reporter {
            controller: controller.to_string(),
            instance: Some(instance.to_string()),
        };
        Events {
            recorder: Some(Recorder::new(client, reporter)),
        }
    }

    pub async fn normal<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, action: &str, note: String) {
        self.publish(obj, EventType::Normal, reason, action, note).await;
    }

    pub async fn warning<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, action: &str, note: String) {
        self.publish(obj, EventType::Warning, reason, action, note).await;
    }

    async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let Some(recorder) = &self.recorder else { return };
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        // An event is best effort: failing to record one must not fail the reconcile.
        if let Err(e) = recorder.publish(&ev, &obj.object_ref(&())).await {
            debug!(reason, error = %e, "could not publish event");
        }
    }
}
