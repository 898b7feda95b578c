//! Kairon's power states against the real control plane and CAPI: `spec.powerState` on a
//! Kairon Machine (set by its operator, or by Kairon's own preemption) stops the VM without
//! deleting it, and Running brings back the same VM. The KaironMachine says so (with a Warning
//! each time), and nothing is replaced or created twice. (This rig's workload cluster has no
//! node lifecycle controller, so its Nodes stay Ready whatever the kubelet does; the Node going
//! NotReady and Ready again is proven in `e2e_templates`, whose control planes are real.)

use std::time::Duration;

use crate::common::{Rig, RigOptions, km_instance};
use capkr::api::conditions::reason;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_paused_halted_or_stopped_by_kairon_runs_again_as_the_same_machine() {
    let rig = Rig::start(RigOptions {
        workers: 1,
        ..RigOptions::new("power")
    })
    .await;
    let machines = rig.wait_running(2, UP).await;
    let worker = machines
        .iter()
        .map(|m| m.name_any())
        .find(|n| !n.contains("control-plane"))
        .expect("a worker Machine");
    let vm_uid = rig.vms().get(&worker).await.unwrap().uid();
    let machine_uid = rig.machines().get(&worker).await.unwrap().uid();
    let set_power = |state: &'static str| {
        let (vms, worker) = (rig.vms(), worker.clone());
        async move {
            vms.patch(
                &worker,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"powerState": state}})),
            )
            .await
            .unwrap_or_else(|e| panic!("powerState {state}: {e}"));
        }
    };

    for (state, said) in [
        ("Paused", "is paused"),
        ("Halted", "is halted"),
        ("Stopped", "is stopped"),
    ] {
        set_power(state).await;
        rig.wait(
            &format!("{state}: the KaironMachine says it does not run"),
            UP,
            || async {
                let km = rig.kms().get(&worker).await?;
                Ok::<_, kube::Error>(
                    km_instance(&km).is_some_and(|(r, m)| r == reason::INSTANCE_STOPPED && m.ends_with(said)),
                )
            },
        )
        .await;
        let vm = rig.vms().get(&worker).await.unwrap();
        assert_eq!(vm.status.as_ref().and_then(|s| s.phase.as_deref()), Some(state));
        let km = rig.kms().get(&worker).await.unwrap();
        let status = km.status.as_ref().unwrap();
        assert!(status.is_provisioned(), "{state}: provisioned stays true");
        assert_eq!(status.failure_reason(), None, "{state}: not a failure");

        set_power("Running").await;
        rig.wait(
            &format!("{state} -> Running: the KaironMachine provisioned again"),
            UP,
            || async {
                let km = rig.kms().get(&worker).await?;
                Ok::<_, kube::Error>(km_instance(&km).is_some_and(|(r, _)| r == reason::PROVISIONED))
            },
        )
        .await;
        let vm = rig.vms().get(&worker).await.unwrap();
        assert_eq!(vm.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
        assert_eq!(
            rig.vms().get(&worker).await.unwrap().uid(),
            vm_uid,
            "{state}: the same Kairon Machine"
        );
        assert_eq!(
            rig.machines().get(&worker).await.unwrap().uid(),
            machine_uid,
            "{state}: the same Machine, not a replacement"
        );
    }
    rig.assert_one_vm_per_kaironmachine().await;

    // A Warning each time it stopped running, saying how.
    let events: Api<Event> = Api::namespaced(rig.env.client(), &rig.ns);
    let mut notes: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("InstanceNotRunning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(worker.as_str())
        })
        .inspect(|e| assert_eq!(e.type_.as_deref(), Some("Warning")))
        .filter_map(|e| e.note)
        .collect();
    notes.sort();
    let want: Vec<String> = ["halted", "paused", "stopped"]
        .iter()
        .map(|how| format!("InstanceStopped: Kairon Machine {worker} is {how}"))
        .collect();
    assert_eq!(notes, want);
}
