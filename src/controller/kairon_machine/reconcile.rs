//! The reconcile workflow: what a KaironMachine reconcile reads, decides and writes, in the
//! contract's order (see the module docs of [`super`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::status::{Observed, StatusInput, next_status};
use crate::api::conditions::{self, Decided, INSTANCE_PROVISIONED, Status, reason};
use crate::api::{self, KaironCluster, KaironIdentityReference, KaironMachine, KaironMachineStatus, MACHINE_FINALIZER};
use crate::capi::{self, bootstrap};
use crate::controller::runtime::{owning_cluster, pause_step};
use crate::controller::write::{Writer, has_finalizer};
use crate::controller::{Endpoints, Error, Fresher, Settings, Synced};
use crate::events::{Events, reason as event};
use crate::kairon::{
    self, Created, Deletion, Instances, KaironError, Ownership, desired_kairon_machine, ownership, provider_id,
};
use crate::metrics::Metrics;

/// How often to look again for a bootstrap Secret that is named but missing (Secrets are read
/// with a single GET, never watched).
const SECRET_RETRY: Duration = Duration::from_secs(20);
/// How often to look again while a Kairon Machine is being deleted, on top of its watch.
const DELETE_RETRY: Duration = Duration::from_secs(30);
/// How often to look again at a Kairon API that cannot be used (identity Secret, reachability).
const ENDPOINT_RETRY: Duration = Duration::from_secs(15);

/// What the reconciler needs: clients, settings and the caches its watches fill.
pub struct Context {
    /// The management cluster.
    pub client: Client,
    /// Where Kairon Machines live for clusters without an identity (the management cluster
    /// unless configured otherwise).
    pub kairon: Instances,
    /// The Kairon APIs of identities (`KaironCluster.spec.identityRef`); `None`: identities
    /// are not looked at and every VM is on `kairon` (request-sequence tests).
    pub endpoints: Option<Arc<Endpoints>>,
    /// KaironClusters, for the identity of a machine whose VM is not created yet.
    pub kaironclusters: Store<KaironCluster>,
    pub settings: Settings,
    pub machines: Store<capi::Machine>,
    pub clusters: Store<capi::Cluster>,
    pub instances: Store<kairon::Machine>,
    /// First lists of `machines`, `clusters`, `instances` and `kaironclusters`.
    pub synced: Vec<Synced>,
    /// Events on KaironMachines (disabled in mock tests).
    pub events: Events,
    pub metrics: Arc<Metrics>,
    /// Our last writes to KaironMachines the cache has not shown yet.
    pub fresh: Fresher<KaironMachine>,
}

/// What a reconcile has read before deciding anything: the KaironMachine (as fresh as we know
/// it), its owner Machine and its Cluster from the caches.
struct Scope {
    km: Arc<KaironMachine>,
    ns: String,
    machine: Option<Arc<capi::Machine>>,
    cluster: Option<Arc<capi::Cluster>>,
    /// From the cluster-name label, else the Machine's `spec.clusterName`; empty if neither.
    cluster_name: String,
}

impl Scope {
    /// The KaironCluster the machine's Cluster names as its infrastructure, if any.
    fn kaironcluster_name(&self) -> Option<&str> {
        self.cluster
            .as_deref()
            .and_then(|c| c.infrastructure_name(api::GROUP, "KaironCluster"))
    }
}

/// The Kairon API a KaironMachine's VM lives on, and the identity that names it (`None`:
/// the manager's own).
pub(super) struct Target {
    instances: Instances,
    store: Store<kairon::Machine>,
    identity: Option<KaironIdentityReference>,
}

/// How the reconcile goes on after a step: with what the step produced, or stopping with what
/// was observed (and when to look again).
enum Step<T> {
    Continue(T),
    Stop(Observed, Action),
}

