//! What the tests started, for `make test`'s last lines: the runner (`capkr-test-runner`) sets
//! `CAPKR_TESTENV_TALLY` to a directory per test binary, every test process appends one line
//! per environment or API server it starts to a file of its own there, and the runner counts
//! the lines, in all and per binary.

use std::io::Write;

/// The env var naming the tally directory.
pub const TALLY_DIR_ENV: &str = "CAPKR_TESTENV_TALLY";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Started {
    /// etcd, kube-apiserver, kube-controller-manager and CAPI's three managers.
    FullEnvironment,
    /// etcd, kube-apiserver and kube-controller-manager with fewer CAPI managers (or none).
    ApiServerEnvironment,
    /// A further kube-apiserver: a workload cluster's or a Kairon API's.
    ApiServer,
    /// The kube-apiserver of a simulated control-plane VM (written by `kairon-sim`, which
    /// does not link this crate).
    GuestApiServer,
}

impl Started {
    pub fn word(self) -> &'static str {
        match self {
            Started::FullEnvironment => "full-environment",
            Started::ApiServerEnvironment => "api-server-environment",
            Started::ApiServer => "api-server",
            Started::GuestApiServer => "guest-api-server",
        }
    }
}

/// Appends `what` to this process's tally file, when a tally is being kept.
pub(crate) fn record(what: Started) {
    let Some(dir) = std::env::var_os(TALLY_DIR_ENV) else {
        return;
    };
    let path = std::path::Path::new(&dir).join(std::process::id().to_string());
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{}", what.word());
    }
}
