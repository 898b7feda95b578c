//! What an environment is started with: which of CAPI's managers run, the API server's flags,
//! the CRDs, the audit policy.

/// Which of CAPI's managers to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapiManagers {
    pub core: bool,
    pub bootstrap: bool,
    pub control_plane: bool,
}

impl CapiManagers {
    /// None of CAPI's managers: an API server with the CRDs only (no webhooks are configured
    /// without their manager).
    pub const NONE: CapiManagers = CapiManagers {
        core: false,
        bootstrap: false,
        control_plane: false,
    };
    /// CAPI core and the kubeadm bootstrap provider, without KubeadmControlPlane's manager:
    /// for clusters whose control-plane Machines are plain Machines (no control-plane
    /// provider), as the end-to-end rig's are.
    pub const WITHOUT_CONTROL_PLANE: CapiManagers = CapiManagers {
        core: true,
        bootstrap: true,
        control_plane: false,
    };
}

impl Default for CapiManagers {
    fn default() -> Self {
        CapiManagers {
            core: true,
            bootstrap: true,
            control_plane: true,
        }
    }
}

/// How to start an [`Env`]. `EnvOptions::new("my_test")` gives everything.
#[derive(Clone, Debug)]
pub struct EnvOptions {
    /// Prefixes log lines in dumps and names the temp dir.
    pub name: String,
    pub capi: CapiManagers,
    /// Extra kube-apiserver flags (`--flag=value`).
    pub apiserver_args: Vec<String>,
    /// An audit `Policy` (YAML); the log goes to [`Env::audit_log_path`] (JSON lines, blocking).
    pub audit_policy: Option<String>,
    /// `--feature-gates` for CAPI core and KCP (CABPK gets `MachinePool=true`).
    pub capi_feature_gates: String,
    /// Extra flags for every CAPI manager (e.g. `--sync-period=1m`).
    pub capi_args: Vec<String>,
    /// Extra environment of every CAPI manager (e.g. `HTTPS_PROXY`, through which CAPI core
    /// and KCP reach Runtime Extensions registered by Service).
    pub capi_env: Vec<(String, String)>,
    /// Whether to wait for the MachineDeployment defaulting webhook to answer.
    pub check_webhooks: bool,
    /// Which versions of Kairon's kinds the API server serves, and with which Machine schema.
    pub kairon_crds: crate::kairon_crds::KaironCrds,
}

impl EnvOptions {
    pub fn new(name: impl Into<String>) -> EnvOptions {
        EnvOptions {
            name: name.into(),
            ..EnvOptions::default()
        }
    }
    pub fn capi_managers(mut self, m: CapiManagers) -> Self {
        self.capi = m;
        self
    }
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.apiserver_args.push(arg.into());
        self
    }
    pub fn audit_policy(mut self, policy_yaml: impl Into<String>) -> Self {
        self.audit_policy = Some(policy_yaml.into());
        self
    }
    pub fn capi_arg(mut self, arg: impl Into<String>) -> Self {
        self.capi_args.push(arg.into());
        self
    }
}

impl Default for EnvOptions {
    fn default() -> Self {
        EnvOptions {
            name: "testenv".into(),
            capi: CapiManagers::default(),
            apiserver_args: Vec::new(),
            audit_policy: None,
            capi_feature_gates: "MachinePool=true,ClusterTopology=true".into(),
            capi_args: Vec::new(),
            capi_env: Vec::new(),
            check_webhooks: true,
            kairon_crds: Default::default(),
        }
    }
}

/// The admission plugins CAPI v1.14's e2e management cluster (its kind bootstrap,
/// `test/framework/bootstrap/kind_provider.go`) enables besides kube-apiserver's defaults, as
/// OpenShift does: changing an object's owner references needs `delete` on it. Every
/// environment's management API server runs with them.
pub const CAPI_E2E_ADMISSION_PLUGINS: &str = "--enable-admission-plugins=OwnerReferencesPermissionEnforcement";

/// An audit policy that logs every request at Metadata level.
pub const AUDIT_POLICY_METADATA: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n";
