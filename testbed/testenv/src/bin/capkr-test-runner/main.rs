//! `make test`'s runner: builds every test binary of the workspace (`cargo test --no-run`) and
//! runs them with a fixed number of test threads *in all*, instead of one binary after the
//! other each with its own threads.
//!
//! A job is a binary, or one top-level module of it: `--own TARGET/MODULE` runs that module's
//! tests as a job of their own, in a process of their own (named MODULE), and the binary's
//! other tests as the binary's job. So one test binary per tier still gives each group of tests
//! that starts its own environment a process of its own, as when each was a binary. Every test
//! of a binary is in exactly one of its jobs (read from its `--list`, run by `--exact` names).
//!
//! `cargo test -- --test-threads=2` keeps two test threads busy only inside a binary: a job
//! with one long test (most of the real-control-plane groups) leaves the second idle, and the
//! next one waits. Here each job takes one slot (`--test-threads=1`), except those named with
//! `--wide`, which take two slots and two threads (the groups whose tests start several API
//! servers each), and those named with `--threads JOB=N`, which take N slots and N threads (a
//! group whose tests share one environment and run side by side in it); jobs start, longest
//! first, whenever enough slots are free. So at most `--slots` tests run at once, and no slot
//! idles while work is left.
//!
//! Each job's output goes to `target/test-logs/<job>.log`. When a job ends, its libtest lines
//! are printed as cargo would print them (`running N tests`, a line per test, `test result:
//! …`), a failed job's panics too; the run ends with a table of every job's time and the tests
//! counted over all jobs, and each job's CPU time: its process's and that of every process it
//! waited for (its environments' API servers, etcd, controllers, the simulator and its
//! guests), from `wait4`'s resource usage. Exit status 1 when any job failed, or when a job that exited 0
//! printed no `test result` line; every job runs regardless (as `--no-fail-fast`). The last
//! line says how many environments and API servers the tests
//! started (`capkr_testenv::tally`).

use std::collections::VecDeque;
use std::fs::File;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// A test binary built by cargo.
#[derive(Clone, Debug)]
struct Binary {
    /// `<package>::<kind>::<target>` as shown.
    name: String,
    target: String,
    executable: PathBuf,
    /// The package's directory: cargo runs a test binary there.
    cwd: PathBuf,
}

/// What runs as one process: a binary's tests, or those of one of its top-level modules.
#[derive(Clone, Debug)]
struct Job {
    /// `<package>::<kind>::<target>[::<module>]` as shown; the log file's name.
    name: String,
    /// What `--wide`, `--threads` and `--first` name: the module, or the binary's target.
    key: String,
    binary: Binary,
    /// The job's tests by exact name; empty for the whole binary.
    tests: Vec<String>,
}

struct Options {
    slots: usize,
    /// `(target, module)`: modules run as jobs of their own.
    own: Vec<(String, String)>,
    wide: Vec<String>,
    /// Binaries that run with more than one thread (and take as many slots).
    threads: Vec<(String, usize)>,
    first: Vec<String>,
    log_dir: PathBuf,
    /// A binary still running after this long is killed and fails: a hung test fails the run
    /// with its name, instead of holding it until CI's own limit ends it without a word. Longer
    /// than the CAPI suite's own 45-minute timeout, which then speaks first.
    timeout: Duration,
}

fn usage() -> &'static str {
    "usage: capkr-test-runner [--slots N] [--own TARGET/MODULE]... [--wide JOB]... [--threads JOB=N]... [--first JOB]... [--log-dir DIR] [--timeout-minutes M (50)]"
}

fn parse_args() -> Result<Options> {
    let mut opts = Options {
        slots: 2,
        own: vec![],
        wide: vec![],
        threads: vec![],
        first: vec![],
        log_dir: PathBuf::from("target/test-logs"),
        timeout: Duration::from_secs(50 * 60),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} wants a value\n{}", usage()));
        match a.as_str() {
            "--slots" => opts.slots = value()?.parse().context("--slots wants a number")?,
            "--own" => {
                let v = value()?;
                let (target, module) = v
                    .split_once('/')
                    .with_context(|| format!("--own wants TARGET/MODULE, not {v:?}"))?;
                opts.own.push((target.to_string(), module.to_string()));
            }
            "--wide" => opts.wide.push(value()?),
            "--threads" => {
                let v = value()?;
                let (target, n) = v
                    .split_once('=')
                    .with_context(|| format!("--threads wants JOB=N, not {v:?}"))?;
                let n: usize = n.parse().with_context(|| format!("--threads {v}: N is a number"))?;
                if n == 0 {
                    bail!("--threads {v}: at least one thread");
                }
                opts.threads.push((target.to_string(), n));
            }
            "--first" => opts.first.push(value()?),
            "--log-dir" => opts.log_dir = PathBuf::from(value()?),
            "--timeout-minutes" => {
                let m: u64 = value()?.parse().context("--timeout-minutes wants a number")?;
                opts.timeout = Duration::from_secs(m * 60);
            }
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{}", usage()),
        }
    }
    if opts.slots == 0 {
        bail!("--slots must be at least 1");
    }
    Ok(opts)
}

