//! What the provider refuses to take on trust, against the real CAPI controllers: a bootstrap
//! Secret that is not the Machine's bootstrap data (the cluster's own kubeconfig, a Secret its
//! bootstrap config did not make), an owner Machine that does not name the KaironMachine, a
//! Kairon Machine replaced under the same name (new UID) after provisioning, and a
//! `spec.providerID` naming a VM that is not ours to adopt.

use std::time::Duration;

use crate::common::{Rig, RigOptions, km_instance, km_ready, km_spec};
use capkr::api::conditions::reason;
use capkr::api::{KaironMachine, KaironMachineSpec};
use capkr::kairon;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const UP: Duration = Duration::from_secs(180);

/// Creates a Machine `name` of the rig's cluster with `bootstrap`, pointing at KaironMachine
/// `infra`; returns its UID.
async fn create_machine(rig: &Rig, name: &str, bootstrap: Value, infra: &str) -> String {
    let m: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": name, "namespace": rig.ns, "labels": {"cluster.x-k8s.io/cluster-name": rig.cluster}},
        "spec": {"clusterName": rig.cluster, "version": capkr_testenv::KUBERNETES_VERSION, "bootstrap": bootstrap,
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironMachine", "name": infra}}
    }))
    .unwrap();
    let m = rig.machines().create(&PostParams::default(), &m).await.unwrap();
    m.uid().unwrap()
}

/// Creates KaironMachine `name` owned by Machine `owner` (UID `uid`), as CAPI would set it.
async fn create_km(rig: &Rig, name: &str, owner: &str, uid: &str) {
    create_km_with_provider_id(rig, name, owner, uid, None).await
}

async fn create_km_with_provider_id(rig: &Rig, name: &str, owner: &str, uid: &str, provider_id: Option<String>) {
    let mut km = KaironMachine::new(
        name,
        KaironMachineSpec {
            provider_id,
            ..km_spec()
        },
    );
    km.metadata.labels = Some([("cluster.x-k8s.io/cluster-name".to_string(), rig.cluster.clone())].into());
    km.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Machine".into(),
        name: owner.into(),
        uid: uid.into(),
        ..Default::default()
    }]);
    rig.kms().create(&PostParams::default(), &km).await.unwrap();
}

async fn create_secret(rig: &Rig, name: &str, value: &str) {
    let secrets: kube::Api<Secret> = kube::Api::namespaced(rig.env.client(), &rig.ns);
    let mut s = Secret::default();
    s.metadata.name = Some(name.into());
    s.string_data = Some([("value".to_string(), value.to_string())].into());
    secrets.create(&PostParams::default(), &s).await.unwrap();
}

