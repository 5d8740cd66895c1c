//! History limits (pure): which finished backup objects of one database to delete so that at
//! most N completed and M failed ones remain. Deleting an object deletes its Job (owner
//! reference), never the backup in the store: the retention policy decides that.

use crate::api::database_service_backup::BackupPhase;
use chrono::{DateTime, Utc};

/// What history pruning needs to know about one backup object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// Object name.
    pub name: String,
    /// Its phase.
    pub phase: Option<BackupPhase>,
    /// metadata.creationTimestamp.
    pub created: Option<DateTime<Utc>>,
    /// The cron time it was created for, when the scheduler created it.
    pub scheduled_at: Option<DateTime<Utc>>,
}

/// Names to delete: the completed ones beyond the newest `keep_completed`, the failed ones
/// beyond the newest `keep_failed`. Unfinished backups are never deleted, nor the newest
/// scheduled one (the scheduler's memory of its last run: without it, a run would be due again).
pub fn history_to_delete(entries: &[HistoryEntry], keep_completed: usize, keep_failed: usize) -> Vec<String> {
    let newest_scheduled = entries
        .iter()
        .filter(|entry| entry.scheduled_at.is_some())
        .max_by(|left, right| (left.scheduled_at, &left.name).cmp(&(right.scheduled_at, &right.name)))
        .map(|entry| entry.name.clone());
    let mut newest_first: Vec<&HistoryEntry> = entries.iter().collect();
    newest_first.sort_by(|left, right| (right.created, &right.name).cmp(&(left.created, &left.name)));
    let mut delete = Vec::new();
    for (phase, keep) in [(BackupPhase::Completed, keep_completed), (BackupPhase::Failed, keep_failed)] {
        delete.extend(
            newest_first
                .iter()
                .filter(|entry| entry.phase == Some(phase))
                .skip(keep)
                .filter(|entry| Some(&entry.name) != newest_scheduled.as_ref())
                .map(|entry| entry.name.clone()),
        );
    }
    delete.sort();
    delete
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: u32) -> Option<DateTime<Utc>> {
        Some(DateTime::parse_from_rfc3339(&format!("2026-12-01T01:{minute:02}:00Z")).unwrap().with_timezone(&Utc))
    }

    fn entry(name: &str, phase: Option<BackupPhase>, minute: u32) -> HistoryEntry {
        HistoryEntry { name: name.into(), phase, created: at(minute), scheduled_at: None }
    }

    #[test]
    fn keeps_the_newest_completed_and_failed_and_deletes_the_rest() {
        let entries = vec![
            entry("c1", Some(BackupPhase::Completed), 1),
            entry("f1", Some(BackupPhase::Failed), 2),
            entry("c2", Some(BackupPhase::Completed), 3),
            entry("f2", Some(BackupPhase::Failed), 4),
            entry("c3", Some(BackupPhase::Completed), 5),
            entry("f3", Some(BackupPhase::Failed), 6),
        ];
        assert_eq!(history_to_delete(&entries, 2, 1), vec!["c1", "f1", "f2"]);
        assert_eq!(history_to_delete(&entries, 3, 3), Vec::<String>::new());
    }

    #[test]
    fn never_deletes_unfinished_backups() {
        let entries = vec![
            entry("pending", Some(BackupPhase::Pending), 1),
            entry("running", Some(BackupPhase::Running), 2),
            entry("new", None, 3),
            entry("done", Some(BackupPhase::Completed), 4),
        ];
        assert_eq!(history_to_delete(&entries, 1, 1), Vec::<String>::new());
    }

    #[test]
    fn keeps_the_newest_scheduled_backup_even_beyond_the_limit() {
        let mut scheduled = entry("orders-202612010100", Some(BackupPhase::Completed), 1);
        scheduled.scheduled_at = at(0);
        let mut older_scheduled = entry("orders-202612010000", Some(BackupPhase::Completed), 0);
        older_scheduled.scheduled_at = at(0).map(|time| time - chrono::Duration::hours(1));
        let entries = vec![
            older_scheduled,
            scheduled,
            entry("manual-1", Some(BackupPhase::Completed), 2),
            entry("manual-2", Some(BackupPhase::Completed), 3),
        ];
        assert_eq!(history_to_delete(&entries, 2, 1), vec!["orders-202612010000"]);
    }
}
