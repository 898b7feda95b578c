use super::*;

/// The script the translation writes for `runcmd`, and the commands Kairon runs.
pub(super) fn runcmd_script(ci: &CloudInit) -> Option<&str> {
    assert!(RUNCMD_SCRIPT.starts_with(STAGING_DIR));
    let file = ci.write_files.iter().find(|f| f.path == RUNCMD_SCRIPT)?;
    assert_eq!(file.permissions, "0700", "cloud-init writes its runcmd script 0700");
    Some(&file.content)
}

#[test]
fn runcmd_is_one_sh_script_as_cloud_init_writes_it() {
    let long = format!("echo {}", "x".repeat(100 * 1024));
    let cases: &[(&str, String, &str)] = &[
        (
            "strings verbatim, in order",
            "runcmd:\n  - export KUBECONFIG=/etc/kubernetes/admin.conf\n  - cd /root\n  - kubectl apply -f x.yaml\n"
                .into(),
            "#!/bin/sh\nexport KUBECONFIG=/etc/kubernetes/admin.conf\ncd /root\nkubectl apply -f x.yaml\n",
        ),
        (
            "lists quoted word by word, integers as text",
            "runcmd:\n  - [ kubeadm, join, \"it's\", 3 ]\n  - echo after\n".into(),
            "#!/bin/sh\n'kubeadm' 'join' 'it'\\''s' '3'\necho after\n",
        ),
        (
            "a heredoc keeps its lines",
            "runcmd:\n  - \"cat <<EOF > /x\\nline\\nEOF\"\n  - echo done\n".into(),
            "#!/bin/sh\ncat <<EOF > /x\nline\nEOF\necho done\n",
        ),
        ("an empty list runs nothing", "runcmd: []\n".into(), ""),
    ];
    for (what, runcmd, want) in cases {
        let got = translate(&format!("#cloud-config\n{runcmd}")).unwrap();
        if want.is_empty() {
            assert_eq!(runcmd_script(&got), None, "{what}");
            assert!(got.run_cmd.is_empty(), "{what}");
            continue;
        }
        assert_eq!(runcmd_script(&got), Some(*want), "{what}");
        // Kairon's runCmd hands the script to `sh`, the interpreter its `#!/bin/sh` names
        // when cloud-init's scripts_user executes it (`/run` is `noexec` on the guest).
        assert_eq!(got.run_cmd, [format!("sh '{RUNCMD_SCRIPT}'")], "{what}");
    }
    let got = translate(&format!("#cloud-config\nruncmd:\n  - {long}\n")).unwrap();
    assert_eq!(runcmd_script(&got), Some(format!("#!/bin/sh\n{long}\n").as_str()));
}

/// Runs the translated script with `sh`, in a fresh directory, as the guest would.
fn run_script(runcmd: &str) -> (std::path::PathBuf, std::process::Output) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "capkr-runcmd-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let ci = translate(&format!("#cloud-config\nruncmd:\n{runcmd}")).unwrap();
    let script = dir.join("runcmd");
    std::fs::write(&script, runcmd_script(&ci).expect("a script")).unwrap();
    let out = std::process::Command::new("sh")
        .arg(&script)
        .current_dir(&dir)
        .output()
        .unwrap();
    (dir, out)
}

#[test]
fn shell_state_holds_from_one_entry_to_the_next_and_a_failing_entry_stops_nothing() {
    // cloud-init's script has no `set -e`: a failing line is followed by the next, and the
    // script's status is its last line's.
    let (dir, out) = run_script(
        "  - export X=1\n  - Y=2\n  - mkdir sub && cd sub\n  - 'false'\n  - test \"$X$Y\" = 12 && touch ok\n",
    );
    assert!(out.status.success());
    assert!(
        dir.join("sub/ok").exists(),
        "export, assignment and cd hold; false stops nothing"
    );
    let (dir2, out) = run_script("  - touch first\n  - exit 3\n  - touch never\n");
    assert_eq!(out.status.code(), Some(3));
    assert!(dir2.join("first").exists() && !dir2.join("never").exists());
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(dir2);
}
