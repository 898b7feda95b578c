//! The disruption budgets a cluster keeps on Kairon, on the real control plane: a cluster of
//! one control plane and a MachineDeployment gets a MachineDisruptionBudget over its
//! control-plane VM and one over its workers, each selecting exactly those VMs as Kairon
//! matches selectors (`key: ""` holds on a Machine without the key), and none allowing a
//! disruption; the workers' covers the VMs the deployment grows by; a budget of another management
//! cluster with the same name as one of ours would have is left alone; a paused cluster's
//! budgets stay as they are (nothing written, nothing deleted, nothing put back) until it is
//! unpaused; and deleting the cluster deletes its budgets.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{Rig, RigOptions};
use capkr::api::{KaironCluster, conditions};
use capkr::kairon;
use capkr::kairon::budget::{BUDGET_FOR, MachineDisruptionBudget, selects};
use capkr::kairon::labels;
use capkr_testenv::cluster::{ClusterOptions, Infrastructure, cluster_yaml_of};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_keeps_budgets_over_its_control_plane_and_workers_and_deletes_them_with_it() {
    let rig = Rig::start(RigOptions {
        workers: 2,
        ..RigOptions::new("e2e_budgets")
    })
    .await;
    let budgets: Api<MachineDisruptionBudget> = Api::namespaced(rig.env.client(), &rig.ns);
    let md = format!("{}-md-0", rig.cluster);
    let (cp_name, md_name) = (format!("cp-{}", rig.cluster), format!("workers-{}", rig.cluster));
    rig.wait_running(3, UP).await;

    // Both budgets, each over exactly its VMs.
    let found = rig
        .wait(
            "a budget over the control plane and one over the workers",
            UP,
            || async {
                let list = budgets.list(&ListParams::default()).await?;
                let by_name: BTreeMap<String, MachineDisruptionBudget> =
                    list.items.into_iter().map(|b| (b.name_any(), b)).collect();
                Ok::<_, kube::Error>(
                    (by_name.contains_key(&cp_name) && by_name.contains_key(&md_name)).then_some(by_name),
                )
            },
        )
        .await;
    let vms = rig.vms();
    let (cp, mdb) = (&found[&cp_name], &found[&md_name]);
    assert_eq!(cp.labels().get(BUDGET_FOR).map(String::as_str), Some("control-plane"));
    assert_eq!(cp.labels().get(labels::CLUSTER_NAME), Some(&rig.cluster));
    // Selected as Kairon selects (a missing label reads as ""), over every VM of the API.
    let all = vms.list(&ListParams::default()).await.unwrap().items;
    let selected = |b: &MachineDisruptionBudget| -> Vec<&kairon::Machine> {
        all.iter()
            .filter(|vm| selects(&b.spec.selector, vm.metadata.labels.as_ref()))
            .collect()
    };
    let (cp_vms, md_vms) = (selected(cp), selected(mdb));
    assert_eq!(
        cp_vms.len(),
        1,
        "the control-plane budget selects the control-plane VM only: {:?}",
        cp_vms.iter().map(|v| v.name_any()).collect::<Vec<_>>()
    );
    assert!(cp_vms[0].labels().contains_key(labels::CONTROL_PLANE));
    assert_eq!(md_vms.len(), 2, "the workers' budget selects the deployment's two VMs");
    assert!(md_vms.iter().all(|vm| !vm.labels().contains_key(labels::CONTROL_PLANE)));
    assert!(cp.spec.min_available.is_none() && mdb.spec.min_available.is_none());
    assert_eq!(
        (cp.spec.max_unavailable.as_deref(), mdb.spec.max_unavailable.as_deref()),
        (Some("0"), Some("0")),
        "Kairon may cold-migrate none of the cluster's VMs"
    );
    eprintln!(
        "budgets: {cp_name} maxUnavailable {:?}, {md_name} maxUnavailable {:?}",
        cp.spec.max_unavailable, mdb.spec.max_unavailable
    );

    // A budget of another management cluster, labelled for this cluster under a name of its
    // own: left alone.
    let foreign = format!("md-{}-md-1", rig.cluster);
    let foreign_budget: MachineDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineDisruptionBudget",
        "metadata": {"name": foreign, "labels": {
            labels::CLUSTER_NAME: rig.cluster, "infrastructure.cluster.x-k8s.io/kairon-cluster-namespace": rig.ns,
            "app.kubernetes.io/managed-by": "cluster-api-provider-kairon",
            labels::MANAGEMENT_CLUSTER: "another-management-cluster"}},
        "spec": {"selector": {"team": "theirs"}, "minAvailable": "3"}}))
    .unwrap();
    budgets.create(&Default::default(), &foreign_budget).await.unwrap();

    // The deployment grows to 4 with maxUnavailable 50%: the workers' budget covers the new
    // VMs and still allows no disruption.
    rig.machine_deployments()
        .patch(
            &md,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4,
                "rollout": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "50%"}}}}})),
        )
        .await
        .unwrap();
    rig.wait_running(5, UP).await;
    let all = vms.list(&ListParams::default()).await.unwrap().items;
    let b = budgets.get(&md_name).await.unwrap();
    let covered = all
        .iter()
        .filter(|vm| selects(&b.spec.selector, vm.metadata.labels.as_ref()))
        .count();
    assert_eq!(covered, 4, "the workers' budget selects the deployment's four VMs");
    assert_eq!(b.spec.max_unavailable.as_deref(), Some("0"));
    let theirs = budgets.get(&foreign).await.unwrap();
    assert_eq!(
        theirs.spec.min_available.as_deref(),
        Some("3"),
        "another's budget is untouched"
    );

    // Paused (as `clusterctl move` pauses it): the budgets stay as they are, and the provider
    // does not touch them even when a reconcile runs, not even to put back one deleted by hand;
    // unpaused, it does.
    rig.set_paused(true).await;
    let kcs = rig.kcs();
    let kc_name = rig.cluster.clone();
    rig.wait("the KaironCluster Paused", UP, || async {
        let kc = kcs.get(&kc_name).await?;
        let paused = kc
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .and_then(|c| capkr::api::conditions::get(c, capkr::api::conditions::PAUSED))
            .is_some_and(|c| c.status == "True");
        Ok::<_, kube::Error>(paused.then_some(()))
    })
    .await;
    let versions = |list: Vec<MachineDisruptionBudget>| -> BTreeMap<String, String> {
        list.into_iter()
            .map(|b| (b.name_any(), b.resource_version().unwrap_or_default()))
            .collect()
    };
    let before = versions(budgets.list(&ListParams::default()).await.unwrap().items);
    let nudge = |n: u32| {
        let kcs = kcs.clone();
        let name = kc_name.clone();
        async move {
            kcs.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"e2e.capkr/nudge": n.to_string()}}})),
            )
            .await
            .unwrap();
        }
    };
    nudge(1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let paused_list = versions(budgets.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(paused_list, before, "a paused cluster's budgets stay as they were");
    budgets.delete(&cp_name, &DeleteParams::default()).await.unwrap();
    nudge(2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        budgets.get_opt(&cp_name).await.unwrap().is_none(),
        "nothing is written for a paused cluster"
    );
    rig.set_paused(false).await;
    rig.wait("the control plane's budget back once unpaused", UP, || async {
        Ok::<_, kube::Error>(budgets.get_opt(&cp_name).await?.map(|_| ()))
    })
    .await;

    // The cluster goes, and its budgets with it; another's stays.
    rig.clusters()
        .delete(&rig.cluster, &DeleteParams::default())
        .await
        .unwrap();
    rig.wait("the cluster's budgets deleted with it", UP, || async {
        let left: Vec<String> = budgets
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        Ok::<_, kube::Error>((left == [foreign.clone()]).then_some(()))
    })
    .await;
}

/// Every version of the namespace's KaironClusters, as a watch from before they exist sees them.
fn every_version(api: Api<KaironCluster>) -> Arc<Mutex<Vec<KaironCluster>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let into = seen.clone();
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(kc)) = events.next().await {
            into.lock().unwrap_or_else(|e| e.into_inner()).push(kc);
        }
    });
    seen
}

