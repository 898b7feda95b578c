#!/usr/bin/env bash
# Builds the upstream binaries the integration tests run (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, the Cluster API managers, clusterctl, helm,
# KWOK's controller) from the
# Go modules pinned under testbed/tools/, into a cache outside the source tree:
#
#   ${CAPKR_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capkr-test-tools}/<hash>/bin
#
# <hash> covers testbed/tools/*/go.mod, go.sum, testbed/tools/guest/*.go and this script, so a warm run only hashes a
# few files and checks that the binaries exist. The LAST line on stdout is the absolute bin
# dir (BIN=$(hack/test-tools.sh | tail -1)); progress goes to stderr.
#
# Existing binaries are honoured instead of building:
#   TEST_ASSET_ETCD, TEST_ASSET_KUBE_APISERVER   explicit paths (used when they exist)
#   KUBEBUILDER_ASSETS                           envtest dir holding etcd and kube-apiserver
# When any is used, the printed dir is $CACHE/<hash>/ext-<id>/bin, holding symlinks to them
# and to the built binaries.
#
# Next to bin/ it also keeps manifests/capi/{core,bootstrap-kubeadm,control-plane-kubeadm}/
# {crd/*.yaml,webhook/manifests.yaml} (+ manifests/capi/metadata.yaml): the raw CRD bases and
# webhook manifests of the pinned Cluster API, copied from the Go module cache, which the
# test environment (testbed/testenv) installs the way envtest does; and manifests/kwok/stages.yaml,
# KWOK's node heartbeat and fast pod Stages, which kairon-sim gives its KWOK controllers.
# <bin>/../manifests finds them.
#
# Needs only Go (the version in testbed/tools/*/go.mod, 1.26) and the Go module proxy.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS="$ROOT/testbed/tools"
SCRIPT="$ROOT/hack/test-tools.sh"
CACHE=${CAPKR_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capkr-test-tools}

