#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The oldest Kubernetes the manual states (OLDEST_KUBERNETES_VERSION in versions.sh), for `make test`:
# the local control plane and the real node are started again on that minor (its apiserver,
# controller-manager, scheduler, kubelet and kube-proxy, built once from the Go module proxy and
# cached like today's), the operator image is loaded, the kwok end-to-end suite runs against it and
# then the demo (the chart, a bad object refused, a primary and a standby of real PostgreSQL, psql).
# The cluster is stopped at the end, whatever happened, so that the next `make cluster-up` starts on
# the current minor again.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.sh
. "$here/versions.sh"
export KUBERNETES_VERSION="$OLDEST_KUBERNETES_VERSION"
export KUBECONFIG="$repo/.cluster/kubeconfig" PATH="$repo/.cluster/bin:$PATH"

log() { printf '[oldest] %s\n' "$*" >&2; }
stop() { "$here/down.sh" >/dev/null 2>&1 || "$here/down.sh"; }
trap stop EXIT

t0=$SECONDS
"$here/down.sh" >/dev/null
"$here/build.sh" oldest
"$here/up.sh"
served="$(kubectl version -o json | sed -n 's/.*"gitVersion": "\(v[0-9.]*\)".*/\1/p' | tail -n 1)"
[ "$served" = "$KUBERNETES_VERSION" ] || { log "the apiserver serves $served, not $KUBERNETES_VERSION"; exit 1; }
# shellcheck source=/dev/null
. "$repo/.cluster/real-node.env"
kubelet="$(kubectl get node "$REAL_NODE" -o jsonpath='{.status.nodeInfo.kubeletVersion}')"
[ "$kubelet" = "$KUBERNETES_VERSION" ] || { log "the real node runs kubelet $kubelet, not $KUBERNETES_VERSION"; exit 1; }
"$here/images.sh" operator
log "kwok end-to-end suite against Kubernetes $served"
(cd "$repo" && DBSERVICE_E2E=1 "${CARGO:-cargo}" test --test e2e -- --test-threads 16)
log "demo against Kubernetes $served"
"$repo/scripts/demo.sh"
log "kwok suite and demo passed on Kubernetes $served in $((SECONDS - t0))s"
