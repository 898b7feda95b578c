//! The shipped cluster templates as a user gets them: the release assets
//! (`hack/release-manifests.sh`) as a clusterctl local repository, the real
//! `clusterctl generate cluster`, and the simulator running control-plane VMs for real
//! (`kairon-sim --guest-bin-dir`, see its README) on a loopback network of their own.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::bins::{Binaries, workspace_root};

/// The provider version the release assets are written as.
pub const VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));

/// A loopback network for simulated VMs: `127.<octet>.0.0/20` for VM addresses, and
/// `127.<octet>.100.<n>` for control-plane endpoints (kube-vip addresses), n = 1, 2, ...
#[derive(Clone, Copy, Debug)]
pub struct GuestNetwork {
    pub octet: u32,
}

impl GuestNetwork {
    /// An octet unlikely to be used by another environment on this machine.
    pub fn pick() -> GuestNetwork {
        let seed = std::process::id()
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
        GuestNetwork { octet: 20 + seed % 230 }
    }
    pub fn address_pool(&self) -> String {
        format!("127.{}.0.0/20", self.octet)
    }
    pub fn endpoint_ip(&self, n: u32) -> String {
        format!("127.{}.100.{n}", self.octet)
    }
}

/// The `kairon-sim` delays the real-control-plane tests use (the rig, the templates rig, the
/// CAPI suite): short, so a cluster comes up in seconds, yet every phase is seen.
pub fn guest_delay_args() -> Vec<String> {
    [
        "--provision-delay",
        "200ms",
        "--boot-delay",
        "500ms",
        "--delete-delay",
        "1s",
    ]
    .map(String::from)
    .to_vec()
}

/// `kairon-sim` flags that make control-plane VMs run etcd and kube-apiserver for real.
pub fn guest_simulator_args(bins: &Binaries, guest_dir: &Path, net: &GuestNetwork) -> Result<Vec<String>> {
    if !bins.dir.join("kairon-guest").exists() {
        bail!(
            "{} lacks kairon-guest: rebuild the test tools (`hack/test-tools.sh`)",
            bins.dir.display()
        );
    }
    std::fs::create_dir_all(guest_dir).with_context(|| format!("creating {}", guest_dir.display()))?;
    Ok(vec![
        "--address-pool".into(),
        net.address_pool(),
        "--guest-bin-dir".into(),
        bins.dir.display().to_string(),
        "--guest-dir".into(),
        guest_dir.display().to_string(),
    ])
}

/// The release assets as a clusterctl local repository, with its own config and XDG dirs so
/// clusterctl reads nothing of the user's and never reaches GitHub.
pub struct ClusterctlRepo {
    pub dir: PathBuf,
    clusterctl: PathBuf,
}

impl ClusterctlRepo {
    /// Writes the release assets into `<dir>/repo/infrastructure-kairon/<VERSION>/`.
    pub fn create(dir: &Path, bins: &Binaries) -> Result<ClusterctlRepo> {
        let version_dir = dir.join("repo").join("infrastructure-kairon").join(VERSION);
        std::fs::create_dir_all(&version_dir)?;
        std::fs::create_dir_all(dir.join("xdg"))?;
        let out = Command::new(workspace_root().join("hack/release-manifests.sh"))
            .arg(&version_dir)
            .env("VERSION", VERSION)
            .output()
            .context("running hack/release-manifests.sh")?;
        if !out.status.success() {
            bail!(
                "hack/release-manifests.sh failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::write(dir.join("empty.kubeconfig"), "")?;
        std::fs::write(
            dir.join("clusterctl.yaml"),
            format!(
                "providers:\n  - name: kairon\n    type: InfrastructureProvider\n    url: file://{}\n",
                version_dir.join("infrastructure-components.yaml").display()
            ),
        )?;
        Ok(ClusterctlRepo {
            dir: dir.to_path_buf(),
            clusterctl: bins.clusterctl.clone(),
        })
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join("clusterctl.yaml")
    }

    /// `clusterctl --config <repo>/clusterctl.yaml`, isolated from the user's config.
    pub fn clusterctl(&self) -> Command {
        let mut cmd = Command::new(&self.clusterctl);
        cmd.env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .env("XDG_CONFIG_HOME", self.dir.join("xdg"))
            .env("HOME", &self.dir)
            .env("KUBECONFIG", self.dir.join("empty.kubeconfig"))
            .env("GOPROXY", "off")
            .arg("--config")
            .arg(self.config_path());
        cmd
    }

    /// `clusterctl generate cluster` of a flavor ("" = default) with the variables a user
    /// sets for the simulator: the endpoint address and an image name.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_cluster(
        &self,
        name: &str,
        namespace: &str,
        flavor: &str,
        kubernetes_version: &str,
        control_planes: u32,
        workers: u32,
        endpoint_ip: &str,
    ) -> Result<String> {
        let mut cmd = self.clusterctl();
        cmd.args(["generate", "cluster", name, "--infrastructure"])
            .arg(format!("kairon:{VERSION}"))
            .args([
                "--target-namespace",
                namespace,
                "--kubernetes-version",
                kubernetes_version,
            ])
            .arg("--control-plane-machine-count")
            .arg(control_planes.to_string())
            .arg("--worker-machine-count")
            .arg(workers.to_string())
            .env("CONTROL_PLANE_ENDPOINT_IP", endpoint_ip)
            .env("KAIRON_MACHINE_IMAGE", format!("ubuntu-2404-kube-{kubernetes_version}"));
        if !flavor.is_empty() {
            cmd.args(["--flavor", flavor]);
        }
        let out = cmd.output().context("running clusterctl")?;
        if !out.status.success() {
            bail!(
                "clusterctl generate cluster failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
