#!/usr/bin/env bash
# Scale benchmark (make bench-scale): starts a SEPARATE local control plane (never the shared
# .cluster), installs the chart in URL mode, runs the release operator with the chart
# ServiceAccount's token, creates N DatabaseServices through the webhooks and prints: creation time,
# time until all are Running, operator peak RSS and CPU-seconds, apiserver CPU-seconds over the
# same window, API requests by verb during convergence (the operator's own counter), writes during
# a quiet minute afterwards, and admission failures. Stops its cluster on exit.
#
# Environment: N (default 1000), CONCURRENCY (operator --concurrency, default: the binary's),
# DBSERVICE_CLUSTER_DIR (default <repo>/.cluster-bench), DBSERVICE_KWOK_NODES (default N/100+2),
# KEEP_CLUSTER=1 to leave the cluster running, CREATE_PARALLELISM (default 4), QUIET_SECONDS (60),
# BENCH_BINARY (a build to measure instead of the release build), BENCH_OLD_BINARY (another build,
# e.g. from before a fix, whose exit at start-up is measured too).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
N="${N:-1000}"
export DBSERVICE_CLUSTER_DIR="${DBSERVICE_CLUSTER_DIR:-$repo/.cluster-bench}"
export DBSERVICE_KWOK_NODES="${DBSERVICE_KWOK_NODES:-$((N / 100 + 2))}"
# kwok nodes only: the machine's one real node belongs to the shared cluster.
export DBSERVICE_REAL_NODE="${DBSERVICE_REAL_NODE:-0}"
cluster="$DBSERVICE_CLUSTER_DIR"
if [ "$cluster" = "$repo/.cluster" ]; then
  echo "bench-scale: DBSERVICE_CLUSTER_DIR must not be the shared cluster ($cluster)" >&2
  exit 2
fi
work="$cluster/bench"
namespace=bench
release_namespace=dbservice-system
webhook_port="${BENCH_WEBHOOK_PORT:-29443}"
probe_port="${BENCH_PROBE_PORT:-28080}"
parallelism="${CREATE_PARALLELISM:-4}"
quiet_seconds="${QUIET_SECONDS:-60}"
target="${CARGO_TARGET_DIR:-$repo/target}"
operator_pid=""
terminated=""

