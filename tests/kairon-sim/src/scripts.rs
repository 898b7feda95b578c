//! With `--guest-scripts-dir`: the guest runs, before kubeadm, the pre-kubeadm commands of its
//! cloud-init `runcmd` that call a script its own `write_files` wrote (`./wait-signal.sh …`,
//! as upstream's KCP remediation flavor gates kubeadm on a signal). Each VM gets a directory
//! under the given one standing in for its root: the referenced scripts are written there,
//! and the commands run there with `sh -c`, one after the other, as cloud-init's runcmd
//! would. kubeadm (and so the Node, and on a control-plane VM its etcd and API server) waits
//! until they have exited. The VM's commands are killed when its Machine goes.
//!
//! Any other command is not run: the test host is not the guest, and commands such as the
//! shipped flavors' `sed -i … /etc/kubernetes/…` must never touch it. Only the scripts a
//! command names are written out — never the kubeadm files, which hold the cluster's keys.
//! Neither user-data nor command lines are logged.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use crate::guest::{self, MetaData};

/// One pre-kubeadm command that runs a written script: the script's path as written
/// (`/wait-signal.sh`), its content, and the command line as cloud-init would run it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptCommand {
    pub script_path: String,
    pub script: String,
    pub command: String,
}

/// The pre-kubeadm commands of `user_data` that call a script written by its `write_files`,
/// in order: the `runcmd` entries before the first that runs `kubeadm`, whose first word is
/// `./<path>` or `/<path>` of a written file. An unreadable user-data has none.
pub fn pre_kubeadm_scripts(user_data: &str, meta: &MetaData) -> Vec<ScriptCommand> {
    let Ok(files) = guest::written_files(user_data, meta) else {
        return Vec::new();
    };
    let rendered = guest::render(user_data, meta);
    let Ok(doc) = serde_saphyr::from_str::<serde_json::Value>(&rendered) else {
        return Vec::new();
    };
    let commands: Vec<String> = doc
        .get("runcmd")
        .and_then(serde_json::Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|c| match c {
            serde_json::Value::String(s) => Some(s.clone()),
            // The list form (exec without a shell): a shell's `-c`/`-lc` command as that
            // command (FluxVM writes each of Kairon's runCmd entries as `[bash, -lc, X]`),
            // any other joined, as far as the first word goes.
            serde_json::Value::Array(words) => {
                let words: Vec<&str> = words.iter().filter_map(serde_json::Value::as_str).collect();
                Some(match words.as_slice() {
                    [shell, flag, command] if is_shell(shell) && matches!(*flag, "-c" | "-lc") => command.to_string(),
                    _ => words.join(" "),
                })
            }
            _ => None,
        })
        .collect();
    commands
        .iter()
        .take_while(|c| !runs_kubeadm(c))
        .filter_map(|c| {
            let first = c.split_whitespace().next()?;
            // cloud-init runs runcmd from `/`: `./x` is `/x`.
            let path = first.strip_prefix('.').unwrap_or(first);
            if !path.starts_with('/') || path.split('/').any(|part| part == "..") {
                return None;
            }
            let (script_path, script) = files.iter().find(|(p, _)| p == path)?;
            Some(ScriptCommand {
                script_path: script_path.clone(),
                script: script.clone(),
                command: c.clone(),
            })
        })
        .collect()
}

fn is_shell(word: &str) -> bool {
    matches!(word, "bash" | "sh" | "/bin/bash" | "/bin/sh" | "/usr/bin/bash")
}

fn runs_kubeadm(command: &str) -> bool {
    command
        .split(|ch: char| ch.is_whitespace() || ch == ';' || ch == '&' || ch == '|')
        .any(|w| w == "kubeadm" || w.ends_with("/kubeadm"))
}

/// Where a VM's pre-kubeadm commands stand.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// All have exited (or there are none): kubeadm may run.
    Done,
    /// One is still running.
    Running,
}

struct VmScripts {
    dir: PathBuf,
    pending: Vec<ScriptCommand>,
    running: Option<Child>,
    /// Commands started so far, for the log.
    started: usize,
}

impl Drop for VmScripts {
    fn drop(&mut self) {
        if let Some(child) = &mut self.running {
            kill_group(child);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Kills the command's process group (the shell and what it started).
fn kill_group(child: &mut Child) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) with a negative pid signals the process group we created for it.
        unsafe {
            libc::kill(-(pid as i32), libc::SIGKILL);
        }
    }
    let _ = child.start_kill();
}

