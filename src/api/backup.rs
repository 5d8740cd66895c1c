//! The backup parts of the DatabaseService API: where WAL and base backups go
//! (`spec.backup`) and how a new database is recovered from them (`spec.bootstrap.recovery`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default `archive_timeout`: the recovery point objective when the database is quiet.
pub const DEFAULT_ARCHIVE_TIMEOUT_SECONDS: i32 = 300;

/// Continuous WAL archiving and base backups to an S3-compatible object store.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// Where WAL and base backups are stored.
    pub object_store: ObjectStore,
    /// When base backups are taken: standard 5-field cron (minute hour day-of-month month
    /// day-of-week), in UTC, e.g. "0 1 * * *". No scheduled backups when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub schedule: Option<String>,
    /// Recovery window to keep, e.g. "30d", "4w" or "1m" (30 days): older base backups and the
    /// WAL no kept backup needs are deleted. Everything is kept when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub retention_policy: Option<String>,
    /// archive_timeout in seconds: a partly filled WAL segment is archived after this long, so
    /// it bounds the data lost with the whole database (RPO). Defaults to 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 86400))]
    pub archive_timeout_seconds: Option<i32>,
    /// Seconds WAL archiving may fail without a break before a Warning event
    /// (WalArchivingFailing) and a ledger entry say so; the ContinuousArchiving condition turns
    /// False at the first failure either way. Defaults to 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 86400))]
    pub archive_failure_warning_seconds: Option<i32>,
    /// Completed DatabaseServiceBackups kept; older ones are deleted with their Jobs (the
    /// backups themselves stay in the store until the retention policy removes them). Defaults to 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub successful_backups_history_limit: Option<i32>,
    /// Failed DatabaseServiceBackups kept; older ones are deleted with their Jobs. Defaults to 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub failed_backups_history_limit: Option<i32>,
}

/// Default of `archiveFailureWarningSeconds`: long enough for a store's brief outage or restart,
/// short against the hours a busy primary takes to fill pg_wal.
pub const DEFAULT_ARCHIVE_FAILURE_WARNING_SECONDS: i32 = 300;
/// Bounds of `archiveFailureWarningSeconds`.
pub const ARCHIVE_FAILURE_WARNING_SECONDS_RANGE: std::ops::RangeInclusive<i32> = 30..=86400;
/// Bounds of `archiveTimeoutSeconds`.
pub const ARCHIVE_TIMEOUT_SECONDS_RANGE: std::ops::RangeInclusive<i32> = 10..=86400;

impl BackupSpec {
    /// How long archiving may fail before the Warning event.
    pub fn archive_failure_warning(&self) -> std::time::Duration {
        let seconds = self.archive_failure_warning_seconds.unwrap_or(DEFAULT_ARCHIVE_FAILURE_WARNING_SECONDS);
        std::time::Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    }
}

/// Completed backup objects kept by default.
pub const DEFAULT_SUCCESSFUL_BACKUPS_HISTORY_LIMIT: i32 = 5;
/// Failed backup objects kept by default.
pub const DEFAULT_FAILED_BACKUPS_HISTORY_LIMIT: i32 = 3;

/// An S3-compatible bucket and the place of one database in it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStore {
    /// `http(s)://host[:port]`, without a path.
    #[schemars(length(min = 1, max = 512))]
    pub endpoint: String,
    /// Bucket name.
    #[schemars(length(min = 3, max = 63))]
    pub bucket: String,
    /// Key prefix inside the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub path: Option<String>,
    /// Directory of this database under the prefix; defaults to the DatabaseService name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub server_name: Option<String>,
    /// Signing region; defaults to us-east-1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub region: Option<String>,
    /// Secret in the DatabaseService's namespace holding the access key.
    pub credentials_secret: CredentialsSecret,
    /// Secret key holding PEM CA certificates to trust instead of the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<SecretKey>,
}

/// The Secret with the store's access key.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsSecret {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key of the access key id; defaults to "accessKeyId".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub access_key_id_key: Option<String>,
    /// Key of the secret access key; defaults to "secretAccessKey".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub secret_access_key_key: Option<String>,
}

/// One key of a Secret.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKey {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key in the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// How a new DatabaseService gets its first data.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    /// Recover from another database's backups instead of starting empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoverySpec>,
    /// Options of the new data directory when it starts empty (locale, encoding, checksums,
    /// WAL segment size); not with recovery, which copies the source's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb: Option<crate::api::postgresql::InitdbSpec>,
    /// Copy named databases from an existing PostgreSQL (any major from 9.2) once the first
    /// instance runs; not with recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<crate::api::import::ImportSpec>,
}

/// Point-in-time recovery into this (new) DatabaseService.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySpec {
    /// The store and server name holding the source database's backups and WAL.
    pub source: ObjectStore,
    /// Base backup to start from (an id from `dbservice-operator backups`); by default the
    /// latest that ended before the target. Required for xid and name targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub backup_id: Option<String>,
    /// Where to stop; the end of the archive when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<RecoveryTargetSpec>,
    /// Allow this database to archive into a path that already holds WAL (normally refused:
    /// two databases writing one archive corrupt each other's recovery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_non_empty_archive: Option<bool>,
}

/// Exactly one of the fields.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryTargetSpec {
    /// RFC 3339 time, e.g. "2026-12-01T00:30:00Z".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub time: Option<String>,
    /// LSN, e.g. "0/3000028".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 17))]
    pub lsn: Option<String>,
    /// Transaction id whose commit is the last one replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<i64>,
    /// Restore point created with pg_create_restore_point().
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub name: Option<String>,
}

impl ObjectStore {
    /// The server name this store entry resolves to for the DatabaseService `name`: the one set,
    /// else the database's own name.
    pub fn server_name_or<'a>(&'a self, name: &'a str) -> &'a str {
        self.server_name.as_deref().unwrap_or(name)
    }
}
