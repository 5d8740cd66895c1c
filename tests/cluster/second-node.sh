#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# A SECOND real worker node on this machine, for the faults that need two: a drain of the primary's
# node (issue 21) has to switch over to a standby on another node before the primary may be evicted.
# It reuses real-node.sh's functions with its own kubelet (ports 10260/10258, cgroup root
# /dbservice-second), its own containerd (/run/dbservice-containerd-2) and its own pod network
# (10.85.1.0/24 on bridge dbs1, routed to the first node's pods through the host). kube-proxy,
# CoreDNS and the apiserver relay of the first node serve both: they are host processes.
#
#   second-node.sh up            start it (idempotent; real-node.sh up calls it last)
#   second-node.sh down          stop it and undo its changes (real-node.sh down calls it first)
#   second-node.sh check-clean   exit 1 unless nothing of it remains
#   second-node.sh namespace NS  pods created in NS may run on either real node
#
# Only pods that tolerate its own taint (dbservice.dev/second-node) land on it, and it lacks the
# first node's `type=real` label, so no other test's pod ever runs there: draining it disturbs no
# fault measured beside the drain.
set -euo pipefail

second_here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=real-node.sh
. "$second_here/real-node.sh"

FIRST_NODE_PIDS="$PIDS"
NODE=real-1
BRIDGE=dbs1
POD_CIDR=10.85.1.0/24
GATEWAY=10.85.1.1
RN="$CLUSTER_DIR/real-node/second"
LOGS="$RN/logs"
PIDS="$RN/pids"
NODE_PKI="$RN/pki"
CONTAINERD_STATE=/run/dbservice-containerd-2
CONTAINERD_SOCKET="$CONTAINERD_STATE/containerd.sock"
KUBELET_PORT=10260
KUBELET_HEALTHZ_PORT=10258
CGROUP_ROOT=/dbservice-second
SECOND_TAINT_KEY=dbservice.dev/second-node

log() { printf '[second-node] %s\n' "$*" >&2; }
die() { printf '[second-node] ERROR: %s\n' "$*" >&2; exit 1; }
node_labels() { echo "type=real-second,$TAINT_KEY=true"; }
extra_taints() { echo "- {key: $SECOND_TAINT_KEY, value: \"true\", effect: NoSchedule}"; }

