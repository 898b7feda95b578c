//! Everything the provider assumes about Kairon's API (group `kairon.zyvor.dev`, kind
//! `Machine` and its companions) lives in this module, so that following Kairon's real schema is
//! a change in one place.
//!
//! - [`served`]: which version of each Kairon kind a Kairon API serves (`v1`, `v1beta1`,
//!   `v1alpha1`), the one spoken, and the fields its Machine schema has;
//! - [`Machine`]: our model of a Kairon Machine (also the source of the development CRD);
//! - [`Vm`]: what the provider reads of one, from a cache, a read or a create's answer;
//! - [`desired`]: which Kairon Machine should exist for a KaironMachine (pure);
//! - [`observe`]: what a Kairon Machine's status means for the KaironMachine (pure);
//! - [`client`]: how Kairon is spoken to — the only place that reads, creates, relabels and
//!   deletes Kairon Machines; `gate`: whether a tenant's Kairon API answers its writes;
//! - [`network`]: what Kairon's network modes mean for a cluster (pure);
//! - [`maintenance`]: Kairon's hosts and migrations, which the provider sees only through a
//!   Machine's status (its host, the host's labels, an evacuation request), read by
//!   [`evacuation`] (pure).

pub mod bootstrap_runtime;
pub mod budget;
mod budget_client;
mod client;
pub mod cloud_init;
pub mod desired;
pub mod evacuation;
mod fingerprint;
#[cfg(test)]
pub(crate) mod fixtures;
mod gate;
pub mod machine_image;
pub mod maintenance;
pub mod network;
pub mod nodes;
pub mod observe;
pub mod ownership;
pub mod served;
pub(crate) mod types;
pub mod vm;

pub use budget_client::{BudgetError, Budgets};
pub(crate) use client::read_event;
pub use client::{Created, Deletion, Instances, KaironError, Owner, read};
pub(crate) use desired::kaironmachine_for_instance;
pub use desired::{desired_kairon_machine, provider_id, uid_provider_id};
pub(crate) use desired::{is_the_instance, names_instance};
pub(crate) use fingerprint::endpoint_fingerprint;
pub(crate) use observe::{Holder, Ownership, ownership};
pub use types::{
    CloudInit, CloudInitFile, GuestAgent, Image, ImageSource, Machine, MachineSpec, MachineStatus, Network, Placement,
    Resources, Term, UserData, WeightedTerm, phase, power_state,
};
pub use vm::{Attachment, Vm};

/// Reads a Kairon Machine as the API server sent it, leniently: whatever Kairon's schema has
/// beyond our model is ignored, its conditions but those shown (see
/// [`conditions_shown`]) and its bootstrap data (`cloudInit`,
/// `legacyUserData`: never read back, never held in memory) are dropped before parsing, missing
/// spec fields take their defaults, and an object that still cannot be read becomes a Machine
/// with its metadata in phase [`phase::UNREADABLE`], `status.message` saying why — so that one odd object affects its
/// own KaironMachine alone, never a whole list (a typed list fails whole).
pub fn machine_from_value(mut value: serde_json::Value) -> Machine {
    if let Some(status) = value.get_mut("status").and_then(serde_json::Value::as_object_mut) {
        match status.remove("conditions").and_then(conditions_shown) {
            Some(kept) => status.insert("conditions".into(), kept),
            None => None,
        };
    }
    if let Some(spec) = value.get_mut("spec").and_then(serde_json::Value::as_object_mut) {
        spec.remove("cloudInit");
        spec.remove("legacyUserData");
    }
    let first = match serde_json::from_value::<Machine>(value.clone()) {
        Ok(m) => return m,
        Err(e) => e,
    };
    if let Ok(serde_json::Value::Object(mut spec)) = serde_json::to_value(MachineSpec::default())
        && let Some(obj) = value.as_object_mut()
    {
        if let Some(serde_json::Value::Object(given)) = obj.get("spec") {
            spec.extend(given.clone());
        }
        obj.insert("spec".into(), serde_json::Value::Object(spec));
        if let Ok(m) = serde_json::from_value::<Machine>(value.clone()) {
            return m;
        }
    }
    let metadata = value
        .get("metadata")
        .cloned()
        .and_then(|m| serde_json::from_value(m).ok())
        .unwrap_or_default();
    Machine {
        metadata,
        spec: MachineSpec::default(),
        status: Some(MachineStatus {
            phase: Some(phase::UNREADABLE.into()),
            message: Some(crate::text::bounded(&first.to_string(), 256)),
            ..Default::default()
        }),
    }
}

