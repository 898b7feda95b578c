//! A KubeadmConfig's commands on a Kairon guest, against the real control plane: CABPK writes
//! them into cloud-init's `runcmd`, the provider carries them into the Kairon Machine, and the
//! simulator's guest runs them for real (`--guest-scripts-dir`: FluxVM's `bash -lc` per
//! `runCmd` entry, in a sandbox whose disk is the VM's directory). Shell state holds from one
//! command to the next as under cloud-init, and none of the commands shows in logs, events or
//! conditions.

use std::time::Duration;

use crate::common::{Rig, RigOptions};
use kube::ResourceExt;
use kube::api::ListParams;

/// Commands that only work as one script: a variable, and a working directory.
const POST: &str = "  postKubeadmCommands:\n  - export X=1\n  - test \"$X\" = 1 && touch /tmp/ok\n";
const WORKER_COMMANDS: &str = "      preKubeadmCommands:\n      - cd /tmp\n      - STAGE=pre-kubeadm-7f3e\n      postKubeadmCommands:\n      - test \"$STAGE\" = pre-kubeadm-7f3e && touch pre-state-held\n";

#[tokio::test(flavor = "multi_thread")]
async fn kubeadm_config_commands_share_one_shell_on_the_guest() {
    // The simulator runs the guests' commands under a directory of this test's.
    let scripts = std::env::temp_dir().join(format!("capkr-e2e-guest-scripts-{}", std::process::id()));
    let opts = RigOptions {
        workers: 1,
        create: false,
        sim_args: vec!["--guest-scripts-dir".into(), scripts.display().to_string()],
        ..RigOptions::new("e2e_guest_commands")
    };
    let rig = Rig::start(opts.clone()).await;
    let yaml = rig.manifests(&opts);
    let yaml = insert_after(&yaml, "kind: KubeadmConfig\n", "spec:\n", POST);
    let yaml = insert_after(&yaml, "kind: KubeadmConfigTemplate\n", "    spec:\n", WORKER_COMMANDS);
    rig.env
        .apply(&yaml, Some(&rig.ns))
        .await
        .expect("cluster objects apply");

    rig.wait_running(2, Duration::from_secs(240)).await;
    let vms = rig.vm_map().await;
    let uid_of = |prefix: &str| {
        vms.iter()
            .find(|(name, _)| name.starts_with(prefix))
            .and_then(|(_, vm)| vm.uid())
            .unwrap_or_else(|| panic!("a Kairon Machine {prefix}*"))
    };
    let cp = scripts.join(uid_of("c1-control-plane")).join("root");
    let worker = scripts.join(uid_of("c1-md-0")).join("root");
    let ok = cp.join("tmp/ok");
    let held = worker.join("tmp/pre-state-held");
    let ran = async {
        for _ in 0..120 {
            if ok.exists() && held.exists() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        false
    };
    if !ran.await {
        // What the guests did, by file names only (their output may hold bootstrap data).
        let names = |dir: &std::path::Path| {
            std::fs::read_dir(dir)
                .map(|d| {
                    d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        };
        let called = |root: &std::path::Path| root.join("run/kairon-sim/kubeadm-called").exists();
        panic!(
            "the guests' post-kubeadm commands did not hold their shell state within 60s: control plane /tmp {:?} (kubeadm called: {}), worker /tmp {:?} (kubeadm called: {})",
            names(&cp.join("tmp")),
            called(&cp),
            names(&worker.join("tmp")),
            called(&worker)
        );
    }

    // The commands are bootstrap data: in no log, event or condition.
    let secret_bits = ["pre-kubeadm-7f3e", "touch /tmp/ok"];
    for p in [&rig.sim, &rig.manager] {
        let log = std::fs::read_to_string(p.log_path()).unwrap_or_default();
        for bit in secret_bits {
            assert!(!log.contains(bit), "{} log shows a bootstrap command", p.name());
        }
    }
    let events: kube::Api<k8s_openapi::api::core::v1::Event> = kube::Api::namespaced(rig.env.client(), &rig.ns);
    let events = serde_json::to_string(&events.list(&ListParams::default()).await.unwrap().items).unwrap();
    let kms = serde_json::to_string(&rig.kms().list(&ListParams::default()).await.unwrap().items).unwrap();
    for bit in secret_bits {
        assert!(!events.contains(bit), "an event shows a bootstrap command");
        assert!(!kms.contains(bit), "a KaironMachine shows a bootstrap command");
    }
    drop(rig);
    let _ = std::fs::remove_dir_all(&scripts);
}

/// `text` with `insert` after the first `anchor` that follows the first `after`.
fn insert_after(text: &str, after: &str, anchor: &str, insert: &str) -> String {
    let from = text.find(after).unwrap_or_else(|| panic!("{after:?} in the manifests"));
    let at = from
        + text[from..]
            .find(anchor)
            .unwrap_or_else(|| panic!("{anchor:?} after {after:?}"))
        + anchor.len();
    format!("{}{insert}{}", &text[..at], &text[at..])
}
