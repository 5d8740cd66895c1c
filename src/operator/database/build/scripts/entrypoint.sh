#!/bin/bash
# dbservice-operator: PostgreSQL container entrypoint (ConfigMap NAME-scripts, mounted at /scripts).
#
# Container command: ["/bin/bash", "/scripts/entrypoint.sh"]
#
# Role comes from the StatefulSet ordinal at the end of POD_NAME: NAME-0 is the primary, NAME-1..N
# are hot standbys that clone the primary with pg_basebackup and stream WAL from it.
#
# Required environment:
#   POD_NAME              StatefulSet pod name (downward API), e.g. mydb-0
#   PGDATA                data directory; must be a SUBDIRECTORY of the volume mount
#                         (e.g. /var/lib/postgresql/data/pgdata), its parent must be writable
#   POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB   superuser and initial database (primary init)
#   APPLICATION_USER, APPLICATION_PASSWORD          the application's role, owner of POSTGRES_DB
#                                                   (optional; created by primary-init.sh)
#   REPLICATION_USER, REPLICATION_PASSWORD          streaming-replication role
#   PRIMARY_HOST          DNS name of the primary (standbys only, without the agent)
#   DBSERVICE_AGENT       path of the instance agent (dbservice-operator): agent mode, see below
# Optional environment:
#   PRIMARY_PORT (5432), PGPORT (5432), LISTEN_ADDRESSES (*), MAX_WAL_SENDERS (10),
#   WAL_KEEP_SIZE (256MB), PRIMARY_WAIT_TIMEOUT seconds (300), BASEBACKUP_ATTEMPTS (3),
#   PG_BIN (directory prepended to PATH), PG_SOCKET_DIR (unix socket directory),
#   DBSERVICE_SCRIPTS_DIR (directory holding primary-init.sh; defaults to this script's directory),
#   DOCKER_ENTRYPOINT (path of the official image's docker-entrypoint.sh),
#   DBSERVICE_ENTRYPOINT_MODE: "container" (default: official postgres image, its docker-entrypoint.sh
#                         performs initdb) or "standalone" (plain PostgreSQL binaries, used by tests:
#                         this script runs initdb itself and then execs postgres).
#
# Passwords may come as files instead: NAME_FILE (POSTGRES_PASSWORD_FILE, APPLICATION_PASSWORD_FILE,
# REPLICATION_PASSWORD_FILE), as the pods of the operator have them; they are read when needed and
# never handed to the instance agent's environment (it reads the files itself).
# Secrets are never written to stdout/stderr and never passed on a command line.
set -euo pipefail

log() {
	printf '%s dbservice-entrypoint[%s]: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${ROLE:-init}" "$*" >&2
}

die() {
	log "FATAL: $*"
	exit 1
}

require_env() {
	local name
	for name in "$@"; do
		if [ -z "${!name:-}" ]; then
			die "environment variable $name must be set"
		fi
	done
}

SCRIPTS_DIR="${DBSERVICE_SCRIPTS_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
MODE="${DBSERVICE_ENTRYPOINT_MODE:-container}"
case "$MODE" in
container | standalone) ;;
*) die "DBSERVICE_ENTRYPOINT_MODE must be 'container' or 'standalone', got '$MODE'" ;;
esac

if [ -n "${PG_BIN:-}" ]; then
	export PATH="$PG_BIN:$PATH"
fi

# NAME from the file NAME_FILE names, unless NAME is set already.
password_from_file() {
	local name="$1" file_variable="${1}_FILE"
	if [ -z "${!name:-}" ] && [ -n "${!file_variable:-}" ]; then
		[ -r "${!file_variable}" ] || die "$file_variable: cannot read ${!file_variable}"
		export "$name"="$(<"${!file_variable}")"
	fi
}
password_from_file REPLICATION_PASSWORD
password_from_file APPLICATION_PASSWORD
password_from_file POSTGRES_PASSWORD
# The official docker-entrypoint.sh refuses POSTGRES_PASSWORD and POSTGRES_PASSWORD_FILE together.
SUPERUSER_PASSWORD_FILE="${POSTGRES_PASSWORD_FILE:-}"
unset POSTGRES_PASSWORD_FILE

