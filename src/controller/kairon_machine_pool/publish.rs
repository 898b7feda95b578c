//! What a KaironMachinePool publishes: `spec.providerIDList` and its status, from its
//! MachinePool's members, each written only when it differs.

use serde_json::json;

use super::context::{Context, Scope};
use super::status::{Counted, Observed, pool_status, provider_id_list};
use crate::api::conditions::Decided;
use crate::controller::error::Error;

/// Writes `spec.providerIDList` and the status, each only when it differs; returns whether
/// anything was written.
pub(crate) async fn write_status(
    ctx: &Context,
    s: &Scope,
    waiting: Option<Decided>,
    paused: Option<&str>,
) -> Result<bool, Error> {
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
