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

/// Where the octets in use are claimed, one file per octet naming the claiming process.
const OCTET_CLAIMS: &str = "capkr-test-octets";
/// Octets handed out: `20..250`.
const FIRST_OCTET: u32 = 20;
const OCTETS: u32 = 230;

impl GuestNetwork {
    /// An octet no other live process on this machine holds (test binaries run side by side,
    /// and two of them on one endpoint address see each other's clusters), claimed for this
    /// process until it exits.
    pub fn pick() -> GuestNetwork {
        let seed = std::process::id()
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
        GuestNetwork {
            octet: claim_octet(&std::env::temp_dir().join(OCTET_CLAIMS), seed),
        }
    }
    pub fn address_pool(&self) -> String {
        format!("127.{}.0.0/20", self.octet)
    }
    pub fn endpoint_ip(&self, n: u32) -> String {
        format!("127.{}.100.{n}", self.octet)
    }
}

/// Claims an octet under `dir`, trying from `seed` on: a claim is a file created exclusively,
/// holding the claiming process's id; a claim whose process is gone is taken over. When every
/// octet is held, the seed's own (as before claims existed).
pub fn claim_octet(dir: &Path, seed: u32) -> u32 {
    let _ = std::fs::create_dir_all(dir);
    for i in 0..OCTETS {
        let octet = FIRST_OCTET + (seed.wrapping_add(i)) % OCTETS;
        let path = dir.join(octet.to_string());
        if crate::net::claim(&path) {
            return octet;
        }
    }
    FIRST_OCTET + seed % OCTETS
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

#[cfg(test)]
mod octet_tests {
    use super::*;

    #[test]
    fn octets_are_claimed_once_and_a_dead_process_s_claim_is_taken_over() {
        let dir = std::env::temp_dir().join(format!("capkr-octet-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = claim_octet(&dir, 5);
        let b = claim_octet(&dir, 5);
        assert_eq!(a, FIRST_OCTET + 5);
        assert_ne!(a, b, "a second claim gets another octet");
        // A claim by a live process (pid 1) is skipped; one by a process that is gone is taken.
        std::fs::write(dir.join((FIRST_OCTET + 40).to_string()), "1").unwrap();
        std::fs::write(dir.join((FIRST_OCTET + 41).to_string()), "4294967295").unwrap();
        assert_eq!(claim_octet(&dir, 40), FIRST_OCTET + 41);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
