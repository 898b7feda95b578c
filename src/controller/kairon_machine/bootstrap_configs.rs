//! The metadata of bootstrap configs, from a watch: what a machine's bootstrap data Secret is
//! checked against ([`crate::capi::bootstrap::check_config`]) without a read per machine.
//!
//! A Secret made by a bootstrap config (CABPK's KubeadmConfig, or any bootstrap provider's kind)
//! is used only once that config is seen to be the machine's. The config's owner references
//! are all that is read, so the watch is metadata-only and keeps the name, namespace, UID and
//! owner references of each config (no labels, annotations or managedFields; never the spec,
//! which may hold secrets of its own).
//!
//! A kind is watched from the first Secret one of its configs made; until its first list is
//! in, and for a config not in the cache or not yet showing the owner a check needs (the cache
//! lags behind the API server), the config is read once, as before. Only a cache that says yes
//! is believed. A kind the API server does not serve or does not let the manager list and
//! watch (an installation whose RBAC predates the watch) is not watched again: its configs are
//! read each time. At most [`MAX_KINDS`] kinds are watched.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event, watcher};
use tracing::{debug, warn};

/// How many bootstrap config kinds are watched at most (a Secret may name any kind of the
/// bootstrap group as its maker; CAPI's bootstrap providers have one or two each).
pub const MAX_KINDS: usize = 8;

type ConfigMeta = PartialObjectMeta<DynamicObject>;

/// Where the watch of one kind stands.
const LISTING: u8 = 0;
const LISTED: u8 = 1;
/// Not served, or not listable by the manager: read per config.
const UNWATCHABLE: u8 = 2;

struct Watched {
    store: Store<ConfigMeta>,
    resource: ApiResource,
    state: Arc<AtomicU8>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The watched bootstrap config kinds, by `apiVersion` and kind.
pub struct BootstrapConfigs {
    /// Where to watch; `None`: nothing is watched and every config is read (request-sequence
    /// tests).
    client: Option<Client>,
    /// The namespace the manager watches (`None`: all).
    namespace: Option<String>,
    /// How a watch reads its first list ([`crate::controller::settings::initial_lists`]).
    config: watcher::Config,
    kinds: Mutex<HashMap<(String, String), Watched>>,
}

impl BootstrapConfigs {
    /// Configs of every kind met are watched in `namespace` (all when `None`).
    pub fn watching(client: Client, namespace: Option<String>, config: watcher::Config) -> Self {
        BootstrapConfigs {
            client: Some(client),
            namespace,
            config,
            kinds: Mutex::default(),
        }
    }

    /// Nothing is watched: every check reads its config.
    pub fn not_watched() -> Self {
        BootstrapConfigs {
            client: None,
            namespace: None,
            config: watcher::Config::default(),
            kinds: Mutex::default(),
        }
    }

    /// The metadata of `made_by` (a config of namespace `ns`) from the watch of its kind, if that
    /// kind's first list is in and the config is there with `made_by`'s UID. Starts the watch
    /// of a kind met for the first time. `None` says nothing: read the config.
    pub fn cached(&self, ns: &str, made_by: &OwnerReference) -> Option<ObjectMeta> {
        let client = self.client.as_ref()?;
        if self.namespace.as_deref().is_some_and(|watched| watched != ns) {
            return None;
        }
        let key = (made_by.api_version.clone(), made_by.kind.clone());
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        let Some(watched) = kinds.get(&key) else {
            if kinds.len() < MAX_KINDS {
                let watched = self.watch(client, made_by);
                kinds.insert(key, watched);
            }
            return None;
        };
        if watched.state.load(Ordering::Relaxed) != LISTED {
            return None;
        }
        let found = watched
            .store
            .get(&ObjectRef::new_with(&made_by.name, watched.resource.clone()).within(ns))?;
        (found.metadata.uid.as_deref() == Some(made_by.uid.as_str())).then(|| found.metadata.clone())
    }

