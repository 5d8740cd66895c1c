#!/usr/bin/env bash
# Admission over the wire: the release binary's HTTPS server (`dbservice-operator webhook`),
# HTTP/1.1 keep-alive over TLS as the apiserver talks to it, with apiserver-sized reviews
# (managedFields and all: an UPDATE review for /validate carries object and oldObject).
#
#   benches/https.sh                    # saturation with wrk, then a fixed 2,000 req/s with vegeta
#   RATE=1000 DURATION=30 benches/https.sh
#   PIN=1 benches/https.sh              # server on CPU 0, load tools on CPU 1 (as the apiserver runs
#                                       # on other cores than the webhook), so neither steals the other's
#
# Needs wrk (Debian package `wrk`) and vegeta (go install github.com/tsenart/vegeta/v12@v12.12.0).
# Prints requests/s, p50/p99/p99.9 and the server's peak RSS (VmHWM) for each scenario.
set -euo pipefail

cd "$(dirname "$0")/.."
BINARY=${BINARY:-${CARGO_TARGET_DIR:-target}/release/dbservice-operator}
RATE=${RATE:-2000}
DURATION=${DURATION:-20}
CONNECTIONS=${CONNECTIONS:-16}
VEGETA=${VEGETA:-$(command -v vegeta || echo "$HOME/go/bin/vegeta")}
WORK=$(mktemp -d)
SERVER_PID=
cleanup() {
    if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

[[ -x $BINARY ]] || { echo "no release binary at $BINARY (cargo build --release)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }
[[ -x $VEGETA ]] || { echo "vegeta is not installed (go install github.com/tsenart/vegeta/v12@v12.12.0)" >&2; exit 1; }

"$BINARY" certs --out "$WORK/certs" >/dev/null

# An object as the apiserver sends it: server-set metadata and managedFields of two managers.
python3 - "$WORK" <<'EOF'
import json, sys
work = sys.argv[1]
def database(generation, replicas):
    return {
        "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
        "metadata": {
            "name": "orders", "namespace": "shop", "uid": "0b8e4c2d-6f1a-4e3b-9c5d-7a8b9c0d1e2f",
            "resourceVersion": "48213", "generation": generation, "creationTimestamp": "2026-11-30T10:00:00Z",
            "labels": {"app.kubernetes.io/name": "orders", "team": "checkout", "environment": "production"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": json.dumps({"spec": {"version": "16.4"}}) * 8},
            "finalizers": ["dbservice.dev/cleanup"],
            "managedFields": [
                {"manager": manager, "operation": "Apply", "apiVersion": "dbservice.dev/v1", "time": "2026-11-30T10:00:00Z",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {f"f:{field}": {} for field in
                     ["version", "storageSize", "replicas", "databaseName", "username", "image", "deletionPolicy", "resources"]},
                     "f:metadata": {"f:labels": {"f:team": {}, "f:environment": {}}}}}
                for manager in ["kubectl", "argocd-controller"]
            ],
        },
        "spec": {"version": "16.4", "storageSize": "20Gi", "replicas": replicas, "databaseName": "orders",
                 "username": "orders_app", "image": "postgres:16.4", "deletionPolicy": "Retain",
                 "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}},
        "status": {"phase": "Running", "readyReplicas": replicas, "currentVersion": "16.4", "observedGeneration": generation},
    }
def review(operation, obj, old):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "dbservice.dev", "version": "v1", "kind": "DatabaseService"},
        "resource": {"group": "dbservice.dev", "version": "v1", "resource": "databaseservices"},
        "requestKind": {"group": "dbservice.dev", "version": "v1", "kind": "DatabaseService"},
        "requestResource": {"group": "dbservice.dev", "version": "v1", "resource": "databaseservices"},
        "name": "orders", "namespace": "shop", "operation": operation,
        "userInfo": {"username": "system:serviceaccount:argocd:argocd-application-controller",
                     "uid": "9d6b1b0e-1f0a-4a43-9d6c-0b7c9b0f5d11",
                     "groups": ["system:serviceaccounts", "system:serviceaccounts:argocd", "system:authenticated"]},
        "object": obj, "oldObject": old, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions", "fieldManager": "argocd-controller"}}}
validate = review("UPDATE", database(3, 3), database(2, 2))
fresh = database(1, 1)
del fresh["status"], fresh["metadata"]["finalizers"], fresh["spec"]["image"], fresh["spec"]["deletionPolicy"]
mutate = review("CREATE", fresh, None)
for name, body in [("validate", validate), ("mutate", mutate)]:
    data = json.dumps(body).encode()
    open(f"{work}/{name}.json", "wb").write(data)
    print(f"{name} body: {len(data)} bytes", file=sys.stderr)
EOF

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
PROBE=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# PIN=1: the server on CPU 0 and the load tools on CPU 1, so the tool's own CPU use does not
# show up as server latency (in a cluster the apiserver calling us runs elsewhere).
SERVER_CPUS=()
TOOL_CPUS=()
if [[ ${PIN:-0} == 1 ]]; then SERVER_CPUS=(taskset -c 0); TOOL_CPUS=(taskset -c 1); fi
"${SERVER_CPUS[@]}" "$BINARY" webhook --listen "127.0.0.1:$PORT" --probe-listen "127.0.0.1:$PROBE" \
    --tls-cert "$WORK/certs/tls.crt" --tls-key "$WORK/certs/tls.key" --log-format json >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PROBE/readyz" >/dev/null && break; sleep 0.1; done

echo "load average before: $(cut -d" " -f1-3 /proc/loadavg) on $(nproc) cores${PIN:+, pinned (PIN=$PIN)}"
peak_rss() { awk '/VmHWM/ {printf "%.1f MiB", $2/1024}' "/proc/$SERVER_PID/status"; }

for path in validate mutate; do
    cat >"$WORK/$path.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local file = io.open("$WORK/$path.json", "rb")
wrk.body = file:read("*a")
file:close()
done = function(summary, latency, requests)
  io.write(string.format("wrk saturation $path: %.0f req/s, p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, errors %d\n",
    summary.requests / (summary.duration / 1e6), latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency:percentile(99.9) / 1000, summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
EOF
    "${TOOL_CPUS[@]}" wrk -t2 -c"$CONNECTIONS" -d"${DURATION}s" -s "$WORK/$path.lua" "https://127.0.0.1:$PORT/$path" | grep '^wrk saturation'
    echo "  server peak RSS so far: $(peak_rss)"
    printf 'POST https://127.0.0.1:%s/%s\nContent-Type: application/json\n@%s\n' "$PORT" "$path" "$WORK/$path.json" >"$WORK/$path.target"
    # A bounded pool of keep-alive connections, like the apiserver's transport: without a cap vegeta
    # opens new connections (TLS handshakes) whenever a response is late, which is not what is measured.
    "${TOOL_CPUS[@]}" "$VEGETA" attack -rate="$RATE" -duration="${DURATION}s" -keepalive -workers="$CONNECTIONS" -max-workers="$CONNECTIONS" -root-certs "$WORK/certs/ca.crt" \
        -targets "$WORK/$path.target" >"$WORK/$path.bin"
    "$VEGETA" report -type=json <"$WORK/$path.bin" | python3 -c '
import json, sys
report = json.load(sys.stdin)
latencies = report["latencies"]
rate, success = report["rate"], report["success"] * 100
p50, p99, slowest = (latencies[key] / 1e6 for key in ("50th", "99th", "max"))
print(f"vegeta fixed {rate:.0f} req/s {sys.argv[1]}: success {success:.2f}%, p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {slowest:.2f} ms")
' "$path"
    "$VEGETA" report -type='hist[0,500us,1ms,2ms,5ms,10ms]' <"$WORK/$path.bin" | sed 's/^/  /'
    # p99.9 from the raw results.
    "$VEGETA" encode --to csv <"$WORK/$path.bin" | python3 -c '
import sys
latencies = sorted(int(line.split(",")[2]) for line in sys.stdin)
print(f"  p99.9 {latencies[int(len(latencies) * 0.999) - 1] / 1e6:.2f} ms over {len(latencies)} requests")'
    echo "  server peak RSS so far: $(peak_rss)"
done
