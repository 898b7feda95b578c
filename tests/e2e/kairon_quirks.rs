//! What Kairon may send that we do not expect, against the real API server and CAPI:
//! - free text (Kairon's `status.message`, which a runtime's errors can fill with many lines
//!   quoted from the user-data) reaches our status and events bounded and cleaned
//!   (events.k8s.io rejects a note over 1 KiB, so an unbounded message meant a lost event);
//! - a Kairon Machine whose schema is not what we know affects its own KaironMachine alone
//!   (a typed list failed whole: the Kairon Machine cache went stale for every cluster).

use std::time::Duration;

use crate::common::{Rig, RigOptions};
use capkr::api::KaironMachine;
use capkr::api::conditions::{self, INSTANCE_PROVISIONED, reason};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{CustomResourceDefinition, JSONSchemaProps};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_multiline_kairon_message_gives_a_bounded_condition_and_an_event() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        ..RigOptions::new("kairon_text")
    })
    .await;
    rig.wait_running(2, UP).await;
    let name = rig
        .kms()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|k| k.name_any())
        .find(|n| n.contains("md-0"))
        .expect("the worker's KaironMachine");

    // What Kairon might report with a runtime it no longer knows the state of: 6 KiB over
    // many lines, with escapes. (The simulator leaves a Machine in Unknown as it is, as Kairon
    // does.)
    let quoted = "runcmd: kubeadm join --token abcdef.0123456789abcdef\n".repeat(120);
    let message = format!("cloud-init failed:\x1b[31m\n{quoted}");
    rig.vms()
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Unknown", "message": message}})),
        )
        .await
        .unwrap();

    let km: KaironMachine = rig
        .wait("the KaironMachine reports InstanceStateUnknown", UP, || async {
            let km = rig.kms().get(&name).await?;
            let failed = conditions::get(
                km.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_deref())
                    .unwrap_or_default(),
                INSTANCE_PROVISIONED,
            )
            .is_some_and(|c| c.reason == reason::INSTANCE_STATE_UNKNOWN);
            Ok::<_, kube::Error>(failed.then_some(km))
        })
        .await;
    let status = km.status.unwrap();
    let c = conditions::get(status.conditions.as_deref().unwrap(), INSTANCE_PROVISIONED).unwrap();
    assert!(
        c.message
            .starts_with(&format!("Kairon Machine {name} is in phase Unknown"))
            && c.message.contains("among them): cloud-init failed:"),
        "{}",
        c.message
    );
    assert!(c.message.len() <= 1024, "bounded: {} bytes", c.message.len());
    assert!(
        !c.message.contains('\n') && !c.message.contains('\x1b'),
        "cleaned: {:?}",
        c.message
    );
    assert_eq!(
        status.failure_reason(),
        None,
        "not a failure: a MachineHealthCheck decides"
    );

    let events: Api<Event> = Api::namespaced(rig.env.client(), &rig.ns);
    let event = rig
        .wait("a Warning event InstanceNotRunning for it", UP, || async {
            let list = events.list(&ListParams::default()).await?.items;
            Ok::<_, kube::Error>(list.into_iter().find(|e| {
                e.reason.as_deref() == Some("InstanceNotRunning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
            }))
        })
        .await;
    let note = event.note.unwrap_or_default();
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        note.starts_with("InstanceStateUnknown: ") && note.contains("cloud-init failed:"),
        "{note}"
    );
    assert!(note.len() <= 1024, "{} bytes", note.len());
    assert!(!note.contains('\n') && !note.contains('\x1b'), "{note:?}");
    assert!(rig.manager.is_running());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kairon_machine_we_cannot_read_is_its_own_kaironmachines_problem_alone() {
    // The simulator watches the rig's namespace only: the odd objects live elsewhere.
    let rig = Rig::start(RigOptions {
        workers: 1,
        sim_args: vec!["--namespace".into(), "kairon-odd".into()],
        // It loosens the Kairon Machine CRD's schema, and its manager watches every namespace.
        own_env: true,
        ..RigOptions::new("kairon_odd")
    })
    .await;
    rig.wait_running(2, UP).await;

    // Kairon's real schema may differ from ours: let the API server accept anything.
    let crds: Api<CustomResourceDefinition> = Api::all(rig.env.client());
    let mut crd = crds.get("machines.kairon.zyvor.dev").await.unwrap();
    for v in &mut crd.spec.versions {
        v.schema.as_mut().unwrap().open_api_v3_schema = Some(JSONSchemaProps {
            type_: Some("object".into()),
            x_kubernetes_preserve_unknown_fields: Some(true),
            ..Default::default()
        });
    }
    crds.replace("machines.kairon.zyvor.dev", &PostParams::default(), &crd)
        .await
        .unwrap();

    let odd_ns = "kairon-odd-elsewhere";
    rig.env.create_namespace(odd_ns).await.unwrap();
    let machines: Api<DynamicObject> = Api::namespaced_with(
        rig.env.client(),
        odd_ns,
        &capkr_testenv::capi_resource("Machine", "machines"),
    );
    let machine: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "oddling", "namespace": odd_ns},
        "spec": {"clusterName": "ghost", "bootstrap": {"dataSecretName": "none"},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironMachine", "name": "oddling"}}
    }))
    .unwrap();
    let machine = machines.create(&PostParams::default(), &machine).await.unwrap();
    let kms: Api<KaironMachine> = Api::namespaced(rig.env.client(), odd_ns);
    let km: KaironMachine = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironMachine",
        "metadata": {"name": "oddling", "namespace": odd_ns, "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine", "name": "oddling", "uid": machine.uid().unwrap()}]},
        "spec": {"image": {"imageRef": "img", "diskSize": "10Gi"}, "resources": {"cpu": 1, "memory": "1Gi"}}
    }))
    .unwrap();
    let km = kms.create(&PostParams::default(), &km).await.unwrap();
    // Its Kairon Machine, in a shape we do not know (the image as text, not an object).
    let vms: Api<DynamicObject> = Api::namespaced_with(
        rig.env.client(),
        odd_ns,
        &capkr_testenv::api_resource("kairon.zyvor.dev", "v1alpha1", "Machine", "machines"),
    );
    let odd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "Machine",
        "metadata": {"name": "oddling", "namespace": odd_ns, "labels": {
            "app.kubernetes.io/managed-by": "cluster-api-provider-kairon",
            "infrastructure.cluster.x-k8s.io/kaironmachine-uid": km.uid().unwrap()}},
        "spec": {"resources": {"cpu": "1", "memory": "1Gi"}, "image": "two", "gpu": {"model": "x"}}
    }))
    .unwrap();
    vms.create(&PostParams::default(), &odd).await.unwrap();

    let km = rig
        .wait("the odd one's KaironMachine reports InstanceUnreadable", UP, || async {
            let km = kms.get("oddling").await?;
            let unreadable = conditions::get(
                km.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_deref())
                    .unwrap_or_default(),
                INSTANCE_PROVISIONED,
            )
            .is_some_and(|c| c.reason == reason::INSTANCE_UNREADABLE);
            Ok::<_, kube::Error>(unreadable.then_some(km))
        })
        .await;
    let c = conditions::get(km.status.unwrap().conditions.as_deref().unwrap(), INSTANCE_PROVISIONED)
        .unwrap()
        .clone();
    assert!(
        c.message.contains("oddling") && c.message.contains("two"),
        "says which and why: {}",
        c.message
    );

    // Everyone else is served as before: a new worker comes up, and its status follows its VM.
    rig.scale(2).await;
    rig.wait_running(3, UP).await;
    rig.assert_one_vm_per_kaironmachine().await;
    let log = std::fs::read_to_string(rig.manager.log_path()).unwrap();
    assert!(!log.contains("panicked"), "no panic");
    assert!(rig.manager.is_running());
}

