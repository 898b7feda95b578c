//! The writes every reconciler makes. Each is deliberate: finalizers with a JSON patch whose
//! `test` makes concurrent edits fail instead of clobbering, status by server-side apply with
//! one field manager, and only when it differs.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde_json::json;

use super::StaticResource;

/// The field manager of every write the manager makes.
pub const FIELD_MANAGER: &str = "capkr-manager";

/// Whether `obj` carries `finalizer`.
pub fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.finalizers().iter().any(|f| f == finalizer)
}

/// Adds `finalizer`, failing if the finalizer list changed since `obj` was read. Returns the
/// object as written.
pub async fn add_finalizer<K: StaticResource>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<K, kube::Error> {
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
    json_patch(api, &obj.name_any(), ops).await
}

/// Removes `finalizer`, failing if it moved since `obj` was read.
pub async fn remove_finalizer<K: StaticResource>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<(), kube::Error> {
    let Some(i) = obj.finalizers().iter().position(|f| f == finalizer) else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{i}");
    let ops = json!([
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]);
    match json_patch(api, &obj.name_any(), ops).await {
        Err(e) if super::is_not_found(&e) => Ok(()),
        other => other.map(|_| ()),
    }
}

async fn json_patch<K: StaticResource>(api: &Api<K>, name: &str, ops: serde_json::Value) -> Result<K, kube::Error> {
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
    api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
}

/// Applies `status` (server-side apply, forced, our field manager). Returns the object as
/// written.
pub async fn apply_status<K: StaticResource>(
    api: &Api<K>,
    name: &str,
    status: &impl Serialize,
) -> Result<K, kube::Error> {
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": name},
        "status": status,
    });
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
        .await
}

/// Merge-patches `body` into the object (used for single fields such as `spec.providerID`).
/// Returns the object as written.
pub async fn merge_patch<K: StaticResource>(
    api: &Api<K>,
    name: &str,
    body: serde_json::Value,
) -> Result<K, kube::Error> {
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch(name, &pp, &Patch::Merge(&body)).await
}