impl Context {
    /// Reads the owner Machine and the Cluster of `km` from the caches.
    fn dereference(&self, km: Arc<KaironMachine>) -> Result<Scope, Error> {
        let km = self.fresh.freshest(km);
        let ns = km.namespace().ok_or(Error::MissingNamespace)?;
        let machine =
            capi::owner(&km.metadata, "Machine").and_then(|o| self.machines.get(&ObjectRef::new(&o.name).within(&ns)));
        let cluster_name = capi::cluster_name(&km.metadata)
            .map(str::to_string)
            .or_else(|| {
                machine
                    .as_ref()
                    .map(|m| m.spec.cluster_name.clone())
                    .filter(|c| !c.is_empty())
            })
            .unwrap_or_default();
        let cluster = owning_cluster(
            &self.clusters,
            &ns,
            Some(cluster_name.as_str()).filter(|c| !c.is_empty()),
        );
        Ok(Scope {
            km,
            ns,
            machine,
            cluster,
            cluster_name,
        })
    }

    fn writer(&self, ns: &str) -> Writer<'_, KaironMachine> {
        Writer::new(Api::namespaced(self.client.clone(), ns), Some(&self.fresh))
    }

    fn resync(&self) -> Action {
        Action::requeue(self.settings.sync_period)
    }

    fn default_target(&self) -> Target {
        Target {
            instances: self.kairon.clone(),
            store: self.instances.clone(),
            identity: None,
        }
    }

    /// The Kairon API of the KaironMachine: the one its VM was created on (recorded in
    /// status, so that deletion talks to it whatever happened since), else the one its
    /// KaironCluster names. Stops, saying why, when that API cannot be used now.
    async fn target(&self, scope: &Scope) -> Result<Step<Target>, Error> {
        let Some(endpoints) = &self.endpoints else {
            return Ok(Step::Continue(self.default_target()));
        };
        let recorded = scope
            .km
            .status
            .as_ref()
            .and_then(|s| s.instance.as_ref())
            .map(|i| i.identity_ref.clone());
        let identity = match recorded {
            Some(identity) => identity,
            // No Cluster: nothing will be created (that waits for the Cluster's
            // infrastructure), and a VM that exists anyway can only be on the default API —
            // it is looked at there, as without identities.
            None if scope.cluster.is_none() => None,
            None => match self.named_identity(scope).await? {
                Some(identity) => identity,
                None => {
                    let d = Decided::new(
                        INSTANCE_PROVISIONED,
                        Status::False,
                        reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
                        format!("waiting for the KaironCluster of Cluster {}", scope.cluster_name),
                    );
                    return Ok(Step::Stop(Observed::Waiting(d), Action::requeue(ENDPOINT_RETRY)));
                }
            },
        };
        let Some(identity) = identity else {
            return Ok(Step::Continue(self.default_target()));
        };
        let unavailable = |r: &'static str, why: String| {
            let why = format!("the Kairon API of identity {} {}: {why}", identity.kind, identity.name);
            let d = Decided::new(
                INSTANCE_PROVISIONED,
                Status::Unknown,
                r,
                crate::text::bounded(&why, 1024),
            );
            Ok(Step::Stop(Observed::Waiting(d), Action::requeue(ENDPOINT_RETRY)))
        };
        let endpoint = match endpoints.endpoint(&scope.ns, &identity).await {
            Ok(e) => e,
            Err(e) => return unavailable(e.reason(), e.to_string()),
        };
        if let Err(why) = endpoint.ready().await {
            return unavailable(reason::KAIRON_API_UNAVAILABLE, why);
        }
        Ok(Step::Continue(Target {
            instances: endpoint.instances,
            store: endpoint.store,
            identity: Some(identity),
        }))
    }

    /// The identity the KaironCluster of the machine's Cluster names (`Some(None)`: none);
    /// `None` while that KaironCluster is not known.
    async fn named_identity(&self, scope: &Scope) -> Result<Option<Option<KaironIdentityReference>>, Error> {
        let Some(kc_name) = scope.kaironcluster_name() else {
            return Ok(None);
        };
        let ns = scope.ns.as_str();
        if let Some(kc) = self.kaironclusters.get(&ObjectRef::new(kc_name).within(ns)) {
            return Ok(Some(kc.spec.identity_ref.clone()));
        }
        // The cache may lag behind a KaironCluster just created: ask before deciding.
        let kc = Api::<KaironCluster>::namespaced(self.client.clone(), ns)
            .get_opt(kc_name)
            .await
            .map_err(Error::read(format!("KaironCluster {ns}/{kc_name}")))?;
        Ok(kc.map(|kc| kc.spec.identity_ref))
    }
}

