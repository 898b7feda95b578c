//! The tests that need no control plane: the CRDs' CEL rules evaluated client-side, and each
//! reconciler's requests in order against a mock API server (`tower-test`), one module per
//! reconciler. One binary, one job of `make test`; see `tests/README.md`.

mod mock_support;

mod cel_rules;
mod mock_kairon_discovery;
mod mock_kaironcluster;
mod mock_kaironmachinepool;
mod mock_reconcile;
mod mock_reconcile_maintenance;