require_env PGDATA POSTGRES_USER POSTGRES_PASSWORD REPLICATION_USER REPLICATION_PASSWORD
export PGDATA="${PGDATA%/}"
export POSTGRES_DB="${POSTGRES_DB:-$POSTGRES_USER}"
export PGPORT="${PGPORT:-5432}"
PRIMARY_PORT="${PRIMARY_PORT:-5432}"
PRIMARY_HOST="${PRIMARY_HOST:-}"
POD_NAME="${POD_NAME:-${HOSTNAME:-}}"

# The role name is interpolated into pg_hba.conf and conninfo strings: keep it a plain identifier.
if ! [[ "$REPLICATION_USER" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
	die "REPLICATION_USER must match [A-Za-z_][A-Za-z0-9_]*"
fi

# ---------------------------------------------------------------------------------------------
# Agent mode (DBSERVICE_AGENT: the instance agent, copied into the pod by the install-dbservice
# init container): the agent supervises PostgreSQL and the role comes from the primary Lease,
# never from the ordinal. This script then only initializes the first data directory, when the
# agent asks for it with the argument "initialize".
AGENT="${DBSERVICE_AGENT:-}"
ACTION="${1:-start}"
case "$ACTION" in
start | initialize) ;;
*) die "unknown argument '$ACTION' (expected start or initialize)" ;;
esac

# Role (without the agent): ordinal 0 is the primary, everything else is a standby.
ORDINAL="${POD_NAME##*-}"
if ! [[ "$ORDINAL" =~ ^[0-9]+$ ]]; then
	die "cannot derive a StatefulSet ordinal from POD_NAME '$POD_NAME'"
fi
if [ -n "$AGENT" ] || [ "$ACTION" = initialize ]; then
	ROLE=agent
elif [ "$((10#$ORDINAL))" -eq 0 ]; then
	ROLE=primary
else
	ROLE=standby
	require_env PRIMARY_HOST
fi

# ---------------------------------------------------------------------------------------------
# Official image hand-off: source its docker-entrypoint.sh (it is written to be sourced) so that
# its initdb path can run our primary-init.sh without write access to /docker-entrypoint-initdb.d.
official_entrypoint_source() {
	local official="${DOCKER_ENTRYPOINT:-}"
	if [ -z "$official" ]; then
		official="$(command -v docker-entrypoint.sh || true)"
	fi
	if [ -z "$official" ] || [ ! -r "$official" ]; then
		die "docker-entrypoint.sh of the official postgres image not found (set DBSERVICE_ENTRYPOINT_MODE=standalone outside the image)"
	fi
	# The official functions are not 'set -u' safe.
	set +u
	# shellcheck disable=SC1090
	source "$official"
	set -u
}

if [ "$MODE" = container ] && [ "$(id -u)" = 0 ]; then
	# Started as root (no runAsUser): let the official helpers fix ownership, then drop to postgres.
	official_entrypoint_source
	set +u
	docker_setup_env
	docker_create_db_directories
	set -u
	chown postgres "$(dirname "$PGDATA")" 2>/dev/null || :
	log "running as root; re-executing as user postgres"
	exec gosu postgres /bin/bash "${BASH_SOURCE[0]}" "$@"
fi
if [ "$(id -u)" = 0 ]; then
	die "PostgreSQL must not run as root; run this script as a non-root user"
fi

# ---------------------------------------------------------------------------------------------
# Server settings shared by primary and standbys (a standby may be promoted one day, and
# hot_standby only matters on standbys).
pg_major_version() {
	local v
	v="$(postgres --version)" # "postgres (PostgreSQL) 17.2 (Debian 17.2-1.pgdg120+1)"
	if [[ "$v" =~ \(PostgreSQL\)\ ([0-9]+) ]]; then
		printf '%s\n' "${BASH_REMATCH[1]}"
	fi
}

PG_MAJOR_VERSION="$(pg_major_version)"
[ -n "$PG_MAJOR_VERSION" ] || die "cannot determine the PostgreSQL major version"
WAL_KEEP_SIZE="${WAL_KEEP_SIZE:-256MB}"
PG_ARGS=(
	-c "listen_addresses=${LISTEN_ADDRESSES:-*}"
	-c wal_level=replica
	-c "max_wal_senders=${MAX_WAL_SENDERS:-10}"
	-c hot_standby=on
)
if [ "$PG_MAJOR_VERSION" -ge 13 ]; then
	PG_ARGS+=(-c "wal_keep_size=$WAL_KEEP_SIZE")