/// Without these checks each of the three got a VM (the first with the cluster's admin
/// kubeconfig as its user-data, readable by anyone who may read Kairon Machines) and reported
/// Ready.
#[tokio::test(flavor = "multi_thread")]
async fn secrets_and_owners_that_do_not_belong_to_the_machine_get_no_vm() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        ..RigOptions::new("trust_bootstrap")
    })
    .await;
    rig.wait_running(2, UP).await;
    let kubeconfig = format!("{}-kubeconfig", rig.cluster);
    let secrets: kube::Api<Secret> = kube::Api::namespaced(rig.env.client(), &rig.ns);
    let admin = secrets
        .get(&kubeconfig)
        .await
        .expect("CAPI wrote the cluster's kubeconfig");
    assert!(
        admin
            .owner_references()
            .iter()
            .any(|o| o.kind == "Cluster" && o.name == rig.cluster),
        "the kubeconfig belongs to the Cluster: {:?}",
        admin.owner_references()
    );

    // 1. Data given directly (no bootstrap config): the cluster's kubeconfig.
    let uid = create_machine(
        &rig,
        "steal-kubeconfig",
        json!({"dataSecretName": kubeconfig}),
        "steal-kubeconfig",
    )
    .await;
    create_km(&rig, "steal-kubeconfig", "steal-kubeconfig", &uid).await;

    // 2. A bootstrap config is named, but the Secret is not one it made.
    let marker = "UNTRUSTED-MARKER-51c2";
    create_secret(&rig, "planted", &format!("#cloud-config\n# {marker}\n")).await;
    let bootstrap = json!({"dataSecretName": "planted",
        "configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "planted-config"}});
    let uid = create_machine(&rig, "foreign-config", bootstrap, "foreign-config").await;
    create_km(&rig, "foreign-config", "foreign-config", &uid).await;

    // 3. Good data, but the owner Machine names another KaironMachine.
    create_secret(&rig, "decoy-data", "#cloud-config\n").await;
    let uid = create_machine(&rig, "decoy", json!({"dataSecretName": "decoy-data"}), "not-the-victim").await;
    create_km(&rig, "victim", "decoy", &uid).await;

    let cases = [
        (
            "steal-kubeconfig",
            reason::BOOTSTRAP_DATA_SECRET_NOT_TRUSTED,
            kubeconfig.as_str(),
        ),
        (
            "foreign-config",
            reason::BOOTSTRAP_DATA_SECRET_NOT_TRUSTED,
            "KubeadmConfig planted-config",
        ),
        (
            "victim",
            reason::OWNER_MACHINE_MISMATCH,
            "Machine decoy does not reference KaironMachine victim",
        ),
    ];
    for (name, want, in_message) in cases {
        let (_, message) = rig
            .wait(&format!("{name}: InstanceProvisioned {want}"), UP, || async {
                let km = rig.kms().get(name).await?;
                Ok::<_, kube::Error>(km_instance(&km).filter(|(r, _)| r == want))
            })
            .await;
        assert!(message.contains(in_message), "{name}: the message says why: {message}");
    }
    // Give the manager time to do anything more it would do, then look: no VM, no finalizer on
    // the KaironMachine whose owner does not name it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let vms = rig.vm_map().await;
    for (name, _, _) in cases {
        assert!(!vms.contains_key(name), "{name}: no Kairon Machine created");
    }
    let victim = rig.kms().get("victim").await.unwrap();
    assert!(
        victim.finalizers().is_empty(),
        "nothing written to a KaironMachine we do not own"
    );
    for vm in vms.values() {
        let user_data = serde_json::to_string(&vm.spec.cloud_init).unwrap();
        assert!(
            !user_data.contains("client-key-data"),
            "no kubeconfig in any VM's user-data"
        );
        assert!(!user_data.contains(marker));
    }
    assert!(rig.manager.is_running());
}

/// The worker's KaironMachine of a rig of one control plane and one worker, both running.
async fn worker_kaironmachine(rig: &Rig) -> KaironMachine {
    rig.wait_running(2, UP).await;
    rig.kms()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|k| k.name_any().contains("md-0"))
        .expect("the worker's KaironMachine")
}

/// `old` created again as a restore from a backup makes it: same name, labels and
/// annotations, a new UID (returned), no status.
async fn restore(rig: &Rig, old: &kairon::Machine) -> String {
    let mut restored = old.clone();
    restored.metadata = kube::api::ObjectMeta {
        name: old.metadata.name.clone(),
        namespace: old.metadata.namespace.clone(),
        labels: old.metadata.labels.clone(),
        annotations: old.metadata.annotations.clone(),
        ..Default::default()
    };
    restored.status = None;
    let created = rig.vms().create(&PostParams::default(), &restored).await.unwrap();
    created.uid().unwrap()
}

/// An annotation change, so that the KaironMachine is reconciled now.
async fn poke(rig: &Rig, name: &str) {
    rig.kms()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"test.kairon/poke": "1"}}})),
        )
        .await
        .unwrap();
}

