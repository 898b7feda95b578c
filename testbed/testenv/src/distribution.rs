//! For the tests of the release artefacts (the `distribution` test binary, and the `e2e`
//! modules that install the provider as users do): the release assets as a clusterctl local
//! repository, the real `clusterctl`, `helm` and `kubectl` binaries, and small YAML helpers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{Binaries, KUBERNETES_VERSION, ScratchDir, machine_image, parse_yaml_documents, workspace_root};
use serde_json::Value;

pub const VERSION: &str = "v0.1.0";
/// The flavors in templates/ ("" is the default `cluster-template.yaml`).
pub const FLAVORS: [&str; 6] = [
    "",
    "md-remediation",
    "topology",
    "identity",
    "machinepool",
    "topology-machinepool",
];

pub fn bins() -> Binaries {
    Binaries::locate().expect("upstream binaries (clusterctl, helm, kubectl)")
}

pub fn root() -> PathBuf {
    workspace_root()
}

/// Runs a command and returns its output; panics with stdout and stderr when it fails.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn docs(yaml: &str) -> Vec<Value> {
    parse_yaml_documents(yaml).expect("valid YAML")
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A clusterctl local file repository in a temp dir (kept with `CAPKR_TEST_KEEP=1`), holding
/// `make release-manifests`'s output as `infrastructure-kairon/v0.1.0/`, with its own
/// `clusterctl.yaml` and XDG config dir so clusterctl never reads the user's config or reaches
/// GitHub.
pub struct LocalRepo {
    pub dir: ScratchDir,
    pub bins: Binaries,
}

impl LocalRepo {
    /// Runs `hack/release-manifests.sh` into a new temp dir: work, not a default value.
    #[expect(clippy::new_without_default, reason = "new builds the release assets")]
    pub fn new() -> LocalRepo {
        let dir = ScratchDir::new("capkr-clusterctl-repo-").expect("a temp dir");
        let repo = LocalRepo { dir, bins: bins() };
        let out = repo.version_dir("infrastructure-kairon", VERSION);
        run_ok(Command::new(root().join("hack/release-manifests.sh")).arg(&out));
        std::fs::create_dir_all(repo.path().join("xdg")).unwrap();
        // Forces the "no management cluster" path of `generate cluster` (ClusterClass from the repo).
        std::fs::write(repo.path().join("empty.kubeconfig"), "").unwrap();
        repo.write_config(&[]);
        repo
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn version_dir(&self, label: &str, version: &str) -> PathBuf {
        let d = self.path().join("repo").join(label).join(version);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    pub fn components_path(&self) -> PathBuf {
        self.version_dir("infrastructure-kairon", VERSION)
            .join("infrastructure-components.yaml")
    }

    /// `providers:` entries: kairon plus `extra` (name, type, file URL); cert-manager is
    /// treated as externally provided (clusterctl then only checks its API answers).
    pub fn write_config(&self, extra: &[(&str, &str, PathBuf)]) {
        let mut cfg = format!(
            "providers:\n  - name: kairon\n    type: InfrastructureProvider\n    url: file://{}\n",
            self.components_path().display()
        );
        for (name, typ, url) in extra {
            cfg.push_str(&format!(
                "  - name: {name}\n    type: {typ}\n    url: file://{}\n",
                url.display()
            ));
        }
        cfg.push_str("cert-manager:\n  externallyProvisioned: \"true\"\n  timeout: 30s\n");
        std::fs::write(self.path().join("clusterctl.yaml"), cfg).unwrap();
    }

    /// `clusterctl <args> --config <repo>/clusterctl.yaml`, isolated from the user's config.
    pub fn clusterctl(&self) -> Command {
        let mut cmd = Command::new(&self.bins.clusterctl);
        cmd.env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .env("XDG_CONFIG_HOME", self.path().join("xdg"))
            .env("HOME", self.path())
            .env("KUBECONFIG", self.path().join("empty.kubeconfig"))
            .env("GOPROXY", "off")
            .arg("--config")
            .arg(self.path().join("clusterctl.yaml"));
        cmd
    }

    /// `clusterctl generate cluster` for a flavor, with every required variable set.
    pub fn generate_cluster(&self, name: &str, namespace: &str, flavor: &str) -> String {
        let mut cmd = self.clusterctl();
        cmd.args(["generate", "cluster", name, "--infrastructure"])
            .arg(format!("kairon:{VERSION}"))
            .args([
                "--target-namespace",
                namespace,
                "--kubernetes-version",
                KUBERNETES_VERSION,
            ])
            .args(["--control-plane-machine-count", "3", "--worker-machine-count", "2"])
            .env("CONTROL_PLANE_ENDPOINT_IP", "10.20.0.100")
            .env("KAIRON_MACHINE_IMAGE", machine_image())
            .env("KAIRON_IDENTITY_SECRET_NAME", "kairon-site-a");
        if !flavor.is_empty() {
            cmd.args(["--flavor", flavor]);
        }
        stdout(&run_ok(&mut cmd))
    }
}

/// The names in the first column (`` `NAME` ``) of the Markdown table under `heading` in docs/install.md.
pub fn documented_variables(heading: &str) -> Vec<String> {
    let readme = read(&root().join("docs/install.md"));
    let mut lines = readme.lines().skip_while(|l| l.trim() != heading);
    assert!(lines.next().is_some(), "docs/install.md has no heading {heading:?}");
    let mut names: Vec<String> = lines
        .take_while(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('`').nth(1).map(str::to_string))
        .collect();
    names.sort();
    names
}

/// cert-manager's API as far as `clusterctl init` uses it: it creates a test Issuer and
/// Certificate (and the providers' own) — nothing needs to act on them here.
pub const CERT_MANAGER_STUB_CRDS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: issuers.cert-manager.io
spec:
  group: cert-manager.io
  names: {kind: Issuer, listKind: IssuerList, plural: issuers, singular: issuer}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: certificates.cert-manager.io
spec:
  group: cert-manager.io
  names: {kind: Certificate, listKind: CertificateList, plural: certificates, singular: certificate}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

/// The source dir and version of the pinned Cluster API module (`testbed/tools/capi`), from the
/// Go module cache.
pub fn capi_module() -> (PathBuf, String) {
    let out = run_ok(
        Command::new("go")
            .args(["mod", "download", "-json", "sigs.k8s.io/cluster-api"])
            .current_dir(root().join("testbed/tools/capi")),
    );
    let module: Value = serde_json::from_slice(&out.stdout).expect("go mod download -json");
    let dir = PathBuf::from(module["Dir"].as_str().expect("module dir"));
    let version = module["Version"].as_str().expect("module version").to_string();
    (dir, version)
}
