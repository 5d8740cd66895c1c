//! Settings of `wal-archive` and `wal-restore`: flags with environment variables, so that
//! PostgreSQL's `archive_command` stays `dbservice-operator wal-archive %p %f`. Credentials come
//! from the environment or from files of a mounted Secret; they are never printed (`hide_env_values`
//! and a redacting `Debug`).

use crate::store::client::{Addressing, S3Client, StoreError, StoreSettings};
use crate::store::compression::Compression;
use crate::store::keys::{KeyError, KeyLayout};
use crate::store::signing::AccessKey;
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where backups go and how to authenticate.
#[derive(Args, Clone)]
pub struct StoreArgs {
    /// Object store endpoint, `http(s)://host[:port]`.
    #[arg(long, env = "DBSERVICE_S3_ENDPOINT")]
    pub endpoint: String,
    /// Bucket.
    #[arg(long, env = "DBSERVICE_S3_BUCKET")]
    pub bucket: String,
    /// Key prefix inside the bucket (may be empty).
    #[arg(long, env = "DBSERVICE_S3_PATH", default_value = "")]
    pub path: String,
    /// Name of the database server: the directory of its WAL and base backups under the prefix.
    #[arg(long, env = "DBSERVICE_BACKUP_SERVER_NAME")]
    pub server_name: String,
    /// Signing region.
    #[arg(long, env = "DBSERVICE_S3_REGION", default_value = "us-east-1")]
    pub region: String,
    /// Access key id (prefer --access-key-id-file).
    #[arg(long, env = "AWS_ACCESS_KEY_ID", hide_env_values = true)]
    pub access_key_id: Option<String>,
    /// File holding the access key id (a mounted Secret key).
    #[arg(long, env = "DBSERVICE_S3_ACCESS_KEY_ID_FILE")]
    pub access_key_id_file: Option<PathBuf>,
    /// Secret access key (prefer --secret-access-key-file).
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub secret_access_key: Option<String>,
    /// File holding the secret access key (a mounted Secret key).
    #[arg(long, env = "DBSERVICE_S3_SECRET_ACCESS_KEY_FILE")]
    pub secret_access_key_file: Option<PathBuf>,
    /// PEM CA certificates to trust instead of the system's, for a store with a private CA.
    #[arg(long, env = "DBSERVICE_S3_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Bound of each request in seconds, body included.
    #[arg(long, env = "DBSERVICE_S3_TIMEOUT_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout_seconds: u64,
    /// Bound of opening a connection in seconds (default: the request's bound).
    #[arg(long, env = "DBSERVICE_S3_CONNECT_TIMEOUT_SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub connect_timeout_seconds: Option<u64>,
    /// URL form: `path` (S3-compatible servers) or `virtual-host` (AWS).
    #[arg(long, env = "DBSERVICE_S3_ADDRESSING", value_enum, default_value = "path")]
    pub addressing: Addressing,
    /// WAL compression.
    #[arg(long, env = "DBSERVICE_WAL_COMPRESSION", value_enum, default_value = "zstd")]
    pub compression: Compression,
}

impl std::fmt::Debug for StoreArgs {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("StoreArgs")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("path", &self.path)
            .field("server_name", &self.server_name)
            .field("region", &self.region)
            .field("credentials", &"<redacted>")
            .field("ca_file", &self.ca_file)
            .field("timeout_seconds", &self.timeout_seconds)
            .field("addressing", &self.addressing)
            .field("compression", &self.compression)
            .finish()
    }
}

