//! The budgets of an externally managed KaironCluster, which are kept although nothing of the
//! KaironCluster itself is written.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::debug;

use super::{Context, ENDPOINT_RETRY};
use crate::api::KaironCluster;
use crate::capi;
use crate::controller::budgets;
use crate::controller::error::Error;
use crate::controller::runtime::owning_cluster;
use crate::events::reason as event;

/// An externally managed KaironCluster: nothing of it is ours to write, but its KaironMachines
/// still make their VMs here, so the cluster's budgets are kept all the same (said by Warning
/// events, not a condition), and deleted with it: here while someone else's finalizer holds it,
/// by [`forget_external`] once it is gone.
pub(super) async fn keep_budgets_of_external(kc: &KaironCluster, ns: &str, ctx: &Context) -> Result<Action, Error> {
    let cluster = owning_cluster(&ctx.clusters, ns, capi::cluster_name(&kc.metadata));
    if capi::paused_reason(cluster.as_deref(), &kc.metadata).is_some() {
        debug!("externally managed and paused; budgets left as they are");
        return Ok(Action::await_change());
    }
    let Some(budgets) = ctx.budgets(kc, ns).await else {
        return Ok(Action::await_change());
    };
    if kc.metadata.deletion_timestamp.is_some() {
        budgets::remove(kc, &budgets).await?;
        return Ok(Action::await_change());
    }
    let Some(cluster) = capi::owner(&kc.metadata, "Cluster").and(cluster) else {
        debug!("externally managed, waiting for an owner Cluster");
        return Ok(Action::await_change());
    };
    let kept = budgets::keep(kc, &cluster, &budgets).await?;
    if let budgets::Kept::Taken(_) | budgets::Kept::Forbidden(_) = &kept {
        ctx.events
            .warning(
                kc,
                event::DISRUPTION_BUDGETS_NOT_KEPT,
                "KeepBudgets",
                kept.condition().message,
            )
            .await;
        return Ok(Action::requeue(ENDPOINT_RETRY));
    }
    Ok(Action::requeue(ctx.settings.sync_period))
}

/// The budgets of an externally managed KaironCluster that was deleted (it carries no
/// finalizer of ours): deleted after it. One deleted while the manager was not watching keeps
/// its budgets, which select no VM once the cluster's are gone.
pub(super) async fn forget_external(kc: Arc<KaironCluster>, ctx: Arc<Context>) {
    if !capi::is_externally_managed(&kc.metadata) {
        return;
    }
    let ns = kc.namespace().unwrap_or_default();
    if let Some(budgets) = ctx.budgets(&kc, &ns).await
        && let Err(e) = budgets::remove(&kc, &budgets).await
    {
        tracing::warn!(kaironcluster = %kc.name_any(), namespace = %ns, error = %e,
            "the budgets of a deleted externally managed KaironCluster could not be deleted");
    }
}
