//! Decide (pure): what the restoring pod reports, copied into `status.recovery`, the Recovered
//! condition and the journal.

use crate::api::recovery::{RecoveryPhase, RecoveryStatus, RECOVERED_CONDITION};

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
    status: &mut crate::api::database_service::DatabaseServiceStatus,
    reported: Option<RecoveryStatus>,
    generation: i64,
    now: chrono::DateTime<chrono::Utc>,
    journal: &mut crate::operator::journal::Journal,
) {
    use crate::operator::conditions;
    use crate::operator::ledger::LedgerEntry;
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
        let mut status = crate::api::database_service::DatabaseServiceStatus::default();
        let mut journal = crate::operator::journal::Journal::default();
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
        let mut status = crate::api::database_service::DatabaseServiceStatus::default();
        let mut journal = crate::operator::journal::Journal::default();
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
}