/// Reconciles one KaironMachine.
pub async fn reconcile(km: Arc<KaironMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    Synced::all(&ctx.synced).await?;
    let scope = ctx.dereference(km)?;
    let km = scope.km.as_ref();

    let why = capi::paused_reason(scope.cluster.as_deref(), &km.metadata);
    let current = km.status.as_ref().and_then(|s| s.conditions.as_deref());
    let c = ctx.as_ref();
    if let Some(action) = pause_step(why, current, |why| async move {
        write_status(c, km, StatusInput::Paused(why), None).await.map(|_| ())
    })
    .await?
    {
        return Ok(action);
    }
    if km.metadata.deletion_timestamp.is_some() {
        return reconcile_delete(&scope, &ctx).await;
    }
    // The contract: until CAPI has made a Machine the owner, nothing is done, not even the
    // finalizer.
    let Some(machine) = scope.machine.as_deref() else {
        debug!("waiting for an owner Machine");
        return Ok(Action::await_change());
    };
    // An ownerReference anyone could have written is not enough: the Machine must be that
    // very one (UID) and must name this KaironMachine. Otherwise nothing is created.
    if let Some(why) = capi::owner(&km.metadata, "Machine").and_then(|o| machine.not_owner_of(o, &km.name_any())) {
        let observed = Observed::Waiting(Decided::new(
            INSTANCE_PROVISIONED,
            Status::False,
            reason::OWNER_MACHINE_MISMATCH,
            why,
        ));
        write_status(&ctx, km, StatusInput::Live(&observed), None).await?;
        return Ok(Action::await_change());
    }
    if !has_finalizer(km, MACHINE_FINALIZER) {
        ctx.writer(&scope.ns).add_finalizer(km, MACHINE_FINALIZER).await?;
    }
    let target = match ctx.target(&scope).await? {
        Step::Continue(t) => t,
        Step::Stop(observed, action) => {
            write_status(&ctx, km, StatusInput::Live(&observed), None).await?;
            return Ok(action);
        }
    };
    let (observed, action) = match reconcile_instance(&scope, machine, &ctx, &target).await {
        Ok(Step::Continue(vm)) => (Observed::Instance(Box::new(vm)), ctx.resync()),
        Ok(Step::Stop(observed, action)) => (observed, action),
        Err(Error::Kairon(e @ KaironError::Create { .. })) => {
            report_create_failure(km, &e, &ctx).await?;
            // An error, so that the object backs off and the failure is counted.
            return Err(e.into());
        }
        Err(e) => return Err(e),
    };
    // The status goes against the KaironMachine as this reconcile's own writes left it: the
    // providerID patch raised the generation, and conditions naming the old one would be
    // written again, with nothing else changed, by the next reconcile.
    let km = ctx.fresh.after_our_writes(scope.km.clone());
    if let Some(next) = write_status(&ctx, &km, StatusInput::Live(&observed), Some(&target)).await? {
        report_transitions(&km, &next, &ctx).await;
    }
    Ok(action)
}

