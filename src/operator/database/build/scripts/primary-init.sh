#!/bin/bash
# dbservice-operator: one-time primary initialization (docker-entrypoint-initdb.d style).
#
# Runs while the first-boot temporary server is up (socket only), as the superuser POSTGRES_USER:
#   - creates the application's role APPLICATION_USER (LOGIN, not a superuser, password
#     APPLICATION_PASSWORD) and makes it the owner of POSTGRES_DB (when APPLICATION_USER is set),
#   - rejects network logins as POSTGRES_USER in pg_hba.conf unless SUPERUSER_NETWORK_ACCESS=on,
#   - creates (or updates) the streaming-replication role REPLICATION_USER with REPLICATION LOGIN
#     and a SCRAM-SHA-256 hash of REPLICATION_PASSWORD,
#   - allows replication connections for that role from anywhere with scram-sha-256 in pg_hba.conf
#     (inserted at the top so no earlier, weaker line can match first).
# Idempotent: running it again changes nothing but the password. entrypoint.sh runs it both in the
# container (from the official docker-entrypoint.sh init path) and in standalone mode.
#
# Environment: PGDATA, POSTGRES_USER, REPLICATION_USER, REPLICATION_PASSWORD; optional
# APPLICATION_USER, APPLICATION_PASSWORD, POSTGRES_DB, SUPERUSER_NETWORK_ACCESS; libpq's
# PGHOST/PGPORT (unset PGHOST = default socket directory).

# If sourced (e.g. dropped into /docker-entrypoint-initdb.d), run in a child shell so our shell
# options and exits do not leak into the caller.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
	bash "${BASH_SOURCE[0]}"
	return $?
fi

set -euo pipefail

log() {
	printf '%s dbservice-primary-init: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2
}

for name in PGDATA POSTGRES_USER REPLICATION_USER REPLICATION_PASSWORD; do
	if [ -z "${!name:-}" ]; then
		log "FATAL: environment variable $name must be set"
		exit 1
	fi
done
# shellcheck disable=SC2153 # set by the pod, checked above
if ! [[ "$REPLICATION_USER" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
	log "FATAL: REPLICATION_USER must match [A-Za-z_][A-Za-z0-9_]*"
	exit 1
fi
if [ "$REPLICATION_USER" = "$POSTGRES_USER" ]; then
	log "FATAL: REPLICATION_USER must differ from POSTGRES_USER"
	exit 1
fi

# --- replication role ------------------------------------------------------------------------
# The password travels on psql's stdin (never argv, never the log). The session turns off statement
# logging so a failing statement is not echoed to the server log with the password in it, and forces
# SCRAM hashing (md5 is the default before PostgreSQL 14).
password_literal="'${REPLICATION_PASSWORD//\'/\'\'}'"
# psql's stdout is discarded and its stderr captured: on failure psql echoes the failing
# statement's text as error context, so the password is redacted before anything is printed.
if ! err="$(
	{
		printf '%s\n' \
			"SET log_statement = 'none';" \
			"SET log_min_error_statement = 'panic';" \
			"SET standard_conforming_strings = on;" \
			"SET password_encryption = 'scram-sha-256';" \
			"SELECT format('CREATE ROLE %I', :'repl_user') WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = :'repl_user') \\gexec"
		printf 'ALTER ROLE :"repl_user" WITH REPLICATION LOGIN PASSWORD %s;\n' "$password_literal"
		# pg_rewind (a former primary rejoining as a standby) reads the new primary's files with these
		# functions, as the replication role: the documented grants for a non-superuser source.
		printf '%s\n' \
			'GRANT EXECUTE ON FUNCTION pg_catalog.pg_ls_dir(text, boolean, boolean) TO :"repl_user";' \
			'GRANT EXECUTE ON FUNCTION pg_catalog.pg_stat_file(text, boolean) TO :"repl_user";' \
			'GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text) TO :"repl_user";' \
			'GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean) TO :"repl_user";' \
			'GRANT EXECUTE ON FUNCTION pg_catalog.pg_switch_wal() TO :"repl_user";'
	} | psql -X -q -v ON_ERROR_STOP=1 --no-password \
		--username "$POSTGRES_USER" --dbname postgres \
		--set repl_user="$REPLICATION_USER" 2>&1 >/dev/null
)"; then
	err="${err//"$password_literal"/'******'}"
	printf '%s\n' "${err//"$REPLICATION_PASSWORD"/******}" >&2
	log "FATAL: could not create the replication role"
	exit 1
fi
log "replication role \"$REPLICATION_USER\" is ready"

# --- application role ---------------------------------------------------------------------------
if [ -n "${APPLICATION_USER:-}" ]; then
	if [ "$APPLICATION_USER" = "$POSTGRES_USER" ] || [ "$APPLICATION_USER" = "$REPLICATION_USER" ]; then
		log "FATAL: APPLICATION_USER must differ from POSTGRES_USER and REPLICATION_USER"
		exit 1
	fi
	application_literal="'${APPLICATION_PASSWORD//\'/\'\'}'"
	if ! err="$(
		{
			printf '%s\n' \
				"SET log_statement = 'none';" \
				"SET log_min_error_statement = 'panic';" \
				"SET password_encryption = 'scram-sha-256';" \
				"SELECT format('CREATE ROLE %I', :'app_user') WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = :'app_user') \\gexec"
			printf 'ALTER ROLE :"app_user" WITH LOGIN NOSUPERUSER PASSWORD %s;\n' "$application_literal"
			printf '%s\n' "SELECT format('ALTER DATABASE %I OWNER TO %I', :'db', :'app_user') \\gexec"
		} | psql -X -q -v ON_ERROR_STOP=1 --no-password \
			--username "$POSTGRES_USER" --dbname postgres \
			--set app_user="$APPLICATION_USER" --set db="${POSTGRES_DB:-$APPLICATION_USER}" 2>&1 >/dev/null
	)"; then
		err="${err//"$application_literal"/'******'}"
		printf '%s\n' "${err//"$APPLICATION_PASSWORD"/******}" >&2
		log "FATAL: could not create the application role"
		exit 1
	fi
	log "application role \"$APPLICATION_USER\" owns database \"${POSTGRES_DB:-$APPLICATION_USER}\""
