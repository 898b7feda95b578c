//! What a KaironMachinePool publishes: `spec.providerIDList` and its status, from its
//! MachinePool's members, each written only when it differs. Every reconcile path returns an
//! [`Outcome`], and [`finish`] is the one place that writes them.
//!
//! A pool publishes at most once every [`PUBLISH_EVERY`](super::published::PUBLISH_EVERY):
//! while its members come up, each one provisioned changes the list and the counts, and
//! publishing each change made about one status write and half a list write per member (1.4
//! writes per machine at N=1000). A change after a quiet spell is published at once; those
//! that follow within the window wait for its end and go out together.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::controller::Action;
use serde_json::json;

use super::context::{Context, Scope};
use super::status::{Counted, Observed, pool_status, provider_id_list};
use crate::api::KaironMachine;
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
        /// The members' KaironMachines as this reconcile read them from the cache, if it did:
        /// published as read, not gathered a second time.
        members: Option<Vec<Arc<KaironMachine>>>,
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
    let (waiting, paused, next, members) = match outcome {
        Outcome::Done(action) => return Ok(action),
        Outcome::Publish {
            waiting,
            paused,
            next,
            members,
        } => (waiting, paused, next, members),
    };
    let changed = match write_status(ctx, s, waiting, paused, members).await? {
        Publish::Deferred(wait) => return Ok(Action::requeue(wait)),
        Publish::Wrote => true,
        Publish::Unchanged => false,
    };
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

/// What [`write_status`] did.
enum Publish {
    Wrote,
    Unchanged,
    /// Something differs, but the pool published less than
    /// [`PUBLISH_EVERY`](super::published::PUBLISH_EVERY) ago: nothing was written; look again
    /// after this.
    Deferred(Duration),
}

/// Writes `spec.providerIDList` and the status, each only when it differs, unless the pool
/// published too recently.
async fn write_status(
    ctx: &Context,
    s: &Scope,
    waiting: Option<Decided>,
    paused: Option<&str>,
    members: Option<Vec<Arc<KaironMachine>>>,
) -> Result<Publish, Error> {
    let pool = s.pool.as_ref();
    // Every member of the MachinePool, whichever pool made it: after a repoint, the Nodes of
    // the old pool's members stay in the list until their Machines are drained and gone.
    let counted: Vec<Counted> = match s.machine_pool.as_ref().filter(|_| s.named) {
        Some(mp) => members
            .unwrap_or_else(|| ctx.kaironmachines_of(s, &kube::ResourceExt::name_any(mp.as_ref())))
            .iter()
            .map(|km| Counted {
                provider_id: km.spec.provider_id.clone(),
                running: km.status.as_ref().is_some_and(|st| st.is_provisioned()),
            })
            .collect(),
        None => vec![],
    };
    let list = provider_id_list(&counted);
    let list_differs =
        paused.is_none() && s.named && pool.spec.provider_id_list.as_deref().unwrap_or_default() != list.as_slice();
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
    if !list_differs && pool.status.as_ref() == Some(&next) {
        return Ok(Publish::Unchanged);
    }
    let key = s.key();
    let now = Instant::now();
    if let Some(wait) = ctx.published.wait(&key, now) {
        return Ok(Publish::Deferred(wait));
    }
    let writer = ctx.writer(&s.ns);
    if list_differs {
        writer
            .merge_patch(pool, "spec.providerIDList", json!({"spec": {"providerIDList": list}}))
            .await?;
    }
    writer.apply_status(pool, pool.status.as_ref(), &next).await?;
    ctx.published.published(&key, now);
    Ok(Publish::Wrote)
}
