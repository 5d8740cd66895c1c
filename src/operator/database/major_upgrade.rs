//! Deciding an in-place major upgrade (pure, issue 24): a `spec.version` of a newer major than
//! the last stable one. The steps, each a phase of `status.majorUpgrade`:
//! 1. `BackingUp` (with `spec.backup`): the pods keep the old image while the backup
//!    NAME-before-pgN is taken; a failed backup ends the upgrade before anything changed.
//! 2. `Upgrading`: failover is held; the primary's pod alone is replaced by one of the new image
//!    (the old image's binaries copied in by an init container); its agent runs `pg_upgrade`
//!    beside the old data and starts the new major. A refusal rolls back at once.
//! 3. `Recloning`: the new primary answers; each standby's pod is replaced and its agent clones
//!    the new primary (a standby of the old major cannot stream from it). Statistics are rebuilt.
//! 4. `Completed` once every instance runs the new major and streams; the archive continues
//!    under a new server name (a new system identifier).
//!
//! A failure before the new major accepted writes (a refusal, the progress deadline) goes to
//! `RollingBack`: the primary's pod returns to the old image, whose agent swaps the untouched old
//! data directory back; `RolledBack` once it answers as primary again.

use crate::api::database_service::{DatabaseService, DatabaseServiceStatus};
use crate::api::database_service_backup::BackupPhase;
use crate::api::failover::{InstanceReport, Role};
use crate::api::major_upgrade::{
    backup_name, upgraded_server_name, InstanceUpgradeState, MajorUpgradePhase, MajorUpgradeStatus,
};
use crate::api::version::major_version;
use crate::operator::database::healing::{roll_back, RollbackReason, Rollout};
use crate::operator::database::pod_health::PodHealth;
use crate::operator::journal::{parse_time, rfc3339, Journal};
use crate::operator::ledger::LedgerEntry;
use chrono::{DateTime, Utc};
use std::ops::ControlFlow;

/// The pre-upgrade backup as observed (its `DatabaseServiceBackup`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupObservation {
    /// Its phase; None before the backup controller saw it.
    pub phase: Option<BackupPhase>,
    /// Its message, for a failure.
    pub message: Option<String>,
}

/// What one pass reads.
pub struct MajorUpgradeInput<'a> {
    /// The DatabaseService.
    pub database: &'a DatabaseService,
    /// Each pod's health and its agent's report, by pod name.
    pub instances: &'a [(PodHealth, Option<InstanceReport>)],
    /// The pre-upgrade backup; None when it does not exist (or is not looked for).
    pub backup: Option<&'a BackupObservation>,
    /// Every pod runs the rollout's image and is ready.
    pub rolled_out: bool,
    /// The time of this pass.
    pub now: DateTime<Utc>,
}

/// What the pass must do for the upgrade.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MajorUpgradeDecision {
    /// Create the pre-upgrade backup of this name.
    pub create_backup: Option<String>,
    /// The pods roll the major upgrade's way: this instance (the primary) first.
    pub primary_first: Option<String>,
}

/// Decides this pass's upgrade step: updates `status.majorUpgrade` and `rollout`.
pub fn decide_major_upgrade(
    input: &MajorUpgradeInput,
    status: &mut DatabaseServiceStatus,
    rollout: &mut Rollout,
    journal: &mut Journal,
) -> MajorUpgradeDecision {
    if rollout.rolled_back {
        return rolling_back(input, status, journal);
    }
    let Some(to_major) = major_version(&rollout.version) else { return MajorUpgradeDecision::default() };
    // An upgrade under way carries on (the last stable version becomes the new one as soon as
    // every pod runs it, before the standbys stream again).
    let current =
        status.major_upgrade.as_ref().filter(|upgrade| upgrade.to_version == rollout.version && upgrade.in_progress());
    if current.is_none() && !begin(input, status, rollout, journal, to_major) {
        return MajorUpgradeDecision::default();
    }
    let Some(mut upgrade) = status.major_upgrade.clone() else { return MajorUpgradeDecision::default() };
    let step = match upgrade.phase {
        MajorUpgradePhase::BackingUp => backing_up(input, status, rollout, journal, &mut upgrade, to_major),
        MajorUpgradePhase::Upgrading => upgrading(input, status, rollout, journal, &mut upgrade),
        MajorUpgradePhase::Recloning => recloning(input, status, journal, &mut upgrade, to_major),
        MajorUpgradePhase::Completed | MajorUpgradePhase::RollingBack | MajorUpgradePhase::RolledBack => {
            ControlFlow::Continue(MajorUpgradeDecision::default())
        }
    };
    match step {
        // Rolled back: `roll_back` already wrote `status.majorUpgrade`.
        ControlFlow::Break(decision) => decision,
        ControlFlow::Continue(decision) => {
            status.major_upgrade = Some(upgrade);
            decision
        }
    }
}

