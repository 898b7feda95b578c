//! Part 2, the floor: a minimal client that makes exactly the requests a provider cannot avoid
//! per machine, at the manager's concurrency and under the same client-side rate limit, against
//! the same API server and simulator:
//!
//! 1. one `patch` of the KaironMachine adding the finalizer, before anything exists outside
//!    the management cluster (the contract's rule: a deletion must not miss what was created);
//! 2. `GET` the bootstrap data Secret (the payload has to be read);
//! 3. `create` the Kairon Machine (the same object the manager builds);
//! 4. one `patch` of the KaironMachine recording `spec.providerID` (known only once Kairon has
//!    given the Kairon Machine its UID);
//! 5. once the Kairon Machine runs, one server-side apply of the status the manager writes.
//!
//! Like the manager it learns about KaironMachines, Machines and Kairon Machines from watches,
//! so its only per-machine requests are those five: four writes, one read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use capkr::api::{KaironMachine, MACHINE_FINALIZER};
use capkr::capi::{self, bootstrap};
use capkr::client::TokenBucket;
use capkr::controller::kairon_machine::{Observed, StatusInput, next_status};
use capkr::kairon::cloud_init::{DEFAULT_MAX_DECODED_BYTES, GuestFacts, translate_cloud_config};
use capkr::kairon::{self, desired_kairon_machine, provider_id};
use capkr_testenv::Env;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use crate::objects;
use crate::observe::Observer;
use crate::provider::provisioning_timeout;
use crate::results::{ApiLimits, FloorRun, PerMachine, Percentiles};
use crate::traffic::{FLOOR_USER_AGENT, Traffic, is_floor_request};

/// The namespace of the floor run.
pub const NAMESPACE: &str = "bench-floor";
const FIELD_MANAGER: &str = "capkr-bench-floor";

pub async fn run(env: &Env, opts: &crate::Options, n: usize, limits: ApiLimits) -> Result<FloorRun> {
    let client = env.client();
    objects::create_cluster(&client, NAMESPACE).await?;
    let floor_client = floor_client(env, limits).await?;
    let observer = Observer::start(&client, NAMESPACE).await?;
    let floor = Floor::start(floor_client, opts.kaironmachine_concurrency).await?;
    let mut traffic = Traffic::from_now(env)?;

    let t0 = Instant::now();
    let create = objects::create_machines(
        &client,
        NAMESPACE,
        n,
        opts.create_concurrency,
        observer.creation_recorder(),
    )
    .await?;
    let done = observer.wait_provisioned(n, provisioning_timeout(n)).await;
    let errors = floor.stop();
    if !errors.is_empty() {
        bail!(
            "the floor client failed ({} errors), first: {}",
            errors.len(),
            errors[0]
        );
    }
    let wall = done?.saturating_duration_since(t0);
    // Its last write is what made the last KaironMachine provisioned: nothing is left in flight.
    let (events, _) = traffic
        .until_quiet(is_floor_request, Duration::from_millis(500), Duration::from_secs(10))
        .await?;
    let requests = capkr_testenv::audit::RequestCounts::of(&events, |_| true);
    let latencies = observer.latencies();
    let run = FloorRun {
        wall_s: wall.as_secs_f64(),
        create_s: create.as_secs_f64(),
        created_to_provisioned: Percentiles::of(&latencies.created_to_provisioned),
        running_to_provisioned: Percentiles::of(&latencies.running_to_provisioned),
        per_machine: PerMachine::of(&requests, n),
        requests,
        kaironmachine_versions: observer.kaironmachine_versions_per_machine(),
        concurrency: opts.kaironmachine_concurrency,
    };
    eprintln!(
        "capkr-bench: N={n}: floor {:.1}s ({:.2} writes, {:.2} requests per machine)",
        run.wall_s, run.per_machine.writes, run.per_machine.requests
    );
    Ok(run)
}

/// A client of the management cluster with its own User-Agent and the manager's rate limiter.
async fn floor_client(env: &Env, limits: ApiLimits) -> Result<Client> {
    let kubeconfig = Kubeconfig::read_from(env.kubeconfig_path()).context("reading the admin kubeconfig")?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(FLOOR_USER_AGENT),
    ));
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&TokenBucket::new(limits.qps, limits.burst))
        .build())
}

