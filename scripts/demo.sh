#!/usr/bin/env bash
# The product's main job on the local control plane (run by `make demo`, after `make cluster-up image`):
# install the chart as a user does (the operator's own image in a Deployment on the real node,
# self-managed webhook certificates), show a bad DatabaseService rejected and a good one defaulted,
# run real PostgreSQL (a primary and a streaming standby) under the operator, query it with psql
# through `kubectl exec`, and show the ledger. Everything keeps running so you can look around.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cluster="$repo/.cluster"
export KUBECONFIG="$cluster/kubeconfig" PATH="$cluster/bin:$PATH"
namespace=demo
release_namespace=dbservice-system

# --stop: remove the demo's DatabaseService and namespace (make test does this first: the real node's
# resources are for the tests then).
if [ "${1:-}" = "--stop" ]; then
  if kubectl get namespace "$namespace" >/dev/null 2>&1; then
    kubectl delete namespace "$namespace" --wait=false >/dev/null
    echo "removed the demo namespace"
  fi
  exit 0
fi

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
[ -s "$cluster/real-node.env" ] || { echo "no real node: run make cluster-up (without DBSERVICE_REAL_NODE=0)" >&2; exit 1; }
# shellcheck source=/dev/null
. "$cluster/real-node.env"
image="$("$repo/tests/cluster/images.sh" name)"

step "installing the Helm chart: 2 operator pods of $image on node $REAL_NODE"
"$repo/tests/cluster/real-node.sh" namespace "$release_namespace"
helm upgrade --install dbservice-operator "$repo/charts/dbservice-operator" \
  --namespace "$release_namespace" --reset-values \
  --set image.repository="${image%:*}" --set image.tag="${image##*:}" --wait --timeout 300s >/dev/null
kubectl -n "$release_namespace" get pods -o wide
# The Lease may still name an operator that ran before (it expires within its duration): wait for a pod.
pods="$(kubectl -n "$release_namespace" get pods -l app.kubernetes.io/name=dbservice-operator -o jsonpath='{.items[*].metadata.name}')"
for _ in $(seq 60); do
  holder="$(kubectl -n "$release_namespace" get lease dbservice-operator-leader -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)"
  [[ -n "$holder" && " $pods " == *" $holder "* ]] && break
  sleep 1
done
echo "Lease holder: $holder"

step "a bad DatabaseService is rejected at admission (examples/bad-databaseservice.yaml)"
"$repo/tests/cluster/real-node.sh" namespace "$namespace"
if kubectl apply -n "$namespace" -f "$repo/examples/bad-databaseservice.yaml"; then
  echo "unexpected: the bad object was admitted" >&2
  exit 1
fi

step "DatabaseService demo: PostgreSQL $REAL_NODE_POSTGRES_VERSION, a primary and a standby, on $REAL_NODE_STORAGE_CLASS volumes"
kubectl apply -n "$namespace" -f - <<YAML
apiVersion: dbservice.dev/v1
kind: DatabaseService
metadata:
  name: demo
spec:
  version: "$REAL_NODE_POSTGRES_VERSION"
  storageSize: 1Gi
  databaseName: app
  username: app_user
  replicas: 2
  storageClassName: $REAL_NODE_STORAGE_CLASS
YAML
echo "defaults filled in by the mutating webhook:"
kubectl get dbs demo -n "$namespace" -o jsonpath='  deletionPolicy={.spec.deletionPolicy} image={.spec.image} finalizers={.metadata.finalizers}{"\n"}'
started=$SECONDS
kubectl wait dbs/demo -n "$namespace" --for=jsonpath='{.status.phase}'=Running --timeout=300s
echo "Running after $((SECONDS - started)) s"
kubectl get dbs -n "$namespace"
echo
kubectl get statefulset,service,secret,configmap,pvc,pods -n "$namespace" -l app.kubernetes.io/instance=demo -o wide

step "psql through kubectl exec: a table on the primary, read back from the standby"
kubectl exec -n "$namespace" demo-0 -c postgres -- psql -X -h /var/run/postgresql -U app_user -d app -c \
  "create table if not exists greetings (said_at timestamptz default now(), text text); insert into greetings (text) values ('hello from the demo'); select version();"
# pg_stat_replication in full is for the superuser (postgres, inside the pod only by default);
# the standby streams over TLS.
kubectl exec -n "$namespace" demo-0 -c postgres -- psql -X -h /var/run/postgresql -U postgres -d app -c \
  "select application_name, state, sync_state, ssl, version from pg_stat_replication join pg_stat_ssl using (pid);"

step "over the network only with TLS, the server verified by the CA of ConfigMap demo-ca (sslmode=verify-full)"
# The pod's PGSSLMODE=verify-full and PGSSLROOTCERT apply; the password comes from its file.
kubectl exec -n "$namespace" demo-0 -c postgres -- bash -c \
  "PGPASSWORD=\$(cat /dbservice/credentials/password) psql -X -h demo.$namespace.svc -U app_user -d app -c \
  'select ssl, version, cipher from pg_stat_ssl where pid = pg_backend_pid();'"
replicated=false
for _ in $(seq 30); do
  kubectl exec -n "$namespace" demo-1 -c postgres -- psql -X -h /var/run/postgresql -U app_user -d app -Atc \
    "select 1 from greetings limit 1" 2>/dev/null | grep -q 1 && { replicated=true; break; }
  sleep 1
done
$replicated || { echo "the standby never had the primary's row" >&2; exit 1; }
kubectl exec -n "$namespace" demo-1 -c postgres -- psql -X -h /var/run/postgresql -U app_user -d app -c \
  "select pg_is_in_recovery() as standby, text from greetings;"

step "the ledger (ConfigMap demo-ledger)"
kubectl get configmap demo-ledger -n "$namespace" -o jsonpath='{.data.ledger\.jsonl}'
echo

cat <<EOF2

Everything is still running. Look around:
  export KUBECONFIG=$KUBECONFIG PATH=$cluster/bin:\$PATH
  kubectl get dbs -A                                 # Phase, Ready, Version, Replicas, Age
  kubectl describe dbs demo -n $namespace                # conditions and events
  kubectl delete pod demo-0 -n $namespace                # the primary comes back on its volume
  kubectl -n $release_namespace logs deploy/dbservice-operator
  make cluster-status                                # the real node's processes
Stop everything: make cluster-down
EOF2
