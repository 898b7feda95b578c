#!/usr/bin/env bash
# A throw-away control plane for trying kairon-sim by hand: etcd, a management
# kube-apiserver with the development Kairon CRD, and a "workload" kube-apiserver sharing
# etcd under another prefix. Source it:
#
#   source testbed/kairon-sim/scripts/env.sh     # from the repo root
#   kubectl get machines.kairon.zyvor.dev -A   # KUBECONFIG points at the management server
#   env_down                                   # stops everything, removes the temp dir
#
# Exports KUBECONFIG (management), WORKLOAD_KUBECONFIG, SIM_ENV_DIR, BIN.
# Needs the binaries of hack/test-tools.sh and openssl.

_sim_env_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
BIN=${BIN:-$("$_sim_env_root/hack/test-tools.sh" 2>/dev/null | tail -1)}
export BIN PATH="$BIN:$PATH"
SIM_ENV_DIR=$(mktemp -d /tmp/kairon-sim-env.XXXXXX)
export SIM_ENV_DIR

_free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

_sim_env_certs() {
  local d=$SIM_ENV_DIR/pki
  mkdir -p "$d"
  (
    cd "$d"
    openssl ecparam -name prime256v1 -genkey -noout -out ca.key
    openssl req -x509 -new -key ca.key -subj /CN=kairon-sim-ca -days 2 -out ca.crt
    openssl ecparam -name prime256v1 -genkey -noout -out apiserver.key
    openssl req -new -key apiserver.key -subj /CN=kube-apiserver -out apiserver.csr
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out apiserver.crt
    openssl ecparam -name prime256v1 -genkey -noout -out admin.key
    openssl req -new -key admin.key -subj "/O=system:masters/CN=kairon-admin" -out admin.csr
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext -out admin.crt
    openssl genrsa -out sa.key 2048
    openssl rsa -in sa.key -pubout -out sa.pub
  ) >/dev/null 2>&1
}

_sim_env_kubeconfig() { # port file
  local d=$SIM_ENV_DIR/pki
  cat >"$2" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:$1
    certificate-authority-data: $(base64 -w0 "$d/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(base64 -w0 "$d/admin.crt")
    client-key-data: $(base64 -w0 "$d/admin.key")
contexts:
- name: c
  context: {cluster: c, user: admin}
current-context: c
EOF
}

_sim_env_apiserver() { # name port etcd-prefix
  local d=$SIM_ENV_DIR/pki
  kube-apiserver --etcd-servers="http://127.0.0.1:$ETCD_PORT" --etcd-prefix="$3" \
    --secure-port="$2" --bind-address=127.0.0.1 \
    --tls-cert-file="$d/apiserver.crt" --tls-private-key-file="$d/apiserver.key" \
    --client-ca-file="$d/ca.crt" --authorization-mode=RBAC \
    --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true \
    --disable-admission-plugins=ServiceAccount \
    --service-account-issuer="https://127.0.0.1:$2/" \
    --service-account-key-file="$d/sa.pub" --service-account-signing-key-file="$d/sa.key" \
    --endpoint-reconciler-type=none \
    >"$SIM_ENV_DIR/$1.log" 2>&1 &
  echo $! >"$SIM_ENV_DIR/$1.pid"
}

_sim_env_wait() { # kubeconfig
  local i
  for i in $(seq 1 150); do
    kubectl --kubeconfig "$1" get --raw /readyz >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "API server did not become ready; see $SIM_ENV_DIR/*.log" >&2
  return 1
}

env_down() {
  local f pids=() i
  for f in "$SIM_ENV_DIR"/*.pid; do
    [[ -f $f ]] && pids+=("$(cat "$f")")
  done
  ((${#pids[@]})) && kill "${pids[@]}" 2>/dev/null
  for i in $(seq 1 50); do
    kill -0 "${pids[@]}" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "${pids[@]}" 2>/dev/null
  rm -rf "$SIM_ENV_DIR"
}

_sim_env_certs
ETCD_PORT=$(_free_port)
etcd --data-dir "$SIM_ENV_DIR/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$(_free_port)" \
  --unsafe-no-fsync >"$SIM_ENV_DIR/etcd.log" 2>&1 &
echo $! >"$SIM_ENV_DIR/etcd.pid"
MGMT_PORT=$(_free_port)
WORKLOAD_PORT=$(_free_port)
_sim_env_apiserver mgmt "$MGMT_PORT" /registry
_sim_env_apiserver workload "$WORKLOAD_PORT" /workload
export KUBECONFIG=$SIM_ENV_DIR/mgmt.kubeconfig WORKLOAD_KUBECONFIG=$SIM_ENV_DIR/workload.kubeconfig
_sim_env_kubeconfig "$MGMT_PORT" "$KUBECONFIG"
_sim_env_kubeconfig "$WORKLOAD_PORT" "$WORKLOAD_KUBECONFIG"
_sim_env_wait "$KUBECONFIG" && _sim_env_wait "$WORKLOAD_KUBECONFIG" &&
  kubectl apply -f "$_sim_env_root/config/kairon/" >/dev/null &&
  kubectl wait --for=condition=Established crd/machines.kairon.zyvor.dev crd/hosts.kairon.zyvor.dev \
    crd/machinemigrations.kairon.zyvor.dev >/dev/null &&
  echo "control plane up in $SIM_ENV_DIR (management :$MGMT_PORT, workload :$WORKLOAD_PORT)" >&2