/// Where one machine is.
#[derive(Default)]
struct MachineState {
    /// The create job was started.
    started: bool,
    /// The KaironMachine after the finalizer and providerID patch.
    patched: Option<KaironMachine>,
    /// The Kairon Machine, once seen Running.
    running: Option<kairon::Machine>,
    status_started: bool,
}

#[derive(Clone)]
struct Shared {
    client: Client,
    permits: Arc<Semaphore>,
    machines: Store<capi::MachineView>,
    state: Arc<Mutex<HashMap<String, MachineState>>>,
    errors: Arc<Mutex<Vec<String>>>,
}

struct Floor {
    tasks: Vec<JoinHandle<()>>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Floor {
    /// Starts the watches and returns once they have listed.
    async fn start(client: Client, concurrency: usize) -> Result<Floor> {
        let (machines, writer) = reflector::store();
        let shared = Shared {
            client: client.clone(),
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            machines: machines.clone(),
            state: Arc::default(),
            errors: Arc::default(),
        };
        let machine_api: Api<capi::Machine> = Api::namespaced(client.clone(), NAMESPACE);
        let machine_task = tokio::spawn(async move {
            let mut events = watcher(machine_api, watcher::Config::default())
                .default_backoff()
                .map_ok(capi::cached_machine_event)
                .reflect(writer)
                .boxed();
            while events.next().await.is_some() {}
        });

        let (km_ready, mut km_ready_rx) = watch::channel(false);
        let s = shared.clone();
        let km_task = tokio::spawn(async move {
            let api: Api<KaironMachine> = Api::namespaced(s.client.clone(), NAMESPACE);
            let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(watcher::Event::InitDone) => {
                        let _ = km_ready.send(true);
                    }
                    Ok(watcher::Event::Apply(km) | watcher::Event::InitApply(km)) => s.on_kaironmachine(km),
                    _ => {}
                }
            }
        });

