//! The kubelets of a workload cluster whose control plane runs for real, played by one KWOK
//! controller (`sigs.k8s.io/kwok`) per cluster: it manages the Nodes the guests register while
//! their kubelet runs (those labelled [`KUBELET_LABEL`]), renews their Leases and refreshes
//! their status, and runs the Pods bound to them through KWOK's own Stages (Running with an IP,
//! Jobs completed, deleted Pods terminated (phase `Succeeded`, as kubelet reports a Pod whose
//! containers it stopped) and then gone). A guest whose VM fails or goes away loses the label, so
//! its Node's heartbeat stops and the cluster's own node lifecycle controller marks it
//! NotReady and evicts its Pods, as for a real kubelet. Pure, except [`ClusterKwok`].

use std::path::{Path, PathBuf};

use crate::procs::{ProcessError, Supervised};
use crate::static_pods::write_kubeconfig;

/// On a Node whose kubelet runs; KWOK manages exactly the Nodes with it.
pub const KUBELET_LABEL: &str = "sim.kairon.zyvor.dev/kubelet";
pub const KUBELET_LABEL_VALUE: &str = "running";
/// kubelet's default `nodeLeaseDurationSeconds`; the Lease is renewed every quarter of it.
pub const NODE_LEASE_SECONDS: u32 = 40;
/// Where Pods get their addresses when the ClusterConfiguration names no pod subnet.
pub const DEFAULT_POD_CIDR: &str = "10.244.0.0/16";