/// Of Kairon's conditions, those the provider shows, each only when True of what it says:
/// `Scheduled=False` (kairon-controller could not place the Machine: `Unschedulable`,
/// `QuotaBlocked`, `CPUPinningFailed`; Kairon only ever writes it False), `NodeUnreachable=True`
/// (its node is not Ready or gone, `internal/controller/fencing.go`) and `Fenced=True` (an
/// operator fenced it off that node, `kaironctl fence`). Each keeps its reason and message
/// bounded and cleaned, as a condition every field of which is set (Kairon's may lack reason
/// and message, and a tenant's Kairon API may send anything). The others are dropped: nothing
/// reads them, and a cache of thousands of VMs would carry them all.
fn conditions_shown(conditions: serde_json::Value) -> Option<serde_json::Value> {
    let kept: Vec<serde_json::Value> = [
        (KAIRON_SCHEDULED, "False"),
        (KAIRON_NODE_UNREACHABLE, "True"),
        (KAIRON_FENCED, "True"),
    ]
    .into_iter()
    .filter_map(|(type_, status)| {
        let c = conditions
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_ && c["status"] == status)?;
        let text = |key: &str, max: usize| crate::text::bounded(c[key].as_str().unwrap_or_default(), max);
        let since = c["lastTransitionTime"]
            .as_str()
            .filter(|t| t.parse::<k8s_openapi::jiff::Timestamp>().is_ok())
            .unwrap_or("1970-01-01T00:00:00Z");
        Some(serde_json::json!({
            "type": type_,
            "status": status,
            "reason": text("reason", 64),
            "message": text("message", 512),
            "lastTransitionTime": since,
        }))
    })
    .collect();
    (!kept.is_empty()).then_some(serde_json::Value::Array(kept))
}