        let (vm_ready, mut vm_ready_rx) = watch::channel(false);
        let s = shared.clone();
        let vm_task = tokio::spawn(async move {
            let api: Api<kairon::Machine> = Api::namespaced(s.client.clone(), NAMESPACE);
            let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(watcher::Event::InitDone) => {
                        let _ = vm_ready.send(true);
                    }
                    Ok(watcher::Event::Apply(vm) | watcher::Event::InitApply(vm)) => s.on_instance(vm),
                    _ => {}
                }
            }
        });

        let floor = Floor {
            tasks: vec![machine_task, km_task, vm_task],
            errors: shared.errors.clone(),
        };
        let listed = async {
            let _ = machines.wait_until_ready().await;
            let _ = km_ready_rx.wait_for(|r| *r).await;
            let _ = vm_ready_rx.wait_for(|r| *r).await;
        };
        if tokio::time::timeout(Duration::from_secs(60), listed).await.is_err() {
            bail!("the floor client's watches did not list within 60 s");
        }
        Ok(floor)
    }

    /// Stops the watches; returns the errors of failed jobs.
    fn stop(self) -> Vec<String> {
        for t in &self.tasks {
            t.abort();
        }
        self.errors.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Shared {
    fn on_kaironmachine(&self, km: KaironMachine) {
        if km.spec.provider_id.is_some() {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let entry = state.entry(km.name_any()).or_default();
        if entry.started {
            return;
        }
        entry.started = true;
        let s = self.clone();
        tokio::spawn(async move {
            let name = km.name_any();
            match s.create_instance(&km).await {
                Ok(patched) => s.created(&name, patched),
                Err(e) => s.fail(format!("{name}: {e:#}")),
            }
        });
    }

    fn on_instance(&self, vm: kairon::Machine) {
        if vm.status.as_ref().and_then(|s| s.phase.as_deref()) != Some(kairon::phase::RUNNING) {
            return;
        }
        let name = vm.name_any();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let entry = state.entry(name.clone()).or_default();
        if entry.running.is_none() {
            entry.running = Some(vm);
        }
        self.maybe_write_status(&name, entry);
    }

    fn created(&self, name: &str, patched: KaironMachine) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let entry = state.entry(name.to_string()).or_default();
        entry.patched = Some(patched);
        self.maybe_write_status(name, entry);
    }

    /// Starts the status write once the KaironMachine is patched and its instance runs.
    fn maybe_write_status(&self, name: &str, entry: &mut MachineState) {
        let (Some(km), Some(vm)) = (&entry.patched, &entry.running) else {
            return;
        };
        if entry.status_started {
            return;
        }
        entry.status_started = true;
        let (s, km, vm, name) = (self.clone(), km.clone(), vm.clone(), name.to_string());
        tokio::spawn(async move {
            if let Err(e) = s.write_status(&km, vm).await {
                s.fail(format!("{name}: {e:#}"));
            }
        });
    }

    fn fail(&self, msg: String) {
        self.errors.lock().unwrap_or_else(|e| e.into_inner()).push(msg);
    }

    /// Steps 1–4: the finalizer, the bootstrap data, the Kairon Machine, the providerID.
    async fn create_instance(&self, km: &KaironMachine) -> Result<KaironMachine> {
        let name = km.name_any();
        let machine = self.owner_machine(km).await?;
        let secret_name = machine
            .data_secret_name()
            .ok_or_else(|| anyhow!("Machine {name} has no dataSecretName"))?
            .to_string();
        let _permit = self.permits.acquire().await?;
        let kms: Api<KaironMachine> = Api::namespaced(self.client.clone(), NAMESPACE);
        let patch_params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let finalizer = json!({"metadata": {"finalizers": [MACHINE_FINALIZER]}});
        kms.patch(&name, &patch_params, &Patch::Merge(&finalizer))
            .await
            .context("adding the finalizer")?;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), NAMESPACE);
        let secret = secrets
            .get(&secret_name)
            .await
            .context("reading the bootstrap Secret")?;
        let user_data = bootstrap::bootstrap_data(&secret, bootstrap::DEFAULT_MAX_BOOTSTRAP_DATA_BYTES)
            .map_err(|e| anyhow!("bootstrap data: {e}"))?;
        let facts = GuestFacts::kairon(&name);
        let cloud_init = translate_cloud_config(&user_data, &facts, DEFAULT_MAX_DECODED_BYTES)
            .map_err(|e| anyhow!("bootstrap data: {e}"))?;
        let desired = desired_kairon_machine(km, objects::CLUSTER, machine.is_control_plane(), cloud_init, None);
        let vms: Api<kairon::Machine> = Api::namespaced(self.client.clone(), NAMESPACE);
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        // Errors of a request that carried bootstrap data are reduced to their code.
        let vm = vms.create(&pp, &desired).await.map_err(|e| match e {
            kube::Error::Api(s) => anyhow!("creating the Kairon Machine: {} {}", s.code, s.reason),
            _ => anyhow!("creating the Kairon Machine failed"),
        })?;
        vm.uid()
            .ok_or_else(|| anyhow!("the created Kairon Machine has no uid"))?;
        let body = json!({"spec": {"providerID": provider_id(&vm.name_any())}});
        kms.patch(&name, &patch_params, &Patch::Merge(&body))
            .await
            .context("recording the providerID")
    }

    /// The owning Machine from the watch cache; it is created before its KaironMachine, so
    /// this waits only when the Machine's event is late.
    async fn owner_machine(&self, km: &KaironMachine) -> Result<Arc<capi::MachineView>> {
        let owner = capi::owner(&km.metadata, "Machine")
            .ok_or_else(|| anyhow!("KaironMachine {} has no owner Machine", km.name_any()))?;
        let key = ObjectRef::new(&owner.name).within(NAMESPACE);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(m) = self.machines.get(&key) {
                return Ok(m);
            }
            if Instant::now() > deadline {
                bail!("Machine {} did not show up in the watch cache", owner.name);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Step 4: the status the manager would write for a Running instance, in one apply.
    async fn write_status(&self, km: &KaironMachine, vm: kairon::Machine) -> Result<()> {
        let _permit = self.permits.acquire().await?;
        let status = next_status(
            None,
            StatusInput::Live(&Observed::Instance(Box::new(kairon::Vm::read(vm)))),
            km.metadata.generation,
            &capkr::api::conditions::now(),
        );
        let name = km.name_any();
        let body = json!({
            "apiVersion": format!("{}/{}", capkr::api::GROUP, capkr::api::VERSION),
            "kind": "KaironMachine",
            "metadata": {"name": name},
            "status": status,
        });
        let kms: Api<KaironMachine> = Api::namespaced(self.client.clone(), NAMESPACE);
        kms.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
            .await
            .context("writing the status")?;
        Ok(())
    }
}