    /// Starts the watch of `made_by`'s kind.
    fn watch(&self, client: &Client, made_by: &OwnerReference) -> Watched {
        let resource = config_resource(made_by);
        let api: Api<ConfigMeta> = match &self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let writer = reflector::store::Writer::new(resource.clone());
        let store = writer.as_reader();
        let state = Arc::new(AtomicU8::new(LISTING));
        let events = watcher(api, self.config.clone())
            .default_backoff()
            .modify(keep_owners)
            .reflect(writer);
        let kind = format!("{} {}", made_by.api_version, made_by.kind);
        let task = tokio::spawn(follow(events, state.clone(), kind));
        Watched {
            store,
            resource,
            state,
            task,
        }
    }
}

/// The resource of the config `made_by` names: at the version the bootstrap provider wrote in
/// the ownerReference, under the kind's regular plural (CAPI's bootstrap configs all have one:
/// kubeadmconfigs, talosconfigs, rke2configs, ...).
pub(super) fn config_resource(made_by: &OwnerReference) -> ApiResource {
    let (group, version) = made_by
        .api_version
        .split_once('/')
        .unwrap_or(("", &made_by.api_version));
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &made_by.kind))
}

/// Drives the watch, saying when its first list is in; ends for good when the kind cannot be
/// listed or watched (not served, or forbidden).
async fn follow(
    events: impl futures::Stream<Item = Result<Event<ConfigMeta>, watcher::Error>> + Send,
    state: Arc<AtomicU8>,
    kind: String,
) {
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::InitDone) => state.store(LISTED, Ordering::Relaxed),
            Ok(_) => {}
            Err(e) if unwatchable(&e) => {
                warn!(%kind, error = %crate::text::bounded(&e.to_string(), 512),
                    "bootstrap configs of this kind cannot be watched; each is read when checked");
                state.store(UNWATCHABLE, Ordering::Relaxed);
                return;
            }
            Err(e) => {
                debug!(%kind, error = %crate::text::bounded(&e.to_string(), 512), "bootstrap config watch failed; retrying")
            }
        }
    }
}

/// A list or watch the API server refuses for good: the kind is not served, or the manager may
/// not list or watch it.
fn unwatchable(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 403 || s.code == 404,
        _ => false,
    }
}

/// What a check reads of a config: its name, namespace, UID and owner references.
fn keep_owners(meta: &mut ConfigMeta) {
    let m = &mut meta.metadata;
    m.managed_fields = None;
    m.annotations = None;
    m.labels = None;
    m.finalizers = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(kind: &str) -> OwnerReference {
        OwnerReference {
            api_version: "bootstrap.cluster.x-k8s.io/v1beta2".into(),
            kind: kind.into(),
            name: "c1".into(),
            uid: "u1".into(),
            controller: Some(true),
            ..Default::default()
        }
    }

    #[test]
    fn nothing_is_cached_when_nothing_is_watched() {
        let configs = BootstrapConfigs::not_watched();
        assert_eq!(configs.cached("ns", &owner("KubeadmConfig")), None);
        assert!(configs.kinds.lock().unwrap().is_empty());
    }

    #[test]
    fn only_metadata_a_check_reads_is_kept() {
        let mut meta: ConfigMeta = serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": "c1", "namespace": "ns", "uid": "u1",
                "labels": {"a": "b"}, "annotations": {"c": "d"}, "finalizers": ["f"],
                "managedFields": [{"manager": "m"}],
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                    "name": "m1", "uid": "mu", "controller": true}]}
        }))
        .unwrap();
        keep_owners(&mut meta);
        let m = &meta.metadata;
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref(), m.uid.as_deref()),
            (Some("c1"), Some("ns"), Some("u1"))
        );
        assert_eq!(m.owner_references.as_ref().map(Vec::len), Some(1));
        assert!(m.labels.is_none() && m.annotations.is_none() && m.finalizers.is_none() && m.managed_fields.is_none());
    }

    #[test]
    fn a_refused_or_unserved_kind_is_not_watched_again_but_other_failures_are_retried() {
        let status = |code| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            }))
        };
        assert!(unwatchable(&watcher::Error::InitialListFailed(status(403))));
        assert!(unwatchable(&watcher::Error::WatchStartFailed(status(404))));
        assert!(!unwatchable(&watcher::Error::InitialListFailed(status(500))));
        assert!(!unwatchable(&watcher::Error::InitialListFailed(status(429))));
    }
}
