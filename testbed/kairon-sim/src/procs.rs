//! Processes of the simulated VMs: run a helper to completion, spawn a child that dies with
//! the simulator, and keep one running the way kubelet keeps a static pod's container running.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// Why a process could not be run or started.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("{0} failed: {1}")]
    Command(&'static str, String),
    #[error("opening its log: {0}")]
    Log(#[source] std::io::Error),
}

/// kubelet's restart back-off, shorter for tests (10 s to 5 min there): it starts at
/// [`RESTART_AFTER`], doubles while the process keeps dying within [`RESTART_RESET`] of its
/// start, up to [`RESTART_MAX`].
const RESTART_AFTER: Duration = Duration::from_secs(2);
const RESTART_MAX: Duration = Duration::from_secs(60);
const RESTART_RESET: Duration = Duration::from_secs(10);

/// The back-off before the next start, after a run of `ran` that followed a back-off of `last`.
fn next_backoff(last: Duration, ran: Duration) -> Duration {
    if ran >= RESTART_RESET {
        RESTART_AFTER
    } else {
        (last * 2).min(RESTART_MAX)
    }
}

/// Runs a helper to completion; its stdout on success.
pub async fn run(bin: &Path, args: &[String], what: &'static str) -> Result<String, ProcessError> {
    let out = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| ProcessError::Command(what, format!("{}: {e}", bin.display())))?;
    if !out.status.success() {
        return Err(ProcessError::Command(
            what,
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Starts `bin` with its output appended to `log`; killed when dropped, and when the
/// simulator dies (`PR_SET_PDEATHSIG`).
pub fn spawn(bin: &Path, args: &[String], log: &Path) -> Result<Child, ProcessError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(ProcessError::Log)?;
    let err = file.try_clone().map_err(ProcessError::Log)?;
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // Die with the simulator, even when it is SIGKILLed.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
        .map_err(|e| ProcessError::Command("spawn", format!("{}: {e}", bin.display())))
}

/// A process kept running: started at once, started again whenever it exits (as kubelet
/// restarts a static pod's container: kube-controller-manager and kube-scheduler exit when they
/// lose their leader lease). Aborting the handle (or dropping a [`Supervised`]) kills it.
pub struct Supervised(JoinHandle<()>);

impl Supervised {
    pub fn start(name: &'static str, bin: PathBuf, args: Vec<String>, log: PathBuf) -> Result<Self, ProcessError> {
        let mut child = spawn(&bin, &args, &log)?;
        Ok(Self(tokio::spawn(async move {
            let mut backoff = RESTART_AFTER / 2;
            loop {
                let started = std::time::Instant::now();
                let status = child.wait().await;
                backoff = next_backoff(backoff, started.elapsed());
                tracing::warn!(process = name, ?status, log = %log.display(), ?backoff, "exited; starting it again");
                tokio::time::sleep(backoff).await;
                child = match spawn(&bin, &args, &log) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(process = name, error = %e, "cannot start it again");
                        return;
                    }
                };
            }
        })))
    }

    /// Whether it is still kept running (false only if it could not be started again).
    pub fn kept(&self) -> bool {
        !self.0.is_finished()
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        // The task's future (and the Child in it, kill_on_drop) is dropped with the abort.
        self.0.abort();
    }
}

/// One line in the test runner's tally (`CAPKR_TESTENV_TALLY`, see `capkr_testenv::tally`):
/// a guest's kube-apiserver is an API server the tests started too.
pub fn tally_guest_api_server() {
    use std::io::Write;
    let Some(dir) = std::env::var_os("CAPKR_TESTENV_TALLY") else {
        return;
    };
    let path = Path::new(&dir).join(format!("sim-{}", std::process::id()));
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "guest-api-server");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_backoff_doubles_while_crashing_and_resets_after_a_good_run() {
        let s = Duration::from_secs;
        let cases = [
            ("first crash", RESTART_AFTER / 2, s(1), s(2)),
            ("crashing again", s(2), s(1), s(4)),
            ("capped", s(40), s(1), s(60)),
            ("ran long enough", s(60), s(30), s(2)),
        ];
        for (name, last, ran, want) in cases {
            assert_eq!(next_backoff(last, ran), want, "{name}");
        }
    }
}
