//! Cluster API's own end-to-end specs (`sigs.k8s.io/cluster-api/test/e2e`, unmodified) against
//! the provider: the Go module `tests/capi-e2e` is compiled into a Ginkgo test binary, and run
//! against one management environment shared by every spec — etcd, kube-apiserver, CAPI core
//! (with ClusterTopology), CABPK, KCP, capkr-manager, and the simulator whose guests act out
//! kubeadm with real etcd and kube-apiserver processes. The framework uses that environment as
//! an existing cluster; this file writes the e2e config (providers from the release assets,
//! variables, intervals), the suite creates the clusterctl repository and inventory.
//!
//! Two specs need Machine taints in their flavors; the test writes those flavors
//! (`kcp-md-taints`, `topology-taints`) next to the release assets, from the shipped default and
//! topology flavors, and runs CAPI with the `MachineTaintPropagation` feature gate.
//!
//! The Runtime SDK specs call the test Runtime Extension (`tests/capi-e2e/extension`), which
//! runs here as a process beside the managers; CAPI core (with `RuntimeSDK`) reaches it at the
//! Service address the specs' ExtensionConfigs name through the extension's own proxy.
//!
//! `CAPKR_CAPI_E2E_FOCUS` (a Ginkgo label filter, e.g. `quick-start`) runs a subset;
//! `CAPKR_CAPI_E2E_REPEAT=N` runs the selected specs N more times on the same environment,
//! stopping at the first failure (a loop for a flaky spec); `CAPKR_CAPI_E2E_AUDIT=1` writes the management API server's audit log
//! (every request at Metadata level; or `=<file>`, that audit policy) into the environment's
//! dir, for finding who wrote what.
//! The specs that run and those that cannot here are listed in `docs/capi-e2e.md`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use capkr_testenv::flavors::{ClusterctlRepo, GuestNetwork, VERSION, guest_delay_args, guest_simulator_args};
use capkr_testenv::{
    Env, EnvOptions, KUBERNETES_VERSION, Process, ProcessSpec, SIMULATOR_HOSTS, free_port, workspace_root,
};

/// The CAPI release of the managers (tests/tools/capi); the specs are those of the test module
/// v1.14.4, built against this release (tests/capi-e2e/go.mod).
const CAPI_VERSION: &str = "v1.14.2";

/// The versions the upgrade specs go from and to, upstream's own: a minor upgrade (its
/// MachineSet preflight check expects the kubeadm version skew of one), between versions of
/// the kind mapper, where upstream's upgrade-plan handler takes its versions from. The newest
/// v1.36 there is v1.36.4, the only v1.37 is v1.37.0: with [`KUBERNETES_VERSION`] v1.37.2 as
/// the target the handler plans v1.37.0 and CAPI refuses a plan that does not end at the
/// target. The guests report these as their kubelet's version (their image names it); their
/// etcd and kube-apiserver are the binaries of [`KUBERNETES_VERSION`].
const KUBERNETES_VERSION_UPGRADE_FROM: &str = "v1.36.4";
const KUBERNETES_VERSION_UPGRADE_TO: &str = "v1.37.0";

/// Where the Runtime SDK specs' ExtensionConfigs say the test Runtime Extension is: the
/// Service `test-extension-webhook-service` in `test-extension-system`, as upstream deploys it.
const EXTENSION_NAMESPACE: &str = "test-extension-system";
const EXTENSION_SERVICE: &str = "test-extension-webhook-service";

/// Left out unless `CAPKR_CAPI_E2E_FOCUS` (a Ginkgo label filter) names them: the specs that
/// cannot pass here (docs/capi-e2e.md).
const DEFAULT_LABEL_FILTER: &str = "!not-applicable";