fn budgets_condition(kc: &KaironCluster) -> Option<(String, String)> {
    kc.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .and_then(|c| conditions::get(c, conditions::DISRUPTION_BUDGETS_READY))
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// CAPI makes no Machine before the KaironCluster is provisioned: the budgets are kept before
/// that, and the version of the KaironCluster that first says provisioned already says where
/// they stand. A budget of that name that is not ours is said (`DisruptionBudgetNameTaken`),
/// left alone, and does not hold up the cluster.
#[tokio::test(flavor = "multi_thread")]
async fn budgets_are_kept_before_the_cluster_is_provisioned_and_a_taken_name_is_said() {
    let opts = RigOptions {
        workers: 1,
        create: false,
        ..RigOptions::new("e2e_budgets_first")
    };
    let rig = Rig::start(opts.clone()).await;
    let budgets: Api<MachineDisruptionBudget> = Api::namespaced(rig.env.client(), &rig.ns);
    let (cp_name, workers_name) = (format!("cp-{}", rig.cluster), format!("workers-{}", rig.cluster));
    let theirs: MachineDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineDisruptionBudget",
        "metadata": {"name": cp_name},
        "spec": {"selector": {"team": "theirs"}, "minAvailable": "3"}}))
    .unwrap();
    budgets.create(&Default::default(), &theirs).await.unwrap();
    let seen = every_version(rig.kcs());
    // The watch has listed (nothing yet) before the cluster comes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    rig.env
        .apply(&rig.manifests(&opts), Some(&rig.ns))
        .await
        .expect("cluster objects apply");
    rig.wait_running(2, UP).await;

    let versions = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let first = versions
        .iter()
        .find(|kc| kc.status.as_ref().is_some_and(|s| s.is_provisioned()))
        .unwrap_or_else(|| {
            rig.fail(format!(
                "no provisioned KaironCluster among {} versions",
                versions.len()
            ))
        });
    eprintln!(
        "budgets first: {} versions of the KaironCluster seen; the first provisioned one (resourceVersion {:?}) says {:?}",
        versions.len(),
        first.resource_version(),
        budgets_condition(first)
    );
    assert_eq!(
        budgets_condition(first),
        Some(("False".to_string(), "DisruptionBudgetNameTaken".to_string())),
        "the version that first says provisioned says where the budgets stand"
    );
    let workers = budgets
        .get_opt(&workers_name)
        .await
        .unwrap()
        .unwrap_or_else(|| rig.fail("the workers' budget, kept although the control plane's name is taken"));
    assert_eq!(workers.spec.max_unavailable.as_deref(), Some("0"));
    let still_theirs = budgets.get(&cp_name).await.unwrap();
    assert_eq!(
        (
            still_theirs.spec.min_available.as_deref(),
            still_theirs.spec.selector.get("team").map(String::as_str)
        ),
        (Some("3"), Some("theirs")),
        "another's budget is left as it was"
    );
    assert!(
        still_theirs.labels().get(labels::CLUSTER_NAME).is_none(),
        "and not labelled ours"
    );
}

