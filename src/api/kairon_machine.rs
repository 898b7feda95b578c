//! `KaironMachine`: the infrastructure machine of the CAPI v1beta2 contract.
//!
//! CAPI clones it from a `KaironMachineTemplate` (same name as its Machine) and owns it through
//! a controller reference to the Machine. The spec describes the VM; it is immutable except for
//! `providerID`, which the controller writes once.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Desired state of a Kairon virtual machine.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KaironMachine",
    namespaced,
    status = "KaironMachineStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "km",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "KaironMachine is the Cluster API infrastructure machine backed by a Kairon virtual machine.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name", description = "Cluster this machine belongs to"),
    printcolumn(name = "Machine", type_ = "string", json_path = ".metadata.ownerReferences[?(@.kind==\"Machine\")].name", description = "Machine that owns this KaironMachine"),
    printcolumn(name = "ProviderID", type_ = "string", json_path = ".spec.providerID", description = "Provider ID of the Kairon Machine"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.instance.phase", description = "Phase of the Kairon Machine"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status", description = "Ready condition"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("!has(oldSelf.spec.providerID) || (has(self.spec.providerID) && self.spec.providerID == oldSelf.spec.providerID)").message("spec.providerID is write-once: it cannot be changed or removed once set").field_path(".spec.providerID"),
    validation = Rule::new("self.spec.image == oldSelf.spec.image").message("spec.image is immutable: create a new KaironMachineTemplate and roll out instead").field_path(".spec.image"),
    validation = Rule::new("has(self.spec.resources) == has(oldSelf.spec.resources) && (!has(self.spec.resources) || self.spec.resources == oldSelf.spec.resources)").message("spec.resources is immutable: create a new KaironMachineTemplate and roll out instead").field_path(".spec.resources"),
    validation = Rule::new("has(self.spec.instanceTypeName) == has(oldSelf.spec.instanceTypeName) && (!has(self.spec.instanceTypeName) || self.spec.instanceTypeName == oldSelf.spec.instanceTypeName)").message("spec.instanceTypeName is immutable: create a new KaironMachineTemplate and roll out instead").field_path(".spec.instanceTypeName"),
    validation = Rule::new("has(self.spec.network) == has(oldSelf.spec.network) && (!has(self.spec.network) || self.spec.network == oldSelf.spec.network)").message("spec.network is immutable: create a new KaironMachineTemplate and roll out instead").field_path(".spec.network"),
    validation = Rule::new("has(self.spec.guestAgent) == has(oldSelf.spec.guestAgent) && (!has(self.spec.guestAgent) || self.spec.guestAgent == oldSelf.spec.guestAgent)").message("spec.guestAgent is immutable: create a new KaironMachineTemplate and roll out instead").field_path(".spec.guestAgent"),
    validation = Rule::new("has(self.spec.placement) == has(oldSelf.spec.placement) && (!has(self.spec.placement) || self.spec.placement == oldSelf.spec.placement)").message("spec.placement is immutable: create a new KaironMachineTemplate and roll out instead").field_path(".spec.placement"),
    validation = Rule::new("has(self.spec.evictionStrategy) == has(oldSelf.spec.evictionStrategy) && (!has(self.spec.evictionStrategy) || self.spec.evictionStrategy == oldSelf.spec.evictionStrategy)").message("spec.evictionStrategy is immutable: create a new KaironMachineTemplate and roll out instead").field_path(".spec.evictionStrategy"),
)]
#[x_kube(validation = Rule::new("has(self.resources) != has(self.instanceTypeName)").message("exactly one of resources and instanceTypeName must be set"))]
#[serde(rename_all = "camelCase")]
pub struct KaironMachineSpec {
    /// Provider ID of the machine, `kairon://<name of the Kairon Machine>` (`kairon://<its
    /// uid>` for a KaironMachinePool's members, and as earlier versions wrote it). Written by the controller once
    /// the Kairon Machine exists; never set it in a template.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub provider_id: Option<String>,

    /// The boot disk, as Kairon takes it (Kairon's `spec.image`): exactly one of `imageRef` (a
    /// Kairon MachineImage), `path` (a disk already on the Kairon node) or `httpURL` (a disk
    /// kairon-node downloads, with its `digest`), and optionally the size of the VM's copy.
    pub image: MachineImage,

    /// CPUs and memory of the VM (Kairon's `spec.resources`). Exactly one of `resources` and
    /// `instanceTypeName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<MachineResources>,

    /// A Kairon MachineInstanceType of the Kairon Machine's namespace, whose cpu and memory
    /// Kairon copies into the Machine's resources (Kairon's `spec.instanceTypeName`). Exactly
    /// one of `resources` and `instanceTypeName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub instance_type_name: Option<String>,