/// kairon-controller's condition on a Machine it could not place.
pub(crate) const KAIRON_SCHEDULED: &str = "Scheduled";
/// kairon-controller's condition on a Machine whose node is not Ready or gone; the phase stays.
pub(crate) const KAIRON_NODE_UNREACHABLE: &str = "NodeUnreachable";
/// `kaironctl fence`'s condition: an operator attested the node gone; Kairon places it anew.
pub(crate) const KAIRON_FENCED: &str = "Fenced";

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use serde_json::json;

    /// A cached VM reads as the VM itself for everything the provider decides from it.
    #[test]
    fn a_cached_kairon_machine_keeps_what_is_read() {
        let mut vm = fixtures::vm(Some(phase::RUNNING));
        vm.spec = MachineSpec {
            resources: Some(Resources {
                cpu: Some("2".into()),
                memory: Some("4Gi".into()),
            }),
            image: Some(Image {
                image_ref: Some("img".into()),
                ..Default::default()
            }),
            cloud_init: Some(CloudInit {
                run_cmd: vec!["kubeadm join SECRET".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        vm.metadata.labels = Some(
            [
                (labels::KAIRONMACHINE_NAME, "km1"),
                (labels::KAIRONMACHINE_NAMESPACE, "ns"),
                (labels::KAIRONMACHINE_UID, "km-uid"),
                (labels::MANAGEMENT_CLUSTER, "mgmt"),
                (labels::CLUSTER_NAME, "c1"),
                (labels::MANAGED_BY, labels::MANAGED_BY_VALUE),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        );
        vm.metadata
            .annotations
            .get_or_insert_default()
            .insert("kairon.zyvor.dev/scheduled-at".into(), "t".into());
        vm.metadata.finalizers = Some(vec!["kairon.zyvor.dev/machine".into()]);
        // Host maintenance is read from the VM as it is before its deletion: its node.
        let cached = Vm::cached(vm.clone());
        assert_eq!(evacuation::host(&cached), evacuation::host(&Vm::from(vm.clone())));
        assert!(evacuation::host(&cached).is_some());
        // Also as the watch reads it (which drops status.conditions).
        let read = machine_from_value(serde_json::to_value(&vm).expect("json"));
        assert_eq!(
            evacuation::host(&Vm::from(read.clone())),
            evacuation::host(&Vm::from(vm.clone()))
        );
        vm.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let cached = Vm::cached(vm.clone());

        let mut km = crate::api::KaironMachine::new("km1", Default::default());
        km.metadata.uid = Some("km-uid".into());
        let owner = Owner {
            id: "mgmt".into(),
            adopt_from: vec![],
        };
        assert_eq!(
            ownership(&cached, &km, &owner),
            ownership(&Vm::from(vm.clone()), &km, &owner)
        );
        assert_eq!(ownership(&cached, &km, &owner), Ownership::Ours);
        km.metadata.uid = Some("a-new-incarnation".into());
        km.spec.provider_id = Some("kairon://vm-uid".into());
        assert_eq!(
            ownership(&cached, &km, &owner),
            ownership(&Vm::from(vm.clone()), &km, &owner)
        );
        assert!(matches!(
            ownership(&cached, &km, &owner),
            Ownership::OursBeforeMove { holder: Some(_) }
        ));
        assert_eq!(observe::holder(&cached), observe::holder(&Vm::from(vm.clone())));
        assert_eq!(
            observe::effective_phase(&cached),
            observe::effective_phase(&Vm::from(vm.clone()))
        );
        assert_eq!(observe::addresses(&cached), observe::addresses(&Vm::from(vm.clone())));
        assert_eq!(observe::failure_domain(&cached).as_deref(), Some("zone-a"));
        assert_eq!(
            observe::instance_ref(&cached),
            observe::instance_ref(&Vm::from(vm.clone()))
        );
        assert_eq!(
            observe::status_phase(&cached),
            observe::status_phase(&Vm::from(vm.clone()))
        );
        for label in [
            labels::KAIRONMACHINE_NAME,
            labels::KAIRONMACHINE_NAMESPACE,
            labels::KAIRONMACHINE_UID,
            labels::MANAGEMENT_CLUSTER,
        ] {
            assert_eq!(
                cached.label(label),
                vm.labels().get(label).map(String::as_str),
                "{label}"
            );
        }
        assert!(cached.metadata.labels.is_none() && cached.metadata.annotations.is_none());
        assert_eq!(
            cached.attachment,
            Attachment::default(),
            "what the spec says of the address"
        );
        assert!(cached.metadata.finalizers.is_none());
        // Nothing of the bootstrap data is held.
        assert!(!format!("{cached:?}").contains("SECRET"));
    }

    #[test]
    fn odd_kairon_machines_are_read_each_on_its_own() {
        let base = json!({"apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "Machine",
            "metadata": {"name": "m1", "namespace": "ns", "uid": "u1"},
            "spec": {"resources": {"cpu": "2", "memory": "4Gi"}, "image": {"imageRef": "img", "diskSize": "20Gi"},
                     "cloudInit": {"runCmd": ["kubeadm join --token SECRET"]}, "legacyUserData": "#cloud-config SECRET"},
            "status": {"phase": "Running", "guestIP": "10.0.0.1", "guestIPs": ["10.0.0.1"]}});
        let m = machine_from_value(base.clone());
        assert_eq!(m.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
        assert_eq!(m.status.as_ref().unwrap().guest_ip.as_deref(), Some("10.0.0.1"));
        assert!(m.spec.cloud_init.is_none(), "bootstrap data is never held");
        assert!(!format!("{m:?}").contains("SECRET"), "bootstrap data is never held");

        let mut extra = base.clone();
        extra["spec"]["gpu"] = json!({"model": "x"});
        extra["status"]["conditions"] = json!([{"type": "Booted", "status": "True"}]);
        extra["status"]["phase"] = json!("Hibernating");
        let m = machine_from_value(extra);
        assert_eq!(
            m.status.as_ref().unwrap().phase.as_deref(),
            Some("Hibernating"),
            "added fields and a condition without message are fine"
        );
        assert_eq!(m.status.as_ref().unwrap().phase.as_deref(), Some("Hibernating"));

        let mut missing = base.clone();
        missing["spec"].as_object_mut().unwrap().remove("image");
        let m = machine_from_value(missing);
        assert_eq!(
            m.status.as_ref().unwrap().phase.as_deref(),
            Some("Running"),
            "a missing spec field takes its default"
        );

        let mut wrong = base.clone();
        wrong["status"]["guestIPs"] = json!("two");
        wrong["spec"]["cloudInit"] = json!({"runCmd": "kubeadm join SECRET"});
        let m = machine_from_value(wrong);
        assert_eq!(m.metadata.uid.as_deref(), Some("u1"), "metadata is kept");
        assert_eq!(m.status.as_ref().unwrap().phase.as_deref(), Some(phase::UNREADABLE));
        let why = m.status.as_ref().unwrap().message.clone().expect("why");
        assert!(why.contains("two"), "{why}");
        assert!(!why.contains("SECRET"), "{why}");
    }
}

/// Scheme of provider IDs: `kairon://<name of the Kairon Machine>` ([`provider_id`]). The guest
/// sees the name as its NoCloud `instance-id`, so kubelet can be given the same provider ID.
pub(crate) const PROVIDER_ID_PREFIX: &str = "kairon://";

/// Links back from a Kairon Machine to the KaironMachine that created it. Labels, because
/// Kairon's controller can drop ownerReferences when it writes a Machine back.
pub mod labels {
    pub(crate) const KAIRONMACHINE_NAME: &str = "infrastructure.cluster.x-k8s.io/kaironmachine-name";
    pub(crate) const KAIRONMACHINE_NAMESPACE: &str = "infrastructure.cluster.x-k8s.io/kaironmachine-namespace";
    /// The adoption key: only a Kairon Machine carrying our UID is ours.
    pub const KAIRONMACHINE_UID: &str = "infrastructure.cluster.x-k8s.io/kaironmachine-uid";
    pub const CLUSTER_NAME: &str = crate::capi::CLUSTER_NAME_LABEL;
    /// On a control-plane VM (empty value), as on its CAPI Machine: what the control planes'
    /// anti-affinity selects.
    pub const CONTROL_PLANE: &str = crate::capi::CONTROL_PLANE_LABEL;
    /// On a control-plane VM, [`ROLE_CONTROL_PLANE`]: what the control plane's disruption budget
    /// selects. Kairon matches a selector entry `key: ""` on any Machine that lacks the key, so
    /// [`CONTROL_PLANE`] (empty value) cannot tell control planes from workers there.
    pub const ROLE: &str = "infrastructure.cluster.x-k8s.io/kairon-role";
    pub const ROLE_CONTROL_PLANE: &str = "control-plane";
    /// The management cluster whose manager created or adopted the Kairon Machine
    /// ([`super::Owner`]).
    pub const MANAGEMENT_CLUSTER: &str = "infrastructure.cluster.x-k8s.io/kairon-management-cluster";
    pub(crate) const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub(crate) const MANAGED_BY_VALUE: &str = "cluster-api-provider-kairon";

    /// On a pool member's KaironMachine: the KaironMachinePool that made it.
    pub const KAIRONMACHINEPOOL_NAME: &str = "infrastructure.cluster.x-k8s.io/kaironmachinepool-name";
    /// Kairon's own label on each Machine its MachineSet controller makes: the set's name.
    pub const KAIRON_MACHINESET: &str = "kairon.zyvor.dev/machineset";

    /// The label selector of every Kairon Machine this provider manages.
    pub(crate) fn managed_selector() -> String {
        format!("{MANAGED_BY}={MANAGED_BY_VALUE}")
    }
}

/// Annotation recording the failure domain a Kairon Machine was placed in, so placement can be
/// reported again after status is lost (status is never moved by `clusterctl move`).
pub(crate) const FAILURE_DOMAIN_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/failure-domain";