/// A create Kairon rejected: the condition says so with the answer's code and reason (the
/// error never carries the request, which held bootstrap data), and a Warning event when it
/// first happens.
async fn report_create_failure(km: &KaironMachine, e: &KaironError, ctx: &Context) -> Result<(), Error> {
    let observed = Observed::Waiting(Decided::new(
        INSTANCE_PROVISIONED,
        Status::False,
        reason::INSTANCE_CREATE_FAILED,
        e.to_string(),
    ));
    if write_status(ctx, km, StatusInput::Live(&observed), None)
        .await?
        .is_some()
    {
        ctx.events
            .warning(km, event::INSTANCE_CREATE_FAILED, "Create", e.to_string())
            .await;
    }
    Ok(())
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

/// Ensures the Kairon Machine exists (when it may), is ours, and is named by our providerID.
async fn reconcile_instance(
    scope: &Scope,
    machine: &capi::Machine,
    ctx: &Context,
    target: &Target,
) -> Result<Step<kairon::Machine>, Error> {
    let km = scope.km.as_ref();
    let ns = scope.ns.as_str();
    let name = km.name_any();

    let mut vm = target
        .store
        .get(&ObjectRef::new(&name).within(ns))
        .map(|vm| (*vm).clone());
    if vm.is_none() && km.spec.provider_id.is_some() {
        // The cache may lag behind a create we just made: ask the API before concluding the
        // VM is gone.
        vm = target.instances.get(ns, &name).await?;
        if vm.is_none() {
            return Ok(Step::Stop(Observed::Gone, ctx.resync()));
        }
    }
    let vm = match vm {
        Some(vm) => vm,
        None => match create_instance(scope, machine, ctx, target).await? {
            Step::Continue(vm) => vm,
            Step::Stop(observed, action) => return Ok(Step::Stop(observed, action)),
        },
    };
    // Our providerID names the VM we provisioned. A Kairon Machine under the same name with
    // another UID (a restore, a re-create by hand) is not that VM, whatever its labels say:
    // its addresses are not our node's. The instance is gone.
    if let Some(pid) = km.spec.provider_id.as_deref()
        && vm.metadata.uid.as_deref().map(provider_id).as_deref() != Some(pid)
    {
        warn!(instance = %name, "the Kairon Machine with this name is not the one spec.providerID names");
        return Ok(Step::Stop(Observed::Gone, ctx.resync()));
    }

    match ownership(&vm, km) {
        Ownership::Foreign => {
            warn!(instance = %name, "a Kairon Machine with this name belongs to someone else");
            let why = "its labels name another KaironMachine".to_string();
            return Ok(Step::Stop(Observed::Conflict { name, why }, ctx.resync()));
        }
        Ownership::OursBeforeMove => {
            if let Some(why) = refuse_adoption(&vm, km, ctx, target).await? {
                warn!(instance = %name, %why, "not adopting the Kairon Machine named by spec.providerID");
                return Ok(Step::Stop(Observed::Conflict { name, why }, ctx.resync()));
            }
            info!(instance = %name, "adopting the Kairon Machine named by spec.providerID");
            target.instances.adopt(&vm, km).await?;
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
        let body = json!({"spec": {"providerID": provider_id(uid)}});
        ctx.writer(ns).merge_patch(km, "spec.providerID", body).await?;
    }
    Ok(Step::Continue(vm))
}

/// Why `vm`, which `km`'s providerID names, must not be adopted: `spec.providerID` can be set
/// by whoever creates a KaironMachine, so it alone proves nothing. A VM is adopted only from
/// this management cluster (or one it adopts from), and only when the KaironMachine its labels
/// name is gone, as after `clusterctl move`.
async fn refuse_adoption(
    vm: &kairon::Machine,
    km: &KaironMachine,
    ctx: &Context,
    target: &Target,
) -> Result<Option<String>, Error> {
    let labels = vm.labels();
    if let Err(why) = target
        .instances
        .owner()
        .may_adopt(labels.get(kairon::labels::MANAGEMENT_CLUSTER).map(String::as_str))
    {
        return Ok(Some(why));
    }
    let Some(uid) = labels.get(kairon::labels::KAIRONMACHINE_UID) else {
        return Ok(None);
    };
    let ns = labels
        .get(kairon::labels::KAIRONMACHINE_NAMESPACE)
        .cloned()
        .or_else(|| vm.namespace())
        .unwrap_or_default();
    let name = labels
        .get(kairon::labels::KAIRONMACHINE_NAME)
        .cloned()
        .unwrap_or_else(|| vm.name_any());
    let holder = Api::<KaironMachine>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&name)
        .await
        .map_err(Error::read(format!("KaironMachine {ns}/{name}")))?;
    Ok(holder
        .filter(|h| h.metadata.uid.as_ref() == Some(uid) && h.metadata.uid != km.metadata.uid)
        .map(|_| format!("it belongs to KaironMachine {ns}/{name}, which still exists")))
}

/// Creates the Kairon Machine once everything it needs is there: cluster infrastructure,
/// bootstrap data, the failure domain. Stops with what is still missing otherwise.
async fn create_instance(
    scope: &Scope,
    machine: &capi::Machine,
    ctx: &Context,
    target: &Target,
) -> Result<Step<kairon::Machine>, Error> {
    let cluster = scope.cluster.as_deref();
    let waiting = |r: &'static str, msg: String| {
        Ok(Step::Stop(
            Observed::Waiting(Decided::new(INSTANCE_PROVISIONED, Status::False, r, msg)),
            ctx.resync(),
        ))
    };

    if !cluster.is_some_and(capi::Cluster::infrastructure_provisioned) {
        return waiting(
            reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
            format!("waiting for the infrastructure of Cluster {}", scope.cluster_name),
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
    let user_data = match read_bootstrap_data(scope, machine, secret_name, ctx).await? {
        Step::Continue(data) => data,
        Step::Stop(observed, action) => return Ok(Step::Stop(observed, action)),
    };

    let failure_domain = match machine.failure_domain() {
        None => None,
        Some(fd) => match find_failure_domain(scope, fd, ctx).await? {
            Some(spec) => Some(spec),
            None => {
                return waiting(
                    reason::FAILURE_DOMAIN_NOT_FOUND,
                    format!("failure domain {fd} is not defined on the KaironCluster"),
                );
            }
        },
    };

    let km = scope.km.as_ref();
    let desired = desired_kairon_machine(km, &scope.cluster_name, user_data, failure_domain.as_ref());
    let vm = match target.instances.create(desired).await? {
        Created::New(vm) => {
            let (ns, name) = (&scope.ns, km.name_any());
            info!(instance = %name, "created Kairon Machine");
            ctx.events
                .normal(
                    km,
                    event::INSTANCE_CREATED,
                    "Create",
                    format!("created Kairon Machine {ns}/{name}"),
                )
                .await;
            vm
        }
        // Created by an earlier reconcile the cache has not seen yet, or by someone else: the
        // ownership check decides.
        Created::Existing(vm) => vm,
    };
    Ok(Step::Continue(vm))
}

/// Reads the bootstrap data with one GET of the one Secret (no cluster-wide Secret cache), if
/// that Secret may be the Machine's bootstrap data.
async fn read_bootstrap_data(
    scope: &Scope,
    machine: &capi::Machine,
    secret_name: &str,
    ctx: &Context,
) -> Result<Step<String>, Error> {
    let ns = scope.ns.as_str();
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
        return Ok(Step::Stop(Observed::Waiting(d), Action::requeue(SECRET_RETRY)));
    };
    let data = bootstrap::check_source(&secret, machine.bootstrap_config())
        .and_then(|()| bootstrap::bootstrap_data(&secret, ctx.settings.max_bootstrap_data_bytes));
    Ok(match data {
        Ok(data) => Step::Continue(data),
        Err(e) if e.is_terminal() => {
            let condition = Decided::new(INSTANCE_PROVISIONED, Status::False, e.reason(), e.to_string());
            Step::Stop(
                Observed::Terminal {
                    condition,
                    failure_reason: "InvalidConfiguration",
                },
                Action::await_change(),
            )
        }
        Err(e) => {
            let d = Decided::new(INSTANCE_PROVISIONED, Status::False, e.reason(), e.to_string());
            Step::Stop(Observed::Waiting(d), Action::requeue(SECRET_RETRY))
        }
    })
}

/// The failure domain named by the Machine, from the KaironCluster.
async fn find_failure_domain(
    scope: &Scope,
    name: &str,
    ctx: &Context,
) -> Result<Option<api::FailureDomainSpec>, Error> {
    let ns = scope.ns.as_str();
    let Some(kc_name) = scope.kaironcluster_name() else {
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
async fn reconcile_delete(scope: &Scope, ctx: &Context) -> Result<Action, Error> {
    let km = scope.km.as_ref();
    let ns = scope.ns.as_str();
    if !has_finalizer(km, MACHINE_FINALIZER) {
        return Ok(Action::await_change());
    }
    let release = || async {
        ctx.writer(ns).remove_finalizer(km, MACHINE_FINALIZER).await?;
        Ok::<_, Error>(Action::await_change())
    };
    if capi::has_annotation(&km.metadata, capi::DELETE_FOR_MOVE_ANNOTATION) {
        // Moved to another management cluster: the VM lives on there.
        info!("deleted for clusterctl move; the Kairon Machine is kept");
        return release().await;
    }
    let name = km.name_any();
    if cluster_is_gone(scope, ctx).await? {
        // In CAPI's own flow the Cluster outlives its machines. A KaironMachine deleted after
        // its Cluster is gone was left behind (by a `clusterctl move` that did not know our
        // kinds, say) while the cluster lives on elsewhere: its VM is not ours to destroy.
        warn!(instance = %name, cluster = %scope.cluster_name, "the Cluster is gone; the Kairon Machine is kept");
        ctx.metrics.instances_kept.inc();
        ctx.events
            .warning(
                km,
                event::INSTANCE_KEPT,
                "Delete",
                format!(
                    "Cluster {} no longer exists: Kairon Machine {ns}/{name} is kept, not deleted",
                    scope.cluster_name
                ),
            )
            .await;
        return release().await;
    }
    let target = match ctx.target(scope).await? {
        Step::Continue(t) => t,
        Step::Stop(observed, action) => {
            write_status(ctx, km, StatusInput::Deleting(&observed), None).await?;
            return Ok(action);
        }
    };
    // Authoritative read: the finalizer must not go while the VM exists.
    let Some(vm) = target.instances.get(ns, &name).await? else {
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
        match target.instances.delete(&vm).await? {
            Deletion::Started => info!(instance = %name, "deleting Kairon Machine"),
            Deletion::Gone => return release().await,
        }
    }
    write_status(
        ctx,
        km,
        StatusInput::Deleting(&Observed::Instance(Box::new(vm))),
        Some(&target),
    )
    .await?;
    Ok(Action::requeue(DELETE_RETRY))
}

/// Whether the KaironMachine's Cluster no longer exists, asked of the API server when the cache
/// does not have it (it may lag behind a Cluster just created).
async fn cluster_is_gone(scope: &Scope, ctx: &Context) -> Result<bool, Error> {
    if scope.cluster.is_some() {
        return Ok(false);
    }
    if scope.cluster_name.is_empty() {
        return Ok(true);
    }
    let clusters: Api<capi::Cluster> = Api::namespaced(ctx.client.clone(), &scope.ns);
    let cluster = clusters
        .get_opt(&scope.cluster_name)
        .await
        .map_err(Error::read(format!("Cluster {}/{}", scope.ns, scope.cluster_name)))?;
    Ok(cluster.is_none())
}

/// Writes the status that follows from `input`, if it differs; returns what it wrote.
/// With the `target` the status observed, the identity its VM lives on is recorded with it.
pub(super) async fn write_status(
    ctx: &Context,
    km: &KaironMachine,
    input: StatusInput<'_>,
    target: Option<&Target>,
) -> Result<Option<KaironMachineStatus>, Error> {
    let mut next = next_status(km.status.as_ref(), input, km.metadata.generation, &conditions::now());
    if let (Some(target), Some(instance)) = (target, next.instance.as_mut()) {
        instance.identity_ref = target.identity.clone();
    }
    let ns = km.namespace().ok_or(Error::MissingNamespace)?;
    let wrote = ctx.writer(&ns).apply_status(km, km.status.as_ref(), &next).await?;
    Ok(wrote.then_some(next))
}
