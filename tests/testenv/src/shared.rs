//! One environment for all the tests of a binary, as Cluster API's own suites share one
//! envtest per package (`envtest.Run` in a `TestMain`): the first test that asks starts it,
//! every test keeps to a namespace of its own (its manager and simulator watch only that one),
//! and the environment lives until the test process exits. Then its processes are stopped
//! (API servers before etcd) and its temp dir removed; were the process killed instead, its
//! children die with it (`PR_SET_PDEATHSIG`) and the next environment sweeps the dir.

use std::time::Duration;

use anyhow::Result;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::env::{Env, EnvOptions};
use crate::process::{Process, stop_all};
use crate::workload::WorkloadCluster;

static SHARED: tokio::sync::OnceCell<Env> = tokio::sync::OnceCell::const_new();

impl Env {
    /// The environment shared by the tests of this binary, started with `opts` by the first
    /// caller (a binary asks with one set of options; later callers' are not looked at). A
    /// failed start is not remembered: the next test tries again, and fails the same way.
    pub async fn shared(opts: EnvOptions) -> Result<&'static Env> {
        SHARED
            .get_or_try_init(|| async {
                let env = Env::start(opts).await?;
                // SAFETY: registers a plain function without arguments.
                unsafe { libc::atexit(close_shared) };
                Ok(env)
            })
            .await
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

extern "C" fn close_shared() {
    if let Some(env) = SHARED.get() {
        env.close();
    }
}
