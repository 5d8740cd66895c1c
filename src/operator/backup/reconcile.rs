//! One pass over one backup object: start its Job when it is the database's turn, follow the
//! Job, fill the status from its summary, tell (events, ledger) and trim the history.

use crate::api::backup::{DEFAULT_FAILED_BACKUPS_HISTORY_LIMIT, DEFAULT_SUCCESSFUL_BACKUPS_HISTORY_LIMIT};
use crate::api::database_service::{DatabaseService, FIELD_MANAGER};
use crate::api::database_service_backup::{BackupPhase, DatabaseServiceBackup, DatabaseServiceBackupStatus};
use crate::operator::backup::context::BackupContext;
use crate::operator::backup::history::{history_to_delete, HistoryEntry};
use crate::operator::backup::job::{backup_job, is_job_of, job_name};
use crate::operator::backup::scheduler::scheduled_at;
use crate::operator::backup::status::{finished_status, job_outcome, termination_message, JobOutcome};
use crate::operator::ledger::LedgerEntry;
use crate::operator::publish::record_ledger;
use crate::operator::server_side_apply::{apply_status, status_body};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

/// How often a waiting backup looks again whether its turn has come.
const PENDING_RECHECK: Duration = Duration::from_secs(15);
/// A safety net: a running backup is looked at this often even when no watch event comes.
const RUNNING_RECHECK: Duration = Duration::from_secs(300);
/// Pods of a backup Job read at most (one attempt: backoffLimit 0).
const POD_LIST_LIMIT: u32 = 5;

/// Why a backup pass failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileBackupError {
    /// An API call failed.
    #[error("{step}: {source}")]
    Api {
        /// What was being done.
        step: &'static str,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// Leadership ended during the pass.
    #[error("leadership lost")]
    StepDown,
}

fn api_error(step: &'static str) -> impl FnOnce(kube::Error) -> ReconcileBackupError {
    move |source| ReconcileBackupError::Api { step, source }
}

/// The backup objects of one database in the cache.
fn backups_of(context: &BackupContext, namespace: &str, database: &str) -> Vec<Arc<DatabaseServiceBackup>> {
    context.backups.state_filter(|backup| {
        backup.namespace().as_deref() == Some(namespace) && backup.spec.database_service == database
    })
}

fn phase_of(backup: &DatabaseServiceBackup) -> Option<BackupPhase> {
    backup.status.as_ref().and_then(|status| status.phase)
}

/// The backup that keeps this one waiting: another one of the same database that is running,
/// or that is unfinished and older (first come, first served; one Job per database at a time).
fn blocking_backup(backup: &DatabaseServiceBackup, others: &[Arc<DatabaseServiceBackup>]) -> Option<String> {
    let order =
        |candidate: &DatabaseServiceBackup| (candidate.creation_timestamp().map(|time| time.0), candidate.name_any());
    others
        .iter()
        .filter(|other| other.uid() != backup.uid())
        .filter(|other| match phase_of(other) {
            Some(BackupPhase::Running) => true,
            Some(BackupPhase::Completed | BackupPhase::Failed) => false,
            None | Some(BackupPhase::Pending) => order(other) < order(backup),
        })
        .map(|other| other.name_any())
        .min()
}

/// Writes the status with server-side apply when it differs from the stored one, conditional
/// on the resourceVersion it was decided from.
async fn write_status(
    backup: &DatabaseServiceBackup,
    status: &DatabaseServiceBackupStatus,
    context: &BackupContext,
) -> Result<(), ReconcileBackupError> {
    if backup.status.as_ref() == Some(status) {
        return Ok(());
    }
    let api: Api<DatabaseServiceBackup> =
        Api::namespaced(context.pass.shared.client.clone(), &backup.namespace().unwrap_or_default());
    let name = backup.name_any();
    let body = status_body::<DatabaseServiceBackup>(&name, backup.resource_version().as_deref(), status);
    apply_status(&api, &name, &body).await.map_err(api_error("write backup status"))?;
    context.pass.shared.metrics.count_write("DatabaseServiceBackup", "status");
    Ok(())
}

async fn publish_event(
    context: &BackupContext,
    backup: &DatabaseServiceBackup,
    warning: bool,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_: if warning { EventType::Warning } else { EventType::Normal },
        reason: reason.into(),
        note: Some(note),
        action: "Backup".into(),
        secondary: None,
    };
    if let Err(error) = context.pass.shared.recorder.publish(&event, &backup.object_ref(&())).await {
        tracing::warn!(%error, reason, "could not publish an event");
    }
}

