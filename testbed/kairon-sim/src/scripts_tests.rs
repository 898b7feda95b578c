use std::time::Duration;

use capkr::kairon::cloud_init::{CloudInit, DEFAULT_MAX_DECODED_BYTES, GuestFacts, translate_cloud_config};

use super::*;
use crate::cloud_init::{meta, seed};

fn meta_data() -> MetaData {
    MetaData {
        instance_id: "cp-1".into(),
        local_hostname: "cp-1".into(),
    }
}

#[test]
fn the_guest_runs_runcmd_as_the_one_script_cloud_init_writes() {
    let data = "#cloud-config\nwrite_files:\n- {path: /etc/late, content: late, defer: true}\n- {path: /gate.sh, content: \"#!/bin/sh\\n\", permissions: '0755'}\n- {path: etc/hosts, content: \"10.0.0.1 api\\n\", append: true}\nruncmd:\n  - export X=1\n  - [ bash, -lc, \"echo it's\" ]\n  - [ kubeadm, join, 3 ]\n";
    let boot = guest_boot(data, &meta_data());
    assert_eq!(
        boot.runcmd.as_deref(),
        Some("#!/bin/sh\nexport X=1\n'bash' '-lc' 'echo it'\\''s'\n'kubeadm' 'join' '3'\n")
    );
    let files: Vec<(&str, u32, bool)> = boot.files.iter().map(|f| (f.path.as_str(), f.mode, f.append)).collect();
    assert_eq!(
        files,
        [
            ("/gate.sh", 0o755, false),
            ("/etc/hosts", 0o644, true),
            ("/etc/late", 0o644, false)
        ],
        "deferred files last"
    );
    assert_eq!(
        guest_boot("#cloud-config\nwrite_files: []\n", &meta_data()).runcmd,
        None
    );
    assert_eq!(guest_boot("{\"ignition\": {}}", &meta_data()), GuestBoot::default());
}

