//! Writes of Kairon's MachineSet policy ([`crate::machineset`]): the set's finalizer, spec
//! (scale-in) and status as merge patches on the resourceVersion they were decided on; members
//! created from the template, and removed (marked `removed-by: machineset`, then deleted on
//! their uid). A conflict returns the set as it is now, so the next decision is made on it.

use capkr::kairon::Machine;
use capkr::kairon::machineset::{MACHINESET_FINALIZER, MachineSet, REMOVED_BY_ANNOTATION, REMOVED_BY_MACHINESET};
use kube::api::{DeleteParams, Patch, Preconditions};
use kube::{Api, Client, ResourceExt};
use serde_json::{Map, Value, json};

use crate::machines::{patch_params, post_params};
use crate::machineset::{self, SetStep, scaled_in_annotation};
use crate::site_writes::{Written, fresh, write_status};

/// How a step's writes ended.
pub struct SetOutcome {
    /// The set as it is now, when the step wrote it.
    pub set: Option<Written<MachineSet>>,
    /// Members the step created (to be seen by the Machine watch before the next decision).
    pub created: Vec<Machine>,
    /// Members as the step left them (marked, being deleted).
    pub removed: Vec<Machine>,
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

    fn machines(&self, set: &MachineSet) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &set.namespace().unwrap_or_default())
    }

    /// Carries out `step` for `set`, whose members are `members`.
    pub async fn apply(&self, set: &MachineSet, members: &[Machine], step: SetStep) -> SetOutcome {
        let mut outcome = SetOutcome {
            set: None,
            created: Vec::new(),
            removed: Vec::new(),
            error: None,
        };
        let mut finalizers = set.finalizers().to_vec();
        let patch = match step {
            SetStep::Wait => return outcome,
            SetStep::AddFinalizer => {
                finalizers.push(MACHINESET_FINALIZER.into());
                json!({"metadata": {"finalizers": finalizers}})
            }
            SetStep::RemoveFinalizer => {
                finalizers.retain(|f| f != MACHINESET_FINALIZER);
                json!({"metadata": {"finalizers": finalizers}})
            }
            SetStep::ScaleIn { uids, replicas } => {
                let members: Vec<&Machine> = members.iter().collect();
                let records = machineset::scale_in_records(&uids, &members);
                json!({"metadata": {"annotations": records}, "spec": {"replicas": replicas}})
            }
            SetStep::ForgetScaledIn { uids } => {
                let records: Map<String, Value> = uids.iter().map(|u| (scaled_in_annotation(u), Value::Null)).collect();
                json!({"metadata": {"annotations": records}})
            }
            SetStep::Status(status) => {
                outcome.set = Some(write_status(&self.sets(set), set, set.status.as_ref(), &status).await);
                return outcome;
            }
            SetStep::Create { count } => {
                for _ in 0..count {
                    let name = format!("{}-{}", set.name_any(), random_suffix());
                    match self
                        .machines(set)
                        .create(&post_params(), &machineset::member(set, &name))
                        .await
                    {
                        Ok(m) => outcome.created.push(m),
                        // A name taken: the next decision creates another.
                        Err(kube::Error::Api(s)) if s.code == 409 => break,
                        Err(e) => {
                            outcome.error = Some(e);
                            break;
                        }
                    }
                }
                return outcome;
            }
            SetStep::Remove { names } => {
                for m in members.iter().filter(|m| names.contains(&m.name_any())) {
                    match self.remove(m).await {
                        Ok(Some(m)) => outcome.removed.push(m),
                        Ok(None) => {}
                        Err(e) => {
                            outcome.error = Some(e);
                            break;
                        }
                    }
                }
                return outcome;
            }
        };
        outcome.set = Some(self.patch_set(set, patch).await);
        outcome
    }

    /// A merge patch of the set on the resourceVersion it was decided on.
    async fn patch_set(&self, set: &MachineSet, mut patch: Value) -> Written<MachineSet> {
        patch["metadata"]["resourceVersion"] = json!(set.resource_version());
        let api = self.sets(set);
        let name = set.name_any();
        match api.patch(&name, &patch_params(), &Patch::Merge(&patch)).await {
            Ok(written) => Written::Object(Box::new(written)),
            Err(kube::Error::Api(s)) if s.code == 404 => Written::Gone,
            Err(kube::Error::Api(s)) if s.code == 409 => fresh(&api, &name).await,
            Err(e) => Written::Failed(e),
        }
    }

    /// Marks a member as Kairon's own removal, then deletes it (that very object: its uid).
    /// The member as it is left; `None` when it is gone or changed meanwhile (decided again).
    async fn remove(&self, m: &Machine) -> Result<Option<Machine>, kube::Error> {
        let api = self.machines_of(m);
        let name = m.name_any();
        let marked = if m.annotations().get(REMOVED_BY_ANNOTATION).map(String::as_str) == Some(REMOVED_BY_MACHINESET) {
            m.clone()
        } else {
            let patch = json!({"metadata": {"resourceVersion": m.resource_version(),
                "annotations": {REMOVED_BY_ANNOTATION: REMOVED_BY_MACHINESET}}});
            match api.patch(&name, &patch_params(), &Patch::Merge(&patch)).await {
                Ok(marked) => marked,
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return Ok(None),
                Err(e) => return Err(e),
            }
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: marked.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &params).await {
            Ok(either) => Ok(either.left()),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn machines_of(&self, m: &Machine) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &m.namespace().unwrap_or_default())
    }
}

/// Five random characters, as Kubernetes' generated names (lower-case letters and digits that
/// spell no words).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| char::from(ALPHABET[fastrand::usize(..ALPHABET.len())]))
        .collect()
}
