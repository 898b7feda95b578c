//! The KaironMachine reconciler: one Kairon Machine per KaironMachine, its status mapped back.
//!
//! Order of a reconcile, as the contract asks:
//! 1. dereference the owner Machine and the Cluster (from caches);
//! 2. pause (Cluster `spec.paused` or the annotation) — before deletion, so that
//!    `clusterctl move` never destroys a VM;
//! 3. deletion: delete the Kairon Machine, keep the finalizer until it is gone;
//! 4. no owner Machine yet: do nothing, not even add the finalizer;
//! 5. finalizer, then wait for cluster infrastructure and bootstrap data, create the Kairon
//!    Machine (deterministic name; adopt only what carries our UID), write `spec.providerID`;
//! 6. status from what Kairon reports, written only when it differs.

use std::sync::Arc;
use std::time::Duration;

use futures::{Future, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, PredicateConfig, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::fresh::Fresher;
use super::write::{self, has_finalizer};
use super::{Error, Settings, Synced, is_not_found, keep_only_labels, strip_managed_fields};
use crate::api::conditions::{self, Decided, INSTANCE_PROVISIONED, READY, Status, reason};
use crate::api::{self, Initialization, KaironCluster, KaironMachine, KaironMachineStatus, MACHINE_FINALIZER};
use crate::capi::{self, bootstrap};
use crate::events::{Events, reason as event};
use crate::kairon::{self, Ownership, desired_kairon_machine, labels, observe, ownership, provider_id};
use crate::metrics::Metrics;
use crate::telemetry::{Telemetry, instrumented};

/// Annotation clusterctl puts on objects it deletes after moving them elsewhere.
pub const DELETE_FOR_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";

/// How often to look again for a bootstrap Secret that is named but missing (Secrets are read
/// with a single GET, never watched).
const SECRET_RETRY: Duration = Duration::from_secs(20);
/// How often to look again while a Kairon Machine is being deleted, on top of its watch.
const DELETE_RETRY: Duration = Duration::from_secs(30);

/// What the reconciler needs: clients, settings and the caches its watches fill.
pub struct Context {
    /// The management cluster.
    pub client: Client,
    /// Where Kairon Machines live (the management cluster unless configured otherwise).
    pub kairon: Client,
    pub settings: Settings,
    pub machines: Store<capi::Machine>,
    pub clusters: Store<capi::Cluster>,
    pub instances: Store<kairon::Machine>,
    /// First lists of `machines`, `clusters` and `instances`.
    pub synced: Vec<Synced>,
    /// Events on KaironMachines (disabled in mock tests).
    pub events: Events,
    pub metrics: Arc<Metrics>,
    /// Our last writes to KaironMachines the cache has not shown yet.
    pub fresh: Fresher<KaironMachine>,
}

impl Context {
    async fn wait_for_caches(&self) -> Result<(), Error> {
        Synced::all(&self.synced).await
    }
}

/// What one reconcile learned about the KaironMachine's instance; the status follows from it.
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    /// No instance yet, and a reason why not (waiting, or a bootstrap data problem).
    Waiting(Decided),
    /// No instance, and none will be created: a terminal failure (v1beta1 reason, message).
    Terminal {
        condition: Decided,
        failure_reason: &'static str,
    },
    /// The instance, as Kairon reports it.
    Instance(Box<kairon::Machine>),
    /// The instance existed (our providerID names it) and is gone.
    Gone,
    /// A Kairon Machine with our name belongs to someone else.
    Conflict { name: String },
}

