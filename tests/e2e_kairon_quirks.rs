//! Kairon's free text (a failure's reason and message, which cloud-init errors can fill with
//! many lines quoted from the user-data) reaches our status and events bounded and cleaned,
//! against the real API server: events.k8s.io rejects a note over 1 KiB, so an unbounded
//! message meant a lost Warning event.

mod common;

use std::time::Duration;

use capkr::api::KaironMachine;
use capkr::api::conditions::{self, INSTANCE_PROVISIONED, reason};
use common::{Rig, RigOptions};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_multiline_failure_message_gives_a_bounded_condition_and_an_event() {
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

    // What Kairon might report when cloud-init fails: 6 KiB over many lines, with escapes.
    let quoted = "runcmd: kubeadm join --token abcdef.0123456789abcdef\n".repeat(120);
    let message = format!("cloud-init failed:\x1b[31m\n{quoted}");
    rig.vms()
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed", "reason": "CloudInitFailed", "message": message}})),
        )
        .await
        .unwrap();

    let km: KaironMachine = rig
        .wait("the KaironMachine reports InstanceFailed", UP, || async {
            let km = rig.kms().get(&name).await?;
            let failed = conditions::get(
                km.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_deref())
                    .unwrap_or_default(),
                INSTANCE_PROVISIONED,
            )
            .is_some_and(|c| c.reason == reason::INSTANCE_FAILED);
            Ok::<_, kube::Error>(failed.then_some(km))
        })
        .await;
    let status = km.status.unwrap();
    let c = conditions::get(status.conditions.as_deref().unwrap(), INSTANCE_PROVISIONED).unwrap();
    assert!(
        c.message.starts_with(&format!(
            "Kairon Machine {name} failed: CloudInitFailed: cloud-init failed:"
        )),
        "{}",
        c.message
    );
    assert!(c.message.len() <= 1024, "bounded: {} bytes", c.message.len());
    assert!(
        !c.message.contains('\n') && !c.message.contains('\x1b'),
        "cleaned: {:?}",
        c.message
    );
    let failure_message = status
        .deprecated
        .and_then(|d| d.v1beta1)
        .and_then(|v| v.failure_message)
        .unwrap();
    assert!(failure_message.len() <= 1024 && !failure_message.contains('\n'));

    let events: Api<Event> = Api::namespaced(rig.env.client(), &rig.ns);
    let event = rig
        .wait("a Warning event InstanceFailed for it", UP, || async {
            let list = events.list(&ListParams::default()).await?.items;
            Ok::<_, kube::Error>(list.into_iter().find(|e| {
                e.reason.as_deref() == Some("InstanceFailed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
            }))
        })
        .await;
    let note = event.note.unwrap_or_default();
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(note.contains("CloudInitFailed"), "{note}");
    assert!(note.len() <= 1024, "{} bytes", note.len());
    assert!(rig.manager.is_running());
}
