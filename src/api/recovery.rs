//! Recovery into a new DatabaseService (`spec.bootstrap.recovery`): the contract between the
//! operator and the pod that restores. The plan travels in one environment variable (no secret:
//! the source's credentials are files of an optional Secret volume); the instance agent reports
//! its progress ([`RecoveryStatus`]) in the pod annotation [`RECOVERY_ANNOTATION`], which the
//! operator copies into `status.recovery`. The agent's procedure is `instance::recovery`; the pod
//! decoration is `operator::database::build::recovery`.

use crate::api::backup::{BootstrapSpec, ObjectStore, RecoveryTargetSpec};
use kube::ResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Environment variable holding the [`RecoveryPlan`] as JSON.
pub const RECOVERY_PLAN_VARIABLE: &str = "DBSERVICE_RECOVERY_PLAN";
/// Pod annotation where the agent that restores writes its [`RecoveryStatus`] as JSON.
pub const RECOVERY_ANNOTATION: &str = "dbservice.dev/recovery";
/// Where the source store's access key files are in the pod.
pub const CREDENTIALS_DIRECTORY: &str = "/dbservice/recovery-credentials";
/// Where the source store's CA file is in the pod.
pub const CA_DIRECTORY: &str = "/dbservice/recovery-ca";
/// Name of the CA file in [`CA_DIRECTORY`].
pub const CA_FILE: &str = "ca.crt";

/// What the first instance of a recovered database restores: the source store (its server name
/// resolved), the backup and the target. No secret: the credentials are files.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryPlan {
    /// The source store, with `serverName` set.
    pub source: ObjectStore,
    /// The base backup to start from, when the spec names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
    /// Where to stop; the end of the archive when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<RecoveryTargetSpec>,
}

impl RecoveryPlan {
    /// The plan of the DatabaseService `name` with `bootstrap`, when it recovers from a backup.
    pub fn of(bootstrap: Option<&BootstrapSpec>, name: &str) -> Option<Self> {
        let recovery = bootstrap?.recovery.as_ref()?;
        let mut source = recovery.source.clone();
        source.server_name = Some(recovery.source.server_name_or(name).to_string());
        Some(RecoveryPlan { source, backup_id: recovery.backup_id.clone(), target: recovery.target.clone() })
    }

    /// One line for messages: "time 2026-12-01T00:30:00Z", "latest".
    pub fn target_description(&self) -> String {
        let Some(target) = &self.target else { return "latest".into() };
        match (&target.time, &target.lsn, target.xid, &target.name) {
            (Some(time), ..) => format!("time {time}"),
            (_, Some(lsn), ..) => format!("lsn {lsn}"),
            (_, _, Some(xid), _) => format!("xid {xid}"),
            (_, _, _, Some(name)) => format!("restore point {name}"),
            _ => "latest".into(),
        }
    }
}

/// Where a recovery stands.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RecoveryPhase {
    /// The base backup is being restored.
    Restoring,
    /// PostgreSQL replays the source's WAL up to the target.
    Replaying,
    /// Promoted at the target; the database runs on its own.
    Completed,
    /// The last attempt failed; the agent tries again after a pause (see `error`).
    Failed,
}

/// Progress and outcome of a recovery (`status.recovery`, reported by the restoring instance).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryStatus {
    /// Where the recovery stands.
    pub phase: RecoveryPhase,
    /// Instance that restores.
    pub instance: String,
    /// Target, e.g. "time 2026-12-01T00:30:00Z" or "latest".
    pub target: String,
    /// Base backup restored (once chosen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
    /// Attempts so far (1 for the first).
    pub attempt: u32,
    /// When the attempt began (RFC 3339).
    pub started_at: String,
    /// When the base backup was unpacked (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_at: Option<String>,
    /// When the database was promoted at the target (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// Uncompressed size of the base backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_bytes: Option<u64>,
    /// Seconds spent unpacking the base backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_seconds: Option<f64>,
    /// Seconds spent replaying WAL up to the target and promoting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_seconds: Option<f64>,
    /// Why the last attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RecoveryStatus {
    /// Restore throughput in MiB/s, once known.
    pub fn restore_mib_per_second(&self) -> Option<f64> {
        let (bytes, seconds) = (self.restored_bytes?, self.restore_seconds?);
        (seconds > 0.0).then(|| bytes as f64 / 1_048_576.0 / seconds)
    }
}