/// Events and the database's ledger entry for a backup that just finished.
async fn tell_finished(
    context: &BackupContext,
    backup: &DatabaseServiceBackup,
    database: Option<&DatabaseService>,
    status: &DatabaseServiceBackupStatus,
) {
    let completed = status.phase == Some(BackupPhase::Completed);
    let message = status.message.clone().unwrap_or_default();
    let (reason, action) =
        if completed { ("BackupCompleted", "BackupCompleted") } else { ("BackupFailed", "BackupFailed") };
    publish_event(context, backup, !completed, reason, format!("backup {}: {message}", backup.name_any())).await;
    let Some(database) = database else { return };
    let outcome = match (completed, status.size_bytes, &status.end_lsn) {
        (true, Some(size), Some(end_lsn)) => {
            format!("{}: {:.1} MiB, consistent at {end_lsn}", backup.name_any(), size as f64 / 1048576.0)
        }
        _ => format!("{}: {message}", backup.name_any()),
    };
    let entry = LedgerEntry::now(
        database.metadata.generation.unwrap_or(0),
        action,
        "",
        status.backup_id.clone().unwrap_or_default(),
        outcome,
    );
    if let Err(error) = record_ledger(database, &[entry], false, true, &context.pass).await {
        tracing::warn!(%error, database = %database.name_any(), "could not record the backup in the ledger");
    }
}

/// Deletes the finished backup objects of `database_name` beyond its history limits (their Jobs
/// and pods go with them; the backups in the store stay).
async fn trim_history(
    context: &BackupContext,
    namespace: &str,
    database_name: &str,
    database: Option<&DatabaseService>,
) -> Result<(), ReconcileBackupError> {
    let spec = database.and_then(|database| database.spec.backup.as_ref());
    let keep_completed =
        spec.and_then(|spec| spec.successful_backups_history_limit).unwrap_or(DEFAULT_SUCCESSFUL_BACKUPS_HISTORY_LIMIT);
    let keep_failed =
        spec.and_then(|spec| spec.failed_backups_history_limit).unwrap_or(DEFAULT_FAILED_BACKUPS_HISTORY_LIMIT);
    let entries: Vec<HistoryEntry> = backups_of(context, namespace, database_name)
        .iter()
        .map(|backup| HistoryEntry {
            name: backup.name_any(),
            phase: phase_of(backup),
            created: backup
                .creation_timestamp()
                .and_then(|time| chrono::DateTime::from_timestamp(time.0.as_second(), 0)),
            scheduled_at: scheduled_at(backup),
        })
        .collect();
    let delete = history_to_delete(&entries, keep_completed.max(1) as usize, keep_failed.max(1) as usize);
    let api: Api<DatabaseServiceBackup> = Api::namespaced(context.pass.shared.client.clone(), namespace);
    for name in delete {
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {
                context.pass.shared.metrics.count_write("DatabaseServiceBackup", "delete");
                tracing::info!(backup = %name, database = database_name, namespace, "deleted a backup object beyond the history limit");
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(api_error("delete an old backup object")(error)),
        }
    }
    Ok(())
}

/// The DatabaseService a backup names, as this operator sees it.
enum DatabaseLookup {
    /// Cached: this operator manages it.
    Managed(Arc<DatabaseService>),
    /// It exists but another operator's label selector has it: not ours to touch.
    Foreign,
    /// It does not exist.
    Missing,
}

async fn find_database(
    context: &BackupContext,
    namespace: &str,
    name: &str,
) -> Result<DatabaseLookup, ReconcileBackupError> {
    if let Some(database) = context.databases.get(&ObjectRef::new(name).within(namespace)) {
        return Ok(DatabaseLookup::Managed(database));
    }
    let api: Api<DatabaseService> = Api::namespaced(context.pass.shared.client.clone(), namespace);
    let exists = api.get_metadata_opt(name).await.map_err(api_error("look up the DatabaseService"))?.is_some();
    Ok(if exists { DatabaseLookup::Foreign } else { DatabaseLookup::Missing })
}

/// The reconciliation of one backup object.
pub async fn reconcile_backup(
    backup: &DatabaseServiceBackup,
    context: &BackupContext,
) -> Result<Action, ReconcileBackupError> {
    let namespace = backup.namespace().unwrap_or_default();
    let database_name = backup.spec.database_service.clone();
    let phase = phase_of(backup);
    let database = match find_database(context, &namespace, &database_name).await? {
        DatabaseLookup::Managed(database) => Some(database),
        DatabaseLookup::Foreign => return Ok(Action::await_change()),
        DatabaseLookup::Missing => None,
    };
    if phase.is_some_and(BackupPhase::is_terminal) {
        trim_history(context, &namespace, &database_name, database.as_deref()).await?;
        return Ok(Action::await_change());
    }
    let name = job_name(backup);
    let job = context.jobs.get(&ObjectRef::new(&name).within(&namespace)).filter(|job| is_job_of(job, backup));
    let Some(job) = job else {
        return start(backup, database.as_deref(), &name, context).await;
    };
    let outcome = job_outcome(&job);
    if outcome == JobOutcome::Active {
        write_status(backup, &finished_status(&name, &outcome, None), context).await?;
        return Ok(Action::requeue(RUNNING_RECHECK));
    }
    let pods: Api<Pod> = Api::namespaced(context.pass.shared.client.clone(), &namespace);
    let listed = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}")).limit(POD_LIST_LIMIT))
        .await
        .map_err(api_error("read the backup Job's pod"))?;
    let message = termination_message(&listed.items);
    let status = finished_status(&name, &outcome, message.as_deref());
    write_status(backup, &status, context).await?;
    tell_finished(context, backup, database.as_deref(), &status).await;
    trim_history(context, &namespace, &database_name, database.as_deref()).await?;
    Ok(Action::await_change())
}

