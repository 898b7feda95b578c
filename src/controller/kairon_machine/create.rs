//! The create path: once the cluster's infrastructure, the bootstrap data and the failure
//! domain are there, one Kairon Machine under the KaironMachine's name.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tracing::info;

use super::checked_configs::CheckedKey;
use super::context::{Context, Scope, Step, Target};
use super::status::Observed;
use crate::api::conditions::{Decided, INSTANCE_PROVISIONED, Status, reason};
use crate::api::{self, KaironCluster};
use crate::capi::{self, bootstrap, bootstrap::Source};
use crate::controller::error::Error;
use crate::kairon::cloud_init::{GuestFacts, translate_off_runtime};
use crate::kairon::{self, Created, desired_kairon_machine};

/// How often to look again for a bootstrap Secret that is named but missing (Secrets are read
/// with a single GET, never watched).
const SECRET_RETRY: Duration = Duration::from_secs(20);

/// Creates the Kairon Machine once everything it needs is there: cluster infrastructure,
/// bootstrap data, the failure domain. Stops with what is still missing otherwise.
pub(super) async fn create_instance(
    scope: &Scope,
    machine: &capi::MachineView,
    ctx: &Context,
    target: &Target,
) -> Result<Step<kairon::Vm>, Error> {
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
    // Before any VM: a control plane no peer could reach would only time out in kubeadm.
    if machine.is_control_plane()
        && let Some(why) = kairon::network::control_plane_unreachable(scope.km.spec.network.as_ref())
    {
        return Ok(Step::Stop(
            Observed::Waiting(Decided::new(
                INSTANCE_PROVISIONED,
                Status::False,
                reason::CONTROL_PLANE_NETWORK_UNREACHABLE,
                why,
            )),
            // The spec is immutable: nothing but a new KaironMachine changes the verdict.
            Action::await_change(),
        ));
    }
    // A member of a MachinePool: CAPI's Machine for it names no bootstrap data; the pool's
    // one Secret, made for the MachinePool, is every member's.
    let pool = match pool_of(machine, &scope.ns, ctx) {
        PoolOf::None => None,
        PoolOf::Found(mp) => Some(mp),
        PoolOf::Missing(name) => {
            return waiting(
                reason::WAITING_FOR_BOOTSTRAP_DATA,
                format!("waiting for MachinePool {name}, whose bootstrap data the pool member's is"),
            );
        }
    };
    let (secret_name, owner): (Option<&str>, bootstrap::ConfigOwner<'_>) = match pool.as_deref() {
        Some(mp) => (mp.data_secret_name(), mp.into()),
        None => (machine.data_secret_name(), machine.into()),
    };
    let Some(secret_name) = secret_name else {
        if !machine.is_control_plane() && !cluster.is_some_and(capi::Cluster::control_plane_initialized) {
            return waiting(
                reason::WAITING_FOR_CONTROL_PLANE_INITIALIZED,
                "waiting for the control plane to be initialized".into(),
            );
        }
        return waiting(reason::WAITING_FOR_BOOTSTRAP_DATA, "waiting for bootstrap data".into());
    };
    let user_data = match read_bootstrap_data(scope, owner, secret_name, ctx).await? {
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
    // Kairon has no raw user-data: the bootstrap data becomes its structured cloudInit, the
    // guest's hostname (and NoCloud instance-id) the Machine's name.
    let facts = GuestFacts::kairon(&km.name_any());
    let max_decoded = 2 * ctx.settings.max_bootstrap_data_bytes;
    let cloud_init = match translate_off_runtime(user_data, facts, max_decoded).await {
        Ok(cloud_init) => cloud_init,
        Err(e) => {
            // The same data fails again: terminal until the bootstrap config changes. The
            // message names a key, field, path or line, never content.
            let condition = Decided::new(
                INSTANCE_PROVISIONED,
                Status::False,
                reason::UNSUPPORTED_BOOTSTRAP_DATA,
                format!("bootstrap data cannot be given to Kairon: {e}"),
            );
            return Ok(Step::Stop(
                Observed::Terminal {
                    condition,
                    failure_reason: "InvalidConfiguration",
                },
                Action::await_change(),
            ));
        }
    };
    let desired = desired_kairon_machine(
        km,
        &scope.cluster_name,
        machine.is_control_plane(),
        cloud_init,
        failure_domain.as_ref(),
    );
    if !target.instances.is_discovered() {
        return waiting(
            reason::KAIRON_API_UNAVAILABLE,
            "the Kairon API has not said yet which versions of Kairon's kinds it serves".into(),
        );
    }
    // Kairon's API server would drop a field its schema lacks: a VM without its boot disk or
    // placement. Terminal until the KaironMachine (or Kairon) changes.
    if let Some(gap) = target.instances.served().unsupported(&desired) {
        let condition = Decided::new(
            INSTANCE_PROVISIONED,
            Status::False,
            reason::KAIRON_FIELD_UNSUPPORTED,
            format!("{gap}: no Kairon Machine is created"),
        );
        return Ok(Step::Stop(
            Observed::Terminal {
                condition,
                failure_reason: "InvalidConfiguration",
            },
            Action::await_change(),
        ));
    }
    let vm = match target.instances.create(desired).await? {
        // No event of its own: the one the VM running publishes (`InstanceProvisioned`) names
        // it, and a VM that never runs says why in the KaironMachine's conditions. One write
        // per machine less on the path every machine takes.
        Created::New(vm) => {
            info!(instance = %km.name_any(), "created Kairon Machine");
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
    owner: bootstrap::ConfigOwner<'_>,
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
    let trusted = match bootstrap::check_source(&secret, owner) {
        Ok(Source::Given) => Ok(()),
        Ok(Source::Config(made_by)) => {
            // A MachinePool's one Secret serves every member: its config, once found to be the
            // MachinePool's, is not read again for each.
            let key = (owner.kind == "MachinePool").then(|| CheckedKey {
                secret: secret.metadata.uid.clone().unwrap_or_default(),
                config: made_by.uid.clone(),
                owner: owner.uid.unwrap_or_default().to_string(),
            });
            if key.as_ref().is_some_and(|k| ctx.checked_configs.contains(k)) {
                Ok(())
            } else {
                let checked = check_bootstrap_config(&secret, ns, made_by, owner, ctx).await?;
                if let (Ok(()), Some(key)) = (&checked, key) {
                    ctx.checked_configs.insert(key);
                }
                checked
            }
        }
        Err(e) => Err(e),
    };
    let data = trusted.and_then(|()| bootstrap::bootstrap_data(&secret, ctx.settings.max_bootstrap_data_bytes));
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

/// The MachinePool a Machine belongs to, if its controller is one.
enum PoolOf {
    None,
    Found(Arc<capi::MachinePool>),
    /// Not in the cache (not yet, or not that one by UID): its name.
    Missing(String),
}

fn pool_of(machine: &capi::MachineView, ns: &str, ctx: &Context) -> PoolOf {
    let Some((name, uid)) = machine.pool() else {
        return PoolOf::None;
    };
    match ctx
        .machine_pools
        .get(&ObjectRef::new(name).within(ns))
        .filter(|mp| mp.metadata.uid.as_deref() == Some(uid))
    {
        Some(mp) => PoolOf::Found(mp),
        None => PoolOf::Missing(name.to_string()),
    }
}

/// Checks that the config `made_by` that made `secret` is `owner`'s: from the watch of its kind
/// when that says so ([`super::bootstrap_configs`]), else from the config read.
async fn check_bootstrap_config(
    secret: &Secret,
    ns: &str,
    made_by: &OwnerReference,
    owner: bootstrap::ConfigOwner<'_>,
    ctx: &Context,
) -> Result<Result<(), bootstrap::BootstrapDataError>, Error> {
    if let Some(cached) = ctx.bootstrap_configs.cached(ns, made_by)
        && bootstrap::check_config(secret, made_by, Some(&cached), owner).is_ok()
    {
        return Ok(Ok(()));
    }
    let config = read_bootstrap_config(ns, made_by, ctx).await?;
    Ok(bootstrap::check_config(secret, made_by, config.as_ref(), owner))
}

/// The metadata of the bootstrap config that made the bootstrap data Secret (its controller
/// ownerReference `made_by`), in the Machine's namespace; `None` if there is none. Metadata
/// only: its owner references are what is checked, and its spec may hold secrets too
/// ([`super::bootstrap_configs::config_resource`]: which resource).
async fn read_bootstrap_config(ns: &str, made_by: &OwnerReference, ctx: &Context) -> Result<Option<ObjectMeta>, Error> {
    let ar = super::bootstrap_configs::config_resource(made_by);
    Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &ar)
        .get_metadata_opt(&made_by.name)
        .await
        .map(|config| config.map(|c| c.metadata))
        .map_err(Error::read(format!(
            "bootstrap config {} {ns}/{}",
            made_by.kind, made_by.name
        )))
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
