//! When Kairon misbehaves, and when bootstrap data is bad: against the real CAPI controllers.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::{Rig, RigOptions, km_ready, km_spec};
use capkr::api::KaironMachine;
use capkr::api::conditions::{self, INSTANCE_PROVISIONED, reason};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);

fn instance_reason(km: &KaironMachine) -> Option<String> {
    conditions::get(km.status.as_ref()?.conditions.as_deref()?, INSTANCE_PROVISIONED).map(|c| c.reason.clone())
}

/// Full updates from Kairon: the simulator rewrites Kairon Machines with full updates that drop
/// ownerReferences (as Kairon's controller can); links back are labels, so scaling down and
/// deleting the cluster still clean up every VM.
#[tokio::test(flavor = "multi_thread")]
async fn full_update_mode_keeps_cleanup_working() {
    let rig = Rig::start(RigOptions {
        workers: 2,
        sim_args: vec!["--full-update".into()],
        ..RigOptions::new("full_update")
    })
    .await;
    rig.wait_running(3, UP).await;
    for (name, vm) in rig.vm_map().await {
        assert!(vm.owner_references().is_empty(), "{name}: no ownerReferences");
        assert!(
            vm.labels().contains_key(capkr::kairon::labels::KAIRONMACHINE_UID),
            "{name}: labels survive full updates"
        );
    }
    rig.scale_and_settle(1, UP).await;
    rig.clusters()
        .delete(&rig.cluster, &DeleteParams::background())
        .await
        .unwrap();
    rig.wait("everything gone", UP, || async {
        Ok::<_, kube::Error>(
            rig.vms().list(&ListParams::default()).await?.items.is_empty()
                && rig.kcs().list(&ListParams::default()).await?.items.is_empty(),
        )
    })
    .await;
}

