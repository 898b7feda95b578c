//! How Kairon MachineSets are spoken to: an authoritative read, a create that falls back to
//! reading what already has the name, `spec.replicas` written only against the version the
//! decision was made on (a release together with its record), a relabel for adoption, and a
//! delete that names the UID it means. A pool never rewrites a set's template.
//!
//! A pool's sets carry no bootstrap data; a set made by someone else might: errors keep only
//! the answer's code and reason, and what is read never holds a template's cloudInit
//! ([`machine_set_from_value`] drops it before parsing).

use std::sync::Arc;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::client::{MAX_API_REASON, redacted_error_kind, settle};
use super::gate::{Permit, Refusal, WriteGate};
use super::machineset::MachineSet;
use super::set_desired::{POOL_ID_ANNOTATION, RELEASE_RECORD_PREFIX};
use super::{Deletion, Owner, labels};
use crate::api::FIELD_MANAGER;
use crate::text::bounded;

/// Kairon MachineSets on one Kairon API. Made by [`super::Instances::machine_sets`].
#[derive(Clone)]
pub struct MachineSets {
    client: Client,
    owner: Owner,
    gate: Option<Arc<WriteGate>>,
    /// MachineSets in the version spoken on this API.
    resource: ApiResource,
}

/// What a create found.
#[derive(Debug)]
pub enum SetCreated {
    /// A new set.
    New(MachineSet),
    /// One with that name already existed: whose it is is for the caller to decide.
    Existing(MachineSet),
}

/// A failed request about a Kairon MachineSet, by what was asked. None of them can quote
/// bootstrap data.
#[derive(Debug, thiserror::Error)]
pub enum SetError {
    #[error("reading Kairon MachineSet {ns}/{name}: {source}")]
    Read {
        ns: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action} Kairon MachineSet {name}: {detail}")]
    Write {
        action: &'static str,
        name: String,
        detail: String,
    },
    /// The set changed since it was read (its `resourceVersion` moved): decide again on a
    /// fresh read.
    #[error("{action} Kairon MachineSet {name}: it changed since it was read")]
    Stale { action: &'static str, name: String },
    #[error("deleting Kairon MachineSet {name}: {source}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Not sent: the API did not answer an earlier write ([`WriteGate`]).
    #[error("{action} Kairon MachineSet {name}: {refusal}")]
    Refused {
        action: &'static str,
        name: String,
        refusal: Refusal,
    },
}

impl SetError {
    /// A short label for metrics and logs.
    pub fn stage(&self) -> &'static str {
        match self {
            SetError::Read { .. } => "read",
            SetError::Write { .. } | SetError::Stale { .. } => "write_machineset",
            SetError::Delete { .. } => "delete_machineset",
            SetError::Refused { .. } => "kairon_api",
        }
    }
}

impl MachineSets {
    pub(super) fn new(client: Client, owner: Owner, gate: Option<Arc<WriteGate>>, resource: ApiResource) -> Self {
        MachineSets {
            client,
            owner,
            gate,
            resource,
        }
    }