/// The Ginkgo suite compiled by `hack/capi-e2e-suite.sh` (`go test -c`, cached by the
/// module's content outside the source tree; `.ci/run` has it built while cargo builds).
fn build_suite() -> PathBuf {
    let script = workspace_root().join("hack/capi-e2e-suite.sh");
    let output = match Command::new(&script).output() {
        Ok(o) => o,
        Err(e) => panic!("running {}: {e}", script.display()),
    };
    assert!(
        output.status.success(),
        "{} failed (the CAPI e2e suite needs the Go toolchain, go 1.26, on PATH):\n{}{}",
        script.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(path.is_file(), "{} printed no suite binary: {stdout}", script.display());
    path
}

/// The taints the KCP/MachineDeployment and ClusterClass rollout specs expect on every
/// Machine and Node from the start (upstream's `kcp-md-taints` and `topology-taints` flavors
/// add the same to its own templates).
const PRE_EXISTING_TAINTS: &str = "taints:
  - key: pre-existing-on-initialization-taint
    value: on-initialization-value
    effect: PreferNoSchedule
    propagation: OnInitialization
  - key: pre-existing-always-taint
    value: always-value
    effect: PreferNoSchedule
    propagation: Always
";

/// `PRE_EXISTING_TAINTS` indented by `indent` spaces.
fn taints(indent: usize) -> String {
    PRE_EXISTING_TAINTS
        .lines()
        .map(|l| format!("{}{l}\n", " ".repeat(indent)))
        .collect()
}

/// Inserts `what` after the one occurrence of `anchor` in `text`.
fn insert_after(text: &str, anchor: &str, what: &str) -> String {
    assert_eq!(
        text.matches(anchor).count(),
        1,
        "the shipped template should have {anchor:?} exactly once"
    );
    text.replacen(anchor, &format!("{anchor}{what}"), 1)
}

/// Test flavors the rollout specs need and the release does not ship: the shipped default and
/// topology flavors with Machine taints on the control plane and the workers.
fn write_taint_flavors(assets: &Path) {
    let read = |f: &str| {
        std::fs::read_to_string(assets.join(f)).unwrap_or_else(|e| panic!("reading {f} from the release assets: {e}"))
    };
    let default = read("cluster-template.yaml");
    let kcp_md = insert_after(&default, "  machineTemplate:\n    spec:\n", &taints(6));
    let kcp_md = insert_after(
        &kcp_md,
        "  template:\n    spec:\n      clusterName: ${CLUSTER_NAME}\n",
        &taints(6),
    );
    std::fs::write(assets.join("cluster-template-kcp-md-taints.yaml"), kcp_md).expect("writing a flavor");
    let topology = read("cluster-template-topology.yaml");
    let topology = insert_after(
        &topology,
        "    controlPlane:\n      replicas: ${CONTROL_PLANE_MACHINE_COUNT}\n",
        &taints(6),
    );
    let topology = insert_after(&topology, "          replicas: ${WORKER_MACHINE_COUNT}\n", &taints(10));
    std::fs::write(assets.join("cluster-template-topology-taints.yaml"), topology).expect("writing a flavor");
}

/// The flavor the MachineDeployment remediation spec runs: the shipped `md-remediation` flavor
/// whose MachineHealthCheck also takes upstream's test condition (`e2e.remediation.condition`
/// False for 10 s) and remediates however many workers are unhealthy, as upstream's own
/// `md-remediation` flavor does. The spec sets the first unhealthy condition of the
/// MachineHealthCheck on the Node of its one worker and waits 5 minutes for the remediation:
/// the shipped conditions (Ready Unknown or False for 300 s) would take all of that before
/// remediation starts, and the shipped limit (at most 40% of the workers unhealthy) stops it
/// for a single worker.
fn write_md_remediation_flavor(assets: &Path) {
    let shipped = std::fs::read_to_string(assets.join("cluster-template-md-remediation.yaml"))
        .unwrap_or_else(|e| panic!("reading cluster-template-md-remediation.yaml from the release assets: {e}"));
    let flavor = insert_after(
        &shipped,
        "    unhealthyNodeConditions:\n",
        "      - type: e2e.remediation.condition\n        status: \"False\"\n        timeoutSeconds: 10\n",
    );
    let limit = "      unhealthyLessThanOrEqualTo: 40%\n";
    assert_eq!(
        flavor.matches(limit).count(),
        1,
        "the shipped md-remediation flavor limits remediation to 40%"
    );
    let flavor = flavor.replacen(limit, "      unhealthyLessThanOrEqualTo: 100%\n", 1);
    std::fs::write(assets.join("cluster-template-md-remediation-e2e.yaml"), flavor).expect("writing a flavor");
}

/// The script upstream's `kcp-remediation` flavor runs before kubeadm on each control-plane
/// VM: it polls the spec's `mhc-test` ConfigMap on the management cluster (with the token
/// and address the spec passes as variables) until the spec says `pass`, then acknowledges.
const WAIT_SIGNAL_SCRIPT: &str = r#"#!/bin/bash
set -o errexit
set -o pipefail
echo "Waiting for signal..."
TOKEN=$1
SERVER=$2
NAMESPACE=$3
while true;
do
  sleep 1s
  signal=$(curl -k -s --header "Authorization: Bearer $TOKEN" $SERVER/api/v1/namespaces/$NAMESPACE/configmaps/mhc-test | jq -r .data.signal?)
  echo "signal $signal"
  if [ "$signal" == "pass" ]; then
     curl -k -s --header "Authorization: Bearer $TOKEN" -XPATCH -H "Content-Type: application/strategic-merge-patch+json" --data '{"data": {"signal": "ack-pass"}}' $SERVER/api/v1/namespaces/$NAMESPACE/configmaps/mhc-test
     exit 0
  fi
done
"#;

/// The MachineHealthCheck of upstream's `kcp-remediation` flavor: control-plane Machines the
/// spec labels `mhc-test: fail` are remediated when their Node does not start within 30 s or
/// carries the spec's condition for 10 s.
const KCP_REMEDIATION_MHC: &str = r#"---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineHealthCheck
metadata:
  name: ${CLUSTER_NAME}-mhc-0
spec:
  clusterName: ${CLUSTER_NAME}
  selector:
    matchLabels:
      cluster.x-k8s.io/control-plane: ""
      mhc-test: fail
  checks:
    nodeStartupTimeoutSeconds: 30
    unhealthyNodeConditions:
      - type: e2e.remediation.condition
        status: "False"
        timeoutSeconds: 10
  remediation:
    triggerIf:
      unhealthyLessThanOrEqualTo: 100%
"#;

/// The flavor the KCP remediation spec needs, as upstream's `kcp-remediation`: the shipped
/// default flavor whose control-plane VMs wait, before kubeadm, for the spec's signal, plus the
/// spec's MachineHealthCheck. The simulator runs that script (`--guest-scripts-dir`).
fn write_kcp_remediation_flavor(assets: &Path) {
    let default = std::fs::read_to_string(assets.join("cluster-template.yaml"))
        .unwrap_or_else(|e| panic!("reading cluster-template.yaml from the release assets: {e}"));
    let flavor = insert_after(
        &default,
        "    preKubeadmCommands:\n",
        "      - ./wait-signal.sh \"${TOKEN}\" \"${SERVER}\" \"${NAMESPACE}\"\n",
    );
    let script: String = WAIT_SIGNAL_SCRIPT.lines().map(|l| format!("          {l}\n")).collect();
    let flavor = insert_after(
        &flavor,
        "    files:\n",
        &format!("      - path: /wait-signal.sh\n        permissions: \"0777\"\n        content: |\n{script}"),
    );
    std::fs::write(
        assets.join("cluster-template-kcp-remediation.yaml"),
        format!("{flavor}{KCP_REMEDIATION_MHC}"),
    )
    .expect("writing a flavor");
}

/// The text of `text` with the part from `start` (included) to `end` (excluded) removed; each
/// anchor must occur once, `end` after `start`.
fn remove_between(text: &str, start: &str, end: &str) -> String {
    assert_eq!(text.matches(start).count(), 1, "{start:?} should occur exactly once");
    let from = text.find(start).unwrap_or_default();
    let to = text[from..]
        .find(end)
        .map(|i| from + i)
        .unwrap_or_else(|| panic!("{end:?} should follow {start:?}"));
    format!("{}{}", &text[..from], &text[to..])
}

/// `block`'s lines re-indented: `from` leading spaces become `to`.
fn reindent(block: &str, from: usize, to: usize) -> String {
    block
        .lines()
        .map(|l| match l.strip_prefix(&" ".repeat(from)) {
            Some(rest) => format!("{}{rest}\n", " ".repeat(to)),
            None => format!("{}\n", l.trim_start()),
        })
        .collect()
}

/// `text` without the YAML block of `key` (a line `key:` and the deeper-indented lines after it).
fn without_block(text: &str, key: &str) -> String {
    let indent = key.len() - key.trim_start().len();
    let mut out = String::new();
    let mut skipping = false;
    let mut found = false;
    for line in text.lines() {
        let depth = line.len() - line.trim_start().len();
        if skipping && (line.trim().is_empty() || depth > indent) {
            continue;
        }
        skipping = line == format!("{key}:");
        found |= skipping;
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(found, "no block {key:?}");
    out
}

/// The documents of a shipped flavor, by kind (each must occur once).
fn document<'a>(docs: &[&'a str], kind: &str) -> &'a str {
    let found: Vec<&&str> = docs
        .iter()
        .filter(|d| d.contains(&format!("\nkind: {kind}\n")))
        .collect();
    assert_eq!(found.len(), 1, "the shipped default flavor should hold one {kind}");
    found[0]
}

