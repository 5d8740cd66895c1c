#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# One REAL worker node beside the kwok nodes of the local control plane: kubelet and kube-proxy (built by
# build.sh), containerd + runc + the CNI bridge plugin (Debian), CoreDNS (built by build.sh) as a host
# process, a local-volume provisioner, and locally built images (images.sh). No registry is involved.
#
#   real-node.sh up            start it (idempotent; the control plane must be up); called by up.sh
#   real-node.sh down          stop it and undo every change to the machine; called by down.sh
#   real-node.sh check-clean   exit 1 (listing what is left) unless nothing of the real node remains
#   real-node.sh status
#
# Pods land on the node only when they ask for it: it is tainted dbservice.dev/real-node=true:NoSchedule
# and labelled type=real. A namespace annotated by `real-node.sh namespace NS` sends every pod created in
# it there (the apiserver's PodNodeSelector + PodTolerationRestriction admission plugins), so the
# operator's pod template needs no test-only field.
#
# Safety: pods get no default route (only the Service CIDR is routed, to the bridge), kwok's fake pod IPs
# are black-holed, pods resolve names only through our CoreDNS (which has no upstream), and the kubelet
# API authenticates clients by the cluster CA (the apiserver has a kubelet client certificate) and
# authorizes them through the apiserver (webhook): no anonymous access.
#
# State: $CLUSTER_DIR/real-node (logs, pids, configs, volumes); containerd's state under /run (short paths
# for unix sockets). Needs root. Environment: DBSERVICE_CLUSTER_DIR, DBSERVICE_START_TIMEOUT.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.sh
. "$here/versions.sh"

CLUSTER_DIR="${DBSERVICE_CLUSTER_DIR:-$repo/.cluster}"
TIMEOUT="${DBSERVICE_START_TIMEOUT:-120}"
RN="$CLUSTER_DIR/real-node"
LOGS="$RN/logs"
PIDS="$RN/pids"
PROCESS_MARK="$RN"
# shellcheck source=processes.sh
. "$here/processes.sh"
PKI="$CLUSTER_DIR/run/pki"
NODE_PKI="$RN/pki"
K8S_DIR="$CACHE_ROOT/kubernetes-$KUBERNETES_VERSION"
COREDNS="$CACHE_ROOT/coredns-$COREDNS_VERSION/coredns"

NODE=real-0
# The pod network: its own /24 on bridge dbs0, outside kwok's fake 10.244.0.0/16 and the Services' 10.96.0.0/16.
# The second node (second-node.sh) has the next /24 on its own bridge; POD_NETWORK covers both.
BRIDGE=dbs0
POD_CIDR=10.85.0.0/24
GATEWAY=10.85.0.1
POD_NETWORK=10.85.0.0/16
# CoreDNS binds this node's bridge address; the second node's pods reach it there too.
CLUSTER_DNS=10.85.0.1
# What differs on the second node (second-node.sh sets these after sourcing this file).
KUBELET_PORT=10250
KUBELET_HEALTHZ_PORT=10248
CGROUP_ROOT=/
SERVICE_CIDR=10.96.0.0/16
KWOK_CIDR=10.244.0.0/16
# In-cluster clients reach the apiserver (bound to 127.0.0.1) through the `kubernetes` Service, whose
# endpoint is this relay on the bridge address.
APISERVER_RELAY_PORT=6443
CONTAINERD_STATE=/run/dbservice-containerd
CONTAINERD_SOCKET="$CONTAINERD_STATE/containerd.sock"
# The machine-wide resources (bridge, routes, ports 53 and 10250) allow one real node per machine.
OWNER_FILE=/run/dbservice-real-node.owner
# Network namespaces this machine had before the node started and cannot remove (seen once: two
# cni-* namespaces of pods killed mid-creation stayed mounted where this sandbox may not unmount
# them); check-clean judges only what the node made since.
STUCK_FILE=/run/dbservice-real-node.stuck-netns
TAINT_KEY=dbservice.dev/real-node
STORAGE_CLASS=real-local
# Volumes of exactly the claimed size (a loop-mounted file system), for tests that fill one.
SIZED_STORAGE_CLASS=real-local-sized
# The same in XFS, which the provisioner grows online when a claim asks for more (ext4's online
# resize needs CAP_SYS_RESOURCE, which this machine's root may not have; XFS's needs CAP_SYS_ADMIN).
GROWABLE_STORAGE_CLASS=real-local-growable

