//! The test clusters: a Cluster with a KaironCluster (two failure domains, zone-a and
//! zone-b), one control-plane Machine with kubeadm init data (`<cluster>-control-plane-0`) and
//! a MachineDeployment (`<cluster>-md-0`) of workers with join data, optionally under a
//! MachineHealthCheck. Used by the demo, the end-to-end tests and the benchmark, which builds
//! the same shape of CAPD's in-memory kinds ([`Infrastructure`]).

use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

/// The Kubernetes version of the test environment: the kube-apiserver that `hack/test-tools.sh`
/// builds (`testbed/tools/k8s`), and the version the test clusters' Machines ask for.
pub const KUBERNETES_VERSION: &str = "v1.37.2";

/// The Kairon image of the test clusters' machines.
pub fn machine_image() -> String {
    format!("ubuntu-2404-kube-{KUBERNETES_VERSION}")
}

/// The simulator's `--hosts` for the test clusters: three hosts, labelled into the two failure
/// domains of their KaironCluster (zone-a: one host, zone-b: two).
pub const SIMULATOR_HOSTS: &str = "kairon-node-1:topology.kairon.zyvor.dev/zone=zone-a,\
kairon-node-2:topology.kairon.zyvor.dev/zone=zone-b,kairon-node-3:topology.kairon.zyvor.dev/zone=zone-b";

/// The shape of a test cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub workers: usize,
    /// Failure domain of the control-plane Machine and of the MachineDeployment's Machines.
    pub cp_failure_domain: Option<String>,
    pub md_failure_domain: Option<String>,
    /// A MachineHealthCheck on the MachineDeployment's Machines.
    pub health_check: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            workers: 2,
            cp_failure_domain: None,
            md_failure_domain: None,
            health_check: false,
        }
    }
}

/// The infrastructure kinds of a test cluster, and what goes into their specs.
#[derive(Clone, Debug)]
pub struct Infrastructure {
    /// `apiVersion` of the infrastructure kinds.
    pub api_version: String,
    pub cluster_kind: String,
    pub machine_kind: String,
    pub machine_template_kind: String,
    /// The infrastructure cluster's `metadata.annotations`, as YAML mapping lines (not
    /// indented; empty: none).
    pub cluster_annotations: String,
    /// The infrastructure cluster's `spec`, as a YAML mapping indented by two spaces.
    pub cluster_spec: String,
    /// A machine's `spec`, as a YAML mapping indented by two spaces (as under a machine; the
    /// template indents it further).
    pub machine_spec: String,
    /// Whether kubelet is told its provider ID (`kairon://<instance id>`).
    pub provider_id: bool,
}

impl Infrastructure {
    /// Kairon's kinds: the KaironCluster's control-plane endpoint at `host:port` and its two
    /// failure domains (zone-a, zone-b).
    pub fn kairon(host: &str, port: u16) -> Infrastructure {
        Infrastructure {
            api_version: "infrastructure.cluster.x-k8s.io/v1alpha1".into(),
            cluster_kind: "KaironCluster".into(),
            machine_kind: "KaironMachine".into(),
            machine_template_kind: "KaironMachineTemplate".into(),
            cluster_annotations: String::new(),
            cluster_spec: format!(
                r#"  controlPlaneEndpoint:
    host: {host}
    port: {port}
  failureDomains:
  - name: zone-a
    controlPlane: true
    nodeSelector:
      topology.kairon.zyvor.dev/zone: zone-a
  - name: zone-b
    nodeSelector:
      topology.kairon.zyvor.dev/zone: zone-b"#
            ),
            machine_spec: format!(
                "  image:\n    imageRef: {}\n    diskSize: 20Gi\n  resources:\n    cpu: 2\n    memory: 4Gi\n{NETWORK}",
                machine_image()
            ),
            provider_id: true,
        }
    }
}

/// The shipped flavors' network, as a machine spec's lines (indented as under a machine): a
/// tap device on the bridge `br0` the cluster's VMs share, learning their addresses, with the
/// guest agent on (docs/kaironmachine.md, "Networking on Kairon").
pub const NETWORK: &str =
    "  network:\n    mode: tap\n    bridge: br0\n    learnIP: true\n  guestAgent:\n    enabled: true";

