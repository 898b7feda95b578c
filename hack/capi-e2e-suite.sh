#!/usr/bin/env bash
# Compiles the Ginkgo suite of Cluster API's e2e specs (the Go module tests/capi-e2e, run by
# tests/e2e/e2e_capi_suite.rs) with `go test -c`, and the test Runtime Extension the Runtime SDK
# specs call (tests/capi-e2e/extension, `go build`), once per content, into a cache outside
# the source tree:
#
#   ${CAPKR_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capkr-test-tools}/capi-e2e-<hash>/capi-e2e.test
#   ${CAPKR_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capkr-test-tools}/capi-e2e-<hash>/capi-e2e-extension
#
# <hash> covers the module's go.mod, go.sum and Go files, and this script. The LAST line on
# stdout is the absolute path of the suite binary (the extension is next to it); progress
# goes to stderr. .ci/run calls it in the
# background while cargo builds, so the test finds the suite built. Needs Go and the Go
# module proxy.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD="$ROOT/tests/capi-e2e"
CACHE=${CAPKR_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capkr-test-tools}

log() { printf '[capi-e2e-suite] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HASH=$( { cat "$MOD/go.mod" "$MOD/go.sum" "${BASH_SOURCE[0]}"; for f in "$MOD"/*.go "$MOD"/extension/*.go; do echo "${f#"$MOD"/}"; cat "$f"; done; uname -sm; go version 2>/dev/null || true; } | sha256sum | cut -c1-16)
mkdir -p "$CACHE"
OUT="$(cd "$CACHE" && pwd)/capi-e2e-$HASH"
# One build at a time (.ci/run's and the test's may overlap): the second waits, then finds it.
exec 9>"$CACHE/capi-e2e.lock"
flock 9
if [[ -x "$OUT/capi-e2e.test" ]]; then
  echo "$OUT/capi-e2e.test"
  exit 0
fi
command -v go >/dev/null || die "Go (1.26) is required to compile the CAPI e2e suite"
# The flags hack/test-tools.sh builds CAPI with: the Go build cache it filled (Kubernetes,
# controller-runtime, CAPI packages) then serves most of this build.
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off
# Go's compiler collecting garbage less often: about 20 % less CPU for the same build.
export GOGC=${GOGC:-400}
tmp=$(mktemp -d "$CACHE/capi-e2e-$HASH.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "go test -c (tests/capi-e2e) ..."
started=$(date +%s)
# Tag e2e: upstream builds its MachinePool spec (test/e2e/machine_pool.go) only with it.
(cd "$MOD" && go test -c -tags e2e -trimpath -o "$tmp/capi-e2e.test" .)
log "go build (tests/capi-e2e/extension) ..."
(cd "$MOD" && go build -trimpath -o "$tmp/capi-e2e-extension" ./extension)
chmod 755 "$tmp"
rm -rf "$OUT"
mv "$tmp" "$OUT"
trap - EXIT
log "cached in $(( $(date +%s) - started ))s: $OUT"
echo "$OUT/capi-e2e.test"