/// Starts an upgrade when the rollout's major is newer than the last stable one and there is a
/// settled primary; false when none starts this pass.
fn begin(
    input: &MajorUpgradeInput,
    status: &mut DatabaseServiceStatus,
    rollout: &mut Rollout,
    journal: &mut Journal,
    to_major: u32,
) -> bool {
    let MajorUpgradeInput { database, now, .. } = *input;
    let from_major = status.last_stable_version.as_deref().and_then(major_version);
    if from_major.is_none_or(|from_major| to_major <= from_major) {
        return false;
    }
    let Some(started) = start(database, status, rollout, now) else {
        hold_old_image(status, rollout);
        return false;
    };
    let note = format!(
        "upgrading PostgreSQL {} to {} in place on {}{}",
        started.from_version,
        started.to_version,
        started.primary,
        if started.phase == MajorUpgradePhase::BackingUp { ", after a backup" } else { "" }
    );
    let entry = LedgerEntry::at(
        now,
        database.metadata.generation.unwrap_or(0),
        "MajorUpgradeStarted",
        started.from_version.clone(),
        started.to_version.clone(),
        "in place with pg_upgrade",
    );
    journal.record(false, "MajorUpgradeStarted", note, Some(entry));
    status.major_upgrade = Some(started);
    true
}

/// `BackingUp`: creates the pre-upgrade backup and waits for it; upgrades the primary once it
/// completed, rolls back (Break) when it failed.
fn backing_up(
    input: &MajorUpgradeInput,
    status: &mut DatabaseServiceStatus,
    rollout: &mut Rollout,
    journal: &mut Journal,
    upgrade: &mut MajorUpgradeStatus,
    to_major: u32,
) -> ControlFlow<MajorUpgradeDecision, MajorUpgradeDecision> {
    let MajorUpgradeInput { database, now, .. } = *input;
    let mut decision = MajorUpgradeDecision::default();
    let name = backup_name(&database.metadata.name.clone().unwrap_or_default(), to_major);
    match input.backup {
        None => decision.create_backup = Some(name.clone()),
        Some(BackupObservation { phase: Some(BackupPhase::Completed), .. }) => {
            upgrade.phase = MajorUpgradePhase::Upgrading;
            upgrade.message = None;
            decision.primary_first = Some(upgrade.primary.clone());
            journal.record(
                false,
                "MajorUpgradeBackedUp",
                format!("backup {name} completed: upgrading {}", upgrade.primary),
                None,
            );
        }
        Some(BackupObservation { phase: Some(BackupPhase::Failed), message }) => {
            let reason = message.clone().unwrap_or_else(|| "no reason given".into());
            upgrade.phase = MajorUpgradePhase::RolledBack;
            upgrade.message = Some(format!("the backup before the upgrade failed: {reason}"));
            status.major_upgrade = Some(upgrade.clone());
            let message = format!(
                "the backup {name} before the upgrade to {} failed ({reason}); nothing was changed. Change the spec to try again",
                rollout.version
            );
            let reason = RollbackReason { condition_reason: "BackupFailed", ledger: "backup failed", message };
            roll_back(database, status, rollout, journal, reason, now);
            return ControlFlow::Break(decision);
        }
        Some(_) => upgrade.message = Some(format!("waiting for backup {name}")),
    }
    upgrade.backup = Some(name);
    if upgrade.phase == MajorUpgradePhase::BackingUp {
        hold_old_image(status, rollout);
    }
    ControlFlow::Continue(decision)
}