/// The report of the pods (the restoring one's annotation), if any.
pub fn reported(pods: &[std::sync::Arc<k8s_openapi::api::core::v1::Pod>]) -> Option<RecoveryStatus> {
    pods.iter()
        .filter_map(|pod| pod.annotations().get(RECOVERY_ANNOTATION))
        .filter_map(|text| serde_json::from_str::<RecoveryStatus>(text).ok())
        .max_by(|left, right| left.started_at.cmp(&right.started_at))
}

/// Default pause after a failed attempt, doubled each time up to [`MAX_RETRY_PAUSE`].
pub const FIRST_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(15);
/// Longest pause between two attempts.
pub const MAX_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(600);

/// Pause after the failed attempt number `attempt` (1 for the first).
pub fn retry_pause(attempt: u32) -> std::time::Duration {
    FIRST_RETRY_PAUSE.saturating_mul(1 << attempt.saturating_sub(1).min(10)).min(MAX_RETRY_PAUSE)
}

/// The staging directory a restore fills before it becomes `pgdata` (same volume, so the final
/// rename is atomic: `pgdata` only ever holds a complete, recovered copy).
pub fn staging_directory(pgdata: &Path) -> PathBuf {
    let mut name = pgdata.file_name().unwrap_or_default().to_os_string();
    name.push(".recovery");
    pgdata.with_file_name(name)
}

/// Condition type of a recovered database: True once it was promoted at its target.
pub const RECOVERED_CONDITION: &str = "Recovered";

/// Whether the pod reports a recovery still under way (restoring, replaying, or waiting to try
/// again): it is not ready on purpose, and restarting it would only start the restore over.
pub fn recovering(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.annotations()
        .get(RECOVERY_ANNOTATION)
        .and_then(|text| serde_json::from_str::<RecoveryStatus>(text).ok())
        .is_some_and(|status| status.phase != RecoveryPhase::Completed)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::backup::{CredentialsSecret, RecoverySpec, SecretKey};
    use crate::api::database_service::DatabaseService;

    /// A DatabaseService `restored` that recovers from store `prod` of server `orders` to `target`.
    pub(crate) fn recovering(target: Option<RecoveryTargetSpec>) -> DatabaseService {
        let mut database = DatabaseService::new("restored", Default::default());
        database.spec.bootstrap = Some(BootstrapSpec {
            initdb: None,
            import: None,
            recovery: Some(RecoverySpec {
                source: ObjectStore {
                    endpoint: "http://10.85.0.1:9000".into(),
                    bucket: "backups".into(),
                    path: Some("prod".into()),
                    server_name: Some("orders".into()),
                    credentials_secret: CredentialsSecret {
                        name: "source-s3".into(),
                        access_key_id_key: Some("id".into()),
                        ..Default::default()
                    },
                    ca_secret: Some(SecretKey { name: "source-ca".into(), key: "root.pem".into() }),
                    ..Default::default()
                },
                backup_id: None,
                target,
                allow_non_empty_archive: None,
            }),
        });
        database
    }

    #[test]
    fn the_server_name_defaults_to_the_new_database_and_latest_is_the_default_target() {
        let mut database = recovering(None);
        database.spec.bootstrap.as_mut().unwrap().recovery.as_mut().unwrap().source.server_name = None;
        let plan = RecoveryPlan::of(database.spec.bootstrap.as_ref(), "restored").unwrap();
        assert_eq!(plan.source.server_name.as_deref(), Some("restored"));
        assert_eq!(plan.target_description(), "latest");
    }

    #[test]
    fn retries_back_off_up_to_ten_minutes() {
        assert_eq!(retry_pause(1).as_secs(), 15);
        assert_eq!(retry_pause(2).as_secs(), 30);
        assert_eq!(retry_pause(7).as_secs(), 600);
        assert_eq!(retry_pause(u32::MAX).as_secs(), 600);
        assert_eq!(
            staging_directory(Path::new("/var/lib/postgresql/data/pgdata")),
            PathBuf::from("/var/lib/postgresql/data/pgdata.recovery")
        );
    }
}
