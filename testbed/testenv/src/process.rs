//! Child processes of an environment: one log file each, their own process group, killed with
//! the test process (`PR_SET_PDEATHSIG`), and stopped on drop (SIGTERM, short grace, SIGKILL).

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

/// Signals the tests send to processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
    Int,
    Stop,
    Cont,
}

impl Signal {
    fn raw(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
            Signal::Int => libc::SIGINT,
            Signal::Stop => libc::SIGSTOP,
            Signal::Cont => libc::SIGCONT,
        }
    }
}

/// `GOGC` of the environment's own Go processes ([`ProcessSpec::test_go_runtime`]): a
/// management kube-apiserver's start with CAPI's CRDs took 11.6 CPU-s at Go's default (100) and
/// 10.0 at 400; the demo's processes 43 CPU-s against 38. The kube-apiservers are two thirds of
/// the CPU `make test`'s tests use, and CPU, not memory, is what the 2-core machine lacks.
pub const TEST_GOGC: &str = "400";

/// What to run; kept so that a process can be restarted with the same command line.
#[derive(Clone, Debug)]
pub struct ProcessSpec {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub envs: Vec<(OsString, OsString)>,
    pub log_path: PathBuf,
}

impl ProcessSpec {
    pub fn new(name: impl Into<String>, program: impl Into<PathBuf>, log_dir: &Path) -> ProcessSpec {
        let name = name.into();
        ProcessSpec {
            log_path: log_dir.join(format!("{name}.log")),
            name,
            program: program.into(),
            args: Vec::new(),
            envs: Vec::new(),
        }
    }

    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Self {
        self.envs.push((k.into(), v.into()));
        self
    }

    /// For the environment's own Go processes (etcd, the kube-apiservers, kube-controller-manager,
    /// the CAPI managers): Go's collector at [`TEST_GOGC`], trading memory the machine has for
    /// CPU it lacks. Not for the simulated guests (their memory is what a VM would need) nor for
    /// the processes the bench compares.
    pub fn test_go_runtime(self) -> Self {
        self.env("GOGC", TEST_GOGC)
    }

    /// The port of a `<flag>=127.0.0.1:<port>` argument (the test environment picks free ones
    /// for `--health-addr` and `--metrics-bind-address`).
    pub fn loopback_port(&self, flag: &str) -> Option<u16> {
        let prefix = format!("{flag}=127.0.0.1:");
        self.args
            .iter()
            .filter_map(|a| a.to_str())
            .find_map(|a| a.strip_prefix(&prefix).and_then(|v| v.parse().ok()))
    }

    pub fn command_line(&self) -> String {
        let mut s = self.program.display().to_string();
        for a in &self.args {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        s
    }
}

/// `defaults` with every `--flag value` pair that `extra` also gives dropped, then `extra`:
/// the simulator, like most CLIs, rejects a flag given twice.
pub fn merged_args(defaults: Vec<String>, extra: &[String]) -> Vec<String> {
    let mut out = vec![];
    let mut it = defaults.into_iter().peekable();
    while let Some(a) = it.next() {
        let takes_value = it.peek().is_some_and(|v| !v.starts_with('-'));
        if a.starts_with('-') && extra.contains(&a) {
            if takes_value {
                it.next();
            }
            continue;
        }
        out.push(a);
    }
    out.extend(extra.iter().cloned());
    out
}

/// A running (or stopped) child process. Dropping it stops it.
#[derive(Debug)]
pub struct Process {
    spec: ProcessSpec,
    child: Mutex<Option<Child>>,
    pid: Mutex<Option<u32>>,
}

/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process.
/// Tokio's blocking threads come and go, so every child is forked by one thread that lives as
/// long as the test process.
type SpawnJob = (Command, mpsc::Sender<std::io::Result<Child>>);
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnJob>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("capkr-testenv-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawning a thread");
        Mutex::new(tx)
    })
}

fn spawn_via_spawner(cmd: Command) -> std::io::Result<Child> {
    let (tx, rx) = mpsc::channel();
    let sender = spawner().lock().unwrap_or_else(|e| e.into_inner()).clone();
    sender
        .send((cmd, tx))
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?;
    rx.recv().map_err(|_| std::io::Error::other("spawner thread is gone"))?
}

impl Process {
    /// Starts the process; stdout and stderr go (appended) to `spec.log_path`.
    pub fn spawn(spec: ProcessSpec) -> Result<Process> {
        let p = Process {
            spec,
            child: Mutex::new(None),
            pid: Mutex::new(None),
        };
        p.start()?;
        Ok(p)
    }