else
	PG_ARGS+=(-c "wal_keep_segments=${WAL_KEEP_SEGMENTS:-16}")
fi
if [ -n "${PG_SOCKET_DIR:-}" ]; then
	PG_ARGS+=(-c "unix_socket_directories=$PG_SOCKET_DIR")
	# local clients (psql in primary-init.sh, pg_ctl) find the server through PGHOST
	export PGHOST="$PG_SOCKET_DIR"
fi
# WAL archiving (spec.backup): the operator sets these when the pod has its binary. archive_mode=on
# archives on the primary only; standbys start archiving when promoted.
if [ -n "${DBSERVICE_ARCHIVE_COMMAND:-}" ]; then
	PG_ARGS+=(-c archive_mode=on -c "archive_command=$DBSERVICE_ARCHIVE_COMMAND" -c "archive_timeout=${DBSERVICE_ARCHIVE_TIMEOUT_SECONDS:-300}")
fi

# TLS (without the agent; the agent gives the same settings to the server it starts).
if [ -n "${TLS_DIRECTORY:-}" ]; then
	PG_ARGS+=(-c ssl=on -c "ssl_cert_file=$TLS_DIRECTORY/tls.crt" -c "ssl_key_file=$TLS_DIRECTORY/tls.key"
		-c "ssl_ca_file=$TLS_DIRECTORY/ca.crt" -c ssl_min_protocol_version=TLSv1.2)
fi

data_dir_initialized() {
	[ -s "$PGDATA/PG_VERSION" ]
}

run_primary_init() {
	log "configuring replication role and pg_hba.conf"
	bash "$SCRIPTS_DIR/primary-init.sh"
}

# ---------------------------------------------------------------------------------------------
# Standby helpers.

# conninfo value quoting: 'value' with \ and ' backslash-escaped
conninfo_quote() {
	local v="$1"
	v="${v//\\/\\\\}"
	v="${v//\'/\\\'}"
	printf "'%s'" "$v"
}

# postgresql.conf string quoting: 'value' with \ doubled and ' doubled
guc_quote() {
	local v="$1"
	v="${v//\\/\\\\}"
	v="${v//\'/\'\'}"
	printf "'%s'" "$v"
}

# (Re)write the standby configuration of data directory $1: standby.signal and primary_conninfo in
# postgresql.auto.conf (replacing the one pg_basebackup -R wrote). Done on every standby start so
# that a changed PRIMARY_HOST or REPLICATION_PASSWORD is picked up, and so that a standby can never
# come up as a second primary.
write_standby_config() {
	local dir="$1" conninfo auto tmp
	conninfo="host=$(conninfo_quote "$PRIMARY_HOST") port=$(conninfo_quote "$PRIMARY_PORT")"
	conninfo+=" user=$(conninfo_quote "$REPLICATION_USER") password=$(conninfo_quote "$REPLICATION_PASSWORD")"
	conninfo+=" application_name=$(conninfo_quote "$POD_NAME")"
	auto="$dir/postgresql.auto.conf"
	tmp="$auto.dbservice.tmp"
	(
		umask 077
		if [ -f "$auto" ]; then
			grep -v -E '^[[:space:]]*primary_conninfo[[:space:]]*=' "$auto" >"$tmp" || true
		else
			printf '# Do not edit this file manually!\n# It will be overwritten by the ALTER SYSTEM command.\n' >"$tmp"
		fi
		printf 'primary_conninfo = %s\n' "$(guc_quote "$conninfo")" >>"$tmp"
	)
	mv -f "$tmp" "$auto"
	: >>"$dir/standby.signal"
}

wait_for_primary() {
	local timeout="${PRIMARY_WAIT_TIMEOUT:-300}" start now
	start="$(date +%s)"
	log "waiting for primary $PRIMARY_HOST:$PRIMARY_PORT (up to ${timeout}s)"
	while :; do
		if pg_isready -q -h "$PRIMARY_HOST" -p "$PRIMARY_PORT" -U "$REPLICATION_USER" -d postgres -t 5; then
			log "primary is accepting connections"
			return 0
		fi
		now="$(date +%s)"
		if [ "$((now - start))" -ge "$timeout" ]; then
			die "primary $PRIMARY_HOST:$PRIMARY_PORT not ready after ${timeout}s"
		fi
		sleep 2
	done
}

