//! The scheduler: every few seconds, for each DatabaseService with `spec.backup.schedule`, it
//! creates the backup object of the latest cron time missed (see [`crate::operator::backup::scheduling`]). The
//! object's name is derived from the cron time, so replicas and retries never double a run.

use crate::api::database_service::{DatabaseService, FIELD_MANAGER};
use crate::api::database_service_backup::{BackupTarget, DatabaseServiceBackup, DatabaseServiceBackupSpec};
use crate::api::names::{owner_reference, MANAGED_BY, MANAGED_BY_LABEL};
use crate::operator::backup::context::BackupContext;
use crate::operator::backup::job::DATABASE_LABEL;
use crate::operator::backup::scheduling::{due_run, scheduled_backup_name};
use crate::schedule::Schedule;
use chrono::{DateTime, Utc};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use std::time::Duration;

/// Annotation holding the cron time a scheduled backup was created for (RFC 3339).
pub const SCHEDULED_AT_ANNOTATION: &str = "dbservice.dev/scheduled-at";
/// How often schedules are looked at: cron has minute resolution.
const TICK: Duration = Duration::from_secs(15);

/// The cron time of a scheduled backup object.
pub fn scheduled_at(backup: &DatabaseServiceBackup) -> Option<DateTime<Utc>> {
    let text = backup.annotations().get(SCHEDULED_AT_ANNOTATION)?;
    DateTime::parse_from_rfc3339(text).ok().map(|time| time.to_utc())
}

/// The backup object the scheduler creates for `database` at cron time `at`.
pub fn scheduled_backup(database: &DatabaseService, at: DateTime<Utc>) -> DatabaseServiceBackup {
    let name = database.name_any();
    let mut backup = DatabaseServiceBackup::new(
        &scheduled_backup_name(&name, at),
        DatabaseServiceBackupSpec { database_service: name.clone(), target: Some(BackupTarget::Standby) },
    );
    backup.metadata = ObjectMeta {
        name: backup.metadata.name.take(),
        namespace: database.namespace(),
        labels: Some(
            [(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()), (DATABASE_LABEL.to_string(), name)].into(),
        ),
        annotations: Some(
            [(SCHEDULED_AT_ANNOTATION.to_string(), at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))].into(),
        ),
        // Deleted with the DatabaseService (the backups in the store stay).
        owner_references: Some(vec![owner_reference(database)]),
        ..Default::default()
    };
    backup
}

/// The cron time to create a backup for now, if any: none while a scheduled backup of the
/// database is still unfinished (a slow backup delays the next one, never stacks them).
pub fn next_scheduled_run(
    database: &DatabaseService,
    backups: &[std::sync::Arc<DatabaseServiceBackup>],
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    // Hibernated: nothing runs to back up, and the schedule resumes with the latest missed run.
    if database.metadata.deletion_timestamp.is_some() || database.spec.is_paused() || database.spec.is_hibernated() {
        return None;
    }
    let schedule: Schedule = database.spec.backup.as_ref()?.schedule.as_ref()?.parse().ok()?;
    let scheduled: Vec<(DateTime<Utc>, bool)> = backups
        .iter()
        .filter_map(|backup| {
            let finished =
                backup.status.as_ref().and_then(|status| status.phase).is_some_and(|phase| phase.is_terminal());
            Some((scheduled_at(backup)?, finished))
        })
        .collect();
    if scheduled.iter().any(|(_, finished)| !finished) {
        return None;
    }
    let last_run = scheduled.iter().map(|(at, _)| *at).max();
    let since = DateTime::from_timestamp(database.creation_timestamp()?.0.as_second(), 0)?;
    due_run(&schedule, last_run, since, now)
}

/// Creates the due backups of every cached DatabaseService, until `stop` resolves.
pub async fn run_scheduler(context: std::sync::Arc<BackupContext>, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    // The caches' first lists race the end of the term: a term that ends before they are
    // filled must not wait for them (they stop being driven when the controllers stop).
    let ready = async {
        context.databases.wait_until_ready().await.is_ok() && context.backups.wait_until_ready().await.is_ok()
    };
    tokio::select! {
        _ = &mut stop => return,
        ready = ready => if !ready { return },
    }
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = ticks.tick() => {}
        }
        if !context.pass.may_write() {
            continue;
        }
        for database in context.databases.state() {
            let namespace = database.namespace().unwrap_or_default();
            let name = database.name_any();
            let backups = context.backups.state_filter(|backup| {
                backup.namespace().as_deref() == Some(namespace.as_str()) && backup.spec.database_service == name
            });
            let Some(at) = next_scheduled_run(&database, &backups, Utc::now()) else { continue };
            let backup = scheduled_backup(&database, at);
            let api: Api<DatabaseServiceBackup> = Api::namespaced(context.pass.shared.client.clone(), &namespace);
            let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
            match api.create(&params, &backup).await {
                Ok(_) => {
                    context.pass.shared.metrics.count_write("DatabaseServiceBackup", "create");
                    tracing::info!(database = %name, %namespace, backup = %backup.name_any(), %at, "scheduled backup created");
                }
                // Created already (by this process before the cache saw it, or by a previous leader).
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(error) => {
                    tracing::warn!(%error, database = %name, %namespace, "cannot create the scheduled backup")
                }
            }
        }
    }
}