    /// How the VM's network interface is attached (Kairon's `spec.network`): Kairon's
    /// user-mode network (a NAT of the VM's own, reachable by no other VM) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<MachineNetwork>,

    /// The VM's guest agent (Kairon's `spec.guestAgent`): with `enabled`, Kairon reads the
    /// guest's addresses from qemu-guest-agent when it knows none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_agent: Option<GuestAgent>,

    /// Which Kairon nodes may run the VM (Kairon's `spec.placement`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<MachinePlacement>,

    /// Deprecated and ignored: Kairon has no eviction strategy. A VM on a cordoned Kairon node
    /// is replaced through CAPI whatever this says, and an operator's live migration is
    /// followed (docs/host-maintenance.md). Still accepted so that manifests setting it
    /// apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['LiveMigrateIfPossible', 'External']").message("evictionStrategy must be LiveMigrateIfPossible or External"))]
    pub eviction_strategy: Option<String>,
}

/// The boot disk of a KaironMachine, in the shape of Kairon's `spec.image`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.imageRef), has(self.path), has(self.httpURL)].filter(x, x).size() == 1").message("image: exactly one of imageRef, path and httpURL must be set"))]
#[x_kube(validation = Rule::new("has(self.httpURL) == has(self.digest)").message("image.digest is required with image.httpURL (Kairon's node cache key) and only with it"))]
pub struct MachineImage {
    /// A cluster-scoped Kairon MachineImage (Kairon's `spec.image.imageRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub image_ref: Option<String>,

    /// An absolute path of a disk file already present on the Kairon node (Kairon's
    /// `spec.image.path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("image.path must be an absolute path"))]
    pub path: Option<String>,

    /// An http(s) URL of a disk image kairon-node downloads (Kairon's
    /// `spec.image.source.httpURL`); needs `digest`.
    #[serde(default, rename = "httpURL", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 8, max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("image.httpURL must be an http:// or https:// URL"))]
    pub http_url: Option<String>,

    /// `sha256:` and 64 lowercase hex digits: the digest of the `httpURL` image (Kairon's
    /// `spec.image.digest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 71))]
    #[x_kube(validation = Rule::new("self.matches('^sha256:[a-f0-9]{64}$')").message("image.digest must be sha256: followed by 64 lowercase hex digits"))]
    pub digest: Option<String>,

    /// Size of the VM's copy of the disk, a quantity greater than zero (Kairon's
    /// `spec.image.diskSize`); the image's own size when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isQuantity(string(self)) && quantity(string(self)).isGreaterThan(quantity('0'))").message("image.diskSize must be a quantity greater than 0"))]
    pub disk_size: Option<Quantity>,
}

impl MachineImage {
    /// A boot disk from a Kairon MachineImage.
    pub fn from_image_ref(name: impl Into<String>, disk_size: Option<&str>) -> Self {
        MachineImage {
            image_ref: Some(name.into()),
            disk_size: disk_size.map(|d| Quantity(d.to_string())),
            ..Default::default()
        }
    }
}

/// CPUs and memory of a KaironMachine, in the shape of Kairon's `spec.resources`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MachineResources {
    /// Number of virtual CPUs, a whole number of at least 1 (Kairon rounds a fraction up).
    #[x_kube(validation = Rule::new("isQuantity(string(self)) && quantity(string(self)).isInteger() && quantity(string(self)).asInteger() >= 1").message("resources.cpu must be a whole number of at least 1"))]
    pub cpu: Quantity,

    /// Memory of the VM, a quantity of at least 512Mi.
    #[x_kube(validation = Rule::new("isQuantity(string(self)) && quantity(string(self)).compareTo(quantity('512Mi')) >= 0").message("resources.memory must be a quantity of at least 512Mi"))]
    pub memory: Quantity,
}

impl MachineResources {
    pub fn new(cpu: i64, memory: &str) -> Self {
        MachineResources {
            cpu: Quantity(cpu.to_string()),
            memory: Quantity(memory.to_string()),
        }
    }
}

