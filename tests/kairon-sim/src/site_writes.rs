//! Writes to Kairon's Host and MachineMigration objects, as kairon-controller makes them:
//! Hosts created (or adopted) at start with `--host-objects`, statuses through the status
//! subresource as merge patches of what changed (with the resourceVersion they were decided
//! on), Kairon's own evacuation migrations created and deleted. A conflict returns the object
//! as it is now, so the next decision is made on it.

use std::fmt::Debug;

use capkr::kairon::maintenance::{Host, HostSpec, HostStatus, MachineMigration, MachineMigrationStatus};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::machines::{patch_params, post_params};
use crate::placement;
use crate::sim::Key;
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

    fn hosts(&self) -> Api<Host> {
        Api::all(self.client.clone())
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
                        Ok(_) => tracing::info!(node = %host.name, "Node created"),
                        Err(kube::Error::Api(s)) if s.code == 409 => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(())
    }

    /// Creates a Host per `--hosts` entry, labelled with its labels; one that exists is
    /// adopted (our labels merged into its own).
    pub async fn ensure_hosts(&self, hosts: &[placement::Host]) -> Result<(), kube::Error> {
        let api = self.hosts();
        for host in hosts {
            match api.get_opt(&host.name).await? {
                Some(existing) => {
                    let missing = host.labels.iter().any(|(k, v)| existing.labels().get(k) != Some(v));
                    if missing {
                        let patch = json!({"metadata": {"labels": host.labels}});
                        api.patch(&host.name, &patch_params(), &Patch::Merge(&patch)).await?;
                    }
                    tracing::info!(host = %host.name, "Host adopted");
                }
                None => {
                    let mut object = Host::new(&host.name, HostSpec::default());
                    object.metadata.labels = Some(host.labels.clone());
                    match api.create(&post_params(), &object).await {
                        Ok(_) => tracing::info!(host = %host.name, "Host created"),
                        Err(kube::Error::Api(s)) if s.code == 409 => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(())
    }

    pub async fn host_status(&self, host: &Host, status: &HostStatus) -> Written<Host> {
        write_status(&self.hosts(), host, host.status.as_ref(), status).await
    }

    pub async fn migration_status(
        &self,
        mig: &MachineMigration,
        status: &MachineMigrationStatus,
    ) -> Written<MachineMigration> {
        let api = self.migrations(&mig.namespace().unwrap_or_default());
        write_status(&api, mig, mig.status.as_ref(), status).await
    }

    /// Creates `mig`; one of that name that exists already is returned as it is.
    pub async fn create_migration(&self, mig: &MachineMigration) -> Written<MachineMigration> {
        let api = self.migrations(&mig.namespace().unwrap_or_default());
        match api.create(&post_params(), mig).await {
            Ok(created) => Written::Object(Box::new(created)),
            Err(kube::Error::Api(s)) if s.code == 409 => fresh(&api, &mig.name_any()).await,
            Err(e) => Written::Failed(e),
        }
    }

    pub async fn delete_migration(&self, key: &Key) -> Written<MachineMigration> {
        match self
            .migrations(&key.namespace)
            .delete(&key.name, &DeleteParams::default())
            .await
        {
            Ok(_) => Written::Gone,
            Err(kube::Error::Api(s)) if s.code == 404 => Written::Gone,
            Err(e) => Written::Failed(e),
        }
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
