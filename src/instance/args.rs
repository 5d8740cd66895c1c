//! Flags of the commands that run inside a database pod (`instance ...`, `install-binary`); the
//! pod template sets most of them through the environment.

use clap::{Args, Subcommand};
use std::path::PathBuf;

/// Flags of `install-binary`.
#[derive(Debug, Args, Clone)]
pub struct InstallBinaryArgs {
    /// Directory to put `dbservice-operator` in.
    pub directory: PathBuf,
}

/// Flags of `instance`.
#[derive(Debug, Args, Clone)]
pub struct InstanceArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: InstanceCommand,
}

/// Subcommands of `instance`.
// Parsed once at start-up: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand, Clone)]
pub enum InstanceCommand {
    /// Print the local PostgreSQL's role, timeline and WAL positions as one JSON line.
    Status(InstanceStatusArgs),
    /// Supervise PostgreSQL in its pod: role from the primary Lease, report on the pod, promote,
    /// demote, rewind, fence (the postgres container's main process).
    Run(InstanceRunArgs),
    /// Kill the local PostgreSQL at the primary Lease's fence deadline the agent writes into a
    /// file (started by `instance run`, never by hand).
    Watchdog(InstanceWatchdogArgs),
}

/// Flags of `instance watchdog`.
#[derive(Debug, Args, Clone)]
pub struct InstanceWatchdogArgs {
    /// The file the agent arms and disarms.
    #[arg(long)]
    pub fence_file: PathBuf,
}

/// Flags of `instance run` (the pod template sets them through the environment).
#[derive(Debug, Args, Clone)]
pub struct InstanceRunArgs {
    /// This instance: the pod's name.
    #[arg(long, env = "POD_NAME")]
    pub pod: String,
    /// Namespace of the pod and its DatabaseService.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// Name of the DatabaseService.
    #[arg(long, env = "DBSERVICE_DATABASE")]
    pub database: String,
    /// Data directory.
    #[arg(long, env = "PGDATA")]
    pub pgdata: PathBuf,
    /// Directory of postgres, pg_ctl, pg_rewind, pg_basebackup and pg_controldata.
    #[arg(long, env = "PG_BIN", default_value = "/usr/lib/postgresql/15/bin")]
    pub pg_bin: PathBuf,
    /// PostgreSQL port.
    #[arg(long, env = "PGPORT", default_value_t = 5432)]
    pub port: u16,
    /// Unix socket directory.
    #[arg(long, env = "PG_SOCKET_DIR", default_value = "/var/run/postgresql")]
    pub socket_dir: PathBuf,
    /// Superuser of the local connection (over the socket).
    #[arg(long, env = "POSTGRES_USER")]
    pub superuser: String,
    /// Role standbys stream, clone and rewind with (its password: the file REPLICATION_PASSWORD_FILE
    /// names, or REPLICATION_PASSWORD; never a flag).
    #[arg(long, env = "REPLICATION_USER")]
    pub replication_user: String,
    /// Directory of the server certificate (tls.crt, tls.key, ca.crt): TLS on, and every
    /// connection to a peer verified by ca.crt. Unset: no TLS.
    #[arg(long, env = "TLS_DIRECTORY")]
    pub tls_directory: Option<PathBuf>,
    /// wal_keep_size: WAL kept for standbys and for pg_rewind.
    #[arg(long, env = "WAL_KEEP_SIZE", default_value = "256MB")]
    pub wal_keep_size: String,
    /// max_wal_senders.
    #[arg(long, env = "MAX_WAL_SENDERS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_wal_senders: u32,
    /// Script run as `bash SCRIPT initialize` to create the first data directory (initdb).
    #[arg(long, env = "DBSERVICE_INITIALIZE_SCRIPT", default_value = "/scripts/entrypoint.sh")]
    pub initialize_script: PathBuf,
    /// Milliseconds between two agent steps (local checks; API reads of the DatabaseService).
    #[arg(long, env = "DBSERVICE_INSTANCE_TICK_MILLISECONDS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(100..=10_000))]
    pub tick_milliseconds: u64,
    /// Primary Lease duration in seconds.
    #[arg(long, env = "DBSERVICE_PRIMARY_LEASE_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(3..=300))]
    pub lease_seconds: u64,
    /// Primary Lease renew deadline in seconds (the holder fences itself after it).
    #[arg(long, env = "DBSERVICE_PRIMARY_RENEW_DEADLINE_SECONDS", default_value_t = 7, value_parser = clap::value_parser!(u64).range(2..=300))]
    pub renew_deadline_seconds: u64,
    /// Address of `/metrics` (PostgreSQL in Prometheus, OpenMetrics).
    #[arg(long, env = "DBSERVICE_METRICS_ADDRESS", default_value = "0.0.0.0:9187")]
    pub metrics_address: std::net::SocketAddr,
    /// Primary Lease renew period in seconds: the only periodic API write of a database.
    #[arg(long, env = "DBSERVICE_PRIMARY_RENEW_PERIOD_SECONDS", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub renew_period_seconds: u64,
}

/// Flags of `instance status`.
#[derive(Debug, Args, Clone)]
pub struct InstanceStatusArgs {
    /// Unix socket directory of the local server.
    #[arg(long, env = "PG_SOCKET_DIR", default_value = "/var/run/postgresql")]
    pub socket_dir: PathBuf,
    /// Port of the local server.
    #[arg(long, env = "PGPORT", default_value_t = 5432)]
    pub port: u16,
    /// Role to connect as (local trust or peer authentication).
    #[arg(long, env = "POSTGRES_USER", default_value = "postgres")]
    pub user: String,
    /// Seconds to wait for an answer.
    #[arg(long, env = "DBSERVICE_INSTANCE_TIMEOUT_SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub timeout_seconds: u64,
}