/// A VM no Kairon node fits is not a failure: Kairon leaves it `Pending` with
/// `Scheduled=False` and keeps trying (the simulator plays that), and the KaironMachine says so
/// with Kairon's reason and message, waiting, never terminally failed (the old simulator failed
/// such a VM, and the KaironMachine reported a terminal failure).
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_no_kairon_node_fits_waits_and_says_why() {
    use capkr::api::MachinePlacement;

    let rig = Rig::start(RigOptions {
        workers: 0,
        ..RigOptions::new("kairon_unschedulable")
    })
    .await;
    rig.wait_running(1, UP).await;
    let name = "nowhere";
    let placement = MachinePlacement {
        node_selector: Some([("topology.kairon.zyvor.dev/zone".to_string(), "zone-z".to_string())].into()),
        ..Default::default()
    };
    machine_by_hand(&rig, name, placement, false).await;

    let message = rig
        .wait("the KaironMachine says Kairon cannot place its VM", UP, || async {
            let km = rig.kms().get(name).await?;
            let c = conditions::get(
                km.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_deref())
                    .unwrap_or_default(),
                INSTANCE_PROVISIONED,
            )
            .filter(|c| c.reason == reason::INSTANCE_NOT_SCHEDULED)
            .map(|c| c.message.clone());
            Ok::<_, kube::Error>(c)
        })
        .await;
    assert!(message.contains("Unschedulable"), "Kairon's reason: {message}");
    assert!(message.contains("zone-z"), "Kairon's message: {message}");
    // Kairon tries again, the VM stays Pending and the KaironMachine waits: nothing terminal.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let vm = rig.vms().get(name).await.unwrap();
    assert_eq!(vm.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"));
    let km = rig.kms().get(name).await.unwrap();
    assert_eq!(
        km.status.as_ref().and_then(|s| s.failure_reason()),
        None,
        "not a failure"
    );
    let still = conditions::get(
        km.status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default(),
        INSTANCE_PROVISIONED,
    )
    .map(|c| c.reason.clone());
    assert_eq!(still.as_deref(), Some(reason::INSTANCE_NOT_SCHEDULED));
    let m = rig.machines().get(name).await.unwrap();
    assert_ne!(
        m.data["status"]["phase"], "Failed",
        "CAPI's Machine is not failed either"
    );
}