    /// The Kairon MachineSets of `namespace`, or of all namespaces (for watches), untyped:
    /// read them with [`read_set`].
    pub fn api(&self, namespace: Option<&str>) -> Api<DynamicObject> {
        let ar = &self.resource;
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, ar),
            None => Api::all_with(self.client.clone(), ar),
        }
    }

    fn permit(&self, action: &'static str, name: &str) -> Result<Option<Permit>, SetError> {
        match &self.gate {
            None => Ok(None),
            Some(gate) => gate.admit().map(Some).map_err(|refusal| SetError::Refused {
                action,
                name: name.to_string(),
                refusal,
            }),
        }
    }

    fn pp() -> PatchParams {
        PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        }
    }

    /// Reads one set from the API server (not from a cache), without its user-data.
    pub async fn get(&self, ns: &str, name: &str) -> Result<Option<MachineSet>, SetError> {
        self.api(Some(ns))
            .get_opt(name)
            .await
            .map(|o| o.map(read_set))
            .map_err(|source| SetError::Read {
                ns: ns.into(),
                name: name.into(),
                source,
            })
    }

    /// Creates `desired` (stamped with this management cluster); if its name is taken,
    /// returns what has it.
    pub async fn create(&self, mut desired: MachineSet) -> Result<SetCreated, SetError> {
        let ns = desired.namespace().unwrap_or_default();
        let name = desired.name_any();
        if !self.owner.id.is_empty() {
            desired
                .metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(labels::MANAGEMENT_CLUSTER.to_string(), self.owner.id.clone());
        }
        let write = |detail: String| SetError::Write {
            action: "creating",
            name: name.clone(),
            detail,
        };
        let mut body: DynamicObject = serde_json::to_value(&desired)
            .and_then(serde_json::from_value)
            .map_err(|_| write("the MachineSet could not be encoded".into()))?;
        // One schema in every version: only the version named changes.
        body.types = Some(kube::api::TypeMeta {
            api_version: self.resource.api_version.clone(),
            kind: self.resource.kind.clone(),
        });
        drop(desired);
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let permit = self.permit("creating", &name)?;
        let answer = self.api(Some(&ns)).create(&pp, &body).await;
        settle(permit, &answer);
        match answer {
            Ok(set) => Ok(SetCreated::New(read_set(set))),
            Err(kube::Error::Api(s)) if s.is_already_exists() => match self.get(&ns, &name).await? {
                Some(set) => Ok(SetCreated::Existing(set)),
                None => Err(write("it exists and vanished right after".into())),
            },
            Err(e) => Err(write(redacted(&e))),
        }
    }

    /// Sets `spec.replicas` to `replicas`, only if `set` is still as it was read: a decision
    /// about how many members to keep is only valid for the members it saw.
    pub async fn patch_replicas(&self, set: &MachineSet, replicas: i32) -> Result<(), SetError> {
        let body = json!({
            "metadata": {"resourceVersion": set.resource_version()},
            "spec": {"replicas": replicas},
        });
        self.merge(set, "scaling", &body).await
    }

    /// Lowers `spec.replicas` by one for member `member_uid` (named `member_name`), which the
    /// pool released, and records that in the same write (an annotation per member), only if
    /// `set` is still as it was read: a release is counted exactly once.
    pub async fn release(&self, set: &MachineSet, member_uid: &str, member_name: &str) -> Result<(), SetError> {
        let body = json!({
            "metadata": {
                "resourceVersion": set.resource_version(),
                "annotations": {release_record(member_uid): member_name},
            },
            "spec": {"replicas": (set.spec.replicas - 1).max(0)},
        });
        self.merge(set, "releasing a member of", &body).await
    }

    /// Removes the release records of members that are gone.
    pub async fn forget_releases(&self, set: &MachineSet, member_uids: &[String]) -> Result<(), SetError> {
        let records: serde_json::Map<String, Value> = member_uids
            .iter()
            .map(|uid| (release_record(uid), Value::Null))
            .collect();
        let body = json!({"metadata": {"resourceVersion": set.resource_version(), "annotations": records}});
        self.merge(set, "forgetting released members of", &body).await
    }

    /// Moves the set's link-back labels (and its management-cluster label) to pool `uid`
    /// (adoption after `clusterctl move`). The template is left alone: nothing in it changes
    /// on a move, so the pool does not roll.
    pub async fn adopt(&self, set: &MachineSet, pool_uid: &str, pool_namespace: &str) -> Result<(), SetError> {
        let mut body = json!({"metadata": {"labels": {
            labels::KAIRONMACHINEPOOL_UID: pool_uid,
            labels::KAIRONMACHINEPOOL_NAMESPACE: pool_namespace,
        }}});
        if !self.owner.id.is_empty() {
            body["metadata"]["labels"][labels::MANAGEMENT_CLUSTER] = json!(self.owner.id);
        }
        self.merge(set, "relabelling", &body).await
    }

    /// Deletes exactly `set` (UID precondition); Kairon deletes its members first.
    pub async fn delete(&self, set: &MachineSet) -> Result<Deletion, SetError> {
        let name = set.name_any();
        let dp = crate::client::delete_exactly(set.metadata.uid.clone());
        let permit = self.permit("deleting", &name)?;
        let answer = self
            .api(Some(&set.namespace().unwrap_or_default()))
            .delete(&name, &dp)
            .await;
        settle(permit, &answer);
        match answer {
            Ok(_) => Ok(Deletion::Started),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(Deletion::Gone),
            Err(source) => Err(SetError::Delete { name, source }),
        }
    }

    async fn merge(&self, set: &MachineSet, action: &'static str, body: &Value) -> Result<(), SetError> {
        self.send(set, action, Patch::Merge(body)).await
    }

    async fn send<P: serde::Serialize + std::fmt::Debug>(
        &self,
        set: &MachineSet,
        action: &'static str,
        patch: Patch<P>,
    ) -> Result<(), SetError> {
        let name = set.name_any();
        let permit = self.permit(action, &name)?;
        let answer = self
            .api(Some(&set.namespace().unwrap_or_default()))
            .patch(&name, &Self::pp(), &patch)
            .await;
        settle(permit, &answer);
        match answer {
            Ok(_) => Ok(()),
            // 409: the resourceVersion moved; 422 from a failed `test` op: the same, for a JSON
            // patch.
            Err(kube::Error::Api(s)) if s.code == 409 || (s.code == 422 && s.message.contains("test")) => {
                Err(SetError::Stale { action, name })
            }
            Err(e) => Err(SetError::Write {
                action,
                name,
                detail: redacted(&e),
            }),
        }
    }
}

