//! Recovery into a new DatabaseService (`spec.bootstrap.recovery`), the pure parts: what the pods
//! get (the plan in one environment variable, the source's credentials as files of an optional
//! Secret volume), and what the instance agent reports while it restores
//! ([`RecoveryStatus`], the pod annotation [`RECOVERY_ANNOTATION`] copied into
//! `status.recovery`). The agent's procedure is `instance::recovery`.

use crate::api::DatabaseService;
use crate::backup::config::{RestoreArgs, StoreArgs};
use crate::backup::spec::{ObjectStore, RecoveryTargetSpec};
use crate::backup::validation::server_name;
use crate::controller::build::plain_env;
use k8s_openapi::api::core::v1::{KeyToPath, PodSpec, SecretVolumeSource, Volume, VolumeMount};
use kube::ResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Environment variable holding the [`RecoveryPlan`] as JSON.
pub const RECOVERY_PLAN_VARIABLE: &str = "DBSERVICE_RECOVERY_PLAN";
/// Pod annotation where the agent that restores writes its [`RecoveryStatus`] as JSON.
pub const RECOVERY_ANNOTATION: &str = "dbservice.dev/recovery";
const CREDENTIALS_VOLUME: &str = "dbservice-recovery-credentials";
/// Where the source store's access key files are in the pod.
pub const CREDENTIALS_DIRECTORY: &str = "/dbservice/recovery-credentials";
const CA_VOLUME: &str = "dbservice-recovery-ca";
const CA_DIRECTORY: &str = "/dbservice/recovery-ca";
const CA_FILE: &str = "ca.crt";

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
    /// The plan of `database`, when it recovers from a backup.
    pub fn of(database: &DatabaseService) -> Option<Self> {
        let recovery = database.spec.bootstrap.as_ref()?.recovery.as_ref()?;
        let name = database.name_any();
        let mut source = recovery.source.clone();
        source.server_name = Some(server_name(&recovery.source, &name).to_string());
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

    /// The `restore` settings of this plan for the data directory `pgdata`, with the credentials
    /// files under `credentials_directory` (and the CA under `ca_directory`) as the pod mounts them.
    pub fn restore_args(
        &self,
        pgdata: &Path,
        binary: &Path,
        credentials_directory: &Path,
        ca_directory: &Path,
    ) -> RestoreArgs {
        let source = &self.source;
        let target = self.target.clone().unwrap_or_default();
        RestoreArgs {
            pgdata: pgdata.to_path_buf(),
            backup_id: self.backup_id.clone(),
            target_time: target.time,
            target_lsn: target.lsn,
            target_xid: target.xid.and_then(|xid| u64::try_from(xid).ok()),
            target_name: target.name,
            restore_command_binary: Some(binary.to_path_buf()),
            store: StoreArgs {
                endpoint: source.endpoint.clone(),
                bucket: source.bucket.clone(),
                path: source.path.clone().unwrap_or_default(),
                server_name: source.server_name.clone().unwrap_or_default(),
                region: source.region.clone().unwrap_or_else(|| "us-east-1".into()),
                access_key_id: None,
                access_key_id_file: Some(credentials_directory.join("accessKeyId")),
                secret_access_key: None,
                secret_access_key_file: Some(credentials_directory.join("secretAccessKey")),
                ca_file: source.ca_secret.as_ref().map(|_| ca_directory.join(CA_FILE)),
                timeout_seconds: 60,
                addressing: crate::backup::client::Addressing::Path,
                compression: crate::backup::compression::Compression::Zstd,
            },
        }
    }

    /// [`RecoveryPlan::restore_args`] with the pod's mount points.
    pub fn restore_args_in_pod(&self, pgdata: &Path, binary: &Path) -> RestoreArgs {
        self.restore_args(pgdata, binary, Path::new(CREDENTIALS_DIRECTORY), Path::new(CA_DIRECTORY))
    }
}

fn secret_volume(name: &str, secret: &str, items: Vec<(String, &str)>) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items: Some(
                items
                    .into_iter()
                    .map(|(key, path)| KeyToPath { key, path: path.into(), ..Default::default() })
                    .collect(),
            ),
            default_mode: Some(0o440),
            // Only the first start of the first instance reads it: a source Secret deleted after the
            // recovery must not keep the pods from starting.
            optional: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Adds the recovery plan and the source's credentials (and CA) to a pod whose first container