/// `Upgrading`: the primary's pod runs the new image and its agent `pg_upgrade`; on to
/// `Recloning` once it answers as primary of the new major, rolls back (Break) on a failure.
fn upgrading(
    input: &MajorUpgradeInput,
    status: &mut DatabaseServiceStatus,
    rollout: &mut Rollout,
    journal: &mut Journal,
    upgrade: &mut MajorUpgradeStatus,
) -> ControlFlow<MajorUpgradeDecision, MajorUpgradeDecision> {
    let MajorUpgradeInput { database, now, .. } = *input;
    let decision = MajorUpgradeDecision { primary_first: Some(upgrade.primary.clone()), ..Default::default() };
    let primary = input.instances.iter().find(|(health, _)| health.name == upgrade.primary);
    let report = primary.and_then(|(_, report)| report.as_ref());
    let upgrade_report = report.and_then(|report| report.major_upgrade.as_ref());
    let failed = upgrade_report.filter(|report| {
        report.state == InstanceUpgradeState::Failed && Some(report.to_major) == major_version(&upgrade.to_version)
    });
    if let Some(failed) = failed {
        let reason = failed.message.clone().unwrap_or_else(|| "no reason given".into());
        upgrade.phase = MajorUpgradePhase::RollingBack;
        upgrade.message = Some(reason.clone());
        status.major_upgrade = Some(upgrade.clone());
        let message = format!(
            "the upgrade of {} to {} failed and is rolled back to {} on its untouched data: {reason}",
            status.major_upgrade.as_ref().map(|upgrade| upgrade.primary.as_str()).unwrap_or_default(),
            rollout.version,
            status.last_stable_version.clone().unwrap_or_default(),
        );
        let reason = RollbackReason { condition_reason: "UpgradeFailed", ledger: "pg_upgrade failed", message };
        roll_back(database, status, rollout, journal, reason, now);
        return ControlFlow::Break(MajorUpgradeDecision {
            primary_first: status.major_upgrade.as_ref().map(|u| u.primary.clone()),
            ..decision
        });
    }
    let upgraded = primary.is_some_and(|(health, _)| health.image == upgrade.to_image && health.ready)
        && report.is_some_and(|report| {
            report.role == Role::Primary && report.postgres_ready && upgraded_to(report, &upgrade.to_version)
        });
    if upgraded {
        let report = report.expect("checked above");
        upgrade.phase = MajorUpgradePhase::Recloning;
        upgrade.steps = upgrade_report.map(|report| report.steps.clone()).unwrap_or_default();
        upgrade.downtime_milliseconds =
            parse_time(&upgrade.primary_stopped_at).map(|stopped| (now - stopped).num_milliseconds().max(0) as u64);
        upgrade.message = None;
        // pg_upgrade starts the new system on timeline 1.
        status.failover.timeline = Some(report.timeline);
        journal.record(
            false,
            "MajorUpgradePrimaryUpgraded",
            format!(
                "{} runs PostgreSQL {} (down {}); cloning the standbys from it",
                upgrade.primary,
                upgrade.to_version,
                seconds(upgrade.downtime_milliseconds),
            ),
            None,
        );
    }
    ControlFlow::Continue(decision)
}

/// `Recloning`: the standbys are replaced and clone the new primary; `Completed` once every pod
/// runs the new image and every standby streams.
fn recloning(
    input: &MajorUpgradeInput,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    upgrade: &mut MajorUpgradeStatus,
    to_major: u32,
) -> ControlFlow<MajorUpgradeDecision, MajorUpgradeDecision> {
    let mut decision = MajorUpgradeDecision { primary_first: Some(upgrade.primary.clone()), ..Default::default() };
    let primary_report = input
        .instances
        .iter()
        .find(|(health, _)| health.name == upgrade.primary)
        .and_then(|(_, report)| report.as_ref());
    upgrade.analyze =
        primary_report.and_then(|report| report.major_upgrade.as_ref()).and_then(|report| report.analyze.clone());
    let standbys_stream =
        input.instances.iter().filter(|(health, _)| health.name != upgrade.primary).all(|(_, report)| {
            report.as_ref().is_some_and(|report| report.role == Role::Standby && report.wal_receiver)
        });
    if input.rolled_out && standbys_stream {
        decision.primary_first = None;
        complete(input, status, journal, upgrade, to_major);
    }
    ControlFlow::Continue(decision)
}

