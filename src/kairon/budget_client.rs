//! How the budgets the provider keeps for a cluster are spoken to: listed by the cluster's
//! labels, written whole by server-side apply (only those this installation made or may adopt),
//! and deleted by the UID they were read with.

use std::sync::Arc;

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::budget::{BUDGET_FOR, CLUSTER_NAMESPACE, DesiredBudget, MachineDisruptionBudget};
use super::client::settle;
use super::gate::{Permit, Refusal, WriteGate};
use super::{Owner, labels};
use crate::api::FIELD_MANAGER;

/// The MachineDisruptionBudgets of one Kairon API. Made by [`super::Instances::budgets`].
#[derive(Clone)]
pub struct Budgets {
    client: Client,
    owner: Owner,
    gate: Option<Arc<WriteGate>>,
    /// MachineDisruptionBudgets in the version spoken on this API.
    resource: ApiResource,
}

/// A failed request about a MachineDisruptionBudget.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error("listing the Kairon MachineDisruptionBudgets of cluster {ns}/{cluster}: {source}")]
    List {
        ns: String,
        cluster: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action} Kairon MachineDisruptionBudget {name}: {source}")]
    Write {
        action: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Not sent: the API did not answer an earlier write ([`WriteGate`]).
    #[error("{action} Kairon MachineDisruptionBudget {name}: {refusal}")]
    Refused {
        action: &'static str,
        name: String,
        refusal: Refusal,
    },
}

impl BudgetError {
    /// A short label for metrics and logs.
    pub fn stage(&self) -> &'static str {
        match self {
            BudgetError::List { .. } => "read",
            BudgetError::Write { .. } => "write_budget",
            BudgetError::Refused { .. } => "kairon_api",
        }
    }

    /// The API has no MachineDisruptionBudget kind (a Kairon without them).
    pub fn is_missing_kind(&self) -> bool {
        matches!(self, BudgetError::List { source: kube::Error::Api(s), .. } if s.code == 404)
    }

    /// The credentials may not do what was asked (403): the identity's RBAC lacks the verbs.
    pub fn is_forbidden(&self) -> bool {
        matches!(
            self,
            BudgetError::List { source: kube::Error::Api(s), .. } | BudgetError::Write { source: kube::Error::Api(s), .. }
                if s.code == 403
        )
    }
}

impl Budgets {
    pub(super) fn new(client: Client, owner: Owner, gate: Option<Arc<WriteGate>>, resource: ApiResource) -> Self {
        Budgets {
            client,
            owner,
            gate,
            resource,
        }
    }

    /// This management cluster's id ([`Owner::id`]).
    pub fn owner_id(&self) -> &str {
        &self.owner.id
    }

    /// The budgets of `ns`, untyped (in the version spoken): read them with [`budget_from`].
    pub fn api(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &self.resource)
    }

    /// The budgets labelled for cluster `ns/cluster` by this provider, whoever made them.
    pub async fn of_cluster(&self, ns: &str, cluster: &str) -> Result<Vec<MachineDisruptionBudget>, BudgetError> {
        let selector = format!(
            "{},{}={cluster},{CLUSTER_NAMESPACE}={ns}",
            labels::managed_selector(),
            labels::CLUSTER_NAME
        );
        self.api(ns)
            .list(&ListParams::default().labels(&selector))
            .await
            .and_then(|l| l.items.into_iter().map(budget_from).collect())
            .map_err(|source| BudgetError::List {
                ns: ns.to_string(),
                cluster: cluster.to_string(),
                source,
            })
    }

    /// Whether this installation may write `budget`: it made it, or may adopt from who did
    /// (the source of a `clusterctl move`).
    pub fn may_write(&self, budget: &MachineDisruptionBudget) -> bool {
        self.owner
            .may_adopt(budget.labels().get(labels::MANAGEMENT_CLUSTER).map(String::as_str))
            .is_ok()
    }

    /// Writes `desired` whole (labels and spec), as this installation's: over the budget of
    /// that name listed for the cluster (`exists`), or as a new one. `Ok(false)`: a budget of
    /// that name that is not the cluster's already exists; it is left alone.
    pub async fn write(
        &self,
        ns: &str,
        cluster: &str,
        desired: &DesiredBudget,
        exists: bool,
    ) -> Result<bool, BudgetError> {
        let mut l = serde_json::Map::new();
        l.insert(labels::CLUSTER_NAME.into(), json!(cluster));
        l.insert(CLUSTER_NAMESPACE.into(), json!(ns));
        l.insert(BUDGET_FOR.into(), json!(desired.covers));
        l.insert(labels::MANAGED_BY.into(), json!(labels::MANAGED_BY_VALUE));
        if !self.owner.id.is_empty() {
            l.insert(labels::MANAGEMENT_CLUSTER.into(), json!(self.owner.id));
        }
        let body = json!({
            "apiVersion": self.resource.api_version,
            "kind": self.resource.kind,
            "metadata": {"name": desired.name, "namespace": ns, "labels": l},
            "spec": desired.spec,
        });
        let action = if exists { "updating" } else { "creating" };
        let permit = self.permit(action, &desired.name)?;
        let api = self.api(ns);
        let answer = if exists {
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            api.patch(&desired.name, &pp, &Patch::Apply(&body)).await.map(|_| ())
        } else {
            let budget: DynamicObject = serde_json::from_value(body).map_err(|e| BudgetError::Write {
                action,
                name: desired.name.clone(),
                source: kube::Error::SerdeError(e),
            })?;
            let pp = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            api.create(&pp, &budget).await.map(|_| ())
        };
        settle(permit, &answer);
        match answer {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(s)) if !exists && s.code == 409 => Ok(false),
            Err(source) => Err(BudgetError::Write {
                action,
                name: desired.name.clone(),
                source,
            }),
        }
    }

    /// Deletes exactly `budget` (the UID it was read with).
    pub async fn delete(&self, budget: &MachineDisruptionBudget) -> Result<(), BudgetError> {
        let name = budget.name_any();
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: budget.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        let permit = self.permit("deleting", &name)?;
        let answer = self
            .api(&budget.namespace().unwrap_or_default())
            .delete(&name, &dp)
            .await;
        settle(permit, &answer);
        match answer {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            Err(source) => Err(BudgetError::Write {
                action: "deleting",
                name,
                source,
            }),
        }
    }

    fn permit(&self, action: &'static str, name: &str) -> Result<Option<Permit>, BudgetError> {
        match &self.gate {
            None => Ok(None),
            Some(gate) => gate.admit().map(Some).map_err(|refusal| BudgetError::Refused {
                action,
                name: name.to_string(),
                refusal,
            }),
        }
    }
}

/// A budget from an untyped answer (the same schema in every version).
pub fn budget_from(obj: DynamicObject) -> Result<MachineDisruptionBudget, kube::Error> {
    serde_json::to_value(obj)
        .and_then(serde_json::from_value)
        .map_err(kube::Error::SerdeError)
}
