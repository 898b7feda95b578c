//! The release artefacts with the real tools (`clusterctl`, `helm`, `kubectl`), one module per
//! artefact. The tests that need a management cluster share one (`Env::shared`): the server-side
//! dry run of every flavor, the chart's RBAC with a manager acting as its ServiceAccount, and the
//! release's ValidatingAdmissionPolicy, each in namespaces of its own; `clusterctl init`, which
//! installs CAPI's own components into its cluster, and the Cluster API Operator, which
//! installs and upgrades ours cluster-wide, have one of their own.

use capkr_testenv::distribution as distribution_support;

mod admission;
mod clusterctl;
mod distribution_image;
mod docs;
mod helm;
mod operator;

/// The management cluster the tests of this binary share: CAPI's managers with their webhooks
/// (the flavors' dry run needs them).
fn shared_env_options() -> capkr_testenv::EnvOptions {
    capkr_testenv::EnvOptions::new("distribution")
}