/// `doc` with `labels` added to its metadata.
fn labelled(doc: &str, labels: &str) -> String {
    insert_after(doc, "\nmetadata:\n", &format!("  labels:\n{labels}"))
}

/// The flavor the KCP adoption spec needs, as upstream's `kcp-adoption`: objects labelled
/// `kcp-adoption.step1` make a Cluster without a control-plane provider and one control-plane
/// Machine with its own KubeadmConfig and KaironMachine (the shipped default flavor's
/// KubeadmControlPlane spec and control-plane template, unchanged); those labelled
/// `kcp-adoption.step2` are the shipped default flavor's Cluster and control plane, whose
/// KubeadmControlPlane then adopts the Machine.
fn write_kcp_adoption_flavor(assets: &Path) {
    let default = std::fs::read_to_string(assets.join("cluster-template.yaml"))
        .unwrap_or_else(|e| panic!("reading cluster-template.yaml from the release assets: {e}"));
    let docs: Vec<&str> = default.split("\n---\n").map(|d| d.trim_end_matches('\n')).collect();
    let cluster = format!("\n{}", document(&docs, "Cluster"));
    let infra_cluster = format!("\n{}", document(&docs, "KaironCluster"));
    let cp_template = format!(
        "\n{}",
        document(
            &docs,
            "KaironMachineTemplate\nmetadata:\n  name: ${CLUSTER_NAME}-control-plane"
        )
    );
    let kcp = format!("\n{}", document(&docs, "KubeadmControlPlane"));

    let step1 = "    kcp-adoption.step1: \"\"\n";
    let step2 = "    kcp-adoption.step2: \"\"\n";
    let control_plane = "    cluster.x-k8s.io/control-plane: \"\"\n";
    let cp0 = "${CLUSTER_NAME}-control-plane-0";
    let machine_spec = cp_template
        .split_once("\n  template:\n    spec:\n")
        .map(|(_, spec)| reindent(spec, 6, 2))
        .expect("the control-plane KaironMachineTemplate has spec.template.spec");
    // As KCP makes the first Machine's: its InitConfiguration, no JoinConfiguration (KCP
    // tells the first Machine from the others by which of the two it has).
    let kubeadm_config_spec = kcp
        .split_once("\n  kubeadmConfigSpec:\n")
        .map(|(_, spec)| without_block(&reindent(spec, 4, 2), "  joinConfiguration"))
        .expect("the KubeadmControlPlane has a kubeadmConfigSpec");
    let without_control_plane = cluster
        .split_once("\n  controlPlaneRef:\n")
        .map(|(head, _)| head.to_string())
        .expect("the shipped Cluster ends with its controlPlaneRef");
    let step1_docs = [
        labelled(&without_control_plane, step1),
        labelled(&infra_cluster, step1),
        format!(
            "\napiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: KaironMachine\nmetadata:\n  name: {cp0}\n  labels:\n{control_plane}{step1}spec:\n{machine_spec}"
        ),
        format!(
            "\napiVersion: bootstrap.cluster.x-k8s.io/v1beta2\nkind: KubeadmConfig\nmetadata:\n  name: {cp0}\n  labels:\n{control_plane}{step1}spec:\n{kubeadm_config_spec}"
        ),
        format!(
            "\napiVersion: cluster.x-k8s.io/v1beta2\nkind: Machine\nmetadata:\n  name: {cp0}\n  labels:\n{control_plane}{step1}spec:\n  clusterName: ${{CLUSTER_NAME}}\n  version: ${{KUBERNETES_VERSION}}\n  bootstrap:\n    configRef:\n      apiGroup: bootstrap.cluster.x-k8s.io\n      kind: KubeadmConfig\n      name: {cp0}\n  infrastructureRef:\n    apiGroup: infrastructure.cluster.x-k8s.io\n    kind: KaironMachine\n    name: {cp0}\n"
        ),
    ];
    let step2_docs = [&cluster, &infra_cluster, &cp_template, &kcp].map(|d| labelled(d, step2));
    let all: Vec<String> = step1_docs
        .iter()
        .chain(step2_docs.iter())
        .map(|d| d.trim_matches('\n').to_string())
        .collect();
    std::fs::write(
        assets.join("cluster-template-kcp-adoption.yaml"),
        format!("{}\n", all.join("\n---\n")),
    )
    .expect("writing a flavor");
}

/// The flavors the quick-start without workers needs, as upstream's `topology-kcp-only`: a
/// ClusterClass `kairon-kcp-only` (the shipped `kairon` class without its worker class and
/// the patches that only workers use) and a Cluster of it with no workers.
fn write_kcp_only_flavor(assets: &Path) {
    let read = |f: &str| {
        std::fs::read_to_string(assets.join(f)).unwrap_or_else(|e| panic!("reading {f} from the release assets: {e}"))
    };
    let class = read("clusterclass-kairon.yaml");
    let class = class.replacen(
        "kind: ClusterClass\nmetadata:\n  name: kairon\n",
        "kind: ClusterClass\nmetadata:\n  name: kairon-kcp-only\n",
        1,
    );
    assert!(
        class.contains("name: kairon-kcp-only\n"),
        "the shipped ClusterClass is named kairon"
    );
    let class = remove_between(&class, "  workers:\n", "  variables:\n");
    let (head, patches) = class
        .split_once("\n  patches:\n")
        .expect("the shipped ClusterClass has patches");
    let patches = remove_between(patches, "    - name: workerMachine\n", "    - name: kubeVIP\n");
    let class = format!("{head}\n  patches:\n{patches}");
    assert!(
        !class.contains("default-worker\n    bootstrap") && !class.contains("machineDeploymentClass"),
        "worker references left in the kcp-only class"
    );
    std::fs::write(assets.join("clusterclass-kairon-kcp-only.yaml"), class).expect("writing a flavor");

    let cluster = read("cluster-template-topology.yaml");
    let cluster = insert_after(&cluster, "    classRef:\n      name: kairon", "-kcp-only");
    let cluster = remove_between(&cluster, "    workers:\n", "    variables:\n");
    std::fs::write(assets.join("cluster-template-topology-kcp-only.yaml"), cluster).expect("writing a flavor");
}

