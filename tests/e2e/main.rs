//! The end-to-end tests that share one environment: one binary, one management control plane
//! (`capkr_testenv::Env::shared`: etcd, kube-apiserver with an audit log,
//! kube-controller-manager, CAPI core, CABPK and KCP with their webhooks), and for each test a
//! namespace of its own with its workload API server, simulator and manager, both watching that
//! namespace only (`common::Rig`). So the tests run side by side, as CAPI's own suites run theirs
//! in one envtest. A test that changes the environment itself, or whose manager must watch every
//! namespace, asks for an environment of its own (`RigOptions::own_env`).
//!
//! One module per topic, as the files were: see `tests/README.md`.

#[path = "../common/mod.rs"]
mod common;

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
