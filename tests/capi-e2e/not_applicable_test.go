package e2e

// Specs that cannot pass here (docs/capi-e2e.md says why) would carry the label
// "not-applicable", which the default filter of tests/e2e/e2e_capi_suite.rs leaves out, and
// CAPKR_CAPI_E2E_FOCUS=<their label> would run one to see it fail. None is wired up at
// present: the Node drain spec, the last one here, runs since the simulated workload
// clusters run Pods (node_drain_test.go).