/// How the VM's network interface is attached, in the shape of Kairon's `spec.network`
/// (`docs/kairon-api.md`, "Networks"). Only `tap` on a bridge and `macvtap` give VMs a shared
/// network on which peers and a kube-vip address can be reached; `user` is a NAT of each VM's
/// own.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.bridge) || (has(self.mode) && self.mode == 'tap')").message("network.bridge is only used with network.mode tap"))]
#[x_kube(validation = Rule::new("!has(self.bridge) || !has(self.netns) || !self.netns").message("network.bridge is not used with network.netns: true (a netns VM is routed through its own namespace, on no host bridge): set one of them"))]
#[x_kube(validation = Rule::new("!has(self.netns) || !self.netns || (has(self.mode) && self.mode == 'tap')").message("network.netns is only used with network.mode tap"))]
#[x_kube(validation = Rule::new("!has(self.staticNetwork) || !self.staticNetwork || (has(self.mode) && self.mode == 'tap' && has(self.netns) && self.netns)").message("network.staticNetwork needs network.mode tap with network.netns: true"))]
#[x_kube(validation = Rule::new("!has(self.learnIP) || !self.learnIP || (has(self.mode) && self.mode == 'tap')").message("network.learnIP is only used with network.mode tap"))]
#[x_kube(validation = Rule::new("(has(self.mode) && self.mode == 'macvtap') == has(self.parent)").message("network.parent is required with network.mode macvtap and only used with it"))]
#[x_kube(validation = Rule::new("!has(self.macvtapMode) || (has(self.mode) && self.mode == 'macvtap')").message("network.macvtapMode is only used with network.mode macvtap"))]
pub struct MachineNetwork {
    /// `user` (Kairon's default: a NAT of the VM's own, reachable by no other VM; it reports no
    /// address), `tap` (a tap device on `bridge`, or in a network namespace of its own with
    /// `netns`) or `macvtap` (directly on the host NIC `parent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['user', 'tap', 'macvtap']").message("network.mode must be user, tap or macvtap"))]
    pub mode: Option<String>,

    /// tap: the bridge on the Kairon node the tap device joins (the node's default bridge, if
    /// it has one, when absent). VMs on bridges of the same name share one network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15))]
    pub bridge: Option<String>,

    /// tap: a network namespace of the VM's own, with an address Kairon assigns and reports.
    /// Routed, not bridged: no address announced by ARP (a kube-vip VIP) reaches other VMs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<bool>,

    /// tap with netns: the guest gets its netns address from cloud-init rather than DHCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_network: Option<bool>,

    /// The guest NIC's MAC address (six octets, `:` or `-` separated). Kairon makes one for a
    /// netns VM when absent. Not in templates: every VM made from one would share it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$') || self.matches('^[0-9A-Fa-f]{2}(-[0-9A-Fa-f]{2}){5}$')").message("network.mac must be six hex octets separated by : or -, like 52:54:00:12:34:56"))]
    pub mac: Option<String>,

    /// tap: when Kairon knows no address of the guest, report the one FluxVM learns from its
    /// ARP or neighbour advertisements or its DHCP lease. Without it (or netns, or the guest
    /// agent) a bridged VM reports no address.
    #[serde(default, rename = "learnIP", skip_serializing_if = "Option::is_none")]
    pub learn_ip: Option<bool>,

    /// macvtap: the host NIC on the Kairon node the macvtap device sits on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15))]
    pub parent: Option<String>,

    /// macvtap: `bridge`, `vepa`, `private` (VMs on the same parent cannot reach each other)
    /// or `passthru`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['bridge', 'vepa', 'private', 'passthru']").message("network.macvtapMode must be bridge, vepa, private or passthru"))]
    pub macvtap_mode: Option<String>,
}

/// Values of `spec.network.mode`.
pub mod network_mode {
    pub const USER: &str = "user";
    pub const TAP: &str = "tap";
    pub const MACVTAP: &str = "macvtap";
}

/// The VM's guest agent (Kairon's `spec.guestAgent`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct GuestAgent {
    /// kairon-node asks qemu-guest-agent in the guest for its addresses when Kairon knows
    /// none (the image must run it). In user mode it reports the NAT's own address, which
    /// no other VM can reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// Which Kairon nodes may run a KaironMachine's VM.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachinePlacement {
    /// Labels of the Kairon nodes allowed to run the VM (Kairon's
    /// `spec.placement.nodeSelector`). A failure domain of the Machine adds its own node
    /// selector on top.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// How a cluster's control-plane VMs are kept on different Kairon nodes, so that one node
    /// going down takes at most one etcd member: `Preferred` (the default: Kairon's
    /// `preferredAntiAffinity`, so a cluster with more control planes than Kairon nodes still
    /// schedules), `Required` (Kairon's `antiAffinity`: a control plane waits in Pending rather
    /// than share a node) or `None`. Workers are not spread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['Preferred', 'Required', 'None']").message("placement.controlPlaneAntiAffinity must be Preferred, Required or None"))]
    pub control_plane_anti_affinity: Option<String>,
}

