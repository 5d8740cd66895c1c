#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Starts the local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
# (fake nodes), all on 127.0.0.1, from the binaries that build.sh cached. State lives in .cluster/:
#
#   .cluster/kubeconfig      admin kubeconfig (client cert O=system:masters), what tests use
#   .cluster/bin/            symlinks to kubectl, helm, kwok, etcd, kube-* in the cache
#   .cluster/state.env       ports of this run (sourceable shell)
#   .cluster/pids/*.pid      one pid per process started here; down.sh kills exactly these
#   .cluster/logs/*.log      one log per process (kept after down.sh, overwritten by the next up)
#   .cluster/run/            this run's data: etcd data dir, certificates, component kubeconfigs
#   .cluster/lock            flock held by up.sh/down.sh while they work
#
# Idempotent: a healthy running cluster is left alone; leftovers of a crashed one are cleaned first.
# With DBSERVICE_REAL_NODE=1 (the default) it then starts one real node (real-node.sh).
# Environment: DBSERVICE_CLUSTER_DIR (default <repo>/.cluster), DBSERVICE_KWOK_NODES (default 2),
# DBSERVICE_START_TIMEOUT (seconds per component, default 120), DBSERVICE_CACHE (see versions.sh).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.sh
. "$here/versions.sh"

CLUSTER_DIR="${DBSERVICE_CLUSTER_DIR:-$repo/.cluster}"
NODES="${DBSERVICE_KWOK_NODES:-2}"
# 1: also start the real node (real-node.sh: kubelet, containerd, real pods); 0: kwok only.
REAL_NODE="${DBSERVICE_REAL_NODE:-1}"
TIMEOUT="${DBSERVICE_START_TIMEOUT:-120}"
BIN="$CLUSTER_DIR/bin"
PIDS="$CLUSTER_DIR/pids"
LOGS="$CLUSTER_DIR/logs"
PROCESS_MARK="$CLUSTER_DIR"
# shellcheck source=processes.sh
. "$here/processes.sh"
RUN="$CLUSTER_DIR/run"
PKI="$RUN/pki"
KUBECONFIG_FILE="$CLUSTER_DIR/kubeconfig"
SERVICE_CIDR="10.96.0.0/16"
FIRST_SERVICE_IP="10.96.0.1"

K8S_DIR="$CACHE_ROOT/kubernetes-$KUBERNETES_VERSION"
ETCD_DIR="$CACHE_ROOT/etcd-$ETCD_VERSION"
KWOK_DIR="$CACHE_ROOT/kwok-$KWOK_VERSION"
HELM_DIR="$CACHE_ROOT/helm-$HELM_VERSION"

