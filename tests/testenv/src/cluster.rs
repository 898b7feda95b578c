//! The test clusters: a Cluster with a KaironCluster (two failure domains, zone-a and
//! zone-b), one control-plane Machine with kubeadm init data (`<cluster>-control-plane-0`) and
//! a MachineDeployment (`<cluster>-md-0`) of workers with join data, optionally under a
//! MachineHealthCheck. Used by the demo and by the end-to-end tests.

/// The Kubernetes version of the test environment: the kube-apiserver that `hack/test-tools.sh`
/// builds (`tests/tools/k8s`), and the version the test clusters' Machines ask for.
pub const KUBERNETES_VERSION: &str = "v1.36.3";

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

/// The cluster's objects (CAPI v1beta2), with the control plane endpoint at `host:port`.
pub fn cluster_yaml(namespace: &str, cluster: &str, host: &str, port: u16, opts: &ClusterOptions) -> String {
    let fd = |f: Option<&String>| f.map(|f| format!("\n  failureDomain: {f}")).unwrap_or_default();
    let md_fd = opts
        .md_failure_domain
        .as_ref()
        .map(|f| format!("\n      failureDomain: {f}"))
        .unwrap_or_default();
    let cp_fd = fd(opts.cp_failure_domain.as_ref());
    let workers = opts.workers;
    let image = machine_image();
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
    kind: KaironCluster
    name: {cluster}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KaironCluster
metadata:
  name: {cluster}
  namespace: {namespace}
spec:
  controlPlaneEndpoint:
    host: {host}
    port: {port}
  failureDomains:
  - name: zone-a
    controlPlane: true
    nodeSelector:
      topology.kairon.zyvor.dev/zone: zone-a
  - name: zone-b
    nodeSelector:
      topology.kairon.zyvor.dev/zone: zone-b
---
apiVersion: bootstrap.cluster.x-k8s.io/v1beta2
kind: KubeadmConfig
metadata:
  name: {cluster}-control-plane-0
  namespace: {namespace}
spec:
  initConfiguration:
    nodeRegistration:
      name: '{{{{ ds.meta_data.local_hostname }}}}'
      kubeletExtraArgs:
      - name: provider-id
        value: 'kairon://{{{{ ds.meta_data.instance_id }}}}'
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KaironMachine
metadata:
  name: {cluster}-control-plane-0
  namespace: {namespace}
spec:
  cpus: 2
  memory: 4Gi
  image: {image}
  diskSize: 20Gi
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
    kind: KaironMachine
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
          name: '{{{{ ds.meta_data.local_hostname }}}}'
          kubeletExtraArgs:
          - name: provider-id
            value: 'kairon://{{{{ ds.meta_data.instance_id }}}}'
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KaironMachineTemplate
metadata:
  name: {cluster}-md-0
  namespace: {namespace}
spec:
  template:
    spec:
      cpus: 2
      memory: 4Gi
      image: {image}
      diskSize: 20Gi
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
        kind: KaironMachineTemplate
        name: {cluster}-md-0{mhc}
"#
    )
}
