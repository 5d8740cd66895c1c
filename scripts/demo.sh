#!/usr/bin/env bash
# The product's main job on the local control plane (run by `make demo`, after tests/cluster/up.sh):
# install the chart (CRD, RBAC, webhook configurations pointing at a local operator), run the operator
# with the chart ServiceAccount's token, create a DatabaseService and watch it become Ready, show a bad
# one rejected, and show the ledger. The operator keeps running so you can look around.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cluster="$repo/.cluster"
demo="$cluster/demo"
export KUBECONFIG="$cluster/kubeconfig" PATH="$cluster/bin:$PATH"
namespace=demo
release_namespace=dbservice-system
webhook_port="${DEMO_WEBHOOK_PORT:-19443}"
probe_port="${DEMO_PROBE_PORT:-18080}"

# --stop: stop a demo operator left running (make test does this: it needs the same leader Lease).
if [ "${1:-}" = "--stop" ]; then
  if [ -s "$cluster/pids/demo-operator.pid" ]; then
    kill -TERM "$(cat "$cluster/pids/demo-operator.pid")" 2>/dev/null || true
    rm -f "$cluster/pids/demo-operator.pid"
    echo "stopped the demo operator"
  fi
  exit 0
fi

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "building the operator"
cargo build --quiet --manifest-path "$repo/Cargo.toml"
operator="$repo/target/debug/dbservice-operator"
mkdir -p "$demo" "$cluster/pids"

# A previous demo's operator (if any) is replaced.
"$0" --stop >/dev/null

step "webhook certificates (a CA and a serving certificate for 127.0.0.1)"
"$operator" certs --out "$demo/certs" --dns localhost --ip 127.0.0.1

step "installing the Helm chart in URL mode (the apiserver calls https://127.0.0.1:$webhook_port)"
helm upgrade --install dbservice-operator "$repo/charts/dbservice-operator" \
  --namespace "$release_namespace" --create-namespace \
  --set deployment.enabled=false \
  --set webhook.url="https://127.0.0.1:$webhook_port" \
  --set webhook.caBundle="$(base64 -w0 "$demo/certs/ca.crt")" --wait >/dev/null
kubectl wait --for=condition=Established crd/databaseservices.dbservice.dev --timeout=60s

step "starting the operator with the chart ServiceAccount's token (log: $demo/operator.log)"
token="$(kubectl create token dbservice-operator -n "$release_namespace" --duration=24h)"
server="$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')"
ca_data="$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
umask 077
cat > "$demo/operator.kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority-data: "$ca_data"}}]
users: [{name: dbservice-operator, user: {token: "$token"}}]
contexts: [{name: local, context: {cluster: local, user: dbservice-operator}}]
current-context: local
KUBECONFIG
umask 022
KUBECONFIG="$demo/operator.kubeconfig" nohup "$operator" run \
  --listen "127.0.0.1:$webhook_port" --probe-listen "127.0.0.1:$probe_port" \
  --tls-cert "$demo/certs/tls.crt" --tls-key "$demo/certs/tls.key" \
  --namespace "$release_namespace" --identity demo --lease-name dbservice-operator-leader \
  > "$demo/operator.log" 2>&1 &
echo $! > "$cluster/pids/demo-operator.pid"
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$probe_port/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$probe_port/readyz" >/dev/null || { tail -20 "$demo/operator.log"; exit 1; }

step "creating DatabaseService demo (examples/databaseservice.yaml)"
kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -n "$namespace" -f "$repo/examples/databaseservice.yaml"
echo "defaults filled in by the mutating webhook:"
kubectl get dbs demo -n "$namespace" -o jsonpath='  replicas={.spec.replicas} deletionPolicy={.spec.deletionPolicy} image={.spec.image} finalizers={.metadata.finalizers}{"\n"}'
kubectl wait dbs/demo -n "$namespace" --for=jsonpath='{.status.phase}'=Running --timeout=120s
kubectl get dbs -n "$namespace"
echo
kubectl get statefulset,service,secret,configmap,pvc,pods -n "$namespace" -l app.kubernetes.io/instance=demo
echo
echo "conditions:"
kubectl get dbs demo -n "$namespace" -o jsonpath='{range .status.conditions[*]}  {.type}={.status} ({.reason}): {.message}{"\n"}{end}'

step "a bad DatabaseService is rejected at admission (examples/bad-databaseservice.yaml)"
if kubectl apply -n "$namespace" -f "$repo/examples/bad-databaseservice.yaml"; then
  echo "unexpected: the bad object was admitted" >&2
  exit 1
fi

step "the ledger: dbservice-operator ledger demo -n $namespace"
"$operator" ledger demo -n "$namespace"

cat <<EOF2

The operator is still running (pid $(cat "$cluster/pids/demo-operator.pid"), log $demo/operator.log).
Look around:
  export KUBECONFIG=$KUBECONFIG PATH=$cluster/bin:\$PATH
  kubectl get dbs -A                      # Phase, Ready, Version, Replicas, Age
  kubectl describe dbs demo -n $namespace     # conditions and events
  kubectl delete svc demo -n $namespace       # drift: the operator puts it back (see the ledger)
  kubectl patch dbs demo -n $namespace --type merge -p '{"spec":{"replicas":2}}'
  $operator ledger demo -n $namespace
  curl -s http://127.0.0.1:$probe_port/metrics | grep dbservice_
Stop everything (the operator too): make cluster-down
EOF2
