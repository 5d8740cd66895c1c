//! Decide (pure), owned settings part (issue 37): an agent that put back settings the operator
//! owns after an `ALTER SYSTEM` by someone else reports it; each new revert becomes one Warning
//! event and one ledger entry. The instance's status keeps the last revert told, so a report
//! that stays the same is told once, and the next revert (a repeated `ALTER SYSTEM`) again.

use crate::api::failover::{InstanceStatus, OwnedSettingsReverted};
use crate::operator::journal::Journal;
use crate::operator::ledger::LedgerEntry;
use chrono::{DateTime, Utc};

/// Reason of the Warning event (and action of its ledger entry).
pub const REVERTED_EVENT: &str = "OwnedSettingReverted";

/// Records an event and a ledger entry for every instance of `next` whose last revert differs
/// from the one `previous` (the stored status) shows.
pub fn tell_reverts(
    previous: &[InstanceStatus],
    next: &[InstanceStatus],
    journal: &mut Journal,
    generation: i64,
    now: DateTime<Utc>,
) {
    for (name, reverted) in newly_reported(previous, next, |instance| instance.owned_settings_reverted.as_ref()) {
        let (note, outcome) = describe(name, reverted);
        let entry = LedgerEntry::at(now, generation, REVERTED_EVENT, "ALTER SYSTEM", "operator's value", outcome);
        journal.record(true, REVERTED_EVENT, note, Some(entry));
    }
}

/// The instances of `next` whose `field` is set and differs from what `previous` (the stored
/// status) shows for them, with that value: the reports not told yet (each is told once).
pub fn newly_reported<'a, T: PartialEq + 'a>(
    previous: &'a [InstanceStatus],
    next: &'a [InstanceStatus],
    field: impl Fn(&'a InstanceStatus) -> Option<&'a T> + Copy + 'a,
) -> impl Iterator<Item = (&'a str, &'a T)> + 'a {
    next.iter().filter_map(move |instance| {
        let reported = field(instance)?;
        let told = previous.iter().find(|old| old.name == instance.name).and_then(field);
        (told != Some(reported)).then_some((instance.name.as_str(), reported))
    })
}

/// The event's note and the ledger entry's outcome: names only, never values.
fn describe(instance: &str, reverted: &OwnedSettingsReverted) -> (String, String) {
    let names = reverted.settings.join(", ");
    let note = format!(
        "instance {instance} put back {names} at {}: the operator owns these settings, and an ALTER SYSTEM had changed them in postgresql.auto.conf",
        reverted.at
    );
    let outcome =
        format!("instance {instance} reset {names} at {} (revert {} of its agent)", reverted.at, reverted.count);
    (note, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn instance(name: &str, reverted: Option<(&str, u64)>) -> InstanceStatus {
        InstanceStatus {
            name: name.into(),
            owned_settings_reverted: reverted.map(|(at, count)| OwnedSettingsReverted {
                at: at.into(),
                settings: vec!["wal_level".into(), "archive_command".into()],
                count,
            }),
            ..Default::default()
        }
    }

    fn told(previous: &[InstanceStatus], next: &[InstanceStatus]) -> Journal {
        let mut journal = Journal::default();
        tell_reverts(previous, next, &mut journal, 3, Utc.timestamp_opt(1_800_000_000, 0).unwrap());
        journal
    }

    #[test]
    fn a_new_revert_is_one_warning_and_one_entry_naming_the_settings() {
        let journal = told(&[instance("db-0", None)], &[instance("db-0", Some(("2027-01-15T08:00:00Z", 1)))]);
        assert_eq!(journal.reasons(), [REVERTED_EVENT]);
        assert!(journal.events[0].warning);
        assert!(journal.events[0].note.contains("wal_level, archive_command"), "{}", journal.events[0].note);
        assert_eq!(journal.entries.len(), 1);
        assert_eq!(journal.entries[0].action, REVERTED_EVENT);
        assert!(journal.entries[0].outcome.contains("db-0 reset wal_level, archive_command at 2027-01-15T08:00:00Z"));
    }

    #[test]
    fn a_revert_already_told_is_not_told_again_but_the_next_one_is() {
        let first = [instance("db-0", Some(("2027-01-15T08:00:00Z", 1)))];
        assert!(told(&first, &first).is_empty());
        // The same second, another revert: its number tells it apart.
        let second = [instance("db-0", Some(("2027-01-15T08:00:00Z", 2)))];
        assert_eq!(told(&first, &second).reasons(), [REVERTED_EVENT]);
        // Nothing reverted, or an instance not reporting: nothing to tell.
        assert!(told(&first, &[instance("db-0", None), instance("db-1", None)]).is_empty());
    }

    #[test]
    fn each_instance_is_told_on_its_own() {
        let previous = [instance("db-0", Some(("2027-01-15T08:00:00Z", 1))), instance("db-1", None)];
        let next =
            [instance("db-0", Some(("2027-01-15T08:00:00Z", 1))), instance("db-1", Some(("2027-01-15T08:00:05Z", 1)))];
        let journal = told(&previous, &next);
        assert_eq!(journal.events.len(), 1);
        assert!(journal.events[0].note.starts_with("instance db-1 "));
    }
}
