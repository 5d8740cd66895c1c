#!/usr/bin/env bash
# Base backup and restore throughput of `dbservice-operator backup` / `restore` for a pgbench
# database of a few GiB, against moto_server on loopback, beside the raw speed of the disk
# (dd, O_DIRECT) and of the store (one unsigned 256 MiB PUT/GET with curl). pgbench tables
# compress far better than most data, so NOISE_MIB of random bytes (default 512) are added.
#   benches/base-backup.sh [pgbench scale]   (default 150: with the noise about 2.8 GiB of tar;
#                                             binary: target/release/dbservice-operator, or BINARY=...)
set -euo pipefail
scale="${1:-150}"
source "$(dirname "$0")/lib/loopback.sh"
loopback_setup base-backup-bench
now() { date +%s.%N; }
mib_per_s() { python3 -c "import sys; b,s,e=map(float,sys.argv[1:]); print(f'{b/2**20:.0f} MiB in {e-s:.1f} s = {b/2**20/(e-s):.0f} MiB/s')" "$@"; }
curl -s -X PUT -o /dev/null "http://127.0.0.1:$moto_port/bench"

echo "== raw speeds"
dd if=/dev/urandom of="$work/random" bs=1M count=256 status=none
start=$(now); dd if=/dev/zero of="$work/dd" bs=1M count=2048 oflag=direct status=none; end=$(now)
echo "disk write (dd, O_DIRECT, 1 MiB blocks): $(mib_per_s $((2048 * 1048576)) "$start" "$end")"
start=$(now); dd if="$work/dd" of=/dev/null bs=1M iflag=direct status=none; end=$(now)
echo "disk read  (dd, O_DIRECT, 1 MiB blocks): $(mib_per_s $((2048 * 1048576)) "$start" "$end")"
rm -f "$work/dd"
start=$(now); curl -sf -o /dev/null -T "$work/random" "http://127.0.0.1:$moto_port/bench/raw"; end=$(now)
echo "store PUT  (curl, 256 MiB, unsigned):     $(mib_per_s $((256 * 1048576)) "$start" "$end")"
# moto accepts unsigned PUTs but wants an Authorization header (which it does not verify) on GET.
authorization="Authorization: AWS4-HMAC-SHA256 Credential=k/20261201/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00"
start=$(now); got=$(curl -sf -H "$authorization" -o /dev/null -w '%{size_download}' "http://127.0.0.1:$moto_port/bench/raw"); end=$(now)
[ "$got" = $((256 * 1048576)) ] || { echo "store GET returned $got bytes" >&2; exit 1; }
echo "store GET  (curl, 256 MiB):               $(mib_per_s "$got" "$start" "$end")"
curl -s -H "$authorization" -o /dev/null -X DELETE "http://127.0.0.1:$moto_port/bench/raw"

echo "== database (pgbench scale $scale)"
"${as_pg[@]}" "$pg_bin/initdb" -D "$work/pgdata" -U postgres --auth=trust --no-sync >/dev/null
# WAL of the initial load is discarded (archive_command = true); our archiver is switched on after.
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pgdata" -l "$work/pg.log" -w -o "-p $port -c listen_addresses=127.0.0.1 \
  -c unix_socket_directories=$work -c max_wal_size=1GB -c archive_mode=on -c archive_command=true" start >/dev/null
"${as_pg[@]}" "$pg_bin/pgbench" -h 127.0.0.1 -p "$port" -U postgres -i -q -s "$scale" postgres >/dev/null 2>&1
"${as_pg[@]}" "$pg_bin/psql" -q -h 127.0.0.1 -p "$port" -U postgres -c "create extension if not exists pgcrypto" \
  -c "create table noise as select gen_random_bytes(1000) as bytes from generate_series(1, ${NOISE_MIB:-512} * 1024)" >/dev/null
export DBSERVICE_S3_ENDPOINT="http://127.0.0.1:$moto_port" DBSERVICE_S3_BUCKET=bench DBSERVICE_S3_PATH=bench \
  DBSERVICE_BACKUP_SERVER_NAME=pgbench AWS_ACCESS_KEY_ID=k AWS_SECRET_ACCESS_KEY=s DBSERVICE_S3_TIMEOUT_SECONDS=300
"${as_pg[@]}" "$pg_bin/psql" -q -h 127.0.0.1 -p "$port" -U postgres -c \
  "alter system set archive_command = '\"$(realpath "$binary")\" wal-archive %p %f'" -c "select pg_reload_conf()" >/dev/null
# The server inherited no store settings: give them to it through the archive_command environment.
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pgdata" -l "$work/pg.log" -w -m fast stop >/dev/null
"${as_pg[@]}" env DBSERVICE_S3_ENDPOINT="$DBSERVICE_S3_ENDPOINT" DBSERVICE_S3_BUCKET=bench DBSERVICE_S3_PATH=bench \
  DBSERVICE_BACKUP_SERVER_NAME=pgbench AWS_ACCESS_KEY_ID=k AWS_SECRET_ACCESS_KEY=s \
  "$pg_bin/pg_ctl" -D "$work/pgdata" -l "$work/pg.log" -w -o "-p $port -c listen_addresses=127.0.0.1 \
  -c unix_socket_directories=$work -c max_wal_size=1GB -c archive_mode=on" start >/dev/null
size=$(du -sb "$work/pgdata" | cut -f1)
echo "data directory: $((size / 1048576)) MiB"

start=$(now)
manifest=$("$binary" backup --host 127.0.0.1 --port "$port" --user postgres --pg-bin-dir "$pg_bin")
end=$(now)
read -r tar_bytes stored_bytes < <(python3 -c "import json,sys; m=json.loads(sys.argv[1]); print(m['sizeBytes'], m['storedBytes'])" "$manifest")
echo "backup  (pg_basebackup -> zstd -> store): $(mib_per_s "$tar_bytes" "$start" "$end") of tar, stored $((stored_bytes / 1048576)) MiB (ratio $(python3 -c "print(f'{$tar_bytes/$stored_bytes:.1f}')")x)"

mkdir "$work/restored"; [ "$(id -u)" = 0 ] && chown postgres "$work/restored"
start=$(now)
"${as_pg[@]}" env DBSERVICE_S3_ENDPOINT="$DBSERVICE_S3_ENDPOINT" DBSERVICE_S3_BUCKET=bench DBSERVICE_S3_PATH=bench \
  DBSERVICE_BACKUP_SERVER_NAME=pgbench AWS_ACCESS_KEY_ID=k AWS_SECRET_ACCESS_KEY=s DBSERVICE_S3_TIMEOUT_SECONDS=300 \
  "$binary" restore --pgdata "$work/restored" >/dev/null
end=$(now)
echo "restore (store -> zstd -> tar -> disk):  $(mib_per_s "$tar_bytes" "$start" "$end") of tar"
