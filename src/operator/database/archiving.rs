//! Decide (pure), WAL archiving part (issue 12): from the current primary's report to the
//! `ContinuousArchiving` condition, the Warning event and ledger entry once archiving has failed
//! for longer than `spec.backup.archiveFailureWarningSeconds`, and the Normal event and entry when
//! it recovers. A failing archive_command makes PostgreSQL keep every later segment in pg_wal,
//! which fills the volume and stops the database (cnpg#7570, cnpg#9824): the warning has to come
//! first.
//!
//! Only the primary archives (`archive_mode = on`), so only its report counts. The condition's
//! message names the failing segment and since when, and nothing that changes by itself, so a
//! pass that learns nothing new writes nothing.

use crate::api::backup::BackupSpec;
use crate::api::database_service::DatabaseServiceStatus;
use crate::api::failover::ArchivingReport;
use crate::operator::conditions::{self, types};
use crate::operator::journal::{rfc3339, Journal, Transition};
use crate::operator::ledger::LedgerEntry;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// ContinuousArchiving=True: the last archive attempt succeeded (or none has failed).
pub const ARCHIVING_REASON: &str = "Archiving";
/// ContinuousArchiving=False, for less than the warning threshold.
pub const FAILING_REASON: &str = "ArchiveFailing";
/// ContinuousArchiving=False for longer than the threshold: the Warning event was sent.
pub const FAILING_TOO_LONG_REASON: &str = "ArchiveFailingTooLong";
/// Reason of the Warning event (and action of its ledger entry).
pub const FAILING_EVENT: &str = "WalArchivingFailing";
/// Reason of the Normal event when archiving works again after the warning.
pub const RECOVERED_EVENT: &str = "WalArchivingRecovered";

/// What the metrics should show about one database's archiving.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArchivingHealth {
    /// No `spec.backup`: no archiving, no series.
    NotConfigured,
    /// Configured, but the primary has not reported on it (starting, down, or changing).
    Unknown,
    /// The last attempt succeeded.
    Healthy,
    /// Failing since then.
    Failing {
        /// Start of the failing streak.
        since: DateTime<Utc>,
    },
}

/// What the archiving step decided besides the status and journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchivingOutcome {
    /// For the metrics.
    pub health: ArchivingHealth,
    /// Failing but not yet for the threshold: look again when it is reached (no report will
    /// change in the meantime, so no watch event would wake the controller).
    pub warn_in: Option<Duration>,
}

