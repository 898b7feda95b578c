//! What a KaironMachinePool publishes: `spec.providerIDList` and its status, from the
//! pool's KaironMachines and its current Kairon MachineSet, each written only when it differs.

use kube::ResourceExt;
use serde_json::json;

use super::context::{Context, Scope};
use super::status::{Counted, Observed, pool_status, provider_id_list};
use crate::api::MachineSetRef;
use crate::api::conditions::Decided;
use crate::controller::error::Error;
use crate::kairon::machineset::MachineSet;
use crate::kairon::set_desired::revision_of;

/// Writes `spec.providerIDList` and the status, each only when it differs; returns whether
/// anything was written.
pub(crate) async fn write_status(
    ctx: &Context,
    s: &Scope,
    set: Option<&MachineSet>,
    waiting: Option<Decided>,
    paused: Option<&str>,
) -> Result<bool, Error> {
    let pool = s.pool.as_ref();
    let counted: Vec<Counted> = ctx
        .kaironmachines_of(s)
        .iter()
        .map(|km| Counted {
            provider_id: km.spec.provider_id.clone(),
            running: km.status.as_ref().is_some_and(|st| st.is_provisioned()),
        })
        .collect();
    let writer = ctx.writer(&s.ns);
    let mut wrote = false;
    let list = provider_id_list(&counted);
    if paused.is_none() && pool.spec.provider_id_list.clone().unwrap_or_default() != list {
        writer
            .merge_patch(pool, "spec.providerIDList", json!({"spec": {"providerIDList": list}}))
            .await?;
        wrote = true;
    }
    let set_ref = set.map(|set| {
        (
            MachineSetRef {
                name: set.name_any(),
                uid: set.metadata.uid.clone(),
                template_hash: revision_of(set).map(str::to_string),
                identity_ref: None,
                endpoint: None,
            },
            // Kairon's sets report no observed generation: the set existing is what counts.
            true,
        )
    });
    let next = pool_status(
        &Observed {
            previous: pool.status.as_ref(),
            set: set_ref,
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