/// An externally managed KaironCluster (`cluster.x-k8s.io/managed-by`): its status and
/// finalizers are another's, but its KaironMachines make their VMs here, so its budgets are
/// kept all the same, and deleted once it is gone.
#[tokio::test(flavor = "multi_thread")]
async fn an_externally_managed_clusters_vms_are_under_budgets_and_they_go_with_it() {
    let opts = RigOptions {
        workers: 1,
        create: false,
        ..RigOptions::new("e2e_budgets_external")
    };
    let rig = Rig::start(opts.clone()).await;
    let budgets: Api<MachineDisruptionBudget> = Api::namespaced(rig.env.client(), &rig.ns);
    let infra = Infrastructure {
        cluster_annotations: "cluster.x-k8s.io/managed-by: e2e-external".into(),
        ..Infrastructure::kairon(&rig.workload().host, rig.workload().port)
    };
    let shape = ClusterOptions {
        workers: 1,
        ..Default::default()
    };
    rig.env
        .apply(&cluster_yaml_of(&rig.ns, &rig.cluster, &infra, &shape), Some(&rig.ns))
        .await
        .expect("cluster objects apply");
    // As whoever manages it would: provisioned, its endpoint in its spec.
    let kcs = rig.kcs();
    let name = rig.cluster.clone();
    rig.wait("the KaironCluster marked provisioned by its manager", UP, || async {
        let done = kcs
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"initialization": {"provisioned": true}}})),
            )
            .await;
        Ok::<_, kube::Error>(done.ok().map(|_| ()))
    })
    .await;
    rig.wait_running(2, UP).await;
    let (cp_name, workers_name) = (format!("cp-{}", rig.cluster), format!("workers-{}", rig.cluster));
    rig.wait("both budgets of the externally managed cluster", UP, || async {
        let cp = budgets.get_opt(&cp_name).await?;
        let workers = budgets.get_opt(&workers_name).await?;
        Ok::<_, kube::Error>((cp.is_some() && workers.is_some()).then_some(()))
    })
    .await;
    let kc = kcs.get(&name).await.unwrap();
    assert!(
        kc.finalizers().iter().all(|f| !f.contains("kairon")),
        "no finalizer of ours on it: {:?}",
        kc.finalizers()
    );
    assert_eq!(budgets_condition(&kc), None, "its status is not ours to write");

    rig.clusters()
        .delete(&rig.cluster, &DeleteParams::default())
        .await
        .unwrap();
    rig.wait("the KaironCluster gone, and its budgets with it", UP, || async {
        let kc = kcs.get_opt(&name).await?;
        let left = budgets.list(&ListParams::default()).await?.items.len();
        Ok::<_, kube::Error>((kc.is_none() && left == 0).then_some(()))
    })
    .await;
}
