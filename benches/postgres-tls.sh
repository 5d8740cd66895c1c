#!/usr/bin/env bash
# What TLS costs PostgreSQL (issue 22): pgbench TPS over TCP on loopback without TLS and with
# the TLS the pods use (TLS 1.2 at least, an ECDSA P-256 server certificate from a CA of its own,
# the client verifying it: sslmode=verify-full), on one PostgreSQL server with ssl=on. Two loads:
# long sessions (the TLS record cost) and a new connection per transaction (`-C`: the handshake).
#   benches/postgres-tls.sh [seconds per run]     (default 20; PostgreSQL from PG_BIN, default 15's)
set -euo pipefail
seconds="${1:-20}"
pg_bin="${PG_BIN:-/usr/lib/postgresql/15/bin}"
work="$(mktemp -d /tmp/postgres-tls-bench.XXXXXX)"
port=$((20000 + RANDOM % 10000))
as_pg=()
if [ "$(id -u)" = 0 ]; then chown postgres "$work"; as_pg=(runuser -u postgres --); fi
cleanup() {
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pgdata" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# A CA and a server certificate for localhost, as the operator makes them (ECDSA P-256).
openssl ecparam -name prime256v1 -genkey -noout -out "$work/ca.key" 2>/dev/null
openssl req -x509 -new -key "$work/ca.key" -subj "/CN=bench CA" -days 1 -out "$work/ca.crt" 2>/dev/null
openssl ecparam -name prime256v1 -genkey -noout -out "$work/tls.key" 2>/dev/null
openssl req -new -key "$work/tls.key" -subj "/CN=localhost" -out "$work/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$work/ext"
openssl x509 -req -in "$work/tls.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial -days 1 \
  -extfile "$work/ext" -out "$work/tls.crt" 2>/dev/null
chmod 600 "$work"/*.key
[ "$(id -u)" = 0 ] && chown postgres "$work"/*

"${as_pg[@]}" "$pg_bin/initdb" -D "$work/pgdata" -U postgres --auth=trust --no-sync >/dev/null
# Both plain and TLS logins are allowed here (the pods reject plain text): one server, two clients.
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pgdata" -l "$work/pg.log" -w -o "-p $port -c listen_addresses=127.0.0.1 \
  -c unix_socket_directories=$work -c ssl=on -c ssl_cert_file=$work/tls.crt -c ssl_key_file=$work/tls.key \
  -c ssl_min_protocol_version=TLSv1.2 -c max_connections=50" start >/dev/null
"${as_pg[@]}" "$pg_bin/pgbench" -h localhost -p "$port" -U postgres -i -q -s 10 postgres >/dev/null 2>&1

run() { # mode, extra pgbench flags -> tps
  "${as_pg[@]}" env PGSSLMODE="$1" PGSSLROOTCERT="$work/ca.crt" "$pg_bin/pgbench" -h localhost -p "$port" -U postgres -n -c 8 -j 2 -T "$seconds" "${@:2}" postgres 2>/dev/null |
    sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}
ssl_in_use="$("${as_pg[@]}" env PGSSLMODE=verify-full PGSSLROOTCERT="$work/ca.crt" "$pg_bin/psql" -h localhost -p "$port" -U postgres -Atc \
  "select ssl, version, cipher from pg_stat_ssl where pid = pg_backend_pid()" postgres)"
echo "TLS session: $ssl_in_use (pgbench -c 8 -j 2, ${seconds}s per run, scale 10, $(nproc) cores)"
printf '%-44s %12s %12s %8s\n' load "plain TPS" "TLS TPS" "TLS/plain"
for load in "select-only (-S)|-S" "TPC-B-like (default)|" "select-only, connection per transaction (-S -C)|-S -C"; do
  name="${load%%|*}"
  read -r -a flags <<<"${load#*|}"
  plain="$(run disable "${flags[@]}")"
  tls="$(run verify-full "${flags[@]}")"
  printf '%-44s %12.0f %12.0f %7.0f%%\n' "$name" "$plain" "$tls" "$(awk -v tls="$tls" -v plain="$plain" 'BEGIN { print 100 * tls / plain }')"
done
