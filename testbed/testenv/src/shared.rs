//! One environment for all the tests of a binary, as Cluster API's own suites share one
//! envtest per package (`envtest.Run` in a `TestMain`): the first test that asks starts it,
//! every test keeps to a namespace of its own (its manager and simulator watch only that one),
//! and the environment lives until the test process exits. Then its processes are stopped
//! (API servers before etcd) and its temp dir removed; were the process killed instead, its
//! children die with it (`PR_SET_PDEATHSIG`) and the next environment sweeps the dir.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Result;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::sync::OnceCell;

use crate::env::{Env, EnvOptions};
use crate::process::{Process, stop_all};
use crate::workload::WorkloadCluster;

/// A shared environment and whether its setup ran; started once, never dropped.
struct Shared {
    name: String,
    env: OnceCell<Env>,
    setup: OnceCell<()>,
}

/// The shared environments of this process, by name.
static SHARED: Mutex<Vec<&'static Shared>> = Mutex::new(Vec::new());

impl Env {
    /// The environment named `opts.name` shared by the tests of this binary, started with
    /// `opts` by the first caller (the callers of one name ask with the same options; later
    /// callers' are not looked at). A failed start is not remembered: the next test tries
    /// again, and fails the same way.
    pub async fn shared(opts: EnvOptions) -> Result<&'static Env> {
        Env::shared_with(opts, |_| async { Ok(()) }).await
    }

    /// [`Env::shared`], with `setup` run once on the environment before any caller gets it
    /// (installing what every test of it needs).
    pub async fn shared_with<F, Fut>(opts: EnvOptions, setup: F) -> Result<&'static Env>
    where
        F: FnOnce(&'static Env) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let shared: &'static Shared = {
            let mut all = SHARED.lock().unwrap_or_else(|e| e.into_inner());
            match all.iter().find(|s| s.name == opts.name) {
                Some(s) => s,
                None => {
                    if all.is_empty() {
                        // SAFETY: registers a plain function without arguments, once.
                        unsafe { libc::atexit(close_shared) };
                    }
                    let s: &'static Shared = Box::leak(Box::new(Shared {
                        name: opts.name.clone(),
                        env: OnceCell::new(),
                        setup: OnceCell::new(),
                    }));
                    all.push(s);
                    s
                }
            }
        };
        let env = shared.env.get_or_try_init(|| Env::start(opts)).await?;
        shared.setup.get_or_try_init(|| setup(env)).await?;
        Ok(env)
    }

    /// Stops the API server of a workload cluster of this environment and forgets it: a test
    /// of a shared environment ends with the workload cluster it started.
    pub fn stop_workload(&self, workload: &WorkloadCluster) {
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<Process> = {
            let (gone, kept): (Vec<Process>, Vec<Process>) = std::mem::take(&mut *procs)
                .into_iter()
                .partition(|p| p.name() == workload.process_name);
            *procs = kept;
            gone
        };
        drop(procs);
        stop_all(&gone.iter().collect::<Vec<_>>(), Duration::from_secs(3));
        self.workloads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|w| w.kubeconfig_path != workload.kubeconfig_path());
    }

    /// Pauses every Cluster of `namespace`, so that CAPI's controllers leave a finished test's
    /// objects alone while the environment serves the tests still running.
    pub async fn pause_clusters(&self, namespace: &str) -> Result<()> {
        let clusters: Api<DynamicObject> =
            Api::namespaced_with(self.client(), namespace, &crate::capi_resource("Cluster", "clusters"));
        for c in clusters.list(&ListParams::default()).await?.items {
            let name = c.metadata.name.clone().unwrap_or_default();
            clusters
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"paused": true}})),
                )
                .await?;
        }
        Ok(())
    }
}

impl Env {
    /// What a test of the shared environment does when it ends (from a `Drop`, inside the
    /// test's runtime): on a failure it prints the environment, then pauses the Clusters of
    /// its namespace from a thread of its own (a runtime cannot be blocked on from inside).
    pub fn leave_namespace(&'static self, namespace: &str) {
        if std::thread::panicking() {
            self.dump();
        }
        let ns = namespace.to_string();
        let paused = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(self.pause_clusters(&ns)))
        })
        .join();
        if let Ok(Err(e)) = paused {
            eprintln!(
                "capkr-testenv[{}]: pausing the Clusters of {namespace}: {e:#}",
                self.name()
            );
        }
    }
}

extern "C" fn close_shared() {
    let all = SHARED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for s in all {
        if let Some(env) = s.env.get() {
            env.close();
        }
    }
}
