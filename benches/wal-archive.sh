#!/usr/bin/env bash
# Archive throughput of `dbservice-operator wal-archive`, one process per segment as PostgreSQL's
# archiver runs it, against moto_server on loopback. The segments are real WAL written by pgbench
# (so compression sees realistic data), archived after the fact so PostgreSQL's own speed is
# not part of the figure.
#   benches/wal-archive.sh [segments]      (default 64; binary: target/release/dbservice-operator,
#                                           or BINARY=...; PostgreSQL from /usr/lib/postgresql/15/bin)
set -euo pipefail
segments="${1:-64}"
source "$(dirname "$0")/lib/loopback.sh"
loopback_setup wal-archive-bench
"${as_pg[@]}" "$pg_bin/initdb" -D "$work/pgdata" -U postgres --auth=trust --no-sync >/dev/null
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$work/pgdata" -l "$work/pg.log" -w \
  -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$work -c max_wal_size=4GB -c wal_keep_size=4GB -c fsync=off" start >/dev/null
"${as_pg[@]}" "$pg_bin/pgbench" -h 127.0.0.1 -p "$port" -U postgres -i -q -s 10 postgres >/dev/null 2>&1
while [ "$(find "$work/pgdata/pg_wal" -maxdepth 1 -name '0*' | wc -l)" -le "$segments" ]; do
  "${as_pg[@]}" "$pg_bin/pgbench" -h 127.0.0.1 -p "$port" -U postgres -n -T 5 postgres >/dev/null 2>&1
done
mapfile -t files < <(find "$work/pgdata/pg_wal" -maxdepth 1 -name '0*' -printf '%f\n' | sort | head -n "$segments")
python3 -c "import boto3; boto3.client('s3', endpoint_url='http://127.0.0.1:$moto_port', aws_access_key_id='k', \
aws_secret_access_key='s', region_name='us-east-1').create_bucket(Bucket='bench')"

export DBSERVICE_S3_ENDPOINT="http://127.0.0.1:$moto_port" DBSERVICE_S3_BUCKET=bench DBSERVICE_S3_PATH=bench \
  DBSERVICE_BACKUP_SERVER_NAME=pgbench AWS_ACCESS_KEY_ID=k AWS_SECRET_ACCESS_KEY=s
raw_bytes=$(( ${#files[@]} * $(stat -c %s "$work/pgdata/pg_wal/${files[0]}") ))
start=$(date +%s.%N)
for file in "${files[@]}"; do "$binary" wal-archive "$work/pgdata/pg_wal/$file" "$file"; done
end=$(date +%s.%N)
stored=$(python3 -c "import boto3; c=boto3.client('s3', endpoint_url='http://127.0.0.1:$moto_port', aws_access_key_id='k', \
aws_secret_access_key='s', region_name='us-east-1'); print(sum(o['Size'] for o in c.list_objects_v2(Bucket='bench')['Contents']))")
python3 - "$start" "$end" "${#files[@]}" "$raw_bytes" "$stored" <<'PY'
import sys
start, end, count, raw, stored = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
seconds = end - start
print(f"{count} segments ({raw / 2**20:.0f} MiB) in {seconds:.2f} s: {count / seconds:.1f} segments/s, "
      f"{raw / 2**20 / seconds:.0f} MiB/s of WAL; stored {stored / 2**20:.1f} MiB (ratio {raw / stored:.1f}x)")
PY
