//! Writes of Kairon's MachineSet policy ([`crate::machineset`]), in the order of a Kairon
//! tick: the set's finalizer (a merge patch on the resourceVersion it was decided on), then the
//! step (members created from the template as `<set>-<8 hex>`, or deleted on their uid, or the
//! set's finalizer removed), then the status through the status subresource, with the error
//! in `message` when the step failed. A conflict on the set returns it as it is now, and
//! nothing more is written: the next decision is made on it.

use capkr::kairon::Machine;
use capkr::kairon::machineset::{MACHINESET_FINALIZER, MachineSet};
use kube::api::{DeleteParams, Patch, Preconditions};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::machines::{patch_params, post_params};
use crate::machineset::{self, SetPlan, SetStep};
use crate::site_writes::{Written, fresh, write_status};

/// How a plan's writes ended.
pub struct SetOutcome {
    /// The set as it is now, when a write touched it.
    pub set: Option<Written<MachineSet>>,
    /// Members created (to be seen by the Machine watch before the next decision).
    pub created: Vec<Machine>,
    /// Members deleted and still there (held by a finalizer), as the deletion left them.
    pub removed: Vec<Machine>,
    /// Members deleted and gone at once (no finalizer), as they were before (to be seen gone
    /// by the Machine watch before the next decision).
    pub vanished: Vec<Machine>,
    pub error: Option<kube::Error>,
}

#[derive(Clone)]
pub struct SetWriter {
    client: Client,
}

impl SetWriter {
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    fn sets(&self, set: &MachineSet) -> Api<MachineSet> {
        Api::namespaced(self.client.clone(), &set.namespace().unwrap_or_default())
    }

    fn machines(&self, namespace: Option<String>) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &namespace.unwrap_or_default())
    }

    /// Carries out `plan` for `set`; `members` are the Machines it was planned over.
    pub async fn apply(&self, set: &MachineSet, members: &[Machine], plan: SetPlan) -> SetOutcome {
        let mut outcome = SetOutcome {
            set: None,
            created: Vec::new(),
            removed: Vec::new(),
            vanished: Vec::new(),
            error: None,
        };
        let mut set = set.clone();
        if plan.add_finalizer {
            let mut finalizers = set.finalizers().to_vec();
            finalizers.push(MACHINESET_FINALIZER.into());
            match self
                .patch_set(&set, json!({"metadata": {"finalizers": finalizers}}))
                .await
            {
                Ok(written) => set = written.clone(),
                Err(stop) => {
                    outcome.set = Some(stop);
                    return outcome;
                }
            }
            outcome.set = Some(Written::Object(Box::new(set.clone())));
        }

        let mut failure = None;
        match &plan.step {
            SetStep::Wait => {}
            SetStep::Create { count } => {
                for _ in 0..*count {
                    let name = format!("{}-{}", set.name_any(), random_suffix());
                    match self
                        .machines(set.namespace())
                        .create(&post_params(), &machineset::member(&set, &name))
                        .await
                    {
                        Ok(m) => outcome.created.push(m),
                        Err(e) => {
                            failure = Some(format!(
                                "create machine for machineset {}/{}: {e}",
                                set.namespace().unwrap_or_default(),
                                set.name_any()
                            ));
                            outcome.error = Some(e);
                            break;
                        }
                    }
                }
            }
            SetStep::Delete { names } => {
                for name in names {
                    let Some(m) = members.iter().find(|m| m.name_any() == *name) else {
                        continue;
                    };
                    match self.delete(m).await {
                        Ok(Some(left)) => outcome.removed.push(left),
                        Ok(None) => outcome.vanished.push(m.clone()),
                        Err(e) => {
                            failure = Some(format!(
                                "delete machine {}/{}: {e}",
                                m.namespace().unwrap_or_default(),
                                m.name_any()
                            ));
                            outcome.error = Some(e);
                            break;
                        }
                    }
                }
            }
            SetStep::RemoveFinalizer => {
                let mut finalizers = set.finalizers().to_vec();
                finalizers.retain(|f| f != MACHINESET_FINALIZER);
                outcome.set = Some(
                    match self
                        .patch_set(&set, json!({"metadata": {"finalizers": finalizers}}))
                        .await
                    {
                        Ok(written) => Written::Object(Box::new(written)),
                        Err(stop) => stop,
                    },
                );
                return outcome;
            }
        }

        if let Some(mut status) = plan.status {
            if failure.is_some() {
                status.message = failure;
            }
            let written = write_status(&self.sets(&set), &set, set.status.as_ref(), &status).await;
            if let Written::Failed(e) = written {
                outcome.error.get_or_insert(e);
            } else {
                outcome.set = Some(written);
            }
        }
        outcome
    }

    /// A merge patch of the set on the resourceVersion it was decided on: the set written, or
    /// how the write stopped (a conflict: the set as it is now).
    async fn patch_set(&self, set: &MachineSet, mut patch: Value) -> Result<MachineSet, Written<MachineSet>> {
        patch["metadata"]["resourceVersion"] = json!(set.resource_version());
        let api = self.sets(set);
        let name = set.name_any();
        match api.patch(&name, &patch_params(), &Patch::Merge(&patch)).await {
            Ok(written) => Ok(written),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(Written::Gone),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(fresh(&api, &name).await),
            Err(e) => Err(Written::Failed(e)),
        }
    }

    /// Deletes a member, that very object (its uid). `Some`: still there, being deleted;
    /// `None`: gone (at once, or already, or replaced by a namesake meanwhile).
    async fn delete(&self, m: &Machine) -> Result<Option<Machine>, kube::Error> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: m.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.machines(m.namespace()).delete(&m.name_any(), &params).await {
            Ok(either) => Ok(either.left()),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Eight random hex digits, as Kairon names a new member.
fn random_suffix() -> String {
    format!("{:08x}", fastrand::u32(..))
}