/// The upgrade is done: the archive continues under the new server name; the ledger keeps the
/// downtime and the steps' durations.
fn complete(
    input: &MajorUpgradeInput,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    upgrade: &mut MajorUpgradeStatus,
    to_major: u32,
) {
    let MajorUpgradeInput { database, now, .. } = *input;
    upgrade.phase = MajorUpgradePhase::Completed;
    status.archive_server_name = database
        .spec
        .backup
        .as_ref()
        .map(|backup| {
            backup.object_store.server_name_or(&database.metadata.name.clone().unwrap_or_default()).to_string()
        })
        .map(|base| upgraded_server_name(&base, to_major));
    let steps: Vec<String> =
        upgrade.steps.iter().map(|step| format!("{} {}", step.name, seconds(Some(step.milliseconds)))).collect();
    let note = format!(
        "PostgreSQL {} to {} done: primary down {} ({})",
        upgrade.from_version,
        upgrade.to_version,
        seconds(upgrade.downtime_milliseconds),
        steps.join(", ")
    );
    let entry = LedgerEntry::at(
        now,
        database.metadata.generation.unwrap_or(0),
        "MajorUpgraded",
        upgrade.from_version.clone(),
        upgrade.to_version.clone(),
        format!("primary down {}: {}", seconds(upgrade.downtime_milliseconds), steps.join(", ")),
    );
    journal.record(false, "MajorUpgraded", note, Some(entry));
}

/// Whether an in-place major upgrade is past its way back: the standbys are being cloned from the
/// new primary, or the primary's agent upgraded its data and either its new server answers (it
/// committed the upgrade: the old data directory is gone) or link mode shares the old files.
/// Rolling back then would start the old major on data it cannot read.
pub fn past_the_way_back(database: &DatabaseService, instances: &[(PodHealth, Option<InstanceReport>)]) -> bool {
    let Some(upgrade) = database.status.as_ref().and_then(|status| status.major_upgrade.as_ref()) else {
        return false;
    };
    match upgrade.phase {
        MajorUpgradePhase::Recloning => true,
        MajorUpgradePhase::Upgrading => {
            let link = database.spec.upgrade_method == Some(crate::api::major_upgrade::UpgradeMethod::Link);
            instances.iter().filter(|(health, _)| health.name == upgrade.primary).any(|(health, report)| {
                health.image == upgrade.to_image
                    && report.as_ref().is_some_and(|report| {
                        upgraded_to(report, &upgrade.to_version) && (link || report.postgres_ready)
                    })
            })
        }
        _ => false,
    }
}

/// Whether `report` says its data was upgraded to the major of `version`.
fn upgraded_to(report: &InstanceReport, version: &str) -> bool {
    report.major_upgrade.as_ref().is_some_and(|upgraded| {
        upgraded.state == InstanceUpgradeState::Upgraded && Some(upgraded.to_major) == major_version(version)
    })
}

/// The primary's pod was deleted for the upgrade this pass: the downtime counts from now.
pub fn primary_stopped(status: &mut DatabaseServiceStatus, now: DateTime<Utc>) {
    if let Some(upgrade) = status.major_upgrade.as_mut().filter(|upgrade| upgrade.primary_stopped_at.is_none()) {
        upgrade.primary_stopped_at = Some(rfc3339(now));
    }
}

/// A new upgrade, or None when there is no settled primary to upgrade yet.
fn start(
    database: &DatabaseService,
    status: &DatabaseServiceStatus,
    rollout: &Rollout,
    now: DateTime<Utc>,
) -> Option<MajorUpgradeStatus> {
    let failover = &status.failover;
    let primary = failover.current_primary.clone().filter(|_| {
        failover.target_primary == failover.current_primary
            && failover.transition.is_none()
            && failover.primary_failing_since.is_none()
    })?;
    Some(MajorUpgradeStatus {
        phase: if database.spec.backup.is_some() { MajorUpgradePhase::BackingUp } else { MajorUpgradePhase::Upgrading },
        from_version: status.last_stable_version.clone()?,
        from_image: status.last_stable_image.clone()?,
        to_version: rollout.version.clone(),
        to_image: rollout.image.clone(),
        primary,
        started_at: rfc3339(now),
        primary_stopped_at: None,
        downtime_milliseconds: None,
        backup: None,
        steps: Vec::new(),
        analyze: None,
        message: None,
    })
}

