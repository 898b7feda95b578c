//! The MachineDisruptionBudgets a workload cluster keeps on its Kairon API, so that Kairon's
//! evacuation (`kaironctl evacuate`, an evacuating cordon, its admission webhook) never
//! cold-migrates the cluster's VMs (see [`crate::kairon::budget`] for why): one over the control
//! plane and one over the rest of the VMs its KaironMachines made (a pool's members included),
//! none allowing a disruption.
//! The VMs of a cordoned node are replaced through CAPI instead
//! (`kairon_machine::evacuation`). Kept by the KaironCluster's reconcile: written when they
//! differ, deleted when what they cover is gone, and with the cluster; handed over, not
//! deleted, by `clusterctl move` (the target adopts them as it adopts VMs).

use kube::ResourceExt;
use tracing::{debug, info, warn};

use super::error::Error;
use crate::api::KaironCluster;
use crate::api::conditions::{DISRUPTION_BUDGETS_READY, Decided, Status, reason};
use crate::capi;
use crate::kairon::budget::{BudgetInput, DesiredBudget, MachineDisruptionBudget, desired_budgets};
use crate::kairon::{Budgets, labels};

/// Where the cluster's budgets stand after [`keep`]: the KaironCluster's
/// `DisruptionBudgetsReady` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kept {
    /// All of them, as wanted: how many.
    All(usize),
    /// The Kairon API has no MachineDisruptionBudget kind.
    NotServed,
    /// The credentials may not list or write them: what was refused.
    Forbidden(String),
    /// Budgets of these names are another's, and left alone.
    Taken(Vec<String>),
}

impl Kept {
    /// The `DisruptionBudgetsReady` condition this outcome makes.
    pub(crate) fn condition(&self) -> Decided {
        match self {
            Kept::All(n) => Decided::new(
                DISRUPTION_BUDGETS_READY,
                Status::True,
                reason::DISRUPTION_BUDGETS_KEPT,
                format!(
                    "{n} MachineDisruptionBudget(s) keep Kairon's evacuation from cold-migrating the cluster's VMs"
                ),
            ),
            Kept::NotServed => Decided::new(
                DISRUPTION_BUDGETS_READY,
                Status::False,
                reason::DISRUPTION_BUDGETS_NOT_SERVED,
                "the Kairon API serves no MachineDisruptionBudgets: Kairon's evacuation may cold-migrate the \
                 cluster's VMs (a fresh disk, the bootstrap data run again)",
            ),
            Kept::Forbidden(what) => Decided::new(
                DISRUPTION_BUDGETS_READY,
                Status::False,
                reason::DISRUPTION_BUDGETS_FORBIDDEN,
                format!(
                    "{what}: forbidden; the credentials need get, list, create, patch and delete on \
                     machinedisruptionbudgets.kairon.zyvor.dev in the namespace"
                ),
            ),
            Kept::Taken(names) => Decided::new(
                DISRUPTION_BUDGETS_READY,
                Status::False,
                reason::DISRUPTION_BUDGET_NAME_TAKEN,
                format!(
                    "MachineDisruptionBudget(s) {} exist and are not this cluster's: left alone, so the VMs \
                     they would cover are not protected",
                    names.join(", ")
                ),
            ),
        }
    }
}

/// Brings the cluster's budgets to what it has now: each wanted one written when it differs,
/// each of ours no longer wanted deleted; says where they stand. A Kairon API without budgets
/// is left alone; a refusal (403) is an outcome, not an error to retry at once.
pub(crate) async fn keep(kc: &KaironCluster, cluster: &capi::Cluster, budgets: &Budgets) -> Result<Kept, Error> {
    match keep_all(kc, cluster, budgets).await {
        Err(Error::Budget(e)) if e.is_forbidden() => Ok(Kept::Forbidden(crate::text::bounded(
            e.to_string().split(": ").next().unwrap_or_default(),
            256,
        ))),
        other => other,
    }
}

async fn keep_all(kc: &KaironCluster, cluster: &capi::Cluster, budgets: &Budgets) -> Result<Kept, Error> {
    let ns = kc.namespace().unwrap_or_default();
    let input = BudgetInput {
        cluster: cluster.name_any(),
        namespace: ns.clone(),
    };
    let existing = match budgets.of_cluster(&ns, &input.cluster).await {
        Ok(b) => b,
        Err(e) if e.is_missing_kind() => {
            debug!("the Kairon API has no MachineDisruptionBudgets; none kept");
            return Ok(Kept::NotServed);
        }
        Err(e) => return Err(e.into()),
    };
    let wanted = desired_budgets(&input);
    let mut taken = Vec::new();
    for want in &wanted {
        let found = existing.iter().find(|b| b.name_any() == want.name);
        if let Some(b) = found {
            if !budgets.may_write(b) {
                warn!(budget = %want.name, "a MachineDisruptionBudget of this cluster belongs to another management cluster; left alone");
                taken.push(want.name.clone());
                continue;
            }
            if is_current(b, want, budgets) {
                continue;
            }
        }
        if budgets.write(&ns, &input.cluster, want, found.is_some()).await? {
            info!(budget = %want.name, max_unavailable = ?want.spec.max_unavailable, "wrote Kairon MachineDisruptionBudget");
        } else {
            warn!(budget = %want.name, "a MachineDisruptionBudget of that name exists and is not this cluster's; left alone");
            taken.push(want.name.clone());
        }
    }
    for b in &existing {
        if wanted.iter().all(|w| w.name != b.name_any()) && budgets.may_write(b) {
            budgets.delete(b).await?;
            info!(budget = %b.name_any(), "deleted Kairon MachineDisruptionBudget no longer wanted");
        }
    }
    Ok(if taken.is_empty() {
        Kept::All(wanted.len())
    } else {
        Kept::Taken(taken)
    })
}

/// Deletes the cluster's budgets (those this installation may write); when the cluster is
/// moved (`clusterctl move`), they are left for the target to adopt.
pub(crate) async fn remove(kc: &KaironCluster, budgets: &Budgets) -> Result<(), Error> {
    if capi::has_annotation(&kc.metadata, capi::DELETE_FOR_MOVE_ANNOTATION) {
        return Ok(());
    }
    let ns = kc.namespace().unwrap_or_default();
    let Some(cluster) = capi::cluster_name(&kc.metadata) else {
        return Ok(());
    };
    let existing = match budgets.of_cluster(&ns, cluster).await {
        Ok(b) => b,
        Err(e) if e.is_missing_kind() => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for b in existing.iter().filter(|b| budgets.may_write(b)) {
        budgets.delete(b).await?;
        info!(budget = %b.name_any(), "deleted Kairon MachineDisruptionBudget with its cluster");
    }
    Ok(())
}

/// Whether `b` already is `want`, as this installation writes it.
fn is_current(b: &MachineDisruptionBudget, want: &DesiredBudget, budgets: &Budgets) -> bool {
    let ours = budgets.owner_id().is_empty()
        || b.labels().get(labels::MANAGEMENT_CLUSTER).map(String::as_str) == Some(budgets.owner_id());
    ours && b.spec == want.spec
        && b.labels().get(crate::kairon::budget::BUDGET_FOR).map(String::as_str) == Some(want.covers)
}