/// Decides the archiving step: sets or removes the condition in `status`, records events.
/// `report` is the current primary's archiving report.
pub fn decide_archiving(
    backup: Option<&BackupSpec>,
    primary: Option<&str>,
    report: Option<&ArchivingReport>,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    generation: i64,
    now: DateTime<Utc>,
) -> ArchivingOutcome {
    let kind = types::CONTINUOUS_ARCHIVING;
    let Some(backup) = backup else {
        conditions::remove(&mut status.conditions, kind);
        return ArchivingOutcome { health: ArchivingHealth::NotConfigured, warn_in: None };
    };
    let (Some(primary), Some(report)) = (primary, report) else {
        // Unknown: what was last known stays in the condition.
        return ArchivingOutcome { health: ArchivingHealth::Unknown, warn_in: None };
    };
    let previous_reason = status
        .conditions
        .iter()
        .find(|condition| condition.type_ == kind)
        .map(|condition| condition.reason.clone())
        .unwrap_or_default();
    let observed_generation = Some(generation);
    if !report.failing {
        let message = format!("primary {primary} archives its WAL to the object store");
        conditions::set(&mut status.conditions, kind, true, ARCHIVING_REASON, message, observed_generation, now);
        if previous_reason == FAILING_TOO_LONG_REASON {
            let note = format!("WAL archiving works again on primary {primary}");
            let entry = LedgerEntry::at(now, generation, RECOVERED_EVENT, "failing", "archiving", &note);
            journal.record(false, RECOVERED_EVENT, note, Some(entry));
        }
        return ArchivingOutcome { health: ArchivingHealth::Healthy, warn_in: None };
    }
    let since = report.failing_since.unwrap_or(now);
    let segment = report.failed_wal.as_deref().unwrap_or("unknown");
    let threshold = backup.archive_failure_warning();
    let failing_for = (now - since).to_std().unwrap_or(Duration::ZERO);
    let health = ArchivingHealth::Failing { since };
    if failing_for < threshold {
        let message = format!(
            "primary {primary} has failed to archive WAL segment {segment} since {}; PostgreSQL keeps it in pg_wal and retries",
            rfc3339(since)
        );
        conditions::set(&mut status.conditions, kind, false, FAILING_REASON, message, observed_generation, now);
        return ArchivingOutcome { health, warn_in: Some((threshold - failing_for).max(Duration::from_secs(1))) };
    }
    let message = format!(
        "primary {primary} has failed to archive WAL segment {segment} since {} (longer than {}s): every later segment stays in pg_wal until the object store accepts it, and a full volume stops the database; check the store, its credentials and the primary's log",
        rfc3339(since),
        threshold.as_secs()
    );
    let outcome = format!("failing since {}", rfc3339(since));
    let transition = Transition {
        condition: kind,
        status: false,
        condition_reason: FAILING_TOO_LONG_REASON,
        event_reason: FAILING_EVENT,
        warning: true,
        message,
        entry: Some(LedgerEntry::at(now, generation, FAILING_EVENT, segment, "", outcome)),
    };
    journal.transition_on_change(&mut status.conditions, transition, generation, now);
    ArchivingOutcome { health, warn_in: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    const SEGMENT: &str = "000000010000000000000007";

    fn at(second: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + second, 0).unwrap()
    }

    fn backup(warning_seconds: Option<i32>) -> BackupSpec {
        BackupSpec { archive_failure_warning_seconds: warning_seconds, ..Default::default() }
    }

    fn failing(since: i64) -> ArchivingReport {
        ArchivingReport { failing: true, failing_since: Some(at(since)), failed_wal: Some(SEGMENT.into()) }
    }

    fn healthy() -> ArchivingReport {
        ArchivingReport { failing: false, failing_since: None, failed_wal: None }
    }

    /// One pass from `status`: the new status, the events' reasons, the outcome.
    fn pass(
        backup: Option<&BackupSpec>,
        report: Option<&ArchivingReport>,
        status: &DatabaseServiceStatus,
        now: i64,
    ) -> (DatabaseServiceStatus, Journal, ArchivingOutcome) {
        let mut status = status.clone();
        let mut journal = Journal::default();
        let outcome = decide_archiving(backup, Some("db-0"), report, &mut status, &mut journal, 1, at(now));
        (status, journal, outcome)
    }

    fn condition(status: &DatabaseServiceStatus) -> Option<(String, String)> {
        status
            .conditions
            .iter()
            .find(|condition| condition.type_ == types::CONTINUOUS_ARCHIVING)
            .map(|condition| (condition.status.clone(), condition.reason.clone()))
    }

    #[rustfmt::skip]
    #[test]
    fn the_condition_follows_the_primary_report_and_warns_once_after_the_threshold() {
        let spec = Some(backup(None));
        let short = Some(backup(Some(60)));
        let (ok, fail) = (Some(healthy()), Some(failing(100)));
        let fresh = DatabaseServiceStatus::default();
        let (healthy_status, _, _) = pass(spec.as_ref(), ok.as_ref(), &fresh, 0);
        let (early, _, _) = pass(spec.as_ref(), fail.as_ref(), &healthy_status, 150);
        let (warned, _, _) = pass(spec.as_ref(), fail.as_ref(), &early, 400);
        let failing_health = ArchivingHealth::Failing { since: at(100) };
        use ArchivingHealth::{Healthy, NotConfigured, Unknown};
        // name, spec.backup, primary report, status before, now → "status/reason", events, requeue, health
        let cases = [
            ("no backup spec", &None, &ok, &healthy_status, 0, "", &[][..], None, NotConfigured),
            ("healthy", &spec, &ok, &fresh, 0, "True/Archiving", &[], None, Healthy),
            ("not reported yet", &spec, &None, &fresh, 0, "", &[], None, Unknown),
            ("no report keeps what was known", &spec, &None, &early, 500, "False/ArchiveFailing", &[], None, Unknown),
            ("failing 50s of 300s", &spec, &fail, &healthy_status, 150, "False/ArchiveFailing", &[], Some(250), failing_health.clone()),
            ("threshold reached", &spec, &fail, &early, 400, "False/ArchiveFailingTooLong", &[FAILING_EVENT], None, failing_health.clone()),
            ("failing after the warning", &spec, &fail, &warned, 900, "False/ArchiveFailingTooLong", &[], None, failing_health.clone()),
            ("a 60s threshold", &short, &fail, &early, 160, "False/ArchiveFailingTooLong", &[FAILING_EVENT], None, failing_health),
            ("recovered after the warning", &spec, &ok, &warned, 950, "True/Archiving", &[RECOVERED_EVENT], None, Healthy),
            ("recovered before the warning: no event", &spec, &ok, &early, 200, "True/Archiving", &[], None, Healthy),
        ];
        for (name, backup, report, before, now, expected, events, warn_in, health) in cases {
            let (after, journal, outcome) = pass(backup.as_ref(), report.as_ref(), before, now);
            let found = condition(&after).map(|(status, reason)| format!("{status}/{reason}")).unwrap_or_default();
            assert_eq!(found, expected, "{name}: condition");
            assert_eq!(journal.reasons(), events, "{name}: events");
            assert_eq!(journal.entries.len(), events.len(), "{name}: one ledger entry per event");
            assert_eq!(outcome.warn_in.map(|wait| wait.as_secs()), warn_in, "{name}: requeue");
            assert_eq!(outcome.health, health, "{name}: health");
        }
    }

    #[test]
    fn repeated_passes_change_nothing() {
        let spec = backup(None);
        let mut status = DatabaseServiceStatus::default();
        for (report, start) in [(failing(0), 10), (failing(0), 400), (healthy(), 1000)] {
            let (first, _, _) = pass(Some(&spec), Some(&report), &status, start);
            for later in 1..50 {
                let (again, journal, _) = pass(Some(&spec), Some(&report), &first, start + later);
                assert_eq!(again, first, "a pass {later}s later changed the status");
                assert!(journal.is_empty(), "a pass {later}s later recorded {:?}", journal.reasons());
            }
            status = first;
        }
    }

    #[test]
    fn the_message_names_the_segment_and_the_start() {
        let (status, journal, _) = pass(Some(&backup(None)), Some(&failing(0)), &DatabaseServiceStatus::default(), 301);
        let message = &status.conditions[0].message;
        assert!(message.contains(SEGMENT) && message.contains(&rfc3339(at(0))), "{message}");
        assert_eq!(journal.entries[0].from, SEGMENT);
        assert!(journal.events[0].warning);
    }
}
