//! `capkr-testenv`: a real control plane for the provider's integration tests and the demo.
//!
//! [`Env::start`] runs, on free loopback ports in a temp dir: etcd, kube-apiserver (own CA,
//! client-cert admin, RBAC, ValidatingAdmissionPolicy, service-account keys),
//! kube-controller-manager (garbage collector and namespace controller only), CAPI's core,
//! kubeadm bootstrap and kubeadm control-plane managers out of cluster with their webhooks and
//! CRD conversion wired to `https://127.0.0.1:<port>` the way envtest does it, and this
//! project's CRDs plus the development Kairon Machine CRD. [`Env::workload_cluster`] adds a
//! workload API server per cluster; [`Env::start_manager`] and [`Env::start_simulator`] run
//! our own binaries. Everything is stopped and removed on drop, also on panic, and children
//! die with the test process.
//!
//! Binaries: `CAPKR_TEST_BIN` (dir) or `hack/test-tools.sh`; `capkr-manager` and `kairon-sim`
//! from `target/debug` or `CAPKR_MANAGER_BIN` / `KAIRON_SIM_BIN`. `CAPKR_TEST_KEEP=1` keeps
//! the temp dir (logs, kubeconfigs, certificates). [`audit`] reads the API server's audit log.
//!
//! It is also the one support library of every test and of the benchmark: the test cluster
//! and what it runs on ([`cluster`]: [`KUBERNETES_VERSION`], [`SIMULATOR_HOSTS`]), API
//! resources by name ([`capi_resource`]), free ports and a plain-HTTP GET ([`free_port`],
//! [`http_get`]), temp dirs that honour `CAPKR_TEST_KEEP` ([`ScratchDir`]), and a hostile
//! Kairon API for tenants' identities to point at ([`hostile`]).

pub mod audit;
mod bins;
mod certs;
mod clients;
pub mod cluster;
pub mod demo;
pub mod distribution;
mod dump;
mod env;
pub mod faults;
pub mod flavors;
pub mod hostile;
pub mod kairon_crds;
mod kube_util;
mod manifests;
mod net;
mod process;
mod scratch;
mod shared;
pub mod tally;
mod wait;
mod workload;

pub use bins::{Binaries, own_binary, workspace_root};
pub use cluster::{KUBERNETES_VERSION, NETWORK, SIMULATOR_HOSTS, machine_image};
pub use env::{AUDIT_POLICY_METADATA, CAPI_E2E_ADMISSION_PLUGINS, CapiManagers, Env, EnvOptions};
pub use kube_util::{
    FIELD_MANAGER, api_resource, apply_value, apply_yaml, capi_resource, client_from_kubeconfig_file, get_text,
    infrastructure_resource, resolve_kind,
};
pub use manifests::{parse_yaml_documents, redact_user_data};
pub use net::{HttpResponse, free_port, http_get};
pub use process::{Process, ProcessSpec, Signal, merged_args, pid_alive};
pub use scratch::{ScratchDir, keep_requested};
pub use wait::{Outcome, wait_for};
pub use workload::{WorkloadCluster, cluster_ca_secret};