/// runs the instance agent. Nothing changes without `spec.bootstrap.recovery`.
pub fn add_recovery(pod: &mut PodSpec, database: &DatabaseService) {
    let Some(plan) = RecoveryPlan::of(database) else { return };
    let credentials = &plan.source.credentials_secret;
    let mut volumes = vec![secret_volume(
        CREDENTIALS_VOLUME,
        &credentials.name,
        vec![
            (credentials.access_key_id_key.clone().unwrap_or_else(|| "accessKeyId".into()), "accessKeyId"),
            (credentials.secret_access_key_key.clone().unwrap_or_else(|| "secretAccessKey".into()), "secretAccessKey"),
        ],
    )];
    let mut mounts = vec![VolumeMount {
        name: CREDENTIALS_VOLUME.into(),
        mount_path: CREDENTIALS_DIRECTORY.into(),
        read_only: Some(true),
        ..Default::default()
    }];
    if let Some(ca) = &plan.source.ca_secret {
        volumes.push(secret_volume(CA_VOLUME, &ca.name, vec![(ca.key.clone(), CA_FILE)]));
        mounts.push(VolumeMount {
            name: CA_VOLUME.into(),
            mount_path: CA_DIRECTORY.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    pod.volumes.get_or_insert_with(Vec::new).extend(volumes);
    if let Some(postgres) = pod.containers.first_mut() {
        postgres.volume_mounts.get_or_insert_with(Vec::new).extend(mounts);
        let plan = serde_json::to_string(&plan).expect("a plan serializes");
        postgres.env.get_or_insert_with(Vec::new).push(plain_env(RECOVERY_PLAN_VARIABLE, plan));
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

fn summary(status: &RecoveryStatus) -> String {
    let backup = status.backup_id.as_deref().unwrap_or("(being chosen)");
    match status.phase {
        RecoveryPhase::Restoring => {
            format!(
                "{} restores base backup {backup} (attempt {}) to reach {}",
                status.instance, status.attempt, status.target
            )
        }
        RecoveryPhase::Replaying => format!(
            "{} replays the source's WAL from base backup {backup} up to {} (restored {:.1} MiB in {:.1} s)",
            status.instance,
            status.target,
            status.restored_bytes.unwrap_or(0) as f64 / 1_048_576.0,
            status.restore_seconds.unwrap_or(0.0)
        ),
        RecoveryPhase::Completed => format!(
            "recovered to {} from base backup {backup}: restore {:.1} s ({:.1} MiB/s), replay and promotion {:.1} s",
            status.target,
            status.restore_seconds.unwrap_or(0.0),
            status.restore_mib_per_second().unwrap_or(0.0),
            status.replay_seconds.unwrap_or(0.0)
        ),
        RecoveryPhase::Failed => format!(
            "recovery attempt {} to {} failed: {}; trying again after a pause",
            status.attempt,
            status.target,
            status.error.as_deref().unwrap_or("unknown error")
        ),
    }
}

/// Copies what the restoring pod reports into `status.recovery` and the Recovered condition, and
/// journals each new phase: the begin and the end of each attempt into the ledger, a failure as a
/// Warning event. A report that disappeared (the pod was replaced) leaves the status as it was.
pub fn decide_recovery(
    status: &mut crate::api::DatabaseServiceStatus,
    reported: Option<RecoveryStatus>,
    generation: i64,
    now: chrono::DateTime<chrono::Utc>,
    journal: &mut crate::controller::journal::Journal,
) {
    use crate::controller::conditions;
    use crate::controller::ledger::LedgerEntry;
    let Some(reported) = reported else { return };
    let previous = status.recovery.as_ref();
    if previous == Some(&reported) {
        return;
    }
    let new_attempt = previous.is_none_or(|previous| previous.attempt != reported.attempt);
    let new_step = new_attempt || previous.is_some_and(|previous| previous.phase != reported.phase);
    let message = summary(&reported);
    let entry = |time: chrono::DateTime<chrono::Utc>, action: &str, outcome: &str| {
        let backup = reported.backup_id.clone().unwrap_or_default();
        LedgerEntry::at(time, generation, action, backup, reported.target.clone(), outcome)
    };
    if new_attempt {
        // A fast attempt may be seen only once it is over: its begin is still journaled, at the
        // time the agent reported.
        let started = chrono::DateTime::parse_from_rfc3339(&reported.started_at)
            .map_or(now, |time| time.with_timezone(&chrono::Utc));
        let note = format!("{} began recovery attempt {} to {}", reported.instance, reported.attempt, reported.target);
        journal.record(false, "RecoveryStarted", note.clone(), Some(entry(started, "RecoveryStarted", &note)));
    }
    if new_step {
        match reported.phase {
            RecoveryPhase::Restoring => {}
            RecoveryPhase::Replaying => journal.record(false, "RecoveryReplaying", message.clone(), None),
            RecoveryPhase::Completed => {
                let outcome = format!(
                    "{message}; began {}, completed {}",
                    reported.started_at,
                    reported.completed_at.as_deref().unwrap_or("(not reported)")
                );
                journal.record(
                    false,
                    "RecoveryCompleted",
                    message.clone(),
                    Some(entry(now, "RecoveryCompleted", &outcome)),
                );
            }
            RecoveryPhase::Failed => {
                journal.record(true, "RecoveryFailed", message.clone(), Some(entry(now, "RecoveryFailed", &message)))
            }
        }
    }
    let (done, reason) = match reported.phase {
        RecoveryPhase::Restoring => (false, "Restoring"),
        RecoveryPhase::Replaying => (false, "Replaying"),
        RecoveryPhase::Completed => (true, "Completed"),
        RecoveryPhase::Failed => (false, "RecoveryFailed"),
    };
    conditions::set(&mut status.conditions, RECOVERED_CONDITION, done, reason, message, Some(generation), now);
    status.recovery = Some(reported);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::spec::{BootstrapSpec, CredentialsSecret, RecoverySpec, SecretKey};

    fn recovering(target: Option<RecoveryTargetSpec>) -> DatabaseService {
        let mut database = DatabaseService::new("restored", Default::default());
        database.spec.bootstrap = Some(BootstrapSpec {
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
    fn the_pod_gets_the_plan_and_the_source_credentials_as_files() {
        let target = RecoveryTargetSpec { time: Some("2026-12-01T00:30:00Z".into()), ..Default::default() };
        let database = recovering(Some(target));
        let mut pod = PodSpec { containers: vec![Default::default()], ..Default::default() };
        add_recovery(&mut pod, &database);
        let env = pod.containers[0].env.clone().unwrap();
        assert_eq!(env.len(), 1);
        let plan: RecoveryPlan = serde_json::from_str(env[0].value.as_deref().unwrap()).unwrap();
        assert_eq!(plan.target_description(), "time 2026-12-01T00:30:00Z");
        let volumes = pod.volumes.unwrap();
        let credentials = volumes[0].secret.as_ref().unwrap();
        assert_eq!(credentials.secret_name.as_deref(), Some("source-s3"));
        assert_eq!(credentials.optional, Some(true));
        let items = credentials.items.as_ref().unwrap();
        assert_eq!((items[0].key.as_str(), items[0].path.as_str()), ("id", "accessKeyId"));
        assert_eq!((items[1].key.as_str(), items[1].path.as_str()), ("secretAccessKey", "secretAccessKey"));
        assert_eq!(volumes[1].secret.as_ref().unwrap().secret_name.as_deref(), Some("source-ca"));

        let args = plan.restore_args_in_pod(Path::new("/data/pgdata.recovery"), Path::new("/dbservice/bin/x"));
        assert_eq!(args.target_time.as_deref(), Some("2026-12-01T00:30:00Z"));
        assert_eq!(args.store.server_name, "orders");
        assert_eq!(args.store.access_key_id_file, Some(PathBuf::from("/dbservice/recovery-credentials/accessKeyId")));
        assert_eq!(args.store.ca_file, Some(PathBuf::from("/dbservice/recovery-ca/ca.crt")));
        assert!(!format!("{args:?}").contains("secret-value"));
    }

    #[test]
    fn without_recovery_the_pod_is_unchanged() {
        let database = DatabaseService::new("plain", Default::default());
        let mut pod = PodSpec { containers: vec![Default::default()], ..Default::default() };
        add_recovery(&mut pod, &database);
        assert_eq!(pod, PodSpec { containers: vec![Default::default()], ..Default::default() });
    }

    #[test]
    fn the_server_name_defaults_to_the_new_database_and_latest_is_the_default_target() {
        let mut database = recovering(None);
        database.spec.bootstrap.as_mut().unwrap().recovery.as_mut().unwrap().source.server_name = None;
        let plan = RecoveryPlan::of(&database).unwrap();
        assert_eq!(plan.source.server_name.as_deref(), Some("restored"));
        assert_eq!(plan.target_description(), "latest");
    }

    fn report(phase: RecoveryPhase, attempt: u32) -> RecoveryStatus {
        RecoveryStatus {
            phase,
            instance: "restored-0".into(),
            target: "time 2026-12-01T00:30:00Z".into(),
            backup_id: Some("20261201T000000Z".into()),
            attempt,
            started_at: "2026-12-01T01:00:00.000Z".into(),
            restored_at: None,
            completed_at: None,
            restored_bytes: Some(64 * 1_048_576),
            restore_seconds: Some(2.0),
            replay_seconds: Some(3.0),
            error: (phase == RecoveryPhase::Failed).then(|| "postgresql stopped during recovery: FATAL: boom".into()),
        }
    }

    #[test]
    fn each_recovery_step_is_journaled_once_and_a_failure_warns() {
        let now = chrono::Utc::now();
        let mut status = crate::api::DatabaseServiceStatus::default();
        let mut journal = crate::controller::journal::Journal::default();
        decide_recovery(&mut status, Some(report(RecoveryPhase::Restoring, 1)), 1, now, &mut journal);
        decide_recovery(&mut status, Some(report(RecoveryPhase::Restoring, 1)), 1, now, &mut journal);
        decide_recovery(&mut status, Some(report(RecoveryPhase::Failed, 1)), 1, now, &mut journal);
        decide_recovery(&mut status, None, 1, now, &mut journal);
        let reasons: Vec<_> = journal.events.iter().map(|event| (event.reason.as_str(), event.warning)).collect();
        assert_eq!(reasons, [("RecoveryStarted", false), ("RecoveryFailed", true)]);
        let condition = status.conditions.iter().find(|condition| condition.type_ == RECOVERED_CONDITION).unwrap();
        assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "RecoveryFailed"));
        assert!(condition.message.contains("FATAL: boom"), "{}", condition.message);

        decide_recovery(&mut status, Some(report(RecoveryPhase::Restoring, 2)), 1, now, &mut journal);
        decide_recovery(&mut status, Some(report(RecoveryPhase::Completed, 2)), 1, now, &mut journal);
        let condition = status.conditions.iter().find(|condition| condition.type_ == RECOVERED_CONDITION).unwrap();
        assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", "Completed"));
        assert!(condition.message.contains("32.0 MiB/s"), "{}", condition.message);
        let actions: Vec<_> = journal.entries.iter().map(|entry| entry.action.as_str()).collect();
        assert_eq!(actions, ["RecoveryStarted", "RecoveryFailed", "RecoveryStarted", "RecoveryCompleted"]);
        assert_eq!(status.recovery.as_ref().unwrap().phase, RecoveryPhase::Completed);
    }

    #[test]
    fn a_recovery_first_seen_completed_still_journals_its_begin_at_the_reported_time() {
        let mut status = crate::api::DatabaseServiceStatus::default();
        let mut journal = crate::controller::journal::Journal::default();
        let mut completed = report(RecoveryPhase::Completed, 1);
        completed.completed_at = Some("2026-12-01T01:00:03.000Z".into());
        decide_recovery(&mut status, Some(completed), 1, chrono::Utc::now(), &mut journal);
        let entries: Vec<_> =
            journal.entries.iter().map(|entry| (entry.action.as_str(), entry.time.as_str())).collect();
        assert_eq!(entries[0], ("RecoveryStarted", "2026-12-01T01:00:00Z"));
        assert_eq!(entries[1].0, "RecoveryCompleted");
        assert!(journal.entries[1]
            .outcome
            .contains("began 2026-12-01T01:00:00.000Z, completed 2026-12-01T01:00:03.000Z"));
        assert_eq!(journal.entries[1].to, "time 2026-12-01T00:30:00Z");
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
