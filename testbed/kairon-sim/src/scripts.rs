//! With `--guest-scripts-dir`: the guest runs its cloud-init `runcmd` for real, as cloud-init
//! does (cc_runcmd writes one `#!/bin/sh` script of the entries, string entries as they are,
//! list entries shell-quoted; scripts_user executes it from `/`), so FluxVM's
//! `[bash, -lc, X]` entries are each their own `bash -lc`, and shell state does not pass
//! from one to the next, exactly as on a Kairon guest.
//!
//! Each VM gets a directory under the given one. Its `root/` is the guest's disk: the upper
//! layer of an overlay over the host's `/`, which the guest sees as its `/`. The commands run
//! in a sandbox ([`SANDBOX`]): private mount, PID and UTS namespaces (`unshare`, the
//! simulator runs as root), the overlay as root (`chroot`), fresh `/tmp` and `/run` from the
//! VM's directory (`/run` `noexec`, as Debian's and Ubuntu's initramfs mounts it before
//! handing it to the booted system: a file there can be read by a shell, not executed), a
//! `/proc` with `/proc/sys` read-only, `/sys` read-only, a `/dev` with only
//! `null`, `zero`, `full`, `random`, `urandom` and `tty`, and no capabilities at all
//! (`setpriv`). So what a guest writes lands in its `root/` and never on the host; what needs
//! a capability (mounts, sysctl, modules, network and firewall setup, `hostname`) fails; the
//! guest sees only its own processes; the network is the host's, as a guest reaches the API
//! servers. Before the commands start, the guest's `write_files` are written into `root/`
//! (deferred ones last, appends appended; owners are not applied).
//!
//! kubeadm is the simulator's (the Node, and on a control-plane VM its etcd and API server):
//! the guest's `kubeadm` is a stand-in on `PATH` (`/usr/local/sbin`) that records that the
//! guest reached it, exits 0, and logs nothing of its arguments. kubeadm "runs" once the guest
//! has called it, or once its commands have all exited. Other tools (`kubectl`, `systemctl`)
//! are the host's own, seeing the guest's files and failing where they would need the host.
//! The VM's commands are killed, and its directory removed, when its Machine goes.
//!
//! Neither user-data nor command lines are logged; the commands' output goes to the VM's
//! `runcmd.log`.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use crate::guest::{self, MetaData};

/// Where cloud-init writes the runcmd script (`cloud.get_ipath("scripts")`).
pub const RUNCMD_SCRIPT: &str = "/var/lib/cloud/instance/scripts/runcmd";
/// What the guest's kubeadm stand-in touches when called.
pub const KUBEADM_CALLED: &str = "/run/kairon-sim/kubeadm-called";

/// The guest's `kubeadm`: the simulator plays what kubeadm does; this records the call.
const KUBEADM_STAND_IN: &str = "#!/bin/sh\n# kairon-sim: kubeadm is played by the simulator\nmkdir -p /run/kairon-sim && : > /run/kairon-sim/kubeadm-called\n";

/// `sh -c` script run by `unshare` with the VM's directory as `$1`: sets up the guest's view
/// and executes its runcmd script with no capabilities.
const SANDBOX: &str = r#"set -e
vm=$1
m=$vm/merged
mount -t overlay overlay -o "lowerdir=/,upperdir=$vm/root,workdir=$vm/work" "$m"
mount --bind "$vm/root/tmp" "$m/tmp"
mount --bind "$vm/root/run" "$m/run"
mount -o remount,bind,nodev,noexec,nosuid "$m/run"
mount -t proc proc "$m/proc"
mount --bind "$m/proc/sys" "$m/proc/sys"
mount -o remount,bind,ro "$m/proc/sys"
mount -t sysfs -o ro sysfs "$m/sys"
mount -t tmpfs -o mode=755 tmpfs "$m/dev"
for d in null zero full random urandom tty; do
  : > "$m/dev/$d"
  mount --bind "/dev/$d" "$m/dev/$d"
done
ln -s /proc/self/fd "$m/dev/fd"
exec chroot "$m" setpriv --no-new-privs --bounding-set=-all --inh-caps=-all \
  env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  sh -c 'cd / && exec "$0"' /var/lib/cloud/instance/scripts/runcmd
