//! The test flavors some specs need, derived from the shipped templates and class.

use super::*;

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
pub(super) fn write_taint_flavors(assets: &Path) {
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
pub(super) fn write_md_remediation_flavor(assets: &Path) {
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
pub(super) fn write_kcp_remediation_flavor(assets: &Path) {
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
pub(super) fn write_kcp_adoption_flavor(assets: &Path) {
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
    // Each step creates what the Cluster refers to before the Cluster: CAPI's Cluster controller
    // looks again only 30 s after it finds a reference missing, and the spec waits 5 s for the
    // adopted control plane to carry the cluster's label, which that controller sets.
    let step1_docs = [
        labelled(&infra_cluster, step1),
        labelled(&without_control_plane, step1),
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
    let step2_docs = [&infra_cluster, &cp_template, &kcp, &cluster].map(|d| labelled(d, step2));
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
pub(super) fn write_kcp_only_flavor(assets: &Path) {
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
pub(super) fn write_upgrade_flavors(assets: &Path) {
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
pub(super) fn write_runtimesdk_flavor(assets: &Path) {
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
