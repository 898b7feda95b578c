//! What a KaironMachinePool publishes: `spec.providerIDList` and its status, from its
//! MachinePool's members, each written only when it differs. Every reconcile path returns an
//! [`Outcome`], and [`finish`] is the one place that writes them.

use std::time::Duration;

use kube::runtime::controller::Action;
use serde_json::json;

use super::context::{Context, Scope};
use super::status::{Counted, Observed, pool_status, provider_id_list};
use crate::api::conditions::Decided;
use crate::controller::error::Error;

/// How soon a pool that changed something looks again (its watches usually come first).
const BUSY_REQUEUE: Duration = Duration::from_secs(5);
/// The shortest wait before a broken VM's turn.
const MIN_REQUEUE: Duration = Duration::from_secs(1);

/// How a pool reconcile ends.
pub(crate) enum Outcome {
    /// Nothing to publish.
    Done(Action),
    /// The members published, with why the pool waits (`waiting`) or is paused, then `next`.
    Publish {
        waiting: Option<Decided>,
        paused: Option<&'static str>,
        next: Next,
    },
}

/// When to look again once published.
pub(crate) enum Next {
    Now(Action),
    /// After a plan was carried out: soon while it or the publishing changed something, at a
    /// broken VM's turn (`broken_wait`) if one is held, else at the resync.
    AfterPlan {
        busy: bool,
        broken_wait: Option<Duration>,
    },
}

/// Publishes what the outcome says and returns when to look again.
pub(crate) async fn finish(ctx: &Context, s: &Scope, outcome: Outcome) -> Result<Action, Error> {
    let (waiting, paused, next) = match outcome {
        Outcome::Done(action) => return Ok(action),
        Outcome::Publish { waiting, paused, next } => (waiting, paused, next),
    };
    let changed = write_status(ctx, s, waiting, paused).await?;
    Ok(match next {
        Next::Now(action) => action,
        Next::AfterPlan { busy, broken_wait } => match broken_wait {
            // A broken VM waits for its turn: looked at again when the wait is over.
            Some(wait) if !busy && !changed => Action::requeue(wait.max(MIN_REQUEUE)),
            Some(wait) => Action::requeue(wait.clamp(MIN_REQUEUE, BUSY_REQUEUE)),
            None if busy || changed => Action::requeue(BUSY_REQUEUE),
            None => Action::requeue(ctx.settings.sync_period),
        },
    })
}

/// Writes `spec.providerIDList` and the status, each only when it differs; returns whether
/// anything was written.
async fn write_status(ctx: &Context, s: &Scope, waiting: Option<Decided>, paused: Option<&str>) -> Result<bool, Error> {
    let pool = s.pool.as_ref();
    // Every member of the MachinePool, whichever pool made it: after a repoint, the Nodes of
    // the old pool's members stay in the list until their Machines are drained and gone.
    let counted: Vec<Counted> = match s.machine_pool.as_ref().filter(|_| s.named) {
        Some(mp) => ctx
            .kaironmachines_of(s, &kube::ResourceExt::name_any(mp.as_ref()))
            .iter()
            .map(|km| Counted {
                provider_id: km.spec.provider_id.clone(),
                running: km.status.as_ref().is_some_and(|st| st.is_provisioned()),
            })
            .collect(),
        None => vec![],
    };
    let writer = ctx.writer(&s.ns);
    let mut wrote = false;
    let list = provider_id_list(&counted);
    if paused.is_none() && s.named && pool.spec.provider_id_list.clone().unwrap_or_default() != list {
        writer
            .merge_patch(pool, "spec.providerIDList", json!({"spec": {"providerIDList": list}}))
            .await?;
        wrote = true;
    }
    let next = pool_status(
        &Observed {
            previous: pool.status.as_ref(),
            waiting,
            paused,
            instances: &counted,
            generation: pool.metadata.generation,
        },
        &crate::api::conditions::now(),
    );
    wrote |= writer.apply_status(pool, pool.status.as_ref(), &next).await?;
    Ok(wrote)
}