"#;

/// The guest's disk as the test host sees it: `root/` of the VM's directory.
pub fn guest_root(dir: &Path, uid: &str) -> PathBuf {
    dir.join(uid).join("root")
}

/// What the guest's cloud-init does before running commands: its files (path, content, mode),
/// in the order written, and the runcmd script, if there is a `runcmd`. An unreadable
/// user-data has neither.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GuestBoot {
    pub files: Vec<GuestFile>,
    pub runcmd: Option<String>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct GuestFile {
    pub path: String,
    pub content: String,
    pub mode: u32,
    pub append: bool,
}

pub fn guest_boot(user_data: &str, meta: &MetaData) -> GuestBoot {
    let rendered = guest::render(user_data, meta);
    if !rendered.trim_start().starts_with("#cloud-config") {
        return GuestBoot::default();
    }
    let Ok(doc) = serde_saphyr::from_str::<Value>(&rendered) else {
        return GuestBoot::default();
    };
    let entries = doc
        .get("write_files")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let deferred = |f: &Value| f.get("defer").and_then(Value::as_bool) == Some(true);
    let files = entries
        .iter()
        .filter(|f| !deferred(f))
        .chain(entries.iter().filter(|f| deferred(f)))
        .filter_map(|f| {
            let path = f.get("path")?.as_str()?;
            let path = if path.starts_with('/') {
                path.to_string()
            } else {
                format!("/{path}")
            };
            Some(GuestFile {
                path,
                content: guest::file_content(f)?,
                mode: mode(f.get("permissions")),
                append: f.get("append").and_then(Value::as_bool) == Some(true),
            })
        })
        .collect();
    let runcmd = doc.get("runcmd").and_then(Value::as_array).map(|list| shellify(list));
    GuestBoot { files, runcmd }
}

/// cloud-init's `util.shellify`: `#!/bin/sh`, then a line per entry, a string as it is, a
/// list's words each in single quotes.
pub fn shellify(entries: &[Value]) -> String {
    let mut script = String::from("#!/bin/sh\n");
    for entry in entries {
        match entry {
            Value::String(s) => script.push_str(s),
            Value::Array(words) => {
                let quoted: Vec<String> = words
                    .iter()
                    .map(|w| {
                        let text = w.as_str().map_or_else(|| w.to_string(), str::to_string);
                        format!("'{}'", text.replace('\'', "'\\''"))
                    })
                    .collect();
                script.push_str(&quoted.join(" "));
            }
            // cloud-init fails the module on anything else: no script runs.
            _ => return "#!/bin/sh\n".into(),
        }
        script.push('\n');
    }
    script
}

/// A `permissions` value as cloud-init reads it (octal text or an integer), default 0644.
fn mode(value: Option<&Value>) -> u32 {
    match value {
        Some(Value::String(s)) => u32::from_str_radix(s.trim().trim_start_matches("0o"), 8).unwrap_or(0o644),
        Some(Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()).unwrap_or(0o644),
        _ => 0o644,
    }
}

/// Where a VM's commands stand.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// The guest called kubeadm, or its commands have all exited (or there are none).
    Done,
    /// Its commands run and have not reached kubeadm yet.
    Running,
}

struct VmScripts {
    dir: PathBuf,
    running: Option<Child>,
}

impl Drop for VmScripts {
    fn drop(&mut self) {
        if let Some(child) = &mut self.running {
            kill_group(child);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Kills the command's process group (the sandbox and what runs in it).
fn kill_group(child: &mut Child) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) with a negative pid signals the process group we created for it.
        unsafe {
            libc::kill(-(pid as i32), libc::SIGKILL);
        }
    }
    let _ = child.start_kill();
}