/// Builds the workspace's test binaries and lists them, in cargo's order.
fn build() -> Result<Vec<Binary>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args([
            "test",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test --no-run failed");
    }
    let mut binaries = vec![];
    for line in out.stdout.lines() {
        let line = line?;
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let Some(executable) = msg["executable"].as_str() else {
            continue;
        };
        let target = msg["target"]["name"].as_str().unwrap_or_default().to_string();
        let manifest = PathBuf::from(msg["manifest_path"].as_str().unwrap_or_default());
        let package = msg["package_id"]
            .as_str()
            .and_then(|id| id.rsplit('/').next())
            .and_then(|tail| tail.split(['#', '@']).next())
            .unwrap_or_default()
            .to_string();
        let kind = msg["target"]["kind"][0].as_str().unwrap_or_default();
        binaries.push(Binary {
            name: format!("{package}::{kind}::{target}"),
            target,
            executable: executable.into(),
            cwd: manifest.parent().map(Path::to_path_buf).unwrap_or_default(),
        });
    }
    if binaries.is_empty() {
        bail!("cargo built no test binary");
    }
    Ok(binaries)
}

/// A binary's tests by name, from its `--list`.
fn list_tests(b: &Binary) -> Result<Vec<String>> {
    let out = Command::new(&b.executable)
        .args(["--list", "--format=terse"])
        .current_dir(&b.cwd)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("listing the tests of {}", b.executable.display()))?;
    if !out.status.success() {
        bail!("{} --list failed", b.executable.display());
    }
    Ok(test_names(&String::from_utf8_lossy(&out.stdout)))
}

/// The test names of libtest's `--list --format=terse` output (`path::name: test` lines).
fn test_names(list: &str) -> Vec<String> {
    list.lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect()
}

/// A binary's jobs: one per module `own` names for it, and one for the rest of its tests
/// (none when no test is left). A named module without tests is an error: a renamed module
/// would otherwise run, unnoticed, in the binary's job.
fn split(b: &Binary, own: &[&str], tests: &[String]) -> Result<Vec<Job>> {
    let mut jobs = vec![];
    let mut rest: Vec<String> = tests.to_vec();
    for module in own {
        let prefix = format!("{module}::");
        let (mine, others): (Vec<String>, Vec<String>) = rest.into_iter().partition(|t| t.starts_with(&prefix));
        if mine.is_empty() {
            bail!(
                "--own {}/{module}: the binary has no test in a module {module}",
                b.target
            );
        }
        rest = others;
        jobs.push(Job {
            name: format!("{}::{module}", b.name),
            key: module.to_string(),
            binary: b.clone(),
            tests: mine,
        });
    }
    if !rest.is_empty() {
        jobs.push(Job {
            name: b.name.clone(),
            key: b.target.clone(),
            binary: b.clone(),
            tests: rest,
        });
    }
    Ok(jobs)
}

/// Every binary's jobs, in cargo's order.
fn jobs(binaries: &[Binary], own: &[(String, String)]) -> Result<Vec<Job>> {
    for (target, module) in own {
        if !binaries.iter().any(|b| &b.target == target) {
            bail!("--own {target}/{module}: no test binary {target}");
        }
    }
    let mut jobs = vec![];
    for b in binaries {
        let mine: Vec<&str> = own
            .iter()
            .filter(|(t, _)| t == &b.target)
            .map(|(_, m)| m.as_str())
            .collect();
        if mine.is_empty() {
            jobs.push(Job {
                name: b.name.clone(),
                key: b.target.clone(),
                binary: b.clone(),
                tests: vec![],
            });
        } else {
            jobs.extend(split(b, &mine, &list_tests(b)?)?);
        }
    }
    Ok(jobs)
}

struct Running {
    job: Job,
    child: Child,
    slots: usize,
    started: Instant,
    log: PathBuf,
}

