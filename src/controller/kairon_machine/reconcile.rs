//! The reconcile workflow: what a KaironMachine reconcile reads, decides and writes, in the
//! contract's order (see the module docs of [`super`]).

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::create::create_instance;
use super::delete::reconcile_delete;
use super::ownership::{Verdict, whose};
use super::status::{Observed, StatusInput, next_status};
use crate::api::conditions::{self, Decided, INSTANCE_PROVISIONED, Status, reason};
use crate::api::{self, KaironCluster, KaironIdentityReference, KaironMachine, KaironMachineStatus, MACHINE_FINALIZER};
use crate::capi;
use crate::controller::runtime::{owning_cluster, pause_step};
use crate::controller::write::{Writer, has_finalizer};
use crate::controller::{Endpoints, Error, Fresher, Settings, Synced};
use crate::events::{Events, reason as event};
use crate::kairon::{self, Instances, KaironError, provider_id};
use crate::metrics::Metrics;

/// How often to look again at a Kairon API that cannot be used (identity Secret, reachability).
pub(super) const ENDPOINT_RETRY: Duration = Duration::from_secs(15);

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
pub(super) struct Scope {
    pub(super) km: Arc<KaironMachine>,
    pub(super) ns: String,
    pub(super) machine: Option<Arc<capi::Machine>>,
    pub(super) cluster: Option<Arc<capi::Cluster>>,
    /// From the cluster-name label, else the Machine's `spec.clusterName`; empty if neither.
    pub(super) cluster_name: String,
}

impl Scope {
    /// The KaironCluster the machine's Cluster names as its infrastructure, if any.
    pub(super) fn kaironcluster_name(&self) -> Option<&str> {
        self.cluster
            .as_deref()
            .and_then(|c| c.infrastructure_name(api::GROUP, "KaironCluster"))
    }
}

/// The Kairon API a KaironMachine's VM lives on, and the identity that names it (`None`:
/// the manager's own).
pub(super) struct Target {
    pub(super) instances: Instances,
    pub(super) store: Store<kairon::Machine>,
    pub(super) identity: Option<KaironIdentityReference>,
    /// Which Kairon API this is (`None`: the manager's own), recorded with the VM found there.
    pub(super) endpoint: Option<String>,
    /// The Kairon API the VM was recorded on, when the identity names another one now: a VM
    /// not found here is not gone, it is elsewhere ([`Target::elsewhere`]).
    pub(super) moved_from: Option<String>,
}

impl Target {
    /// What is observed of a VM that is not on this Kairon API when the identity has been
    /// pointed elsewhere since the VM was recorded: the VM lives on (as far as anyone here can
    /// tell) where it was, so the last known status is kept and nothing is created or released.
    /// `None` when the identity names the API the VM was recorded on.
    pub(super) fn elsewhere(&self, name: &str) -> Option<Observed> {
        let was = self.moved_from.as_deref()?;
        let identity = self
            .identity
            .as_ref()
            .map(|i| format!("identity {} {}", i.kind, i.name))
            .unwrap_or_else(|| "the identity".into());
        Some(Observed::Waiting(Decided::new(
            INSTANCE_PROVISIONED,
            Status::Unknown,
            reason::INSTANCE_ENDPOINT_CHANGED,
            format!(
                "Kairon Machine {name} was recorded on Kairon API {was}; {identity} now names another one ({}), \
                 where it is not: it is not taken as gone, and nothing is created or deleted until the identity \
                 names the Kairon API that holds it again",
                self.endpoint.as_deref().unwrap_or_default()
            ),
        )))
    }
}

/// How the reconcile goes on after a step: with what the step produced, or stopping with what
/// was observed (and when to look again).
pub(super) enum Step<T> {
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

