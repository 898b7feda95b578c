//! When the Kairon API does not serve MachineSets to the manager (the kind is not installed,
//! or the manager may not list it), KaironMachinePools cannot be served: their controller does
//! not start (its MachineSet watch would never sync, and `/readyz` would never pass for the
//! whole manager), and in its place each pool is told why, once, in its conditions. The other
//! controllers run as usual. Serving MachineSets later takes a restart of the manager.

use std::sync::Arc;
use std::time::Duration;

use futures::{Future, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ListParams;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::{Controller, watcher};
use kube::{Client, ResourceExt};
use tracing::warn;

use super::status::MACHINE_SET_PROVISIONED;
use crate::api::KaironMachinePool;
use crate::api::conditions::{self, Decided, READY, Status, reason};
use crate::controller::error::Error;
use crate::controller::settings::Settings;
use crate::controller::write::Writer;
use crate::kairon::Instances;

/// Why the Kairon API does not serve MachineSets to the manager, if it does not: a list of one
/// answered 404 (the kind is not there) or 403 (not permitted). Any other answer (the API
/// unreachable for now, among others) counts as served: the controller starts and its watch
/// retries, as every watch does.
pub(crate) async fn machine_sets_refused(kairon: &Instances, namespace: Option<&str>) -> Option<String> {
    let api = kairon.machine_sets().api(namespace);
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Err(kube::Error::Api(s)) if s.code == 404 => {
            Some("the Kairon API does not serve MachineSets (kairon.zyvor.dev): its CRD is not installed".to_string())
        }
        Err(kube::Error::Api(s)) if s.code == 403 => Some(
            "the manager may not list MachineSets (kairon.zyvor.dev) on the Kairon API: its RBAC lacks them"
                .to_string(),
        ),
        _ => None,
    }
}

/// The conditions of a pool that cannot be served, for `why`.
fn refused(why: &str) -> [Decided; 2] {
    let message = format!("{why}; KaironMachinePools are not reconciled until the manager restarts with them served");
    [
        Decided::new(
            MACHINE_SET_PROVISIONED,
            Status::False,
            reason::MACHINE_SETS_UNAVAILABLE,
            message.clone(),
        ),
        Decided::new(READY, Status::False, reason::MACHINE_SETS_UNAVAILABLE, message),
    ]
}

struct Ctx {
    client: Client,
    why: String,
}

async fn tell(pool: Arc<KaironMachinePool>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let mut status = pool.status.clone().unwrap_or_default();
    let mut conds = status.conditions.take().unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    for d in refused(&ctx.why) {
        conditions::set(&mut conds, d, pool.metadata.generation, &now);
    }
    status.conditions = Some(conds);
    let ns = pool.namespace().unwrap_or_default();
    Writer::new(kube::Api::namespaced(ctx.client.clone(), &ns), None)
        .apply_status(pool.as_ref(), pool.status.as_ref(), &status)
        .await?;
    Ok(Action::await_change())
}

/// Runs in place of the pool controller: tells every KaironMachinePool why it is not served.
pub(crate) fn controller(
    client: Client,
    settings: Settings,
    why: String,
    shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) -> impl Future<Output = ()> + Send {
    warn!(%why, "KaironMachinePools are not reconciled; the other controllers run");
    let api = settings.api::<KaironMachinePool>(&client);
    Controller::new(api, watcher::Config::default())
        .with_config(ControllerConfig::default().concurrency(1))
        .graceful_shutdown_on(shutdown)
        .run(
            tell,
            |_, e: &Error, _| {
                warn!(error = %e, "could not write a KaironMachinePool's status; retrying");
                Action::requeue(Duration::from_secs(10))
            },
            Arc::new(Ctx { client, why }),
        )
        .for_each(|_| async {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_conditions_say_why_and_what_to_do() {
        for d in refused("the manager may not list MachineSets") {
            assert_eq!((d.status, d.reason), (Status::False, reason::MACHINE_SETS_UNAVAILABLE));
            assert!(
                d.message.starts_with("the manager may not list MachineSets; "),
                "{}",
                d.message
            );
            assert!(d.message.contains("restarts"), "{}", d.message);
        }
    }
}