/// The flavors of the HA upgrade specs, as upstream's. `kcp-pre-drain`: the shipped topology
/// flavor with KCP's pre-drain hook annotation on its control plane (the spec's caller releases
/// each old Machine once the workload cluster is stable). `kcp-scale-in`: the shipped topology
/// flavor of a ClusterClass `kairon-scale-in`, the shipped class with one more patch, KCP's
/// `maxSurge: 0`, so that an old Machine goes before its replacement is made.
fn write_upgrade_flavors(assets: &Path) {
    let read = |f: &str| {
        std::fs::read_to_string(assets.join(f)).unwrap_or_else(|e| panic!("reading {f} from the release assets: {e}"))
    };
    let cluster = read("cluster-template-topology.yaml");
    let pre_drain = insert_after(
        &cluster,
        "    controlPlane:\n",
        "      metadata:\n        annotations:\n          pre-drain.delete.hook.machine.cluster.x-k8s.io/kcp-ready-check: \"true\"\n",
    );
    std::fs::write(assets.join("cluster-template-kcp-pre-drain.yaml"), pre_drain).expect("writing a flavor");

    let class = read("clusterclass-kairon.yaml");
    let class = insert_after(&class, "kind: ClusterClass\nmetadata:\n  name: kairon", "-scale-in");
    let class = insert_after(
        &class,
        "\n  patches:\n",
        "    - name: controlPlaneScaleIn
      description: KubeadmControlPlane removes an old Machine before it makes its replacement.
      definitions:
        - selector:
            apiVersion: controlplane.cluster.x-k8s.io/v1beta2
            kind: KubeadmControlPlaneTemplate
            matchResources:
              controlPlane: true
          jsonPatches:
            - op: add
              path: /spec/template/spec/rollout
              value:
                strategy:
                  type: RollingUpdate
                  rollingUpdate:
                    maxSurge: 0
",
    );
    std::fs::write(assets.join("clusterclass-kairon-scale-in.yaml"), class).expect("writing a flavor");
    let scale_in = insert_after(&cluster, "    classRef:\n      name: kairon", "-scale-in");
    std::fs::write(assets.join("cluster-template-kcp-scale-in.yaml"), scale_in).expect("writing a flavor");
}

/// Where the shipped class's image patches write: a KaironMachineTemplate's image, and a
/// KaironMachinePoolTemplate's (one level down).
const IMAGE_PATHS: [&str; 2] = [
    "/spec/template/spec/image/imageRef",
    "/spec/template/spec/template/image/imageRef",
];

/// The image patch operations of the shipped ClusterClass (`op: replace` of an
/// [`IMAGE_PATHS`] path, with the comment lines above them) taken out of `class`.
fn without_image_patches(class: &str) -> String {
    let lines: Vec<&str> = class.lines().collect();
    let mut out: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let is_image_op = line.trim() == "- op: replace"
            && lines
                .get(i + 1)
                .is_some_and(|next| IMAGE_PATHS.iter().any(|p| next.trim() == format!("path: {p}")));
        if !is_image_op {
            out.push(line);
            i += 1;
            continue;
        }
        while out.last().is_some_and(|l| l.trim_start().starts_with('#')) {
            out.pop();
        }
        let depth = line.len() - line.trim_start().len();
        i += 1;
        while lines
            .get(i)
            .is_some_and(|l| l.len() - l.trim_start().len() > depth + 1 && !l.trim().is_empty())
        {
            i += 1;
        }
    }
    out.iter().map(|l| format!("{l}\n")).collect()
}

