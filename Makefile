# cluster-api-provider-kairon
#
#   make build          build the manager, crdgen and the simulator
#   make test           everything CI runs: drift check, lint, unit, mock and real-control-plane tests
#   make demo           start a local management cluster, Kairon simulator and the manager, create a cluster
#                       (DEMO_ARGS=--exit-when-ready to stop once it is up)
#   make generate       regenerate committed artefacts (CRDs, also the Helm chart's)
#   make release-manifests  clusterctl release assets in out/ (components, metadata, templates)
#   make release-build  the static release binary the Dockerfile builds
#   make lint           rustfmt check and clippy -D warnings
#   make test-tools     build (or find in the cache) the upstream binaries the tests run
#   make bench          scale benchmark, results in docs/bench (BENCH_SIZES="100 1000 5000", see docs/benchmarks.md)

CARGO ?= cargo
SHELL := /bin/bash
DEBUG_DIR = $${CARGO_TARGET_DIR:-$(CURDIR)/target}/debug

.PHONY: all build test test-unit test-tools generate check-generate lint fmt fmt-check demo clean release-manifests release-build bench

all: build

build:
	$(CARGO) build --workspace --bins

# `make test` passes the crdgen it built with the tests (CRDGEN=<path>).
CRDGEN ?= $(CARGO) run -q --bin crdgen --
generate:
	$(CRDGEN) --dir config/crd/bases
	$(CRDGEN) kairon --dir config/kairon
	$(CRDGEN) --dir charts/cluster-api-provider-kairon/crds