log() { printf '[cluster-up] %s\n' "$*" >&2; }
die() { printf '[cluster-up] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------------------
# binaries

require_binaries() {
  local f missing=()
  for f in "$K8S_DIR/kube-apiserver" "$K8S_DIR/kube-controller-manager" "$K8S_DIR/kube-scheduler" \
    "$K8S_DIR/kubectl" "$ETCD_DIR/etcd" "$KWOK_DIR/kwok"; do
    [ -x "$f" ] || missing+=("$f")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    die "missing binaries (run tests/cluster/build.sh all, or make cluster-up): ${missing[*]}"
  fi
  command -v openssl >/dev/null || die "openssl is required"
  command -v curl >/dev/null || die "curl is required"
}

link_binaries() {
  mkdir -p "$BIN"
  local f
  for f in kube-apiserver kube-controller-manager kube-scheduler kubectl; do ln -sfn "$K8S_DIR/$f" "$BIN/$f"; done
  ln -sfn "$ETCD_DIR/etcd" "$BIN/etcd"
  ln -sfn "$KWOK_DIR/kwok" "$BIN/kwok"
  # helm is not needed to run the cluster, only linked when it was built.
  if [ -x "$HELM_DIR/helm" ]; then ln -sfn "$HELM_DIR/helm" "$BIN/helm"; fi
  # Likewise Prometheus and promtool, for the real-node monitoring test.
  local prometheus_dir="$CACHE_ROOT/prometheus-$PROMETHEUS_VERSION"
  if [ -x "$prometheus_dir/prometheus" ]; then
    ln -sfn "$prometheus_dir/prometheus" "$BIN/prometheus"
    ln -sfn "$prometheus_dir/promtool" "$BIN/promtool"
  fi
}

kubectl() { "$K8S_DIR/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# ---------------------------------------------------------------------------------------------------------
# processes

# pid_of, start_detached: see processes.sh.

# owns_port NAME PORT: our NAME process is the one listening on 127.0.0.1:PORT. A health endpoint alone
# could be answered by another cluster's process that won a race for the same port.
owns_port() {
  local pid
  pid="$(pid_of "$1")" || return 1
  [[ "$(ss -Hltnp "sport = :$2" 2>/dev/null)" == *"pid=$pid,"* ]]
}

# start NAME CMD...: detached (see processes.sh); a start that fails tears down what was started.
start() {
  start_detached "$@" || fail "$1" "did not start"
}

# fail NAME WHY: print which component failed and the tail of its log, tear down what was started, exit 1.
fail() {
  local name="$1" why="$2"
  printf '[cluster-up] ERROR: %s %s\n' "$name" "$why" >&2
  if [ -f "$LOGS/$name.log" ]; then
    printf '[cluster-up] ---- last 40 lines of %s ----\n' "$LOGS/$name.log" >&2
    tail -n 40 "$LOGS/$name.log" >&2 || true
    printf '[cluster-up] ----\n' >&2
  fi
  "$here/down.sh" >&2 || true
  exit 1
}

port_conflict() { grep -q 'address already in use' "$LOGS/$1.log" 2>/dev/null; }

# wait_for NAME WHAT CHECK...: retries CHECK until it succeeds (returns 0), the component lost its port to
# another process (only while bring_up waits: stops it, returns 2), or it died / TIMEOUT passed (exit 1).
WATCH_PORTS=false
wait_for() {
  local name="$1" what="$2"; shift 2
  local deadline=$((SECONDS + TIMEOUT)) pid
  until "$@" >/dev/null 2>&1; do
    if [ "$WATCH_PORTS" = true ] && port_conflict "$name"; then
      if pid="$(pid_of "$name")"; then kill "$pid" 2>/dev/null || true; fi
      return 2
    fi
    # Asked twice: while a large binary is being exec'd (cold page cache), /proc/PID/cmdline reads empty
    # for a moment and the process looks gone (seen here: "exited" with an empty log, fine on a rerun).
    if ! pid_of "$name" >/dev/null && ! { sleep 1; pid_of "$name" >/dev/null; }; then
      fail "$name" "exited while waiting for $what"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then fail "$name" "not ready after ${TIMEOUT}s ($what)"; fi
    sleep 0.5
  done
}

# bring_up NAME LAUNCH "PORT_VARS" WHAT CHECK...: LAUNCH starts NAME on the ports in PORT_VARS, then waits
# for CHECK. If another process took one of those ports in the meantime (two clusters starting at once),
# new ports are picked and NAME is started again, up to 3 times.
bring_up() {
  local name="$1" launch="$2" port_vars="$3" what="$4"; shift 4
  local attempt rc var
  for attempt in 1 2 3; do
    "$launch"
    rc=0
    WATCH_PORTS=true
    wait_for "$name" "$what" "$@" || rc=$?
    WATCH_PORTS=false
    [ "$rc" -eq 0 ] && return 0
    log "$name: a port was taken by another process (attempt $attempt); retrying on other ports"
    sleep 1
    for var in $port_vars; do pick_port "$var" "$((PORT_MIN + RANDOM % PORT_SPAN))"; done
    write_state
  done
  fail "$name" "could not get a free port"
}

# ---------------------------------------------------------------------------------------------------------
# ports. Each .cluster directory gets its own fixed block of 6 ports, derived from its path: URLs are stable
# from run to run, and another checkout, the CI clone or a DBSERVICE_CLUSTER_DIR gets a different block, so
# several clusters can run side by side. Ports stay below 32768, where Linux's ephemeral range starts.
# A port that is in use anyway is replaced by a free one; state.env has the ports actually used.

PORT_MIN=20000
PORT_SPAN=12000
TAKEN=""

port_in_use() { [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]; }

# pick_port VAR PREFERRED: sets VAR to PREFERRED if free, else to a random free port.
pick_port() {
  local var="$1" p="$2" tries=0
  while port_in_use "$p" || [[ " $TAKEN " == *" $p "* ]]; do
    p=$((PORT_MIN + RANDOM % PORT_SPAN)); tries=$((tries + 1))
    [ "$tries" -lt 500 ] || die "no free port found"
  done
  TAKEN="$TAKEN $p"
  printf -v "$var" '%s' "$p"
}

pick_ports() {
  local sum base
  sum="$(printf '%s' "$CLUSTER_DIR" | cksum)"
  base=$((PORT_MIN + (${sum%% *} % (PORT_SPAN / 10)) * 10))
  pick_port APISERVER_PORT "$base"
  pick_port ETCD_PORT "$((base + 1))"
  pick_port ETCD_PEER_PORT "$((base + 2))"
  pick_port CONTROLLER_MANAGER_PORT "$((base + 3))"
  pick_port SCHEDULER_PORT "$((base + 4))"
  pick_port KWOK_PORT "$((base + 5))"
  write_state
}

write_state() {
  cat > "$CLUSTER_DIR/state.env" <<EOF
# Written by tests/cluster/up.sh; sourceable. Everything listens on 127.0.0.1 only.
KUBERNETES_VERSION=$KUBERNETES_VERSION
APISERVER_PORT=$APISERVER_PORT
APISERVER_URL=https://127.0.0.1:$APISERVER_PORT
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
CONTROLLER_MANAGER_PORT=$CONTROLLER_MANAGER_PORT
SCHEDULER_PORT=$SCHEDULER_PORT
KWOK_PORT=$KWOK_PORT
KUBECONFIG=$KUBECONFIG_FILE
EOF
}

# ---------------------------------------------------------------------------------------------------------
# certificates (fresh for every run): one CA signs the apiserver serving cert and all client certs, and is
# also the cluster-signing CA of kube-controller-manager (CSRs) and the root CA put into every namespace.

# A minimal config so the machine's openssl.cnf defaults cannot add surprising extensions.
write_openssl_config() {
  cat > "$PKI/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder
EOF
}

# new_ca NAME COMMON_NAME
new_ca() {
  openssl req -x509 -new -nodes -newkey rsa:2048 -sha256 -days 3650 -config "$PKI/openssl.cnf" \
    -keyout "$PKI/$1.key" -out "$PKI/$1.crt" -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign" \
    -addext "subjectKeyIdentifier=hash" 2>/dev/null
}

# new_cert NAME SUBJECT EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES] [CA]
new_cert() {
  local name="$1" subject="$2" eku="$3" san="${4:-}" ca="${5:-ca}"
  openssl req -new -nodes -newkey rsa:2048 -sha256 -config "$PKI/openssl.cnf" \
    -keyout "$PKI/$name.key" -out "$PKI/$name.csr" -subj "$subject" 2>/dev/null
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    echo "authorityKeyIdentifier=keyid"
    if [ -n "$san" ]; then echo "subjectAltName=$san"; fi
  } > "$PKI/$name.ext"
  openssl x509 -req -sha256 -days 365 -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
    -CAcreateserial -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

generate_pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  write_openssl_config
  new_ca ca dbservice-local-ca
  # IP SAN 127.0.0.1 is required: rustls (kube-rs) does not accept a name-only cert for https://127.0.0.1.
  new_cert apiserver "/CN=kube-apiserver" serverAuth \
    "IP:127.0.0.1,IP:$FIRST_SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  new_cert admin "/O=system:masters/CN=dbservice-admin" clientAuth
  # The identities kubeadm uses; RBAC's bootstrap policy has roles for exactly these names.
  new_cert controller-manager "/CN=system:kube-controller-manager" clientAuth
  new_cert scheduler "/CN=system:kube-scheduler" clientAuth
  # kwok writes node and pod status, leases and deletes pods: it gets cluster-admin like in kwokctl.
  new_cert kwok "/O=system:masters/CN=kwok" clientAuth
  # The apiserver's identity towards kubelets (logs, exec); the real node's kubelet accepts only clients
  # of this CA and asks the apiserver whether they may (bound to system:kubelet-api-admin).
  new_cert apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client" clientAuth
  # Front proxy (API aggregation / request-header authentication). Without it the controller-manager and
  # scheduler log "missing content for CA bundle ... requestheader-client-ca-file" over and over.
  new_ca front-proxy-ca dbservice-local-front-proxy-ca
  new_cert front-proxy-client "/CN=front-proxy-client" clientAuth "" front-proxy-ca
  # Service-account token signing key pair (apiserver signs TokenRequests, controller-manager its own).
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
  openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  rm -f "$PKI"/*.srl
}

# write_kubeconfig FILE USER: a self-contained kubeconfig (certificates embedded), so it can be copied.
write_kubeconfig() {
  local file="$1" user="$2"
  cat > "$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dbservice-local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 < "$PKI/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 < "$PKI/$user.crt")
    client-key-data: $(base64 -w0 < "$PKI/$user.key")
contexts:
- name: dbservice-local
  context:
    cluster: dbservice-local
    user: $user
    namespace: default
current-context: dbservice-local
EOF
  chmod 600 "$file"
}

# ---------------------------------------------------------------------------------------------------------
# health

# (Outputs are compared as strings rather than piped into grep -q: with pipefail, grep -q exiting early
# can fail the pipeline through SIGPIPE.)
apiserver_ready() {
  owns_port kube-apiserver "$APISERVER_PORT" &&
  [ "$(curl -fsS --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT/readyz")" = ok ]
}
etcd_healthy() { owns_port etcd "$ETCD_PORT" && [[ "$(curl -fsS --max-time 5 "http://127.0.0.1:$ETCD_PORT/health")" == *'"health":"true"'* ]]; }
# kube-controller-manager and kube-scheduler serve /healthz with a self-signed cert; /healthz is always allowed.
controller_manager_healthy() {
  owns_port kube-controller-manager "$CONTROLLER_MANAGER_PORT" &&
  [ "$(curl -fsSk --max-time 5 "https://127.0.0.1:$CONTROLLER_MANAGER_PORT/healthz")" = ok ]
}
scheduler_healthy() {
  owns_port kube-scheduler "$SCHEDULER_PORT" &&
  [ "$(curl -fsSk --max-time 5 "https://127.0.0.1:$SCHEDULER_PORT/healthz")" = ok ]
}
kwok_healthy() { owns_port kwok "$KWOK_PORT" && curl -fsS --max-time 5 "http://127.0.0.1:$KWOK_PORT/healthz" >/dev/null; }

nodes_ready() {
  local ready
  ready="$(kubectl get nodes -l type=kwok \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c '^True$' || true)"
  [ "$ready" -ge "$NODES" ]
}

# The cluster recorded in .cluster is running: all five processes alive and the apiserver ready. A busy
# machine can make one probe slow, so readiness gets 20 s before the cluster counts as broken (and is
# restarted, which would pull it from under anyone using it).
cluster_running() {
  [ -s "$CLUSTER_DIR/state.env" ] && [ -s "$KUBECONFIG_FILE" ] && [ -s "$PKI/ca.crt" ] || return 1
  # shellcheck source=/dev/null
  . "$CLUSTER_DIR/state.env"
  local name deadline=$((SECONDS + 20))
  for name in etcd kube-apiserver kube-controller-manager kube-scheduler kwok; do
    pid_of "$name" >/dev/null || return 1
  done
  until apiserver_ready; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 1
  done
}

# Cluster-level objects up.sh provides; re-applied (idempotent) if a test removed nodes, for instance.
apply_objects() {
  kubectl apply -f "$here/manifests/storageclasses.yaml" >/dev/null
  create_nodes
  wait_for kwok "$NODES nodes Ready" nodes_ready
}

# ---------------------------------------------------------------------------------------------------------
# components

launch_etcd() {
  log "starting etcd $ETCD_VERSION on 127.0.0.1:$ETCD_PORT"
  # --unsafe-no-fsync: test data only, and fsync dominates etcd latency on a busy 2-core machine.
  start etcd "$ETCD_DIR/etcd" \
    --name=default \
    --data-dir="$RUN/etcd" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="default=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync \
    --log-level=warn
}

launch_apiserver() {
  log "starting kube-apiserver $KUBERNETES_VERSION on https://127.0.0.1:$APISERVER_PORT"
  # The audit log records who read which Secret (metadata only, no values): the trust-boundary tests
  # read it to prove that a forged admission review makes the operator read none (issue 37).
  cat >"$RUN/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    resources: [{group: "", resources: [secrets]}]
  - level: None
POLICY
  # --advertise-address: without it the apiserver looks for a default-route address.
  # --endpoint-reconciler-type=none: there is no real apiserver endpoint for the kubernetes Service.
  # --kubelet-*: the real node's kubelet (real-node.sh) is reached by its InternalIP (its hostname does
  #   not resolve), presents a certificate of our CA and accepts only clients of it.
  # --enable-aggregator-routing: webhooks and aggregated APIs are called at their pod IPs, not through
  #   the Service's ClusterIP, so the apiserver does not depend on kube-proxy's rules on this machine.
  # PodNodeSelector, PodTolerationRestriction: a namespace annotated by `real-node.sh namespace` sends
  #   all its pods to the real node, without test-only fields in the operator's pod template.
  start kube-apiserver "$K8S_DIR/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 \
    --secure-port="$APISERVER_PORT" \
    --cert-dir="$RUN/apiserver" \
    --tls-cert-file="$PKI/apiserver.crt" \
    --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --endpoint-reconciler-type=none \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" \
    --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --allow-privileged=true \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$PKI/ca.crt" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --enable-aggregator-routing=true \
    --enable-admission-plugins=PodNodeSelector,PodTolerationRestriction \
    --audit-policy-file="$RUN/audit-policy.yaml" \
    --audit-log-path="$LOGS/audit.log" \
    --audit-log-format=json \
    --profiling=false
}

launch_controller_manager() {
  log "starting kube-controller-manager on https://127.0.0.1:$CONTROLLER_MANAGER_PORT"
  write_kubeconfig "$RUN/controller-manager.kubeconfig" controller-manager
  # --use-service-account-credentials: each controller uses its own service account, like kubeadm, so the
  #   RBAC bootstrap roles apply (the system:kube-controller-manager role alone is not enough).
  # --root-ca-file: published as kube-root-ca.crt in every namespace (for service-account tokens).
  # --cluster-signing-*: lets CertificateSigningRequests be signed.
  # --enable-hostpath-provisioner: dynamic PVs for StorageClass provisioner kubernetes.io/host-path.
  # --kube-api-qps/--kube-api-burst, --concurrent-*-syncs: the defaults (20 requests/s per controller,
  #   5 workers) make the StatefulSet, PV and EndpointSlice controllers, not the apiserver, the ceiling
  #   when many databases are created at once (benches/README.md, scale); large clusters raise them too.
  start kube-controller-manager "$K8S_DIR/kube-controller-manager" \
    --kubeconfig="$RUN/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$RUN/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$RUN/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 \
    --secure-port="$CONTROLLER_MANAGER_PORT" \
    --cert-dir="$RUN/controller-manager" \
    --leader-elect=false \
    --controllers='*' \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" \
    --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --enable-hostpath-provisioner=true \
    --kube-api-qps="${DBSERVICE_CONTROLLER_MANAGER_QPS:-400}" \
    --kube-api-burst="${DBSERVICE_CONTROLLER_MANAGER_BURST:-800}" \
    --concurrent-statefulset-syncs=20 \
    --concurrent-service-endpoint-syncs=20 \
    --concurrent-endpoint-syncs=20 \
    --profiling=false
}

launch_scheduler() {
  log "starting kube-scheduler on https://127.0.0.1:$SCHEDULER_PORT"
  write_kubeconfig "$RUN/scheduler.kubeconfig" scheduler
  start kube-scheduler "$K8S_DIR/kube-scheduler" \
    --kubeconfig="$RUN/scheduler.kubeconfig" \
    --authentication-kubeconfig="$RUN/scheduler.kubeconfig" \
    --authorization-kubeconfig="$RUN/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 \
    --secure-port="$SCHEDULER_PORT" \
    --leader-elect=false \
    --kube-api-qps="${DBSERVICE_CONTROLLER_MANAGER_QPS:-400}" \
    --kube-api-burst="${DBSERVICE_CONTROLLER_MANAGER_BURST:-800}" \
    --profiling=false
}

launch_kwok() {
  log "starting kwok $KWOK_VERSION on http://127.0.0.1:$KWOK_PORT"
  write_kubeconfig "$RUN/kwok.kubeconfig" kwok
  local config=() f
  for f in "$here"/stages/*.yaml; do config+=(--config "$f"); done
  # Only nodes annotated kwok.x-k8s.io/node=fake are faked. --node-ip 127.0.0.1: nodes (and so pods'
  # hostIP) point at loopback, so anything the apiserver sends "to a kubelet" stays on this machine.
  # Pod IPs: fake, from --cidr (a /16 so long test runs never exhaust kwok's pool); nothing listens there,
  # never connect to them.
  start kwok "$KWOK_DIR/kwok" \
    --kubeconfig="$RUN/kwok.kubeconfig" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-ip=127.0.0.1 \
    --cidr=10.244.0.0/16 \
    --node-lease-duration-seconds=40 \
    --server-address="127.0.0.1:$KWOK_PORT" \
    "${config[@]}"
}

create_nodes() {
  local i
  for i in $(seq 0 $((NODES - 1))); do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kubernetes.io/hostname: kwok-node-$i
    topology.kubernetes.io/zone: local-$((i % 2))
status:
  # No taints (unlike kwok's examples), so ordinary pods schedule here.
  allocatable: {cpu: "32", memory: 256Gi, pods: "110", ephemeral-storage: 1Ti}
  capacity: {cpu: "32", memory: 256Gi, pods: "110", ephemeral-storage: 1Ti}
EOF
  done | kubectl apply -f - >/dev/null
}

smoke_pvc_bound() {
  [ "$(kubectl -n kube-system get pvc cluster-up-smoke -o jsonpath='{.status.phase}')" = Bound ]
}

# A claim on the default class must bind (hostPath provisioner, default-StorageClass admission). The claim
# is removed again; its PV is reclaimed (Delete) by the controller-manager in the background.
pvc_smoke_test() {
  kubectl -n kube-system delete pvc cluster-up-smoke --ignore-not-found --wait=false >/dev/null
  kubectl -n kube-system apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: cluster-up-smoke
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Mi}}
EOF
  wait_for kube-controller-manager "PVC on StorageClass standard to bind" smoke_pvc_bound
  kubectl -n kube-system delete pvc cluster-up-smoke --wait=false >/dev/null
}

# ---------------------------------------------------------------------------------------------------------

main() {
  require_binaries
  mkdir -p "$CLUSTER_DIR" "$PIDS" "$LOGS"
  # One up/down at a time per .cluster (two `make test` started together must not start two clusters);
  # the second one waits, then finds the cluster running. down.sh, called from here, knows we hold it.
  exec 9>"$CLUSTER_DIR/lock"
  flock -w 600 9 || die "another up.sh/down.sh holds $CLUSTER_DIR/lock"
  export DBSERVICE_CLUSTER_LOCKED=1
  link_binaries

  if cluster_running; then
    if ! nodes_ready >/dev/null 2>&1; then
      log "running, but fewer than $NODES Ready kwok nodes: re-applying nodes and StorageClasses"
      apply_objects
    fi
    if [ "$REAL_NODE" = 1 ]; then "$here/real-node.sh" up; fi
    log "already running (https://127.0.0.1:$APISERVER_PORT)"
    log "export KUBECONFIG=$KUBECONFIG_FILE PATH=$BIN:\$PATH"
    return 0
  fi
  # Leftovers from a crash or an interrupted run: stop whatever of ours still runs, drop old data.
  if compgen -G "$PIDS/*.pid" >/dev/null || [ -e "$RUN" ]; then
    log "cleaning up a stale cluster in $CLUSTER_DIR"
    "$here/down.sh"
  fi

  local t0=$SECONDS
  mkdir -p "$RUN" "$PIDS" "$LOGS"
  rm -f "$LOGS"/*.log
  pick_ports
  generate_pki

  bring_up etcd launch_etcd "ETCD_PORT ETCD_PEER_PORT" "/health" etcd_healthy
  bring_up kube-apiserver launch_apiserver APISERVER_PORT "/readyz" apiserver_ready
  write_kubeconfig "$KUBECONFIG_FILE" admin
  bring_up kube-controller-manager launch_controller_manager CONTROLLER_MANAGER_PORT "/healthz" controller_manager_healthy
  bring_up kube-scheduler launch_scheduler SCHEDULER_PORT "/healthz" scheduler_healthy
  bring_up kwok launch_kwok KWOK_PORT "/healthz" kwok_healthy

  log "applying StorageClasses and $NODES kwok nodes"
  apply_objects
  wait_for kube-controller-manager "ServiceAccount default/default" kubectl -n default get serviceaccount default
  pvc_smoke_test
  if [ "$REAL_NODE" = 1 ]; then "$here/real-node.sh" up; fi

  log "ready in $((SECONDS - t0))s: https://127.0.0.1:$APISERVER_PORT (Kubernetes $KUBERNETES_VERSION)"
  log "export KUBECONFIG=$KUBECONFIG_FILE PATH=$BIN:\$PATH"
}

main "$@"
