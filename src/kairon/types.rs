//! Our model of a Kairon Machine, in the shape of Kairon's published Machine CRD
//! (`charts/kairon/crds/machines.yaml`; `docs/kairon-api.md`), with only the fields the
//! provider writes or reads. Kairon declares every spec field optional and prunes what it does
//! not declare, so each field here is optional and omitted when empty: what the provider sends
//! is accepted unchanged by Kairon's schema under strict field validation
//! (`tests/e2e/admission_schema.rs`).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::cloud_init::{CloudInit, CloudInitFile};

/// A Kairon virtual machine. Namespaced; reconciled by kairon-controller and kairon-node (or
/// the simulator).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kairon.zyvor.dev",
    version = "v1",
    kind = "Machine",
    namespaced,
    status = "MachineStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Machine is a Kairon virtual machine (development CRD; production clusters get it from Kairon).",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "CPU", type_ = "string", json_path = ".spec.resources.cpu"),
    printcolumn(name = "Memory", type_ = "string", json_path = ".spec.resources.memory"),
    printcolumn(name = "IP", type_ = "string", json_path = ".status.guestIP"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// The Kairon node (a Kubernetes Node of Kairon's cluster) the VM is bound to; written by
    /// kairon-controller when it schedules the Machine, never by the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// A MachineInstanceType whose resources Kairon copies into `resources` when both its cpu
    /// and memory are empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type_name: Option<String>,
    /// The boot disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<Image>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_agent: Option<GuestAgent>,
    /// Guest customization, applied once when the runtime is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init: Option<CloudInit>,
    /// `Running` (the schema's default), `Stopped`, `Paused` or `Halted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

impl MachineSpec {
    /// The MachineImage `spec.image.imageRef` names, if any.
    pub fn image_ref(&self) -> Option<&str> {
        self.image.as_ref().and_then(|i| i.image_ref.as_deref())
    }
}

/// `spec.image`: one of `imageRef`, `path` or `source` (Kairon also knows `catalogName`,
/// `blank` and OCI sources, which the provider does not write).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Image {
    /// A cluster-scoped MachineImage, which kairon-controller resolves into `source` and
    /// `digest` (and `diskSize`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_ref: Option<String>,
    /// A disk file already present on the Kairon node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ImageSource>,
    /// `sha256:…` of the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Size of the VM's copy of the disk, a quantity string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageSource {
    /// A disk image kairon-node downloads.
    #[serde(default, rename = "httpURL", skip_serializing_if = "Option::is_none")]
    pub http_url: Option<String>,
}

/// `spec.resources`: quantities as strings, parsed by Kairon (`"2"` CPUs, `"4Gi"` memory).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

/// `spec.network`: how the guest's NIC is attached (`mode` `user`, the default, `tap` or
/// `macvtap`), with what each mode takes; the subset the provider writes (see
/// `docs/kairon-api.md`, "Networks"). What Kairon derives itself (a netns MAC, a tap name) is
/// never written.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// tap: the host bridge the tap device joins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<String>,
    /// tap: a network namespace of the VM's own, with an address FluxVM assigns and reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<bool>,
    /// tap + netns: the netns address given to the guest by cloud-init instead of DHCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_network: Option<bool>,
    /// The guest NIC's MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Report the address FluxVM learns from the guest's ARP, neighbour advertisements or DHCP
    /// lease when Kairon has none otherwise.
    #[serde(default, rename = "learnIP", skip_serializing_if = "Option::is_none")]
    pub learn_ip: Option<bool>,
    /// macvtap: the host NIC the macvtap device sits on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// macvtap: `bridge`, `vepa`, `private` or `passthru`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macvtap_mode: Option<String>,
}

