//! The benchmark's own watches on KaironMachines and Kairon Machines of one namespace. Every
//! transition is stamped when the benchmark sees it: `creationTimestamp` has a resolution of
//! one second, far too coarse for latencies of milliseconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use capkr::api::KaironMachine;
use capkr::kairon;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// When the benchmark saw each machine reach each point.
#[derive(Debug, Default)]
struct Timeline {
    /// The KaironMachine's create returned to the benchmark.
    created: HashMap<String, Instant>,
    /// The Kairon Machine was first seen in phase Running.
    running: HashMap<String, Instant>,
    /// The KaironMachine was first seen with `status.initialization.provisioned: true`.
    provisioned: HashMap<String, Instant>,
    /// Versions (resourceVersions) of each KaironMachine seen: a write that changed nothing
    /// makes none.
    km_versions: HashMap<String, (String, usize)>,
}

/// Watches one namespace until dropped.
pub struct Observer {
    timeline: Arc<Mutex<Timeline>>,
    changed: Arc<Notify>,
    tasks: Vec<JoinHandle<()>>,
}

/// Latencies in seconds, one entry per machine that has both ends.
#[derive(Clone, Debug, Default)]
pub struct Latencies {
    pub created_to_provisioned: Vec<f64>,
    pub running_to_provisioned: Vec<f64>,
}

impl Observer {
    /// Starts both watches and returns once their first lists are done.
    pub async fn start(client: &Client, ns: &str) -> Result<Observer> {
        let timeline = Arc::new(Mutex::new(Timeline::default()));
        let changed = Arc::new(Notify::new());

        let (km_ready, mut km_ready_rx) = watch::channel(false);
        let kms: Api<KaironMachine> = Api::namespaced(client.clone(), ns);
        let (t, c) = (timeline.clone(), changed.clone());
        let km_task = tokio::spawn(async move {
            let mut events = watcher(kms, watcher::Config::default()).default_backoff().boxed();
            while let Some(ev) = events.next().await {
                let now = Instant::now();
                match ev {
                    Ok(watcher::Event::InitDone) => {
                        let _ = km_ready.send(true);
                    }
                    Ok(watcher::Event::Apply(km) | watcher::Event::InitApply(km)) => {
                        let mut tl = t.lock().unwrap_or_else(|e| e.into_inner());
                        let rv = km.resource_version().unwrap_or_default();
                        let seen = tl.km_versions.entry(km.name_any()).or_default();
                        if seen.0 != rv {
                            *seen = (rv, seen.1 + 1);
                        }
                        if km.status.as_ref().is_some_and(|s| s.is_provisioned()) {
                            tl.provisioned.entry(km.name_any()).or_insert(now);
                            drop(tl);
                            c.notify_waiters();
                        }
                    }
                    _ => {}
                }
            }
        });

        let (vm_ready, mut vm_ready_rx) = watch::channel(false);
        let vms: Api<kairon::Machine> = Api::namespaced(client.clone(), ns);
        let t = timeline.clone();
        let vm_task = tokio::spawn(async move {
            let mut events = watcher(vms, watcher::Config::default()).default_backoff().boxed();
            while let Some(ev) = events.next().await {
                let now = Instant::now();
                match ev {
                    Ok(watcher::Event::InitDone) => {
                        let _ = vm_ready.send(true);
                    }
                    Ok(watcher::Event::Apply(vm) | watcher::Event::InitApply(vm)) => {
                        let running =
                            vm.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(kairon::phase::RUNNING);
                        if running {
                            let mut tl = t.lock().unwrap_or_else(|e| e.into_inner());
                            tl.running.entry(vm.name_any()).or_insert(now);
                        }
                    }
                    _ => {}
                }
            }
        });

        let observer = Observer {
            timeline,
            changed,
            tasks: vec![km_task, vm_task],
        };
        let both = async {
            let _ = km_ready_rx.wait_for(|r| *r).await;
            let _ = vm_ready_rx.wait_for(|r| *r).await;
        };
        if tokio::time::timeout(Duration::from_secs(60), both).await.is_err() {
            bail!("the benchmark's watches of namespace {ns} did not list within 60 s");
        }
        Ok(observer)
    }

    /// A callback for [`crate::objects::create_machines`].
    pub fn creation_recorder(&self) -> Arc<dyn Fn(String, Instant) + Send + Sync> {
        let t = self.timeline.clone();
        Arc::new(move |name, at| {
            t.lock().unwrap_or_else(|e| e.into_inner()).created.insert(name, at);
        })
    }

    pub fn provisioned_count(&self) -> usize {
        self.timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .provisioned
            .len()
    }

    /// Waits until `n` KaironMachines are provisioned; returns when the last one was seen.
    pub async fn wait_provisioned(&self, n: usize, timeout: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            {
                let tl = self.timeline.lock().unwrap_or_else(|e| e.into_inner());
                if tl.provisioned.len() >= n {
                    return Ok(tl.provisioned.values().max().copied().unwrap_or_else(Instant::now));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "only {} of {n} KaironMachines were provisioned after {timeout:?}",
                    self.provisioned_count()
                );
            }
            // Also wake up now and then: a notification between the check and the wait is lost.
            let _ = tokio::time::timeout(left.min(Duration::from_millis(500)), notified).await;
        }
    }

    /// Distinct versions of KaironMachines seen (the create included), per machine.
    pub fn kaironmachine_versions_per_machine(&self) -> f64 {
        let tl = self.timeline.lock().unwrap_or_else(|e| e.into_inner());
        let total: usize = tl.km_versions.values().map(|v| v.1).sum();
        total as f64 / tl.km_versions.len().max(1) as f64
    }

    pub fn latencies(&self) -> Latencies {
        let tl = self.timeline.lock().unwrap_or_else(|e| e.into_inner());
        let mut l = Latencies::default();
        for (name, done) in &tl.provisioned {
            if let Some(created) = tl.created.get(name) {
                l.created_to_provisioned
                    .push(done.saturating_duration_since(*created).as_secs_f64());
            }
            if let Some(running) = tl.running.get(name) {
                l.running_to_provisioned
                    .push(done.saturating_duration_since(*running).as_secs_f64());
            }
        }
        l
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