struct Finished {
    name: String,
    ok: bool,
    took: Duration,
    /// User and system CPU time of the job's process and of all it waited for.
    cpu: Duration,
    log: PathBuf,
    counts: Option<Counts>,
}

/// A binary's `test result:` line, as numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Counts {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.passed += o.passed;
        self.failed += o.failed;
        self.ignored += o.ignored;
    }
}

/// The lines libtest writes about the tests (not what the tests themselves print), and the
/// counts of its `test result:` line.
fn libtest_report(log: &str) -> (Vec<&str>, Option<Counts>) {
    let mut lines = vec![];
    let mut counts = None;
    for l in log.lines() {
        let is_count = l.starts_with("running ") && (l.ends_with(" test") || l.ends_with(" tests"));
        let is_test = l.starts_with("test ")
            && [" ... ok", " ... FAILED", " ... ignored"]
                .iter()
                .any(|end| l.contains(end));
        if let Some(rest) = l.strip_prefix("test result: ") {
            let number = |what: &str| {
                rest.split(';')
                    .find_map(|part| part.trim().strip_suffix(what)?.trim().rsplit(' ').next()?.parse().ok())
                    .unwrap_or(0)
            };
            counts = Some(Counts {
                passed: number("passed"),
                failed: number("failed"),
                ignored: number("ignored"),
            });
            lines.push(l);
        } else if is_count || is_test {
            lines.push(l);
        }
    }
    (lines, counts)
}

fn start(job: &Job, threads: usize, log_dir: &Path, tally_dir: &Path) -> Result<Running> {
    let log = log_dir.join(format!("{}.log", job.name.replace("::", "-")));
    // What this job started, in a tally directory of its own (named after it).
    let tally = tally_dir.join(job.name.replace("::", "-"));
    std::fs::create_dir_all(&tally)?;
    let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    println!(
        "start  {} ({threads} thread{})",
        job.name,
        if threads == 1 { "" } else { "s" }
    );
    let b = &job.binary;
    let mut cmd = Command::new(&b.executable);
    cmd.arg(format!("--test-threads={threads}"));
    if !job.tests.is_empty() {
        cmd.arg("--exact").args(&job.tests);
    }
    let child = cmd
        .current_dir(&b.cwd)
        .env(capkr_testenv::tally::TALLY_DIR_ENV, &tally)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {}", b.executable.display()))?;
    Ok(Running {
        job: job.clone(),
        child,
        slots: threads,
        started: Instant::now(),
        log,
    })
}

/// Reaps `child` if it has exited (or waits for it, `block`): its exit status, and the CPU time
/// (user + system) it and every descendant it waited for used. `None` while it runs.
fn reap(child: &Child, block: bool) -> Result<Option<(ExitStatus, Duration)>> {
    use std::os::unix::process::ExitStatusExt;
    let pid = libc::pid_t::try_from(child.id()).context("a pid out of range")?;
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 only writes into the two locals.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let flags = if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: `pid` is our own child, not reaped yet (std's Child is never waited on here).
        let r = unsafe { libc::wait4(pid, &mut status, flags, &mut usage) };
        if r == 0 {
            return Ok(None);
        }
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).context("waiting for a test job");
        }
    }
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    Ok(Some((
        ExitStatus::from_raw(status),
        tv(usage.ru_utime) + tv(usage.ru_stime),
    )))
}

/// What of a failed binary's log is worth printing: every panic with what follows it, and the
/// summary at the end.
fn failure_excerpt(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = vec![];
    for (i, l) in lines.iter().enumerate() {
        if l.contains("panicked at") {
            out.extend(lines[i..lines.len().min(i + 12)].iter().copied());
            out.push("...");
        }
    }
    let tail = lines.len().saturating_sub(40);
    out.extend(lines[tail..].iter().copied());
    out.join("\n")
}

/// What each failed test of a job's log said first: its name and the opening lines of its
/// panic message (at most `lines` of them), so that the closing lines of a run name every
/// failure and why, where the excerpts above may have been cut.
fn failure_digest(job: &str, log: &str, lines: usize) -> Vec<String> {
    let all: Vec<&str> = log.lines().collect();
    let mut out = vec![];
    for (i, l) in all.iter().enumerate() {
        let Some(rest) = l.strip_prefix("thread '") else {
            continue;
        };
        let Some((test, at)) = rest.split_once("' ") else {
            continue;
        };
        let Some(at) = at.split_once("panicked at ").map(|(_, at)| at.trim_end_matches(':')) else {
            continue;
        };
        out.push(format!("{job}: {test} (at {at})"));
        out.extend(
            all[i + 1..]
                .iter()
                .take_while(|l| !l.starts_with("stack backtrace:") && !l.starts_with("note: "))
                .filter(|l| !l.trim().is_empty())
                .take(lines)
                .map(|l| format!("    {}", l.chars().take(240).collect::<String>())),
        );
    }
    if out.is_empty() {
        out.push(format!("{job}: no test panicked (its log's end says why)"));
    }
    out
}