/// `spec.guestAgent`: qemu-guest-agent in the image, which kairon-node asks for the guest's
/// addresses when FluxVM knows none.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GuestAgent {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `spec.placement`: which Kairon nodes may run the VM.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Labels a Kairon node must have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Soft spreading away from other Machines (a term's `labelSelector` is an equality map
    /// over their labels; a Machine never matches itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_anti_affinity: Option<Vec<WeightedTerm>>,
    /// Hard spreading away from other Machines: a node in the same topology domain as a
    /// matching Machine is not a candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anti_affinity: Option<Vec<Term>>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Term {
    pub label_selector: BTreeMap<String, String>,
    pub topology_key: String,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WeightedTerm {
    pub weight: i32,
    pub label_selector: BTreeMap<String, String>,
    pub topology_key: String,
}

/// Raw cloud-init user-data: CAPI bootstrap data, which holds cluster secrets. Its `Debug`
/// never shows the content, so it cannot reach a log line by accident.
#[derive(Serialize, Deserialize, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct UserData(pub String);

impl fmt::Debug for UserData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserData(<redacted, {} bytes>)", self.0.len())
    }
}

impl UserData {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for UserData {
    fn from(text: String) -> Self {
        UserData(text)
    }
}

/// What Kairon reports.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// See [`phase`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The Kairon node whose kairon-node reports the VM; changes in place when the VM moves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// FluxVM's id of the current runtime: new for every runtime, so never an identity.
    #[serde(default, rename = "runtimeID", skip_serializing_if = "Option::is_none")]
    pub runtime_id: Option<String>,
    /// The guest's address, when Kairon learns one (tap networking with netns, or the guest
    /// agent).
    #[serde(default, rename = "guestIP", skip_serializing_if = "Option::is_none")]
    pub guest_ip: Option<String>,
    #[serde(default, rename = "guestIPs", skip_serializing_if = "Option::is_none")]
    pub guest_ips: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The last reconcile error; empty once a reconcile is clean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// Kairon's phases.
///
/// Kairon's own (kairon-node and kairon-controller set them as plain strings; none is terminal,
/// Kairon keeps reconciling): Pending, Starting, Running, Paused, Halted, Stopped, Error,
/// Unknown, Blocked. Provisioning and Terminating are ours, never Kairon's: how a KaironMachine
/// records Kairon's bringing-up steps, and how we read a Machine being deleted (Kairon keeps
/// its last phase).
pub mod phase {
    pub const PENDING: &str = "Pending";
    /// Kairon: FluxVM is creating or starting the VM.
    pub const STARTING: &str = "Starting";
    /// Kairon: `spec.powerState: Paused` took effect.
    pub const PAUSED: &str = "Paused";
    /// Kairon: `spec.powerState: Halted`: the VMM is stopped, the VM and its disk are kept.
    pub const HALTED: &str = "Halted";
    /// Kairon: a reconcile of the Machine failed (`status.message` says why); Kairon retries.
    pub const ERROR: &str = "Error";
    /// Kairon: FluxVM reported a status Kairon does not know, its `failed` among them; Kairon
    /// does not restart such a runtime.
    pub const UNKNOWN: &str = "Unknown";
    /// Kairon: adopt-only (an incoming migration) and no runtime yet.
    pub const BLOCKED: &str = "Blocked";
    /// Ours: what a KaironMachine records for Pending, Starting and Blocked.
    pub const PROVISIONING: &str = "Provisioning";
    pub const RUNNING: &str = "Running";
    /// Kairon: `spec.powerState: Stopped` deleted the runtime and its disk, or FluxVM reports
    /// it stopped (Kairon starts it again while Running is wanted).
    pub const STOPPED: &str = "Stopped";
    /// Ours: a Kairon Machine with a deletion timestamp, whatever phase it still shows.
    pub const TERMINATING: &str = "Terminating";
    /// Ours, in memory only, never Kairon's: the object could not be read as a Kairon Machine
    /// (`status.message` says why; see [`super::super::machine_from_value`]).
    pub(crate) const UNREADABLE: &str = "capkr.Unreadable";
}

/// `spec.powerState` values Kairon takes.
pub mod power_state {
    pub const RUNNING: &str = "Running";
    /// No runtime: a member of a pool's set is made so, and started by the pool.
    pub const STOPPED: &str = "Stopped";
}