/// An error of a request that carried bootstrap data, or may have: the answer's code and
/// reason only (an API error may quote the request).
fn redacted(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("the API answered {} {}", s.code, bounded(&s.reason, MAX_API_REASON)),
        e => redacted_error_kind(e),
    }
}

/// A set from an untyped answer, as [`machine_set_from_value`] reads it.
pub fn read_set(obj: DynamicObject) -> MachineSet {
    machine_set_from_value(serde_json::to_value(obj).unwrap_or_default())
}

/// Reads a Kairon MachineSet leniently and without its user-data: `template.spec.cloudInit`
/// and `legacyUserData` are dropped before parsing (bootstrap data is never held in memory), and the template's
/// spec is read as a Kairon Machine's is (missing fields take their defaults). A set that
/// still cannot be read keeps its metadata and an empty spec with no replicas: the pool
/// then reports it rather than acting on a guess.
pub fn machine_set_from_value(mut value: Value) -> MachineSet {
    if let Some(spec) = value.pointer_mut("/spec/template/spec").and_then(Value::as_object_mut) {
        spec.remove("cloudInit");
        spec.remove("legacyUserData");
    }
    if let Ok(set) = serde_json::from_value::<MachineSet>(value.clone()) {
        return set;
    }
    let template_spec = value.pointer("/spec/template/spec").cloned().map(|s| {
        let vm = super::machine_from_value(json!({"metadata": {}, "spec": s}));
        serde_json::to_value(vm.spec).unwrap_or_default()
    });
    if let (Some(ts), Some(t)) = (template_spec, value.pointer_mut("/spec/template")) {
        t["spec"] = ts;
    }
    if let Ok(set) = serde_json::from_value::<MachineSet>(value.clone()) {
        return set;
    }
    let metadata = value
        .get("metadata")
        .cloned()
        .and_then(|m| serde_json::from_value(m).ok())
        .unwrap_or_default();
    MachineSet {
        metadata,
        spec: Default::default(),
        status: None,
    }
}