/// No Job yet: fail what cannot run, wait for the database's running backup, or create the Job.
async fn start(
    backup: &DatabaseServiceBackup,
    database: Option<&DatabaseService>,
    job_name: &str,
    context: &BackupContext,
) -> Result<Action, ReconcileBackupError> {
    let namespace = backup.namespace().unwrap_or_default();
    let fail = |message: String| DatabaseServiceBackupStatus {
        phase: Some(BackupPhase::Failed),
        job_name: backup.status.as_ref().and_then(|status| status.job_name.clone()),
        message: Some(message),
        ..Default::default()
    };
    let failure = match database {
        None => Some(fail(format!("DatabaseService {} not found", backup.spec.database_service))),
        // The Job existed and is gone (deleted by hand): its result is lost.
        Some(_) if phase_of(backup) == Some(BackupPhase::Running) => {
            Some(fail(format!("Job {job_name} disappeared before it finished")))
        }
        Some(_) => None,
    };
    if let Some(status) = failure {
        write_status(backup, &status, context).await?;
        tell_finished(context, backup, database, &status).await;
        return Ok(Action::await_change());
    }
    let database = database.expect("checked above");
    let others = backups_of(context, &namespace, &backup.spec.database_service);
    let ready = database.status.as_ref().map_or(0, |status| status.ready_replicas);
    let waiting_for = match blocking_backup(backup, &others) {
        Some(blocker) => Some(format!("waiting for backup {blocker} of the same database to finish")),
        None if database.spec.is_hibernated() => {
            Some(format!("DatabaseService {} is hibernated: the backup waits until it is woken", database.name_any()))
        }
        // Without a ready instance the Job could only fail.
        None if ready < 1 => {
            Some(format!("waiting for DatabaseService {} to have a ready instance", database.name_any()))
        }
        None => None,
    };
    if let Some(message) = waiting_for {
        let status = DatabaseServiceBackupStatus {
            phase: Some(BackupPhase::Pending),
            message: Some(message),
            ..Default::default()
        };
        write_status(backup, &status, context).await?;
        return Ok(Action::requeue(PENDING_RECHECK));
    }
    let instance_image = context.pass.shared.settings.instance_image.as_deref().unwrap_or_default();
    let job = match backup_job(backup, database, instance_image) {
        Ok(job) => job,
        Err(error) => {
            let status = fail(error.to_string());
            write_status(backup, &status, context).await?;
            tell_finished(context, backup, Some(database), &status).await;
            return Ok(Action::await_change());
        }
    };
    let jobs: Api<Job> = Api::namespaced(context.pass.shared.client.clone(), &namespace);
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    match jobs.create(&params, &job).await {
        Ok(_) => {
            context.pass.shared.metrics.count_write("Job", "create");
            publish_event(context, backup, false, "BackupStarted", format!("Job {job_name} takes the backup")).await;
        }
        // Created by an earlier pass whose status write failed, and not cached yet.
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => return Err(api_error("create the backup Job")(error)),
    }
    let status = finished_status(job_name, &JobOutcome::Active, None);
    write_status(backup, &status, context).await?;
    Ok(Action::requeue(RUNNING_RECHECK))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn backup(name: &str, minute: u32, phase: Option<BackupPhase>) -> Arc<DatabaseServiceBackup> {
        let mut backup = DatabaseServiceBackup::new(name, Default::default());
        backup.metadata.uid = Some(format!("uid-{name}"));
        backup.metadata.creation_timestamp = Some(Time(format!("2026-12-01T01:{minute:02}:00Z").parse().unwrap()));
        backup.status = phase.map(|phase| DatabaseServiceBackupStatus { phase: Some(phase), ..Default::default() });
        Arc::new(backup)
    }

    #[test]
    fn the_oldest_unfinished_backup_runs_first_and_alone() {
        let first = backup("first", 1, Some(BackupPhase::Pending));
        let second = backup("second", 2, None);
        let done = backup("done", 0, Some(BackupPhase::Completed));
        let all = vec![first.clone(), second.clone(), done];
        assert_eq!(blocking_backup(&first, &all), None);
        assert_eq!(blocking_backup(&second, &all), Some("first".into()));
        let running = backup("running", 5, Some(BackupPhase::Running));
        let all = vec![first.clone(), running];
        assert_eq!(blocking_backup(&first, &all), Some("running".into()));
    }
}