cleanup() {
  if [ -n "$operator_pid" ]; then kill -TERM "$operator_pid" 2>/dev/null || true; fi
  if [ "${KEEP_CLUSTER:-0}" != 1 ]; then "$repo/tests/cluster/down.sh" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

step() { printf '\n==> %s\n' "$*" >&2; }
now() { date +%s.%N; }
# cpu_seconds PID: user+system CPU of a process (children excluded).
cpu_seconds() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
metrics() { curl -fsS "http://127.0.0.1:$probe_port/metrics"; }
# metric_sum NAME [FILTER]: sum of a metric's samples whose labels match the grep FILTER.
metric_sum() { metrics | { grep -E "^$1[ {]" || true; } | { grep -e "${2:-.}" || true; } | awk '{sum += $NF} END {printf "%d\n", sum}'; }
# elapsed FROM TO: TO - FROM in seconds with one decimal.
elapsed() { awk -v from="$1" -v to="$2" 'BEGIN {printf "%.1f", to - from}'; }

# The shipped binary: static musl, as the Dockerfile builds it (its allocator is part of what the
# peak RSS measures). BENCH_TARGET=x86_64-unknown-linux-gnu measures a host build instead.
rust_target="${BENCH_TARGET:-x86_64-unknown-linux-musl}"
if [ -n "${BENCH_BINARY:-}" ]; then
  # A build of one's own (e.g. a debug build, for a before/after with BENCH_OLD_BINARY).
  binary="$BENCH_BINARY"
  rust_target="$BENCH_BINARY"
else
  if ! rustup target list --installed 2>/dev/null | grep -qx "$rust_target"; then
    echo "bench-scale: Rust target $rust_target missing: rustup target add $rust_target (and apt-get install musl-tools)" >&2
    exit 2
  fi
  step "building the release operator for $rust_target"
  cargo build --release --quiet --locked --target "$rust_target" --manifest-path "$repo/Cargo.toml"
  binary="$target/$rust_target/release/dbservice-operator"
fi

step "starting a separate control plane in $cluster with $DBSERVICE_KWOK_NODES kwok nodes"
"$repo/tests/cluster/up.sh" >&2
export KUBECONFIG="$cluster/kubeconfig" PATH="$cluster/bin:$PATH"
mkdir -p "$work"

step "installing the chart in URL mode"
"$binary" certs --out "$work/certs" --dns localhost --ip 127.0.0.1 >/dev/null
helm upgrade --install dbservice-operator "$repo/charts/dbservice-operator" \
  --namespace "$release_namespace" --create-namespace \
  --set deployment.enabled=false \
  --set webhook.url="https://127.0.0.1:$webhook_port" \
  --set webhook.caBundle="$(base64 -w0 "$work/certs/ca.crt")" --wait >/dev/null
kubectl wait --for=condition=Established crd/databaseservices.dbservice.dev --timeout=60s >/dev/null
token="$(kubectl create token dbservice-operator -n "$release_namespace" --duration=6h)"
server="$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')"
ca_data="$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
umask 077
cat > "$work/operator.kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority-data: "$ca_data"}}]
users: [{name: dbservice-operator, user: {token: "$token"}}]
contexts: [{name: local, context: {cluster: local, user: dbservice-operator}}]
current-context: local
KUBECONFIG
umask 022

# --instance-image as the chart sets it: each database also gets its agents' ServiceAccount, Role,
# RoleBinding and primary Lease (kwok's pods never run the agent, so the primary stays pod 0).
# start_operator BINARY LOG: the operator in the background (operator_pid), as the chart runs it.
# --instance-image as the chart sets it: each database also gets its agents' ServiceAccount, Role,
# RoleBinding and primary Lease (kwok's pods never run the agent, so the primary stays pod 0).
start_operator() {
  local extra=()
  [ -n "${CONCURRENCY:-}" ] && extra+=(--concurrency "$CONCURRENCY")
  # Info from run and leader only: the shutdown lines ("released the leader Lease", "stopped").
  KUBECONFIG="$work/operator.kubeconfig" RUST_LOG=warn,dbservice_operator::run=info,dbservice_operator::operator::leader=info "$1" run \
    --listen "127.0.0.1:$webhook_port" --probe-listen "127.0.0.1:$probe_port" \
    --tls-cert "$work/certs/tls.crt" --tls-key "$work/certs/tls.key" \
    --namespace "$release_namespace" --identity bench --lease-name dbservice-operator-leader \
    --instance-image localhost/dbservice-operator:bench \
    "${extra[@]}" > "$2" 2>&1 &
  operator_pid=$!
}

# wait_leader INTERVAL: polls the leader metric every INTERVAL seconds until the operator leads.
wait_leader() {
  for _ in $(seq 3000); do
    [ "$(metric_sum dbservice_leader 2>/dev/null | tail -n 1)" -ge 1 ] 2>/dev/null && return 0
    kill -0 "$operator_pid" 2>/dev/null || break
    sleep "$1"
  done
  return 1
}

# terminate LOG: SIGTERM to the operator; sets `terminated` to the seconds to its exit (killed after
# 60 s) and what the log misses. Not in a subshell: only the operator's parent shell can wait for it.
terminate() {
  local term_sent exited_at watchdog result
  term_sent="$(now)"
  kill -TERM "$operator_pid"
  # The operator is this script's child: wait reaps it (a zombie would still answer kill -0).
  ( sleep 60; kill -KILL "$operator_pid" 2>/dev/null ) &
  watchdog=$!
  wait "$operator_pid" 2>/dev/null || true
  exited_at="$(now)"
  kill "$watchdog" 2>/dev/null || true
  operator_pid=""
  result="$(elapsed "$term_sent" "$exited_at") s"
  grep -q 'stopped' "$1" || result="$result (killed after 60 s: \"stopped\" never logged)"
  grep -q 'released the leader Lease' "$1" || result="$result; the Lease was not released"
  terminated="$result"
}

step "starting the operator (log: $work/operator.log)"
start_operator "$binary" "$work/operator.log"
wait_leader 0.2 || { tail -20 "$work/operator.log" >&2; exit 1; }
apiserver_pid="$(cat "$cluster/pids/kube-apiserver.pid")"

kubectl create namespace "$namespace" >/dev/null
for index in $(seq 1 "$N"); do
  printf -- '---\napiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: db-%05d\n  namespace: %s\nspec:\n  version: "16.4"\n  storageSize: 1Gi\n  databaseName: app\n  username: app_user\n' "$index" "$namespace"
done > "$work/databases.yaml"
# Whole YAML documents per part, one kubectl per part.
rm -f "$work"/part-*
awk -v parts="$parallelism" -v dir="$work" '/^---$/ {n++} {print > (dir "/part-" (n % parts))}' "$work/databases.yaml"

# control_plane_cpu: "name cpu-seconds" of every control-plane process this cluster started.
control_plane_cpu() {
  local file name
  for file in "$cluster"/pids/*.pid; do
    name="$(basename "$file" .pid)"
    [ -r "/proc/$(cat "$file")/stat" ] && echo "$name $(cpu_seconds "$(cat "$file")")"
  done
}
metrics > "$work/metrics-before.txt"
control_plane_cpu > "$work/cpu-before.txt"
operator_cpu_before="$(cpu_seconds "$operator_pid")"
apiserver_cpu_before="$(cpu_seconds "$apiserver_pid")"
step "creating $N DatabaseServices through the webhooks ($parallelism kubectl in parallel)"
start="$(now)"
creators=()
for part in "$work"/part-?; do
  kubectl create -f "$part" > "$part.out" 2>&1 &
  creators+=($!)
done
# Only the creators: a bare wait would also wait for the operator.
wait "${creators[@]}" || true
created_at="$(now)"
failures="$(cat "$work"/part-?.out | grep -vc 'created$' || true)"
created="$(kubectl get databaseservices -n "$namespace" --no-headers 2>/dev/null | wc -l)"

step "waiting until all $created are Running"
# Milestones, each the first poll at which all N had reached it, to show which stage is the long
# pole: the operator's first pass (status written, children created), the StatefulSet controller
# (pods), the PV controller (claims Bound), scheduler + kwok (pods Running), the operator's
# last pass (DatabaseService Running). Pods and claims through server-side tables, not whole
# objects, to keep the polling light.
declare -A reached=()
milestone() { # NAME COUNT
  if [ -z "${reached[$1]:-}" ] && [ "$2" -ge "$created" ]; then reached[$1]="$(elapsed "$start" "$(now)")"; fi
}
# VmHWM counts the binary's text pages as well as the heap; the anonymous part (heap, stacks) is
# sampled at each poll to show what the operator itself holds.
peak_anon_kib=0
sample_anon() {
  local anon
  anon="$(awk '/RssAnon/ {print $2}' "/proc/$operator_pid/status")"
  [ "$anon" -gt "$peak_anon_kib" ] && peak_anon_kib="$anon"
  return 0
}
running=0
deadline=$(( $(date +%s) + ${BENCH_TIMEOUT:-1800} ))
while :; do
  phases="$(kubectl get databaseservices -n "$namespace" --no-headers -o custom-columns=PHASE:.status.phase 2>/dev/null)"
  running="$(grep -c '^Running$' <<<"$phases" || true)"
  milestone "status written" "$(grep -c -v -e '^<none>$' -e '^$' <<<"$phases" || true)"
  pods="$(kubectl get pods -n "$namespace" --no-headers 2>/dev/null | awk '{print $3}')"
  milestone "pods created" "$(grep -c . <<<"$pods" || true)"
  milestone "claims Bound" "$(kubectl get pvc -n "$namespace" --no-headers 2>/dev/null | grep -c ' Bound ' || true)"
  milestone "pods Running" "$(grep -c '^Running$' <<<"$pods" || true)"
  milestone "databases Running" "$running"
  sample_anon
  [ "$running" -ge "$created" ] && break
  echo "  $(elapsed "$start" "$(now)") s: $running Running" >&2
  [ "$(date +%s)" -ge "$deadline" ] && { echo "timed out with $running of $created Running" >&2; break; }
  sleep 3
done
converged_at="$(now)"
operator_cpu_after="$(cpu_seconds "$operator_pid")"
apiserver_cpu_after="$(cpu_seconds "$apiserver_pid")"
control_plane_cpu > "$work/cpu-after.txt"
metrics > "$work/metrics-converged.txt"

step "quiet period: $quiet_seconds s"
writes_before="$(metric_sum dbservice_controller_writes_total)"
sleep "$quiet_seconds"
writes_after="$(metric_sum dbservice_controller_writes_total)"
peak_rss_kib="$(awk '/VmHWM/ {print $2}' "/proc/$operator_pid/status")"
rss_kib="$(awk '/VmRSS/ {print $2}' "/proc/$operator_pid/status")"
sample_anon
file_rss_kib="$(awk '/RssFile/ {print $2}' "/proc/$operator_pid/status")"
admission_errors="$(metric_sum dbservice_admission_requests_total 'result="error"')"

requests_by_verb() {
  # Per verb: converged minus before, from the operator's own counter.
  for verb in get list watch create update patch delete; do
    local before after
    before="$(grep -h "^dbservice_api_requests_total{verb=\"$verb\"" "$work/metrics-before.txt" | awk '{s += $NF} END {printf "%d", s}')"
    after="$(grep -h "^dbservice_api_requests_total{verb=\"$verb\"" "$work/metrics-converged.txt" | awk '{s += $NF} END {printf "%d", s}')"
    printf '%s=%d ' "$verb" "$((after - before))"
  done
}
by_resource() {
  grep '^dbservice_api_requests_total' "$work/metrics-converged.txt" | { grep -v 'verb="watch"' || true; } \
    | sed -E 's/.*resource="([^"]*)".*verb="([^"]*)"\} ([0-9]+).*/\2 \1 \3/; s/.*verb="([^"]*)".*resource="([^"]*)"\} ([0-9]+).*/\1 \2 \3/' \
    | sort | awk '{printf "    %-8s %-28s %d\n", $1, $2, $3}'
}