/// `controlPlaneAntiAffinity: Required` is Kairon's hard `antiAffinity`: a cluster's control
/// planes never share a Kairon node. With three Kairon nodes and four control-plane VMs (the
/// rig's own and three made Required here), the one no node may take waits `Pending` with
/// Kairon's `Scheduled=False` (the KaironMachine says `InstanceNotScheduled` with Kairon's
/// message), never on a node another control plane holds; when a node frees up, Kairon places
/// it there.
#[tokio::test(flavor = "multi_thread")]
async fn required_control_plane_anti_affinity_never_shares_a_kairon_node() {
    use capkr::api::{MachinePlacement, anti_affinity};
    use std::collections::BTreeMap;

    let rig = Rig::start(RigOptions {
        workers: 0,
        ..RigOptions::new("kairon_hard_anti_affinity")
    })
    .await;
    rig.wait_running(1, UP).await;
    let names: Vec<String> = (0..3).map(|i| format!("cp-hard-{i}")).collect();
    for name in &names {
        let placement = MachinePlacement {
            control_plane_anti_affinity: Some(anti_affinity::REQUIRED.into()),
            ..Default::default()
        };
        machine_by_hand(&rig, name, placement, true).await;
    }

    // Two of the three run, each on a node of its own; the third waits and says why.
    let placed = || async {
        let vms = rig.vm_map().await;
        let hosts: BTreeMap<String, String> = vms
            .iter()
            .filter(|(_, vm)| {
                vm.labels().contains_key("cluster.x-k8s.io/control-plane")
                    && vm.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .filter_map(|(n, vm)| Some((n.clone(), vm.status.as_ref()?.node_name.clone()?)))
            .collect();
        hosts
    };
    let waiting = rig
        .wait("two placed, the third not scheduled", UP, || async {
            let hosts = placed().await;
            let mut waiting = None;
            for name in &names {
                let km = rig.kms().get(name).await?;
                if crate::common::km_instance(&km).is_some_and(|(r, _)| r == reason::INSTANCE_NOT_SCHEDULED) {
                    waiting = Some((name.clone(), crate::common::km_instance(&km).unwrap().1));
                }
            }
            Ok::<_, kube::Error>(waiting.filter(|_| hosts.len() == 3))
        })
        .await;
    let (pending, message) = waiting;
    assert!(message.contains("antiAffinity"), "Kairon's message: {message}");
    let hosts = placed().await;
    let distinct: std::collections::BTreeSet<&String> = hosts.values().collect();
    assert_eq!(distinct.len(), 3, "one control plane per Kairon node: {hosts:?}");
    assert!(!hosts.contains_key(&pending));
    // It stays so: Kairon keeps trying, nothing shares a node, nothing fails.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let vm = rig.vms().get(&pending).await.unwrap();
    assert_eq!(vm.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"));
    assert_eq!(placed().await, hosts);

    // A node frees up: the waiting one is placed there.
    let (gone, freed) = hosts
        .iter()
        .find(|(n, _)| names.contains(n))
        .map(|(n, h)| (n.clone(), h.clone()))
        .unwrap();
    rig.machines().delete(&gone, &Default::default()).await.unwrap();
    let now = rig
        .wait(&format!("{pending} placed on the node {gone} left"), UP, || async {
            let hosts = placed().await;
            Ok::<_, kube::Error>(hosts.get(&pending).cloned().filter(|_| !hosts.contains_key(&gone)))
        })
        .await;
    assert_eq!(now, freed);
    let hosts = placed().await;
    let distinct: std::collections::BTreeSet<&String> = hosts.values().collect();
    assert_eq!(distinct.len(), hosts.len(), "still one per node: {hosts:?}");
}

/// A cluster's workers do not count as its control planes for their anti-affinity. Kairon
/// matches a selector entry `key: ""` on any Machine without the key, so a selector on CAPI's
/// control-plane label (empty value) would take every worker of the cluster for a control
/// plane: with a worker on every Kairon node, a `Required` control plane could go nowhere.
/// Three workers and the rig's control plane on three nodes; two `Required` control planes
/// made by hand go to the two nodes without a control plane.
#[tokio::test(flavor = "multi_thread")]
async fn a_clusters_workers_do_not_keep_its_required_control_planes_off_their_nodes() {
    use capkr::api::{MachinePlacement, anti_affinity};
    use std::collections::{BTreeMap, BTreeSet};

    let rig = Rig::start(RigOptions {
        workers: 3,
        ..RigOptions::new("kairon_anti_affinity_workers")
    })
    .await;
    rig.wait_running(4, UP).await;
    let vms = rig.vm_map().await;
    let node_of = |vm: &capkr::kairon::Machine| vm.status.as_ref().and_then(|s| s.node_name.clone());
    let worker_nodes: BTreeSet<String> = vms
        .values()
        .filter(|vm| !vm.labels().contains_key("cluster.x-k8s.io/control-plane"))
        .filter_map(node_of)
        .collect();
    assert_eq!(worker_nodes.len(), 3, "a worker on every Kairon node: {worker_nodes:?}");
    let names: Vec<String> = (0..2).map(|i| format!("cp-req-{i}")).collect();
    for name in &names {
        let placement = MachinePlacement {
            control_plane_anti_affinity: Some(anti_affinity::REQUIRED.into()),
            ..Default::default()
        };
        machine_by_hand(&rig, name, placement, true).await;
    }
    let hosts = rig
        .wait("both Required control planes placed", UP, || async {
            let vms = rig.vm_map().await;
            let hosts: BTreeMap<String, String> = vms
                .iter()
                .filter(|(_, vm)| vm.labels().contains_key("cluster.x-k8s.io/control-plane"))
                .filter_map(|(n, vm)| Some((n.clone(), node_of(vm)?)))
                .collect();
            let placed = names.iter().all(|n| hosts.contains_key(n));
            Ok::<_, kube::Error>((placed && hosts.len() == 3).then_some(hosts))
        })
        .await;
    let distinct: BTreeSet<&String> = hosts.values().collect();
    assert_eq!(distinct.len(), 3, "one control plane per Kairon node: {hosts:?}");
}

/// A Machine of the rig's cluster made by hand (no MachineDeployment or control plane owns
/// it), with a bootstrap data Secret of its own and a KaironMachine with `placement`; labelled
/// a control plane if `control_plane`.
async fn machine_by_hand(rig: &Rig, name: &str, placement: capkr::api::MachinePlacement, control_plane: bool) {
    use k8s_openapi::api::core::v1::Secret;

    let mut secret = Secret::default();
    secret.metadata.name = Some(format!("{name}-bootstrap"));
    secret.metadata.labels = Some([("cluster.x-k8s.io/cluster-name".to_string(), rig.cluster.clone())].into());
    secret.string_data = Some([("value".to_string(), "#cloud-config\nruncmd:\n- echo up\n".to_string())].into());
    Api::<Secret>::namespaced(rig.env.client(), &rig.ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let km = KaironMachine::new(
        name,
        capkr::api::KaironMachineSpec {
            placement: Some(placement),
            ..crate::common::km_spec()
        },
    );
    rig.kms().create(&PostParams::default(), &km).await.unwrap();
    let mut labels = json!({"cluster.x-k8s.io/cluster-name": rig.cluster});
    if control_plane {
        labels["cluster.x-k8s.io/control-plane"] = json!("");
    }
    let machine: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": name, "namespace": rig.ns, "labels": labels},
        "spec": {"clusterName": rig.cluster, "version": capkr_testenv::KUBERNETES_VERSION,
                 "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironMachine", "name": name}}
    }))
    .unwrap();
    rig.machines().create(&PostParams::default(), &machine).await.unwrap();
}
