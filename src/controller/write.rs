//! The writes every reconciler makes, and the one place that remembers them. Each is
//! deliberate: finalizers with a JSON patch whose `test` makes concurrent edits fail instead of
//! clobbering, single fields by merge patch, status by server-side apply with one field
//! manager and only when it differs. A [`Writer`] with a [`Fresher`] records what each write
//! returned, so that the next reconcile does not act on a cache that has not caught up.

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::error::Error;
use super::fresh::Fresher;
use crate::api::FIELD_MANAGER;

/// Whether `obj` carries `finalizer`.
pub(crate) fn has_finalizer<K: kube::Resource>(obj: &K, finalizer: &str) -> bool {
    obj.finalizers().iter().any(|f| f == finalizer)
}

/// Writes objects of one kind in one namespace; remembers each write in `fresh`, if given.
pub(crate) struct Writer<'a, K> {
    api: Api<K>,
    fresh: Option<&'a Fresher<K>>,
}

impl<'a, K: StaticResource> Writer<'a, K> {
    pub(crate) fn new(api: Api<K>, fresh: Option<&'a Fresher<K>>) -> Self {
        Writer { api, fresh }
    }

    fn wrote(&self, before: &K, after: K) {
        if let Some(fresh) = self.fresh {
            fresh.wrote(before, after);
        }
    }

    /// Adds `finalizer`, failing if the finalizer list changed since `obj` was read.
    pub(crate) async fn add_finalizer(&self, obj: &K, finalizer: &str) -> Result<(), Error> {
        let current = obj.finalizers();
        let ops = if current.is_empty() {
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
            ])
        } else {
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": current},
                {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
            ])
        };
        let written = self
            .json_patch(&obj.name_any(), ops)
            .await
            .map_err(Error::write("finalizer"))?;
        self.wrote(obj, written);
        Ok(())
    }

    /// Removes `finalizer`, failing if it moved since `obj` was read; then forgets the object.
    pub(crate) async fn remove_finalizer(&self, obj: &K, finalizer: &str) -> Result<(), Error> {
        if let Some(i) = obj.finalizers().iter().position(|f| f == finalizer) {
            let path = format!("/metadata/finalizers/{i}");
            let ops = json!([
                {"op": "test", "path": path, "value": finalizer},
                {"op": "remove", "path": path},
            ]);
            match self.json_patch(&obj.name_any(), ops).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(Error::write("finalizer")(e)),
            }
        }
        if let Some(fresh) = self.fresh {
            fresh.forget(obj);
        }
        Ok(())
    }

    async fn json_patch(&self, name: &str, ops: serde_json::Value) -> Result<K, kube::Error> {
        let patch: json_patch::Patch = serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
        self.api
            .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
    }

    /// Merge-patches `body` (a single field, such as `spec.providerID`, named by `what`).
    pub(crate) async fn merge_patch(&self, obj: &K, what: &'static str, body: serde_json::Value) -> Result<(), Error> {
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let written = self
            .api
            .patch(&obj.name_any(), &pp, &Patch::Merge(&body))
            .await
            .map_err(Error::write(what))?;
        self.wrote(obj, written);
        Ok(())
    }

    /// Applies `next` as the status (server-side apply, forced, our field manager) if it
    /// differs from `current`. Returns whether it wrote.
    pub(crate) async fn apply_status<S: Serialize + PartialEq>(
        &self,
        obj: &K,
        current: Option<&S>,
        next: &S,
    ) -> Result<bool, Error> {
        if current == Some(next) {
            return Ok(false);
        }
        let name = obj.name_any();
        let body = json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "metadata": {"name": name},
            "status": next,
        });
        let written = self
            .api
            .patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
            .await
            .map_err(Error::write("status"))?;
        self.wrote(obj, written);
        Ok(true)
    }
}

/// Deserializable resources with a static type.
pub(crate) trait StaticResource:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + serde::Serialize + Send + Sync + 'static
{
}
impl<K> StaticResource for K where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + serde::Serialize + Send + Sync + 'static
{
}
