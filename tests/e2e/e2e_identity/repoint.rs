//! An identity repointed to another Kairon API: no VM lost.

use super::*;

/// Marks every KaironMachine of `cluster` changed, so that each is reconciled now rather than
/// at its next resync (nothing else triggers one when an identity names another server: the
/// new server's watch has none of their VMs).
async fn poke_kms(rig: &Rig, cluster: &str) {
    let now = format!("{:?}", std::time::SystemTime::now());
    for km in kms_of(rig, cluster).await {
        let _ = rig
            .kms()
            .patch(
                &km.metadata.name.unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"test.kairon/poke": now}}})),
            )
            .await;
    }
}

/// `status.instance` of KaironMachine `name`, as stored (whatever our types know of it).
async fn instance_as_stored(rig: &Rig, name: &str) -> Value {
    let kms: Api<kube::api::DynamicObject> = Api::namespaced_with(
        rig.env.client(),
        &rig.ns,
        &capkr_testenv::infrastructure_resource("KaironMachine", "kaironmachines"),
    );
    kms.get(name).await.expect("KaironMachine").data["status"]["instance"].clone()
}

/// Repointing an identity: the Secret of a running cluster's identity is changed to name the
/// other Kairon API. The VMs live on where they were created, so the machines report that
/// their endpoint changed, keep their last known status (no InstanceNotFound, no Machine
/// remediated by the MachineHealthCheck, which replaces a machine whose infrastructure is not
/// ready for 5 s), and a deleted machine keeps its finalizer while its VM lives on the old
/// server; pointing the identity back makes everything Ready again and lets the deletion
/// finish there. Without the recorded endpoint the machines read as InstanceNotFound on the
/// new server, and a deletion released its finalizer with the VM running on the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repointing_an_identity_to_another_kairon_api_loses_no_vm() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let rig = Rig::start(RigOptions {
        create: false,
        ..RigOptions::new("identity_repoint")
    })
    .await;
    let mut started = Started::new(&rig.env);
    assert_nothing_left(&rig).await;
    let kairon_a = started.keep(rig.env.kairon_api(&rig.ns, "kairon-a").await.expect("Kairon API a"));
    let kairon_b = started.keep(rig.env.kairon_api(&rig.ns, "kairon-b").await.expect("Kairon API b"));
    let _sims = simulators_for(&rig, &[&kairon_a, &kairon_b]);
    let secrets: Api<Secret> = Api::namespaced(rig.env.client(), &rig.ns);
    secrets
        .create(
            &PostParams::default(),
            &identity_secret("identity-a", &kubeconfig(&kairon_a, None)),
        )
        .await
        .expect("identity-a");
    let shape = ClusterOptions {
        workers: 1,
        cp_failure_domain: None,
        md_failure_domain: None,
        health_check: true,
    };
    let yaml = cluster_of_shape_with_identity(&rig, "c1", rig.workload(), "Secret", "identity-a", &shape);
    rig.env.apply(&yaml, Some(&rig.ns)).await.expect("cluster apply");
    wait_cluster_running(&rig, "c1", 2).await;
    let machine_uids = || async {
        let mut uids: Vec<String> = rig
            .machines()
            .list(&ListParams::default())
            .await
            .expect("list Machines")
            .items
            .into_iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter_map(|m| m.metadata.uid)
            .collect();
        uids.sort();
        uids
    };
    let machines_before = machine_uids().await;
    let vms_before = vms_on(&rig, &kairon_a).await;
    assert_eq!(vms_before.len(), 2, "{vms_before:?}");
    // Which endpoint holds each VM is recorded: server, TLS name and CA, as a fingerprint.
    let mut recorded = vec![];
    for km in kms_of(&rig, "c1").await {
        let instance = instance_as_stored(&rig, &km.metadata.name.unwrap()).await;
        recorded.push(instance["endpoint"].as_str().unwrap_or_default().to_string());
    }
    assert!(
        recorded.len() == 2 && !recorded[0].is_empty() && recorded[0] == recorded[1],
        "status.instance records the endpoint of a: {recorded:?}"
    );
    let repoint = |api: &WorkloadCluster| {
        let data = identity_secret("x", &kubeconfig(api, None)).data;
        let secrets = secrets.clone();
        async move {
            let mut s = secrets.get("identity-a").await.unwrap();
            s.data = data;
            secrets
                .replace("identity-a", &PostParams::default(), &s)
                .await
                .expect("repoint identity-a");
        }
    };

    // The identity now names b, where none of c1's VMs are.
    repoint(&kairon_b).await;
    let poked = std::sync::Mutex::new(std::time::Instant::now());
    let poke_now_and_then = || async {
        let due = {
            let mut at = poked.lock().unwrap();
            let due = at.elapsed() >= Duration::from_secs(3);
            if due {
                *at = std::time::Instant::now();
            }
            due
        };
        if due {
            poke_kms(&rig, "c1").await;
        }
    };
    let never_gone = |kms: &[KaironMachine]| {
        for km in kms {
            if let Some((reason, message)) = common::km_instance(km)
                && reason == "InstanceNotFound"
            {
                rig.fail(format!("{:?} reads as gone: {message}", km.metadata.name));
            }
        }
    };
    let message = rig
        .wait("c1's KaironMachines report the changed endpoint", LONG, || async {
            poke_now_and_then().await;
            let kms = kms_of(&rig, "c1").await;
            never_gone(&kms);
            let changed: Vec<String> = kms
                .iter()
                .filter_map(common::km_instance)
                .filter(|(r, _)| r == "InstanceEndpointChanged")
                .map(|(_, m)| m)
                .collect();
            (kms.len() == 2 && changed.len() == 2).then(|| changed[0].clone())
        })
        .await;
    assert!(message.contains("identity-a"), "names the identity: {message}");
    for km in kms_of(&rig, "c1").await {
        let status = km.status.clone().unwrap_or_default();
        assert_eq!(
            ready_reason(&km).as_deref(),
            Some("Unknown/InstanceEndpointChanged"),
            "{:?}",
            km.metadata.name
        );
        assert!(status.is_provisioned(), "the last known status is kept");
        assert!(
            status.instance.is_some_and(|i| i.uid.is_some()),
            "{:?}",
            km.metadata.name
        );
        assert!(!status.addresses.unwrap_or_default().is_empty());
    }
    // Longer than the MachineHealthCheck's 5 s: nothing remediated, no VM anywhere but on a.
    tokio::time::sleep(Duration::from_secs(10)).await;
    never_gone(&kms_of(&rig, "c1").await);
    assert_eq!(machine_uids().await, machines_before, "no Machine replaced");
    assert_eq!(vms_on(&rig, &kairon_a).await, vms_before);
    assert!(vms_on(&rig, &kairon_b).await.is_empty());

    // The worker is deleted: its deletion waits, with the reason, while its VM lives on a.
    scale(&rig, "c1", 0).await;
    let worker = rig
        .wait("the worker's KaironMachine is being deleted", LONG, || async {
            poke_now_and_then().await;
            let kms = kms_of(&rig, "c1").await;
            never_gone(&kms);
            kms.into_iter().find(|km| {
                km.metadata.deletion_timestamp.is_some()
                    && common::km_instance(km).is_some_and(|(r, _)| r == "InstanceEndpointChanged")
            })
        })
        .await;
    let worker_name = worker.metadata.name.clone().unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let worker = rig
        .kms()
        .get_opt(&worker_name)
        .await
        .unwrap()
        .unwrap_or_else(|| rig.fail("the worker's KaironMachine went while its VM lives on the old server"));
    assert!(
        worker
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == capkr::api::MACHINE_FINALIZER),
        "the finalizer is kept"
    );
    assert_eq!(vms_on(&rig, &kairon_a).await, vms_before, "both VMs live on a");

    // Pointed back: the deletion finishes on a, the control plane is Ready again.
    repoint(&kairon_a).await;
    rig.wait("the worker gone from a, the control plane Ready", LONG, || async {
        poke_now_and_then().await;
        let kms = kms_of(&rig, "c1").await;
        never_gone(&kms);
        let a = vms_on(&rig, &kairon_a).await;
        kms.len() == 1 && a.len() == 1 && kms.iter().all(|km| ready_reason(km).as_deref() == Some("True/Ready"))
    })
    .await;
    wait_cluster_running(&rig, "c1", 1).await;
    assert!(vms_on(&rig, &kairon_b).await.is_empty());
    let cp = kms_of(&rig, "c1").await.remove(0);
    let instance = instance_as_stored(&rig, &cp.metadata.name.unwrap()).await;
    assert_eq!(instance["endpoint"].as_str(), Some(recorded[0].as_str()), "a, still");
    assert!(rig.manager.is_running());
    leave_nothing(&rig, &[]).await;
}
