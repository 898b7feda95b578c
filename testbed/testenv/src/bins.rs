//! Where the binaries come from. Upstream ones from `CAPKR_TEST_BIN` or `hack/test-tools.sh`;
//! ours from `target/debug` (or `CAPKR_MANAGER_BIN` / `KAIRON_SIM_BIN`). A missing binary is
//! an error that says how to get it: tests fail, they never skip.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// The workspace root (this crate lives in `<root>/testbed/testenv`).
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| here.to_path_buf())
}

const HOW_TO_GET_TOOLS: &str = "build them with `make test-tools` (or `hack/test-tools.sh`) and set \
     CAPKR_TEST_BIN=$(hack/test-tools.sh | tail -1); `make test` does both";

/// Paths of everything the environment runs.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub dir: PathBuf,
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kubectl: PathBuf,
    pub capi_core: PathBuf,
    pub capi_bootstrap: PathBuf,
    pub capi_control_plane: PathBuf,
    pub clusterctl: PathBuf,
    pub helm: PathBuf,
    /// `<dir>/../manifests/capi` (or `CAPKR_TEST_MANIFESTS`): CAPI CRD bases and webhook manifests.
    pub capi_manifests: PathBuf,
}

impl Binaries {
    /// Finds the upstream binaries once per test process.
    pub fn locate() -> Result<Binaries> {
        static CACHE: OnceLock<std::result::Result<Binaries, String>> = OnceLock::new();
        CACHE
            .get_or_init(|| Binaries::locate_uncached().map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(anyhow::Error::msg)
    }

    fn locate_uncached() -> Result<Binaries> {
        let dir = match std::env::var_os("CAPKR_TEST_BIN").filter(|v| !v.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => run_test_tools()?,
        };
        if !dir.is_dir() {
            bail!("test binaries dir {} does not exist: {HOW_TO_GET_TOOLS}", dir.display());
        }
        let dir = dir.canonicalize().unwrap_or(dir);
        let need = |n: &str| -> Result<PathBuf> {
            let p = dir.join(n);
            if !is_executable(&p) {
                bail!("{} is missing or not executable: {HOW_TO_GET_TOOLS}", p.display());
            }
            Ok(p)
        };
        let capi_manifests = match std::env::var_os("CAPKR_TEST_MANIFESTS").filter(|v| !v.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => dir.join("../manifests/capi"),
        };
        if !capi_manifests.join("core/crd").is_dir() {
            bail!(
                "Cluster API manifests not found at {} (set CAPKR_TEST_MANIFESTS or {HOW_TO_GET_TOOLS})",
                capi_manifests.display()
            );
        }
        Ok(Binaries {
            etcd: need("etcd")?,
            kube_apiserver: need("kube-apiserver")?,
            kube_controller_manager: need("kube-controller-manager")?,
            kubectl: need("kubectl")?,
            capi_core: need("capi-manager")?,
            capi_bootstrap: need("capi-kubeadm-bootstrap-manager")?,
            capi_control_plane: need("capi-kubeadm-control-plane-manager")?,
            clusterctl: need("clusterctl")?,
            helm: need("helm")?,
            capi_manifests,
            dir,
        })
    }
}

fn run_test_tools() -> Result<PathBuf> {
    let script = workspace_root().join("hack/test-tools.sh");
    let out = std::process::Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {} ({HOW_TO_GET_TOOLS})", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({}): {HOW_TO_GET_TOOLS}", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(l) => Ok(PathBuf::from(l.trim())),
        None => bail!("{} printed no bin dir: {HOW_TO_GET_TOOLS}", script.display()),
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// One of this workspace's binaries: `$<env_var>` or `<workspace>/target/debug/<name>`.
pub fn own_binary(name: &str, env_var: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env_var).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        if !is_executable(&p) {
            bail!("{env_var}={} is not an executable file", p.display());
        }
        return Ok(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let p = target.join("debug").join(name);
    if !is_executable(&p) {
        bail!(
            "{} not found: run `cargo build --workspace --bins` first (`make test` does), or set {env_var}",
            p.display()
        );
    }
    Ok(p)
}
