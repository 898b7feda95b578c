//! Deleting a KaironMachinePool: its members go the way every member goes (their Machines are
//! deleted, CAPI drains each Node, the KaironMachine's finalizer deletes the VM), and the
//! finalizer only once they are gone.
//!
//! Kept instead: everything, when the pool was deleted by `clusterctl move` (the pool lives on
//! elsewhere), after its Cluster is gone (left behind; not ours to destroy), or when its
//! MachinePool names another pool now (a repoint: the members are the new pool's).

use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use tracing::info;

use super::context::{Context, Scope};
use super::publish::{Next, Outcome};
use crate::api::conditions::{Decided, READY, Status, reason};
use crate::api::{KaironMachine, MACHINE_POOL_FINALIZER};
use crate::capi;
use crate::client::delete_exactly;
use crate::controller::error::Error;
use crate::events::reason as event;

/// How often a deletion in progress looks again.
const DELETE_RETRY: Duration = Duration::from_secs(5);

pub(crate) async fn reconcile_delete(s: &Scope, ctx: &Context) -> Result<Outcome, Error> {
    let pool = s.pool.as_ref();
    let release = || async {
        ctx.writer(&s.ns).remove_finalizer(pool, MACHINE_POOL_FINALIZER).await?;
        Ok::<_, Error>(Outcome::Done(Action::await_change()))
    };
    if !crate::controller::write::has_finalizer(pool, MACHINE_POOL_FINALIZER) {
        return Ok(Outcome::Done(Action::await_change()));
    }
    if capi::has_annotation(&pool.metadata, capi::DELETE_FOR_MOVE_ANNOTATION) {
        info!("deleted for clusterctl move; its members are kept");
        return release().await;
    }
    if s.cluster.is_none() && cluster_is_gone(s, ctx).await? {
        ctx.events
            .warning(
                pool,
                event::INSTANCE_KEPT,
                "Delete",
                format!(
                    "Cluster {} no longer exists: the pool's members are kept, not deleted",
                    s.cluster_name
                ),
            )
            .await;
        return release().await;
    }
    // A MachinePool that names another pool now (or is gone and took its Machines with it):
    // the members are not this pool's to remove.
    let Some(mp) = s.machine_pool.as_ref().filter(|_| s.named) else {
        ctx.pending.forget(&s.key());
        info!("its MachinePool names another pool or is gone; its members are left to it");
        return release().await;
    };
    // The members first, through their Machines (drained), or their KaironMachines when
    // CAPI has made no Machine for them. A KaironMachine labelled for the MachinePool whose
    // owner is a Machine not of it (another MachinePool's, another cluster's: a label or an
    // ownerReference can be copied) is left alone, its Machine above all.
    let kms = ctx.kaironmachines_of(s, &mp.name_any());
    let (ours, foreign): (Vec<_>, Vec<_>) = kms.iter().partition(|km| owned_by_the_pool(km, s, ctx));
    for km in &foreign {
        info!(kaironmachine = %km.name_any(), "labelled for the pool but owned by a Machine of another; left alone");
    }
    if ours.is_empty() {
        ctx.pending.forget(&s.key());
        return release().await;
    }
    let machines: Api<capi::Machine> = Api::namespaced(ctx.client.clone(), &s.ns);
    let kaironmachines: Api<KaironMachine> = Api::namespaced(ctx.client.clone(), &s.ns);
    for km in ours.iter().filter(|km| km.metadata.deletion_timestamp.is_none()) {
        let name = km.name_any();
        // Exactly the object the cache names (UID precondition): never another made since
        // under the same name.
        let answer = match capi::owner(&km.metadata, "Machine") {
            Some(m) => machines
                .delete(&m.name, &delete_exactly(Some(m.uid.clone())))
                .await
                .map(|_| ()),
            None => kaironmachines
                .delete(&name, &delete_exactly(km.metadata.uid.clone()))
                .await
                .map(|_| ()),
        };
        match answer {
            Ok(()) => {}
            // Gone, or the name now stands for another object (the precondition failed).
            Err(kube::Error::Api(e)) if e.is_not_found() || e.code == 409 => {}
            Err(e) => return Err(Error::write("machine")(e)),
        }
    }
    let d = Decided::new(
        READY,
        Status::False,
        reason::DELETING,
        format!("waiting for {} members to be deleted", ours.len()),
    );
    Ok(Outcome::Publish {
        waiting: Some(d),
        paused: None,
        next: Next::Now(Action::requeue(DELETE_RETRY)),
        members: None,
    })
}

/// Whether `km` is a member this pool's deletion may remove: without an owner Machine (CAPI
/// made none yet), or owned by one of its MachinePool's own Machines, by UID: one CAPI made for
/// the pool's MachinePool (its pool-name label) in the pool's Cluster.
fn owned_by_the_pool(km: &KaironMachine, s: &Scope, ctx: &Context) -> bool {
    let Some(owner) = capi::owner(&km.metadata, "Machine") else {
        return true;
    };
    let Some(machine_pool) = capi::owner(&s.pool.metadata, "MachinePool") else {
        return false;
    };
    ctx.machines_of(s, &machine_pool.name).iter().any(|m| {
        m.name_any() == owner.name
            && m.metadata.uid.as_deref() == Some(owner.uid.as_str())
            && capi::label(&m.metadata, capi::CLUSTER_NAME_LABEL) == Some(s.cluster_name.as_str())
    })
}

/// Whether the pool's Cluster no longer exists, asked of the API server when the cache does
/// not have it.
async fn cluster_is_gone(s: &Scope, ctx: &Context) -> Result<bool, Error> {
    if s.cluster_name.is_empty() {
        return Ok(true);
    }
    let clusters: Api<capi::Cluster> = Api::namespaced(ctx.client.clone(), &s.ns);
    let cluster = clusters
        .get_opt(&s.cluster_name)
        .await
        .map_err(Error::read(format!("Cluster {}/{}", s.ns, s.cluster_name)))?;
    Ok(cluster.is_none())
}