bootstrap_standby() {
	local parent staging attempt max="${BASEBACKUP_ATTEMPTS:-3}"
	parent="$(dirname "$PGDATA")"
	staging="$PGDATA.bootstrap"
	mkdir -p "$parent"
	[ -w "$parent" ] || die "$parent is not writable by uid $(id -u); PGDATA must be a subdirectory of a writable volume (fsGroup)"

	# Anything in PGDATA without PG_VERSION is an interrupted bootstrap: a standby holds no data of
	# its own, so it is safe to start over.
	if [ -d "$PGDATA" ] && [ -n "$(ls -A "$PGDATA")" ]; then
		log "removing incomplete data directory contents in $PGDATA"
		find "$PGDATA" -mindepth 1 -delete
	fi

	wait_for_primary
	attempt=1
	while :; do
		rm -rf -- "$staging"
		log "cloning primary with pg_basebackup (attempt $attempt/$max)"
		# In the background + wait, so that SIGTERM (pod deletion) interrupts it.
		PGPASSWORD="$REPLICATION_PASSWORD" pg_basebackup \
			-h "$PRIMARY_HOST" -p "$PRIMARY_PORT" -U "$REPLICATION_USER" -w \
			-D "$staging" -R -X stream --checkpoint=fast &
		CHILD_PID=$!
		if wait "$CHILD_PID"; then
			CHILD_PID=
			break
		fi
		CHILD_PID=
		if [ "$attempt" -ge "$max" ]; then
			rm -rf -- "$staging"
			die "pg_basebackup failed $max times"
		fi
		attempt=$((attempt + 1))
		sleep 5
	done
	chmod 700 "$staging"
	write_standby_config "$staging"
	# Atomic hand-over: PGDATA only ever holds a complete copy.
	if [ -d "$PGDATA" ]; then
		rmdir "$PGDATA"
	fi
	mv "$staging" "$PGDATA"
	log "base backup complete"
}

# ---------------------------------------------------------------------------------------------
# Standalone initdb (tests, or plain PostgreSQL installations). The container path uses the
# official docker-entrypoint.sh instead; both run the same primary-init.sh.
standalone_init_primary() {
	log "initializing new database cluster in $PGDATA"
	mkdir -p "$PGDATA"
	chmod 700 "$PGDATA"
	# POSTGRES_INITDB_ARGS (spec.bootstrap.initdb, checked at admission to plain words) splits
	# into its options, as the official image's entrypoint splits it.
	local initdb_args=()
	read -r -a initdb_args <<<"${POSTGRES_INITDB_ARGS:-}"
	initdb -D "$PGDATA" --username="$POSTGRES_USER" \
		--pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
		--auth-local=trust --auth-host=scram-sha-256 "${initdb_args[@]}" >/dev/null
	printf '\nhost all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"

	local temp_opts=(-c "listen_addresses=" -p "$PGPORT")
	if [ -n "${PG_SOCKET_DIR:-}" ]; then
		temp_opts+=(-c "unix_socket_directories=$PG_SOCKET_DIR")
	fi
	if ! pg_ctl -D "$PGDATA" -o "$(printf '%q ' "${temp_opts[@]}")" -w -s -l "$PGDATA/init.log" start; then
		cat "$PGDATA/init.log" >&2 || :
		die "temporary server failed to start"
	fi
	psql -X -q -v ON_ERROR_STOP=1 --no-password --username "$POSTGRES_USER" --dbname postgres \
		--set db="$POSTGRES_DB" <<-'EOSQL'
		SELECT format('CREATE DATABASE %I', :'db')
		WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_database WHERE datname = :'db') \gexec
	EOSQL
	run_primary_init
	pg_ctl -D "$PGDATA" -m fast -w -s stop
	rm -f "$PGDATA/init.log"
	log "initialization complete"
}