/// Failed and vanished VMs: a Kairon Machine whose runtime fails (FluxVM reports it failed,
/// which Kairon shows as phase `Unknown` and does not repair) makes its KaironMachine
/// `Ready=False, InstanceStateUnknown`, not a terminal failure: whether to replace it is the
/// MachineHealthCheck's call. One deleted out of band makes it `Ready=False, InstanceNotFound`
/// and is not re-created. A MachineHealthCheck remediates both and the MachineDeployment
/// replaces them.
#[tokio::test(flavor = "multi_thread")]
async fn failed_and_vanished_vms_are_reported_and_remediated() {
    let rig = Rig::start(RigOptions {
        workers: 2,
        health_check: true,
        ..RigOptions::new("remediation")
    })
    .await;
    // The MHC would remediate within seconds; stop it from doing so until we have looked, and
    // before the workers are chosen: under load a worker was remediated while the cluster came
    // up, and the VM picked for the fault was already gone.
    let mhcs: kube::Api<DynamicObject> = kube::Api::namespaced_with(
        rig.env.client(),
        &rig.ns,
        &capkr_testenv::capi_resource("MachineHealthCheck", "machinehealthchecks"),
    );
    let mhc_name = format!("{}-md-0", rig.cluster);
    mhcs.patch(
        &mhc_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}})),
    )
    .await
    .unwrap();
    // Only once CAPI's controller says so has it seen the annotation: a fault injected before
    // that was remediated at once under load (both Machines replaced within 4 s, and the
    // vanished VM's KaironMachine gone before it could be looked at).
    rig.wait("the MachineHealthCheck says it is paused", UP, || async {
        let mhc = mhcs.get(&mhc_name).await?;
        Ok::<_, kube::Error>(crate::common::condition(&mhc, "Paused").is_some_and(|c| c["status"] == "True"))
    })
    .await;
    let machines = rig.wait_running(3, UP).await;
    let workers: Vec<String> = machines
        .iter()
        .map(|m| m.name_any())
        .filter(|n| !n.contains("control-plane"))
        .collect();
    let (failing, vanishing) = (&workers[0], &workers[1]);

    rig.vms()
        .patch(
            failing,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"sim.kairon.zyvor.dev/fail": "DiskError"}}})),
        )
        .await
        .unwrap();
    rig.vms().delete(vanishing, &DeleteParams::default()).await.unwrap();

    let failed = rig
        .wait("the failed VM reported as not running", UP, || async {
            let km = rig.kms().get(failing).await?;
            Ok::<_, kube::Error>(
                (instance_reason(&km).as_deref() == Some(reason::INSTANCE_STATE_UNKNOWN)).then_some(km),
            )
        })
        .await;
    let status = failed.status.clone().unwrap();
    assert_eq!(
        status.failure_reason(),
        None,
        "not terminal: Kairon's Unknown is no failure"
    );
    assert!(status.is_provisioned(), "it was provisioned, and that stays");
    let ready = conditions::get(status.conditions.as_deref().unwrap(), "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reason::INSTANCE_STATE_UNKNOWN)
    );
    assert!(
        ready.message.contains("phase Unknown"),
        "Kairon's phase is in Ready: {}",
        ready.message
    );
    // CAPI mirrors it into the Machine, where the MachineHealthCheck's InfrastructureReady
    // check sees it.
    rig.wait("CAPI mirrors it into the Machine", UP, || async {
        let m = rig.machines().get(failing).await?;
        Ok::<_, kube::Error>(
            crate::common::condition(&m, "InfrastructureReady").map(|c| c["reason"].clone())
                == Some(reason::INSTANCE_STATE_UNKNOWN.into()),
        )
    })
    .await;

    rig.wait("the vanished VM reported as InstanceNotFound", UP, || async {
        let km = rig.kms().get(vanishing).await?;
        Ok::<_, kube::Error>(km_ready(&km) == Some(("False".into(), reason::INSTANCE_NOT_FOUND.into())))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        rig.vms().get_opt(vanishing).await.unwrap().is_none(),
        "a vanished VM is not re-created"
    );
    // CAPI mirrors it into the Machine.
    let m = rig.machines().get(vanishing).await.unwrap();
    assert_eq!(
        crate::common::condition(&m, "InfrastructureReady").map(|c| c["reason"].clone()),
        Some(reason::INSTANCE_NOT_FOUND.into())
    );

    // Let the MachineHealthCheck act: both Machines are replaced.
    mhcs.patch(
        &mhc_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": null}}})),
    )
    .await
    .unwrap();
    let replaced = rig
        .wait("both workers remediated and replaced", UP, || async {
            let list = rig.machines().list(&ListParams::default()).await?.items;
            let names: BTreeSet<String> = list.iter().map(|m| m.name_any()).collect();
            let running = list
                .iter()
                .filter(|m| m.data["status"]["phase"] == "Running" && m.metadata.deletion_timestamp.is_none())
                .count();
            Ok::<_, kube::Error>(
                (!names.contains(failing) && !names.contains(vanishing) && running == 3 && list.len() == 3)
                    .then_some(names),
            )
        })
        .await;
    assert_eq!(replaced.len(), 3);
    rig.wait("the failed VM cleaned up", UP, || async {
        Ok::<_, kube::Error>(rig.vms().get_opt(failing).await?.is_none())
    })
    .await;
    rig.assert_one_vm_per_kaironmachine().await;
}