/// The cluster's objects (CAPI v1beta2) on Kairon, with the control plane endpoint at
/// `host:port`.
pub fn cluster_yaml(namespace: &str, cluster: &str, host: &str, port: u16, opts: &ClusterOptions) -> String {
    cluster_yaml_of(namespace, cluster, &Infrastructure::kairon(host, port), opts)
}

/// The cluster's objects (CAPI v1beta2) with the infrastructure kinds of `infra`.
pub fn cluster_yaml_of(namespace: &str, cluster: &str, infra: &Infrastructure, opts: &ClusterOptions) -> String {
    let fd = |f: Option<&String>| f.map(|f| format!("\n  failureDomain: {f}")).unwrap_or_default();
    let md_fd = opts
        .md_failure_domain
        .as_ref()
        .map(|f| format!("\n      failureDomain: {f}"))
        .unwrap_or_default();
    let cp_fd = fd(opts.cp_failure_domain.as_ref());
    let workers = opts.workers;
    let Infrastructure {
        api_version,
        cluster_kind,
        machine_kind,
        machine_template_kind,
        ..
    } = infra;
    let annotations = match infra.cluster_annotations.as_str() {
        "" => String::new(),
        a => format!("\n  annotations:\n{}", indent(a, 4)),
    };
    let cluster_spec = infra.cluster_spec.as_str();
    let machine_spec = infra.machine_spec.as_str();
    let template_spec = indent(machine_spec, 4);
    let provider_id = |n: usize| match infra.provider_id {
        true => format!(
            "\n{}",
            indent(
                "kubeletExtraArgs:\n- name: provider-id\n  value: 'kairon://{{ ds.meta_data.instance_id }}'",
                n
            )
        ),
        false => String::new(),
    };
    let (init_provider_id, join_provider_id) = (provider_id(6), provider_id(10));
    let mhc = if opts.health_check {
        format!(
            r#"
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineHealthCheck
metadata:
  name: {cluster}-md-0
  namespace: {namespace}
spec:
  clusterName: {cluster}
  selector:
    matchLabels:
      cluster.x-k8s.io/deployment-name: {cluster}-md-0
  checks:
    nodeStartupTimeoutSeconds: 120
    unhealthyNodeConditions:
    - type: Ready
      status: "False"
      timeoutSeconds: 5
    - type: Ready
      status: Unknown
      timeoutSeconds: 5
    unhealthyMachineConditions:
    - type: InfrastructureReady
      status: "False"
      timeoutSeconds: 5
  remediation:
    triggerIf:
      unhealthyLessThanOrEqualTo: 100%"#
        )
    } else {
        String::new()
    };
    format!(
        r#"apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata:
  name: {cluster}
  namespace: {namespace}
spec:
  clusterNetwork:
    pods:
      cidrBlocks: [192.168.0.0/16]
  infrastructureRef:
    apiGroup: infrastructure.cluster.x-k8s.io
    kind: {cluster_kind}
    name: {cluster}
---
apiVersion: {api_version}
kind: {cluster_kind}
metadata:
  name: {cluster}
  namespace: {namespace}{annotations}
spec:
{cluster_spec}
---
apiVersion: bootstrap.cluster.x-k8s.io/v1beta2
kind: KubeadmConfig
metadata:
  name: {cluster}-control-plane-0
  namespace: {namespace}
spec:
  initConfiguration:
    nodeRegistration:
      name: '{{{{ ds.meta_data.local_hostname }}}}'{init_provider_id}
---
apiVersion: {api_version}
kind: {machine_kind}
metadata:
  name: {cluster}-control-plane-0
  namespace: {namespace}
spec:
{machine_spec}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Machine
metadata:
  name: {cluster}-control-plane-0
  namespace: {namespace}
  labels:
    cluster.x-k8s.io/cluster-name: {cluster}
    cluster.x-k8s.io/control-plane: ""
spec:
  clusterName: {cluster}
  version: {KUBERNETES_VERSION}{cp_fd}
  bootstrap:
    configRef:
      apiGroup: bootstrap.cluster.x-k8s.io
      kind: KubeadmConfig
      name: {cluster}-control-plane-0
  infrastructureRef:
    apiGroup: infrastructure.cluster.x-k8s.io
    kind: {machine_kind}
    name: {cluster}-control-plane-0
---
apiVersion: bootstrap.cluster.x-k8s.io/v1beta2
kind: KubeadmConfigTemplate
metadata:
  name: {cluster}-md-0
  namespace: {namespace}
spec:
  template:
    spec:
      joinConfiguration:
        nodeRegistration:
          name: '{{{{ ds.meta_data.local_hostname }}}}'{join_provider_id}
---
apiVersion: {api_version}
kind: {machine_template_kind}
metadata:
  name: {cluster}-md-0
  namespace: {namespace}
spec:
  template:
    spec:
{template_spec}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata:
  name: {cluster}-md-0
  namespace: {namespace}
spec:
  clusterName: {cluster}
  replicas: {workers}
  template:
    spec:
      clusterName: {cluster}
      version: {KUBERNETES_VERSION}{md_fd}
      bootstrap:
        configRef:
          apiGroup: bootstrap.cluster.x-k8s.io
          kind: KubeadmConfigTemplate
          name: {cluster}-md-0
      infrastructureRef:
        apiGroup: infrastructure.cluster.x-k8s.io
        kind: {machine_template_kind}
        name: {cluster}-md-0{mhc}
"#
    )
}

