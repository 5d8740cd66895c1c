//! What a backup's status says, from its Job and the summary the Job's container leaves as its
//! termination message (pure).

use crate::api::database_service_backup::{BackupPhase, DatabaseServiceBackupStatus};
use crate::operator::backup::job::BACKUP_CONTAINER;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

/// Longest message kept in the status (the CRD caps it at 4096).
const MESSAGE_LIMIT: usize = 2048;

/// The summary `dbservice-operator backup` prints and writes to the termination log: the
/// manifest without its chunk list, plus what retention did.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupSummary {
    /// Backup id.
    pub id: String,
    /// Server name.
    #[serde(default)]
    pub server_name: Option<String>,
    /// Start LSN.
    #[serde(default)]
    pub begin_lsn: Option<String>,
    /// End LSN.
    #[serde(default)]
    pub end_lsn: Option<String>,
    /// First WAL segment.
    #[serde(default)]
    pub begin_wal: Option<String>,
    /// Last WAL segment.
    #[serde(default)]
    pub end_wal: Option<String>,
    /// Start time.
    #[serde(default)]
    pub start_time: Option<String>,
    /// End time.
    #[serde(default)]
    pub end_time: Option<String>,
    /// Timeline.
    #[serde(default)]
    pub timeline: Option<i64>,
    /// Major version.
    #[serde(default)]
    pub postgres_major_version: Option<i64>,
    /// Bytes copied.
    #[serde(default)]
    pub size_bytes: Option<i64>,
    /// Bytes stored.
    #[serde(default)]
    pub stored_bytes: Option<i64>,
    /// Copied from a standby.
    #[serde(default)]
    pub from_standby: Option<bool>,
    /// Why retention failed, when it did.
    #[serde(default)]
    pub retention_error: Option<String>,
}

/// Whether the Job finished, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// Still running (or not started).
    Active,
    /// Condition Complete.
    Succeeded,
    /// Condition Failed, with its reason and message.
    Failed(String),
}

/// The Job's outcome from its conditions.
pub fn job_outcome(job: &Job) -> JobOutcome {
    let conditions = job.status.as_ref().and_then(|status| status.conditions.as_ref());
    for condition in conditions.into_iter().flatten() {
        if condition.status != "True" {
            continue;
        }
        match condition.type_.as_str() {
            "Complete" => return JobOutcome::Succeeded,
            "Failed" => {
                let reason = condition.reason.clone().unwrap_or_else(|| "Failed".into());
                let message = condition.message.clone().unwrap_or_default();
                return JobOutcome::Failed(if message.is_empty() { reason } else { format!("{reason}: {message}") });
            }
            _ => {}
        }
    }
    JobOutcome::Active
}

/// The termination message of the backup container of the newest terminated pod.
pub fn termination_message(pods: &[Pod]) -> Option<String> {
    pods.iter()
        .filter_map(|pod| {
            let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
            let terminated =
                statuses.iter().find(|status| status.name == BACKUP_CONTAINER)?.state.as_ref()?.terminated.as_ref()?;
            Some((terminated.finished_at.clone(), terminated.message.clone()?))
        })
        .max_by(|left, right| left.0.cmp(&right.0))
        .map(|(_, message)| message)
}

fn shorten(text: &str) -> String {
    let text = text.trim();
    if text.len() <= MESSAGE_LIMIT {
        return text.to_string();
    }
    // Keep the end: the cause of a failure is in the last lines.
    let mut start = text.len() - MESSAGE_LIMIT;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

/// The summary in a termination message: the last line that parses.
pub fn parse_summary(message: &str) -> Option<BackupSummary> {
    message.lines().rev().find_map(|line| serde_json::from_str(line.trim()).ok())
}

/// The status of a backup whose Job finished; `job_name` is kept.
pub fn finished_status(job_name: &str, outcome: &JobOutcome, message: Option<&str>) -> DatabaseServiceBackupStatus {
    let base = DatabaseServiceBackupStatus { job_name: Some(job_name.into()), ..Default::default() };
    match outcome {
        JobOutcome::Active => DatabaseServiceBackupStatus {
            phase: Some(BackupPhase::Running),
            message: Some(format!("Job {job_name} is taking the backup")),
            ..base
        },
        JobOutcome::Succeeded => match message.and_then(parse_summary) {
            Some(summary) => DatabaseServiceBackupStatus {
                phase: Some(BackupPhase::Completed),
                backup_id: Some(summary.id.clone()),
                server_name: summary.server_name,
                begin_wal: summary.begin_wal,
                end_wal: summary.end_wal,
                begin_lsn: summary.begin_lsn,
                end_lsn: summary.end_lsn,
                start_time: summary.start_time,
                end_time: summary.end_time,
                timeline: summary.timeline,
                postgres_major_version: summary.postgres_major_version,
                size_bytes: summary.size_bytes,
                stored_bytes: summary.stored_bytes,
                from_standby: summary.from_standby,
                message: Some(match summary.retention_error {
                    Some(error) => shorten(&format!("backup {} stored; retention failed: {error}", summary.id)),
                    None => format!("backup {} stored", summary.id),
                }),
                ..base
            },
            None => DatabaseServiceBackupStatus {
                phase: Some(BackupPhase::Failed),
                message: Some(format!(
                    "Job {job_name} succeeded but left no backup summary in its termination message"
                )),
                ..base
            },
        },
        JobOutcome::Failed(reason) => DatabaseServiceBackupStatus {
            phase: Some(BackupPhase::Failed),
            message: Some(shorten(&match message.map(str::trim).filter(|text| !text.is_empty()) {
                Some(log) => format!("Job {job_name} failed ({reason}): {log}"),
                None => format!("Job {job_name} failed ({reason})"),
            })),
            ..base
        },
    }
}
