//! Kairon's MachineImages against the real control plane: the simulator resolves `imageRef`s
//! as kairon-controller does (`kairon-sim --machine-images`).
//!
//! - The control plane's KaironMachine names an image no MachineImage describes (a typo): Kairon
//!   keeps the Kairon Machine Pending with `waiting for MachineImage "…"` and no condition; the
//!   KaironMachine shows Kairon's words (`InstanceWaitingOnKairon`) within one reconcile of the
//!   simulator writing them. A MachineImage of that name of kind iso: Kairon's words change to
//!   `… is kind iso, need disk`, and so do ours. Replaced by one of kind disk: Kairon pins it,
//!   and the machine comes up.

use std::time::{Duration, Instant};

use crate::common::{Rig, RigOptions};
use capkr::api::KaironMachine;
use capkr::api::conditions::{self, INSTANCE_PROVISIONED, reason};
use capkr::kairon::machine_image::{MachineImage, MachineImageSource, MachineImageSpec};
use capkr_testenv::machine_image;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

const UP: Duration = Duration::from_secs(180);
/// What "within one reconcile" allows under load: the Kairon Machine's watch event and one
/// reconcile, not a resync.
const ONE_RECONCILE: Duration = Duration::from_secs(10);

fn instance(km: &KaironMachine) -> Option<(String, String)> {
    let c = conditions::get(km.status.as_ref()?.conditions.as_deref()?, INSTANCE_PROVISIONED)?;
    Some((c.reason.clone(), c.message.clone()))
}

/// Waits until the Kairon Machine's `status.message` says `kairon_says` and then until the
/// KaironMachine shows it; returns how long the second took.
async fn shown(rig: &Rig, kairon_says: &str) -> Duration {
    let (vms, kms) = (rig.vms(), rig.kms());
    let name = rig
        .wait(&format!("a Kairon Machine saying {kairon_says:?}"), UP, || async {
            let list = vms.list(&ListParams::default()).await?;
            let vm = list.items.into_iter().find(|vm| {
                let s = vm.status.as_ref();
                s.and_then(|s| s.message.as_deref()) == Some(kairon_says)
                    && s.and_then(|s| s.phase.as_deref()) == Some("Pending")
                    && s.and_then(|s| s.conditions.as_ref()).is_none_or(Vec::is_empty)
            });
            Ok::<_, kube::Error>(vm.map(|vm| vm.metadata.name.unwrap_or_default()))
        })
        .await;
    let seen = Instant::now();
    rig.wait(&format!("KaironMachine {name} showing {kairon_says:?}"), UP, || async {
        let km = kms.get(&name).await?;
        let said =
            instance(&km).is_some_and(|(r, m)| r == reason::INSTANCE_WAITING_ON_KAIRON && m.ends_with(kairon_says));
        Ok::<_, kube::Error>(said.then_some(()))
    })
    .await;
    seen.elapsed()
}

fn image(name: &str, kind: &str) -> MachineImage {
    MachineImage::new(
        name,
        MachineImageSpec {
            kind: Some(kind.into()),
            digest: format!("sha256:{}", "0".repeat(64)),
            source: MachineImageSource {
                http_url: Some(format!("https://images.example/{name}.img")),
                ..Default::default()
            },
            ..Default::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_kairon_cannot_resolve_is_shown_with_kairons_words_until_it_can() {
    let rig = Rig::start(RigOptions {
        workers: 0,
        sim_args: vec!["--machine-images".into()],
        ..RigOptions::new("e2e_machine_images")
    })
    .await;
    let name = machine_image();
    let images: Api<MachineImage> = Api::all(rig.env.client());
    // Cluster-scoped: no other test's simulator resolves images.
    let _ = images.delete(&name, &DeleteParams::default()).await;

    let took = shown(&rig, &format!("waiting for MachineImage {name:?}")).await;
    assert!(took < ONE_RECONCILE, "shown {took:?} after Kairon wrote it");

    images
        .create(&PostParams::default(), &image(&name, "iso"))
        .await
        .unwrap();
    let took = shown(&rig, &format!("MachineImage {name:?} is kind iso, need disk")).await;
    assert!(took < ONE_RECONCILE, "shown {took:?} after Kairon wrote it");

    images.delete(&name, &DeleteParams::default()).await.unwrap();
    rig.wait("the iso MachineImage gone", UP, || async {
        Ok::<_, kube::Error>(images.get_opt(&name).await?.is_none().then_some(()))
    })
    .await;
    images
        .create(&PostParams::default(), &image(&name, "disk"))
        .await
        .unwrap();
    rig.wait_running(1, UP).await;
    let vm = rig.vms().list(&ListParams::default()).await.unwrap().items;
    let pinned = vm[0].spec.image.as_ref().and_then(|i| i.digest.clone());
    assert_eq!(
        pinned,
        Some(format!("sha256:{}", "0".repeat(64))),
        "Kairon pinned the image"
    );
    images.delete(&name, &DeleteParams::default()).await.unwrap();
}