/// The flavors of the specs that call the test Runtime Extension. `upgrades-runtimesdk`, as
/// upstream's: a ClusterClass `kairon-runtimesdk` whose machine images come from the extension
/// (the shipped `kairon` class with its inline image patches and variables replaced by the
/// extension's external patch and the variables it declares, and the extension's upgrade plan),
/// and a Cluster of it (the shipped topology flavor), its class in `CLUSTER_CLASS_NAMESPACE`
/// when the spec sets one. `topology-runtimesdk-v1beta1`: the same class and Cluster in the API
/// version v1beta1.
fn write_runtimesdk_flavor(assets: &Path) {
    let read = |f: &str| {
        std::fs::read_to_string(assets.join(f)).unwrap_or_else(|e| panic!("reading {f} from the release assets: {e}"))
    };
    let class = read("clusterclass-kairon.yaml");
    let class = insert_after(&class, "kind: ClusterClass\nmetadata:\n  name: kairon", "-runtimesdk");
    let class = without_image_patches(&class);
    // The extension declares the image variables: an external patch is given only its own.
    let class = remove_between(
        &class,
        "    - name: machineImagePrefix\n",
        "    - name: controlPlaneMachine\n",
    );
    assert!(
        !IMAGE_PATHS.iter().any(|p| class.contains(p)) && !class.contains("machineImage"),
        "an inline image patch or variable left in the runtimesdk class"
    );
    // The external patch last: it appends the in-place update spec's files to those of the
    // kubeVIP patch, which sets the KubeadmControlPlaneTemplate's whole list.
    let extension = "${EXTENSION_CONFIG_NAME:-k8s-upgrade-with-runtimesdk}";
    let (class_doc, templates) = class
        .split_once("\n---\n")
        .expect("the shipped ClusterClass file holds its templates");
    let class = format!(
        "{class_doc}\n    - name: testExtension\n      description: Each machine's image by its Kubernetes version; the in-place update spec's files and control-plane maxSurge (the test Runtime Extension).\n      external:\n        generatePatchesExtension: generate-patches.{extension}\n        discoverVariablesExtension: discover-variables.{extension}\n---\n{templates}"
    );
    std::fs::write(
        assets.join("clusterclass-kairon-runtimesdk-v1beta1.yaml"),
        v1beta1_class(&class),
    )
    .expect("writing a flavor");
    let class = class.replacen(
        "\n  patches:\n",
        &format!("\n  upgrade:\n    external:\n      generateUpgradePlanExtension: generate-upgrade-plan.{extension}\n  patches:\n"),
        1,
    );
    std::fs::write(assets.join("clusterclass-kairon-runtimesdk.yaml"), class).expect("writing a flavor");

    let topology = read("cluster-template-topology.yaml");
    let cluster = insert_after(
        &topology,
        "    classRef:\n      name: kairon",
        "-runtimesdk\n      namespace: ${CLUSTER_CLASS_NAMESPACE:-${NAMESPACE}}",
    );
    // The rollout choices of the in-place update spec (as upstream's flavor, with CAPI's
    // defaults unless set).
    let cluster = insert_after(
        &cluster,
        "          replicas: ${WORKER_MACHINE_COUNT}\n",
        "          rollout:\n            strategy:\n              type: RollingUpdate\n              rollingUpdate:\n                maxSurge: ${MD_MAX_SURGE:-1}\n                maxUnavailable: ${MD_MAX_UNAVAILABLE:-0}\n",
    );
    let cluster = insert_after(
        &cluster,
        "    variables:\n",
        "      - name: kubeadmControlPlaneMaxSurge\n        value: \"${KUBEADM_CONTROL_PLANE_MAX_SURGE:-1}\"\n",
    );
    std::fs::write(assets.join("cluster-template-upgrades-runtimesdk.yaml"), cluster).expect("writing a flavor");

    // The same Cluster in the API version v1beta1, as upstream's `topology-runtimesdk-v1beta1`.
    let cluster = topology
        .replacen(
            "apiVersion: cluster.x-k8s.io/v1beta2\n",
            "apiVersion: cluster.x-k8s.io/v1beta1\n",
            1,
        )
        .replacen(
            "    classRef:\n      name: kairon\n",
            "    class: kairon-runtimesdk-v1beta1\n    classNamespace: ${CLUSTER_CLASS_NAMESPACE:-${NAMESPACE}}\n",
            1,
        );
    assert!(
        cluster.contains("cluster.x-k8s.io/v1beta1\n") && cluster.contains("class: kairon-runtimesdk-v1beta1"),
        "the shipped topology Cluster is a v1beta2 Cluster of the class kairon"
    );
    std::fs::write(
        assets.join("cluster-template-topology-runtimesdk-v1beta1.yaml"),
        cluster,
    )
    .expect("writing a flavor");
}

/// The ClusterClass `kairon-runtimesdk` (`class`, the first document, its templates after it)
/// in the API version v1beta1, as upstream's `quick-start-runtimesdk-v1beta1`: named
/// `kairon-runtimesdk-v1beta1`, templates by `ref`, a worker class's templates under
/// `template`, the external patch by `generateExtension`. The templates stay as they are.
fn v1beta1_class(class: &str) -> String {
    let (head, templates) = class
        .split_once("\n---\n")
        .expect("the ClusterClass file holds its templates");
    let head = head
        .replacen(
            "apiVersion: cluster.x-k8s.io/v1beta2\n",
            "apiVersion: cluster.x-k8s.io/v1beta1\n",
            1,
        )
        .replacen("  name: kairon-runtimesdk\n", "  name: kairon-runtimesdk-v1beta1\n", 1)
        .replacen("        generatePatchesExtension: ", "        generateExtension: ", 1);
    let (before, rest) = head
        .split_once("    machineDeployments:\n")
        .expect("the ClusterClass has worker classes");
    let (workers, after) = rest
        .split_once("  variables:\n")
        .expect("the ClusterClass has variables");
    let workers: String = workers
        .lines()
        .map(|l| {
            if l.starts_with("      - class: ") {
                format!("{l}\n        template:\n")
            } else if l == "    machinePools:" {
                // The pool classes follow the worker classes, at the same depth.
                format!("{l}\n")
            } else {
                format!("  {l}\n")
            }
        })
        .collect();
    let head =
        format!("{before}    machineDeployments:\n{workers}  variables:\n{after}").replace("templateRef:", "ref:");
    assert!(
        head.contains("cluster.x-k8s.io/v1beta1\n")
            && head.contains("name: kairon-runtimesdk-v1beta1\n")
            && head.contains("generateExtension: "),
        "the runtimesdk ClusterClass is not as expected"
    );
    format!("{head}\n---\n{templates}")
}

/// The kcp-remediation flavor's guests run its script with these.
fn require_script_tools() {
    for tool in ["sh", "bash", "curl", "jq"] {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "`{tool}` is not on PATH: the KCP remediation spec's guests run upstream's wait-signal script with bash, curl and jq (hack/test-tools.sh installs them)"
        );
    }
}

/// clusterctl's metadata of the CAPI release whose managers run here.
fn capi_metadata() -> String {
    let (major, minor) = {
        let mut it = CAPI_VERSION.trim_start_matches('v').split('.');
        (it.next().unwrap_or("1"), it.next().unwrap_or("0"))
    };
    format!(
        "apiVersion: clusterctl.cluster.x-k8s.io/v1alpha3\nkind: Metadata\nreleaseSeries:\n  - major: {major}\n    minor: {minor}\n    contract: v1beta2\n"
    )
}