#[derive(Debug, thiserror::Error)]
pub enum KwokError {
    #[error("KWOK's stages {0} are missing (hack/test-tools.sh copies them beside the binaries)")]
    NoStages(String),
    #[error("KWOK's stages {path}: {reason}")]
    BadStages { path: String, reason: String },
    #[error("writing its kubeconfig: {0}")]
    Files(#[source] std::io::Error),
    #[error(transparent)]
    Process(#[from] ProcessError),
}

/// A cluster's KWOK controller, kept running, and its directory (its kubeconfig); both go
/// when it is dropped.
pub struct ClusterKwok {
    process: Supervised,
    dir: PathBuf,
}

impl ClusterKwok {
    /// Starts `<bin_dir>/kwok` against `server` with the admin identity in `pki`; its
    /// kubeconfig in `<data_dir>/<name>/`, its log `<data_dir>/logs/<name>.log`.
    pub fn start(
        bin_dir: &Path,
        data_dir: &Path,
        name: &str,
        pki: &Path,
        server: &str,
        pod_cidr: &str,
    ) -> Result<ClusterKwok, KwokError> {
        let kwok_stages = stages_path(bin_dir);
        let text = std::fs::read_to_string(&kwok_stages)
            .map_err(|_| KwokError::NoStages(kwok_stages.display().to_string()))?;
        let ours = with_pod_termination(&text).map_err(|reason| KwokError::BadStages {
            path: kwok_stages.display().to_string(),
            reason,
        })?;
        let dir = data_dir.join(name);
        std::fs::create_dir_all(&dir).map_err(KwokError::Files)?;
        let stages = dir.join("stages.yaml");
        std::fs::write(&stages, ours).map_err(KwokError::Files)?;
        let kubeconfig = write_kubeconfig(pki, &dir, "admin", server).map_err(KwokError::Files)?;
        let process = Supervised::start(
            "kwok",
            bin_dir.join("kwok"),
            kwok_args(&kubeconfig, &stages, pod_cidr),
            data_dir.join("logs").join(format!("{name}.log")),
        )?;
        Ok(ClusterKwok { process, dir })
    }

    /// Whether it is still kept running.
    pub fn kept(&self) -> bool {
        self.process.kept()
    }
}

impl Drop for ClusterKwok {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// KWOK's Stage configs, which `hack/test-tools.sh` copies from the KWOK module beside the
/// binaries: `<bin>/../manifests/kwok/stages.yaml`.
pub fn stages_path(bin_dir: &Path) -> PathBuf {
    bin_dir.join("..").join("manifests").join("kwok").join("stages.yaml")
}

/// The simulator's Stages for deleted Pods: terminate a running one, then delete it.
const POD_DELETE_STAGES: &str = include_str!("kwok_pod_delete.yaml");
/// The simulator's Stage for the Pods of a kubelet that runs again: Ready again.
const POD_READY_AGAIN_STAGE: &str = include_str!("kwok_pod_ready_again.yaml");
/// The simulator's Stage for a Node whose kubelet missed its beats: Ready again, as kubelet
/// posts on its next sync.
const NODE_READY_AGAIN_STAGE: &str = include_str!("kwok_node_ready_again.yaml");
/// On a Node whose kubelet the simulator told to report NotReady (value `NotReady`):
/// [`NODE_READY_AGAIN_STAGE`] leaves such a Node alone.
pub const REPORTS_ANNOTATION: &str = "sim.kairon.zyvor.dev/kubelet-reports";
pub const REPORTS_NOT_READY: &str = "NotReady";

/// KWOK's Stages (YAML documents separated by `---` lines) with its fast `pod-delete`
/// replaced by [`POD_DELETE_STAGES`], and [`POD_READY_AGAIN_STAGE`] and
/// [`NODE_READY_AGAIN_STAGE`] added; an error if it has
/// no such Stage or a document does not parse.
pub fn with_pod_termination(kwok_stages: &str) -> Result<String, String> {
    let mut docs = Vec::new();
    let mut replaced = false;
    for doc in kwok_stages
        .split("\n---\n")
        .flat_map(|d| d.strip_prefix("---\n").or(Some(d)))
    {
        if doc.trim().is_empty() {
            continue;
        }
        let parsed: serde_json::Value =
            serde_saphyr::from_str(doc).map_err(|e| format!("a document does not parse: {e}"))?;
        if parsed["kind"] == "Stage" && parsed.pointer("/metadata/name").and_then(|n| n.as_str()) == Some("pod-delete")
        {
            replaced = true;
            continue;
        }
        docs.push(doc.trim_end());
    }
    if !replaced {
        return Err("no Stage named pod-delete to replace".into());
    }
    docs.push(POD_DELETE_STAGES.trim_end());
    docs.push(POD_READY_AGAIN_STAGE.trim_end());
    docs.push(NODE_READY_AGAIN_STAGE.trim_end());
    Ok(docs.join("\n---\n") + "\n")
}

/// The flags of one cluster's KWOK controller.
pub fn kwok_args(kubeconfig: &Path, stages: &Path, pod_cidr: &str) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--config={}", stages.display()),
        format!("--manage-nodes-with-label-selector={KUBELET_LABEL}={KUBELET_LABEL_VALUE}"),
        format!("--node-lease-duration-seconds={NODE_LEASE_SECONDS}"),
        format!("--cidr={pod_cidr}"),
        // INFO logs every Lease renewal of every Node.
        "--v=WARN".into(),
    ]
}

/// The pod subnet of a ClusterConfiguration (`networking.podSubnet`, the first of a dual-stack
/// list), if it names one.
pub fn pod_cidr_of(cluster_configuration: Option<&serde_json::Value>) -> Option<String> {
    cluster_configuration?
        .pointer("/networking/podSubnet")?
        .as_str()?
        .split(',')
        .map(str::trim)
        .find(|c| !c.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kwok_manages_the_labelled_nodes_with_leases() {
        let args = kwok_args(
            Path::new("/d/admin.conf"),
            Path::new("/m/stages.yaml"),
            "192.168.0.0/16",
        );
        assert_eq!(
            args,
            vec![
                "--kubeconfig=/d/admin.conf",
                "--config=/m/stages.yaml",
                "--manage-nodes-with-label-selector=sim.kairon.zyvor.dev/kubelet=running",
                "--node-lease-duration-seconds=40",
                "--cidr=192.168.0.0/16",
                "--v=WARN",
            ]
        );
    }

    #[test]
    fn pod_cidr_comes_from_the_cluster_configuration() {
        let cases = [
            ("none", None, None),
            ("no networking", Some(json!({"kind": "ClusterConfiguration"})), None),
            (
                "single",
                Some(json!({"networking": {"podSubnet": "192.168.0.0/16"}})),
                Some("192.168.0.0/16"),
            ),
            (
                "dual stack",
                Some(json!({"networking": {"podSubnet": "10.1.0.0/16, fd00::/56"}})),
                Some("10.1.0.0/16"),
            ),
            ("empty", Some(json!({"networking": {"podSubnet": ""}})), None),
        ];
        for (name, config, want) in cases {
            assert_eq!(pod_cidr_of(config.as_ref()).as_deref(), want, "{name}");
        }
    }

    const KWOK_FAST: &str = "---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: pod-ready\nspec: {}\n---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: pod-delete\nspec:\n  next:\n    delete: true\n";

    fn stage_names(yaml: &str) -> Vec<String> {
        yaml.split("\n---\n")
            .map(|d| serde_saphyr::from_str::<serde_json::Value>(d).unwrap())
            .map(|v| v["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn deleted_pods_terminate_before_they_go() {
        let stages = with_pod_termination(KWOK_FAST).unwrap();
        assert_eq!(
            stage_names(&stages),
            [
                "pod-ready",
                "pod-terminate",
                "pod-delete",
                "pod-ready-again",
                "node-ready-again"
            ]
        );
        let docs: Vec<serde_json::Value> = stages
            .split("\n---\n")
            .map(|d| serde_saphyr::from_str(d).unwrap())
            .collect();
        // A running Pod being deleted first goes Succeeded; only a Pod no longer running is
        // deleted, so one held by a finalizer stays Succeeded rather than Running.
        let terminate = &docs[1]["spec"];
        assert_eq!(
            terminate["selector"]["matchExpressions"][1]["values"],
            json!(["Running"])
        );
        assert!(
            terminate["next"]["statusTemplate"]
                .as_str()
                .unwrap()
                .contains("phase: Succeeded")
        );
        let delete = &docs[2]["spec"];
        assert_eq!(delete["selector"]["matchExpressions"][1]["operator"], "NotIn");
        assert_eq!(delete["next"]["delete"], true);
        // A Running Pod marked not Ready while its kubelet was gone is Ready again once the
        // kubelet is back; one being deleted is left to the Stages above.
        let again = &docs[3]["spec"]["selector"]["matchExpressions"];
        assert_eq!(again[0]["operator"], "DoesNotExist");
        assert_eq!(again[1]["values"], json!(["Running"]));
        assert_eq!(again[2]["values"], json!(["False"]));
        // A Node the node lifecycle controller marked Unknown is Ready again, as kubelet posts
        // on its next sync, unless the simulator told its kubelet to report NotReady.
        let node = &docs[4]["spec"];
        assert_eq!(node["resourceRef"]["kind"], "Node");
        let node_selector = &node["selector"]["matchExpressions"];
        assert_eq!(
            node_selector[0]["key"],
            format!(".metadata.annotations[\"{REPORTS_ANNOTATION}\"]")
        );
        assert_eq!(node_selector[0]["operator"], "DoesNotExist");
        assert_eq!(node_selector[1]["values"], json!(["Unknown"]));
        assert!(
            node["next"]["statusTemplate"]
                .as_str()
                .unwrap()
                .contains("range NodeConditions")
        );
    }

    #[test]
    fn stages_without_pod_delete_are_an_error() {
        let err = with_pod_termination("kind: Stage\nmetadata:\n  name: pod-ready\n").unwrap_err();
        assert!(err.contains("pod-delete"), "{err}");
        assert!(with_pod_termination("kind: [\n").is_err());
    }

    #[test]
    fn stages_sit_beside_the_binaries() {
        assert_eq!(
            stages_path(Path::new("/cache/h/bin")),
            Path::new("/cache/h/bin/../manifests/kwok/stages.yaml")
        );
    }
}