/// The commands of every VM, keyed by Machine uid.
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

    /// Starts the VM's commands the first time; then `Done` once the guest called kubeadm or
    /// its commands exited. Commands that cannot start are logged and count as exited.
    pub async fn advance(&self, uid: &str, machine: &str, user_data: &str, meta: &MetaData) -> Progress {
        let mut vms = self.vms.lock().await;
        let vm = vms.entry(uid.to_string()).or_insert_with(|| {
            let dir = self.dir.join(uid);
            let running = match guest_boot(user_data, meta) {
                GuestBoot { runcmd: None, .. } => None,
                boot => match start(&dir, &boot) {
                    Ok(child) => {
                        tracing::info!(
                            machine,
                            "guest runs its runcmd script; kubeadm waits until it calls kubeadm"
                        );
                        Some(child)
                    }
                    Err(e) => {
                        tracing::warn!(machine, error = %e, "guest runcmd script did not start");
                        None
                    }
                },
            };
            VmScripts { dir, running }
        });
        if guest_root(&self.dir, uid)
            .join(KUBEADM_CALLED.trim_start_matches('/'))
            .exists()
        {
            return Progress::Done;
        }
        let Some(child) = &mut vm.running else {
            return Progress::Done;
        };
        match child.try_wait() {
            Ok(None) => Progress::Running,
            Ok(Some(status)) => {
                tracing::info!(machine, %status, "guest runcmd script exited without calling kubeadm");
                vm.running = None;
                Progress::Done
            }
            Err(e) => {
                tracing::warn!(machine, error = %e, "waiting for the guest runcmd script");
                vm.running = None;
                Progress::Done
            }
        }
    }

    /// The Machine is gone: its commands are killed and its directory removed.
    pub async fn stop(&self, uid: &str) {
        if self.vms.lock().await.remove(uid).is_some() {
            tracing::info!(uid, "guest commands stopped");
        }
    }
}

/// Writes the guest's files, its runcmd script and the kubeadm stand-in into `vm/root`, and
/// starts the script in the sandbox, in its own process group; output goes to
/// `vm/runcmd.log`.
fn start(vm: &Path, boot: &GuestBoot) -> std::io::Result<Child> {
    let root = vm.join("root");
    for d in [vm.join("work"), vm.join("merged"), root.join("tmp"), root.join("run")] {
        std::fs::create_dir_all(d)?;
    }
    std::fs::set_permissions(vm, std::fs::Permissions::from_mode(0o700))?;
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    for f in &boot.files {
        write(&root, &f.path, f.content.as_bytes(), f.mode, f.append)?;
    }
    if let Some(script) = &boot.runcmd {
        write(&root, RUNCMD_SCRIPT, script.as_bytes(), 0o700, false)?;
    }
    write(
        &root,
        "/usr/local/sbin/kubeadm",
        KUBEADM_STAND_IN.as_bytes(),
        0o755,
        false,
    )?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(vm.join("runcmd.log"))?;
    Command::new("unshare")
        .args([
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--uts",
            "--propagation",
            "private",
        ])
        .args(["sh", "-c", SANDBOX, "sandbox"])
        .arg(vm)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
}

/// Writes `path` of the guest under `root`; a path leaving `root` is skipped.
fn write(root: &Path, path: &str, content: &[u8], mode: u32, append: bool) -> std::io::Result<()> {
    use std::io::Write;
    let Some(file) = in_upper_layer(root, path) else {
        return Ok(());
    };
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(&file)?;
    out.write_all(content)?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))
}

/// Where the guest's `path` is in the overlay's upper layer `root`. The lower layer is the
/// host's `/`, whose directory symlinks (`/bin` → `usr/bin`, `/var/run` → `/run`) the guest
/// follows: a real directory of that name in the upper layer would hide the link. So the
/// deepest existing directory of the path is resolved on the host (read only) first.
fn in_upper_layer(root: &Path, path: &str) -> Option<PathBuf> {
    let guest = Path::new("/").join(path.trim_start_matches('/'));
    if guest.components().any(|c| c == std::path::Component::ParentDir) {
        return None;
    }
    let name = guest.file_name()?;
    let mut existing = guest.parent()?.to_path_buf();
    let mut rest = Vec::new();
    while !existing.is_dir() {
        rest.push(existing.file_name()?.to_owned());
        existing = existing.parent()?.to_path_buf();
    }
    let mut resolved = std::fs::canonicalize(&existing).ok()?;
    resolved.extend(rest.iter().rev());
    Some(root.join(resolved.strip_prefix("/").ok()?).join(name))
}

#[cfg(test)]
#[path = "scripts_tests.rs"]
mod tests;
