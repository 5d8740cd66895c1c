#!/usr/bin/env bash
# Issue 38's recovery targets, measured: runs the real-node failover test and the faults that end
# in a primary change RUNS times (default 3), collects each `[figure] <scenario>: RTO <s> ...
# writes refused <s>` line (RTO: from the fault to the first commit acknowledged through Service
# NAME after the outage; writes refused: from the first refused attempt to that commit, a
# switchover's measure), and prints every run beside its target. Exits 1 if any run missed its
# target, 2 if a scenario produced no figure (a test that failed before measuring). Needs the real
# node: `make cluster-up && make image` first. The tests are built once and the image is pinned
# (DBSERVICE_OPERATOR_IMAGE, default the tree's), so the tree may change during the runs.
#   benches/fault-recovery.sh [runs]
set -euo pipefail
runs="${1:-3}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export KUBECONFIG="$root/.cluster/kubeconfig" DBSERVICE_E2E=1 CI=true PATH="$root/.cluster/bin:$PATH"
log="$(mktemp /tmp/fault-recovery.XXXXXX)"
output="${log}.output"
# One build for every run, and the image of the tree as it is now: the tree may change meanwhile.
DBSERVICE_OPERATOR_IMAGE="$(tests/cluster/images.sh name)"
export DBSERVICE_OPERATOR_IMAGE
binary="$(cargo test --quiet --test real_node --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"] == "real_node"][0])')"
echo "image $DBSERVICE_OPERATOR_IMAGE, tests $binary" >&2
# The tests to run (DBSERVICE_BENCH_TESTS, words, to run fewer): the failover test and every fault
# that ends in a change of primary.
# shellcheck disable=SC2206 # a list of words
tests=(${DBSERVICE_BENCH_TESTS:-failover_switchover_and_fencing_keep_one_primary_under_a_writer
  faults::stalls::a_primary_stalled_until_fenced
  faults::stalls::the_primary_agent_stopped
  faults::network::
  faults::store::})
for run in $(seq "$runs"); do
  echo "run $run of $runs: real_node ${tests[*]}" >&2
  # A failed test still counts its figures: a missing one is reported below. The whole output is
  # kept: a failed assertion is read there.
  flock /tmp/dbservice-e2e.lock "$binary" "${tests[@]}" --nocapture 2>&1 |
    tee -a "$output" |
    sed -n "s/^.*\[figure\] \(.*\): RTO \([0-9.]*\) s.*writes refused \([0-9.]*\) s.*$/$run\t\1\t\2\t\3/p" >>"$log" || true
  echo "run $run: $(grep -c '^test .* FAILED$' "$output" || true) failed tests so far (output: $output)" >&2
done
subset="${DBSERVICE_BENCH_TESTS:+subset}"
python3 - "$log" "$runs" "${subset:-all}" <<'EOF'
import sys
from collections import defaultdict

# (scenario as the tests name it, target in seconds, measure): issue 38 / the manual's Faults page (docs/manual/src/figures/faults.md). A
# failover counts from the fault to the first commit after it ("rto"); a switchover counts the
# writes refused ("refused": writes go on while its target catches up).
TARGETS = [
    ("object store unreachable: primary pod deleted", 10.0, "rto"),
    ("object store unreachable: switchover", 3.0, "refused"),
    # The operator's leader lost in the middle: no target of its own (the new leader's clocks
    # start when it takes over).
    ("primary pod deleted + operator leader restarted", None, "rto"),
    ("switchover by annotation", 3.0, "refused"),
    ("switchover while the primary's replication link is throttled", 3.0, "refused"),
    ("primary pod deleted", 5.0, "rto"),
    ("PostgreSQL killed in the primary", 15.0, "rto"),
    ("PostgreSQL hung in the primary", 15.0, "rto"),
    ("primary's PostgreSQL stopped until fenced", 15.0, "rto"),
    ("primary's agent alone stopped", 15.0, "rto"),
    ("primary cut off from the API server", 15.0, "rto"),
]
path, runs, subset = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "subset"
figures = defaultdict(list)
rule = lambda scenario: next(((seconds, measure) for prefix, seconds, measure in TARGETS if scenario.startswith(prefix)), (None, "rto"))
for line in open(path):
    run, scenario, rto, refused = line.rstrip("\n").split("\t")
    figures[scenario].append(float(refused if rule(scenario)[1] == "refused" else rto))
missed, missing = 0, 0
print(f"{'scenario':<96} {'target':>7} {'measure':>8}  runs (s)")
for scenario in sorted(figures):
    target, measure = rule(scenario)
    values = figures[scenario]
    verdict = "no target"
    if target is not None:
        late = [value for value in values if value > target]
        verdict = "ok" if not late else f"MISSED ({len(late)} of {len(values)})"
        missed += bool(late)
    shown = "-" if target is None else f"{target:.0f} s"
    print(f"{scenario:<96} {shown:>7} {measure:>8}  {', '.join(f'{value:.1f}' for value in values)}  {verdict}")
for prefix, target, _ in TARGETS:
    if target is None or subset:
        continue
    count = sum(len(values) for scenario, values in figures.items() if scenario.startswith(prefix))
    if count < runs:
        print(f"missing: {prefix}: {count} of {runs} runs measured")
        missing += 1
sys.exit(2 if missing else 1 if missed else 0)
EOF