/// Why the settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreConfigError {
    /// Neither the value nor the file of a credential is set.
    #[error("{flag} or {flag}-file is required")]
    MissingCredential {
        /// The flag, e.g. `--access-key-id`.
        flag: &'static str,
    },
    /// A credential file cannot be read (the path is printed, never the content).
    #[error("{flag}-file {path}: {error}")]
    CredentialFile {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: String,
        /// The read error.
        error: std::io::Error,
    },
    /// A bad prefix or server name.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A bad endpoint, bucket or CA file.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn credential(flag: &'static str, value: &Option<String>, file: &Option<PathBuf>) -> Result<String, StoreConfigError> {
    if let Some(path) = file {
        let content = std::fs::read_to_string(path).map_err(|error| StoreConfigError::CredentialFile {
            flag,
            path: path.display().to_string(),
            error,
        })?;
        return Ok(content.trim().to_string());
    }
    value.clone().filter(|value| !value.is_empty()).ok_or(StoreConfigError::MissingCredential { flag })
}

impl StoreArgs {
    /// The client and key layout these settings describe.
    pub fn connect(&self) -> Result<(S3Client, KeyLayout), StoreConfigError> {
        let layout = KeyLayout::new(&self.path, &self.server_name)?;
        let access_key = AccessKey {
            id: credential("--access-key-id", &self.access_key_id, &self.access_key_id_file)?,
            secret: credential("--secret-access-key", &self.secret_access_key, &self.secret_access_key_file)?,
        };
        let client = S3Client::new(StoreSettings {
            endpoint: self.endpoint.clone(),
            bucket: self.bucket.clone(),
            region: self.region.clone(),
            access_key,
            ca_file: self.ca_file.as_deref().map(Path::to_path_buf),
            timeout: Duration::from_secs(self.timeout_seconds),
            connect_timeout: self.connect_timeout_seconds.map(Duration::from_secs),
            addressing: self.addressing,
        })?;
        Ok((client, layout))
    }
}

impl StoreArgs {
    /// The flags that make `wal-restore` read this same store whatever its environment says,
    /// without a secret: credentials only as files (given as values, they stay in the
    /// environment of whoever runs the command).
    pub fn flags_without_secrets(&self) -> Vec<String> {
        let mut flags = vec![
            format!("--endpoint={}", self.endpoint),
            format!("--bucket={}", self.bucket),
            format!("--path={}", self.path),
            format!("--server-name={}", self.server_name),
            format!("--region={}", self.region),
            format!("--timeout-seconds={}", self.timeout_seconds),
        ];
        if let Some(seconds) = self.connect_timeout_seconds {
            flags.push(format!("--connect-timeout-seconds={seconds}"));
        }
        if let Some(addressing) = clap::ValueEnum::to_possible_value(&self.addressing) {
            flags.push(format!("--addressing={}", addressing.get_name()));
        }
        for (flag, file) in [
            ("--access-key-id-file", &self.access_key_id_file),
            ("--secret-access-key-file", &self.secret_access_key_file),
            ("--ca-file", &self.ca_file),
        ] {
            if let Some(file) = file {
                flags.push(format!("{flag}={}", file.display()));
            }
        }
        flags
    }
}

