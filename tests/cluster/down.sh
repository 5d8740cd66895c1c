#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Stops the local control plane started by up.sh: exactly the processes named in .cluster/pids/ (and only
# if their command line still points into this .cluster directory, so a recycled pid is never touched),
# waits for them to exit, and removes this run's data (.cluster/run, kubeconfig, state.env).
# Logs (.cluster/logs) and the binary symlinks (.cluster/bin) stay. Idempotent: nothing running is fine.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
CLUSTER_DIR="${DBSERVICE_CLUSTER_DIR:-$repo/.cluster}"
PIDS="$CLUSTER_DIR/pids"
GRACE="${DBSERVICE_STOP_TIMEOUT:-20}"

log() { printf '[cluster-down] %s\n' "$*" >&2; }

PROCESS_MARK="$CLUSTER_DIR"
# shellcheck source=processes.sh
. "$here/processes.sh"

# stop NAME: SIGTERM, up to GRACE seconds, then SIGKILL (processes.sh).
stop() {
  local pid
  if pid="$(pid_of "$1")"; then log "stopping $1 (pid $pid)"; fi
  stop_process "$1" "$GRACE"
}

# Same lock as up.sh (which sets DBSERVICE_CLUSTER_LOCKED when it calls us while holding it).
if [ -d "$CLUSTER_DIR" ] && [ -z "${DBSERVICE_CLUSTER_LOCKED:-}" ]; then
  exec 9>"$CLUSTER_DIR/lock"
  flock -w 600 9 || { log "another up.sh/down.sh holds $CLUSTER_DIR/lock"; exit 1; }
fi

# The real node first, while the apiserver still runs (its pods are stopped through it).
if [ -d "$CLUSTER_DIR/real-node" ]; then "$here/real-node.sh" down; fi

if [ -d "$PIDS" ]; then
  # Clients first, etcd last, so nothing logs a storm of connection errors while shutting down.
  for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$name"; done
  # Anything else that an older/newer up.sh recorded.
  for file in "$PIDS"/*.pid; do
    [ -e "$file" ] || continue
    stop "$(basename "$file" .pid)"
  done
fi

rm -rf "$CLUSTER_DIR/run" "$CLUSTER_DIR/state.env" "$CLUSTER_DIR/kubeconfig"
log "stopped; removed $CLUSTER_DIR/run"
# Proof that the real node left nothing on the machine (processes, mounts, iptables, bridge, routes, netns).
if [ -d "$CLUSTER_DIR/real-node" ]; then "$here/real-node.sh" check-clean; fi
