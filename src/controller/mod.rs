//! The three reconcilers and what they share: settings, errors, and the few write helpers
//! (finalizers with optimistic concurrency, status by server-side apply).

pub mod fresh;
pub mod kairon_cluster;
pub mod kairon_machine;
pub mod kairon_machine_template;
mod write;

use std::fmt::Debug;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::capi::WATCH_FILTER_LABEL;

pub use write::FIELD_MANAGER;

/// How the manager was asked to run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch only this namespace (all namespaces when `None`).
    pub namespace: Option<String>,
    /// Reconcile only objects labelled `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// Safety-net resync of every object; events do the real work.
    pub sync_period: Duration,
    /// Largest bootstrap payload accepted.
    pub max_bootstrap_data_bytes: usize,
    /// Reconciles run at once, per controller.
    pub machine_concurrency: u16,
    pub cluster_concurrency: u16,
    pub template_concurrency: u16,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            namespace: None,
            watch_filter: None,
            sync_period: Duration::from_secs(600),
            max_bootstrap_data_bytes: crate::capi::bootstrap::DEFAULT_MAX_BOOTSTRAP_DATA_BYTES,
            machine_concurrency: 10,
            cluster_concurrency: 10,
            template_concurrency: 2,
        }
    }
}

impl Settings {
    /// An `Api` over all namespaces, or over the one we were scoped to.
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }

    /// Watch configuration for CAPI objects and ours: the watch filter, if any.
    pub fn watcher_config(&self) -> watcher::Config {
        let wc = watcher::Config::default().any_semantic();
        match &self.watch_filter {
            Some(v) => wc.labels(&format!("{WATCH_FILTER_LABEL}={v}")),
            None => wc,
        }
    }
}

/// Errors of one reconcile, by the stage they happened in. Messages never contain bootstrap
/// data: API answers to requests that carried it are reduced to their code and reason.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("object has no namespace")]
    MissingNamespace,
    #[error("caches are not available: {0}")]
    Cache(String),
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing {what}: {source}")]
    Write {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating Kairon Machine {name}: {detail}")]
    CreateInstance { name: String, detail: String },
    #[error("deleting Kairon Machine {name}: {source}")]
    DeleteInstance {
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// A short label for metrics and logs.
    pub fn stage(&self) -> &'static str {
        match self {
            Error::MissingNamespace => "validate",
            Error::Cache(_) => "cache",
            Error::Read { .. } => "read",
            Error::Write { .. } => "write",
            Error::CreateInstance { .. } => "create_instance",
            Error::DeleteInstance { .. } => "delete_instance",
        }
    }

    pub(crate) fn read(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Read { what, source }
    }

    pub(crate) fn write(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Write { what, source }
    }
}

/// Whether an API error is a 404.
pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

/// That a cache has done its first full list, for any number of waiters.
///
/// kube's `Store::wait_until_ready` keeps one waker: of several tasks waiting at once, only the
/// last one polled is woken, and the others (possibly the controller runtime itself, which
/// waits on its main store) hang for ever. So each store gets exactly one waiter, the task
/// started here, and everyone else waits on this watch channel. Controllers' main stores are
/// never given to it: the runtime already waits on them.
#[derive(Clone, Debug)]
pub struct Synced(tokio::sync::watch::Receiver<bool>);

impl Synced {
    /// Starts the one waiter of `store`. Call once per store.
    pub fn of<K>(store: &kube::runtime::reflector::Store<K>) -> Synced
    where
        K: kube::Resource + Clone + Send + Sync + 'static,
        K::DynamicType: std::hash::Hash + Eq + Clone + Send + Sync,
    {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let store = store.clone();
        tokio::spawn(async move {
            if store.wait_until_ready().await.is_ok() {
                let _ = tx.send(true);
                tracing::debug!(cache = std::any::type_name::<K>(), "cache synced");
            }
        });
        Synced(rx)
    }

    /// Already synced (for tests that fill stores by hand).
    pub fn ready() -> Synced {
        Synced(tokio::sync::watch::channel(true).1)
    }

    pub fn is_synced(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits for the first full list.
    pub async fn wait(&self) -> Result<(), Error> {
        let mut rx = self.0.clone();
        rx.wait_for(|synced| *synced)
            .await
            .map(|_| ())
            .map_err(|_| Error::Cache("a cache stopped before its first list".into()))
    }

    /// Waits for all of `caches`.
    pub async fn all(caches: &[Synced]) -> Result<(), Error> {
        for c in caches {
            c.wait().await?;
        }
        Ok(())
    }
}

/// How long to wait after an error before trying the object again.
pub(crate) const ERROR_REQUEUE: Duration = Duration::from_secs(15);

/// Logs what the controller runtime reports after each reconcile (errors are already logged by
/// [`error_policy`]; these are the runtime's own, e.g. an object gone before its reconcile).
pub(crate) async fn log_outcome<K: kube::Resource, E: std::fmt::Display>(
    res: Result<
        (
            kube::runtime::reflector::ObjectRef<K>,
            kube::runtime::controller::Action,
        ),
        E,
    >,
) {
    match res {
        Ok((obj, _)) => tracing::debug!(%obj, "reconciled"),
        Err(e) => tracing::debug!(error = %e, "reconcile not run"),
    }
}

/// Every controller's error policy: log where it failed, try again a little later.
pub fn error_policy<K: kube::ResourceExt, C>(
    obj: std::sync::Arc<K>,
    error: &Error,
    _ctx: std::sync::Arc<C>,
) -> kube::runtime::controller::Action {
    tracing::warn!(name = %obj.name_any(), namespace = ?obj.namespace(), stage = error.stage(), %error, "reconcile failed");
    kube::runtime::controller::Action::requeue(ERROR_REQUEUE)
}

/// Drops what the caches never need: managedFields are most of an object's size.
pub(crate) fn strip_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// For caches of objects we only read a few labels of (CAPI Machines, the KaironMachine
/// membership of a cluster): managedFields, annotations, owner references, finalizers and every
/// label but `keep` go before the object is stored. At thousands of machines this is most of
/// what such a cached object weighs.
pub(crate) fn keep_only_labels<K: Resource>(obj: &mut K, keep: &[&str]) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
    meta.owner_references = None;
    meta.finalizers = None;
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|k, _| keep.contains(&k.as_str()));
    }
}

/// Deserializable resources with a static type.
pub(crate) trait StaticResource:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + serde::Serialize + Send + Sync + 'static
{
}
impl<K> StaticResource for K where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + serde::Serialize + Send + Sync + 'static
{
}