# Fails when a committed generated file differs from what the code generates.
check-generate: generate
	@git diff --exit-code -- config/ charts/cluster-api-provider-kairon/crds/ || { echo "generated files are out of date: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- config/ charts/cluster-api-provider-kairon/crds/)" || { git status --porcelain -- config/ charts/cluster-api-provider-kairon/crds/; echo "untracked generated files: run 'make generate' and commit"; exit 1; }

lint: fmt-check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt-check:
	$(CARGO) fmt --all -- --check

fmt:
	$(CARGO) fmt --all

# GOGC=400: Go's compiler collects garbage less often, 20 % less CPU for the same build.
test-tools:
	@GOGC=400 hack/test-tools.sh >/dev/null

# Unit, CEL and mock-server tests only: no control plane needed.
test-unit:
	$(CARGO) test --workspace --lib --bins
	$(CARGO) test --test mock

# Every test of the workspace, TEST_THREADS tests at a time in all (capkr-test-runner). The
# root package has three test binaries, one per tier: `mock` (no control plane), `e2e`
# (everything that starts processes) and `distribution` (the release artefacts). A job is a
# binary, or a module of one named in TEST_OWN, which runs in a process of its own as each
# was its own binary: the modules that start environments of their own, or whose managers
# watch every namespace. A job takes one test thread; TEST_WIDE ones take two: the groups
# whose tests start several API servers each (simulated kubeadm guests, management clusters
# per move); TEST_SHARED ones (JOB=N) take N: groups whose tests share one environment and
# run side by side in it, the CAPI e2e suite's three parts among them. Jobs start in
# TEST_FIRST's order, then cargo's, each once enough slots are free; logs in
# target/test-logs/. At six slots the CAPI suite (the longest job), the templates and the
# maintenance group start together, and the wide groups run one after the other beside the
# suite; the jobs mostly wait on controllers (a cold CI run at five slots kept 1.1 of the 2
# cores busy while its tests ran, and ended on the maintenance group, started only once the
# suite was done), so one more at once costs little. The last line counts the environments and API servers the tests
# started, and which jobs started full ones.
TEST_OWN := $(addprefix e2e/,e2e_capi_suite e2e_templates e2e_move e2e_maintenance e2e_identity \
	e2e_api_faults e2e_hostile_endpoint e2e_lanes admission_schema \
	operability_flags operability_leader operability_metrics operability_qps operability_rbac operability_readyz) \
	distribution/distribution_image
TEST_FIRST := e2e_capi_suite e2e_templates e2e_maintenance e2e e2e_identity e2e_move distribution_image
TEST_WIDE := e2e_templates e2e_move
TEST_SHARED := e2e=2 e2e_capi_suite=3
# The test binaries are built before the upstream binaries are asked for: on a new machine
# .ci/run builds those in the background meanwhile (hack/test-tools.sh waits on its lock).
# `make test` lints in the compile itself, with no clippy pass of its own: clippy-driver (what
# `cargo clippy` runs) is the rustc of the workspace's own crates, denying what `make lint`
# denies, and writes the real artefacts; the dependencies, which clippy never lints, are
# then compiled once instead of also being checked by a separate pass. Every cargo command
# of `make test` (and of the tests it runs) inherits it, so their artefacts stay shared.
CLIPPY_DRIVER := $(shell rustc --print sysroot 2>/dev/null)/bin/clippy-driver
test: export RUSTC_WORKSPACE_WRAPPER := $(CLIPPY_DRIVER)
test: export CLIPPY_ARGS := -D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
# The binaries and the tests are built in one cargo command: built apart, the binaries get the
# features of the normal dependencies alone and the tests those plus the dev-dependencies'
# (tokio's test-util, kube's cel, syn's fold), and every crate above those was compiled twice,
# a third time for `cargo run --bin crdgen`, whose package alone sets the features. The drift
# check then runs that crdgen.
test: fmt-check
	$(CARGO) build --workspace --bins --tests
	$(MAKE) --no-print-directory check-generate CRDGEN=$(DEBUG_DIR)/crdgen
	$(CARGO) test --workspace --doc
	CAPKR_TEST_BIN=$$(GOGC=400 hack/test-tools.sh | tail -1) $(DEBUG_DIR)/capkr-test-runner \
		--slots $${TEST_THREADS:-6} $(addprefix --own ,$(TEST_OWN)) $(addprefix --wide ,$(TEST_WIDE)) $(addprefix --threads ,$(TEST_SHARED)) \
		$(addprefix --first ,$(TEST_FIRST))

# The demo binary as `make build` built it: `cargo run -p capkr-testenv` would build it again
# with that package's features alone.
demo: test-tools build
	CAPKR_TEST_BIN=$$(GOGC=400 hack/test-tools.sh | tail -1) $(DEBUG_DIR)/capkr-demo $(DEMO_ARGS)

# Scale benchmark (docs/benchmarks.md): release builds of the manager, the simulator and the
# benchmark against the real control plane, CAPD's manager (hack/capd-manager.sh) for the
# side-by-side part; writes docs/bench/results.{md,json} and the plots.
BENCH_SIZES ?= 100 1000
BENCH_LIMITS ?= 100/200 0
BENCH_CAPI_SIZES ?= 100 1000
BENCH_POOL_SIZES ?= 100 1000
BENCH_IDLE ?= 120
BENCH_OUT ?= docs/bench
BENCH_ARGS ?=
BENCH_TARGET_DIR = $${CARGO_TARGET_DIR:-$(CURDIR)/target}/release
bench: test-tools
	$(CARGO) build --release -p cluster-api-provider-kairon -p kairon-sim -p capkr-bench --bin capkr-manager --bin kairon-sim --bin capkr-bench
	CAPKR_TEST_BIN=$$(hack/test-tools.sh | tail -1) CAPD_MANAGER_DIR=$$(hack/capd-manager.sh | tail -1) \
	CAPKR_MANAGER_BIN=$(BENCH_TARGET_DIR)/capkr-manager KAIRON_SIM_BIN=$(BENCH_TARGET_DIR)/kairon-sim \
	$(BENCH_TARGET_DIR)/capkr-bench --sizes "$(BENCH_SIZES)" --limits "$(BENCH_LIMITS)" \
		--capi-sizes "$(BENCH_CAPI_SIZES)" --pool-sizes "$(BENCH_POOL_SIZES)" --idle $(BENCH_IDLE) --out-dir $(BENCH_OUT) $(BENCH_ARGS)

# clusterctl release assets: out/ is a version folder of a clusterctl repository.
release-manifests:
	hack/release-manifests.sh out

# The release binary of the Dockerfile (static, release profile); prints its path.
release-build:
	hack/release-build.sh

clean:
	$(CARGO) clean
