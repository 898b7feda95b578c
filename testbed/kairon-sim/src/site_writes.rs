//! Writes to Kairon's Nodes and MachineMigrations, as Kairon makes them: a Node per host
//! created (or adopted) at start with `--host-objects`, migration statuses through the status
//! subresource as merge patches of what changed (with the resourceVersion they were decided
//! on). A conflict returns the object as it is now, so the next decision is made on it.

use std::fmt::Debug;

use capkr::kairon::maintenance::{MachineMigration, MachineMigrationStatus};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Patch;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::machines::{patch_params, post_params};
use crate::placement;
use crate::status_patch::status_patch;

/// How a write ended.
#[derive(Debug)]
pub enum Written<K> {
    /// The object as it is now (written, or someone else's newer version after a conflict).
    Object(Box<K>),
    /// Deleted, or gone.
    Gone,
    Failed(kube::Error),
}

#[derive(Clone)]
pub struct SiteWriter {
    client: Client,
}

impl SiteWriter {
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    fn migrations(&self, namespace: &str) -> Api<MachineMigration> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Creates a Kubernetes Node per `--hosts` entry on Kairon's API server, labelled with its
    /// labels (Kairon's hosts are its cluster's Nodes; nothing runs them here: they are what
    /// operators cordon and `evacuate` names); one that exists is adopted (our labels merged).
    pub async fn ensure_nodes(&self, hosts: &[placement::Host]) -> Result<(), kube::Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        for host in hosts {
            match api.get_opt(&host.name).await? {
                Some(existing) => {
                    if host.labels.iter().any(|(k, v)| existing.labels().get(k) != Some(v)) {
                        let patch = json!({"metadata": {"labels": host.labels}});
                        api.patch(&host.name, &patch_params(), &Patch::Merge(&patch)).await?;
                    }
                    let reported = existing
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready"));
                    if !reported {
                        report_ready(&api, &host.name).await?;
                    }
                }
                None => {
                    let node = Node {
                        metadata: ObjectMeta {
                            name: Some(host.name.clone()),
                            labels: Some(host.labels.clone()),
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    match api.create(&post_params(), &node).await {
                        Ok(_) => {
                            tracing::info!(node = %host.name, "Node created");
                            report_ready(&api, &host.name).await?;
                        }
                        Err(kube::Error::Api(s)) if s.code == 409 => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(())
    }

    /// Creates `mig` (an evacuation's); one of that name that exists already is fine.
    pub async fn create_migration(&self, mig: &MachineMigration) -> Result<(), kube::Error> {
        match self
            .migrations(&mig.namespace().unwrap_or_default())
            .create(&post_params(), mig)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub async fn migration_status(
        &self,
        mig: &MachineMigration,
        status: &MachineMigrationStatus,
    ) -> Written<MachineMigration> {
        let api = self.migrations(&mig.namespace().unwrap_or_default());
        write_status(&api, mig, mig.status.as_ref(), status).await
    }
}

/// Merge-patches the status subresource from `old` to `new`, on the resourceVersion `object`
/// was read at; nothing when nothing changes.
pub async fn write_status<K, S>(api: &Api<K>, object: &K, old: Option<&S>, new: &S) -> Written<K>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    S: Serialize,
{
    let changes = match status_patch(old, new) {
        Ok(Some(changes)) => changes,
        Ok(None) => return Written::Object(Box::new(object.clone())),
        Err(e) => return Written::Failed(kube::Error::SerdeError(e)),
    };
    let name = object.name_any();
    let patch = json!({"metadata": {"resourceVersion": object.resource_version()}, "status": changes});
    match api.patch_status(&name, &patch_params(), &Patch::Merge(&patch)).await {
        Ok(written) => Written::Object(Box::new(written)),
        Err(kube::Error::Api(s)) if s.code == 404 => Written::Gone,
        Err(kube::Error::Api(s)) if s.code == 409 => fresh(api, &name).await,
        Err(e) => Written::Failed(e),
    }
}

pub async fn fresh<K>(api: &Api<K>, name: &str) -> Written<K>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api.get_opt(name).await {
        Ok(Some(object)) => Written::Object(Box::new(object)),
        Ok(None) => Written::Gone,
        Err(e) => Written::Failed(e),
    }
}

/// The host's kubelet reports its Node `Ready` (once: nothing in the test environment marks a
/// silent Node otherwise; a test turns it False to play a host that stops answering).
async fn report_ready(api: &Api<Node>, name: &str) -> Result<(), kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
    api.patch_status(name, &patch_params(), &Patch::Strategic(&patch))
        .await?;
    Ok(())
}
