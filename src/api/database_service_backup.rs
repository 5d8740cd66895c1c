//! The `DatabaseServiceBackup` custom resource (`dbservice.dev/v1`): one base backup of a
//! DatabaseService, taken by a Kubernetes Job. The Rust types are the single source of truth for
//! its CRD ([`custom_resource_definition`]).

use crate::api::crd::{cap_sizes, known_integer_formats, strip_nulls};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// One base backup of a DatabaseService in the same namespace. The spec is immutable: a new
/// backup is a new object.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "dbservice.dev",
    version = "v1",
    kind = "DatabaseServiceBackup",
    plural = "databaseservicebackups",
    shortname = "dbsbackup",
    namespaced,
    status = "DatabaseServiceBackupStatus",
    printcolumn = r#"{"name":"Database","type":"string","jsonPath":".spec.databaseService"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Backup","type":"string","jsonPath":".status.backupId"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseServiceBackupSpec {
    /// Name of the DatabaseService to back up (same namespace); it needs `spec.backup`.
    #[schemars(length(min = 1, max = 63))]
    pub database_service: String,
    /// Instance to copy: `standby` (the default; the primary when there is no standby) or
    /// `primary`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<BackupTarget>,
}

/// The instance a backup copies.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum BackupTarget {
    /// A standby: the primary's CPU and disk are spared.
    #[default]
    Standby,
    /// The primary.
    Primary,
}

/// Where a backup stands.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum BackupPhase {
    /// Waiting: for another backup of the same database to finish, or for its Job to be created.
    Pending,
    /// The Job runs.
    Running,
    /// The backup is in the object store; the status holds its manifest.
    Completed,
    /// The backup failed; the message says why.
    Failed,
}

impl BackupPhase {
    /// Completed or Failed: nothing more happens to the backup.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed)
    }
}

impl std::fmt::Display for BackupPhase {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Completed => "Completed",
            Self::Failed => "Failed",
        })
    }
}

/// What the backup became (from the manifest the Job reports in its termination message).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseServiceBackupStatus {
    /// Pending, Running, Completed or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,
    /// The Job taking the backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub job_name: Option<String>,
    /// Backup id in the object store (use it in `bootstrap.recovery.backupId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub backup_id: Option<String>,
    /// Server name (directory) in the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub server_name: Option<String>,
    /// First WAL segment the backup needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 24))]
    pub begin_wal: Option<String>,
    /// Last WAL segment the backup needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 24))]
    pub end_wal: Option<String>,
    /// LSN where the backup starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 17))]
    pub begin_lsn: Option<String>,
    /// LSN where the backup is consistent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 17))]
    pub end_lsn: Option<String>,
    /// When the backup started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub start_time: Option<String>,
    /// When the backup ended (RFC 3339): the earliest point it can recover to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub end_time: Option<String>,
    /// Timeline of the backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
    /// PostgreSQL major version of the server backed up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_major_version: Option<i64>,
    /// Size of the data directory copied, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Bytes stored after compression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<i64>,
    /// Whether a standby was copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_standby: Option<bool>,
    /// What happened, in words (the failure's cause when Failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub message: Option<String>,
}

/// The backup CRD, with the spec immutable by CEL and every field size-capped.
pub fn custom_resource_definition() -> CustomResourceDefinition {
    let mut definition = serde_json::to_value(DatabaseServiceBackup::crd()).expect("the CRD serializes");
    let root = &mut definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    root["properties"]["spec"]["x-kubernetes-validations"] =
        json!([{"rule": "self == oldSelf", "message": "a backup's spec is immutable; create a new backup"}]);
    cap_sizes(&mut root["properties"]["spec"]);
    cap_sizes(&mut root["properties"]["status"]);
    strip_nulls(&mut definition);
    known_integer_formats(&mut definition);
    serde_json::from_value(definition).expect("the amended CRD deserializes")
}

/// Only the backup CRD's `.spec` as YAML: the chart wraps it with its own metadata.
pub fn crd_spec_yaml() -> String {
    crate::api::yaml::to_string(&custom_resource_definition().spec).expect("the CRD spec serializes to YAML")
}

/// The backup CRD as YAML.
pub fn crd_yaml() -> String {
    crate::api::yaml::to_string(&custom_resource_definition()).expect("the CRD serializes to YAML")
}