/// Whether `machines` are exactly `n`, every one `Running` with a nodeRef, none being deleted
/// and none marked unhealthy by a MachineHealthCheck: "the cluster is up" of every test and of
/// the benchmark. A Machine marked while it started (its InfrastructureReady False longer than
/// a check allows, as it waits for bootstrap data on a loaded machine) still turns Running
/// before its owner deletes it: counting it would let a test go on with a Machine about to be
/// replaced.
pub fn all_running_with_a_node(machines: &[DynamicObject], n: usize) -> bool {
    machines.len() == n && machines.iter().filter(|m| running_with_a_node(m)).count() == n
}

/// One line per object of `objects` (CAPI Machines or KaironMachines): its name, phase,
/// nodeRef and every condition not True with its reason, the state a failed wait reports.
/// Condition messages are left out: a KaironMachine's may quote what its guest reported.
pub fn states(objects: &[DynamicObject]) -> String {
    let mut out = Vec::new();
    for o in objects {
        let status = &o.data["status"];
        let mut line = format!(
            "{} phase={} node={}",
            o.metadata.name.as_deref().unwrap_or("?"),
            status["phase"].as_str().unwrap_or("-"),
            status["nodeRef"]["name"].as_str().unwrap_or("-")
        );
        if o.metadata.deletion_timestamp.is_some() {
            line.push_str(" deleting");
        }
        let not_true: Vec<String> = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["status"] != "True")
            .map(|c| {
                format!(
                    "{}={}({})",
                    c["type"].as_str().unwrap_or("?"),
                    c["status"].as_str().unwrap_or("?"),
                    c["reason"].as_str().unwrap_or("")
                )
            })
            .collect();
        if !not_true.is_empty() {
            line.push_str(" not True: ");
            line.push_str(&not_true.join(" "));
        }
        out.push(line);
    }
    out.join("\n")
}

/// Whether a Machine is `Running` with a nodeRef, not being deleted and not marked unhealthy
/// (`HealthCheckSucceeded` False).
pub fn running_with_a_node(m: &DynamicObject) -> bool {
    let marked = m.data["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "HealthCheckSucceeded" && c["status"] == "False")
    });
    m.metadata.deletion_timestamp.is_none()
        && m.data["status"]["phase"] == "Running"
        && m.data["status"]["nodeRef"]["name"].is_string()
        && !marked
}