    pub(super) fn writer(&self, ns: &str) -> Writer<'_, KaironMachine> {
        Writer::new(Api::namespaced(self.client.clone(), ns), Some(&self.fresh))
    }

    pub(super) fn resync(&self) -> Action {
        Action::requeue(self.settings.sync_period)
    }

    fn default_target(&self) -> Target {
        Target {
            instances: self.kairon.clone(),
            store: self.instances.clone(),
            identity: None,
            endpoint: None,
            moved_from: None,
        }
    }

    /// The Kairon API of the KaironMachine: the one its VM was created on (recorded in
    /// status, so that deletion talks to it whatever happened since), else the one its
    /// KaironCluster names. Stops, saying why, when that API cannot be used now.
    pub(super) async fn target(&self, scope: &Scope) -> Result<Step<Target>, Error> {
        let Some(endpoints) = &self.endpoints else {
            return Ok(Step::Continue(self.default_target()));
        };
        let instance = scope.km.status.as_ref().and_then(|s| s.instance.as_ref());
        let recorded = instance.map(|i| i.identity_ref.clone());
        let recorded_endpoint = instance.and_then(|i| i.endpoint.clone());
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
        let fingerprint = endpoint.fingerprint().to_string();
        Ok(Step::Continue(Target {
            moved_from: recorded_endpoint.filter(|e| *e != fingerprint),
            endpoint: Some(fingerprint),
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
    if vm.is_none() && (km.spec.provider_id.is_some() || target.moved_from.is_some()) {
        // The cache may lag behind a create we just made: ask the API before concluding the
        // VM is gone. On a Kairon API other than the one it was recorded on, a VM not found
        // is elsewhere, not gone, and is not created again here.
        vm = target.instances.get(ns, &name).await?;
        if vm.is_none() {
            let observed = target.elsewhere(&name).unwrap_or(Observed::Gone);
            return Ok(Step::Stop(observed, retry_elsewhere(target, ctx)));
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
        if let Some(elsewhere) = target.elsewhere(&name) {
            return Ok(Step::Stop(elsewhere, retry_elsewhere(target, ctx)));
        }
        warn!(instance = %name, "the Kairon Machine with this name is not the one spec.providerID names");
        return Ok(Step::Stop(Observed::Gone, ctx.resync()));
    }

    match whose(&vm, km, &ctx.client, target.instances.owner()).await? {
        Verdict::NotOurs(why) => {
            warn!(instance = %name, %why, "a Kairon Machine with this name is not this KaironMachine's");
            return Ok(Step::Stop(Observed::Conflict { name, why }, ctx.resync()));
        }
        Verdict::Adopt => {
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
        Verdict::Ours => {}
    }

    if km.spec.provider_id.is_none()
        && let Some(uid) = vm.metadata.uid.as_deref()
    {
        let body = json!({"spec": {"providerID": provider_id(uid)}});
        ctx.writer(ns).merge_patch(km, "spec.providerID", body).await?;
    }
    Ok(Step::Continue(vm))
}

/// When to look again: soon while the VM is elsewhere (the identity may be pointed back, and
/// nothing else triggers a reconcile then), at the resync otherwise.
pub(super) fn retry_elsewhere(target: &Target, ctx: &Context) -> Action {
    if target.moved_from.is_some() {
        Action::requeue(ENDPOINT_RETRY)
    } else {
        ctx.resync()
    }
}

/// Writes the status that follows from `input`, if it differs; returns what it wrote.
/// With the `target` its VM was seen on, the identity and endpoint holding it are recorded.
pub(super) async fn write_status(
    ctx: &Context,
    km: &KaironMachine,
    input: StatusInput<'_>,
    target: Option<&Target>,
) -> Result<Option<KaironMachineStatus>, Error> {
    let mut next = next_status(km.status.as_ref(), input, km.metadata.generation, &conditions::now());
    // Only a VM seen on the target's Kairon API records it: a status kept while the VM is
    // elsewhere keeps the endpoint that holds it.
    let seen = matches!(
        input,
        StatusInput::Live(Observed::Instance(_)) | StatusInput::Deleting(Observed::Instance(_))
    );
    if let (Some(target), Some(instance), true) = (target, next.instance.as_mut(), seen) {
        instance.identity_ref = target.identity.clone();
        instance.endpoint = target.endpoint.clone();
    }
    let ns = km.namespace().ok_or(Error::MissingNamespace)?;
    let wrote = ctx.writer(&ns).apply_status(km, km.status.as_ref(), &next).await?;
    Ok(wrote.then_some(next))
}