/// The status a KaironMachine should have. Pure: a table of cases in the tests.
///
/// `paused` only sets the Paused condition and leaves the rest untouched; `deleting` turns
/// Ready to False with reason Deleting.
pub fn next_status(
    current: Option<&KaironMachineStatus>,
    observed: Option<&Observed>,
    paused: Option<&str>,
    deleting: bool,
    generation: Option<i64>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> KaironMachineStatus {
    let mut status = current.cloned().unwrap_or_default();
    let mut conds = status.conditions.take().unwrap_or_default();
    conditions::set(&mut conds, conditions::paused(paused), generation, now);

    if let Some(observed) = observed {
        let instance = match observed {
            Observed::Waiting(d) => d.clone(),
            Observed::Terminal {
                condition,
                failure_reason,
            } => {
                status.set_failure(failure_reason, &condition.message);
                condition.clone()
            }
            Observed::Gone => {
                status.instance = None;
                Decided::new(
                    INSTANCE_PROVISIONED,
                    Status::False,
                    reason::INSTANCE_NOT_FOUND,
                    "the Kairon Machine of this KaironMachine no longer exists; it is not re-created",
                )
            }
            Observed::Conflict { name } => Decided::new(
                INSTANCE_PROVISIONED,
                Status::False,
                reason::INSTANCE_CONFLICT,
                format!("Kairon Machine {name} exists but does not belong to this KaironMachine; it is left alone"),
            ),
            Observed::Instance(vm) => {
                status.instance = Some(observe::instance_ref(vm));
                let addresses = observe::addresses(vm);
                if !addresses.is_empty() {
                    status.addresses = Some(addresses);
                }
                if let Some(fd) = observe::failure_domain(vm) {
                    status.failure_domain = Some(fd);
                }
                if observe::is_running(vm) {
                    status.initialization = Some(Initialization {
                        provisioned: Some(true),
                    });
                }
                let decided = observe::instance_condition(vm);
                if let Some((kairon_reason, _)) = observe::failure(vm) {
                    status.set_failure(observe::failure_reason_v1beta1(&kairon_reason), &decided.message);
                }
                decided
            }
        };
        let ready = if deleting {
            Decided::new(READY, Status::False, reason::DELETING, "KaironMachine is being deleted")
        } else if instance.status == Status::True {
            Decided::new(READY, Status::True, reason::READY, instance.message.clone())
        } else {
            Decided::new(READY, instance.status, instance.reason, instance.message.clone())
        };
        conditions::set(&mut conds, instance, generation, now);
        conditions::set(&mut conds, ready, generation, now);
    }
    status.conditions = Some(conds);
    status
}

/// Reconciles one KaironMachine.
pub async fn reconcile(km: Arc<KaironMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.wait_for_caches().await?;
    let km = ctx.fresh.freshest(km);
    let ns = km.namespace().ok_or(Error::MissingNamespace)?;
    let api: Api<KaironMachine> = Api::namespaced(ctx.client.clone(), &ns);

    let machine =
        capi::owner(&km.metadata, "Machine").and_then(|o| ctx.machines.get(&ObjectRef::new(&o.name).within(&ns)));
    let cluster_name = capi::label(&km.metadata, capi::CLUSTER_NAME_LABEL)
        .map(str::to_string)
        .or_else(|| {
            machine
                .as_ref()
                .map(|m| m.spec.cluster_name.clone())
                .filter(|c| !c.is_empty())
        });
    let cluster = cluster_name
        .as_ref()
        .and_then(|c| ctx.clusters.get(&ObjectRef::new(c).within(&ns)));

    if let Some(why) = capi::paused_reason(cluster.as_deref(), &km.metadata) {
        // Paused means no writes: the Paused condition is written once, and not refreshed
        // for a new generation (a deletion bumps it) while the pause lasts.
        if !conditions::says(
            km.status.as_ref().and_then(|s| s.conditions.as_deref()),
            &conditions::paused(Some(why)),
        ) {
            write_status(&api, &km, None, Some(why), &ctx.fresh).await?;
        }
        return Ok(Action::await_change());
    }
    if km.metadata.deletion_timestamp.is_some() {
        return reconcile_delete(&km, &api, &ctx, &ns).await;
    }
    // The contract: until CAPI has made a Machine the owner, nothing is done, not even the
    // finalizer.
    let Some(machine) = machine else {
        debug!("waiting for an owner Machine");
        return Ok(Action::await_change());
    };
    if !has_finalizer(km.as_ref(), MACHINE_FINALIZER) {
        let written = write::add_finalizer(&api, km.as_ref(), MACHINE_FINALIZER)
            .await
            .map_err(Error::write("finalizer"))?;
        ctx.fresh.wrote(&km, written);
    }
    let cluster_name = cluster_name.unwrap_or_default();
    let (observed, action) = reconcile_instance(&km, &machine, cluster.as_deref(), &cluster_name, &ctx, &ns).await?;
    if let Some(next) = write_status(&api, &km, Some(&observed), None, &ctx.fresh).await? {
        report_transitions(&km, &next, &ctx).await;
    }
    Ok(action)
}

/// Events and the provisioning-time metric for what a status write just changed.
async fn report_transitions(km: &KaironMachine, next: &KaironMachineStatus, ctx: &Context) {
    let before = km.status.as_ref();
    if next.is_provisioned() && !before.is_some_and(KaironMachineStatus::is_provisioned) {
        if let Some(created) = &km.metadata.creation_timestamp {
            let secs = k8s_openapi::jiff::Timestamp::now()
                .duration_since(created.0)
                .as_secs_f64();
            ctx.metrics.provision_duration.observe(secs.max(0.0));
        }
        let host = next.instance.as_ref().and_then(|i| i.host.clone()).unwrap_or_default();
        ctx.events
            .normal(
                km,
                event::INSTANCE_PROVISIONED,
                "Provision",
                format!("Kairon Machine {} is running on host {host}", km.name_any()),
            )
            .await;
    }
    if let Some(r) = next.failure_reason()
        && before.and_then(KaironMachineStatus::failure_reason).is_none()
    {
        let message = next
            .deprecated
            .as_ref()
            .and_then(|d| d.v1beta1.as_ref())
            .and_then(|v| v.failure_message.clone())
            .unwrap_or_default();
        ctx.events
            .warning(km, event::INSTANCE_FAILED, "Provision", format!("{r}: {message}"))
            .await;
    }
}

/// Ensures the Kairon Machine exists (when it may) and says what it looks like.
async fn reconcile_instance(
    km: &KaironMachine,
    machine: &capi::Machine,
    cluster: Option<&capi::Cluster>,
    cluster_name: &str,
    ctx: &Context,
    ns: &str,
) -> Result<(Observed, Action), Error> {
    let name = km.name_any();
    let instances: Api<kairon::Machine> = Api::namespaced(ctx.kairon.clone(), ns);
    let resync = Action::requeue(ctx.settings.sync_period);

    let mut vm = ctx
        .instances
        .get(&ObjectRef::new(&name).within(ns))
        .map(|vm| (*vm).clone());
    if vm.is_none() && km.spec.provider_id.is_some() {
        // The cache may lag behind a create we just made: ask the API before concluding the
        // VM is gone.
        vm = instances
            .get_opt(&name)
            .await
            .map_err(Error::read(format!("Kairon Machine {ns}/{name}")))?;
        if vm.is_none() {
            return Ok((Observed::Gone, resync));
        }
    }

    let vm = match vm {
        Some(vm) => vm,
        None => match create_instance(km, machine, cluster, cluster_name, ctx, ns, &instances).await? {
            Ok(vm) => vm,
            Err((observed, action)) => return Ok((observed, action)),
        },
    };

    match ownership(&vm, km) {
        Ownership::Foreign => {
            warn!(instance = %name, "a Kairon Machine with this name belongs to someone else");
            return Ok((Observed::Conflict { name }, resync));
        }
        Ownership::OursBeforeMove => {
            info!(instance = %name, "adopting the Kairon Machine named by spec.providerID");
            let body = json!({"metadata": {"labels": {
                labels::KAIRONMACHINE_UID: km.metadata.uid,
                labels::KAIRONMACHINE_NAMESPACE: ns,
            }}});
            write::merge_patch(&instances, &name, body)
                .await
                .map_err(Error::write(format!("labels of Kairon Machine {ns}/{name}")))?;
            ctx.events
                .normal(
                    km,
                    event::INSTANCE_ADOPTED,
                    "Adopt",
                    format!("adopted Kairon Machine {ns}/{name} named by spec.providerID"),
                )
                .await;
        }
        Ownership::Ours => {}
    }

    if km.spec.provider_id.is_none()
        && let Some(uid) = vm.metadata.uid.as_deref()
    {
        let api: Api<KaironMachine> = Api::namespaced(ctx.client.clone(), ns);
        let body = json!({"spec": {"providerID": provider_id(uid)}});
        let written = write::merge_patch(&api, &name, body)
            .await
            .map_err(Error::write("spec.providerID"))?;
        ctx.fresh.wrote(km, written);
    }
    Ok((Observed::Instance(Box::new(vm)), resync))
}

/// Creates the Kairon Machine once everything it needs is there. The inner `Err` says what is
/// still missing.
#[allow(clippy::too_many_arguments)]
async fn create_instance(
    km: &KaironMachine,
    machine: &capi::Machine,
    cluster: Option<&capi::Cluster>,
    cluster_name: &str,
    ctx: &Context,
    ns: &str,
    instances: &Api<kairon::Machine>,
) -> Result<Result<kairon::Machine, (Observed, Action)>, Error> {
    let resync = Action::requeue(ctx.settings.sync_period);
    let waiting = |r: &'static str, msg: String| {
        Ok(Err((
            Observed::Waiting(Decided::new(INSTANCE_PROVISIONED, Status::False, r, msg)),
            resync.clone(),
        )))
    };

    if !cluster.is_some_and(capi::Cluster::infrastructure_provisioned) {
        return waiting(
            reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
            format!("waiting for the infrastructure of Cluster {cluster_name}"),
        );
    }
    let Some(secret_name) = machine.data_secret_name() else {
        if !machine.is_control_plane() && !cluster.is_some_and(capi::Cluster::control_plane_initialized) {
            return waiting(
                reason::WAITING_FOR_CONTROL_PLANE_INITIALIZED,
                "waiting for the control plane to be initialized".into(),
            );
        }
        return waiting(reason::WAITING_FOR_BOOTSTRAP_DATA, "waiting for bootstrap data".into());
    };

    // One GET of the one Secret: no cluster-wide Secret cache.
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret = secrets
        .get_opt(secret_name)
        .await
        .map_err(Error::read(format!("bootstrap data Secret {ns}/{secret_name}")))?;
    let Some(secret) = secret else {
        let d = Decided::new(
            INSTANCE_PROVISIONED,
            Status::False,
            reason::BOOTSTRAP_SECRET_NOT_FOUND,
            format!("bootstrap data Secret {secret_name} not found"),
        );
        return Ok(Err((Observed::Waiting(d), Action::requeue(SECRET_RETRY))));
    };
    let user_data = match bootstrap::bootstrap_data(&secret, ctx.settings.max_bootstrap_data_bytes) {
        Ok(data) => data,
        Err(e) if e.is_terminal() => {
            let condition = Decided::new(INSTANCE_PROVISIONED, Status::False, e.reason(), e.to_string());
            return Ok(Err((
                Observed::Terminal {
                    condition,
                    failure_reason: "InvalidConfiguration",
                },
                Action::await_change(),
            )));
        }
        Err(e) => {
            let d = Decided::new(INSTANCE_PROVISIONED, Status::False, e.reason(), e.to_string());
            return Ok(Err((Observed::Waiting(d), Action::requeue(SECRET_RETRY))));
        }
    };
    drop(secret);

    let failure_domain = match machine.failure_domain() {
        None => None,
        Some(fd) => match find_failure_domain(cluster, fd, ctx, ns).await? {
            Some(spec) => Some(spec),
            None => {
                return waiting(
                    reason::WAITING_FOR_FAILURE_DOMAIN,
                    format!("failure domain {fd} is not defined on the KaironCluster"),
                );
            }
        },
    };

    let desired = desired_kairon_machine(km, cluster_name, user_data, failure_domain.as_ref());
    let name = km.name_any();
    let pp = PostParams {
        field_manager: Some(super::FIELD_MANAGER.into()),
        ..Default::default()
    };
    match instances.create(&pp, &desired).await {
        Ok(vm) => {
            info!(instance = %name, "created Kairon Machine");
            ctx.events
                .normal(
                    km,
                    event::INSTANCE_CREATED,
                    "Create",
                    format!("created Kairon Machine {ns}/{name}"),
                )
                .await;
            Ok(Ok(vm))
        }
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            // Created by an earlier reconcile the cache has not seen yet, or by someone else:
            // read it, and let the ownership check decide.
            let vm = instances
                .get_opt(&name)
                .await
                .map_err(Error::read(format!("Kairon Machine {ns}/{name}")))?;
            match vm {
                Some(vm) => Ok(Ok(vm)),
                None => Err(Error::CreateInstance {
                    name,
                    detail: "it exists and vanished right after".into(),
                }),
            }
        }
        // The request carried bootstrap data and an API error may quote it: keep only the code
        // and reason.
        Err(kube::Error::Api(s)) => Err(Error::CreateInstance {
            name,
            detail: format!("the API answered {} {}", s.code, s.reason),
        }),
        Err(e) => Err(Error::CreateInstance {
            name,
            detail: redacted_error_kind(&e),
        }),
    }
}

