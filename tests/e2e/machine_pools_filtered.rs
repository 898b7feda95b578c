//! A MachinePool under a manager started with `--watch-filter`: the pool's objects and its
//! MachinePool's template carry the filter label, as the user labels them, and every
//! KaironMachine the pool makes carries it too, so the manager's own watches see its members:
//! each gets its VM, and a scale-in deletes them, leaving no VM behind.

use std::time::Instant;

use kube::ResourceExt;
use kube::api::ListParams;
use serde_json::{Value, json};

use super::machine_pools::{UP, pool_members, pool_vm_spec, scale_pool, wait_pool_running};
use crate::common::{Rig, RigOptions};
use capkr_testenv::cluster::{machine_image, machine_pool_yaml};
use capkr_testenv::parse_yaml_documents;

const FILTER: &str = "cluster.x-k8s.io/watch-filter";

/// `yaml` with every object, and what each of CAPI's templates stamps out, labelled with the
/// watch filter `value`.
fn filtered(yaml: &str, value: &str) -> String {
    parse_yaml_documents(yaml)
        .expect("the cluster's objects")
        .into_iter()
        .map(|mut d: Value| {
            d["metadata"]["labels"][FILTER] = json!(value);
            let kind = d["kind"].as_str().unwrap_or_default().to_string();
            if ["MachineDeployment", "MachinePool", "KaironMachineTemplate"].contains(&kind.as_str()) {
                d["spec"]["template"]["metadata"]["labels"][FILTER] = json!(value);
            }
            serde_json::to_string(&d).expect("JSON")
        })
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// A pool 0 → 2 → 0 under `--watch-filter`: every member's KaironMachine carries the filter
/// label, gets its VM and is Ready; scaled to 0, every member's VM is deleted and no VM is
/// left but the control plane's. (The pool's KaironMachines used to lack the label: the
/// manager never saw them, and a scale-in left their VMs behind.)
#[tokio::test(flavor = "multi_thread")]
async fn a_pool_under_a_watch_filter_scales_out_and_in_with_no_vm_left_behind() {
    let opts = RigOptions {
        workers: 0,
        create: false,
        manager_args: vec!["--watch-filter=team-a".to_string()],
        ..RigOptions::new("pool_filtered")
    };
    let rig = Rig::start(opts.clone()).await;
    let pool = format!("{}-mp-0", rig.cluster);
    let objects = format!(
        "{}\n---\n{}",
        rig.manifests(&opts),
        machine_pool_yaml(&rig.ns, &rig.cluster, 0, &pool_vm_spec(&machine_image()))
    );
    rig.env
        .apply(&filtered(&objects, "team-a"), Some(&rig.ns))
        .await
        .expect("cluster objects apply");
    rig.wait_running(1, UP).await;

    let started = Instant::now();
    scale_pool(&rig, &pool, 2).await;
    wait_pool_running(&rig, &pool, 2).await;
    let up_secs = started.elapsed().as_secs_f64();
    let kms = rig.kms().list(&ListParams::default()).await.unwrap().items;
    let members: Vec<_> = kms
        .iter()
        .filter(|k| k.owner_references().iter().any(|o| o.kind == "KaironMachinePool"))
        .collect();
    assert_eq!(members.len(), 2, "two members");
    for km in &members {
        assert_eq!(
            km.labels().get(FILTER).map(String::as_str),
            Some("team-a"),
            "{}: carries the watch filter",
            km.name_any()
        );
    }
    assert_eq!(pool_members(&rig, &pool).await.len(), 2, "a VM per member");

    let started = Instant::now();
    scale_pool(&rig, &pool, 0).await;
    rig.wait("the members' VMs deleted, the control plane's left", UP, || async {
        let vms = rig.vms().list(&ListParams::default()).await?.items;
        let kms = rig.kms().list(&ListParams::default()).await?.items;
        Ok::<_, kube::Error>((vms.len() == 1 && kms.len() == 1).then_some(()))
    })
    .await;
    eprintln!(
        "filtered pool: 0 -> 2 in {up_secs:.1} s, 2 -> 0 in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    rig.assert_one_vm_per_kaironmachine().await;
}