log() { printf '[real-node] %s\n' "$*" >&2; }
die() { printf '[real-node] ERROR: %s\n' "$*" >&2; exit 1; }
kubectl() { "$K8S_DIR/kubectl" --kubeconfig "$CLUSTER_DIR/kubeconfig" "$@"; }
ctr_() { ctr --address "$CONTAINERD_SOCKET" -n k8s.io "$@"; }
# The machine's address on its default route: the kubelet refuses a loopback node IP.
node_ip() { ip -4 -o route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p'; }

# start NAME CMD...: once (a running NAME is left alone); see processes.sh.
start() {
  pid_of "$1" >/dev/null && return 0
  start_detached "$@" || die "$1 did not start"
}

stop() { stop_process "$1" 10; }

# wait_until NAME WHAT CHECK...: polls CHECK until it succeeds; fails with NAME's log tail on timeout/exit.
wait_until() {
  local name="$1" what="$2"; shift 2
  local deadline=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if ! pid_of "$name" >/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
      printf '[real-node] ERROR: %s: no %s (log tail below)\n' "$name" "$what" >&2
      tail -n 30 "$LOGS/$name.log" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
}

# ---------------------------------------------------------------------------------------------------------
# prerequisites

install_packages() {
  local command missing=()
  declare -A needed=([containerd]=containerd [runc]=runc [iptables]=iptables [conntrack]=conntrack
    [socat]=socat [buildah]=buildah [gcc]=gcc [debootstrap]=debootstrap [make]=make [curl]=curl [pkg-config]=pkg-config
    [mkfs.ext4]=e2fsprogs [mkfs.xfs]=xfsprogs [losetup]=mount)
  for command in "${!needed[@]}"; do command -v "$command" >/dev/null || missing+=("${needed[$command]}"); done
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  [ -x /bin/busybox ] || missing+=(busybox-static)
  [ -e /usr/include/stdio.h ] || missing+=(libc6-dev)
  # PgBouncer's build (images.sh pgbouncer_binary).
  [ -e /usr/include/event2/event.h ] || missing+=(libevent-dev)
  [ -e /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
  compgen -G '/usr/lib/postgresql/15/bin/postgres' >/dev/null || missing+=(postgresql-15)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$LOGS/apt.log" 2>&1 ||
      { tail -n 20 "$LOGS/apt.log" >&2; die "apt-get install failed"; }
  fi
}

require() {
  [ "$(id -u)" = 0 ] || die "the real node needs root (network namespaces, mounts, iptables)"
  if ! [ -x "$K8S_DIR/kubelet" ] || ! [ -x "$K8S_DIR/kube-proxy" ] || ! [ -x "$COREDNS" ]; then
    die "kubelet, kube-proxy or CoreDNS missing in $CACHE_ROOT (run tests/cluster/build.sh all)"
  fi
  if ! [ -s "$CLUSTER_DIR/state.env" ] || ! [ -s "$PKI/ca.key" ]; then
    die "no control plane in $CLUSTER_DIR (run tests/cluster/up.sh)"
  fi
  kubectl get --raw /readyz >/dev/null || die "the apiserver of $CLUSTER_DIR does not answer"
}

# One real node per machine: refuse while another cluster directory's real node still runs (its pid files
# name live processes whose command lines point into it). A dead owner's leftovers are cleaned by `down`.
claim_machine() {
  if [ -s "$OWNER_FILE" ] && [ "$(cat "$OWNER_FILE")" != "$CLUSTER_DIR" ]; then
    local other file pid cmdline
    other="$(cat "$OWNER_FILE")"
    for file in "$other"/real-node/pids/*.pid; do
      [ -s "$file" ] || continue
      pid="$(cat "$file")"
      cmdline="$( { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null)" || continue
      if [[ "$cmdline" == *"$other/real-node/"* ]]; then
        die "the real node of this machine belongs to $other (one per machine); stop it there or set DBSERVICE_REAL_NODE=0"
      fi
    done
    log "the real node of $other is not running any more: cleaning up what it left"
    STALE_ROOT="$other/real-node/" down
  fi
  echo "$CLUSTER_DIR" >"$OWNER_FILE"
}

# ---------------------------------------------------------------------------------------------------------
# identities: client certificates signed by the cluster CA (up.sh made it; it signs the apiserver's too)

node_certificate() { # NAME SUBJECT USAGE [SUBJECT_ALT_NAMES]
  local name="$1" subject="$2" usage="$3" san="${4:-}"
  [ -s "$NODE_PKI/$name.crt" ] && return 0
  openssl req -new -nodes -newkey rsa:2048 -sha256 -config "$PKI/openssl.cnf" \
    -keyout "$NODE_PKI/$name.key" -out "$NODE_PKI/$name.csr" -subj "$subject" 2>/dev/null
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    if [ -n "$san" ]; then echo "subjectAltName=$san"; fi
  } >"$NODE_PKI/$name.ext"
  openssl x509 -req -sha256 -days 365 -in "$NODE_PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -CAserial "$NODE_PKI/ca.srl" -CAcreateserial -extfile "$NODE_PKI/$name.ext" -out "$NODE_PKI/$name.crt" 2>/dev/null
  rm -f "$NODE_PKI/$name.csr" "$NODE_PKI/$name.ext"
}

node_kubeconfig() { # NAME
  # shellcheck source=/dev/null
  . "$CLUSTER_DIR/state.env"
  cat >"$NODE_PKI/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$APISERVER_URL", certificate-authority: "$PKI/ca.crt"}}]
users: [{name: $1, user: {client-certificate: "$NODE_PKI/$1.crt", client-key: "$NODE_PKI/$1.key"}}]
contexts: [{name: local, context: {cluster: local, user: $1}}]
current-context: local
EOF
}

identities() {
  mkdir -p "$NODE_PKI" && chmod 700 "$NODE_PKI"
  node_certificate kubelet "/O=system:nodes/CN=system:node:$NODE" clientAuth
  # The kubelet's serving certificate, checked by the apiserver (--kubelet-certificate-authority).
  node_certificate kubelet-serving "/CN=$NODE" serverAuth "IP:$(node_ip),DNS:$NODE"
  node_certificate kube-proxy "/CN=system:kube-proxy" clientAuth
  node_certificate coredns "/CN=dbservice:coredns" clientAuth
  node_kubeconfig kubelet
  node_kubeconfig kube-proxy
  node_kubeconfig coredns
  # up.sh runs RBAC only (no Node authorizer), and the bootstrap system:node binding has no subjects.
  kubectl apply -f "$here/manifests/real-node-rbac.yaml" >/dev/null
}

# ---------------------------------------------------------------------------------------------------------
# runtime and network

network() {
  mkdir -p "$RN/cni/net.d"
  # Only the Service CIDR and the other node's pods are routed out of a pod (to the bridge, where
  # kube-proxy DNATs Services): pods have no default route, so nothing they send can leave the machine.
  cat >"$RN/cni/net.d/10-dbservice.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "dbservice",
  "plugins": [{
    "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GATEWAY"}]],
             "routes": [{"dst": "$SERVICE_CIDR"}, {"dst": "$POD_NETWORK"}], "dataDir": "$RN/cni/ipam"}
  }]
}
EOF
  # The bridge exists before the first pod, so CoreDNS and the apiserver relay can bind the gateway.
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  # (compared as a string: with pipefail, `| grep -q` can fail the pipeline through SIGPIPE)
  [[ "$(ip addr show dev "$BRIDGE")" == *"inet $GATEWAY/"* ]] || ip addr add "$GATEWAY/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Services backed by kwok pods are DNATed to fake IPs: those packets must never leave the machine.
  ip route replace blackhole "$KWOK_CIDR"
}

start_containerd() {
  mkdir -p "$RN/containerd" "$CONTAINERD_STATE"
  cat >"$RN/containerd/config.toml" <<EOF
version = 2
root = "$RN/containerd/root"
state = "$CONTAINERD_STATE"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CONTAINERD_SOCKET"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # These VMs lack CAP_SYS_RESOURCE: runc cannot set the negative oom_score_adj the kubelet asks for
  # ("failed to update /proc/self/oom_score_adj: Permission denied"); clamp it to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RN/cni/net.d"
EOF
  start containerd containerd --config "$RN/containerd/config.toml"
  wait_until containerd "containerd socket" ctr --address "$CONTAINERD_SOCKET" version
}

import_images() {
  local archive
  for archive in "$IMAGE_CACHE"/pause-*.tar "$IMAGE_CACHE"/postgres-*.tar "$IMAGE_CACHE"/pgwheel-*.tar \
    "$IMAGE_CACHE"/busybox-*.tar "$IMAGE_CACHE"/pgbouncer-*.tar; do
    ctr_ images import "$archive" >/dev/null
  done
  if [ -s "$IMAGE_CACHE/operator.tar" ]; then ctr_ images import "$IMAGE_CACHE/operator.tar" >/dev/null; fi
}

start_kubelet() {
  local address
  address="$(node_ip)"
  mkdir -p "$RN/kubelet"
  cat >"$RN/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false          # cgroup v1 hosts are refused by default since 1.35
cgroupDriver: cgroupfs       # containerd 1.6 lacks the RuntimeConfig CRI call (fallback until 1.38)
containerRuntimeEndpoint: unix://$CONTAINERD_SOCKET
address: $address
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
cgroupRoot: $CGROUP_ROOT
tlsCertFile: $NODE_PKI/kubelet-serving.crt
tlsPrivateKeyFile: $NODE_PKI/kubelet-serving.key
# Clients authenticate with a certificate of the cluster CA (the apiserver's kubelet client certificate)
# and are authorized by the apiserver (SubjectAccessReview): nobody else may use the kubelet API.
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $PKI/ca.crt}}
authorization: {mode: Webhook}
registerWithTaints:
- {key: $TAINT_KEY, value: "true", effect: NoSchedule}
$(extra_taints)
failSwapOn: false
resolvConf: ""               # no pod ever gets the machine's resolver: names come from our CoreDNS only
clusterDomain: cluster.local
clusterDNS: [$CLUSTER_DNS]
podLogsDir: $RN/kubelet/pod-logs
rotateCertificates: false
serverTLSBootstrap: false
maxPods: 60
imageGCHighThresholdPercent: 100   # locally built images cannot be pulled again: never collect them
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
nodeStatusReportFrequency: 10s
EOF
  start kubelet "$K8S_DIR/kubelet" --config="$RN/kubelet/config.yaml" --kubeconfig="$NODE_PKI/kubelet.kubeconfig" \
    --hostname-override="$NODE" --node-ip="$address" --node-labels="$(node_labels)" \
    --root-dir="$RN/kubelet/root" --cert-dir="$RN/kubelet/pki" --v=1
  wait_until kubelet "Ready node $NODE" node_ready
}
# What the second node overrides: its labels, and a taint of its own (only the drain test goes there).
node_labels() { echo "type=real,$TAINT_KEY=true"; }
extra_taints() { :; }
node_ready() { [ "$(kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }

start_kube_proxy() {
  mkdir -p "$RN/kube-proxy"
  cat >"$RN/kube-proxy/config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $NODE_PKI/kube-proxy.kubeconfig}
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_NETWORK
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [127.0.0.1/32]
conntrack: {maxPerCore: 0}   # leave the machine's nf_conntrack_max alone
oomScoreAdj: 0               # a negative score needs CAP_SYS_RESOURCE
EOF
  start kube-proxy "$K8S_DIR/kube-proxy" --config="$RN/kube-proxy/config.yaml" --v=1
  wait_until kube-proxy "/healthz" curl -fsS --max-time 2 http://127.0.0.1:10256/healthz
}

# CoreDNS as a host process on the bridge address (the kubelet's clusterDNS), reading the API with its
# own certificate. No `forward` plugin: a name outside cluster.local gets no answer from anywhere.
start_coredns() {
  mkdir -p "$RN/coredns"
  cat >"$RN/coredns/Corefile" <<EOF
.:53 {
    bind $GATEWAY
    errors
    health 127.0.0.1:19153
    ready 127.0.0.1:19181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $NODE_PKI/coredns.kubeconfig local
        pods insecure
        ttl 5
    }
    cache 5
    loadbalance
}
EOF
  start coredns "$COREDNS" -conf "$RN/coredns/Corefile"
  wait_until coredns "/ready" curl -fsS --max-time 2 http://127.0.0.1:19181/ready
}

# Pods reach the apiserver as https://kubernetes.default.svc (10.96.0.1:443): kube-proxy sends that to
# this relay on the bridge address, which passes the TLS stream to the apiserver on 127.0.0.1 unchanged.
start_apiserver_relay() {
  # shellcheck source=/dev/null
  . "$CLUSTER_DIR/state.env"
  start apiserver-relay socat -L "$RN/apiserver-relay.lock" \
    "TCP-LISTEN:$APISERVER_RELAY_PORT,bind=$GATEWAY,reuseaddr,fork,max-children=256" "TCP:127.0.0.1:$APISERVER_PORT"
  kubectl apply -f - >/dev/null <<EOF
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes-real-node
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes, endpointslice.kubernetes.io/managed-by: dbservice.dev-real-node}
addressType: IPv4
endpoints: [{addresses: ["$GATEWAY"], conditions: {ready: true}}]
ports: [{name: https, port: $APISERVER_RELAY_PORT, protocol: TCP}]
EOF
}

start_provisioner() {
  mkdir -p "$RN/volumes"
  local class expandable
  # Only the growable volumes can grow (the provisioner grows their file systems); a directory on the
  # host's disk has no size to grow.
  for class in "$STORAGE_CLASS" "$SIZED_STORAGE_CLASS" "$GROWABLE_STORAGE_CLASS"; do
    expandable=false
    [ "$class" = "$GROWABLE_STORAGE_CLASS" ] && expandable=true
    kubectl apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $class}
provisioner: dbservice.dev/real-node-local
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: $expandable
EOF
  done
  # shellcheck source=/dev/null
  . "$CLUSTER_DIR/state.env"
  start provisioner python3 "$here/local-provisioner.py" --server "$APISERVER_URL" --ca "$PKI/ca.crt" \
    --certificate "$PKI/admin.crt" --key "$PKI/admin.key" \
    --directory "$RN/volumes" --node "$NODE" --storage-class "$STORAGE_CLASS" \
    --sized-storage-class "$SIZED_STORAGE_CLASS" --growable-storage-class "$GROWABLE_STORAGE_CLASS"
}

# ---------------------------------------------------------------------------------------------------------

up() {
  local started=$SECONDS
  mkdir -p "$RN" "$LOGS" "$PIDS"
  install_packages
  # Again: the image names carry the versions of packages just installed (found by a fresh machine:
  # PgBouncer installed here was named localhost/pgbouncer:unknown in real-node.env).
  # shellcheck source=images.sh
  IMAGES_ONLY_VARIABLES=1 . "$here/images.sh"
  require
  claim_machine
  record_stuck_namespaces
  "$here/images.sh" node
  local runtime_started=$SECONDS
  identities
  network
  start_containerd
  import_images
  start_kubelet
  log "node $NODE Ready $((SECONDS - runtime_started))s after containerd started"
  start_kube_proxy
  start_coredns
  start_apiserver_relay
  start_provisioner
  write_environment
  "$here/second-node.sh" up
  log "up in $((SECONDS - started))s: node $NODE, StorageClass $STORAGE_CLASS, PostgreSQL image $DEFAULT_POSTGRES_IMAGE"
}

# real-node.env: what tests and the demo need to know (sourceable).
write_environment() {
  # Wheel versions are MAJOR.MINOR.0; images are tagged MAJOR.MINOR. The other versions: every image
  # but the default major's.
  local other_versions="" version
  for version in "$POSTGRES_VERSION" $POSTGRES_WHEEL_VERSIONS; do
    version="${version%.0}"
    [ "$version" = "$DEFAULT_POSTGRES_VERSION" ] || other_versions="$other_versions $version"
  done
  other_versions="${other_versions# }"
  cat >"$CLUSTER_DIR/real-node.env" <<EOF
# Written by tests/cluster/real-node.sh; sourceable.
REAL_NODE=$NODE
REAL_NODE_STORAGE_CLASS=$STORAGE_CLASS
REAL_NODE_SIZED_STORAGE_CLASS=$SIZED_STORAGE_CLASS
REAL_NODE_GROWABLE_STORAGE_CLASS=$GROWABLE_STORAGE_CLASS
REAL_NODE_POSTGRES_VERSION=$DEFAULT_POSTGRES_VERSION
REAL_NODE_POSTGRES_IMAGE=$DEFAULT_POSTGRES_IMAGE
# The other majors' versions (images docker.io/library/postgres:<version>): Debian's 15 and the PyPI wheels.
REAL_NODE_POSTGRES_OTHER_VERSIONS="$other_versions"
REAL_NODE_BUSYBOX_IMAGE=$BUSYBOX_IMAGE
REAL_NODE_PGBOUNCER_IMAGE=$PGBOUNCER_IMAGE
REAL_NODE_ADDRESS=$(node_ip)
EOF
}

# namespace NS: create NS (if needed) so that every pod created in it runs on the real node.
namespace() {
  local name="$1"
  kubectl create namespace "$name" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl annotate --overwrite namespace "$name" \
    "scheduler.alpha.kubernetes.io/node-selector=type=real" \
    "scheduler.alpha.kubernetes.io/defaultTolerations=[{\"key\":\"$TAINT_KEY\",\"operator\":\"Exists\",\"effect\":\"NoSchedule\"}]" >/dev/null
}

# other_owner: the real node of this machine belongs to another cluster directory (whose machine-wide
# state - bridge, routes, iptables - must not be touched from here).
other_owner() { [ -s "$OWNER_FILE" ] && [ "$(cat "$OWNER_FILE")" != "$CLUSTER_DIR" ] && [ -z "${STALE_ROOT:-}" ]; }

# delete_node_pods: the pods of $NODE deleted through the apiserver while its kubelet runs (it stops
# their containers and tears down their network), up to 60 s.
delete_node_pods() {
  pid_of kubelet >/dev/null || return 0
  kubectl cordon "$NODE" >/dev/null 2>&1 || true
  kubectl delete pods -A --field-selector "spec.nodeName=$NODE" --grace-period=2 --wait=false >/dev/null 2>&1 || true
  local deadline=$((SECONDS + 60))
  while [ -n "$(kubectl get pods -A --field-selector "spec.nodeName=$NODE" -o name 2>/dev/null)" ] && [ "$SECONDS" -lt "$deadline" ]; do
    sleep 1
  done
}

# stop_runtime: every container of this node's containerd killed and removed, containerd stopped, and
# any shim left of it killed.
stop_runtime() {
  local id pid
  if pid_of containerd >/dev/null; then
    for id in $(ctr_ tasks ls -q 2>/dev/null || true); do ctr_ tasks kill -s KILL "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_ containers ls -q 2>/dev/null || true); do
      ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true
      ctr_ containers delete "$id" >/dev/null 2>&1 || true
    done
  fi
  stop containerd
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCKET" || true); do kill -KILL "$pid" 2>/dev/null || true; done
}

down() {
  local pid mount rule table chain tool id
  if other_owner; then
    log "the real node of this machine belongs to $(cat "$OWNER_FILE"): nothing of it is stopped from here"
    rm -rf "$PIDS" "$CLUSTER_DIR/real-node.env"
    return 0
  fi
  # The second node first: it shares this node's iptables rules and CoreDNS.
  if [ -z "${STALE_ROOT:-}" ]; then "$here/second-node.sh" down; fi
  if [ -s "$CLUSTER_DIR/kubeconfig" ] && kubectl get --raw /readyz >/dev/null 2>&1; then
    delete_node_pods
    kubectl delete node "$NODE" --ignore-not-found >/dev/null 2>&1 || true
    kubectl -n default delete endpointslice kubernetes-real-node --ignore-not-found >/dev/null 2>&1 || true
    kubectl delete storageclass "$STORAGE_CLASS" "$SIZED_STORAGE_CLASS" "$GROWABLE_STORAGE_CLASS" --ignore-not-found >/dev/null 2>&1 || true
    kubectl delete -f "$here/manifests/real-node-rbac.yaml" --ignore-not-found >/dev/null 2>&1 || true
  fi
  stop provisioner; stop apiserver-relay; stop coredns; stop kube-proxy; stop kubelet
  stop_runtime
  # Mounts left under our directories (overlay rootfs, shm, volumes), deepest first.
  awk '{print $2}' /proc/mounts | grep -E "^($RN/|$CONTAINERD_STATE/|/run/containerd/|/run/netns/cni-${STALE_ROOT:+|$STALE_ROOT})" | sort -r |
    while read -r mount; do umount -l "$mount" 2>/dev/null || true; done || true
  if [ -x "$K8S_DIR/kube-proxy" ]; then "$K8S_DIR/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
  # What the kubelet creates and kube-proxy --cleanup leaves (KUBE-FIREWALL, KUBE-KUBELET-CANARY,
  # KUBE-IPTABLES-HINT...): every KUBE-* jump and chain, in both families. One real node per machine, so
  # these are ours.
  for tool in iptables ip6tables; do
    for table in filter nat mangle; do
      "$tool" -t "$table" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | sed 's/^-A /-D /' |
        while read -r rule; do eval "$tool -t $table $rule" 2>/dev/null || true; done || true
      for chain in $("$tool" -t "$table" -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do "$tool" -t "$table" -F "$chain" 2>/dev/null || true; done
      for chain in $("$tool" -t "$table" -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do "$tool" -t "$table" -X "$chain" 2>/dev/null || true; done
    done
  done
  # CNI bridge plugin chains (CNI-*) are only made with ipMasq; remove any anyway.
  for id in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do ip netns delete "$id" 2>/dev/null || true; done
  ip link del "$BRIDGE" 2>/dev/null || true
  ip route del blackhole "$KWOK_CIDR" 2>/dev/null || true
  find /var/log/containers -maxdepth 1 -type l -lname "$RN/*" -delete 2>/dev/null || true
  rm -rf "$RN/containerd/root" "$CONTAINERD_STATE" "$RN/kubelet" "$RN/cni/ipam" "$RN/volumes" "$NODE_PKI" \
    "$CLUSTER_DIR/real-node.env"
  pgrep -x containerd >/dev/null || rm -rf /run/containerd
  if [ -s "$OWNER_FILE" ] && [ "$(cat "$OWNER_FILE")" = "$CLUSTER_DIR" ]; then rm -f "$OWNER_FILE"; fi
}

# Removes leftover cni-* network namespaces and records the ones that cannot be removed.
record_stuck_namespaces() {
  local id
  for id in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do
    umount -l "/run/netns/$id" 2>/dev/null || true
    ip netns delete "$id" 2>/dev/null || true
  done
  ip netns list 2>/dev/null | awk '/^cni-/{print $1}' >"$STUCK_FILE" || true
  if [ -s "$STUCK_FILE" ]; then log "network namespaces that cannot be removed here (ignored by check-clean): $(tr '\n' ' ' <"$STUCK_FILE")"; fi
}

# The cni-* network namespaces (and their mounts) the node made: not the stuck ones of before.
own_namespaces() {
  ip netns list 2>/dev/null | awk '/^cni-/{print $1}' |
    { if [ -s "$STUCK_FILE" ]; then grep -vxF -f "$STUCK_FILE"; else cat; fi; } || true
}
own_mounts() {
  grep -E " ($RN/|$CONTAINERD_STATE/|/run/netns/cni-)" /proc/mounts |
    { if [ -s "$STUCK_FILE" ]; then grep -vF -f "$STUCK_FILE"; else cat; fi; } || true
}

# check-clean: nothing of the real node is left on the machine.
check_clean() {
  local left=()
  local name
  if other_owner; then
    log "the real node of this machine belongs to $(cat "$OWNER_FILE"); nothing of it was started from here"
    return 0
  fi
  for name in containerd kubelet kube-proxy coredns apiserver-relay provisioner; do
    if pid_of "$name" >/dev/null; then left+=("process $name"); fi
  done
  pgrep -f "containerd-shim-runc-v2 .*$CONTAINERD_SOCKET" >/dev/null && left+=("containerd shims")
  local mounts
  mounts="$(own_mounts | grep -c . || true)"
  [ "$mounts" = 0 ] || left+=("mounts: $mounts")
  [ "$(iptables-save 2>/dev/null | grep -c KUBE- || true)" = 0 ] || left+=("iptables KUBE-* rules")
  [ "$(ip6tables-save 2>/dev/null | grep -c KUBE- || true)" = 0 ] || left+=("ip6tables KUBE-* rules")
  ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("bridge $BRIDGE")
  [[ "$(ip route show type blackhole 2>/dev/null)" == *"$KWOK_CIDR"* ]] && left+=("blackhole route $KWOK_CIDR")
  [ -z "$(own_namespaces)" ] || left+=("network namespaces cni-*")
  [ -e "$CONTAINERD_STATE" ] && left+=("$CONTAINERD_STATE")
  [ -e "$RN/volumes" ] && left+=("volumes in $RN/volumes")
  "$here/second-node.sh" check-clean || left+=("the second node")
  if [ "${#left[@]}" -gt 0 ]; then
    printf '[real-node] left on the machine: %s\n' "${left[@]}" >&2
    return 1
  fi
  log "clean: no process, mount, iptables rule, bridge, route or network namespace of the real node is left"
}

status() {
  local name pid
  for name in containerd kubelet kube-proxy coredns apiserver-relay provisioner; do
    if pid="$(pid_of "$name")"; then
      printf '%-16s running pid %s, RSS %s kB\n' "$name" "$pid" "$(awk '/VmRSS/{print $2}' "/proc/$pid/status")"
    else
      printf '%-16s stopped\n' "$name"
    fi
  done
}

# shellcheck source=images.sh
IMAGES_ONLY_VARIABLES=1 . "$here/images.sh"
# Sourced by second-node.sh for its functions: no command then.
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0
case "${1:-}" in
  up) up ;;
  down) down; log "down" ;;
  check-clean) check_clean ;;
  namespace) namespace "${2:?usage: $0 namespace NAME}" ;;
  status) status ;;
  *) echo "usage: $0 up|down|check-clean|namespace NAME|status" >&2; exit 2 ;;
esac