/// Values of `spec.placement.controlPlaneAntiAffinity`.
pub mod anti_affinity {
    pub const PREFERRED: &str = "Preferred";
    pub const REQUIRED: &str = "Required";
    pub const NONE: &str = "None";
}

impl KaironMachineSpec {
    /// The node selector the spec gives, if any.
    pub fn node_selector(&self) -> Option<&BTreeMap<String, String>> {
        self.placement.as_ref()?.node_selector.as_ref()
    }

    /// `spec.placement.controlPlaneAntiAffinity`, `Preferred` when absent.
    pub fn control_plane_anti_affinity(&self) -> &str {
        self.placement
            .as_ref()
            .and_then(|p| p.control_plane_anti_affinity.as_deref())
            .unwrap_or(anti_affinity::PREFERRED)
    }
}

/// Observed state of a KaironMachine.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KaironMachineStatus {
    /// Contract field: `provisioned` becomes true once the Kairon Machine runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,

    /// Addresses of the VM, copied by CAPI into the Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 256))]
    pub addresses: Option<Vec<MachineAddress>>,

    /// Failure domain the VM was placed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub failure_domain: Option<String>,

    /// Conditions: Ready, Paused, InstanceProvisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[schemars(length(max = 32))]
    pub conditions: Option<Vec<Condition>>,

    /// The Kairon Machine backing this KaironMachine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<InstanceRef>,

    /// Fields of the v1beta1 contract kept for tools that still read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<DeprecatedStatus>,
}

/// The contract's initialization block.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Initialization {
    /// True once the infrastructure is provisioned; never goes back to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// A machine address as CAPI defines it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MachineAddress {
    /// Hostname, ExternalIP, InternalIP, ExternalDNS or InternalDNS.
    #[serde(rename = "type")]
    #[x_kube(validation = Rule::new("self in ['Hostname', 'ExternalIP', 'InternalIP', 'ExternalDNS', 'InternalDNS']").message("type must be one of Hostname, ExternalIP, InternalIP, ExternalDNS, InternalDNS"))]
    pub type_: String,
    /// The address.
    #[schemars(length(min = 1, max = 256))]
    pub address: String,
}

/// Identity and state of the Kairon Machine a KaironMachine owns.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRef {
    pub name: String,
    pub namespace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The Kairon Machine's phase as Kairon reports it (Running, Paused, Halted, Stopped,
    /// Error, ...), the steps of bringing it up recorded as Provisioning, Terminating once it is
    /// being deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The Kairon host running the VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The identity the VM was created with (the KaironCluster's `spec.identityRef` at the
    /// time); absent for the manager's own Kairon API. Deletion uses it.
    #[serde(default, rename = "identityRef", skip_serializing_if = "Option::is_none")]
    pub identity_ref: Option<super::KaironIdentityReference>,
    /// Which Kairon API holds the VM: a fingerprint of the server, TLS server name and CA the
    /// identity named when the VM was created or found; absent for the manager's own Kairon
    /// API. When the identity names another server and the VM is not found there, the machine
    /// reports `InstanceEndpointChanged` and keeps its last known status: the VM is not taken
    /// as gone, and a deletion waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub endpoint: Option<String>,
}

/// `status.deprecated`, as CAPI's own v1beta2 types carry it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DeprecatedStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v1beta1: Option<V1Beta1Status>,
}

/// Terminal failures in the v1beta1 shape.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct V1Beta1Status {
    /// Machine-readable terminal failure (CAPI's MachineStatusError vocabulary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// Human-readable terminal failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
}

impl KaironMachineStatus {
    /// Whether initialization completed (contract: never flips back).
    pub fn is_provisioned(&self) -> bool {
        self.initialization
            .as_ref()
            .and_then(|i| i.provisioned)
            .unwrap_or(false)
    }

    /// Records a terminal failure in the v1beta1 fields. The first one sticks: it is what
    /// made the machine unusable.
    pub fn set_failure(&mut self, reason: &str, message: &str) {
        let v1beta1 = self
            .deprecated
            .get_or_insert_with(Default::default)
            .v1beta1
            .get_or_insert_with(Default::default);
        if v1beta1.failure_reason.is_none() {
            v1beta1.failure_reason = Some(reason.to_string());
            v1beta1.failure_message = Some(message.to_string());
        }
    }

    /// The v1beta1 failure reason, if a terminal failure was recorded.
    pub fn failure_reason(&self) -> Option<&str> {
        self.deprecated.as_ref()?.v1beta1.as_ref()?.failure_reason.as_deref()
    }
}