/// The pods keep the old image (and the progress deadline does not run) until the primary may
/// be upgraded.
fn hold_old_image(status: &mut DatabaseServiceStatus, rollout: &mut Rollout) {
    if let (Some(version), Some(image)) = (&status.last_stable_version, &status.last_stable_image) {
        rollout.version = version.clone();
        rollout.image = image.clone();
    }
    status.rollout_started_at = None;
}

/// A rolled-back upgrade: the primary's pod returns to the old image first (failover held), and
/// the upgrade counts as rolled back once it answers as primary.
fn rolling_back(
    input: &MajorUpgradeInput,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
) -> MajorUpgradeDecision {
    let Some(mut upgrade) = status.major_upgrade.clone().filter(|upgrade| upgrade.in_progress()) else {
        return MajorUpgradeDecision::default();
    };
    if upgrade.phase != MajorUpgradePhase::RollingBack {
        // The progress deadline rolled it back.
        upgrade.phase = MajorUpgradePhase::RollingBack;
        upgrade.message = Some("the progress deadline passed before the new major was ready".into());
    }
    let primary = input.instances.iter().find(|(health, _)| health.name == upgrade.primary);
    let back = primary.is_some_and(|(health, report)| {
        health.image == upgrade.from_image
            && health.ready
            && report.as_ref().is_some_and(|report| report.role == Role::Primary && report.postgres_ready)
    });
    let decision = MajorUpgradeDecision { create_backup: None, primary_first: Some(upgrade.primary.clone()) };
    if back {
        upgrade.phase = MajorUpgradePhase::RolledBack;
        journal.record(
            true,
            "MajorUpgradeRolledBack",
            format!("{} runs PostgreSQL {} again on its own data", upgrade.primary, upgrade.from_version),
            None,
        );
    }
    status.major_upgrade = Some(upgrade);
    decision
}

fn seconds(milliseconds: Option<u64>) -> String {
    milliseconds.map_or_else(|| "?".into(), |milliseconds| format!("{:.1} s", milliseconds as f64 / 1000.0))
}