/// Flags of `wal-archive`.
#[derive(Debug, Args, Clone)]
pub struct WalArchiveArgs {
    /// Path of the WAL file (PostgreSQL's %p, relative to the data directory).
    #[arg(value_name = "PATH")]
    pub wal_path: PathBuf,
    /// Its file name (PostgreSQL's %f).
    pub file_name: String,
    /// Object store settings.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Flags of `wal-restore`.
#[derive(Debug, Args, Clone)]
pub struct WalRestoreArgs {
    /// Name of the WAL file wanted (PostgreSQL's %f).
    pub file_name: String,
    /// Where to write it (PostgreSQL's %p, relative to the data directory).
    #[arg(value_name = "PATH")]
    pub destination: PathBuf,
    /// Run by a standby: a gap in the archive means "not there" (the standby streams the rest
    /// from its primary), not a failed recovery.
    #[arg(long)]
    pub standby: bool,
    /// With `--standby`: a file that remembers when the store last did not answer; within
    /// [`crate::store::wal::UNANSWERED_WINDOW`] of that, the file is "not there" at once instead of
    /// after another timeout (a promotion asks for up to five files, and waited 3 s for each).
    #[arg(long, value_name = "PATH")]
    pub unanswered_mark: Option<PathBuf>,
    /// Object store settings.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Flags of `backup`: one base backup of a running server.
#[derive(Debug, Args, Clone)]
pub struct BaseBackupArgs {
    /// Server to back up (a standby by preference); the password is --password-file's, else
    /// PGPASSWORD's.
    #[arg(long, env = "PGHOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Its port.
    #[arg(long, env = "PGPORT", default_value_t = 5432)]
    pub port: u16,
    /// Role with the REPLICATION attribute.
    #[arg(long, env = "PGUSER", default_value = "postgres")]
    pub user: String,
    /// File holding --user's password (a mounted Secret key; pg_basebackup gets it as a password
    /// file of its own, never in its environment).
    #[arg(long, env = "DBSERVICE_BACKUP_PASSWORD_FILE")]
    pub password_file: Option<PathBuf>,
    /// CA file: connect with TLS and verify the server by it for its host name (libpq's
    /// variable, which pg_basebackup reads too, with PGSSLMODE=verify-full). Unset: no TLS.
    #[arg(long, env = "PGSSLROOTCERT")]
    pub ssl_root_certificate: Option<PathBuf>,
    /// The primary, where pg_switch_wal() completes the backup's last segment (default: the
    /// source when it is a primary; a standby source without it relies on archive_timeout).
    #[arg(long, env = "DBSERVICE_BACKUP_SWITCH_WAL_HOST")]
    pub switch_wal_host: Option<String>,
    /// Role for pg_switch_wal() on --switch-wal-host, which the replication role may not call
    /// (default: --user); its password comes from DBSERVICE_BACKUP_SWITCH_WAL_PASSWORD.
    #[arg(long, env = "DBSERVICE_BACKUP_SWITCH_WAL_USER")]
    pub switch_wal_user: Option<String>,
    /// After a successful backup, delete what falls outside this recovery window (e.g. 30d), as
    /// `backup-prune` does; the summary reports what was deleted or why retention failed.
    #[arg(long, env = "DBSERVICE_BACKUP_RETENTION", value_parser = parse_retention)]
    pub retention: Option<crate::store::retention::RetentionPolicy>,
    /// Also write the summary to this file (a Job's /dev/termination-log, read by the operator).
    #[arg(long, env = "DBSERVICE_BACKUP_SUMMARY_FILE")]
    pub summary_file: Option<PathBuf>,
    /// Backup id (default: the start time, YYYYMMDDTHHMMSSZ).
    #[arg(long, env = "DBSERVICE_BACKUP_ID")]
    pub backup_id: Option<String>,
    /// Directory of pg_basebackup (default: found on PATH).
    #[arg(long, env = "DBSERVICE_PG_BIN_DIR")]
    pub pg_bin_dir: Option<PathBuf>,
    /// Size of each stored chunk in MiB: the memory the backup needs.
    #[arg(long, env = "DBSERVICE_BACKUP_CHUNK_MIB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(5..=1024))]
    pub chunk_mib: u64,
    /// Seconds to wait for the backup's last WAL segment to be archived.
    #[arg(long, env = "DBSERVICE_BACKUP_WAL_WAIT_SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub wal_wait_seconds: u64,
    /// Object store settings.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Flags of `restore`: fill an empty data directory for point-in-time recovery.
#[derive(Debug, Args, Clone)]
#[command(group = clap::ArgGroup::new("target").multiple(false))]
pub struct RestoreArgs {
    /// Data directory to fill; must be empty or absent.
    #[arg(long, env = "PGDATA")]
    pub pgdata: PathBuf,
    /// Backup to start from (default: the latest that ended before the target).
    #[arg(long, env = "DBSERVICE_RESTORE_BACKUP_ID")]
    pub backup_id: Option<String>,
    /// Recover up to this time (RFC 3339, e.g. 2026-12-01T00:30:00Z).
    #[arg(long, group = "target", env = "DBSERVICE_RESTORE_TARGET_TIME")]
    pub target_time: Option<String>,
    /// Recover up to this LSN (e.g. 0/3000028).
    #[arg(long, group = "target", env = "DBSERVICE_RESTORE_TARGET_LSN")]
    pub target_lsn: Option<String>,
    /// Recover up to the commit of this transaction id (needs --backup-id).
    #[arg(long, group = "target", env = "DBSERVICE_RESTORE_TARGET_XID")]
    pub target_xid: Option<u64>,
    /// Recover up to this restore point (needs --backup-id).
    #[arg(long, group = "target", env = "DBSERVICE_RESTORE_TARGET_NAME")]
    pub target_name: Option<String>,
    /// Binary PostgreSQL runs as restore_command (default: this one).
    #[arg(long, env = "DBSERVICE_RESTORE_COMMAND_BINARY")]
    pub restore_command_binary: Option<PathBuf>,
    /// Object store settings.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Flags of `backup-list`: the backups in the store and the recoverable window.
#[derive(Debug, Args, Clone)]
pub struct ListBackupsArgs {
    /// Object store settings.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Flags of `backup-prune`: enforce a retention policy on the store.
#[derive(Debug, Args, Clone)]
pub struct PruneBackupsArgs {
    /// Recovery window to keep, e.g. 30d, 4w or 1m (30 days).
    #[arg(long, env = "DBSERVICE_BACKUP_RETENTION", value_parser = parse_retention)]
    pub retention: crate::store::retention::RetentionPolicy,
    /// Evaluate the window at this time (RFC 3339) instead of now: shows what a later run deletes.
    #[arg(long, value_parser = parse_time)]
    pub at: Option<chrono::DateTime<chrono::Utc>>,
    /// Print what would be deleted, delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Object store settings.
    #[command(flatten)]
    pub store: StoreArgs,
}

fn parse_retention(value: &str) -> Result<crate::store::retention::RetentionPolicy, String> {
    value.parse().map_err(|error: crate::store::retention::ParseRetentionError| error.to_string())
}

fn parse_time(value: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(value)
        .map(|time| time.with_timezone(&chrono::Utc))
        .map_err(|error| format!("{value:?} is not an RFC 3339 time: {error}"))
}

#[cfg(test)]
mod tests {
    use crate::cli::{Cli, Command};
    use clap::{CommandFactory, Parser};

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn postgres_placeholders_parse_and_secrets_stay_hidden() {
        let cli = Cli::try_parse_from([
            "dbservice-operator",
            "wal-archive",
            "pg_wal/000000010000000000000001",
            "000000010000000000000001",
            "--endpoint=http://127.0.0.1:9000",
            "--bucket=b",
            "--server-name=orders",
            "--access-key-id=AKID",
            "--secret-access-key=very-secret",
        ])
        .unwrap();
        let Some(Command::WalArchive(args)) = cli.command else { panic!("not wal-archive") };
        assert_eq!(args.file_name, "000000010000000000000001");
        assert_eq!(args.wal_path, std::path::PathBuf::from("pg_wal/000000010000000000000001"));
        assert!(!format!("{args:?}").contains("very-secret"));
        assert!(args.store.connect().is_ok());
    }

    #[test]
    fn missing_credentials_are_named() {
        let cli = Cli::try_parse_from([
            "dbservice-operator",
            "wal-restore",
            "000000010000000000000001",
            "RECOVERYXLOG",
            "--endpoint=http://127.0.0.1:9000",
            "--bucket=b",
            "--server-name=orders",
            "--access-key-id-file=/nonexistent/id",
        ])
        .unwrap();
        let Some(Command::WalRestore(args)) = cli.command else { panic!("not wal-restore") };
        let error = args.store.connect().err().expect("unreadable credential file");
        assert_eq!(error.to_string().split(':').next(), Some("--access-key-id-file /nonexistent/id"));
    }
}
