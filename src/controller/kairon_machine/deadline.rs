//! The bounds of one KaironMachine reconcile: a deadline, and writes a Kairon API is not
//! sent because it did not answer earlier ones.
//!
//! A reconcile holds a place of its lane, and the create lane is shared by every Kairon API:
//! a tenant's API that never answers a create would hold places for ever, and with them the
//! object's lock (so that not even its deletion could run). So every reconcile gets
//! [`DEADLINE`]; past it, it is dropped (which frees its place and its lock; a write it was
//! waiting on counts as unanswered for that API's [`crate::kairon::Refusal`] gate), the
//! machine says why, and it is retried with the object's backoff. Dropping a reconcile
//! anywhere is safe: each step is idempotent, as after a crash. A machine on a tenant's
//! Kairon API first takes a place of its tenant's share of workers
//! ([`crate::controller::tenant_share`]).

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tracing::warn;

use super::context::Context;
use super::finish::{Outcome, Report, Seen, finish};
use super::reconcile::reconcile;
use super::status::Observed;
use crate::api::conditions::{Decided, INSTANCE_PROVISIONED, Status, reason};
use crate::api::{self, KaironIdentityReference, KaironMachine};
use crate::capi;
use crate::controller::error::Error;
use crate::controller::tenant_share::TURNED_AWAY_RETRY;
use crate::kairon::KaironError;

/// How long one reconcile may take. A reconcile makes a handful of requests, each answered in
/// well under a second by a working API server (admission webhooks may take up to 30 s, and
/// would be cut here).
pub(crate) const DEADLINE: Duration = Duration::from_secs(30);
/// How long the status write that reports a deadline may take (the management API server).
const REPORT_WAIT: Duration = Duration::from_secs(10);

/// [`reconcile`] within [`DEADLINE`]; a write refused because its Kairon API did not answer
/// an earlier one is reported on the machine and tried again when the API's pause is over.
pub(crate) async fn reconcile_within_deadline(km: Arc<KaironMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    // A machine on a tenant's Kairon API waits on it: at most the tenant's share of workers.
    let _place = match ctx.endpoints.is_some() && identity_of(&km, &ctx).is_some() {
        true => match ctx.shares.enter(km.metadata.namespace.as_deref().unwrap_or_default()) {
            Some(place) => Some(place),
            None => return Ok(Action::requeue(TURNED_AWAY_RETRY)),
        },
        false => None,
    };
    match tokio::time::timeout(DEADLINE, reconcile(km.clone(), ctx.clone())).await {
        Ok(Err(Error::Kairon(KaironError::Refused { refusal, .. }))) => {
            let why = format!("{}: {refusal}", api_of(&km, &ctx));
            report(&km, &ctx, why).await?;
            Ok(Action::requeue(refusal.retry_in()))
        }
        Ok(done) => done,
        Err(_) => {
            let why = format!(
                "the reconcile did not finish within {}s: {} did not answer in time",
                DEADLINE.as_secs(),
                api_of(&km, &ctx)
            );
            warn!(%why, "reconcile dropped at its deadline");
            match tokio::time::timeout(REPORT_WAIT, report(&km, &ctx, why)).await {
                Ok(Err(e)) => warn!(error = %e, "the deadline could not be reported"),
                Err(_) => warn!("the deadline could not be reported in time"),
                Ok(Ok(())) => {}
            }
            Err(Error::Deadline(DEADLINE))
        }
    }
}

/// `InstanceProvisioned` Unknown, reason `KaironAPINotAnswering`, saying `why`.
async fn report(km: &Arc<KaironMachine>, ctx: &Context, why: String) -> Result<(), Error> {
    let km = ctx.fresh.freshest(km.clone());
    let observed = Observed::Waiting(Decided::new(
        INSTANCE_PROVISIONED,
        Status::Unknown,
        reason::KAIRON_API_NOT_ANSWERING,
        why,
    ));
    let seen = if km.metadata.deletion_timestamp.is_some() {
        Seen::Deleting(observed)
    } else {
        Seen::Live(observed)
    };
    finish(ctx, Outcome::report(Report::new(km, seen), Action::await_change()))
        .await
        .map(|_| ())
}

/// The Kairon API the machine is reconciled against, in words, from what is known without a
/// request: the identity recorded with its VM, else the one its KaironCluster names.
fn api_of(km: &KaironMachine, ctx: &Context) -> String {
    match identity_of(km, ctx) {
        Some(r) => format!("the Kairon API of identity {} {}", r.kind, r.name),
        None => "the Kairon API (or the management cluster's)".to_string(),
    }
}

fn identity_of(km: &KaironMachine, ctx: &Context) -> Option<KaironIdentityReference> {
    if let Some(recorded) = km.status.as_ref().and_then(|s| s.instance.as_ref()) {
        return recorded.identity_ref.clone();
    }
    let ns = km.metadata.namespace.as_deref()?;
    let cluster = ctx
        .clusters
        .get(&ObjectRef::new(capi::cluster_name(&km.metadata)?).within(ns))?;
    let kc = cluster.infrastructure_name(api::GROUP, "KaironCluster")?;
    ctx.kaironclusters
        .get(&ObjectRef::new(kc).within(ns))?
        .spec
        .identity_ref
        .clone()
}