/// A description of a client error that cannot contain request content.
fn redacted_error_kind(e: &kube::Error) -> String {
    match e {
        kube::Error::HyperError(_) | kube::Error::Service(_) => "the API server could not be reached".into(),
        _ => "the request failed".into(),
    }
}

/// The failure domain named by the Machine, from the KaironCluster.
async fn find_failure_domain(
    cluster: Option<&capi::Cluster>,
    name: &str,
    ctx: &Context,
    ns: &str,
) -> Result<Option<api::FailureDomainSpec>, Error> {
    let Some(kc_name) = cluster.and_then(|c| c.infrastructure_name(api::GROUP, "KaironCluster")) else {
        return Ok(None);
    };
    let kcs: Api<KaironCluster> = Api::namespaced(ctx.client.clone(), ns);
    let kc = kcs
        .get_opt(kc_name)
        .await
        .map_err(Error::read(format!("KaironCluster {ns}/{kc_name}")))?;
    Ok(kc
        .and_then(|kc| kc.spec.failure_domains)
        .into_iter()
        .flatten()
        .find(|fd| fd.name == name))
}

/// Deletion: the Kairon Machine goes first, then the finalizer.
async fn reconcile_delete(
    km: &KaironMachine,
    api: &Api<KaironMachine>,
    ctx: &Context,
    ns: &str,
) -> Result<Action, Error> {
    if !has_finalizer(km, MACHINE_FINALIZER) {
        return Ok(Action::await_change());
    }
    let release = || async {
        write::remove_finalizer(api, km, MACHINE_FINALIZER)
            .await
            .map_err(Error::write("finalizer"))?;
        ctx.fresh.forget(km);
        Ok::<_, Error>(Action::await_change())
    };
    if capi::has_annotation(&km.metadata, DELETE_FOR_MOVE_ANNOTATION) {
        // Moved to another management cluster: the VM lives on there.
        info!("deleted for clusterctl move; the Kairon Machine is kept");
        return release().await;
    }
    let name = km.name_any();
    let instances: Api<kairon::Machine> = Api::namespaced(ctx.kairon.clone(), ns);
    // Authoritative read: the finalizer must not go while the VM exists.
    let vm = instances
        .get_opt(&name)
        .await
        .map_err(Error::read(format!("Kairon Machine {ns}/{name}")))?;
    let Some(vm) = vm else {
        info!("Kairon Machine is gone; releasing the finalizer");
        ctx.events
            .normal(
                km,
                event::INSTANCE_DELETED,
                "Delete",
                format!("Kairon Machine {ns}/{name} is deleted"),
            )
            .await;
        return release().await;
    };
    if ownership(&vm, km) == Ownership::Foreign {
        info!(instance = %name, "the Kairon Machine with this name is not ours; releasing the finalizer without deleting it");
        return release().await;
    }
    if vm.metadata.deletion_timestamp.is_none() {
        let dp = DeleteParams {
            preconditions: vm.metadata.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match instances.delete(&name, &dp).await {
            Ok(_) => info!(instance = %name, "deleting Kairon Machine"),
            Err(e) if is_not_found(&e) => return release().await,
            Err(source) => return Err(Error::DeleteInstance { name, source }),
        }
    }
    write_status(api, km, Some(&Observed::Instance(Box::new(vm))), None, &ctx.fresh).await?;
    Ok(Action::requeue(DELETE_RETRY))
}

/// Writes the status that follows from what was observed, if it differs; returns what it wrote.
async fn write_status(
    api: &Api<KaironMachine>,
    km: &KaironMachine,
    observed: Option<&Observed>,
    paused: Option<&str>,
    fresh: &Fresher<KaironMachine>,
) -> Result<Option<KaironMachineStatus>, Error> {
    let deleting = km.metadata.deletion_timestamp.is_some();
    let next = next_status(
        km.status.as_ref(),
        observed,
        paused,
        deleting,
        km.metadata.generation,
        &conditions::now(),
    );
    if km.status.as_ref() == Some(&next) {
        return Ok(None);
    }
    let written = write::apply_status(api, &km.name_any(), &next)
        .await
        .map_err(Error::write("status"))?;
    fresh.wrote(km, written);
    Ok(Some(next))
}

/// The KaironMachine for a CAPI Machine: its `spec.infrastructureRef`.
pub fn kaironmachine_for_machine(m: &capi::Machine) -> Option<ObjectRef<KaironMachine>> {
    let r = m
        .spec
        .infrastructure_ref
        .as_ref()
        .filter(|r| r.is(api::GROUP, "KaironMachine"))?;
    Some(ObjectRef::new(&r.name).within(&m.namespace()?))
}

/// The KaironMachine for a Kairon Machine: its link-back labels, or its own name.
pub fn kaironmachine_for_instance(vm: &kairon::Machine) -> Option<ObjectRef<KaironMachine>> {
    let l = vm.labels();
    let ns = l
        .get(labels::KAIRONMACHINE_NAMESPACE)
        .cloned()
        .or_else(|| vm.namespace())?;
    let name = l
        .get(labels::KAIRONMACHINE_NAME)
        .cloned()
        .unwrap_or_else(|| vm.name_any());
    Some(ObjectRef::new(&name).within(&ns))
}

/// What of a Cluster a KaironMachine reacts to: pause, provisioning state, deletion. Cluster
/// status changes all the time while a cluster comes up; without this every change would
/// reconcile every machine of the cluster.
pub fn cluster_trigger(c: &capi::Cluster) -> Option<u64> {
    Some(hash_of(&(
        c.spec.paused,
        c.infrastructure_provisioned(),
        c.control_plane_initialized(),
        c.metadata.deletion_timestamp.is_some(),
        &c.spec.infrastructure_ref,
    )))
}

/// What of a Machine a KaironMachine reacts to: bootstrap data, references, placement, role.
pub fn machine_trigger(m: &capi::Machine) -> Option<u64> {
    Some(hash_of(&(
        m.data_secret_name(),
        &m.spec.infrastructure_ref,
        m.failure_domain(),
        m.is_control_plane(),
        &m.spec.cluster_name,
        m.metadata.deletion_timestamp.is_some(),
    )))
}

fn hash_of(v: &impl std::hash::Hash) -> u64 {
    use std::hash::{DefaultHasher, Hasher};
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// Builds the controller. It runs until `shutdown` resolves and the returned future is
/// driven; the Cluster cache is returned for the other controllers to read.
pub fn controller(
    client: Client,
    kairon_client: Client,
    settings: Settings,
    telemetry: Telemetry,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> (Store<capi::Cluster>, Synced, impl Future<Output = ()> + Send) {
    let wc = settings.watcher_config();

    let (machines, w) = reflector::store();
    let machine_events = watcher(settings.api::<capi::Machine>(&client), wc.clone())
        .default_backoff()
        // Read: the spec view, the control-plane label, deletion.
        .modify(|m: &mut capi::Machine| keep_only_labels(m, &[capi::CONTROL_PLANE_LABEL]))
        .reflect(w)
        .touched_objects()
        .predicate_filter(machine_trigger, PredicateConfig::default());
    let (clusters, w) = reflector::store();
    let cluster_events = watcher(settings.api::<capi::Cluster>(&client), wc.clone())
        .default_backoff()
        .modify(strip_managed_fields)
        .reflect(w)
        .touched_objects()
        .predicate_filter(cluster_trigger, PredicateConfig::default());
    let (instances, w) = reflector::store();
    let instance_wc = watcher::Config::default().any_semantic().labels(&format!(
        "{}={}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE
    ));
    let instance_events = watcher(settings.api::<kairon::Machine>(&kairon_client), instance_wc)
        .default_backoff()
        .modify(|vm: &mut kairon::Machine| {
            // Never hold bootstrap payloads in memory.
            vm.spec.cloud_init = None;
            strip_managed_fields(vm);
        })
        .reflect(w)
        .touched_objects();
    let (kms, w) = reflector::store();
    let km_events = watcher(settings.api::<KaironMachine>(&client), wc)
        .default_backoff()
        .modify(strip_managed_fields)
        .reflect(w)
        .applied_objects();

    let synced = vec![Synced::of(&machines), Synced::of(&clusters), Synced::of(&instances)];
    synced.iter().for_each(|s| telemetry.caches.register(s));
    let clusters_synced = synced[1].clone();
    telemetry.metrics.watch_instances(instances.clone());
    let ctx = Arc::new(Context {
        events: telemetry.events("capkr-kaironmachine-controller"),
        metrics: telemetry.metrics.clone(),
        client,
        kairon: kairon_client,
        settings: settings.clone(),
        machines,
        clusters: clusters.clone(),
        instances,
        synced,
        fresh: Fresher::default(),
    });
    let km_store: Store<KaironMachine> = kms.clone();
    let controller = Controller::for_stream(km_events, kms)
        .watches_stream(machine_events, |m| kaironmachine_for_machine(&m))
        .watches_stream(cluster_events, move |c: capi::Cluster| {
            let (name, ns) = (c.name_any(), c.namespace());
            km_store
                .state()
                .into_iter()
                .filter(|km| {
                    km.namespace() == ns && capi::label(&km.metadata, capi::CLUSTER_NAME_LABEL) == Some(name.as_str())
                })
                .map(|km| ObjectRef::from_obj(km.as_ref()))
                .collect::<Vec<_>>()
        })
        .watches_stream(instance_events, |vm| kaironmachine_for_instance(&vm))
        .with_config(ControllerConfig::default().concurrency(settings.machine_concurrency))
        .graceful_shutdown_on(shutdown);
    let task = controller
        .run(
            instrumented("kaironmachine", telemetry.metrics, reconcile),
            super::error_policy,
            ctx,
        )
        .for_each(super::log_outcome);
    (clusters, clusters_synced, task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::PAUSED;
    use crate::kairon::MachineStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn vm(phase: &str) -> Box<kairon::Machine> {
        let mut m = kairon::Machine::new("m1", Default::default());
        m.metadata.namespace = Some("ns".into());
        m.metadata.uid = Some("vm-uid".into());
        m.metadata.annotations = Some([(kairon::FAILURE_DOMAIN_ANNOTATION.to_string(), "zone-a".to_string())].into());
        m.status = Some(MachineStatus {
            phase: Some(phase.into()),
            host_name: Some("node-7".into()),
            addresses: (phase == "Running").then(|| {
                vec![kairon::Address {
                    type_: "InternalIP".into(),
                    address: "10.0.0.7".into(),
                }]
            }),
            reason: (phase == "Failed").then(|| "Unschedulable".into()),
            message: (phase == "Failed").then(|| "no host has 64 CPUs".into()),
            ..Default::default()
        });
        Box::new(m)
    }

    fn cond<'a>(s: &'a KaironMachineStatus, t: &str) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        conditions::get(s.conditions.as_deref().unwrap(), t).unwrap_or_else(|| panic!("no {t} condition"))
    }

    fn waiting(r: &'static str) -> Observed {
        Observed::Waiting(Decided::new(INSTANCE_PROVISIONED, Status::False, r, "waiting"))
    }

    struct Case {
        name: &'static str,
        observed: Observed,
        ready: (&'static str, &'static str),
        instance: (&'static str, &'static str),
        provisioned: bool,
        failure_reason: Option<&'static str>,
    }

    #[test]
    fn status_from_every_observation() {
        let cases = vec![
            Case {
                name: "waiting for infra",
                observed: waiting(reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE),
                ready: ("False", reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE),
                instance: ("False", reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE),
                provisioned: false,
                failure_reason: None,
            },
            Case {
                name: "waiting for cp",
                observed: waiting(reason::WAITING_FOR_CONTROL_PLANE_INITIALIZED),
                ready: ("False", reason::WAITING_FOR_CONTROL_PLANE_INITIALIZED),
                instance: ("False", reason::WAITING_FOR_CONTROL_PLANE_INITIALIZED),
                provisioned: false,
                failure_reason: None,
            },
            Case {
                name: "pending",
                observed: Observed::Instance(vm("Pending")),
                ready: ("False", reason::INSTANCE_PENDING),
                instance: ("False", reason::INSTANCE_PENDING),
                provisioned: false,
                failure_reason: None,
            },
            Case {
                name: "provisioning",
                observed: Observed::Instance(vm("Provisioning")),
                ready: ("False", reason::INSTANCE_PROVISIONING),
                instance: ("False", reason::INSTANCE_PROVISIONING),
                provisioned: false,
                failure_reason: None,
            },
            Case {
                name: "running",
                observed: Observed::Instance(vm("Running")),
                ready: ("True", reason::READY),
                instance: ("True", reason::PROVISIONED),
                provisioned: true,
                failure_reason: None,
            },
            Case {
                name: "stopped",
                observed: Observed::Instance(vm("Stopped")),
                ready: ("False", reason::INSTANCE_STOPPED),
                instance: ("False", reason::INSTANCE_STOPPED),
                provisioned: false,
                failure_reason: None,
            },
            Case {
                name: "failed",
                observed: Observed::Instance(vm("Failed")),
                ready: ("False", reason::INSTANCE_FAILED),
                instance: ("False", reason::INSTANCE_FAILED),
                provisioned: false,
                failure_reason: Some("InsufficientResources"),
            },
            Case {
                name: "terminating",
                observed: Observed::Instance(vm("Terminating")),
                ready: ("False", reason::INSTANCE_TERMINATING),
                instance: ("False", reason::INSTANCE_TERMINATING),
                provisioned: false,
                failure_reason: None,
            },
            Case {
                name: "gone",
                observed: Observed::Gone,
                ready: ("False", reason::INSTANCE_NOT_FOUND),
                instance: ("False", reason::INSTANCE_NOT_FOUND),
                provisioned: false,
                failure_reason: None,
            },
            Case {
                name: "conflict",
                observed: Observed::Conflict { name: "m1".into() },
                ready: ("False", reason::INSTANCE_CONFLICT),
                instance: ("False", reason::INSTANCE_CONFLICT),
                provisioned: false,
                failure_reason: None,
            },
            Case {
                name: "ignition",
                observed: Observed::Terminal {
                    condition: Decided::new(
                        INSTANCE_PROVISIONED,
                        Status::False,
                        reason::UNSUPPORTED_BOOTSTRAP_FORMAT,
                        "format ignition",
                    ),
                    failure_reason: "InvalidConfiguration",
                },
                ready: ("False", reason::UNSUPPORTED_BOOTSTRAP_FORMAT),
                instance: ("False", reason::UNSUPPORTED_BOOTSTRAP_FORMAT),
                provisioned: false,
                failure_reason: Some("InvalidConfiguration"),
            },
        ];
        for c in cases {
            let s = next_status(None, Some(&c.observed), None, false, Some(3), &at(100));
            let ready = cond(&s, READY);
            let inst = cond(&s, INSTANCE_PROVISIONED);
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                c.ready,
                "{}: Ready",
                c.name
            );
            assert_eq!(
                (inst.status.as_str(), inst.reason.as_str()),
                c.instance,
                "{}: InstanceProvisioned",
                c.name
            );
            assert_eq!(s.is_provisioned(), c.provisioned, "{}: provisioned", c.name);
            assert_eq!(s.failure_reason(), c.failure_reason, "{}: failureReason", c.name);
            assert_eq!(cond(&s, PAUSED).status, "False", "{}", c.name);
            assert_eq!(ready.observed_generation, Some(3));
            assert_eq!(
                ready.message, inst.message,
                "{}: Ready carries the instance message",
                c.name
            );
        }
    }

    #[test]
    fn running_instance_fills_contract_fields() {
        let s = next_status(
            None,
            Some(&Observed::Instance(vm("Running"))),
            None,
            false,
            None,
            &at(1),
        );
        assert_eq!(
            s.initialization,
            Some(Initialization {
                provisioned: Some(true)
            })
        );
        assert_eq!(s.addresses.as_ref().unwrap()[0].address, "10.0.0.7");
        assert_eq!(s.failure_domain.as_deref(), Some("zone-a"));
        let i = s.instance.as_ref().unwrap();
        assert_eq!(
            (i.name.as_str(), i.phase.as_deref(), i.host.as_deref()),
            ("m1", Some("Running"), Some("node-7"))
        );
    }

    #[test]
    fn same_observation_twice_gives_the_same_status() {
        // Steady state writes nothing: recomputing from an unchanged world must be equal.
        for observed in [
            Observed::Instance(vm("Running")),
            waiting(reason::WAITING_FOR_BOOTSTRAP_DATA),
            Observed::Gone,
        ] {
            let first = next_status(None, Some(&observed), None, false, Some(1), &at(10));
            let second = next_status(Some(&first), Some(&observed), None, false, Some(1), &at(20));
            assert_eq!(first, second, "{observed:?}");
        }
    }

    #[test]
    fn transition_time_moves_only_with_status() {
        let pending = next_status(
            None,
            Some(&Observed::Instance(vm("Pending"))),
            None,
            false,
            None,
            &at(10),
        );
        let provisioning = next_status(
            Some(&pending),
            Some(&Observed::Instance(vm("Provisioning"))),
            None,
            false,
            None,
            &at(20),
        );
        assert_eq!(
            cond(&provisioning, READY).last_transition_time,
            at(10),
            "False -> False keeps the time"
        );
        assert_eq!(cond(&provisioning, READY).reason, reason::INSTANCE_PROVISIONING);
        let running = next_status(
            Some(&provisioning),
            Some(&Observed::Instance(vm("Running"))),
            None,
            false,
            None,
            &at(30),
        );
        assert_eq!(
            cond(&running, READY).last_transition_time,
            at(30),
            "False -> True moves it"
        );
    }

    #[test]
    fn provisioned_never_flips_back() {
        let running = next_status(
            None,
            Some(&Observed::Instance(vm("Running"))),
            None,
            false,
            None,
            &at(10),
        );
        for later in [
            Observed::Instance(vm("Stopped")),
            Observed::Instance(vm("Failed")),
            Observed::Gone,
        ] {
            let s = next_status(Some(&running), Some(&later), None, false, None, &at(20));
            assert!(s.is_provisioned(), "{later:?}");
            assert_eq!(cond(&s, READY).status, "False", "{later:?}");
        }
    }

    #[test]
    fn paused_only_touches_the_paused_condition() {
        let running = next_status(
            None,
            Some(&Observed::Instance(vm("Running"))),
            None,
            false,
            None,
            &at(10),
        );
        let paused = next_status(
            Some(&running),
            None,
            Some("Cluster spec.paused is set to true"),
            false,
            None,
            &at(20),
        );
        assert_eq!(cond(&paused, PAUSED).status, "True");
        assert_eq!(cond(&paused, PAUSED).reason, reason::PAUSED);
        assert_eq!(cond(&paused, READY), cond(&running, READY));
        assert_eq!(paused.instance, running.instance);
        let resumed = next_status(
            Some(&paused),
            Some(&Observed::Instance(vm("Running"))),
            None,
            false,
            None,
            &at(30),
        );
        assert_eq!(cond(&resumed, PAUSED).status, "False");
        assert_eq!(cond(&resumed, PAUSED).last_transition_time, at(30));
    }

    #[test]
    fn deleting_sets_ready_false_deleting() {
        let s = next_status(
            None,
            Some(&Observed::Instance(vm("Terminating"))),
            None,
            true,
            None,
            &at(10),
        );
        assert_eq!(cond(&s, READY).reason, reason::DELETING);
        assert_eq!(cond(&s, INSTANCE_PROVISIONED).reason, reason::INSTANCE_TERMINATING);
    }

    #[test]
    fn first_failure_sticks() {
        let failed = next_status(
            None,
            Some(&Observed::Instance(vm("Failed"))),
            None,
            false,
            None,
            &at(10),
        );
        let msg = failed
            .deprecated
            .as_ref()
            .unwrap()
            .v1beta1
            .as_ref()
            .unwrap()
            .failure_message
            .clone()
            .unwrap();
        assert!(msg.contains("Unschedulable: no host has 64 CPUs"), "{msg}");
        let gone = next_status(Some(&failed), Some(&Observed::Gone), None, false, None, &at(20));
        assert_eq!(gone.failure_reason(), Some("InsufficientResources"));
    }

    #[test]
    fn cluster_trigger_ignores_status_noise_but_not_pause_or_provisioning() {
        let base = capi::Cluster::new("c", Default::default());
        let mut noise = base.clone();
        noise.metadata.resource_version = Some("99".into());
        assert_eq!(cluster_trigger(&base), cluster_trigger(&noise));
        let mut paused = base.clone();
        paused.spec.paused = Some(true);
        assert_ne!(cluster_trigger(&base), cluster_trigger(&paused));
        let mut provisioned = base.clone();
        provisioned.status = Some(capi::ClusterStatus {
            initialization: Some(capi::ClusterInitialization {
                infrastructure_provisioned: Some(true),
                control_plane_initialized: None,
            }),
        });
        assert_ne!(cluster_trigger(&base), cluster_trigger(&provisioned));
        let mut cp = provisioned.clone();
        cp.status
            .as_mut()
            .unwrap()
            .initialization
            .as_mut()
            .unwrap()
            .control_plane_initialized = Some(true);
        assert_ne!(cluster_trigger(&provisioned), cluster_trigger(&cp));
    }

    #[test]
    fn machine_trigger_fires_when_bootstrap_data_arrives() {
        let base = capi::Machine::new("m", Default::default());
        let mut with_data = base.clone();
        with_data.spec.bootstrap = Some(capi::Bootstrap {
            data_secret_name: Some("s".into()),
        });
        assert_ne!(machine_trigger(&base), machine_trigger(&with_data));
        let mut noise = with_data.clone();
        noise.metadata.resource_version = Some("7".into());
        assert_eq!(machine_trigger(&with_data), machine_trigger(&noise));
    }

    #[test]
    fn watch_mappers() {
        let mut m = capi::Machine::new("m1", Default::default());
        m.metadata.namespace = Some("ns".into());
        assert_eq!(kaironmachine_for_machine(&m), None, "no infrastructureRef");
        m.spec.infrastructure_ref = Some(capi::ContractVersionedObjectReference {
            api_group: "infrastructure.cluster.x-k8s.io".into(),
            kind: "KaironMachine".into(),
            name: "km1".into(),
        });
        assert_eq!(kaironmachine_for_machine(&m), Some(ObjectRef::new("km1").within("ns")));
        m.spec.infrastructure_ref.as_mut().unwrap().kind = "DockerMachine".into();
        assert_eq!(kaironmachine_for_machine(&m), None, "someone else's infrastructure");

        let mut v = *vm("Running");
        assert_eq!(
            kaironmachine_for_instance(&v),
            Some(ObjectRef::new("m1").within("ns")),
            "falls back to its own name"
        );
        v.metadata.labels = Some(
            [
                (labels::KAIRONMACHINE_NAME.to_string(), "km9".to_string()),
                (labels::KAIRONMACHINE_NAMESPACE.to_string(), "other".to_string()),
            ]
            .into(),
        );
        assert_eq!(
            kaironmachine_for_instance(&v),
            Some(ObjectRef::new("km9").within("other"))
        );
    }
}