    fn start(&self) -> Result<()> {
        let spec = &self.spec;
        if !spec.program.is_file() {
            bail!("{}: binary {} does not exist", spec.name, spec.program.display());
        }
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log_path)
            .with_context(|| format!("opening {}", spec.log_path.display()))?;
        let _ = writeln!(log, "=== {} starting: {}", timestamp(), spec.command_line());
        let err = log.try_clone().context("duplicating the log file handle")?;
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err));
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                // Own process group: a Ctrl-C in the terminal reaches only us, and we tear
                // down in order (API servers before etcd).
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    // The parent died before prctl took effect.
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = spawn_via_spawner(cmd).with_context(|| format!("starting {}", spec.command_line()))?;
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = Some(child.id());
        *self.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn spec(&self) -> &ProcessSpec {
        &self.spec
    }

    pub fn log_path(&self) -> &Path {
        &self.spec.log_path
    }

    /// The pid of the last started instance (also after it exited).
    pub fn pid(&self) -> Option<u32> {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The exit status if the process has exited (reaping it), `None` while it runs.
    pub fn try_exit_status(&self) -> Option<ExitStatus> {
        let mut guard = self.child.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            None => None,
            Some(c) => c.try_wait().ok().flatten(),
        }
    }

    pub fn is_running(&self) -> bool {
        let mut guard = self.child.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            None => false,
            Some(c) => matches!(c.try_wait(), Ok(None)),
        }
    }

    /// Sends `sig` to the process group, without waiting.
    pub fn signal(&self, sig: Signal) -> Result<()> {
        if !self.is_running() {
            bail!("{} is not running", self.spec.name);
        }
        let pid = self.pid().ok_or_else(|| anyhow!("{} has no pid", self.spec.name))? as libc::pid_t;
        // SAFETY: plain syscall; pid is our child's process group.
        let rc = unsafe { libc::kill(-pid, sig.raw()) };
        if rc != 0 {
            bail!("kill({}, {sig:?}): {}", -pid, std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `sig` and waits (up to 30 s) until the process has exited. SIGTERM/SIGINT that are
    /// not honoured within 30 s are an error (the process keeps running).
    pub async fn kill(&self, sig: Signal) -> Result<ExitStatus> {
        self.signal(sig)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.try_exit_status() {
                self.note(&format!("stopped by {sig:?}: {status}"));
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("{} still runs 30 s after {sig:?}", self.spec.name);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the process if it runs (SIGTERM, then SIGKILL after 5 s) and starts it again with
    /// the same command line; its log continues in the same file.
    pub async fn restart(&self) -> Result<()> {
        if self.is_running() {
            self.signal(Signal::Term)?;
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.is_running() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if self.is_running() {
                self.signal(Signal::Kill)?;
                while self.is_running() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        self.start_again()
    }

    /// Starts a process that has exited again with the same command line; its log continues
    /// in the same file.
    pub fn start_again(&self) -> Result<()> {
        self.note("restarting");
        self.start()
    }

    /// Synchronous stop: SIGTERM, up to `grace`, then SIGKILL, and reap.
    pub fn stop(&self, grace: Duration) {
        stop_all(&[self], grace);
    }

    fn note(&self, what: &str) {
        if let Ok(mut f) = OpenOptions::new().append(true).open(&self.spec.log_path) {
            let _ = writeln!(f, "=== {} {}", timestamp(), what);
        }
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        tail_file(&self.spec.log_path, n)
    }

    /// What to say of a process that has exited: its status, the first error lines of its log
    /// (the cause; the last lines are mostly a shutdown's), and its last `lines` lines.
    pub fn exit_report(&self, status: ExitStatus, lines: usize) -> String {
        let mut out = format!("{} exited ({status})", self.spec.name);
        let errors = first_errors(&self.spec.log_path, 5);
        if !errors.is_empty() {
            out.push_str(&format!("; first error lines:\n{errors}"));
        }
        if lines > 0 {
            out.push_str(&format!("\nlast log lines:\n{}", self.log_tail(lines)));
        }
        out
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

/// Stops several processes at once: SIGTERM to all, wait up to `grace` for all, SIGKILL the rest.
pub fn stop_all(procs: &[&Process], grace: Duration) {
    let running: Vec<&&Process> = procs.iter().filter(|p| p.is_running()).collect();
    for p in &running {
        let _ = p.signal(Signal::Term);
    }
    let deadline = Instant::now() + grace;
    while running.iter().any(|p| p.is_running()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in &running {
        if p.is_running() {
            let _ = p.signal(Signal::Kill);
        }
    }
    for p in &running {
        let mut guard = p.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = guard.as_mut() {
            let _ = c.wait();
        }
    }
}

pub(crate) fn tail_file(path: &Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

/// The first `n` lines of a log that report an error: klog's `E`/`F` lines, JSON logs at level
/// error, a Go panic, cobra's `Error:`.
fn first_errors(path: &Path, n: usize) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|l| is_error_line(l))
        .take(n)
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_error_line(line: &str) -> bool {
    let b = line.as_bytes();
    let klog = b.len() > 5 && matches!(b[0], b'E' | b'F') && b[1..5].iter().all(u8::is_ascii_digit);
    klog || line.contains(r#""level":"error""#) || line.starts_with("panic:") || line.starts_with("Error:")
}

pub(crate) fn timestamp() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        now.hour(),
        now.minute(),
        now.second(),
        now.millisecond()
    )
}

/// Whether a pid is still a live process (not a zombie we have reaped).
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks existence/permission.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if rc != 0 {
        return false;
    }
    // A zombie still answers kill(0); treat it as dead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Runs `ready`; if it fails because the named process has exited, starts that process once
/// more with its command line (its log goes on in the same file) and runs `ready` again.
pub(crate) async fn ready_or_restarted_once<F, Fut>(
    procs: &Mutex<Vec<Process>>,
    name: &str,
    env_name: &str,
    ready: F,
) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let Err(first) = ready().await else {
        return Ok(());
    };
    {
        let procs = procs.lock().unwrap_or_else(|e| e.into_inner());
        match procs.iter().find(|p| p.name() == name) {
            Some(p) if p.try_exit_status().is_some() => {
                eprintln!("capkr-testenv[{env_name}]: {first:#}\n(starting {name} once more)");
                p.start_again()?;
            }
            _ => return Err(first),
        }
    }
    ready()
        .await
        .with_context(|| format!("{name} started a second time, after: {first:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{free_port, http_get};

    #[test]
    fn merged_args_let_extra_flags_win() {
        let d = ["--a", "1", "--b", "2", "--flag", "--c", "3"]
            .map(String::from)
            .to_vec();
        let e = ["--b".to_string(), "9".to_string(), "--flag".to_string()];
        assert_eq!(merged_args(d, &e), ["--a", "1", "--c", "3", "--b", "9", "--flag"]);
    }

    #[test]
    fn error_lines_are_klog_errors_json_errors_and_panics() {
        for l in [
            r#"E1207 00:31:26.759250   12891 kind.go:82] "failed to get informer from cache""#,
            r#"F1207 00:31:26.7 1 main.go:1] fatal"#,
            r#"{"level":"error","msg":"bind: address already in use"}"#,
            "panic: runtime error",
            "Error: unknown flag: --x",
        ] {
            assert!(is_error_line(l), "{l}");
        }
        for l in [
            r#"I1207 00:31:26.759279   12891 controller.go:302] "Starting Controller""#,
            "Eventually it started",
            r#"{"level":"info","msg":"error budget"}"#,
            "",
        ] {
            assert!(!is_error_line(l), "{l}");
        }
    }

    #[test]
    fn loopback_port_reads_the_port_of_the_named_flag_only() {
        let spec = ProcessSpec::new("m", "/bin/true", Path::new("/tmp")).args([
            "--metrics-bind-address=127.0.0.1:8443",
            "--health-addr=127.0.0.1:9440",
            "--other=0.0.0.0:1",
        ]);
        assert_eq!(spec.loopback_port("--health-addr"), Some(9440));
        assert_eq!(spec.loopback_port("--metrics-bind-address"), Some(8443));
        assert_eq!(spec.loopback_port("--other"), None, "not on loopback");
        assert_eq!(spec.loopback_port("--missing"), None);
    }

    /// Like the environment's `wait_http`: fails as soon as the process has exited.
    async fn served(procs: &Mutex<Vec<Process>>, port: u16) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(report) = procs
                .lock()
                .unwrap()
                .iter()
                .find_map(|p| p.try_exit_status().map(|s| p.exit_report(s, 3)))
            {
                bail!("{report}");
            }
            if http_get(port, "/readyz").await.is_ok_and(|r| r.status == 200) {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(20) {
                bail!("not served");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A manager that exits on its first start is started once more, and its log keeps both
    /// runs; one that exits every time fails with what it said the first time.
    #[tokio::test]
    async fn a_manager_that_exits_while_starting_is_started_once_more() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("readyz"), "ok").unwrap();
        let run = |crashes: &str| {
            let port = free_port().unwrap();
            let script = format!(
                "if [ -e {d}/{crashes} ]; then exec python3 -m http.server {port} --bind 127.0.0.1 --directory {d}; \
                 else touch {d}/started; echo 'E1207 00:31:26.7 1 kind.go:82] boom'; exit 1; fi",
                d = dir.path().display()
            );
            let spec = ProcessSpec::new(format!("m-{crashes}"), "/bin/sh", dir.path()).args(["-c", &script]);
            (port, Mutex::new(vec![Process::spawn(spec).unwrap()]))
        };

        let (port, procs) = run("started");
        ready_or_restarted_once(&procs, "m-started", "t", || served(&procs, port))
            .await
            .unwrap();
        let log = std::fs::read_to_string(dir.path().join("m-started.log")).unwrap();
        assert_eq!(log.matches("starting: /bin/sh").count(), 2, "{log}");

        let (port, procs) = run("never");
        let err = ready_or_restarted_once(&procs, "m-never", "t", || served(&procs, port))
            .await
            .unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.starts_with(
                "m-never started a second time, after: m-never exited (exit status: 1); first error lines:\nE1207"
            ),
            "{err}"
        );
    }
}