/// The e2e config: CAPI's three providers (their managers run as processes; the repository
/// gets their CRDs as components, never installed from there), the Kairon provider from the
/// release assets, the variables the shipped templates need, and the intervals.
fn e2e_config(dir: &Path, assets: &Path, capi_manifests: &Path, endpoint_ip: &str) -> String {
    let mut providers = String::new();
    let metadata = dir.join("capi-metadata.yaml");
    std::fs::write(&metadata, capi_metadata()).expect("writing the CAPI metadata");
    for (name, typ, group) in [
        ("cluster-api", "CoreProvider", "core"),
        ("kubeadm", "BootstrapProvider", "bootstrap-kubeadm"),
        ("kubeadm", "ControlPlaneProvider", "control-plane-kubeadm"),
    ] {
        let components = dir.join(format!("{group}-components.yaml"));
        let mut crds = String::new();
        let crd_dir = capi_manifests.join(group).join("crd");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&crd_dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", crd_dir.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        for f in files {
            crds.push_str("---\n");
            crds.push_str(&std::fs::read_to_string(&f).expect("reading a CAPI CRD"));
        }
        std::fs::write(&components, crds).expect("writing CAPI components");
        providers.push_str(&format!(
            "- name: {name}\n  type: {typ}\n  versions:\n  - name: {CAPI_VERSION}\n    value: {}\n    type: url\n    files:\n    - sourcePath: {}\n      targetName: metadata.yaml\n",
            components.display(),
            metadata.display()
        ));
    }
    let mut files = String::new();
    let mut names: Vec<String> = std::fs::read_dir(assets)
        .expect("reading the release assets")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "infrastructure-components.yaml" && n.ends_with(".yaml"))
        .collect();
    names.sort();
    assert!(
        names.iter().any(|n| n == "metadata.yaml") && names.iter().any(|n| n == "cluster-template.yaml"),
        "release assets lack metadata.yaml or cluster-template.yaml: {names:?}"
    );
    for n in &names {
        files.push_str(&format!(
            "    - sourcePath: {}\n      targetName: {n}\n",
            assets.join(n).display()
        ));
    }
    providers.push_str(&format!(
        "- name: kairon\n  type: InfrastructureProvider\n  versions:\n  - name: {VERSION}\n    value: {}\n    type: url\n    files:\n{files}",
        assets.join("infrastructure-components.yaml").display()
    ));

    format!(
        r#"managementClusterName: capkr-e2e
images: []
providers:
{providers}
variables:
  KUBERNETES_VERSION: "{KUBERNETES_VERSION}"
  KUBERNETES_VERSION_UPGRADE_FROM: "{KUBERNETES_VERSION_UPGRADE_FROM}"
  KUBERNETES_VERSION_UPGRADE_TO: "{KUBERNETES_VERSION_UPGRADE_TO}"
  CONTROL_PLANE_ENDPOINT_IP: "{endpoint_ip}"
  KAIRON_MACHINE_IMAGE: "ubuntu-2404-kube-{KUBERNETES_VERSION}"
  EXP_CLUSTER_RESOURCE_SET: "true"
  CLUSTER_TOPOLOGY: "true"
intervals:
  default/wait-cluster: ["3m", "2s"]
  default/wait-control-plane: ["5m", "2s"]
  default/wait-worker-nodes: ["5m", "2s"]
  default/wait-machine-pool-nodes: ["5m", "2s"]
  default/wait-delete-cluster: ["5m", "2s"]
  default/wait-machine-upgrade: ["10m", "2s"]
  default/wait-machine-pool-upgrade: ["10m", "2s"]
  default/wait-machine-remediation: ["5m", "2s"]
  default/wait-deployment: ["3m", "2s"]
  default/wait-deployment-available: ["3m", "2s"]
  default/wait-machine-deleted: ["5m", "2s"]
  default/wait-nodes-ready: ["5m", "2s"]
  default/wait-control-plane-upgrade: ["10m", "2s"]
  default/wait-machine-deployment-upgrade: ["10m", "2s"]
  default/check-machines-stable: ["30s", "5s"]
  default/wait-machine-provisioned: ["5m", "2s"]
  default/wait-machines: ["5m", "2s"]
  quick-start/wait-resource-versions-become-stable: ["1m", "5s"]
  quick-start/wait-resource-versions-remain-stable: ["20s", "5s"]
  k8s-upgrade-with-runtimesdk/wait-resource-versions-become-stable: ["1m", "5s"]
  k8s-upgrade-with-runtimesdk/wait-resource-versions-remain-stable: ["20s", "5s"]
"#
    )
}

/// Every test flavor the specs need, derived from the release assets in `assets`.
fn write_test_flavors(assets: &Path) {
    write_taint_flavors(assets);
    write_kcp_remediation_flavor(assets);
    write_md_remediation_flavor(assets);
    write_kcp_adoption_flavor(assets);
    write_kcp_only_flavor(assets);
    write_runtimesdk_flavor(assets);
    write_upgrade_flavors(assets);
}

/// The suite binary, found or compiled once per test process (every part uses it).
fn suite_binary() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.as_ref() {
        return p.clone();
    }
    let started = Instant::now();
    let suite = build_suite();
    eprintln!(
        "CAPI e2e suite binary in {:.1}s: {}",
        started.elapsed().as_secs_f64(),
        suite.display()
    );
    *built = Some(suite.clone());
    suite
}