/// The pre-kubeadm commands of every VM, keyed by Machine uid.
pub struct GuestScripts {
    dir: PathBuf,
    vms: Mutex<HashMap<String, VmScripts>>,
}

impl GuestScripts {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            vms: Mutex::default(),
        }
    }

    /// Starts the VM's next command when the previous one has exited; `Done` once none is
    /// left. Called again until it is. A command that cannot start is skipped (logged), as
    /// cloud-init's runcmd goes on after a failing command.
    pub async fn advance(&self, uid: &str, machine: &str, user_data: &str, meta: &MetaData) -> Progress {
        let mut vms = self.vms.lock().await;
        let vm = vms.entry(uid.to_string()).or_insert_with(|| VmScripts {
            dir: self.dir.join(uid),
            pending: pre_kubeadm_scripts(user_data, meta),
            running: None,
            started: 0,
        });
        loop {
            if let Some(child) = &mut vm.running {
                match child.try_wait() {
                    Ok(None) => return Progress::Running,
                    Ok(Some(status)) => {
                        tracing::info!(machine, command = vm.started, %status, "guest pre-kubeadm command exited");
                    }
                    Err(e) => tracing::warn!(machine, error = %e, "waiting for a guest pre-kubeadm command"),
                }
                vm.running = None;
            }
            if vm.pending.is_empty() {
                return Progress::Done;
            }
            let next = vm.pending.remove(0);
            vm.started += 1;
            match start(&vm.dir, &next) {
                Ok(child) => {
                    tracing::info!(machine, command = vm.started, script = %next.script_path, "guest runs a pre-kubeadm command; kubeadm waits for it");
                    vm.running = Some(child);
                }
                Err(e) => {
                    tracing::warn!(machine, script = %next.script_path, error = %e, "guest pre-kubeadm command did not start")
                }
            }
        }
    }

    /// The Machine is gone: its commands are killed and its directory removed.
    pub async fn stop(&self, uid: &str) {
        if self.vms.lock().await.remove(uid).is_some() {
            tracing::info!(uid, "guest pre-kubeadm commands stopped");
        }
    }
}