start_postgres() {
	if [ "$MODE" = standalone ]; then
		log "starting postgres"
		exec postgres -D "$PGDATA" "${PG_ARGS[@]}"
	fi
	official_entrypoint_source
	# Run primary-init.sh right after /docker-entrypoint-initdb.d/* during the official first-boot
	# initialization (temporary socket-only server, superuser POSTGRES_USER).
	eval "dbservice_official_$(declare -f docker_process_init_files)"
	docker_process_init_files() {
		dbservice_official_docker_process_init_files "$@"
		if [ "$ROLE" = primary ]; then
			run_primary_init
		fi
	}
	log "handing over to docker-entrypoint.sh"
	set +u
	_main postgres "${PG_ARGS[@]}"
}

# First data directory in agent mode, the official image's way in container mode (its
# docker-entrypoint.sh functions, without starting the final server).
container_initialize() {
	official_entrypoint_source
	set +u
	docker_setup_env
	docker_create_db_directories
	if [ -z "$DATABASE_ALREADY_EXISTS" ]; then
		docker_verify_minimum_env
		docker_init_database_dir
		pg_setup_hba_conf
		export PGPASSWORD="${PGPASSWORD:-$POSTGRES_PASSWORD}"
		docker_temp_server_start
		docker_setup_db
		docker_process_init_files /docker-entrypoint-initdb.d/*
		run_primary_init
		docker_temp_server_stop
		unset PGPASSWORD
	fi
	set -u
}

if [ "$ACTION" = initialize ]; then
	data_dir_initialized && die "$PGDATA is initialized already"
	if [ "$MODE" = standalone ]; then
		standalone_init_primary
	else
		container_initialize
	fi
	chmod 700 "$PGDATA"
	exit 0
fi
if [ -n "$AGENT" ]; then
	[ -x "$AGENT" ] || die "instance agent $AGENT is missing (init container install-dbservice)"
	# See the primary case below: the kubelet may have re-applied fsGroup modes.
	if [ -d "$PGDATA" ]; then
		chmod 700 "$PGDATA"
	fi
	PG_BIN="$(dirname "$(command -v postgres)")"
	export PG_BIN PG_SOCKET_DIR="${PG_SOCKET_DIR:-/var/run/postgresql}" WAL_KEEP_SIZE
	export MAX_WAL_SENDERS="${MAX_WAL_SENDERS:-10}"
	log "pod $POD_NAME: handing over to the instance agent (PostgreSQL $PG_MAJOR_VERSION, mode $MODE)"
	# The agent reads the passwords from their files (NAME_FILE); PostgreSQL, which it starts,
	# must not inherit them.
	if [ -n "${REPLICATION_PASSWORD_FILE:-}" ]; then
		unset REPLICATION_PASSWORD APPLICATION_PASSWORD POSTGRES_PASSWORD
	fi
	if [ -n "$SUPERUSER_PASSWORD_FILE" ]; then
		export POSTGRES_PASSWORD_FILE="$SUPERUSER_PASSWORD_FILE"
	fi
	exec "$AGENT" instance run
fi

# ---------------------------------------------------------------------------------------------
log "pod $POD_NAME (ordinal $ORDINAL) starts as $ROLE, PostgreSQL $PG_MAJOR_VERSION, mode $MODE"
case "$ROLE" in
primary)
	if [ -e "$PGDATA/standby.signal" ]; then
		log "WARNING: $PGDATA/standby.signal exists on the primary; it will start in recovery"
	fi
	if [ "$MODE" = standalone ] && ! data_dir_initialized; then
		standalone_init_primary
	elif data_dir_initialized; then
		log "existing data directory found; skipping initialization"
	fi
	# The kubelet may re-apply fsGroup on every mount (setgid, group rwx: mode 2770), and postgres
	# refuses to start on a data directory open to its group beyond u=rwx,g=rx.
	if [ -d "$PGDATA" ]; then
		chmod 700 "$PGDATA"
	fi
	;;
standby)
	# As PID 1, bash ignores SIGTERM unless trapped: make pod deletion during the wait for the
	# primary or the base backup stop promptly (a half-done backup is discarded on the next start).
	CHILD_PID=
	trap 'log "terminated during bootstrap"; [ -z "$CHILD_PID" ] || kill -TERM "$CHILD_PID" 2>/dev/null || :; exit 143' TERM INT
	rm -rf -- "$PGDATA.bootstrap"
	if data_dir_initialized; then
		log "existing data directory found; skipping base backup"
	else
		bootstrap_standby
	fi
	write_standby_config "$PGDATA"
	chmod 700 "$PGDATA"
	;;
esac
start_postgres