/// The `DatabaseServiceBackup` taken before an upgrade, from the primary; deleted with the
/// DatabaseService (the backup in the store stays, as the retention policy says).
pub fn pre_upgrade_backup(
    database: &DatabaseService,
    name: &str,
) -> crate::api::database_service_backup::DatabaseServiceBackup {
    use crate::api::database_service_backup::{BackupTarget, DatabaseServiceBackup, DatabaseServiceBackupSpec};
    use crate::api::names::{owner_reference, MANAGED_BY, MANAGED_BY_LABEL};
    use crate::operator::backup::job::DATABASE_LABEL;
    let database_name = database.metadata.name.clone().unwrap_or_default();
    let mut backup = DatabaseServiceBackup::new(
        name,
        DatabaseServiceBackupSpec { database_service: database_name.clone(), target: Some(BackupTarget::Primary) },
    );
    backup.metadata.namespace = database.metadata.namespace.clone();
    backup.metadata.labels = Some(
        [(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()), (DATABASE_LABEL.to_string(), database_name)].into(),
    );
    backup.metadata.owner_references = Some(vec![owner_reference(database)]);
    backup
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::failover::FailoverStatus;
    use crate::api::major_upgrade::{InstanceUpgradeReport, UpgradeStep};
    use chrono::TimeZone;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + seconds, 0).unwrap()
    }

    fn database(with_backup: bool) -> DatabaseService {
        let backup = if with_backup {
            serde_json::json!({"objectStore": {"endpoint": "http://store:9000", "bucket": "b", "credentialsSecret": {"name": "s3"}}})
        } else {
            serde_json::Value::Null
        };
        let mut database: DatabaseService = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
            "metadata": {"name": "orders", "namespace": "shop", "uid": "1", "generation": 2},
            "spec": {"version": "17.11", "storageSize": "1Gi", "databaseName": "app", "username": "app_user",
                     "replicas": 2, "backup": backup}
        }))
        .unwrap();
        if !with_backup {
            database.spec.backup = None;
        }
        database
    }

    fn running_15() -> DatabaseServiceStatus {
        DatabaseServiceStatus {
            failover: FailoverStatus {
                current_primary: Some("orders-1".into()),
                target_primary: Some("orders-1".into()),
                timeline: Some(3),
                ..Default::default()
            },
            last_stable_version: Some("15.18".into()),
            last_stable_image: Some("postgres:15.18".into()),
            current_version: Some("15.18".into()),
            ..Default::default()
        }
    }

    fn rollout() -> Rollout {
        Rollout {
            version: "17.11".into(),
            image: "postgres:17.11".into(),
            replicas: 2,
            rolled_back: false,
            changed_workload: false,
        }
    }

    fn health(name: &str, image: &str, ready: bool) -> PodHealth {
        PodHealth {
            name: name.into(),
            ordinal: name.rsplit('-').next().unwrap().parse().unwrap(),
            ready,
            crash_looping: false,
            unschedulable: false,
            unhealthy_since: None,
            image: image.into(),
            unschedulable_reason: None,
            terminating: false,
        }
    }

    fn report(role: Role, upgrade: Option<InstanceUpgradeReport>, timeline: u32) -> InstanceReport {
        InstanceReport {
            role,
            timeline,
            received_lsn: None,
            replay_lsn: None,
            wal_receiver: role == Role::Standby,
            postgres_ready: true,
            fenced: false,
            disk_full: false,
            shutdown_checkpoint_lsn: None,
            archiving: None,
            parameters: None,
            pending_restart: Vec::new(),
            declared: None,
            import: None,
            major_upgrade: upgrade,
            owned_settings_reverted: None,
            waits_for: None,
            discarded_on_rejoin: None,
            reloaded: None,
            volume: None,
        }
    }

    fn upgrade_report(state: InstanceUpgradeState, message: Option<&str>) -> InstanceUpgradeReport {
        InstanceUpgradeReport {
            state,
            from_major: 15,
            to_major: 17,
            steps: vec![UpgradeStep { name: "pg_upgrade".into(), milliseconds: 2500 }],
            message: message.map(String::from),
            analyze: Some("stage 1 of 3".into()),
        }
    }

    struct Pass {
        decision: MajorUpgradeDecision,
        rollout: Rollout,
        journal: Journal,
    }

    fn pass(
        database: &DatabaseService,
        status: &mut DatabaseServiceStatus,
        instances: &[(PodHealth, Option<InstanceReport>)],
        backup: Option<BackupObservation>,
        rolled_out: bool,
        now: DateTime<Utc>,
    ) -> Pass {
        let mut rollout = rollout();
        if status.failed_generation == database.metadata.generation {
            rollout.rolled_back = true;
            rollout.version = status.last_stable_version.clone().unwrap();
            rollout.image = status.last_stable_image.clone().unwrap();
        }
        let mut journal = Journal::default();
        let input = MajorUpgradeInput { database, instances, backup: backup.as_ref(), rolled_out, now };
        let decision = decide_major_upgrade(&input, status, &mut rollout, &mut journal);
        Pass { decision, rollout, journal }
    }

    fn old_pods() -> Vec<(PodHealth, Option<InstanceReport>)> {
        vec![
            (health("orders-0", "postgres:15.18", true), Some(report(Role::Standby, None, 3))),
            (health("orders-1", "postgres:15.18", true), Some(report(Role::Primary, None, 3))),
        ]
    }

    #[test]
    fn with_a_backup_the_old_image_stays_until_the_backup_completed() {
        let database = database(true);
        let mut status = running_15();
        let first = pass(&database, &mut status, &old_pods(), None, false, at(0));
        let upgrade = status.major_upgrade.clone().unwrap();
        assert_eq!(upgrade.phase, MajorUpgradePhase::BackingUp);
        assert_eq!(upgrade.primary, "orders-1");
        assert_eq!(first.decision.create_backup.as_deref(), Some("orders-before-pg17"));
        assert_eq!(first.rollout.image, "postgres:15.18", "no pod gets the new image before the backup");
        assert_eq!(first.decision.primary_first, None);
        assert!(first.journal.reasons().contains(&"MajorUpgradeStarted"));
        let running = BackupObservation { phase: Some(BackupPhase::Running), message: None };
        let waiting = pass(&database, &mut status, &old_pods(), Some(running), false, at(10));
        assert_eq!(waiting.decision.create_backup, None);
        assert_eq!(waiting.rollout.image, "postgres:15.18");
        let done = BackupObservation { phase: Some(BackupPhase::Completed), message: None };
        let upgrading = pass(&database, &mut status, &old_pods(), Some(done), false, at(20));
        assert_eq!(status.major_upgrade.as_ref().unwrap().phase, MajorUpgradePhase::Upgrading);
        assert_eq!(upgrading.rollout.image, "postgres:17.11");
        assert_eq!(upgrading.decision.primary_first.as_deref(), Some("orders-1"));
    }

    #[test]
    fn a_failed_backup_ends_the_upgrade_before_anything_changed() {
        let database = database(true);
        let mut status = running_15();
        pass(&database, &mut status, &old_pods(), None, false, at(0));
        let failed = BackupObservation { phase: Some(BackupPhase::Failed), message: Some("store unreachable".into()) };
        let ended = pass(&database, &mut status, &old_pods(), Some(failed), false, at(10));
        let upgrade = status.major_upgrade.clone().unwrap();
        assert_eq!(upgrade.phase, MajorUpgradePhase::RolledBack);
        assert!(upgrade.message.unwrap().contains("store unreachable"));
        assert!(ended.rollout.rolled_back);
        assert_eq!(ended.rollout.image, "postgres:15.18");
        assert_eq!(status.failed_generation, Some(2));
    }

    #[test]
    fn the_primary_upgraded_then_the_standbys_recloned_then_completed_with_a_new_archive() {
        let database = database(true);
        let mut status = running_15();
        status.major_upgrade = Some(MajorUpgradeStatus {
            phase: MajorUpgradePhase::Upgrading,
            ..start(&database, &status, &rollout(), at(0)).unwrap()
        });
        primary_stopped(&mut status, at(5));
        // The new primary's pod waits for pg_upgrade: nothing moves.
        let pods = vec![
            (health("orders-0", "postgres:15.18", true), Some(report(Role::Standby, None, 3))),
            (health("orders-1", "postgres:17.11", false), None),
        ];
        let waiting = pass(&database, &mut status, &pods, None, false, at(6));
        assert_eq!(status.major_upgrade.as_ref().unwrap().phase, MajorUpgradePhase::Upgrading);
        assert_eq!(waiting.decision.primary_first.as_deref(), Some("orders-1"));
        assert!(status.major_upgrade.as_ref().unwrap().holds_failover());
        // It runs the new major: downtime and steps recorded, the timeline is the new system's.
        let upgraded = Some(upgrade_report(InstanceUpgradeState::Upgraded, None));
        let pods = vec![
            (health("orders-0", "postgres:15.18", true), Some(report(Role::Standby, None, 3))),
            (health("orders-1", "postgres:17.11", true), Some(report(Role::Primary, upgraded.clone(), 1))),
        ];
        pass(&database, &mut status, &pods, None, false, at(17));
        let upgrade = status.major_upgrade.clone().unwrap();
        assert_eq!(upgrade.phase, MajorUpgradePhase::Recloning);
        assert_eq!(upgrade.downtime_milliseconds, Some(12_000));
        assert_eq!(upgrade.steps.len(), 1);
        assert_eq!(status.failover.timeline, Some(1));
        assert_eq!(database_with(&database, &status).archive_server_name().as_deref(), Some("orders-pg17"));
        // Every pod runs 17 (the last stable version is 17 by now) but the standby does not stream yet.
        status.last_stable_version = Some("17.11".into());
        status.last_stable_image = Some("postgres:17.11".into());
        let mut standby = report(Role::Standby, None, 1);
        standby.wal_receiver = false;
        let pods = vec![
            (health("orders-0", "postgres:17.11", true), Some(standby)),
            (health("orders-1", "postgres:17.11", true), Some(report(Role::Primary, upgraded.clone(), 1))),
        ];
        pass(&database, &mut status, &pods, None, true, at(30));
        assert_eq!(status.major_upgrade.as_ref().unwrap().phase, MajorUpgradePhase::Recloning);
        assert_eq!(status.major_upgrade.as_ref().unwrap().analyze.as_deref(), Some("stage 1 of 3"));
        let pods = vec![
            (health("orders-0", "postgres:17.11", true), Some(report(Role::Standby, None, 1))),
            (health("orders-1", "postgres:17.11", true), Some(report(Role::Primary, upgraded, 1))),
        ];
        let done = pass(&database, &mut status, &pods, None, true, at(40));
        assert_eq!(status.major_upgrade.as_ref().unwrap().phase, MajorUpgradePhase::Completed);
        assert_eq!(status.archive_server_name.as_deref(), Some("orders-pg17"));
        assert!(done.journal.reasons().contains(&"MajorUpgraded"));
        assert_eq!(done.decision.primary_first, None);
        assert!(!status.major_upgrade.as_ref().unwrap().holds_failover());
    }

    #[test]
    fn a_refusal_rolls_back_at_once_and_the_old_primary_returns_first() {
        let database = database(false);
        let mut status = running_15();
        pass(&database, &mut status, &old_pods(), None, false, at(0));
        assert_eq!(status.major_upgrade.as_ref().unwrap().phase, MajorUpgradePhase::Upgrading);
        let refused =
            Some(upgrade_report(InstanceUpgradeState::Failed, Some("pg_upgrade --check refused the upgrade: reg*")));
        let pods = vec![
            (health("orders-0", "postgres:15.18", true), Some(report(Role::Standby, None, 3))),
            (health("orders-1", "postgres:17.11", false), Some(report(Role::Primary, refused, 3))),
        ];
        let rolled = pass(&database, &mut status, &pods, None, false, at(10));
        assert!(rolled.rollout.rolled_back);
        assert_eq!(rolled.rollout.image, "postgres:15.18");
        assert_eq!(rolled.decision.primary_first.as_deref(), Some("orders-1"));
        let upgrade = status.major_upgrade.clone().unwrap();
        assert_eq!(upgrade.phase, MajorUpgradePhase::RollingBack);
        assert!(upgrade.message.clone().unwrap().contains("reg*"));
        assert!(upgrade.holds_failover());
        let condition = status.conditions.iter().find(|condition| condition.type_ == "RolledBack").unwrap();
        assert_eq!(condition.reason, "UpgradeFailed");
        // The old primary answers again on 15: rolled back, failover free again.
        let back = pass(&database, &mut status, &old_pods(), None, true, at(20));
        assert_eq!(status.major_upgrade.as_ref().unwrap().phase, MajorUpgradePhase::RolledBack);
        assert!(back.journal.reasons().contains(&"MajorUpgradeRolledBack"));
        let after = pass(&database, &mut status, &old_pods(), None, true, at(30));
        assert_eq!(after.decision, MajorUpgradeDecision::default());
    }

    #[test]
    fn a_minor_change_or_no_settled_primary_starts_nothing() {
        let database = database(false);
        let mut status = running_15();
        status.last_stable_version = Some("17.10".into());
        pass(&database, &mut status, &old_pods(), None, false, at(0));
        assert_eq!(status.major_upgrade, None);
        let mut status = running_15();
        status.failover.target_primary = Some("pending".into());
        let waiting = pass(&database, &mut status, &old_pods(), None, false, at(0));
        assert_eq!(status.major_upgrade, None);
        assert_eq!(waiting.rollout.image, "postgres:15.18", "no new image before the upgrade can start");
    }

    fn database_with(database: &DatabaseService, status: &DatabaseServiceStatus) -> DatabaseService {
        DatabaseService { status: Some(status.clone()), ..database.clone() }
    }
}