/// Sets `spec.replicas` of MachineDeployment `namespace/name`.
pub async fn scale_machine_deployment(
    client: &Client,
    namespace: &str,
    name: &str,
    replicas: usize,
) -> kube::Result<()> {
    let mds: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &crate::capi_resource("MachineDeployment", "machinedeployments"),
    );
    mds.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": replicas}})),
    )
    .await
    .map(|_| ())
}

/// `text` with every line indented by `n` more spaces.
fn indent(text: &str, n: usize) -> String {
    let pad = " ".repeat(n);
    text.lines().map(|l| format!("{pad}{l}")).collect::<Vec<_>>().join("\n")
}

/// The label selector of a KaironMachinePool's members: their KaironMachines and the VMs
/// those make.
pub fn pool_selector(pool: &str) -> String {
    format!("infrastructure.cluster.x-k8s.io/kaironmachinepool-name={pool}")
}

/// A MachinePool `<cluster>-mp-0` of `replicas` workers of Kairon's (KaironMachinePool of the
/// same name), joining with a KubeadmConfig whose kubelet gets the Kairon providerID: the
/// objects to apply beside [`cluster_yaml`]'s.
pub fn machine_pool_yaml(namespace: &str, cluster: &str, replicas: usize, machine_spec: &str) -> String {
    let template = indent(machine_spec, 2);
    format!(
        r#"apiVersion: bootstrap.cluster.x-k8s.io/v1beta2
kind: KubeadmConfig
metadata:
  name: {cluster}-mp-0
  namespace: {namespace}
spec:
  joinConfiguration:
    nodeRegistration:
      name: '{{{{ ds.meta_data.local_hostname }}}}'
      kubeletExtraArgs:
      - name: provider-id
        value: 'kairon://{{{{ ds.meta_data.instance_id }}}}'
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KaironMachinePool
metadata:
  name: {cluster}-mp-0
  namespace: {namespace}
spec:
  template:
{template}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachinePool
metadata:
  name: {cluster}-mp-0
  namespace: {namespace}
spec:
  clusterName: {cluster}
  replicas: {replicas}
  template:
    spec:
      clusterName: {cluster}
      version: {KUBERNETES_VERSION}
      bootstrap:
        configRef:
          apiGroup: bootstrap.cluster.x-k8s.io
          kind: KubeadmConfig
          name: {cluster}-mp-0
      infrastructureRef:
        apiGroup: infrastructure.cluster.x-k8s.io
        kind: KaironMachinePool
        name: {cluster}-mp-0
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(phase: &str, health: Option<&str>) -> DynamicObject {
        let mut conditions = vec![serde_json::json!({"type": "Ready", "status": "True"})];
        if let Some(s) = health {
            conditions.push(serde_json::json!({"type": "HealthCheckSucceeded", "status": s}));
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m"},
            "status": {"phase": phase, "nodeRef": {"name": "m"}, "conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn a_machine_marked_unhealthy_is_not_up_though_running() {
        assert!(running_with_a_node(&machine("Running", None)));
        assert!(running_with_a_node(&machine("Running", Some("True"))));
        assert!(!running_with_a_node(&machine("Running", Some("False"))));
        assert!(!running_with_a_node(&machine("Provisioned", None)));
        let up = [machine("Running", Some("True")), machine("Running", None)];
        assert!(all_running_with_a_node(&up, 2));
        let one_marked = [machine("Running", Some("True")), machine("Running", Some("False"))];
        assert!(!all_running_with_a_node(&one_marked, 2));
    }

    #[test]
    fn states_name_each_objects_phase_node_and_conditions_not_true() {
        let mut m = machine("Provisioned", Some("False"));
        m.data["status"]["nodeRef"] = serde_json::Value::Null;
        m.data["status"]["conditions"][1]["reason"] = "NodeStartupTimeout".into();
        let up = machine("Running", None);
        assert_eq!(
            states(&[m, up]),
            "m phase=Provisioned node=- not True: HealthCheckSucceeded=False(NodeStartupTimeout)\nm phase=Running node=m"
        );
    }
}
