//! One Kairon API of an identity as the reconcilers use it ([`Endpoint`]): its client, the
//! cache its watch fills, and whether it can be used now — what its watch reported, checked
//! again with a request of our own, and its first list waited for only so long. The registry
//! that starts and stops endpoints is [`crate::controller::endpoints`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::reflector::Store;

use crate::controller::runtime::Synced;
use crate::kairon::{self, Instances};
use crate::text::bounded;

/// How long after its start an endpoint may take for its first list; past that, reconciles
/// report it unavailable at once instead of waiting.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);
/// How much of what is wrong with an endpoint is kept (and reported): errors quote the server.
pub(super) const MAX_PROBLEM: usize = 512;
/// How often a known problem of an endpoint is checked again by a reconcile, and for how long.
const PROBE_EVERY: Duration = Duration::from_secs(5);
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// One Kairon API as the reconcilers use it.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub instances: Instances,
    pub store: Store<kairon::Vm>,
    pub synced: Synced,
    namespace: String,
    /// Which Kairon API this is ([`kairon::endpoint_fingerprint`]).
    fingerprint: String,
    problem: Arc<Mutex<Option<String>>>,
    /// Why the endpoint was cut off for good (it sent more than its budget), if it was: unlike
    /// a problem, never cleared by a probe that succeeds.
    cut_off: Arc<Mutex<Option<String>>>,
    /// When a known problem was last checked with a request of our own.
    probed: Arc<Mutex<Option<Instant>>>,
    /// When the endpoint (its client and watch) started.
    started: Instant,
}

impl Endpoint {
    /// An endpoint just started: `problem` is what its watch reports.
    pub(super) fn new(
        instances: Instances,
        store: Store<kairon::Vm>,
        synced: Synced,
        namespace: String,
        fingerprint: String,
        problem: Arc<Mutex<Option<String>>>,
    ) -> Endpoint {
        Endpoint {
            instances,
            store,
            synced,
            namespace,
            fingerprint,
            problem,
            cut_off: Arc::default(),
            probed: Arc::default(),
            started: Instant::now(),
        }
    }

    /// With `cut_off` as where its watch records that it went over its budget.
    pub(super) fn with_cut_off(mut self, cut_off: Arc<Mutex<Option<String>>>) -> Endpoint {
        self.cut_off = cut_off;
        self
    }

    /// Which Kairon API this is: server, TLS server name and CA, not the credentials.
    pub(crate) fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// What is wrong with the endpoint's watch, if anything.
    pub(crate) fn problem(&self) -> Option<String> {
        let cut = self.cut_off.lock().unwrap_or_else(|e| e.into_inner()).clone();
        cut.or_else(|| self.problem.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Waits (a while) for the first list; then whether the endpoint can be used, or why not.
    /// A problem the watch reported is checked again with a request of our own: a watch that
    /// resumed says nothing until a Kairon Machine changes.
    ///
    /// A known problem is answered at once (and probed at most every [`PROBE_EVERY`], for at
    /// most [`PROBE_TIMEOUT`]): reconciles of a broken endpoint's machines must not hold the
    /// controller's workers that other clusters need. The first list is waited for only until
    /// [`FIRST_LIST_WAIT`] after the endpoint started; an endpoint that has not listed by then
    /// has that problem, and is answered from it like any other.
    pub(crate) async fn ready(&self) -> Result<(), String> {
        if let Some(why) = self.cut_off.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(why);
        }
        let known = self.problem();
        if let Some(why) = &known {
            let mut probed = self.probed.lock().unwrap_or_else(|e| e.into_inner());
            if probed.is_some_and(|at| at.elapsed() < PROBE_EVERY) {
                return Err(why.clone());
            }
            *probed = Some(Instant::now());
        }
        if known.is_none() {
            let synced = Synced::all(std::slice::from_ref(&self.synced));
            let wait = FIRST_LIST_WAIT.saturating_sub(self.started.elapsed());
            if !matches!(tokio::time::timeout(wait, synced).await, Ok(Ok(()))) {
                let why = format!(
                    "the Kairon API did not answer the first list of its Kairon Machines within {}s",
                    FIRST_LIST_WAIT.as_secs()
                );
                *self.probed.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                return Err(self.set_problem_if_none(why));
            }
            if self.problem().is_none() {
                return Ok(());
            }
        }
        let api = self.instances.api(Some(&self.namespace));
        let lp = kube::api::ListParams::default().limit(1);
        let probe = api.list_metadata(&lp);
        let why = match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
            // The list succeeded; the cache is usable once the watch has listed too.
            Ok(Ok(_)) if self.synced.is_synced() => {
                *self.problem.lock().unwrap_or_else(|e| e.into_inner()) = None;
                return Ok(());
            }
            Ok(Ok(_)) => "the Kairon API answers; waiting for the first list of its Kairon Machines".to_string(),
            Ok(Err(e)) => bounded(&format!("the Kairon API cannot be read: {e}"), MAX_PROBLEM),
            Err(_) => "the Kairon API does not answer".to_string(),
        };
        *self.problem.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
        Err(why)
    }

    /// Records `why` unless a problem is known already (the watch's own error says more);
    /// returns the problem.
    fn set_problem_if_none(&self, why: String) -> String {
        self.problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(why)
            .clone()
    }
}