/// Bad bootstrap data (ignition, no `value`, an oversized value, a missing Secret, a
/// cloud-config Kairon's structured cloudInit cannot carry) gives a clear condition each, creates nothing, never leaks the payload into logs, and the
/// manager keeps serving the healthy cluster next to it.
#[tokio::test(flavor = "multi_thread")]
async fn bad_bootstrap_data_gives_conditions_and_creates_nothing() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        ..RigOptions::new("bad_bootstrap")
    })
    .await;
    rig.wait_running(2, UP).await;
    let marker = "BOOTSTRAP-MARKER-7f3a9c";
    let big = format!("#cloud-config\n# {marker}\n{}", "x".repeat(600 * 1024));
    // (name, Secret data or no Secret, expected InstanceProvisioned reason)
    type Case<'a> = (&'a str, Option<Vec<(&'a str, String)>>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "bad-ignition",
            Some(vec![
                ("value", format!("{{\"ignition\":\"{marker}\"}}")),
                ("format", "ignition".into()),
            ]),
            reason::UNSUPPORTED_BOOTSTRAP_FORMAT,
        ),
        (
            "bad-novalue",
            Some(vec![("format", "cloud-config".into())]),
            reason::BOOTSTRAP_DATA_MISSING,
        ),
        (
            "bad-oversized",
            Some(vec![("value", big)]),
            reason::BOOTSTRAP_DATA_TOO_LARGE,
        ),
        ("bad-nosecret", None, reason::BOOTSTRAP_SECRET_NOT_FOUND),
        (
            "bad-bootcmd",
            Some(vec![(
                "value",
                format!("#cloud-config\nbootcmd:\n- echo {marker}\nruncmd:\n- kubeadm join\n"),
            )]),
            reason::UNSUPPORTED_BOOTSTRAP_DATA,
        ),
        (
            "bad-jinja",
            Some(vec![(
                "value",
                format!("## template: jinja\n#cloud-config\nruncmd:\n- \"{{% if ds %}}{marker}{{% endif %}}\"\n"),
            )]),
            reason::UNSUPPORTED_BOOTSTRAP_DATA,
        ),
    ];
    let secrets: kube::Api<Secret> = kube::Api::namespaced(rig.env.client(), &rig.ns);
    let machines = rig.machines();
    for (name, data, _) in &cases {
        let secret_name = format!("{name}-bootstrap");
        if let Some(data) = data {
            let mut s = Secret::default();
            s.metadata.name = Some(secret_name.clone());
            s.string_data = Some(data.iter().map(|(k, v)| (k.to_string(), v.clone())).collect());
            secrets.create(&PostParams::default(), &s).await.unwrap();
        }
        let km = KaironMachine::new(name, km_spec());
        rig.kms().create(&PostParams::default(), &km).await.unwrap();
        // A Machine with bootstrap data given directly (no bootstrap config), as the contract allows.
        let m: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": rig.ns, "labels": {"cluster.x-k8s.io/cluster-name": rig.cluster}},
            "spec": {"clusterName": rig.cluster, "version": capkr_testenv::KUBERNETES_VERSION,
                     "bootstrap": {"dataSecretName": secret_name},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironMachine", "name": name}}
        }))
        .unwrap();
        machines.create(&PostParams::default(), &m).await.unwrap();
    }
    for (name, _, want) in &cases {
        let km = rig
            .wait(&format!("{name}: InstanceProvisioned reason {want}"), UP, || async {
                let km = rig.kms().get(name).await?;
                Ok::<_, kube::Error>((instance_reason(&km).as_deref() == Some(*want)).then_some(km))
            })
            .await;
        let text = serde_json::to_string(&km.status).unwrap();
        assert!(
            !text.contains(marker),
            "{name}: the status never carries bootstrap data"
        );
        if *name == "bad-bootcmd" {
            assert!(
                text.contains("cloud-config key bootcmd has no Kairon equivalent"),
                "{name}: the condition names the key: {text}"
            );
            assert_eq!(
                km.status.as_ref().and_then(|s| s.failure_reason()),
                Some("InvalidConfiguration"),
                "{name}: terminal, as CAPI's contract has it"
            );
        }
    }
    // The manager keeps serving the healthy cluster: scale it and see the new worker run.
    rig.scale(2).await;
    rig.wait("the healthy cluster still served", UP, || async {
        let list = machines.list(&ListParams::default()).await?.items;
        let running = list.iter().filter(|m| m.data["status"]["phase"] == "Running").count();
        Ok::<_, kube::Error>(running == 3)
    })
    .await;
    assert!(rig.manager.is_running(), "the manager did not crash");
    let vms = rig.vm_map().await;
    for (name, _, _) in &cases {
        assert!(!vms.contains_key(*name), "{name}: no Kairon Machine created");
    }
    let log = std::fs::read_to_string(rig.manager.log_path()).unwrap();
    assert!(!log.contains(marker), "bootstrap data never reaches the manager's log");
    assert!(!log.contains("panicked"), "no panic");
}
