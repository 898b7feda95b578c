#!/usr/bin/env bash
# Builds the manager of Cluster API's Docker provider (CAPD, sigs.k8s.io/cluster-api/test
# infrastructure/docker, whose in-memory backend runs DevClusters and DevMachines without
# containers) from the Go module tests/capi-e2e, which pins it, into a cache outside the
# source tree:
#
#   ${CAPKR_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capkr-test-tools}/capd-<hash>/
#     capd-manager   the binary
#     crd/           CAPD's CRD bases, copied from the Go module cache
#
# <hash> covers tests/capi-e2e/go.mod, go.sum and this script. The LAST line on stdout is the
# absolute cache dir (DIR=$(hack/capd-manager.sh | tail -1)); progress goes to stderr. The
# benchmark (testbed/bench) runs CAPD beside capkr-manager. Needs Go and the Go module proxy.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD="$ROOT/tests/capi-e2e"
CACHE=${CAPKR_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capkr-test-tools}
PKG=sigs.k8s.io/cluster-api/test/infrastructure/docker

log() { printf '[capd-manager] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HASH=$( { cat "$MOD/go.mod" "$MOD/go.sum" "${BASH_SOURCE[0]}"; uname -sm; } | sha256sum | cut -c1-16)
mkdir -p "$CACHE"
OUT="$(cd "$CACHE" && pwd)/capd-$HASH"
if [[ -x "$OUT/capd-manager" && -d "$OUT/crd" ]]; then
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || die "Go is required to build CAPD's manager"
# One build at a time per cache dir (.ci/run builds it in the background while the benchmark
# test may ask for it): a concurrent caller waits, then finds it built.
if command -v flock >/dev/null; then
  exec 9>"$CACHE/.capd.lock"
  flock 9
  if [[ -x "$OUT/capd-manager" && -d "$OUT/crd" ]]; then echo "$OUT"; exit 0; fi
fi
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off
tmp=$(mktemp -d "$CACHE/capd-$HASH.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "building $PKG (tests/capi-e2e) ..."
(cd "$MOD" && go build -trimpath -o "$tmp/capd-manager" "$PKG")
dir=$(cd "$MOD" && go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api/test)
[[ -d "$dir/infrastructure/docker/config/crd/bases" ]] || die "no CAPD CRDs under $dir"
chmod 755 "$tmp"
mkdir -p "$tmp/crd"
cp "$dir"/infrastructure/docker/config/crd/bases/*.yaml "$tmp/crd/"
chmod -R u+w "$tmp"
rm -rf "$OUT"
mv "$tmp" "$OUT"
trap - EXIT
log "cached: $OUT"
echo "$OUT"