#[test]
fn guest_paths_follow_the_hosts_directory_links() {
    let root = Path::new("/vm/root");
    // On a merged-/usr host `/bin` is a link: the guest's /bin/tool is /usr/bin/tool.
    let bin = std::fs::canonicalize("/bin").unwrap();
    assert_eq!(
        in_upper_layer(root, "/bin/tool"),
        Some(root.join(bin.strip_prefix("/").unwrap()).join("tool"))
    );
    assert_eq!(in_upper_layer(root, "/run/new/dir/f"), Some(root.join("run/new/dir/f")));
    assert_eq!(in_upper_layer(root, "/etc/../x"), None);
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kairon-sim-scripts-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Advances the VM until `want`, for at most ten seconds.
async fn advance_until(scripts: &GuestScripts, uid: &str, ci: &CloudInit, want: Progress) {
    let seed = seed(ci).expect("a seed");
    for _ in 0..200 {
        if scripts.advance(uid, "m", &seed.user_data, &meta(ci)).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{uid}: not {want:?} after 10s; log: {:?}",
        std::fs::read_to_string(scripts.dir.join(uid).join("runcmd.log"))
    );
}

/// Waits until the VM's script has exited (its `done` file is written last).
async fn wait_for(path: &Path) {
    for _ in 0..200 {
        if path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn translated(runcmd: &str) -> CloudInit {
    translate_cloud_config(
        &format!("#cloud-config\nruncmd:\n{runcmd}"),
        &GuestFacts::kairon("m"),
        DEFAULT_MAX_DECODED_BYTES,
    )
    .unwrap()
}

#[tokio::test]
async fn an_export_holds_for_the_next_entry_only_in_one_script() {
    let dir = scratch("export");
    let scripts = GuestScripts::new(dir.clone());
    // What the bridge once wrote: an entry per runcmd entry, each its own `bash -lc` on
    // FluxVM.
    let split = CloudInit {
        hostname: "m".into(),
        run_cmd: vec![
            "export X=1".into(),
            "test \"$X\" = 1 && touch /tmp/ok".into(),
            "touch /tmp/done".into(),
        ],
        ..Default::default()
    };
    let one = translated("  - export X=1\n  - test \"$X\" = 1 && touch /tmp/ok\n  - touch /tmp/done\n");
    for (uid, ci, want) in [("split", &split, false), ("one", &one, true)] {
        advance_until(&scripts, uid, ci, Progress::Done).await;
        let tmp = guest_root(&dir, uid).join("tmp");
        wait_for(&tmp.join("done")).await;
        assert!(tmp.join("done").exists(), "{uid}: the commands ran");
        assert_eq!(tmp.join("ok").exists(), want, "{uid}");
    }
    scripts.stop("split").await;
    scripts.stop("one").await;
    assert!(!dir.join("one").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_guest_never_touches_the_host() {
    let dir = scratch("host");
    let scripts = GuestScripts::new(dir.clone());
    let pid = std::process::id();
    let probe = format!("/capkr-sandbox-probe-{pid}");
    let ci = translated(&format!(
        "  - touch {probe} /etc/capkr-sandbox-probe-{pid} /usr/bin/capkr-sandbox-probe-{pid}\n  - echo 3 > /proc/sys/vm/drop_caches || touch /tmp/sysctl-refused\n  - kill -0 {pid} || touch /tmp/host-pid-unseen\n  - mount -t tmpfs t /mnt || touch /tmp/mount-refused\n  - \"printf '#!/bin/sh\\\\ntouch /tmp/executed\\\\n' > /run/x && chmod 755 /run/x && /run/x || touch /tmp/run-noexec\"\n  - touch /tmp/done\n"
    ));
    advance_until(&scripts, "vm", &ci, Progress::Done).await;
    let root = guest_root(&dir, "vm");
    wait_for(&root.join("tmp/done")).await;
    for refused in [
        "sysctl-refused",
        "host-pid-unseen",
        "mount-refused",
        "run-noexec",
        "done",
    ] {
        assert!(root.join("tmp").join(refused).exists(), "{refused}");
    }
    assert!(
        std::fs::metadata(root.join("run/x")).is_ok_and(|m| m.permissions().mode() & 0o111 != 0),
        "an executable script in /run"
    );
    assert!(!root.join("tmp/executed").exists(), "the guest's /run is noexec");
    let usr_bin = std::fs::canonicalize("/usr/bin").unwrap();
    for path in [
        probe.clone(),
        format!("/etc/capkr-sandbox-probe-{pid}"),
        format!("{}/capkr-sandbox-probe-{pid}", usr_bin.display()),
    ] {
        assert!(!Path::new(&path).exists(), "{path} written on the host");
        assert!(
            root.join(path.trim_start_matches('/')).exists(),
            "{path} in the guest's disk"
        );
    }
    scripts.stop("vm").await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn kubeadm_waits_for_the_commands_before_it_and_the_ones_after_run_on() {
    let dir = scratch("kubeadm");
    let scripts = GuestScripts::new(dir.clone());
    // As the KCP remediation flavor: a written script gates kubeadm.
    let data = "#cloud-config\nwrite_files:\n- path: /gate.sh\n  permissions: '0755'\n  content: |\n    #!/bin/sh\n    while [ ! -f /tmp/go ]; do sleep 0.05; done\nruncmd:\n  - ./gate.sh\n  - kubeadm join --token SECRET-TOKEN\n  - touch /tmp/after\n  - sleep 600\n";
    let ci = translate_cloud_config(data, &GuestFacts::kairon("m"), DEFAULT_MAX_DECODED_BYTES).unwrap();
    advance_until(&scripts, "vm", &ci, Progress::Running).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seed = seed(&ci).unwrap();
    assert_eq!(
        scripts.advance("vm", "m", &seed.user_data, &meta(&ci)).await,
        Progress::Running
    );
    let root = guest_root(&dir, "vm");
    std::fs::write(root.join("tmp/go"), "").unwrap();
    advance_until(&scripts, "vm", &ci, Progress::Done).await;
    wait_for(&root.join("tmp/after")).await;
    assert!(root.join("tmp/after").exists(), "post-kubeadm commands run");
    let log = std::fs::read_to_string(dir.join("vm/runcmd.log")).unwrap();
    assert!(!log.contains("SECRET-TOKEN"), "kubeadm's arguments are not logged");
    // The `sleep 600` is killed with the VM.
    let pid = {
        let vms = scripts.vms.lock().await;
        vms["vm"].running.as_ref().and_then(Child::id).unwrap()
    };
    scripts.stop("vm").await;
    assert!(!dir.join("vm").exists());
    let mut alive = true;
    for _ in 0..50 {
        alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
        });
        if !alive {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!alive, "the stopped VM's commands still run");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn cabpks_commands_reach_kubeadm_and_run_after_it_from_the_bridges_one_script() {
    let dir = scratch("cabpk");
    let scripts = GuestScripts::new(dir.clone());
    for name in ["control-plane-init.yaml", "worker-join.yaml"] {
        let path = format!("{}/testdata/cabpk/{name}", env!("CARGO_MANIFEST_DIR"));
        let data = std::fs::read_to_string(&path).unwrap();
        let ci = translate_cloud_config(&data, &GuestFacts::kairon("m"), DEFAULT_MAX_DECODED_BYTES).unwrap();
        advance_until(&scripts, name, &ci, Progress::Done).await;
        let root = guest_root(&dir, name);
        assert!(
            root.join(KUBEADM_CALLED.trim_start_matches('/')).exists(),
            "{name}: kubeadm called"
        );
        // CABPK's `kubeadm … && echo success > /run/cluster-api/bootstrap-success.complete`.
        let success = root.join("run/cluster-api/bootstrap-success.complete");
        wait_for(&success).await;
        assert!(success.exists(), "{name}: the command after kubeadm ran");
    }
    // The worker's `systemctl restart containerd` fails in the guest; the rest goes on.
    let post = guest_root(&dir, "worker-join.yaml").join("run/post.log");
    wait_for(&post).await;
    assert_eq!(std::fs::read_to_string(post).unwrap(), "post-kubeadm\n");
    let kube_vip = guest_root(&dir, "control-plane-init.yaml").join("etc/kubernetes/manifests/kube-vip.yaml");
    assert!(kube_vip.exists(), "the flavor's sed edits the guest's file");
    scripts.stop("control-plane-init.yaml").await;
    scripts.stop("worker-join.yaml").await;
    let _ = std::fs::remove_dir_all(&dir);
}
