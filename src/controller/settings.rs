//! How the manager was asked to run ([`Settings`]) and how its watches read the initial state.

use std::fmt::Debug;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::capi::WATCH_FILTER_LABEL;

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
    pub pool_concurrency: u16,
    /// Initial lists of the management API server come as a stream of watch events
    /// (`sendInitialEvents`, see [`streams_initial_lists`]), else as pages.
    pub streaming_lists: bool,
    /// The same for the Kairon API server of the manager (`--kairon-kubeconfig`).
    pub kairon_streaming_lists: bool,
    /// Seconds after which the API server ends a watch of the manager's Kairon API: set when
    /// its client has a read timeout (`--kairon-kubeconfig`), so that a quiet watch never
    /// meets it.
    pub kairon_watch_timeout: Option<u32>,
    /// How long a VM may stay on a cordoned Kairon node before its Machine is replaced through
    /// CAPI: the time an operator has to migrate it live instead.
    pub evacuation_grace_period: Duration,
    /// How long the deletion of a Kairon Machine may wait on Kairon's finalizers (kairon-node's
    /// `runtime-cleanup` above all) before the KaironMachine says it is stuck.
    pub kairon_deletion_grace_period: Duration,
}

/// [`Settings::evacuation_grace_period`] by default.
pub const EVACUATION_GRACE_PERIOD: Duration = Duration::from_secs(60);

/// [`Settings::kairon_deletion_grace_period`] by default.
pub const KAIRON_DELETION_GRACE_PERIOD: Duration = Duration::from_secs(300);

/// KaironMachinePools reconciled at once.
pub(crate) const POOL_CONCURRENCY: u16 = 5;

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
            pool_concurrency: POOL_CONCURRENCY,
            streaming_lists: false,
            kairon_streaming_lists: false,
            kairon_watch_timeout: None,
            evacuation_grace_period: EVACUATION_GRACE_PERIOD,
            kairon_deletion_grace_period: KAIRON_DELETION_GRACE_PERIOD,
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

    /// Watch configuration for CAPI objects and ours: the watch filter, if any, and how the
    /// initial state is read ([`initial_lists`]).
    pub(crate) fn watcher_config(&self) -> watcher::Config {
        let wc = initial_lists(self.streaming_lists);
        match &self.watch_filter {
            Some(v) => wc.labels(&format!("{WATCH_FILTER_LABEL}={v}")),
            None => wc,
        }
    }
}

/// How a watch reads the initial state: streamed when the API server can (`streaming`), else
/// in consistent pages of 500.
///
/// After a restart with thousands of machines, the initial lists are the manager's peak of
/// memory: a page is held as one response and parsed whole, managedFields and (for Kairon
/// Machines) bootstrap payloads included, before anything is dropped from it, and the
/// Machine, KaironMachine and Kairon Machine lists run at once. Streamed, the API server sends
/// the initial state as one watch event per object, each parsed and trimmed alone, in one
/// request per watch. (The "any" list semantic, resourceVersion 0 served from the watch cache,
/// would be worse than pages: it ignores the page size and answers with every object at once.)
pub(crate) fn initial_lists(streaming: bool) -> watcher::Config {
    let wc = watcher::Config::default();
    if streaming { wc.streaming_lists() } else { wc }
}

/// A selector no object carries: the probe of [`streams_initial_lists`] must see nothing.
const PROBE_SELECTOR: &str = "capkr.zyvor.dev/streaming-list-probe=none";

/// Whether the API server behind `api` streams a watch's initial state (`sendInitialEvents`,
/// the WatchList feature: on by default in Kubernetes 1.32 and from 1.34, off by default in
/// 1.33, and a gate an administrator can turn off). One watch request with a selector nothing
/// matches, dropped as soon as it is answered: an API server without the feature refuses the
/// parameters (422) before it starts the watch. (Servers before 1.27 ignored them; Cluster API
/// does not support management clusters that old.) Any error counts as no: pages always work.
pub(crate) async fn streams_initial_lists<K>(api: &Api<K>) -> bool
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    use kube::api::WatchParams;
    const WAIT: Duration = Duration::from_secs(10);

    let wp = WatchParams::streaming_lists().labels(PROBE_SELECTOR).timeout(1);
    match tokio::time::timeout(WAIT, api.watch(&wp, "0")).await {
        // Answered (200): the watch is dropped unread.
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            tracing::info!(error = %e, "the API server does not stream initial lists");
            false
        }
        Err(_) => {
            tracing::warn!(wait = ?WAIT, "no answer to the streamed-list probe; lists are paged");
            false
        }
    }
}
