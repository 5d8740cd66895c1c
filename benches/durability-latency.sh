#!/usr/bin/env bash
# What each data durability mode costs a commit (issue 38): pgbench on a primary with one streaming
# standby on loopback, with `synchronous_standby_names` as the modes set it: '' (none, or preferred
# while degraded) and 'ANY 1 ("standby")' (required, and preferred while its standby streams).
# Prints TPS and the average latency of each, and fails if the synchronous run did not wait for
# the standby (pg_stat_replication must show it as a quorum member) or committed nothing.
#   benches/durability-latency.sh [seconds per run]    (default 20; PostgreSQL from PG_BIN, default 15's)
set -euo pipefail
seconds="${1:-20}"
pg_bin="${PG_BIN:-/usr/lib/postgresql/15/bin}"
work="$(mktemp -d /tmp/durability-latency.XXXXXX)"
port=$((20000 + RANDOM % 10000))
standby_port=$((port + 1))
as_pg=()
if [ "$(id -u)" = 0 ]; then chown postgres "$work"; as_pg=(runuser -u postgres --); fi
cleanup() {
  for data in standby primary; do
    "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/$data" -m immediate stop >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

sql() { "${as_pg[@]}" "$pg_bin/psql" -h "$work" -p "$port" -U postgres -AtXq -c "$1" postgres; }

"${as_pg[@]}" "$pg_bin/initdb" -D "$work/primary" -U postgres --auth=trust >/dev/null
printf 'host replication postgres 127.0.0.1/32 trust\n' >>"$work/primary/pg_hba.conf"
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/primary" -l "$work/primary.log" -w -o "-p $port \
  -c listen_addresses=127.0.0.1 -c unix_socket_directories=$work -c max_connections=50" start >/dev/null
"${as_pg[@]}" "$pg_bin/pg_basebackup" -h 127.0.0.1 -p "$port" -U postgres -D "$work/standby" -X stream -R
echo "primary_conninfo = 'host=127.0.0.1 port=$port user=postgres application_name=standby'" \
  >>"$work/standby/postgresql.auto.conf"
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/standby" -l "$work/standby.log" -w -o "-p $standby_port \
  -c listen_addresses=127.0.0.1 -c unix_socket_directories=$work" start >/dev/null
for _ in $(seq 100); do
  [ "$(sql "select count(*) from pg_stat_replication where state = 'streaming'")" = 1 ] && break
  sleep 0.2
done
"${as_pg[@]}" "$pg_bin/pgbench" -h "$work" -p "$port" -U postgres -i -q -s 10 postgres >/dev/null 2>&1

run() { # synchronous_standby_names -> "tps latency_ms"
  sql "alter system set synchronous_standby_names = '$1'" && sql "select pg_reload_conf()" >/dev/null
  sleep 1
  local sync_state
  sync_state="$(sql "select sync_state from pg_stat_replication where application_name = 'standby'")"
  if [ -n "$1" ] && [ "$sync_state" != quorum ]; then echo "the standby is $sync_state, not a quorum member" >&2; exit 1; fi
  "${as_pg[@]}" "$pg_bin/pgbench" -h "$work" -p "$port" -U postgres -n -c 4 -j 2 -T "$seconds" postgres 2>/dev/null |
    awk '/^latency average/ { latency = $4 } /^tps = / { tps = $3 } END { print tps, latency }'
}
echo "pgbench TPC-B-like, -c 4 -j 2, ${seconds}s per run, scale 10, $(nproc) cores, standby on loopback"
printf '%-58s %10s %14s\n' "mode (synchronous_standby_names)" TPS "latency (ms)"
for mode in "none, or preferred while degraded ('')|" 'required, or preferred while its standby streams (ANY 1)|ANY 1 ("standby")'; do
  read -r tps latency <<<"$(run "${mode#*|}")"
  awk -v tps="$tps" 'BEGIN { exit !(tps > 0) }' || { echo "no commit in mode ${mode%%|*}" >&2; exit 1; }
  printf '%-58s %10.0f %14.3f\n' "${mode%%|*}" "$tps" "$latency"
done