log() { printf '[test-tools] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- cache key -----------------------------------------------------------------------
MODFILES=(k8s/go.mod k8s/go.sum capi/go.mod capi/go.sum helm/go.mod helm/go.sum guest/go.mod guest/go.sum kwok/go.mod kwok/go.sum)
# guest/ holds this project's own Go code (kairon-guest), so its sources are inputs too.
mapfile -t GUEST_SOURCES < <(cd "$TOOLS" && ls guest/*.go 2>/dev/null | sort)
MODFILES+=("${GUEST_SOURCES[@]}")
hash_inputs() {
  local f
  for f in "${MODFILES[@]}"; do
    [[ -f "$TOOLS/$f" ]] || die "missing $TOOLS/$f"
    printf '== %s\n' "$f"
    cat "$TOOLS/$f"
  done
  printf '== hack/test-tools.sh\n'
  cat "$SCRIPT"
  # The target platform is part of what the binaries are.
  printf '== platform %s %s\n' "$(uname -s)" "$(uname -m)"
}
HASH=$(hash_inputs | sha256sum | cut -c1-16)
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
BUILD_BIN="$CACHE/$HASH/bin"

# --- externally provided binaries ----------------------------------------------------
declare -A EXT=()
if [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/etcd" && -x "$KUBEBUILDER_ASSETS/kube-apiserver" ]]; then
  EXT[etcd]=$(cd "$KUBEBUILDER_ASSETS" && pwd)/etcd
  EXT[kube-apiserver]=$(cd "$KUBEBUILDER_ASSETS" && pwd)/kube-apiserver
elif [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks etcd or kube-apiserver; building them"
fi
abs() { (cd "$(dirname "$1")" && printf '%s/%s\n' "$(pwd)" "$(basename "$1")"); }
if [[ -n "${TEST_ASSET_ETCD:-}" ]]; then
  if [[ -x "$TEST_ASSET_ETCD" ]]; then EXT[etcd]=$(abs "$TEST_ASSET_ETCD")
  else log "TEST_ASSET_ETCD=$TEST_ASSET_ETCD is not an executable file; ignoring it"; fi
fi
if [[ -n "${TEST_ASSET_KUBE_APISERVER:-}" ]]; then
  if [[ -x "$TEST_ASSET_KUBE_APISERVER" ]]; then EXT[kube-apiserver]=$(abs "$TEST_ASSET_KUBE_APISERVER")
  else log "TEST_ASSET_KUBE_APISERVER=$TEST_ASSET_KUBE_APISERVER is not an executable file; ignoring it"; fi
fi

# name  module-dir  package
TARGETS=(
  "etcd                               k8s  go.etcd.io/etcd/server/v3"
  "kube-apiserver                     k8s  k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager            k8s  k8s.io/kubernetes/cmd/kube-controller-manager"
  "kube-scheduler                     k8s  k8s.io/kubernetes/cmd/kube-scheduler"
  "kubectl                            k8s  k8s.io/kubernetes/cmd/kubectl"
  "capi-manager                       capi sigs.k8s.io/cluster-api/core"
  "capi-kubeadm-bootstrap-manager     capi sigs.k8s.io/cluster-api/bootstrap/kubeadm"
  "capi-kubeadm-control-plane-manager capi sigs.k8s.io/cluster-api/controlplane/kubeadm"
  "clusterctl                         capi sigs.k8s.io/cluster-api/cmd/clusterctl"
  "helm                               helm helm.sh/helm/v3/cmd/helm"
  "kairon-guest                       guest ."
  "kwok                               kwok sigs.k8s.io/kwok/cmd/kwok"
)
ALL_NAMES=()
for t in "${TARGETS[@]}"; do read -r n _ _ <<<"$t"; ALL_NAMES+=("$n"); done

missing() { # names of binaries that still have to be built
  local t n
  for t in "${TARGETS[@]}"; do
    read -r n _ _ <<<"$t"
    [[ -n "${EXT[$n]:-}" ]] && continue
    [[ -x "$BUILD_BIN/$n" ]] || echo "$n"
  done
}

# CAPI's CRD bases and webhook manifests, copied once per hash from the module cache.
MANIFESTS="$CACHE/$HASH/manifests"
copy_manifests() {
  [[ -f "$MANIFESTS/.complete" ]] && return 0
  command -v go >/dev/null || die "Go is required to copy the Cluster API manifests from the module cache"
  local mod tmp src dst pair
  mod=$(cd "$TOOLS/capi" && GOWORK=off GOFLAGS=-mod=readonly go mod download -json sigs.k8s.io/cluster-api \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  [[ -n "$mod" && -d "$mod/core/config/crd/bases" ]] || die "cannot find sigs.k8s.io/cluster-api in the Go module cache"
  mkdir -p "$CACHE/$HASH"
  tmp=$(mktemp -d "$CACHE/$HASH/.manifests.XXXXXX")
  for pair in core:core bootstrap/kubeadm:bootstrap-kubeadm controlplane/kubeadm:control-plane-kubeadm; do
    src="$mod/${pair%%:*}/config"; dst="$tmp/capi/${pair##*:}"
    mkdir -p "$dst/crd" "$dst/webhook"
    cp "$src"/crd/bases/*.yaml "$dst/crd/"
    cp "$src/webhook/manifests.yaml" "$dst/webhook/"
  done
  cp "$mod/metadata.yaml" "$tmp/capi/"
  # KWOK's own Stage configs (the simulated kubelets' behaviour): Node heartbeats with a
  # Lease, and the fast Pod lifecycle (Running with an IP, completed Jobs, deletion).
  mod=$(cd "$TOOLS/kwok" && GOWORK=off GOFLAGS=-mod=readonly go mod download -json sigs.k8s.io/kwok \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  [[ -n "$mod" && -d "$mod/kustomize/stage" ]] || die "cannot find sigs.k8s.io/kwok in the Go module cache"
  mkdir -p "$tmp/kwok"
  for src in "$mod"/kustomize/stage/node/heartbeat-with-lease/node-*.yaml "$mod"/kustomize/stage/pod/fast/pod-*.yaml; do
    printf -- '---\n' >>"$tmp/kwok/stages.yaml"
    cat "$src" >>"$tmp/kwok/stages.yaml"
  done
  chmod -R u+w "$tmp"                       # files from the module cache are read-only
  touch "$tmp/.complete"
  if [[ -f "$MANIFESTS/.complete" ]]; then rm -rf "$tmp"; return 0; fi   # a concurrent caller won
  rm -rf "$MANIFESTS"
  mv -T "$tmp" "$MANIFESTS" 2>/dev/null || rm -rf "$tmp"
  log "copied the Cluster API manifests and KWOK's stages to $MANIFESTS"
}

# The dir to print: the build dir itself, or a dir of symlinks when external binaries are used.
result_dir() {
  if [[ ${#EXT[@]} -eq 0 ]]; then echo "$BUILD_BIN"; return; fi
  local id n d tmp
  id=$(for n in "${!EXT[@]}"; do echo "$n=${EXT[$n]}"; done | sort | sha256sum | cut -c1-12)
  d="$CACHE/$HASH/ext-$id/bin"
  if [[ ! -d "$d" ]]; then
    tmp=$(mktemp -d "$CACHE/$HASH/.ext.XXXXXX")
    for n in "${ALL_NAMES[@]}"; do ln -s "${EXT[$n]:-$BUILD_BIN/$n}" "$tmp/$n"; done
    mkdir -p "$(dirname "$d")"
    mv -T "$tmp" "$d" 2>/dev/null || rm -rf "$tmp"   # lost a race: the other one is identical
  fi
  # <bin>/../manifests must resolve from this dir as well.
  [[ -e "$(dirname "$d")/manifests" ]] || ln -sfn "$MANIFESTS" "$(dirname "$d")/manifests"
  echo "$d"
}

# --- warm path -------------------------------------------------------------------------
if [[ -z "$(missing)" ]]; then
  copy_manifests
  touch "$CACHE/$HASH" 2>/dev/null || true   # newest-used first when pruning
  OUT=$(result_dir)
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi

# --- cold path -------------------------------------------------------------------------
command -v go >/dev/null || die "Go is required to build the test binaries (go1.26+); or set KUBEBUILDER_ASSETS / TEST_ASSET_* for etcd and kube-apiserver"
mkdir -p "$BUILD_BIN"

# One build at a time per cache; a concurrent caller waits, then finds the binaries.
if command -v flock >/dev/null; then
  exec 9>"$CACHE/.lock"
  if ! flock -n 9; then log "another build holds $CACHE/.lock; waiting"; flock 9; fi
fi

export CGO_ENABLED=0 GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"
unset GOOS GOARCH                           # always build for this machine
trap 'exit 130' INT TERM                      # so build_one's EXIT trap removes its temp file
NICE=(); command -v nice >/dev/null && NICE=(nice -n 10)

T_START=$SECONDS
timed() { # label cmd...: runs cmd, logs its wall time
  local label=$1; shift
  local t0=$SECONDS
  "$@" || die "$label failed"
  log "$label: $((SECONDS - t0))s"
}

modver() { (cd "$TOOLS/$1" && go list -m -f '{{.Version}}' "$2"); }
modtime() { (cd "$TOOLS/$1" && go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' "$2"); }
ZERO_COMMIT=0000000000000000000000000000000000000000

declare -A LDF=() TAGS=()
ldflags_for() { # module-dir: sets LDF[dir]/TAGS[dir], the version ldflags upstream's release builds use
  local dir=$1 v d major minor p
  case $dir in
    k8s)
      # kubernetes hack/lib/version.sh: both component-base and client-go version vars.
      v=$(modver k8s k8s.io/kubernetes); d=$(modtime k8s k8s.io/kubernetes)
      major=${v#v}; major=${major%%.*}; minor=${v#v*.}; minor=${minor%%.*}
      LDF[k8s]="-s -w"
      for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        LDF[k8s]+=" -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor"
        LDF[k8s]+=" -X $p.gitCommit=$ZERO_COMMIT -X $p.gitTreeState=clean -X $p.buildDate=${d:-1970-01-01T00:00:00Z}"
      done
      # etcd's own scripts/build_lib.sh only injects the git SHA.
      LDF[k8s]+=" -X go.etcd.io/etcd/api/v3/version.GitSHA=$(modver k8s go.etcd.io/etcd/server/v3)"
      TAGS[k8s]="notest,grpcnotrace"           # kubernetes hack/lib/golang.sh (selinux: kubelet only)
      ;;
    capi)
      # cluster-api hack/scripts/release/version.sh
      v=$(modver capi sigs.k8s.io/cluster-api); d=$(modtime capi sigs.k8s.io/cluster-api)
      major=${v#v}; major=${major%%.*}; minor=${v#v*.}; minor=${minor%%.*}
      p=sigs.k8s.io/cluster-api/version
      LDF[capi]="-s -w -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor"
      LDF[capi]+=" -X $p.gitCommit=$ZERO_COMMIT -X $p.gitTreeState=clean -X $p.buildDate=${d:-1970-01-01T00:00:00Z}"
      TAGS[capi]=""
      ;;
    helm)
      # helm Makefile: version, and the default Kubernetes version from client-go's minor.
      v=$(modver helm helm.sh/helm/v3)
      local cg; cg=$(modver helm k8s.io/client-go)       # v0.M.p => Kubernetes 1.M
      minor=${cg#v0.}; minor=${minor%%.*}
      p=helm.sh/helm/v3
      LDF[helm]="-s -w -X $p/internal/version.version=$v -X $p/internal/version.metadata="
      LDF[helm]+=" -X $p/internal/version.gitCommit=$ZERO_COMMIT -X $p/internal/version.gitTreeState=clean"
      LDF[helm]+=" -X $p/pkg/lint/rules.k8sVersionMajor=1 -X $p/pkg/lint/rules.k8sVersionMinor=$minor"
      LDF[helm]+=" -X $p/pkg/chartutil.k8sVersionMajor=1 -X $p/pkg/chartutil.k8sVersionMinor=$minor"
      TAGS[helm]=""
      ;;
    guest)
      LDF[guest]="-s -w"
      TAGS[guest]=""
      ;;
    kwok)
      # kwok hack/releases.sh: the version (its default Kubernetes version is not used here).
      v=$(modver kwok sigs.k8s.io/kwok)
      LDF[kwok]="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${v#v}"
      TAGS[kwok]=""
      ;;
  esac
}

build_one() { # name dir pkg
  local n=$1 dir=$2 pkg=$3 tmp
  tmp="$BUILD_BIN/.$n.tmp.$$"
  trap 'rm -f "$tmp"' EXIT
  (cd "$TOOLS/$dir" && "${NICE[@]}" go build -trimpath -tags="${TAGS[$dir]}" -ldflags="${LDF[$dir]}" -o "$tmp" "$pkg") || return 1
  mv -f "$tmp" "$BUILD_BIN/$n" || return 1
  trap - EXIT
}

mapfile -t TODO < <(missing)
if [[ ${#TODO[@]} -eq 0 ]]; then log "built meanwhile by another caller: $BUILD_BIN"; copy_manifests; result_dir; exit 0; fi
log "building ${TODO[*]} into $BUILD_BIN (go: $(go env GOVERSION), GOMODCACHE=$(go env GOMODCACHE), GOCACHE=$(go env GOCACHE))"

# Module download: only the modules holding the needed packages (go.sum is complete).
declare -A DIRS=()
for t in "${TARGETS[@]}"; do
  read -r n dir pkg <<<"$t"
  [[ " ${TODO[*]} " == *" $n "* ]] || continue
  DIRS[$dir]+=" $pkg"
done
for dir in k8s capi helm guest kwok; do
  [[ -n "${DIRS[$dir]:-}" ]] || continue
  # shellcheck disable=SC2086
  timed "download modules ($dir)" bash -c 'cd "$1" && shift && "$@" >/dev/null' _ "$TOOLS/$dir" \
    "${NICE[@]}" go list -deps -tags=notest,grpcnotrace ${DIRS[$dir]}
  ldflags_for "$dir"
done

for t in "${TARGETS[@]}"; do
  read -r n dir pkg <<<"$t"
  [[ -x "$BUILD_BIN/$n" || -n "${EXT[$n]:-}" ]] && continue
  timed "build $n" build_one "$n" "$dir" "$pkg"
done

[[ -z "$(missing)" ]] || die "still missing: $(missing | tr '\n' ' ')"
copy_manifests
log "all built in $((SECONDS - T_START))s"

# Keep the three newest builds (other branches may use other pins); drop older ones.
for old in $(ls -1dt "$CACHE"/*/ 2>/dev/null | tail -n +4); do
  old=${old%/}
  [[ "$(basename "$old")" =~ ^[0-9a-f]{16}$ && -d "$old/bin" && "$old" != "$CACHE/$HASH" ]] || continue
  log "pruning old build $old"
  rm -rf "$old"
done
result_dir