step "SIGTERM with $N databases: time to exit"
terminate "$work/operator.log"
exit_after="$terminated"

# Issue 26's hang: a term that ends before the caches finished their first list (SIGTERM as soon
# as the operator leads, while it lists N databases). BENCH_OLD_BINARY (e.g. a build of a83f7fc,
# before the fix) is measured the same way, for the before/after.
startup_exit() { # BINARY LOG
  start_operator "$1" "$2"
  wait_leader 0.02 || { tail -20 "$2" >&2; exit 1; }
  terminate "$2"
}
step "SIGTERM the moment the operator leads, with $N databases"
startup_exit "$binary" "$work/operator-startup.log"
startup_exit_after="$terminated"
startup_exit_before="not measured (BENCH_OLD_BINARY unset)"
if [ -n "${BENCH_OLD_BINARY:-}" ]; then
  startup_exit "$BENCH_OLD_BINARY" "$work/operator-startup-old.log"
  startup_exit_before="$terminated"
fi

cat <<REPORT | tee "$work/report.txt"

bench-scale: N=$N, $DBSERVICE_KWOK_NODES kwok nodes, concurrency ${CONCURRENCY:-default}, build: $rust_target
  created:                 $created in $(elapsed "$start" "$created_at") s ($failures kubectl failures, $admission_errors admission errors)
  all Running after:       $(elapsed "$start" "$converged_at") s ($running of $created)
  all N reached (s):       status written ${reached[status written]:--}, pods created ${reached[pods created]:--}, claims Bound ${reached[claims Bound]:--}, pods Running ${reached[pods Running]:--}, databases Running ${reached[databases Running]:--}
  operator peak RSS:       $((peak_rss_kib / 1024)) MiB ($peak_rss_kib KiB); after the quiet period $((rss_kib / 1024)) MiB
  of which:                anonymous (heap, stacks) peak $((peak_anon_kib / 1024)) MiB sampled at each poll; binary text mapped $((file_rss_kib / 1024)) MiB
  operator CPU:            $(elapsed "$operator_cpu_before" "$operator_cpu_after") s
  apiserver CPU:           $(elapsed "$apiserver_cpu_before" "$apiserver_cpu_after") s
  API requests (converge): $(requests_by_verb)
  writes in quiet period:  $((writes_after - writes_before)) in $quiet_seconds s
  exit after SIGTERM:      $exit_after
  SIGTERM when it leads:   $startup_exit_after (BENCH_OLD_BINARY ${BENCH_OLD_BINARY:-}: $startup_exit_before)
  CPU-seconds while converging (2 cores = $(awk -v from="$start" -v to="$converged_at" 'BEGIN {printf "%.0f", 2 * (to - from)}') CPU-s available):
$(join "$work/cpu-before.txt" "$work/cpu-after.txt" | awk '{printf "    %-24s %.1f\n", $1, $3 - $2}')
    dbservice-operator       $(elapsed "$operator_cpu_before" "$operator_cpu_after")
  requests by verb and resource since start (watches excluded):
$(by_resource)
REPORT