# The kubelet refuses a cgroup root that does not exist; on cgroup v1 it must exist in every
# hierarchy (cpuset's needs the parent's cpus and mems before any child can hold a process).
cgroup_root() {
  local hierarchy
  if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
    mkdir -p "/sys/fs/cgroup$CGROUP_ROOT"
    return 0
  fi
  for hierarchy in /sys/fs/cgroup/*/; do
    [ -L "${hierarchy%/}" ] && continue
    mkdir -p "$hierarchy${CGROUP_ROOT#/}"
  done
  if [ -d /sys/fs/cgroup/cpuset ]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset$CGROUP_ROOT/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset$CGROUP_ROOT/cpuset.mems"
  fi
}

# Removes the cgroup root, deepest first (empty directories only: a cgroup with a process stays).
remove_cgroup_root() {
  local directory
  for directory in "/sys/fs/cgroup$CGROUP_ROOT" /sys/fs/cgroup/*"$CGROUP_ROOT"; do
    [ -d "$directory" ] || continue
    find "$directory" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

second_identities() {
  mkdir -p "$NODE_PKI" && chmod 700 "$NODE_PKI"
  node_certificate kubelet "/O=system:nodes/CN=system:node:$NODE" clientAuth
  node_certificate kubelet-serving "/CN=$NODE" serverAuth "IP:$(node_ip),DNS:$NODE"
  node_kubeconfig kubelet
}

# The images a database pod needs: the pause image, the default PostgreSQL and the operator's (the
# agent). The other majors stay on the first node.
second_images() {
  local archive
  for archive in "$IMAGE_CACHE"/pause-*.tar "$IMAGE_CACHE"/$DEFAULT_POSTGRES_ARCHIVES "$IMAGE_CACHE"/busybox-*.tar; do
    ctr_ images import "$archive" >/dev/null
  done
  if [ -s "$IMAGE_CACHE/operator.tar" ]; then ctr_ images import "$IMAGE_CACHE/operator.tar" >/dev/null; fi
}

second_up() {
  local started=$SECONDS
  [ "$(id -u)" = 0 ] || die "the second node needs root"
  pid_of_first kubelet >/dev/null || die "the first real node is not running (real-node.sh up)"
  mkdir -p "$RN" "$LOGS" "$PIDS"
  second_identities
  network
  cgroup_root
  start_containerd
  second_images
  start_kubelet
  start_provisioner
  log "up in $((SECONDS - started))s: node $NODE (pods $POD_CIDR on $BRIDGE, kubelet port $KUBELET_PORT)"
}

# pid_of_first NAME: the pid of the first node's NAME process.
pid_of_first() { PIDS="$FIRST_NODE_PIDS" PROCESS_MARK="$CLUSTER_DIR/real-node" pid_of "$1"; }

second_down() {
  local mount
  if [ -s "$CLUSTER_DIR/kubeconfig" ] && kubectl get --raw /readyz >/dev/null 2>&1; then
    delete_node_pods
    kubectl delete node "$NODE" --ignore-not-found >/dev/null 2>&1 || true
  fi
  stop provisioner; stop kubelet
  stop_runtime
  awk '{print $2}' /proc/mounts | grep -E "^($RN/|$CONTAINERD_STATE/)" | sort -r |
    while read -r mount; do umount -l "$mount" 2>/dev/null || true; done || true
  ip link del "$BRIDGE" 2>/dev/null || true
  find /var/log/containers -maxdepth 1 -type l -lname "$RN/*" -delete 2>/dev/null || true
  remove_cgroup_root
  rm -rf "$RN/containerd/root" "$CONTAINERD_STATE" "$RN/kubelet" "$RN/cni/ipam" "$RN/volumes" "$NODE_PKI"
}

second_check_clean() {
  local left=() name
  for name in containerd kubelet provisioner; do
    if pid_of "$name" >/dev/null; then left+=("process $name"); fi
  done
  pgrep -f "containerd-shim-runc-v2 .*$CONTAINERD_SOCKET" >/dev/null && left+=("containerd shims")
  grep -qE " ($RN/|$CONTAINERD_STATE/)" /proc/mounts && left+=("mounts")
  ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("bridge $BRIDGE")
  [ -e "$CONTAINERD_STATE" ] && left+=("$CONTAINERD_STATE")
  [ -e "$RN/volumes" ] && left+=("volumes in $RN/volumes")
  if [ "${#left[@]}" -gt 0 ]; then
    printf '[second-node] left on the machine: %s\n' "${left[@]}" >&2
    return 1
  fi
}

# namespace NS: every pod created in NS runs on a real node (both carry $TAINT_KEY=true); only a pod
# that tolerates $SECOND_TAINT_KEY itself may run on this one (the database's, not the test's writers).
second_namespace() {
  local name="$1"
  kubectl create namespace "$name" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl annotate --overwrite namespace "$name" \
    "scheduler.alpha.kubernetes.io/node-selector=$TAINT_KEY=true" \
    "scheduler.alpha.kubernetes.io/defaultTolerations=[{\"key\":\"$TAINT_KEY\",\"operator\":\"Exists\",\"effect\":\"NoSchedule\"}]" >/dev/null
}

case "${1:-}" in
  up) second_up ;;
  down) second_down ;;
  check-clean) second_check_clean ;;
  namespace) second_namespace "${2:?usage: $0 namespace NAME}" ;;
  *) echo "usage: $0 up|down|check-clean|namespace NAME" >&2; exit 2 ;;
esac
