//! Which KaironMachine stands for a VM of a pool ("MachinePool Machines"). Pure: no I/O.
//!
//! CAPI lists a pool's infrastructure machines by the labels `cluster.x-k8s.io/cluster-name`
//! and `cluster.x-k8s.io/pool-name` (the MachinePool's name through `MustFormatValue`), makes
//! a Machine of the same name for each, and its Machine controller then becomes the
//! KaironMachine's controller owner. Until then a plain owner reference to the pool keeps the
//! KaironMachine from being an orphan (CAPD does the same).
//!
//! The KaironMachine carries `spec.providerID` naming its VM from creation (`kairon://<VM
//! name>`, what the guest, started with its name as hostname and instance-id, gives kubelet),
//! so the KaironMachine controller never makes a VM for it: it only follows the one Kairon's
//! MachineSet made, and releases and deletes it (behind its finalizer) when CAPI deletes the
//! Machine.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use crate::api::{KaironMachine, KaironMachinePool};
use crate::capi::{CLUSTER_NAME_LABEL, POOL_NAME_LABEL, format_label_value};
use crate::kairon::labels::KAIRONMACHINEPOOL_NAME;
use crate::kairon::set_desired::label_value;
use crate::kairon::{Machine, provider_id};

/// The KaironMachine for member `vm` of `pool`'s set, the pool belonging to MachinePool
/// `machine_pool` of cluster `cluster`. `None` for a VM Kairon has not given a UID (not
/// created yet): its providerID is not known.
pub fn kaironmachine_for_member(
    pool: &KaironMachinePool,
    machine_pool: &str,
    cluster: &str,
    vm: &Machine,
) -> Option<KaironMachine> {
    vm.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    let labels = [
        (CLUSTER_NAME_LABEL.to_string(), cluster.to_string()),
        (POOL_NAME_LABEL.to_string(), format_label_value(machine_pool)),
        (KAIRONMACHINEPOOL_NAME.to_string(), label_value(&pool.name_any())),
    ]
    .into();
    let owner = OwnerReference {
        api_version: KaironMachinePool::api_version(&()).into_owned(),
        kind: KaironMachinePool::kind(&()).into_owned(),
        name: pool.name_any(),
        uid: pool.uid().unwrap_or_default(),
        controller: None,
        block_owner_deletion: None,
    };
    let mut spec = pool.spec.template.clone();
    spec.provider_id = Some(provider_id(&vm.name_any()));
    Some(KaironMachine {
        metadata: ObjectMeta {
            name: Some(vm.name_any()),
            namespace: pool.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec,
        status: None,
    })
}

/// Whether an existing KaironMachine of that name is the one for `vm` (a create that found the
/// name taken): it must name that VM (by name, or by uid as the old model did).
pub fn stands_for(km: &KaironMachine, vm: &Machine) -> bool {
    km.spec
        .provider_id
        .as_deref()
        .is_some_and(|pid| crate::kairon::names_instance(pid, vm))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{KaironMachinePoolSpec, KaironMachineSpec, MachineImage, MachineResources};

    fn pool() -> KaironMachinePool {
        let mut p = KaironMachinePool::new(
            "demo-mp-0",
            KaironMachinePoolSpec {
                template: KaironMachineSpec {
                    resources: Some(MachineResources::new(2, "4Gi")),
                    image: MachineImage::from_image_ref("img", Some("20Gi")),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some("pool-uid".into());
        p
    }

    fn member(name: &str, uid: Option<&str>) -> Machine {
        let mut vm = Machine::new(name, Default::default());
        vm.metadata.namespace = Some("ns".into());
        vm.metadata.uid = uid.map(Into::into);
        vm
    }

    #[test]
    fn a_members_kaironmachine_is_found_by_capi_and_names_its_vm_from_creation() {
        let km = kaironmachine_for_member(&pool(), "demo-mp-0", "demo", &member("demo-mp-0-x7k2q", Some("vm-uid")))
            .expect("a KaironMachine");
        assert_eq!(km.metadata.name.as_deref(), Some("demo-mp-0-x7k2q"), "the VM's name");
        assert_eq!(km.metadata.namespace.as_deref(), Some("ns"));
        let l = km.metadata.labels.as_ref().expect("labels");
        assert_eq!(l.get(CLUSTER_NAME_LABEL).map(String::as_str), Some("demo"));
        assert_eq!(l.get(POOL_NAME_LABEL).map(String::as_str), Some("demo-mp-0"));
        assert_eq!(l.get(KAIRONMACHINEPOOL_NAME).map(String::as_str), Some("demo-mp-0"));
        assert_eq!(
            km.spec.provider_id.as_deref(),
            Some("kairon://demo-mp-0-x7k2q"),
            "what the guest, named so, gives kubelet"
        );
        assert_eq!(km.spec.image.image_ref.as_deref(), Some("img"));
        let owners = km.metadata.owner_references.as_ref().expect("owner");
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].kind, "KaironMachinePool");
        assert_eq!(owners[0].uid, "pool-uid");
        assert_eq!(owners[0].controller, None, "the Machine becomes its controller");
        assert!(stands_for(&km, &member("demo-mp-0-x7k2q", Some("vm-uid"))));
        assert!(!stands_for(&km, &member("demo-mp-0-other", Some("vm-uid"))));
        let mut old_model = km.clone();
        old_model.spec.provider_id = Some("kairon://vm-uid".into());
        assert!(stands_for(&old_model, &member("demo-mp-0-x7k2q", Some("vm-uid"))));
        assert!(!stands_for(&old_model, &member("demo-mp-0-x7k2q", Some("another-vm"))));
    }

    #[test]
    fn a_long_machinepool_name_is_labelled_as_capi_looks_it_up() {
        let long = "machineSetName".repeat(12);
        let km = kaironmachine_for_member(&pool(), &long, "demo", &member("m", Some("u"))).expect("km");
        let l = km.metadata.labels.expect("labels");
        assert_eq!(l.get(POOL_NAME_LABEL).map(String::as_str), Some("hash_FR_ghQ_z"));
    }

    #[test]
    fn a_vm_without_a_uid_gets_no_kaironmachine_yet() {
        assert!(kaironmachine_for_member(&pool(), "mp", "demo", &member("m", None)).is_none());
        assert!(kaironmachine_for_member(&pool(), "mp", "demo", &member("m", Some(""))).is_none());
    }
}