/// The enabled specs in three parts of about equal length (their times alone, in
/// docs/capi-e2e.md: 1419, 1496 and 1444 s), each a Ginkgo run of its own on the one
/// environment all share, so that `make test` runs them side by side. The runs wait on
/// controllers much more than they compute (one takes about half a core), so three at once
/// take little longer than one.
const PARTS: [&str; 3] = [
    "runtimesdk-upgrade-cross-ns || kcp-remediation || clusterclass-rollout || quick-start || kcp-adoption \
     || quick-start-kcp-only || kairon-conflict-retry",
    "runtimesdk-upgrade || node-drain || k8s-upgrade-scale-in || in-place-update || md-scale || md-remediation \
     || cluster-deletion",
    "k8s-upgrade-ha || k8s-upgrade || clusterclass-changes || kcp-infra-adoption || scale || kairon-in-place \
     || machine-pool || quick-start-runtimesdk-v1beta1 || kcp-md-rollout",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capi_e2e_runtimesdk_cross_ns_kcp_remediation_clusterclass_rollout_quick_starts_and_kcp_adoption_pass() {
    run_specs(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capi_e2e_runtimesdk_upgrade_node_drain_scale_in_in_place_md_scale_remediation_and_deletion_pass() {
    run_specs(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capi_e2e_upgrades_clusterclass_changes_infra_adoption_scale_machine_pool_and_rollout_pass() {
    run_specs(2).await;
}

/// The guest network of the shared environment's simulator.
static NETWORK: OnceLock<GuestNetwork> = OnceLock::new();

/// The port of the test Runtime Extension's proxy: CAPI core of the shared environment is
/// started with it, whichever part starts the environment, and the extension listens on it.
static PROXY_PORT: OnceLock<u16> = OnceLock::new();

/// The management environment every part shares, as upstream's parallel Ginkgo nodes share
/// one management cluster: CAPI with the feature gates the specs need
/// (MachineTaintPropagation: the rollout specs check Machine taints reaching the Nodes;
/// RuntimeSDK; InPlaceUpdates, in core and KCP), one simulator whose guests run etcd and kube-apiserver, one manager, and the
/// test Runtime Extension.
async fn suite_env() -> (&'static Env, GuestNetwork) {
    let mut opts = EnvOptions::new("capi_e2e_suite");
    opts.capi_feature_gates =
        "MachinePool=true,ClusterTopology=true,MachineTaintPropagation=true,RuntimeSDK=true,InPlaceUpdates=true".into();
    // CAPI core and KCP call the test Runtime Extension at its Service's address through this
    // proxy (the extension's own); they never proxy loopback, where every API server listens.
    let proxy_port = *PROXY_PORT.get_or_init(|| free_port().expect("a free port for the extension's proxy"));
    opts.capi_env = vec![("HTTPS_PROXY".into(), format!("http://127.0.0.1:{proxy_port}"))];
    match std::env::var("CAPKR_CAPI_E2E_AUDIT").ok().filter(|v| !v.is_empty()) {
        // A file: that audit policy (e.g. request bodies of some resources).
        Some(path) if std::path::Path::new(&path).is_file() => {
            let policy = std::fs::read_to_string(&path).expect("reading CAPKR_CAPI_E2E_AUDIT's policy");
            opts = opts.audit_policy(policy);
        }
        Some(_) => opts = opts.audit_policy(capkr_testenv::audit::AUDIT_POLICY_METADATA_RESPONSES),
        None => {}
    }
    let env = Env::shared_with(opts, |env| async move {
        let net = *NETWORK.get_or_init(GuestNetwork::pick);
        let guest_dir = env.dir().join("guests");
        let mut sim_args = guest_delay_args();
        // Labelled hosts: the ClusterClass-changes spec moves workers to zone-b.
        sim_args.extend(["--hosts".to_string(), SIMULATOR_HOSTS.into()]);
        sim_args.extend(guest_simulator_args(env.binaries(), &guest_dir, &net)?);
        // The kcp-remediation flavor's pre-kubeadm signal script.
        require_script_tools();
        sim_args.push("--guest-scripts-dir".into());
        sim_args.push(env.dir().join("guest-scripts").display().to_string());
        let sim = env.start_simulator(sim_args)?;
        let manager = env.start_manager(["-v", "1"])?;
        let extension = start_test_extension(env, proxy_port).await?;
        for p in [&sim, &manager, &extension] {
            anyhow::ensure!(p.is_running(), "{} exited right after start", p.name());
        }
        env.keep(sim);
        env.keep(manager);
        env.keep(extension);
        Ok(())
    })
    .await
    .expect("test environment");
    let net = *NETWORK.get().expect("the shared environment's setup picked a network");
    (env, net)
}

/// Starts the test Runtime Extension (`tests/capi-e2e/extension`, built next to the suite)
/// with its CONNECT proxy on `proxy_port`, and does what upstream's deployment of it leaves
/// for CAPI to find: the Secret `<service>-cert` in its namespace whose `ca.crt`, named by the
/// ExtensionConfigs' inject-ca annotation, CAPI takes as the extension's CA bundle.
async fn start_test_extension(env: &Env, proxy_port: u16) -> anyhow::Result<Process> {
    let host = format!("{EXTENSION_SERVICE}.{EXTENSION_NAMESPACE}.svc");
    let cert_dir = env.dir().join("test-extension-certs");
    env.write_serving_cert(&cert_dir, &host, &[&host])?;
    env.create_namespace(EXTENSION_NAMESPACE).await?;
    let secret = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": format!("{EXTENSION_SERVICE}-cert"), "namespace": EXTENSION_NAMESPACE},
        "stringData": {"ca.crt": env.ca_pem()},
    });
    env.apply(&secret.to_string(), None).await?;
    let binary = suite_binary().with_file_name("capi-e2e-extension");
    let spec = ProcessSpec::new("capi-e2e-extension", binary, &env.log_dir()).args([
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--webhook-port={}", free_port()?),
        format!("--webhook-cert-dir={}", cert_dir.display()),
        format!("--proxy-address=127.0.0.1:{proxy_port}"),
        format!("--service-host={host}"),
    ]);
    Process::spawn(spec)
}

/// Runs the specs part `part` of [`PARTS`] selects (and `CAPKR_CAPI_E2E_FOCUS`, when set) on
/// the shared environment, with the part's own control-plane endpoints and output dirs.
async fn run_specs(part: usize) {
    let labels = PARTS[part];
    let suite = suite_binary();
    // The last run's output of each part, for a look after the fact.
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi-e2e");
    std::fs::create_dir_all(&work).expect("creating the suite's output dir");

    let (env, net) = suite_env().await;
    let dir = env.dir().join(format!("capi-e2e-{part}"));
    let repo = ClusterctlRepo::create(&dir, env.binaries()).expect("release assets");
    let assets = repo.dir.join("repo").join("infrastructure-kairon").join(VERSION);
    write_test_flavors(&assets);
    let config = dir.join("e2e-config.yaml");
    std::fs::write(
        &config,
        e2e_config(&dir, &assets, &env.binaries().capi_manifests, &endpoint_ip(&net, part)),
    )
    .expect("writing the e2e config");
    let artifacts = dir.join("artifacts");

    let mut cmd = Command::new(&suite);
    cmd.current_dir(&dir)
        .arg("-test.v")
        .arg("-test.timeout=45m")
        .arg("-ginkgo.v")
        .arg("-ginkgo.timeout=45m")
        .arg("-ginkgo.no-color")
        .arg(format!(
            "-ginkgo.junit-report={}",
            artifacts.join("junit.xml").display()
        ))
        .arg(format!("-e2e.config={}", config.display()))
        .arg(format!("-e2e.artifacts-folder={}", artifacts.display()))
        .arg(format!("-e2e.kubeconfig={}", env.kubeconfig_path().display()))
        // The framework's clusterctl client must never reach GitHub or read the user's config.
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .env("GOPROXY", "off")
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .env("HOME", &dir);
    let focus = std::env::var("CAPKR_CAPI_E2E_FOCUS").ok().filter(|f| !f.is_empty());
    let filter = match &focus {
        // A focus may name specs of any part; those left out by default run in the first.
        Some(f) if part == 0 => format!("({f}) && ({labels} || not-applicable)"),
        Some(f) => format!("({f}) && ({labels}) && {DEFAULT_LABEL_FILTER}"),
        None => format!("({labels}) && {DEFAULT_LABEL_FILTER}"),
    };
    cmd.arg(format!("-ginkgo.label-filter={filter}"));
    // Ginkgo's own --repeat is its CLI's, not the test binary's: the loop is ours, each round
    // a fresh Ginkgo run on the same environment, stopping at the first failure.
    let rounds = 1 + std::env::var("CAPKR_CAPI_E2E_REPEAT")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    let mut text = String::new();
    for round in 1..=rounds {
        let started = Instant::now();
        let out = cmd.output().expect("running the CAPI e2e suite");
        text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = std::fs::write(work.join(format!("last-run-{part}.txt")), &text);
        eprintln!("{text}");
        eprintln!(
            "CAPI e2e suite (round {round} of {rounds}): {:.1}s, {}",
            started.elapsed().as_secs_f64(),
            out.status
        );
        if !out.status.success() {
            env.dump();
            panic!(
                "the CAPI e2e suite failed ({}, round {round} of {rounds}); artifacts in {} (CAPKR_TEST_KEEP=1 keeps them)\n{}",
                out.status,
                artifacts.display(),
                failure_summary(&text)
            );
        }
    }
    assert!(text.contains("SUCCESS!"), "no Ginkgo summary in the output");
    // A focus may select nothing of this part; without one, every part runs specs.
    assert!(
        focus.is_some() || !text.contains("-- 0 Passed"),
        "the Ginkgo run passed no spec"
    );
}

/// The first control-plane endpoint of a part's clusters: 127.<octet>.<100 + part>.1, so the
/// parts' addresses never meet (the scale spec numbers its clusters' endpoints up from it).
fn endpoint_ip(net: &GuestNetwork, part: usize) -> String {
    format!("127.{}.{}.1", net.octet, 100 + part)
}

/// Ginkgo's closing summary of the failed specs (from "Summarizing" on, at most 60 lines),
/// so that the panic message, which CI shows, names the spec and where it failed.
fn failure_summary(text: &str) -> String {
    let from = text
        .rfind("Summarizing ")
        .or_else(|| text.rfind("[FAILED]"))
        .unwrap_or(text.len());
    let lines: Vec<&str> = text[from..].lines().take(60).collect();
    if lines.is_empty() {
        "(no Ginkgo failure summary in the output)".to_string()
    } else {
        lines.join("\n")
    }
}

#[test]
fn the_failure_summary_is_ginkgos_and_says_so_when_there_is_none() {
    let out = "spec output\n[FAILED] early line\nmore\nSummarizing 1 Failure:\n  [FAIL] kcp-adoption [It] x\n  /path/kcp_adoption.go:203\n\nRan 7 of 13 Specs\n";
    let summary = failure_summary(out);
    assert!(summary.starts_with("Summarizing 1 Failure:"), "{summary}");
    assert!(summary.contains("kcp_adoption.go:203"), "{summary}");
    assert!(!summary.contains("spec output"), "{summary}");
    let no_summary = failure_summary("panic: no ginkgo at all\n");
    assert_eq!(no_summary, "(no Ginkgo failure summary in the output)");
    let long = format!("Summarizing 2 Failures:\n{}", "x\n".repeat(200));
    assert_eq!(failure_summary(&long).lines().count(), 60);
}

/// Every Describe of `tests/capi-e2e` is in exactly one part: a label in none would run in no
/// `make test` (Ginkgo reports "Ran 0 specs", a success), a label in two would run twice.
#[test]
fn every_spec_label_is_in_exactly_one_part() {
    let dir = workspace_root().join("tests/capi-e2e");
    let mut labels = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("reading tests/capi-e2e").flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "go") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("reading a Go file");
        for line in text.lines().filter(|l| l.starts_with("var _ = Describe(")) {
            let (_, rest) = line.split_once("Label(\"").expect("every Describe has a label");
            let label = rest.split('"').next().unwrap_or_default().to_string();
            if !line.contains("\"not-applicable\"") {
                labels.push(label);
            }
        }
    }
    assert!(labels.len() >= 20, "found only {labels:?} in {}", dir.display());
    let in_parts: Vec<&str> = PARTS.iter().flat_map(|p| p.split("||")).map(str::trim).collect();
    for label in &labels {
        let times = in_parts.iter().filter(|l| *l == label).count();
        assert_eq!(times, 1, "spec label {label:?} is in {times} parts of PARTS");
    }
    for label in &in_parts {
        assert!(
            labels.iter().any(|l| l == label),
            "PARTS names {label:?}, which no Describe has"
        );
    }
}

/// The test flavors are derived from the shipped templates by text edits that assert what
/// they expect to find: run them all on a copy of `templates/` (as the release assets hold
/// them), so a template change that breaks one fails here in a second, not in the suite.
#[test]
fn every_test_flavor_derives_from_the_shipped_templates() {
    let assets = std::env::temp_dir().join(format!("capkr-capi-e2e-flavors-{}", std::process::id()));
    std::fs::create_dir_all(&assets).expect("a temp dir");
    let templates = workspace_root().join("templates");
    for entry in std::fs::read_dir(&templates).expect("reading templates/").flatten() {
        std::fs::copy(entry.path(), assets.join(entry.file_name())).expect("copying a template");
    }
    write_test_flavors(&assets);
    let v1beta1 = std::fs::read_to_string(assets.join("clusterclass-kairon-runtimesdk-v1beta1.yaml")).expect("written");
    let (class, _) = v1beta1.split_once("\n---\n").expect("class and templates");
    // Every worker class of either kind sits at the same depth, its templates under `template`.
    for kind in ["\n    machineDeployments:\n", "\n    machinePools:\n"] {
        assert!(class.contains(kind), "no {kind:?} in {class}");
        if let Some((_, rest)) = class.split_once(kind) {
            let first = rest.lines().next().unwrap_or_default();
            assert!(
                first.starts_with("      - class: "),
                "{kind:?} is followed by {first:?}"
            );
            assert!(rest.contains("        template:\n          bootstrap:"), "{class}");
        }
    }
    let _ = std::fs::remove_dir_all(&assets);
}