fn main() -> Result<()> {
    let opts = parse_args()?;
    std::fs::create_dir_all(&opts.log_dir)?;
    // Every test process (and what it starts) writes what it started here.
    let tally_dir = opts.log_dir.join("tally");
    let _ = std::fs::remove_dir_all(&tally_dir);
    std::fs::create_dir_all(&tally_dir)?;
    let tally_dir = tally_dir.canonicalize()?;
    let t0 = Instant::now();
    let binaries = build()?;
    let jobs = jobs(&binaries, &opts.own)?;
    println!(
        "{} test binaries built in {:.0}s; running them as {} jobs in {} slots",
        binaries.len(),
        t0.elapsed().as_secs_f64(),
        jobs.len(),
        opts.slots
    );
    // Longest first (as named), then cargo's order.
    let mut queue: VecDeque<Job> = opts
        .first
        .iter()
        .filter_map(|f| jobs.iter().find(|j| &j.key == f).cloned())
        .collect();
    queue.extend(jobs.iter().filter(|j| !opts.first.contains(&j.key)).cloned());

    let mut running: Vec<Running> = vec![];
    let mut finished: Vec<Finished> = vec![];
    while !queue.is_empty() || !running.is_empty() {
        let used: usize = running.iter().map(|r| r.slots).sum();
        let free = opts.slots - used;
        // The first job that fits: a wide job waits for two free slots while narrow ones run.
        let fits = |j: &Job| {
            let want = if let Some((_, n)) = opts.threads.iter().find(|(t, _)| t == &j.key) {
                opts.slots.min(*n)
            } else if opts.wide.contains(&j.key) {
                opts.slots.min(2)
            } else {
                1
            };
            (want <= free).then_some(want)
        };
        if let Some(i) = queue.iter().position(|b| fits(b).is_some()) {
            let j = queue.remove(i).expect("index in range");
            let threads = fits(&j).expect("fits");
            running.push(start(&j, threads, &opts.log_dir, &tally_dir)?);
            continue;
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut i = 0;
        while i < running.len() {
            let timed_out = running[i].started.elapsed() > opts.timeout;
            if timed_out {
                // SIGKILL: its environments' processes go with their owner's death (testenv).
                let _ = running[i].child.kill();
            }
            if let Some((status, cpu)) = reap(&running[i].child, timed_out)? {
                let r = running.remove(i);
                let took = r.started.elapsed();
                let text = std::fs::read_to_string(&r.log).unwrap_or_default();
                let (lines, counts) = libtest_report(&text);
                // A binary that exits 0 without libtest's summary ran no test harness at all.
                let ok = !timed_out && status.success() && counts.is_some();
                println!(
                    "{}   {} in {:.0}s ({:.0} CPU-s){}",
                    if ok { "ok " } else { "FAIL" },
                    r.job.name,
                    took.as_secs_f64(),
                    cpu.as_secs_f64(),
                    if timed_out {
                        format!(
                            ", killed: still running after {} min (--timeout-minutes)",
                            opts.timeout.as_secs() / 60
                        )
                    } else {
                        String::new()
                    }
                );
                for l in lines {
                    println!("{l}");
                }
                if !ok {
                    println!(
                        "----- {} (whole log: {}) -----\n{}\n-----",
                        r.job.name,
                        r.log.display(),
                        failure_excerpt(&r.log)
                    );
                }
                finished.push(Finished {
                    name: r.job.name,
                    ok,
                    took,
                    cpu,
                    log: r.log,
                    counts,
                });
            } else {
                i += 1;
            }
        }
    }

    finished.sort_by_key(|f| std::cmp::Reverse(f.took));
    let table: Vec<String> = finished
        .iter()
        .map(|f| {
            format!(
                "{:>7.0}  {:>7.0}  {:<4}  {}",
                f.took.as_secs_f64(),
                f.cpu.as_secs_f64(),
                if f.ok { "ok" } else { "FAIL" },
                f.name
            )
        })
        .collect();
    println!("\n{:>7}  {:>7}  {:<4}  job", "seconds", "CPU-s", "");
    for line in &table {
        println!("{line}");
    }
    // The same table, slowest first, for .ci/run's closing summary.
    std::fs::write(opts.log_dir.join("times.txt"), table.join("\n") + "\n")?;
    let failed: Vec<&Finished> = finished.iter().filter(|f| !f.ok).collect();
    let mut all = Counts::default();
    for c in finished.iter().filter_map(|f| f.counts) {
        all += c;
    }
    let cpu: Duration = finished.iter().map(|f| f.cpu).sum();
    println!(
        "\n{} jobs, {} failed, {:.1} min in all, {:.0} CPU-s in the jobs",
        finished.len(),
        failed.len(),
        t0.elapsed().as_secs_f64() / 60.0,
        cpu.as_secs_f64()
    );
    println!(
        "test result: {}. {} passed; {} failed; {} ignored (all {} jobs)",
        if failed.is_empty() { "ok" } else { "FAILED" },
        all.passed,
        all.failed,
        all.ignored,
        finished.len()
    );
    let by_binary = Tally::by_binary(&tally_dir);
    let mut all = Tally::default();
    for (_, t) in &by_binary {
        all.add_tally(t);
    }
    println!("{}", all.line());
    println!("{}", Tally::full_by_binary(&by_binary));
    let digest_file = opts.log_dir.join("failures.txt");
    let _ = std::fs::remove_file(&digest_file);
    if !failed.is_empty() {
        for f in &failed {
            println!("failed: {} ({})", f.name, f.log.display());
        }
        // Every failure and its message, last: what a reader of the run's end sees first.
        let digest: Vec<String> = failed
            .iter()
            .flat_map(|f| failure_digest(&f.name, &std::fs::read_to_string(&f.log).unwrap_or_default(), 10))
            .collect();
        println!("why they failed:\n{}", digest.join("\n"));
        std::fs::write(&digest_file, digest.join("\n") + "\n")?;
        std::process::exit(1);
    }
    Ok(())
}

/// What the tests started, counted from the tally files.
#[derive(Debug, Default, PartialEq)]
struct Tally {
    full: usize,
    api_server_only: usize,
    api_servers: usize,
    /// Of `api_servers`, those simulated control-plane VMs ran.
    guest_api_servers: usize,
}

impl Tally {
    /// One tally per binary: `dir` holds a directory per binary, a file per process in it.
    fn by_binary(dir: &Path) -> Vec<(String, Tally)> {
        let mut all = vec![];
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let mut t = Tally::default();
            for file in std::fs::read_dir(entry.path()).into_iter().flatten().flatten() {
                t.add(&std::fs::read_to_string(file.path()).unwrap_or_default());
            }
            all.push((entry.file_name().to_string_lossy().into_owned(), t));
        }
        all.sort_by(|a, b| b.1.full.cmp(&a.1.full).then(a.0.cmp(&b.0)));
        all
    }

    fn add_tally(&mut self, o: &Tally) {
        self.full += o.full;
        self.api_server_only += o.api_server_only;
        self.api_servers += o.api_servers;
        self.guest_api_servers += o.guest_api_servers;
    }

    /// "full environments by binary: a 3, b 1", the binaries that started any, most first.
    fn full_by_binary(by_binary: &[(String, Tally)]) -> String {
        let parts: Vec<String> = by_binary
            .iter()
            .filter(|(_, t)| t.full > 0)
            .map(|(name, t)| format!("{name} {}", t.full))
            .collect();
        format!("full environments by binary: {}", parts.join(", "))
    }

    fn add(&mut self, text: &str) {
        use capkr_testenv::tally::Started;
        for line in text.lines() {
            if line == Started::FullEnvironment.word() {
                self.full += 1;
                self.api_servers += 1;
            } else if line == Started::ApiServerEnvironment.word() {
                self.api_server_only += 1;
                self.api_servers += 1;
            } else if line == Started::ApiServer.word() {
                self.api_servers += 1;
            } else if line == Started::GuestApiServer.word() {
                self.api_servers += 1;
                self.guest_api_servers += 1;
            }
        }
    }

    fn line(&self) -> String {
        format!(
            "started: {} full environments (etcd, kube-apiserver, kube-controller-manager, CAPI core, CABPK, KCP), \
             {} with fewer CAPI managers, {} kube-apiservers in all ({} of them in simulated control-plane VMs)",
            self.full, self.api_server_only, self.api_servers, self.guest_api_servers
        )
    }
}

#[cfg(test)]
mod tests;