/// A Kairon Machine replaced under our name (a restore: same name and labels, new UID) is not
/// the VM our providerID names. Without the check the KaironMachine reported the newcomer's
/// UID and addresses as its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_replaced_under_the_same_name_is_not_reported_as_ours() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        ..RigOptions::new("trust_replaced")
    })
    .await;
    let km = worker_kaironmachine(&rig).await;
    let name = km.name_any();
    let old = rig.vms().get(&name).await.unwrap();
    let old_uid = old.uid().unwrap();
    assert_eq!(
        km.spec.provider_id.as_deref(),
        Some(format!("kairon://{name}").as_str())
    );
    let recorded = km
        .status
        .as_ref()
        .and_then(|s| s.instance.as_ref())
        .and_then(|i| i.uid.clone());
    assert_eq!(
        recorded.as_deref(),
        Some(old_uid.as_str()),
        "the instance's uid is recorded"
    );

    // Paused, the manager does not look while the VM is swapped.
    rig.set_paused(true).await;
    rig.vms().delete(&name, &Default::default()).await.unwrap();
    rig.wait("the old Kairon Machine gone", UP, || async {
        Ok::<_, kube::Error>(rig.vms().get_opt(&name).await?.is_none())
    })
    .await;
    let new_uid = restore(&rig, &old).await;
    let new_addresses = rig
        .wait("the restored Kairon Machine running", UP, || async {
            let vm = rig.vms().get(&name).await?;
            let status = vm.status.unwrap_or_default();
            Ok::<_, kube::Error>(
                (status.phase.as_deref() == Some("Running"))
                    .then(|| status.guest_ips.unwrap_or_default())
                    .filter(|a| !a.is_empty()),
            )
        })
        .await;
    rig.set_paused(false).await;
    // Reconciled now rather than at the next resync.
    poke(&rig, &name).await;

    let km = rig
        .wait("the KaironMachine reports its instance gone", UP, || async {
            let km = rig.kms().get(&name).await?;
            let status = km.status.clone().unwrap_or_default();
            let about_newcomer = status.instance.as_ref().and_then(|i| i.uid.clone()) == Some(new_uid.clone());
            if about_newcomer {
                rig.fail(format!(
                    "the KaironMachine reports the replacement VM as its own: {status:?}"
                ));
            }
            Ok::<_, kube::Error>(
                (km_instance(&km).map(|c| c.0).as_deref() == Some(reason::INSTANCE_NOT_FOUND)).then_some(km),
            )
        })
        .await;
    let status = km.status.unwrap();
    let reported: Vec<String> = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .map(|a| a.address)
        .collect();
    for a in new_addresses {
        if !old
            .status
            .as_ref()
            .and_then(|s| s.guest_ips.as_ref())
            .is_some_and(|o| o.contains(&a))
        {
            assert!(!reported.contains(&a), "the replacement's address {a} is not reported");
        }
    }
    assert_eq!(
        km.spec.provider_id,
        Some(format!("kairon://{name}")),
        "providerID is write-once"
    );
    assert!(rig.manager.is_running());
}

/// The same restore after the KaironMachine saw its VM gone (not paused: `InstanceNotFound`
/// first, the newcomer after). The status then forgot which VM was ours (`status.instance`
/// cleared), and the newcomer, named by our providerID and labelled as ours, was taken for it:
/// Ready again with its addresses.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_restored_after_ours_was_seen_gone_is_not_taken_for_it() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        ..RigOptions::new("trust_restored")
    })
    .await;
    let km = worker_kaironmachine(&rig).await;
    let name = km.name_any();
    let old = rig.vms().get(&name).await.unwrap();
    rig.vms().delete(&name, &Default::default()).await.unwrap();
    rig.wait("the KaironMachine reports its VM gone", UP, || async {
        let km = rig.kms().get(&name).await?;
        Ok::<_, kube::Error>(km_instance(&km).is_some_and(|c| c.0 == reason::INSTANCE_NOT_FOUND))
    })
    .await;
    let new_uid = restore(&rig, &old).await;
    rig.wait("the restored Kairon Machine running", UP, || async {
        let vm = rig.vms().get(&name).await?;
        Ok::<_, kube::Error>(vm.status.and_then(|s| s.phase).as_deref() == Some("Running"))
    })
    .await;
    // Reconciled now (and then again at the manager's own pace): it must stay not found.
    poke(&rig, &name).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let km = rig.kms().get(&name).await.unwrap();
        let status = km.status.clone().unwrap_or_default();
        let instance = status.instance.as_ref();
        assert_ne!(
            instance.and_then(|i| i.uid.clone()),
            Some(new_uid.clone()),
            "the newcomer is reported as ours: {status:?}"
        );
        assert_eq!(
            instance.and_then(|i| i.uid.clone()),
            old.uid(),
            "the gone VM stays recorded by its uid: {status:?}"
        );
        assert_eq!(
            km_instance(&km).map(|c| c.0).as_deref(),
            Some(reason::INSTANCE_NOT_FOUND),
            "{status:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(rig.manager.is_running());
}