fi

# --- pg_hba.conf -------------------------------------------------------------------------------
hba="$PGDATA/pg_hba.conf"
begin='# BEGIN dbservice-operator replication'
end='# END dbservice-operator replication'
if grep -qxF "$begin" "$hba"; then
	log "pg_hba.conf already allows replication"
else
	tmp="$hba.dbservice.tmp"
	{
		printf '%s\n' "$begin"
		printf 'host\treplication\t%s\tall\tscram-sha-256\n' "$REPLICATION_USER"
		printf '%s\n\n' "$end"
		cat "$hba"
	} >"$tmp"
	chmod 600 "$tmp"
	mv -f "$tmp" "$hba"
	log "pg_hba.conf allows replication connections for \"$REPLICATION_USER\" (scram-sha-256)"
fi

# Network connections without TLS: rejected before any other rule (the agent rewrites this
# block before every start too).
tls_begin='# BEGIN dbservice-operator tls'
if [ -n "${TLS_DIRECTORY:-}" ] && ! grep -qxF "$tls_begin" "$hba"; then
	tmp="$hba.dbservice.tmp"
	{
		printf '%s\n' "$tls_begin"
		printf 'hostnossl\tall\tall\tall\treject\n'
		printf 'hostnossl\treplication\tall\tall\treject\n'
		printf '%s\n' '# END dbservice-operator tls'
		cat "$hba"
	} >"$tmp"
	chmod 600 "$tmp"
	mv -f "$tmp" "$hba"
	log "pg_hba.conf rejects network connections without TLS"
fi

# Network logins as the superuser: rejected first unless allowed (the agent rewrites this block
# before every start, so that spec.enableSuperuserAccess can change).
superuser_begin='# BEGIN dbservice-operator superuser'
if [ "${SUPERUSER_NETWORK_ACCESS:-off}" != on ] && ! grep -qxF "$superuser_begin" "$hba"; then
	tmp="$hba.dbservice.tmp"
	{
		printf '%s\n' "$superuser_begin"
		printf 'host\tall\t%s\tall\treject\n' "$POSTGRES_USER"
		printf 'host\treplication\t%s\tall\treject\n' "$POSTGRES_USER"
		printf '%s\n' '# END dbservice-operator superuser'
		cat "$hba"
	} >"$tmp"
	chmod 600 "$tmp"
	mv -f "$tmp" "$hba"
	log "pg_hba.conf rejects network logins as \"$POSTGRES_USER\""
fi
