//! The tests that start processes: the real control plane (etcd, kube-apiserver,
//! kube-controller-manager, CAPI's managers), the simulator and the manager. One binary, run
//! by `make test` as several jobs (`capkr-test-runner --own`).
//!
//! The topic modules below share one environment per process: one management control plane
//! (`capkr_testenv::Env::shared`: etcd, kube-apiserver with an audit log,
//! kube-controller-manager, CAPI core, CABPK and KCP with their webhooks), and for each test a
//! namespace of its own with its workload API server, simulator and manager, both watching that
//! namespace only (`common::Rig`). So the tests run side by side, as CAPI's own suites run theirs
//! in one envtest. A test that changes the environment itself, or whose manager must watch every
//! namespace, asks for an environment of its own (`RigOptions::own_env`).
//!
//! The `e2e_*`, `operability_*` and `admission_schema` modules each run as a job of their own
//! (`TEST_OWN` in the Makefile): their tests start environments of their own or share one
//! among themselves only. See `tests/README.md` for what goes where.

mod common;
mod templates_support;

use capkr_testenv::distribution as distribution_support;

mod api_versions;
mod budgets;
mod create_failures;
mod events;
mod faults;
mod guest_commands;
mod images;
mod kairon_quirks;
mod left_behind;
mod lifecycle;
mod machine_pools;
mod machine_pools_acceptance;
mod machine_pools_filtered;
mod machine_pools_repoint;
mod maintenance;
mod power;
mod resilience;
mod smoke;
mod trust;
mod unreachable;

// Each a job of its own (`TEST_OWN`).
mod admission_schema;
mod e2e_api_faults;
mod e2e_capi_suite;
mod e2e_hostile_endpoint;
mod e2e_identity;
mod e2e_lanes;
mod e2e_maintenance;
mod e2e_move;
mod e2e_templates;
mod operability_flags;
mod operability_leader;
mod operability_metrics;
mod operability_qps;
mod operability_rbac;
mod operability_readyz;
