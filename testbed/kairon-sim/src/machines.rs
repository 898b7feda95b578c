//! Writes to Kairon Machines on the management API server, the way kairon-controller makes
//! them: status through the status subresource, metadata by patch, or, with `--full-update`,
//! by a full replace of a model that has no ownerReferences. Every write carries the
//! resourceVersion it was decided on, so a decision made on a stale object fails (409) instead
//! of undoing someone else's write.

use capkr::kairon::{Machine, MachineStatus};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::sim::{FIELD_MANAGER, FINALIZER, Key};
use crate::status_patch::status_patch;

/// How a write ended, as the engine needs to know it.
#[derive(Debug)]
pub enum WriteResult {
    /// Written; the object as the server returned it.
    Written(Box<Machine>),
    /// Someone else wrote first; the object as it is now (decide again on it).
    Conflict(Option<Box<Machine>>),
    /// The object is gone.
    Gone,
    /// Anything else: retry later.
    Failed(kube::Error),
}

#[derive(Clone)]
pub struct MachineWriter {
    client: Client,
    full_update: bool,
}

impl MachineWriter {
    pub fn new(client: Client, full_update: bool) -> Self {
        Self { client, full_update }
    }

    fn api(&self, key: &Key) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &key.namespace)
    }

    pub async fn add_finalizer(&self, m: &Machine) -> WriteResult {
        let key = Key::of(m);
        let mut finalizers = m.finalizers().to_vec();
        finalizers.push(FINALIZER.to_string());
        if self.full_update {
            let mut model = without_unmodelled_metadata(m);
            model.metadata.finalizers = Some(finalizers);
            return self
                .outcome(&key, self.api(&key).replace(&key.name, &post_params(), &model).await)
                .await;
        }
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": m.resource_version()}});
        let result = self
            .api(&key)
            .patch(&key.name, &patch_params(), &Patch::Merge(&patch))
            .await;
        self.outcome(&key, result).await
    }

    /// Removes our finalizer: a JSON patch whose `test` op makes sure the index still names it.
    pub async fn remove_finalizer(&self, m: &Machine) -> WriteResult {
        let key = Key::of(m);
        let Some(index) = m.finalizers().iter().position(|f| f == FINALIZER) else {
            return WriteResult::Written(Box::new(m.clone()));
        };
        if self.full_update {
            let mut model = without_unmodelled_metadata(m);
            if let Some(finalizers) = model.metadata.finalizers.as_mut() {
                finalizers.retain(|f| f != FINALIZER);
            }
            return self
                .outcome(&key, self.api(&key).replace(&key.name, &post_params(), &model).await)
                .await;
        }
        let path = format!("/metadata/finalizers/{index}");
        let ops = json!([
            {"op": "test", "path": path, "value": FINALIZER},
            {"op": "remove", "path": path},
        ]);
        let patch: json_patch::Patch = match serde_json::from_value(ops) {
            Ok(p) => p,
            Err(e) => return WriteResult::Failed(kube::Error::SerdeError(e)),
        };
        let result = self
            .api(&key)
            .patch(&key.name, &patch_params(), &Patch::<()>::Json(patch))
            .await;
        // A failed `test` op is 422; treat it like a conflict: look again.
        let result = result.map_err(|e| match e {
            kube::Error::Api(mut s) if s.code == 422 => {
                s.code = 409;
                kube::Error::Api(s)
            }
            e => e,
        });
        self.outcome(&key, result).await
    }

    /// Merge-patches `status` through the status subresource: the fields that differ from the
    /// Machine's, those it drops as `null`; nothing when nothing differs. Fields of the status
    /// the model does not know are left alone.
    pub async fn write_status(&self, m: &Machine, status: &MachineStatus) -> WriteResult {
        let key = Key::of(m);
        let changes = match status_patch(m.status.as_ref(), status) {
            Ok(Some(changes)) => changes,
            Ok(None) => return WriteResult::Written(Box::new(m.clone())),
            Err(e) => return WriteResult::Failed(kube::Error::SerdeError(e)),
        };
        let patch = json!({"metadata": {"resourceVersion": m.resource_version()}, "status": changes});
        let result = self
            .api(&key)
            .patch_status(&key.name, &patch_params(), &Patch::Merge(&patch))
            .await;
        self.outcome(&key, result).await
    }

    /// Merge-patches the Machine's metadata and spec as kairon-controller does when it binds it
    /// to a node or migrates it (`patch`, without a resourceVersion: it is added), then, if
    /// given, writes `status` on what that returned (the target's agent reporting an adopted
    /// VM). Always a patch, `--full-update` or not.
    pub async fn patch_machine(
        &self,
        m: &Machine,
        patch: &serde_json::Value,
        status: Option<&MachineStatus>,
    ) -> WriteResult {
        let key = Key::of(m);
        let mut patch = patch.clone();
        patch["metadata"]["resourceVersion"] = json!(m.resource_version());
        let result = self
            .api(&key)
            .patch(&key.name, &patch_params(), &Patch::Merge(&patch))
            .await;
        match (self.outcome(&key, result).await, status) {
            (WriteResult::Written(written), Some(status)) => self.write_status(&written, status).await,
            (other, _) => other,
        }
    }

    async fn outcome(&self, key: &Key, result: Result<Machine, kube::Error>) -> WriteResult {
        match result {
            Ok(m) => WriteResult::Written(Box::new(m)),
            Err(kube::Error::Api(s)) if s.code == 404 => WriteResult::Gone,
            Err(kube::Error::Api(s)) if s.code == 409 => match self.api(key).get_opt(&key.name).await {
                Ok(Some(fresh)) => WriteResult::Conflict(Some(Box::new(fresh))),
                Ok(None) => WriteResult::Gone,
                Err(_) => WriteResult::Conflict(None),
            },
            Err(e) => WriteResult::Failed(e),
        }
    }
}

/// The object as Kairon's own model holds it: no ownerReferences, no managedFields. Labels,
/// annotations, finalizers and the resourceVersion survive.
fn without_unmodelled_metadata(m: &Machine) -> Machine {
    let mut model = m.clone();
    model.metadata.owner_references = None;
    model.metadata.managed_fields = None;
    model
}

pub fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    }
}

pub fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
    use std::collections::BTreeMap;

    #[test]
    fn full_update_model_drops_owner_references_but_keeps_labels_and_annotations() {
        let labels: BTreeMap<String, String> =
            [("cluster.x-k8s.io/cluster-name".to_string(), "demo".to_string())].into();
        let annotations: BTreeMap<String, String> = [("a".to_string(), "b".to_string())].into();
        let m = Machine {
            metadata: ObjectMeta {
                name: Some("m".into()),
                labels: Some(labels.clone()),
                annotations: Some(annotations.clone()),
                resource_version: Some("42".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "x/v1".into(),
                    kind: "K".into(),
                    name: "o".into(),
                    uid: "u".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Default::default(),
            status: None,
        };
        let model = without_unmodelled_metadata(&m);
        assert_eq!(model.metadata.owner_references, None);
        assert_eq!(model.metadata.labels, Some(labels));
        assert_eq!(model.metadata.annotations, Some(annotations));
        assert_eq!(model.metadata.resource_version.as_deref(), Some("42"));
    }
}