/// Adoption by providerID: `spec.providerID` is settable by whoever creates a KaironMachine, so
/// it names a VM to adopt only when that VM was made by this management cluster (or one it
/// adopts from) and the KaironMachine the VM's labels name is gone. Without these checks the
/// VMs below were relabelled to the newcomer, which then reported Ready and would have deleted
/// them with its Machine (the plain VM, without a management-cluster label, until the label
/// was required).
#[tokio::test(flavor = "multi_thread")]
async fn a_provider_id_alone_does_not_take_another_installations_or_a_live_machines_vm() {
    let rig = Rig::start(RigOptions {
        workers: 0,
        ..RigOptions::new("trust_adoption")
    })
    .await;
    rig.wait_running(1, UP).await;
    let ours = rig.vms().list(&Default::default()).await.unwrap().items;
    assert_eq!(ours.len(), 1, "the control plane's VM");
    let template = ours[0].clone();
    let kube_system = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(rig.env.client())
        .get("kube-system")
        .await
        .unwrap();
    let label = |vm: &capkr::kairon::Machine, k: &str| vm.labels().get(k).cloned();
    assert_eq!(
        label(&template, capkr::kairon::labels::MANAGEMENT_CLUSTER),
        kube_system.uid(),
        "every VM names its management cluster (by default the UID of kube-system)"
    );
    create_secret(&rig, "plain-data", "#cloud-config\n").await;

    // Planted VMs: one made by another installation sharing this Kairon API, one that the
    // live control-plane KaironMachine's labels claim (a second management cluster with the
    // same identity, or a copy of the object).
    let plant = |name: &str, labels: Vec<(&str, String)>| {
        let mut vm = template.clone();
        vm.metadata = kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: template.metadata.namespace.clone(),
            labels: Some(
                template
                    .labels()
                    .clone()
                    .into_iter()
                    .chain(labels.into_iter().map(|(k, v)| (k.to_string(), v)))
                    .collect(),
            ),
            ..Default::default()
        };
        vm.status = None;
        vm
    };
    let foreign = plant(
        "foreign-vm",
        vec![
            (capkr::kairon::labels::MANAGEMENT_CLUSTER, "another-installation".into()),
            (
                capkr::kairon::labels::KAIRONMACHINE_UID,
                "uid-of-a-machine-elsewhere".into(),
            ),
            (
                "infrastructure.cluster.x-k8s.io/kaironmachine-name",
                "foreign-vm".into(),
            ),
        ],
    );
    let claimed = plant("claimed-vm", vec![]);
    // And a plain Kairon VM, which no installation of the provider made.
    let plain = planted_vm(&rig, "plain-vm", vec![]);
    let mut planted = Vec::new();
    for vm in [foreign, claimed, plain] {
        let vm = rig.vms().create(&PostParams::default(), &vm).await.unwrap();
        planted.push((vm.name_any(), vm.uid().unwrap(), vm.labels().clone()));
    }
    for (name, vm_uid, _) in &planted {
        let uid = create_machine(&rig, name, json!({"dataSecretName": "plain-data"}), name).await;
        create_km_with_provider_id(&rig, name, name, &uid, Some(format!("kairon://{vm_uid}"))).await;
    }

    let cases = [
        ("foreign-vm", "created by management cluster another-installation"),
        ("claimed-vm", "which still exists"),
        ("plain-vm", "carries no management-cluster label"),
    ];
    for (name, why) in cases {
        let (_, message) = rig
            .wait(
                &format!("{name}: InstanceProvisioned InstanceNameConflict"),
                UP,
                || async {
                    let km = rig.kms().get(name).await?;
                    if km_ready(&km).is_some_and(|(status, _)| status == "True") {
                        rig.fail(format!("{name}: the KaironMachine took the VM: {:?}", km.status));
                    }
                    Ok::<_, kube::Error>(km_instance(&km).filter(|(r, _)| r == reason::INSTANCE_CONFLICT))
                },
            )
            .await;
        assert!(message.contains(why), "{name}: the message says why: {message}");
    }
    // Give the manager time to do anything more it would do, then look: the VMs' labels are
    // as planted, nobody's KaironMachine reports them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (name, _, labels) in &planted {
        let vm = rig.vms().get(name).await.unwrap();
        assert_eq!(but_kairons(vm.labels()), but_kairons(labels), "{name}: not relabelled");
        let km = rig.kms().get(name).await.unwrap();
        let status = km.status.unwrap_or_default();
        assert!(
            status.instance.and_then(|i| i.uid).is_none(),
            "{name}: no instance reported"
        );
        assert!(
            status.addresses.unwrap_or_default().is_empty(),
            "{name}: no addresses reported"
        );
    }
    assert!(rig.manager.is_running());
}

