//! Following the audit log while the benchmark runs: which requests a client made in a window,
//! and when it has gone quiet.

use std::time::{Duration, Instant};

use anyhow::Result;
use capkr_testenv::Env;
use capkr_testenv::audit::{AuditEvent, AuditLog};

/// The identity the benchmark gives the manager: its User-Agent is `capkr-manager/<v> (bench)`.
pub const MANAGER_IDENTITY: &str = "bench";

/// The User-Agent of the floor client.
pub const FLOOR_USER_AGENT: &str = concat!("capkr-bench-floor/", env!("CARGO_PKG_VERSION"));

/// The manager's requests that count: Leases (leader election) are left out, and so are
/// `GET /version`, which is what the benchmark's own `/readyz` probes cause.
pub fn is_manager_request(e: &AuditEvent) -> bool {
    e.from_manager(Some(MANAGER_IDENTITY)) && !e.is_lease() && e.resource_path() != "/version"
}

pub fn is_floor_request(e: &AuditEvent) -> bool {
    e.from_agent(FLOOR_USER_AGENT, None)
}

/// The audit log from a point on.
pub struct Traffic {
    log: AuditLog,
}

impl Traffic {
    /// Starts at the log's current end.
    pub fn from_now(env: &Env) -> Result<Traffic> {
        let mut log = env.audit_log()?;
        log.read_new()?;
        Ok(Traffic { log })
    }

    /// Everything written since the last call that `keep` selects.
    pub fn take(&mut self, keep: impl Fn(&AuditEvent) -> bool) -> Result<Vec<AuditEvent>> {
        Ok(self.log.read_new()?.into_iter().filter(|e| keep(e)).collect())
    }

    /// Collects what `keep` selects until none of it has been written for `quiet` (or
    /// `timeout` passed: then the second value is false).
    pub async fn until_quiet(
        &mut self,
        keep: impl Fn(&AuditEvent) -> bool,
        quiet: Duration,
        timeout: Duration,
    ) -> Result<(Vec<AuditEvent>, bool)> {
        self.until_quiet_keeping(&keep, &keep, quiet, timeout).await
    }

    /// Collects what `keep` selects until none of what `quiet_on` selects has been written for
    /// `quiet` (or `timeout` passed: then the second value is false). With `keep` wider than
    /// `quiet_on`, the other clients' requests of the same window come along.
    pub async fn until_quiet_keeping(
        &mut self,
        keep: impl Fn(&AuditEvent) -> bool,
        quiet_on: impl Fn(&AuditEvent) -> bool,
        quiet: Duration,
        timeout: Duration,
    ) -> Result<(Vec<AuditEvent>, bool)> {
        let start = Instant::now();
        let mut last = Instant::now();
        let mut got = Vec::new();
        loop {
            let new = self.take(&keep)?;
            if new.iter().any(&quiet_on) {
                last = Instant::now();
            }
            got.extend(new);
            if last.elapsed() >= quiet {
                return Ok((got, true));
            }
            if start.elapsed() >= timeout {
                return Ok((got, false));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