/// Writes the script under `root` (standing in for `/`) and starts the command there, in its
/// own process group; output goes to `root/runcmd.log`.
fn start(root: &std::path::Path, cmd: &ScriptCommand) -> std::io::Result<Child> {
    use std::os::unix::fs::PermissionsExt;
    let script = root.join(cmd.script_path.trim_start_matches('/'));
    if let Some(parent) = script.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&script, &cmd.script)?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    // `/x` in the command is the script under root; `./x` already is, from root.
    let command = match cmd.command.strip_prefix(cmd.script_path.as_str()) {
        Some(rest) => format!(".{}{rest}", cmd.script_path),
        None => cmd.command.clone(),
    };
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("runcmd.log"))?;
    Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> MetaData {
        MetaData {
            instance_id: "uid-1".into(),
            local_hostname: "cp-1".into(),
        }
    }

    /// User-data as CABPK writes it: files, then runcmd with the pre-kubeadm commands, kubeadm,
    /// and the post-kubeadm commands.
    fn user_data(runcmd: &str) -> String {
        format!(
            "## template: jinja\n#cloud-config\nwrite_files:\n-   path: /wait-signal.sh\n    permissions: '0777'\n    content: |\n      #!/bin/bash\n      exit 0\n-   path: /run/kubeadm/kubeadm.yaml\n    content: |\n      apiVersion: kubeadm.k8s.io/v1beta4\n      kind: InitConfiguration\nruncmd:\n{runcmd}"
        )
    }

    #[test]
    fn only_commands_running_a_written_script_before_kubeadm_are_picked() {
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "upstream's wait-signal, after a host-touching sed",
                "  - \"sed -i 's#a#b#' /etc/kubernetes/manifests/kube-vip.yaml\"\n  - \"./wait-signal.sh \\\"tok\\\" \\\"https://127.0.0.1:6443\\\" \\\"ns\\\"\"\n  - 'kubeadm init --config /run/kubeadm/kubeadm.yaml  && echo success > /run/cluster-api/bootstrap-success.complete'\n",
                &["./wait-signal.sh \"tok\" \"https://127.0.0.1:6443\" \"ns\""],
            ),
            (
                "absolute path",
                "  - /wait-signal.sh a\n  - kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml\n",
                &["/wait-signal.sh a"],
            ),
            (
                "after kubeadm: a post-kubeadm command",
                "  - kubeadm init --config /run/kubeadm/kubeadm.yaml\n  - ./wait-signal.sh\n",
                &[],
            ),
            (
                "a file that is not a script the command names",
                "  - ./other.sh\n  - cat /run/kubeadm/kubeadm.yaml\n  - kubeadm init\n",
                &[],
            ),
            (
                "path tricks",
                "  - ./../wait-signal.sh\n  - .//run/../wait-signal.sh\n  - kubeadm init\n",
                &[],
            ),
            (
                "FluxVM's form of Kairon's runCmd: each command under bash -lc",
                "  - [ bash, -lc, './wait-signal.sh \"tok\"' ]\n  - [ bash, -lc, 'kubeadm init' ]\n  - [ bash, -lc, './wait-signal.sh after' ]\n",
                &["./wait-signal.sh \"tok\""],
            ),
            (
                "another exec list is joined",
                "  - [ /wait-signal.sh, a ]\n  - [ env, X=1, ./wait-signal.sh ]\n  - kubeadm join\n",
                &["/wait-signal.sh a"],
            ),
            ("no runcmd", "  []\n", &[]),
        ];
        for (what, runcmd, want) in cases {
            let got: Vec<String> = pre_kubeadm_scripts(&user_data(runcmd), &meta())
                .into_iter()
                .map(|c| c.command)
                .collect();
            assert_eq!(got, *want, "{what}");
        }
        let picked = pre_kubeadm_scripts(&user_data("  - ./wait-signal.sh\n  - kubeadm init\n"), &meta());
        assert_eq!(picked[0].script_path, "/wait-signal.sh");
        assert_eq!(picked[0].script, "#!/bin/bash\nexit 0\n");
    }

    #[test]
    fn not_a_cloud_config_has_no_scripts() {
        assert!(pre_kubeadm_scripts("{\"ignition\": {}}", &meta()).is_empty());
        assert!(pre_kubeadm_scripts("#cloud-config\nwrite_files: [\n", &meta()).is_empty());
    }

    #[tokio::test]
    async fn commands_run_in_order_in_the_vms_directory_and_are_killed_when_it_goes() {
        let dir = std::env::temp_dir().join(format!("kairon-sim-scripts-{}", std::process::id()));
        let scripts = GuestScripts::new(dir.clone());
        // The script waits for a file in its directory, then writes another: kubeadm waits.
        let data = "#cloud-config\nwrite_files:\n-   path: /gate.sh\n    content: |\n      #!/bin/sh\n      while [ ! -f go ]; do sleep 0.05; done\n      echo \"$1\" > passed\nruncmd:\n  - ./gate.sh first\n  - /gate.sh second\n  - kubeadm init\n";
        let vm = dir.join("uid-1");
        assert_eq!(scripts.advance("uid-1", "m", data, &meta()).await, Progress::Running);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert_eq!(scripts.advance("uid-1", "m", data, &meta()).await, Progress::Running);
        assert!(!vm.join("passed").exists());
        std::fs::write(vm.join("go"), "").unwrap();
        let mut progress = Progress::Running;
        for _ in 0..100 {
            progress = scripts.advance("uid-1", "m", data, &meta()).await;
            if progress == Progress::Done {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(progress, Progress::Done);
        assert_eq!(std::fs::read_to_string(vm.join("passed")).unwrap(), "second\n");

        // A VM whose command never ends: stopping it kills the command and removes its dir.
        assert_eq!(scripts.advance("uid-2", "m", data, &meta()).await, Progress::Running);
        let pid = {
            let vms = scripts.vms.lock().await;
            vms["uid-2"].running.as_ref().and_then(Child::id).unwrap()
        };
        scripts.stop("uid-2").await;
        assert!(!dir.join("uid-2").exists());
        let mut alive = true;
        for _ in 0..50 {
            // Gone, or a zombie not reaped yet.
            alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit(')')
                    .next()
                    .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
            });
            if !alive {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(!alive, "the stopped VM's command still runs");
        scripts.stop("uid-1").await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