/// A Kairon Machine of the rig's namespace with no link to us: `labels` only, a minimal spec,
/// no user-data (the simulator runs it without registering a Node).
fn planted_vm(rig: &Rig, name: &str, labels: Vec<(&str, String)>) -> kairon::Machine {
    let mut vm = kairon::Machine::new(
        name,
        kairon::MachineSpec {
            resources: Some(kairon::Resources {
                cpu: Some("1".into()),
                memory: Some("1Gi".into()),
            }),
            image: Some(kairon::Image {
                image_ref: Some("img".into()),
                disk_size: Some("10Gi".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    vm.metadata.namespace = Some(rig.ns.clone());
    vm.metadata.labels = Some(labels.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
    vm
}

/// Deletion by providerID: whoever may create a KaironMachine can give it our finalizer, the
/// cluster-name label of a Cluster of the namespace and a `spec.providerID` naming any VM of
/// that Kairon namespace. Its deletion deletes a VM only when that VM is provably its own, by
/// the rule adoption follows; otherwise the VM is kept, the finalizer released and a Warning
/// event says why. Without this each of the three VMs below was deleted with the manager's
/// credentials: a plain Kairon VM no CAPI object made, another installation's, and one whose
/// labels name a KaironMachine that still exists.
#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_kaironmachine_deletes_no_vm_that_is_not_provably_its_own() {
    let rig = Rig::start(RigOptions {
        workers: 0,
        ..RigOptions::new("trust_delete")
    })
    .await;
    rig.wait_running(1, UP).await;
    let ours = rig.vms().list(&Default::default()).await.unwrap().items;
    assert_eq!(ours.len(), 1, "the control plane's VM");
    let cp_vm = ours[0].clone();
    let cp_labels: Vec<(&str, String)> = cp_vm.labels().iter().map(|(k, v)| (k.as_str(), v.clone())).collect();

    let plants = [
        planted_vm(&rig, "plain-vm", vec![]),
        planted_vm(
            &rig,
            "foreign-vm",
            vec![
                (kairon::labels::MANAGEMENT_CLUSTER, "another-installation".into()),
                (kairon::labels::KAIRONMACHINE_UID, "uid-of-a-machine-elsewhere".into()),
                (
                    "infrastructure.cluster.x-k8s.io/kaironmachine-name",
                    "foreign-vm".into(),
                ),
                ("app.kubernetes.io/managed-by", "cluster-api-provider-kairon".into()),
            ],
        ),
        // Our management cluster's label, but naming the live control-plane KaironMachine.
        planted_vm(&rig, "claimed-vm", cp_labels),
    ];
    let mut planted = Vec::new();
    for vm in plants {
        let vm = rig.vms().create(&PostParams::default(), &vm).await.unwrap();
        planted.push((vm.name_any(), vm.uid().unwrap(), vm.labels().clone()));
    }
    for (name, vm_uid, _) in &planted {
        let mut km = KaironMachine::new(
            name,
            KaironMachineSpec {
                provider_id: Some(format!("kairon://{vm_uid}")),
                ..km_spec()
            },
        );
        km.metadata.labels = Some([("cluster.x-k8s.io/cluster-name".to_string(), rig.cluster.clone())].into());
        km.metadata.finalizers = Some(vec![capkr::api::MACHINE_FINALIZER.to_string()]);
        rig.kms().create(&PostParams::default(), &km).await.unwrap();
        rig.kms().delete(name, &Default::default()).await.unwrap();
    }

    for (name, vm_uid, _) in &planted {
        rig.wait(&format!("{name}: the KaironMachine gone"), UP, || async {
            let vm = rig.vms().get_opt(name).await?;
            if vm.as_ref().is_none_or(|v| v.metadata.deletion_timestamp.is_some()) {
                rig.fail(format!(
                    "{name}: the VM the KaironMachine's providerID names was deleted"
                ));
            }
            Ok::<_, kube::Error>(rig.kms().get_opt(name).await?.is_none())
        })
        .await;
        assert_eq!(
            rig.vms().get(name).await.unwrap().uid().as_ref(),
            Some(vm_uid),
            "{name}: the same VM"
        );
    }
    // Give a deletion time to start if one were coming, then look.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let vms = rig.vm_map().await;
    for (name, vm_uid, labels) in &planted {
        let vm = vms
            .get(name)
            .unwrap_or_else(|| rig.fail(format!("Kairon Machine {name} was deleted")));
        assert_eq!(vm.uid().as_ref(), Some(vm_uid), "{name}: the same VM");
        assert!(vm.metadata.deletion_timestamp.is_none(), "{name}: not being deleted");
        assert_eq!(but_kairons(vm.labels()), but_kairons(labels), "{name}: not relabelled");
    }
    let cp = vms.get(&cp_vm.name_any()).expect("the control plane's VM");
    assert!(cp.metadata.deletion_timestamp.is_none());
    let events: kube::Api<Event> = kube::Api::namespaced(rig.env.client(), &rig.ns);
    let kept: Vec<String> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("InstanceKept") && e.type_.as_deref() == Some("Warning"))
        .filter_map(|e| e.note)
        .collect();
    for (name, _, _) in &planted {
        assert!(
            kept.iter()
                .any(|n| n.contains(&format!("Kairon Machine {}/{name}", rig.ns))),
            "{name}: a Warning event says the VM is kept: {kept:?}"
        );
    }
    assert!(rig.manager.is_running());
}

/// Another Machine's bootstrap Secret: the control-plane Machine's bootstrap Secret (made by
/// its KubeadmConfig: the cluster's CA, etcd, service-account and front-proxy keys) named by a
/// Machine without a bootstrap config, or by one whose configRef names that KubeadmConfig; and
/// a Secret labelled for another Cluster. Without the checks each got a VM, the first two with
/// the control plane's private keys in their user-data.
#[tokio::test(flavor = "multi_thread")]
async fn another_machines_bootstrap_secret_gets_no_vm() {
    let rig = Rig::start(RigOptions {
        workers: 0,
        ..RigOptions::new("trust_other_secret")
    })
    .await;
    let machines = rig.wait_running(1, UP).await;
    let cp = &machines[0];
    let cp_config = cp.data["spec"]["bootstrap"]["configRef"]["name"]
        .as_str()
        .expect("the control-plane Machine's KubeadmConfig")
        .to_string();
    let cp_secret = cp.data["spec"]["bootstrap"]["dataSecretName"]
        .as_str()
        .expect("the control-plane Machine's bootstrap Secret")
        .to_string();
    let secrets: kube::Api<Secret> = kube::Api::namespaced(rig.env.client(), &rig.ns);
    let secret = secrets.get(&cp_secret).await.unwrap();
    assert!(
        secret
            .owner_references()
            .iter()
            .any(|o| o.kind == "KubeadmConfig" && o.name == cp_config && o.controller == Some(true)),
        "the control plane's bootstrap Secret is its KubeadmConfig's: {:?}",
        secret.owner_references()
    );
    let payload = String::from_utf8(secret.data.unwrap()["value"].0.clone()).unwrap();
    assert!(payload.contains("ca.key"), "it holds the cluster's CA key");

    let mut other = Secret::default();
    other.metadata.name = Some("other-cluster-data".into());
    other.metadata.labels = Some([("cluster.x-k8s.io/cluster-name".to_string(), "c2".to_string())].into());
    other.string_data = Some([("value".to_string(), "#cloud-config\n".to_string())].into());
    secrets.create(&PostParams::default(), &other).await.unwrap();

    let bootstraps = [
        ("bare-takes-cp-data", json!({"dataSecretName": cp_secret})),
        (
            "config-takes-cp-data",
            json!({"dataSecretName": cp_secret,
                   "configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": cp_config}}),
        ),
        ("other-cluster-data", json!({"dataSecretName": "other-cluster-data"})),
    ];
    for (name, bootstrap) in &bootstraps {
        let uid = create_machine(&rig, name, bootstrap.clone(), name).await;
        create_km(&rig, name, name, &uid).await;
    }
    // Why, in the message: made by a bootstrap config; that config is another Machine's; the
    // Secret's cluster.
    let cases = [
        (
            "bare-takes-cp-data",
            format!("Secret {cp_secret}"),
            format!("KubeadmConfig {cp_config}"),
        ),
        (
            "config-takes-cp-data",
            format!("Secret {cp_secret}"),
            format!("Machine {}", cp.name_any()),
        ),
        (
            "other-cluster-data",
            "Secret other-cluster-data".to_string(),
            "Cluster c2".to_string(),
        ),
    ];
    for (name, secret, why) in &cases {
        let (_, message) = rig
            .wait(
                &format!("{name}: InstanceProvisioned BootstrapDataSecretNotTrusted"),
                UP,
                || async {
                    if rig.vms().get_opt(name).await?.is_some() {
                        rig.fail(format!("{name}: got a VM"));
                    }
                    let km = rig.kms().get(name).await?;
                    Ok::<_, kube::Error>(
                        km_instance(&km).filter(|(r, _)| r == reason::BOOTSTRAP_DATA_SECRET_NOT_TRUSTED),
                    )
                },
            )
            .await;
        assert!(message.contains(secret.as_str()), "{name}: names the Secret: {message}");
        assert!(message.contains(why.as_str()), "{name}: says why ({why}): {message}");
        assert!(
            !message.contains("PRIVATE KEY") && !message.contains("cloud-config"),
            "{name}: never the content"
        );
    }
    // Give the manager time to do anything more it would do, then look.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let vms = rig.vm_map().await;
    assert_eq!(vms.len(), 1, "the control plane's VM only: {:?}", vms.keys());
    for (name, _) in &bootstraps {
        assert!(!vms.contains_key(*name), "{name}: no Kairon Machine created");
    }
    assert!(rig.manager.is_running());
}

/// A VM's labels without those Kairon itself writes (`kairon.zyvor.dev/…`, such as the node it
/// binds the VM to): what the provider would have relabelled.
fn but_kairons(labels: &std::collections::BTreeMap<String, String>) -> std::collections::BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, _)| !k.starts_with("kairon.zyvor.dev/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}
