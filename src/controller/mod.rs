//! The three reconcilers and what they share.
//!
//! - [`kairon_machine`] (a folder: the reconcile workflow, the status mapping, the watches),
//!   [`kairon_cluster`], [`kairon_machine_template`]: one reconciler each;
//! - [`runtime`]: what runs them — cache readiness, the first steps of every reconcile (caches,
//!   owning Cluster, pause), a span and metrics per reconcile, the error policy;
//! - `identity_protection`: what keeps an identity (`spec.identityRef`) until its cluster's
//!   VMs are gone, and takes it along on `clusterctl move`;
//! - `write` and `fresh`: every write a reconciler makes, and the record of it for the next
//!   reconcile;
//! - [`Error`]: what can fail, by stage.

pub(crate) mod caches;
pub mod endpoints;
mod error;
mod fresh;
pub(crate) mod identity_protection;
pub mod kairon_cluster;
pub mod kairon_machine;
pub(crate) mod kairon_machine_template;
pub(crate) mod runtime;
mod write;

use std::fmt::Debug;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::capi::WATCH_FILTER_LABEL;

pub use endpoints::Endpoints;
pub use error::Error;
pub use fresh::Fresher;
pub use runtime::Synced;
pub(crate) use runtime::{CacheReadiness, Telemetry};

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
    pub(crate) fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }

    /// Watch configuration for CAPI objects and ours: the watch filter, if any.
    ///
    /// Lists are paged (500 objects a page) and consistent. The "any" semantic (resourceVersion
    /// 0, served from the API server's watch cache) would ignore the page size and answer with
    /// every object in one response: at a restart with thousands of machines, tens of MB of
    /// JSON held and parsed at once, most of the manager's peak memory.
    pub(crate) fn watcher_config(&self) -> watcher::Config {
        let wc = watcher::Config::default();
        match &self.watch_filter {
            Some(v) => wc.labels(&format!("{WATCH_FILTER_LABEL}={v}")),
            None => wc,
        }
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
