//! The provider on Kairon APIs that serve other versions than the development CRDs (`v1`
//! stored, `v1beta1` and `v1alpha1` deprecated): a Kairon whose CRDs serve `v1` alone, and an
//! older Kairon serving `v1alpha1` alone with a Machine schema from before MachineImages and
//! the weighted scorer (`capkr_testenv::kairon_crds`). Each rig has an environment of its own.

use std::time::Duration;

use crate::common::{Rig, RigOptions};
use capkr::api::conditions::{self, INSTANCE_PROVISIONED, reason};
use capkr_testenv::cluster::{ClusterOptions, Infrastructure, cluster_yaml_of};
use capkr_testenv::kairon_crds::KaironCrds;
use capkr_testenv::{NETWORK, api_resource};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};

#[tokio::test(flavor = "multi_thread")]
async fn on_a_kairon_serving_v1_alone_the_cluster_comes_up_and_its_vms_go_with_it() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        kairon_crds: KaironCrds::Only("v1"),
        ..RigOptions::new("e2e_kairon_v1_only")
    })
    .await;
    rig.wait_running(2, Duration::from_secs(240)).await;
    let vms = rig.vms();
    let list = vms.list(&ListParams::default()).await.expect("Kairon Machines in v1");
    assert_eq!(list.items.len(), 2, "one Kairon Machine per Machine");
    for vm in &list.items {
        assert_eq!(vm.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
        assert!(
            vm.spec.image_ref().is_some(),
            "the Kairon Machine keeps its imageRef: the v1 schema has it"
        );
    }

    let clusters = rig.clusters();
    clusters
        .delete(&rig.cluster, &DeleteParams::background())
        .await
        .unwrap();
    let kms = rig.kms();
    rig.wait(
        "the Cluster, its KaironMachines and its Kairon Machines gone",
        Duration::from_secs(180),
        || async {
            let left = (
                clusters.list(&ListParams::default()).await?.items.len(),
                kms.list(&ListParams::default()).await?.items.len(),
                vms.list(&ListParams::default()).await?.items.len(),
            );
            Ok::<_, kube::Error>(left == (0, 0, 0))
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_an_older_kairon_serving_v1alpha1_alone_a_machine_needing_newer_fields_gets_no_vm_and_says_why() {
    let rig = Rig::start(RigOptions {
        workers: 0,
        create: false,
        kairon_crds: KaironCrds::OlderV1alpha1,
        ..RigOptions::new("e2e_kairon_older")
    })
    .await;
    let shape = ClusterOptions {
        workers: 0,
        cp_failure_domain: None,
        md_failure_domain: None,
        health_check: false,
    };
    // c1: an image by path and required anti-affinity, both in the older schema. c2: the
    // default flavor's imageRef, diskSize and preferred anti-affinity, none of them there.
    let mut older = Infrastructure::kairon(&rig.workload().host, rig.workload().port);
    older.machine_spec = format!(
        "  image:\n    path: /var/lib/kairon/images/ubuntu.qcow2\n  resources:\n    cpu: 2\n    memory: 4Gi\n  \
         placement:\n    controlPlaneAntiAffinity: Required\n{NETWORK}"
    );
    let newer = Infrastructure::kairon(&rig.workload().host, rig.workload().port);
    for (cluster, infra) in [("c1", &older), ("c2", &newer)] {
        rig.env
            .apply(&cluster_yaml_of(&rig.ns, cluster, infra, &shape), Some(&rig.ns))
            .await
            .expect("cluster objects apply");
    }
    let vms: Api<DynamicObject> = Api::namespaced_with(
        rig.env.client(),
        &rig.ns,
        &api_resource("kairon.zyvor.dev", "v1alpha1", "Machine", "machines"),
    );
    let kms = rig.kms();
    let of = |cluster: &'static str| ListParams::default().labels(&format!("cluster.x-k8s.io/cluster-name={cluster}"));

    let created = rig
        .wait(
            "c1's control plane has a Kairon Machine in v1alpha1",
            Duration::from_secs(180),
            || async {
                let list = vms.list(&of("c1")).await?;
                Ok::<_, kube::Error>(list.items.into_iter().next())
            },
        )
        .await;
    assert_eq!(
        created.data["spec"]["image"]["path"], "/var/lib/kairon/images/ubuntu.qcow2",
        "the boot disk is kept: the older schema has it"
    );
    assert!(
        created.data["spec"]["placement"]["antiAffinity"].is_array(),
        "required anti-affinity is kept"
    );

    let refused = rig
        .wait(
            "c2's control plane KaironMachine says KaironFieldUnsupported",
            Duration::from_secs(180),
            || async {
                let list = kms.list(&of("c2")).await?;
                Ok::<_, kube::Error>(list.items.into_iter().find_map(|km| {
                    let c = conditions::get(km.status.as_ref()?.conditions.as_deref()?, INSTANCE_PROVISIONED)?;
                    (c.reason == reason::KAIRON_FIELD_UNSUPPORTED).then(|| (km.clone(), c.clone()))
                }))
            },
        )
        .await;
    let (km, condition) = refused;
    assert_eq!(condition.status, "False");
    for named in [
        "spec.image.imageRef (Kairon v0.8.0 has it)",
        "spec.image.diskSize (Kairon v0.8.0 has it)",
        "spec.placement.preferredAntiAffinity (Kairon v0.5.0 has it)",
        "kairon.zyvor.dev/v1alpha1",
    ] {
        assert!(condition.message.contains(named), "{named}: {}", condition.message);
    }
    let status = km.status.unwrap();
    assert_eq!(status.failure_reason(), Some("InvalidConfiguration"));
    // Terminal: a resync later there is still no VM for it.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        vms.list(&of("c2")).await.unwrap().items.is_empty(),
        "no Kairon Machine is created without the fields it needs"
    );
}
