//! Decide (pure), the commits a failover gave up (issue 38): a former primary that rejoins as a
//! standby reports how much of its WAL the new primary never had, counted before pg_rewind
//! discarded it. Each new report becomes one Warning event and one ledger entry; the instance's
//! status keeps the last one told, so a report that stays the same is told once.

use crate::api::failover::{DiscardedOnRejoin, InstanceStatus};
use crate::operator::database::owned_settings::newly_reported;
use crate::operator::journal::Journal;
use crate::operator::ledger::LedgerEntry;
use chrono::{DateTime, Utc};

/// Reason of the Warning event (and action of its ledger entry).
pub const DISCARDED_EVENT: &str = "CommitsDiscarded";

/// Records an event and a ledger entry for every instance of `next` whose last rejoin with
/// discarded commits differs from the one `previous` (the stored status) shows.
pub fn tell_discarded(
    previous: &[InstanceStatus],
    next: &[InstanceStatus],
    journal: &mut Journal,
    generation: i64,
    now: DateTime<Utc>,
) {
    for (name, discarded) in newly_reported(previous, next, |instance| instance.discarded_on_rejoin.as_ref()) {
        let (note, outcome) = describe(name, discarded);
        let from = format!("{name} WAL after {}", discarded.diverged_at);
        let entry = LedgerEntry::at(now, generation, DISCARDED_EVENT, &from, "discarded by pg_rewind", outcome);
        journal.record(true, DISCARDED_EVENT, note, Some(entry));
    }
}

/// The event's note and the ledger entry's outcome.
fn describe(instance: &str, discarded: &DiscardedOnRejoin) -> (String, String) {
    let what = format!(
        "{} commits ({} bytes of WAL) after {} on timeline {}",
        discarded.commits, discarded.bytes, discarded.diverged_at, discarded.timeline
    );
    let note = format!(
        "former primary {instance} rejoined as a standby at {} and discarded {what} that the new primary never had: \
         a failover gave them up (under asynchronous replication, or beyond maximumLagBytes when allowed, clients may have been told they committed)",
        discarded.at
    );
    (note, format!("{instance} gave up {what} at {}", discarded.at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn instance(name: &str, commits: Option<u64>) -> InstanceStatus {
        InstanceStatus {
            name: name.into(),
            discarded_on_rejoin: commits.map(|commits| DiscardedOnRejoin {
                at: "2026-12-07T06:00:00Z".into(),
                diverged_at: "0/3043028".into(),
                timeline: 2,
                commits,
                bytes: 11_720,
            }),
            ..InstanceStatus::default()
        }
    }

    #[test]
    fn each_new_rejoin_that_discarded_commits_is_told_once() {
        let now = Utc.with_ymd_and_hms(2026, 12, 7, 6, 0, 1).unwrap();
        let mut journal = Journal::default();
        tell_discarded(&[instance("db-0", None)], &[instance("db-0", Some(12))], &mut journal, 3, now);
        assert_eq!(journal.reasons(), vec![DISCARDED_EVENT]);
        let entry = &journal.entries[0];
        assert!(entry.outcome.contains("12 commits (11720 bytes of WAL) after 0/3043028"), "{}", entry.outcome);

        let mut again = Journal::default();
        tell_discarded(&[instance("db-0", Some(12))], &[instance("db-0", Some(12))], &mut again, 3, now);
        tell_discarded(&[], &[instance("db-1", None)], &mut again, 3, now);
        assert!(again.is_empty(), "told once; an instance without a report tells nothing");
    }
}