/// What the caches keep of a set: its labels, the pool's ID and the release records, spec
/// without cloudInit, status. Other annotations, managedFields and finalizers go.
pub fn keep_set_what_is_read(set: &mut MachineSet) {
    set.spec.template.spec.cloud_init = None;
    let meta = &mut set.metadata;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.retain(|k, _| k == POOL_ID_ANNOTATION || k.starts_with(RELEASE_RECORD_PREFIX));
    }
}

/// The annotation that records the release of member `uid` on its set.
pub fn release_record(uid: &str) -> String {
    format!("{RELEASE_RECORD_PREFIX}{uid}")
}

/// The name of released member `uid`, as `set`'s record of it says.
pub fn released_name<'a>(set: &'a MachineSet, uid: &str) -> Option<&'a str> {
    set.annotations().get(&release_record(uid)).map(String::as_str)
}

/// The members (uids) whose release `set` records.
pub fn released_members(set: &MachineSet) -> Vec<String> {
    set.annotations()
        .keys()
        .filter_map(|k| k.strip_prefix(RELEASE_RECORD_PREFIX))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_read_without_its_user_data_and_leniently() {
        let base = json!({"apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineSet",
            "metadata": {"name": "pool", "namespace": "ns", "uid": "u1"},
            "spec": {"replicas": 3, "template": {"spec": {"resources": {"cpu": "2", "memory": "4Gi"},
                "image": {"imageRef": "img"}, "legacyUserData": "#cloud-config SECRET",
                "cloudInit": {"runCmd": ["kubeadm join SECRET"]}}}},
            "status": {"replicas": 3, "readyReplicas": 2}});
        let set = machine_set_from_value(base.clone());
        assert_eq!(set.spec.replicas, 3);
        assert!(set.spec.template.spec.cloud_init.is_none(), "user-data is never held");
        assert!(!format!("{set:?}").contains("SECRET"));

        let mut odd = base.clone();
        odd["spec"]["template"]["spec"]["gpu"] = json!({"model": "x"});
        odd["spec"]["template"]["spec"]["resources"] = json!({"cpu": 2});
        odd["spec"]["template"]["spec"].as_object_mut().unwrap().remove("image");
        let set = machine_set_from_value(odd);
        assert_eq!(set.spec.replicas, 3, "added and missing template fields are fine");
        assert_eq!(set.status.and_then(|s| s.ready_replicas), Some(2));

        let mut wrong = base;
        wrong["spec"]["replicas"] = json!("three");
        let set = machine_set_from_value(wrong);
        assert_eq!(set.metadata.uid.as_deref(), Some("u1"), "metadata is kept");
        assert_eq!(set.spec.replicas, 0);
    }

    #[test]
    fn a_cached_set_keeps_what_the_pool_reads() {
        let mut set = machine_set_from_value(json!({"apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineSet",
            "metadata": {"name": "pool", "namespace": "ns", "labels": {labels::KAIRONMACHINEPOOL_UID: "p"},
                "annotations": {POOL_ID_ANNOTATION: "kairon://machinesets/u", release_record("m1"): "pool-1", "other": "1"},
                "finalizers": ["kairon.zyvor.dev/machineset-cleanup"]},
            "spec": {"replicas": 2, "template": {"spec": {"resources": {"cpu": "2"}, "image": {"imageRef": "img"}}}}}));
        set.spec.template.spec.cloud_init = Some(super::super::CloudInit {
            run_cmd: vec!["SECRET".into()],
            ..Default::default()
        });
        keep_set_what_is_read(&mut set);
        assert!(set.spec.template.spec.cloud_init.is_none());
        assert_eq!(set.annotations().len(), 2);
        assert_eq!(released_members(&set), vec!["m1".to_string()]);
        assert_eq!(set.labels().len(), 1);
        assert!(set.metadata.finalizers.is_none());
        assert_eq!(set.spec.replicas, 2);
    }
}
