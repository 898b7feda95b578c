//! Cluster lifecycle against the real CAPI controllers: create, steady state, scale, delete.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::{Rig, RigOptions, condition, km_ready};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};

const UP: Duration = Duration::from_secs(180);

/// Create, then steady state: a control plane of one Machine in zone-a and a MachineDeployment of 3
/// workers in zone-b come up with every contract field in place; then, for a minute, no object
/// of ours changes and the manager issues no write.
#[tokio::test(flavor = "multi_thread")]
async fn create_then_steady_state_writes_nothing() {
    let rig = Rig::start(RigOptions {
        workers: 3,
        cp_failure_domain: Some("zone-a"),
        md_failure_domain: Some("zone-b"),
        audit: true,
        ..RigOptions::new("create_steady")
    })
    .await;
    let machines = rig.wait_running(4, UP).await;

    // Failure domains of the KaironCluster are on the Cluster.
    let cluster = rig.clusters().get(&rig.cluster).await.unwrap();
    let fds: Vec<_> = cluster.data["status"]["failureDomains"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| f["name"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(fds, ["zone-a", "zone-b"], "Cluster.status.failureDomains");
    // The Cluster's InfrastructureReady mirrors the KaironCluster's Ready.
    let kc = rig.kcs().get(&rig.cluster).await.unwrap();
    let kc_ready = capkr::api::conditions::get(kc.status.as_ref().unwrap().conditions.as_deref().unwrap(), "Ready")
        .unwrap()
        .clone();
    let infra_ready = condition(&cluster, "InfrastructureReady").expect("InfrastructureReady on the Cluster");
    assert_eq!(infra_ready["status"], kc_ready.status.as_str());
    assert_eq!(infra_ready["reason"], kc_ready.reason.as_str());

    let nodes = rig.nodes().list(&ListParams::default()).await.unwrap().items;
    let vms = rig.vm_map().await;
    for m in &machines {
        let name = m.name_any();
        let km = rig.kms().get(&name).await.unwrap();
        let status = km.status.clone().unwrap();
        assert!(status.is_provisioned(), "{name}: provisioned");
        assert_eq!(km_ready(&km), Some(("True".into(), "Ready".into())), "{name}: Ready");
        assert!(
            status.addresses.as_ref().is_some_and(|a| !a.is_empty()),
            "{name}: addresses"
        );
        let pid = km.spec.provider_id.clone().expect("providerID");
        let node_name = m.data["status"]["nodeRef"]["name"].as_str().unwrap();
        let node = nodes.iter().find(|n| n.name_any() == node_name).expect("node");
        assert_eq!(
            node.spec.as_ref().and_then(|s| s.provider_id.clone()),
            Some(pid.clone()),
            "{name}: Node's providerID"
        );
        assert_eq!(
            m.data["spec"]["providerID"],
            pid.as_str(),
            "{name}: Machine's providerID"
        );
        // Placement: the Machine's failure domain is where the VM runs.
        let want_fd = m.data["spec"]["failureDomain"]
            .as_str()
            .expect("Machines have a failure domain here");
        assert_eq!(
            status.failure_domain.as_deref(),
            Some(want_fd),
            "{name}: status.failureDomain"
        );
        assert_eq!(
            m.data["status"]["failureDomain"], want_fd,
            "{name}: Machine.status.failureDomain"
        );
        let vm = &vms[&name];
        let host = vm.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let zone_hosts = if want_fd == "zone-a" {
            vec!["kairon-node-1"]
        } else {
            vec!["kairon-node-2", "kairon-node-3"]
        };
        assert!(
            zone_hosts.contains(&host.as_str()),
            "{name}: host {host} is in {want_fd}"
        );
    }
    assert_eq!(vms.len(), 4);
    rig.assert_one_vm_per_kaironmachine().await;
    // Each Machine's bootstrap Secret was checked against its KubeadmConfig: from the watch of
    // KubeadmConfigs (metadata only) once it is listed, not with a read per machine.
    let config_requests: Vec<String> = rig
        .manager_requests(0)
        .iter()
        .filter(|e| e.object_ref.as_ref().and_then(|o| o.resource.as_deref()) == Some("kubeadmconfigs"))
        .map(|e| e.verb.clone())
        .collect();
    let gets = config_requests.iter().filter(|v| *v == "get").count();
    assert!(
        config_requests.iter().any(|v| v == "watch"),
        "KubeadmConfigs are watched: {config_requests:?}"
    );
    assert!(
        gets <= 2,
        "at most the first machine's config (and one the watch lagged behind) is read, not each of the 4: {config_requests:?}"
    );

    // Steady state. Let the last status writes (from the final reconciles) settle, then watch.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = our_resource_versions(&rig).await;
    let from = rig.audit_len();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let after = our_resource_versions(&rig).await;
    assert_eq!(before, after, "no object of ours changed in a minute of steady state");
    let writes = rig.manager_writes(from, None);
    assert!(writes.is_empty(), "the manager wrote at steady state: {writes:?}");
    let text = std::fs::read_to_string(rig.env.audit_log_path().unwrap()).unwrap();
    let manager_requests = text.lines().filter(|l| l.contains("capkr-manager/")).count();
    assert!(manager_requests > 0, "the audit log sees the manager at all");
}

async fn our_resource_versions(rig: &Rig) -> BTreeMap<String, String> {
    let mut rv = BTreeMap::new();
    for km in rig.kms().list(&ListParams::default()).await.unwrap() {
        rv.insert(
            format!("KaironMachine/{}", km.name_any()),
            km.resource_version().unwrap_or_default(),
        );
    }
    for kc in rig.kcs().list(&ListParams::default()).await.unwrap() {
        rv.insert(
            format!("KaironCluster/{}", kc.name_any()),
            kc.resource_version().unwrap_or_default(),
        );
    }
    let templates: kube::Api<capkr::api::KaironMachineTemplate> = kube::Api::namespaced(rig.env.client(), &rig.ns);
    for t in templates.list(&ListParams::default()).await.unwrap() {
        rv.insert(
            format!("KaironMachineTemplate/{}", t.name_any()),
            t.resource_version().unwrap_or_default(),
        );
    }
    assert!(rv.len() >= 6, "{rv:?}");
    rv
}

/// Scale, then delete: MachineDeployment 3 → 5 → 1 creates and deletes exactly the right Kairon
/// Machines, each worker is drained before its VM goes; then deleting the Cluster removes
/// everything, each KaironMachine only after its VM is gone and the KaironCluster last.
#[tokio::test(flavor = "multi_thread")]
async fn scale_then_delete_the_cluster() {
    let rig = Rig::start(RigOptions {
        workers: 3,
        sim_args: vec!["--delete-delay".into(), "2s".into()],
        ..RigOptions::new("scale_delete")
    })
    .await;
    let start = rig.wait_running(4, UP).await;
    let first_vms = rig.vm_map().await;
    let uid_of = |vms: &BTreeMap<String, capkr::kairon::Machine>, n: &str| vms[n].metadata.uid.clone().unwrap();

    // 3 -> 5: two new VMs, the existing ones untouched.
    rig.scale(5).await;
    let five = rig.wait_running(6, UP).await;
    let vms = rig.vm_map().await;
    assert_eq!(vms.len(), 6, "one VM per Machine: {:?}", vms.keys());
    for m in &start {
        assert_eq!(
            uid_of(&vms, &m.name_any()),
            uid_of(&first_vms, &m.name_any()),
            "{} kept its VM",
            m.name_any()
        );
    }
    rig.assert_one_vm_per_kaironmachine().await;

    // 5 -> 1: four workers go. Watch each one: its Node is cordoned (drain) before its VM is
    // deleted, and its KaironMachine goes only once its VM is gone.
    rig.scale(1).await;
    let workers: BTreeSet<String> = five
        .iter()
        .map(|m| m.name_any())
        .filter(|n| !n.contains("control-plane"))
        .collect();
    let node_of: BTreeMap<String, String> = five
        .iter()
        .map(|m| {
            (
                m.name_any(),
                m.data["status"]["nodeRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    let mut cordoned: BTreeMap<String, Instant> = BTreeMap::new();
    let mut vm_deleting: BTreeMap<String, Instant> = BTreeMap::new();
    let mut vm_gone: BTreeMap<String, Instant> = BTreeMap::new();
    let mut km_gone: BTreeMap<String, Instant> = BTreeMap::new();
    let deadline = Instant::now() + UP;
    loop {
        let now = Instant::now();
        // Read order matters: KaironMachines, then VMs, then Nodes. A KaironMachine seen gone
        // before its VM is seen present is a real violation, and a VM seen deleting before its
        // Node is seen uncordoned too.
        let kms: BTreeSet<String> = rig
            .kms()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|k| k.name_any())
            .collect();
        let vms = rig.vm_map().await;
        let nodes = rig.nodes().list(&ListParams::default()).await.unwrap().items;
        for w in &workers {
            let node = nodes.iter().find(|n| n.name_any() == node_of[w]);
            if node.is_some_and(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)) {
                cordoned.entry(w.clone()).or_insert(now);
            }
            match vms.get(w) {
                Some(vm) if vm.metadata.deletion_timestamp.is_some() => {
                    vm_deleting.entry(w.clone()).or_insert(now);
                }
                None => {
                    vm_deleting.entry(w.clone()).or_insert(now);
                    vm_gone.entry(w.clone()).or_insert(now);
                }
                _ => {}
            }
            if !kms.contains(w) {
                km_gone.entry(w.clone()).or_insert(now);
                if vms.contains_key(w) {
                    rig.fail(format!(
                        "KaironMachine {w} is gone while its Kairon Machine still exists"
                    ));
                }
            }
        }
        let machines = rig.machines().list(&ListParams::default()).await.unwrap().items;
        if machines.len() == 2 && km_gone.len() == 4 && vms.len() == 2 {
            break;
        }
        if now > deadline {
            rig.fail(format!(
                "scale down to 1 did not finish: {} Machines, {} VMs",
                machines.len(),
                vms.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let removed: BTreeSet<String> = km_gone.keys().cloned().collect();
    assert_eq!(removed.len(), 4);
    for w in &removed {
        let (Some(c), Some(d)) = (cordoned.get(w), vm_deleting.get(w)) else {
            rig.fail(format!(
                "{w}: drain (cordon) or VM deletion not seen: cordoned={cordoned:?} deleting={vm_deleting:?}"
            ));
        };
        assert!(c <= d, "{w}: the Node was cordoned before the VM was deleted");
        assert!(vm_gone[w] <= km_gone[w], "{w}: the VM went before its KaironMachine");
    }
    let survivors = rig.wait_running(2, UP).await;
    let vms = rig.vm_map().await;
    for m in &survivors {
        if let Some(old) = first_vms.get(&m.name_any()) {
            assert_eq!(
                vms[&m.name_any()].metadata.uid,
                old.metadata.uid,
                "{} kept its VM",
                m.name_any()
            );
        }
    }
    rig.assert_one_vm_per_kaironmachine().await;

    // Delete the Cluster.
    rig.clusters()
        .delete(&rig.cluster, &DeleteParams::background())
        .await
        .unwrap();
    let mut km_gone_at: BTreeMap<String, Instant> = BTreeMap::new();
    let mut vm_gone_at: BTreeMap<String, Instant> = BTreeMap::new();
    let names: BTreeSet<String> = survivors.iter().map(|m| m.name_any()).collect();
    let kc_gone;
    let deadline = Instant::now() + UP;
    loop {
        let now = Instant::now();
        // Read order: KaironCluster, KaironMachines, VMs (see above).
        let kcs = rig.kcs().list(&ListParams::default()).await.unwrap().items.len();
        let kms: BTreeSet<String> = rig
            .kms()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|k| k.name_any())
            .collect();
        let vms = rig.vm_map().await;
        for n in &names {
            if !vms.contains_key(n) {
                vm_gone_at.entry(n.clone()).or_insert(now);
            }
            if !kms.contains(n) {
                km_gone_at.entry(n.clone()).or_insert(now);
                if vms.contains_key(n) {
                    rig.fail(format!(
                        "KaironMachine {n} is gone while its Kairon Machine still exists"
                    ));
                }
            }
        }
        if kcs == 0 {
            if !kms.is_empty() {
                rig.fail(format!("the KaironCluster went before KaironMachines {kms:?}"));
            }
            kc_gone = now;
            break;
        }
        if now > deadline {
            rig.fail("cluster deletion did not finish");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for n in &names {
        assert!(km_gone_at[n] <= kc_gone, "{n}: KaironMachine before the KaironCluster");
    }
    rig.wait("the Cluster gone", UP, || async {
        Ok::<_, kube::Error>(rig.clusters().list(&ListParams::default()).await?.items.is_empty())
    })
    .await;
    assert!(rig.vm_map().await.is_empty(), "no Kairon Machine is left");
    assert!(rig.kms().list(&ListParams::default()).await.unwrap().items.is_empty());
}

/// Waiting, said precisely: once the control plane is up, a worker whose bootstrap data has
/// not come waits for its bootstrap data, not for the control plane. CAPI marks a control plane
/// of plain Machines initialized only by the Cluster's `ControlPlaneInitialized` condition
/// (`status.initialization` stays unset); reading only the field, every such worker said
/// `WaitingForControlPlaneInitialized` until its data came.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_without_bootstrap_data_waits_for_it_once_the_control_plane_is_up() {
    use capkr::api::KaironMachine;
    use capkr::api::conditions::reason;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::{DynamicObject, PostParams};
    use serde_json::json;

    let rig = Rig::start(RigOptions {
        workers: 0,
        ..RigOptions::new("lifecycle_waiting")
    })
    .await;
    rig.wait_running(1, UP).await;
    // A worker whose bootstrap config never produces data (it does not exist).
    let m: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "late", "namespace": rig.ns, "labels": {"cluster.x-k8s.io/cluster-name": rig.cluster}},
        "spec": {"clusterName": rig.cluster, "version": capkr_testenv::KUBERNETES_VERSION,
                 "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "never-made"}},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironMachine", "name": "late"}}
    }))
    .unwrap();
    let m = rig.machines().create(&PostParams::default(), &m).await.unwrap();
    let mut km = KaironMachine::new("late", crate::common::km_spec());
    km.metadata.labels = Some([("cluster.x-k8s.io/cluster-name".to_string(), rig.cluster.clone())].into());
    km.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Machine".into(),
        name: "late".into(),
        uid: m.uid().unwrap(),
        ..Default::default()
    }]);
    rig.kms().create(&PostParams::default(), &km).await.unwrap();
    let seen = rig
        .wait("the worker's KaironMachine to say why it waits", UP, || async {
            let km = rig.kms().get("late").await?;
            Ok::<_, kube::Error>(km_ready(&km).filter(|(status, _)| status == "False").map(|(_, r)| r))
        })
        .await;
    // Give a wrong first answer time to be corrected, then read the settled one.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let km = rig.kms().get("late").await.unwrap();
    assert_eq!(
        km_ready(&km).map(|(_, r)| r).as_deref(),
        Some(reason::WAITING_FOR_BOOTSTRAP_DATA),
        "first said {seen}"
    );
    assert!(rig.vms().get_opt("late").await.unwrap().is_none(), "no VM without data");
}
