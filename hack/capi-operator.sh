#!/usr/bin/env bash
# Builds the Cluster API Operator (sigs.k8s.io/cluster-api-operator, pinned by the Go module
# testbed/tools/operator) into a cache outside the source tree:
#
#   ${CAPKR_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capkr-test-tools}/operator-<hash>/
#     capi-operator   the operator's manager
#     crd/            its CRD bases (CoreProvider, InfrastructureProvider, ...), copied from the
#                     Go module cache
#
# <hash> covers testbed/tools/operator/go.mod, go.sum and this script. The LAST line on stdout is
# the absolute cache dir (DIR=$(hack/capi-operator.sh | tail -1)); progress goes to stderr.
# tests/distribution/operator.rs installs the provider with it. Needs Go and the Go module proxy.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD="$ROOT/testbed/tools/operator"
CACHE=${CAPKR_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capkr-test-tools}
PKG=sigs.k8s.io/cluster-api-operator/cmd

log() { printf '[capi-operator] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HASH=$( { cat "$MOD/go.mod" "$MOD/go.sum" "${BASH_SOURCE[0]}"; uname -sm; } | sha256sum | cut -c1-16)
mkdir -p "$CACHE"
OUT="$(cd "$CACHE" && pwd)/operator-$HASH"
if [[ -x "$OUT/capi-operator" && -d "$OUT/crd" ]]; then
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || die "Go is required to build the Cluster API Operator"
# One build at a time per cache dir; a concurrent caller waits, then finds it built.
if command -v flock >/dev/null; then
  exec 9>"$CACHE/.operator.lock"
  flock 9
  if [[ -x "$OUT/capi-operator" && -d "$OUT/crd" ]]; then echo "$OUT"; exit 0; fi
fi
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off
tmp=$(mktemp -d "$CACHE/operator-$HASH.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
v=$(cd "$MOD" && go list -m -f '{{.Version}}' sigs.k8s.io/cluster-api-operator)
log "building $PKG $v (testbed/tools/operator) ..."
(cd "$MOD" && go build -trimpath -ldflags="-s -w" -o "$tmp/capi-operator" "$PKG")
dir=$(cd "$MOD" && go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api-operator)
[[ -d "$dir/config/crd/bases" ]] || die "no operator CRDs under $dir"
chmod 755 "$tmp"
mkdir -p "$tmp/crd"
cp "$dir"/config/crd/bases/*.yaml "$tmp/crd/"
chmod -R u+w "$tmp"
rm -rf "$OUT"
mv "$tmp" "$OUT"
trap - EXIT
log "cached: $OUT"
echo "$OUT"
