# Sourced by the backup benchmarks: a work directory, a moto_server on loopback and the binary to
# measure; PostgreSQL (PG_BIN) is run as the postgres user when the caller is root. Stops both
# and removes the work directory on exit. Sets: binary, pg_bin, work, port, moto_port, as_pg.
#   name: the work directory's prefix
loopback_setup() {
  binary="${BINARY:-${CARGO_TARGET_DIR:-target}/release/dbservice-operator}"
  pg_bin="${PG_BIN:-/usr/lib/postgresql/15/bin}"
  work="$(mktemp -d "/tmp/$1.XXXXXX")"
  port=$((20000 + RANDOM % 20000))
  moto_port=$((port + 1))
  as_pg=()
  if [ "$(id -u)" = 0 ]; then chown postgres "$work"; as_pg=(runuser -u postgres --); fi
  trap loopback_cleanup EXIT
  moto_server -H 127.0.0.1 -p "$moto_port" >"$work/moto.log" 2>&1 &
  moto_pid=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$moto_port/" && break; sleep 0.2; done
}

loopback_cleanup() {
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pgdata" -m immediate stop >/dev/null 2>&1 || true
  if [ -n "${moto_pid:-}" ]; then kill "$moto_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
