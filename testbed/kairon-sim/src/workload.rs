//! The workload clusters, where the booted guests' kubelets would register their Nodes.
//! Clients are built from the Cluster's `<cluster>-kubeconfig` Secret, cached per cluster,
//! and rebuilt when the Secret's content changes. Node objects are built by pure functions.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus, NodeSystemInfo, Secret,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;
use tokio::sync::Mutex;

use crate::guest::GuestIdentity;
use crate::network::Attachment;
use crate::sim::FIELD_MANAGER;

/// How long a cached client is trusted before its Secret is read again.
const SECRET_RECHECK: Duration = Duration::from_secs(10);

/// The port the guests' kubelet endpoint listens on.
pub const KUBELET_PORT: u16 = 10250;

/// Creates `obj` in a workload cluster unless an object of its name exists. Looked up first: a
/// Service of a fixed ClusterIP that exists is refused as "IP already allocated" (422), not as
/// AlreadyExists.
pub(crate) async fn create_if_missing<K>(api: &Api<K>, obj: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    if let Some(name) = obj.meta().name.as_deref()
        && api.get_opt(name).await?.is_some()
    {
        return Ok(());
    }
    let post = PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    };
    match api.create(&post, obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
        Err(e) => Err(e),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("Secret {0} does not exist yet")]
    NoKubeconfig(String),
    #[error("Secret {0} holds no usable kubeconfig under key 'value'")]
    BadKubeconfig(String),
    #[error("reading Secret {0}: {1}")]
    ReadSecret(String, #[source] kube::Error),
    #[error("workload API server: {0}")]
    Api(#[from] kube::Error),
    #[error("Node {0} does not exist")]
    NodeMissing(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ClusterKey {
    namespace: String,
    cluster: String,
}

struct CachedClient {
    fingerprint: u64,
    checked: Instant,
    client: Client,
}

/// Clients for the workload clusters, one per cluster.
pub struct Workloads {
    management: Client,
    clients: Mutex<HashMap<ClusterKey, CachedClient>>,
}

impl Workloads {
    pub fn new(management: Client) -> Self {
        Self {
            management,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// The client for `cluster` in `namespace`, from its `<cluster>-kubeconfig` Secret.
    pub async fn client(&self, namespace: &str, cluster: &str) -> Result<Client, WorkloadError> {
        let key = ClusterKey {
            namespace: namespace.to_string(),
            cluster: cluster.to_string(),
        };
        let mut clients = self.clients.lock().await;
        if let Some(cached) = clients.get(&key).filter(|c| c.checked.elapsed() < SECRET_RECHECK) {
            return Ok(cached.client.clone());
        }
        let secret_name = format!("{cluster}-kubeconfig");
        let secret_ref = format!("{namespace}/{secret_name}");
        let secrets: Api<Secret> = Api::namespaced(self.management.clone(), namespace);
        let secret = match secrets.get_opt(&secret_name).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                clients.remove(&key);
                return Err(WorkloadError::NoKubeconfig(secret_ref));
            }
            Err(e) => return Err(WorkloadError::ReadSecret(secret_ref, e)),
        };
        let Some(ByteString(kubeconfig)) = secret.data.and_then(|mut d| d.remove("value")) else {
            return Err(WorkloadError::BadKubeconfig(secret_ref));
        };
        let fingerprint = fingerprint(&kubeconfig);
        if let Some(cached) = clients.get_mut(&key).filter(|c| c.fingerprint == fingerprint) {
            cached.checked = Instant::now();
            return Ok(cached.client.clone());
        }
        let client = client_from_kubeconfig(&kubeconfig)
            .await
            .ok_or(WorkloadError::BadKubeconfig(secret_ref.clone()))?;
        tracing::info!(secret = %secret_ref, "built workload cluster client");
        clients.insert(
            key,
            CachedClient {
                fingerprint,
                checked: Instant::now(),
                client: client.clone(),
            },
        );
        Ok(client)
    }

    /// Registers the Node as kubelet would: create it (or adopt one of the same name), then
    /// write its status through `nodes/status`. Returns the Node as written.
    pub async fn register_node(
        &self,
        client: &Client,
        node: &Node,
        status: &NodeStatus,
    ) -> Result<Node, WorkloadError> {
        let nodes: Api<Node> = Api::all(client.clone());
        let name = node.metadata.name.clone().unwrap_or_default();
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..Default::default()
        };
        match nodes.create(&pp, node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_already_exists() => {
                let existing = nodes.get(&name).await?;
                let ours = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
                let theirs = existing.spec.as_ref().and_then(|s| s.provider_id.as_deref());
                let mut patch = json!({"metadata": {"labels": node.metadata.labels}});
                match (theirs, ours) {
                    (None | Some(""), Some(ours)) => patch["spec"] = json!({"providerID": ours}),
                    (Some(theirs), Some(ours)) if theirs != ours => {
                        // providerID is write-once on a Node; kubelet would keep the old one.
                        tracing::warn!(node = %name, existing = theirs, wanted = ours, "Node exists with another providerID");
                    }
                    _ => {}
                }
                nodes.patch(&name, &patch_params(), &Patch::Merge(&patch)).await?;
            }
            Err(e) => return Err(e.into()),
        }
        self.set_node_status(client, &name, status).await
    }

    /// Takes the Node away from KWOK (its kubelet stopped): no Lease renewal, no status, no Pod
    /// handled from now on. A Node already gone is fine.
    pub async fn stop_kubelet(&self, client: &Client, name: &str) -> Result<(), WorkloadError> {
        let nodes: Api<Node> = Api::all(client.clone());
        let patch = json!({"metadata": {"labels": {crate::kwok::KUBELET_LABEL: null}}});
        match nodes.patch(name, &patch_params(), &Patch::Merge(&patch)).await {
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            r => r.map(|_| ()).map_err(Into::into),
        }
    }

    /// Writes the Node's status (on registration, and when told to change Ready).
    pub async fn set_node_status(
        &self,
        client: &Client,
        name: &str,
        status: &NodeStatus,
    ) -> Result<Node, WorkloadError> {
        let nodes: Api<Node> = Api::all(client.clone());
        let patch = json!({"status": status});
        // A strategic merge patch, as kubelet's: conditions merge by type, so those others set
        // on the Node (e.g. a remediation test's own condition) stay.
        let node = match nodes
            .patch_status(name, &patch_params(), &Patch::Strategic(&patch))
            .await
        {
            Ok(node) => node,
            Err(kube::Error::Api(s)) if s.is_not_found() => return Err(WorkloadError::NodeMissing(name.to_string())),
            Err(e) => return Err(e.into()),
        };
        // Tells KWOK's `node-ready-again` Stage whether this kubelet reports NotReady; written
        // only when it changes.
        let Some(reports) = reports_annotation_change(&node, status) else {
            return Ok(node);
        };
        let patch = json!({"metadata": {"annotations": {crate::kwok::REPORTS_ANNOTATION: reports}}});
        match nodes.patch(name, &patch_params(), &Patch::Merge(&patch)).await {
            Ok(node) => Ok(node),
            Err(kube::Error::Api(s)) if s.is_not_found() => Err(WorkloadError::NodeMissing(name.to_string())),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the Node, unless it carries another machine's providerID. Returns whether a
    /// Node was deleted.
    pub async fn delete_node(
        &self,
        client: &Client,
        name: &str,
        provider_id: Option<&str>,
    ) -> Result<bool, WorkloadError> {
        let nodes: Api<Node> = Api::all(client.clone());
        let Some(existing) = nodes.get_opt(name).await? else {
            return Ok(false);
        };
        let theirs = existing
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .filter(|p| !p.is_empty());
        if let (Some(theirs), Some(ours)) = (theirs, provider_id)
            && theirs != ours
        {
            tracing::info!(node = %name, "not deleting Node: it belongs to another machine");
            return Ok(false);
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: existing.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match nodes.delete(name, &dp).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

fn fingerprint(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// A client from kubeconfig bytes; `None` if they are not a usable kubeconfig. The error is
/// dropped on purpose: it could quote credentials.
pub async fn client_from_kubeconfig(bytes: &[u8]) -> Option<Client> {
    let text = std::str::from_utf8(bytes).ok()?;
    let kubeconfig = Kubeconfig::from_yaml(text).ok()?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .ok()?;
    Client::try_from(config).ok()
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    }
}

// --- Node objects (pure) -----------------------------------------------------------------

/// Everything a Node says about the simulated guest.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeFacts {
    pub identity: GuestIdentity,
    /// The Kairon Machine's uid (the VM's instance-id).
    pub machine_uid: String,
    /// The guest's own address (see [`crate::boot::node_facts`]): its `InternalIP`.
    pub internal_ip: Option<String>,
    /// Its NIC's network: which VIP it can carry for whom (see [`crate::endpoint`]).
    pub attachment: Attachment,
    pub hostname: String,
    /// What kubelet reports as `nodeInfo.kubeletVersion`: see [`crate::guest::kubelet_version`].
    pub kubelet_version: String,
    pub cpus: i32,
    pub memory: Quantity,
    pub disk: Quantity,
}

pub type SharedFacts = Arc<NodeFacts>;

/// The value [`crate::kwok::REPORTS_ANNOTATION`] must get on `node` (`Some(Null)`: removed) for
/// the status posted, or `None` if it already has it.
pub fn reports_annotation_change(node: &Node, status: &NodeStatus) -> Option<serde_json::Value> {
    let not_ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status != "True");
    let has = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::kwok::REPORTS_ANNOTATION))
        .is_some();
    match (not_ready, has) {
        (true, false) => Some(json!(crate::kwok::REPORTS_NOT_READY)),
        (false, true) => Some(serde_json::Value::Null),
        _ => None,
    }
}

/// The Node kubelet would create on registration (without status).
pub fn desired_node(facts: &NodeFacts) -> Node {
    let id = &facts.identity;
    let mut labels: BTreeMap<String, String> = id.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), id.node_name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("kubernetes.io/arch".into(), "amd64".into());
    labels.insert("beta.kubernetes.io/os".into(), "linux".into());
    labels.insert("beta.kubernetes.io/arch".into(), "amd64".into());
    labels.insert(
        crate::kwok::KUBELET_LABEL.into(),
        crate::kwok::KUBELET_LABEL_VALUE.into(),
    );
    Node {
        metadata: ObjectMeta {
            name: Some(id.node_name.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: id.provider_id.clone(),
            taints: (!id.taints.is_empty()).then(|| id.taints.clone()),
            ..Default::default()
        }),
        status: None,
    }
}

/// The Node status kubelet would post: Ready (or NotReady when told), no pressure.
pub fn node_status(facts: &NodeFacts, ready: bool, ready_since: Timestamp, now: Timestamp) -> NodeStatus {
    let condition = |type_: &str, status: &str, reason: &str, message: &str, since: Timestamp| NodeCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(since)),
    };
    let ready_condition = if ready {
        condition(
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status",
            ready_since,
        )
    } else {
        condition(
            "Ready",
            "False",
            "KubeletNotReady",
            "simulated: sim.kairon.zyvor.dev/node-ready is \"false\"",
            ready_since,
        )
    };
    let mut addresses = Vec::new();
    if let Some(ip) = &facts.internal_ip {
        addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: ip.clone(),
        });
    }
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: facts.hostname.clone(),
    });
    let resources: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), Quantity(facts.cpus.to_string())),
        ("memory".to_string(), facts.memory.clone()),
        ("ephemeral-storage".to_string(), facts.disk.clone()),
        ("pods".to_string(), Quantity("110".into())),
    ]
    .into();
    let uid = &facts.machine_uid;
    NodeStatus {
        conditions: Some(vec![
            condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
                ready_since,
            ),
            condition(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
                ready_since,
            ),
            condition(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
                ready_since,
            ),
            ready_condition,
        ]),
        addresses: Some(addresses),
        // Where the API server reaches kubelet (port-forward, logs, exec).
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(KUBELET_PORT),
            }),
        }),
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        node_info: Some(NodeSystemInfo {
            architecture: "amd64".into(),
            boot_id: uid.clone(),
            container_runtime_version: "containerd://2.1.4".into(),
            kernel_version: "6.8.0-kairon".into(),
            kube_proxy_version: String::new(),
            kubelet_version: facts.kubelet_version.clone(),
            machine_id: uid.replace('-', ""),
            operating_system: "linux".into(),
            os_image: "Ubuntu 24.04 LTS (kairon-sim)".into(),
            system_uuid: uid.clone(),
            swap: None,
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Taint;

    fn facts() -> NodeFacts {
        NodeFacts {
            identity: GuestIdentity {
                node_name: "demo-md-0-abc".into(),
                provider_id: Some("kairon://uid-1".into()),
                kubernetes_version: None,
                labels: [("pool".to_string(), "md-0".to_string())].into(),
                taints: vec![Taint {
                    key: "node.cluster.x-k8s.io/uninitialized".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }],
                control_plane: false,
            },
            machine_uid: "uid-1".into(),
            internal_ip: Some("10.42.0.9".into()),
            attachment: Attachment::User,
            hostname: "demo-md-0-abc".into(),
            kubelet_version: "v1.36.4".into(),
            cpus: 2,
            memory: Quantity("4Gi".into()),
            disk: Quantity("40Gi".into()),
        }
    }

    #[test]
    fn node_carries_provider_id_and_kubelet_labels() {
        let node = desired_node(&facts());
        assert_eq!(node.metadata.name.as_deref(), Some("demo-md-0-abc"));
        let spec = node.spec.unwrap();
        assert_eq!(spec.provider_id.as_deref(), Some("kairon://uid-1"));
        assert_eq!(spec.taints.unwrap()[0].key, "node.cluster.x-k8s.io/uninitialized");
        let labels = node.metadata.labels.unwrap();
        for (k, v) in [
            ("kubernetes.io/hostname", "demo-md-0-abc"),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
            ("pool", "md-0"),
            ("sim.kairon.zyvor.dev/kubelet", "running"),
        ] {
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
        }
    }

    #[test]
    fn the_not_ready_mark_is_written_only_when_it_changes() {
        let t0 = Timestamp::UNIX_EPOCH;
        let marked = |value: Option<&str>| Node {
            metadata: ObjectMeta {
                annotations: value.map(|v| [(crate::kwok::REPORTS_ANNOTATION.to_string(), v.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let cases = [
            ("ready, unmarked", true, None, None),
            ("not ready, unmarked", false, None, Some(json!("NotReady"))),
            ("not ready, marked", false, Some("NotReady"), None),
            (
                "ready again, marked",
                true,
                Some("NotReady"),
                Some(serde_json::Value::Null),
            ),
        ];
        for (name, ready, mark, want) in cases {
            let status = node_status(&facts(), ready, t0, t0);
            assert_eq!(reports_annotation_change(&marked(mark), &status), want, "{name}");
        }
    }

    #[test]
    fn node_status_reports_ready_or_not() {
        let t0 = Timestamp::UNIX_EPOCH;
        let now = Timestamp::from_second(60).unwrap();
        for (ready, want_status, want_reason) in [(true, "True", "KubeletReady"), (false, "False", "KubeletNotReady")] {
            let status = node_status(&facts(), ready, t0, now);
            let conditions = status.conditions.unwrap();
            let ready_condition = conditions.iter().find(|c| c.type_ == "Ready").unwrap();
            assert_eq!(ready_condition.status, want_status);
            assert_eq!(ready_condition.reason.as_deref(), Some(want_reason));
            assert_eq!(ready_condition.last_heartbeat_time, Some(Time(now)));
            assert_eq!(ready_condition.last_transition_time, Some(Time(t0)));
            for pressure in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
                assert_eq!(conditions.iter().find(|c| c.type_ == pressure).unwrap().status, "False");
            }
        }
        let status = node_status(&facts(), true, t0, now);
        assert_eq!(status.node_info.unwrap().kubelet_version, "v1.36.4");
        let addresses: Vec<(String, String)> = status
            .addresses
            .unwrap()
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        assert_eq!(
            addresses,
            vec![
                ("InternalIP".into(), "10.42.0.9".into()),
                ("Hostname".into(), "demo-md-0-abc".into())
            ]
        );
    }
}
