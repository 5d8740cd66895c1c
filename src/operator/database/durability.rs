//! Decide (pure), durability part (issue 38): records the durability in force in the status (the
//! agents follow it) once its change was told, follows a `preferred` primary's offer to make its
//! commits wait for its standbys and its return to acknowledging alone, and tells each change
//! (event, ledger entry, condition SynchronousReplication).

use crate::api::database_service::{DatabaseService, DatabaseServiceStatus};
use crate::api::failover::InstanceReport;
use crate::api::synchronous::{in_force, DataDurability, Durability};
use crate::operator::journal::Journal;
use crate::operator::ledger::LedgerEntry;
use chrono::{DateTime, Utc};

/// Condition type: whether every acknowledged commit is on a standby.
pub const CONDITION: &str = "SynchronousReplication";
/// Event and ledger action: the durability in force changed (a spec change or a new default).
pub const CHANGED: &str = "DataDurabilityChanged";
/// Event and ledger action: a `preferred` primary acknowledges commits alone.
pub const DEGRADED: &str = "SynchronousReplicationDegraded";
/// Event and ledger action: a `preferred` primary makes its commits wait for its standbys again.
pub const RESTORED: &str = "SynchronousReplicationRestored";

/// How many standbys a failover must assume confirmed the primary's commits, and among which
/// (None: every other instance): `required` always, `preferred` while the primary may wait for
/// the recorded ones.
pub fn synchronous_in_force(database: &DatabaseService, status: &DatabaseServiceStatus) -> (u32, Option<Vec<String>>) {
    let durability = in_force(database.spec.durability(), status.durability);
    match (durability.mode, waited_for(status)) {
        (DataDurability::Required, _) => (durability.standbys, None),
        (DataDurability::Preferred, Some(members)) => (durability.standbys, Some(members.to_vec())),
        (DataDurability::Preferred, None) | (DataDurability::None, _) => (0, None),
    }
}

/// The standbys the primary may wait for, when there are any.
fn waited_for(status: &DatabaseServiceStatus) -> Option<&[String]> {
    status.failover.primary_waits_for.as_deref().filter(|members| !members.is_empty())
}

/// One pass: the durability asked for becomes the one in force (told first), the primary's
/// `preferred` report is followed, the condition set.
pub fn keep_durability(
    database: &DatabaseService,
    primary: Option<&InstanceReport>,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    now: DateTime<Utc>,
) {
    let generation = database.metadata.generation.unwrap_or(0);
    let asked = database.spec.durability();
    let before = in_force(asked, status.durability);
    if status.durability != Some(asked) {
        if before != asked {
            let existing = status.failover.current_primary.is_some() && status.observed_generation.is_some();
            let note = change_note(before, asked, status.durability.is_none());
            let entry = LedgerEntry::at(now, generation, CHANGED, describe(before), describe(asked), note.clone());
            // A new database starts with its durability: only a running one is told.
            if existing {
                journal.record(asked.mode == DataDurability::None, CHANGED, note, Some(entry));
            }
        }
        status.durability = Some(asked);
        if asked.mode != DataDurability::Preferred {
            status.failover.primary_waits_for = None;
        }
    }
    // The list is the word of the primary that gave it: after a failover, the new primary is in
    // its predecessor's list and never waits for itself, so until it speaks it waits for the
    // others only (none, with two instances: the condition says so, and says nothing stale).
    let current = status.failover.current_primary.clone();
    if let Some(members) = status.failover.primary_waits_for.as_mut() {
        members.retain(|member| Some(member) != current.as_ref());
    }
    if asked.mode == DataDurability::Preferred {
        follow_primary(primary.and_then(|report| report.waits_for.clone()), status, journal, generation, now);
    }
    set_condition(asked, status, generation, now);
}

/// The primary's word on the standbys its commits may wait for (None: no word, the status keeps
/// the last one).
fn follow_primary(
    waits_for: Option<Vec<String>>,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    generation: i64,
    now: DateTime<Utc>,
) {
    let Some(mut waits_for) = waits_for else { return };
    waits_for.sort();
    waits_for.dedup();
    if status.failover.primary_waits_for.as_ref() == Some(&waits_for) {
        return;
    }
    let before = status.failover.primary_waits_for.as_ref().map(|members| !members.is_empty());
    let waits = !waits_for.is_empty();
    status.failover.primary_waits_for = Some(waits_for);
    // The first word of a new database is no news (the condition shows it), nor a standby more
    // or less among several.
    if before.is_none() || before == Some(waits) {
        return;
    }
    let (action, from, to, note) = if waits {
        (
            RESTORED,
            "primary alone",
            "standbys confirm",
            "a standby streams again: commits wait for it again (preferred durability)",
        )
    } else {
        (
            DEGRADED,
            "standbys confirm",
            "primary alone",
            "no standby streams (or a commit waited 5 s for one): the primary acknowledges commits alone (preferred durability); a failover now may lose the last commits",
        )
    };
    journal.record(!waits, action, note.into(), Some(LedgerEntry::at(now, generation, action, from, to, note)));
}

fn set_condition(asked: Durability, status: &mut DatabaseServiceStatus, generation: i64, now: DateTime<Utc>) {
    let waits = waited_for(status).is_some();
    let conditions = &mut status.conditions;
    let (holds, reason, message) = match asked.mode {
        DataDurability::None => return crate::operator::conditions::remove(conditions, CONDITION),
        DataDurability::Required => {
            (true, "Required", format!("every commit waits for {} standby(s) (required durability)", asked.standbys))
        }
        DataDurability::Preferred if waits => (
            true,
            "StandbysConfirm",
            format!("every commit waits for {} standby(s) (preferred durability)", asked.standbys),
        ),
        DataDurability::Preferred => (
            false,
            "PrimaryAlone",
            "the primary acknowledges commits without its standbys until one streams again (preferred durability): a failover may lose the last commits".to_string(),
        ),
    };
    crate::operator::conditions::set(conditions, CONDITION, holds, reason, message, Some(generation), now);
}

fn describe(durability: Durability) -> String {
    match durability.mode {
        DataDurability::None => "none".into(),
        mode => format!("{mode} ({} standby)", durability.standbys),
    }
}

fn change_note(before: Durability, after: Durability, new_default: bool) -> String {
    let (before, after) = (describe(before), describe(after));
    if new_default {
        format!(
            "data durability is now {after} (was {before}): this operator's default for two or more instances; \
             set spec.failover.dataDurability: none to keep asynchronous replication"
        )
    } else {
        format!("data durability changed from {before} to {after}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn database(failover: serde_json::Value, status: DatabaseServiceStatus) -> DatabaseService {
        let mut database: DatabaseService = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
            "metadata": {"name": "db", "namespace": "shop", "generation": 4},
            "spec": {"version": "16", "storageSize": "1Gi", "databaseName": "app", "username": "app_user",
                     "replicas": 2, "failover": failover},
        }))
        .unwrap();
        database.status = Some(status);
        database
    }

    fn running() -> DatabaseServiceStatus {
        let mut status = DatabaseServiceStatus { observed_generation: Some(3), ..Default::default() };
        status.failover.current_primary = Some("db-0".into());
        status
    }

    fn report(waits: Option<&[&str]>) -> InstanceReport {
        serde_json::from_value(serde_json::json!({
            "role": "primary", "timeline": 1, "walReceiver": false, "postgresReady": true, "fenced": false,
            "diskFull": false, "waitsFor": waits,
        }))
        .unwrap()
    }

    fn pass(database: &DatabaseService, primary: Option<&InstanceReport>) -> (DatabaseServiceStatus, Journal) {
        let mut status = database.status.clone().unwrap();
        let mut journal = Journal::default();
        keep_durability(database, primary, &mut status, &mut journal, Utc.timestamp_opt(1_800_000_000, 0).unwrap());
        (status, journal)
    }

    fn condition(status: &DatabaseServiceStatus) -> Option<(String, String)> {
        let found = status.conditions.iter().find(|condition| condition.type_ == CONDITION)?;
        Some((found.status.clone(), found.reason.clone()))
    }

    const PREFERRED: Durability = Durability { mode: DataDurability::Preferred, standbys: 1 };

    #[test]
    fn a_running_database_is_told_of_the_new_default_before_it_takes_effect() {
        let database = database(serde_json::json!({}), running());
        // Before the pass, nothing waits: the agents follow the recorded durability.
        assert_eq!(synchronous_in_force(&database, database.status.as_ref().unwrap()), (0, None));
        let (status, journal) = pass(&database, None);
        assert_eq!(journal.reasons(), [CHANGED]);
        assert!(journal.events[0].note.contains("set spec.failover.dataDurability: none"), "{:?}", journal.events);
        assert_eq!(
            (journal.entries[0].from.as_str(), journal.entries[0].to.as_str()),
            ("none", "preferred (1 standby)")
        );
        assert_eq!(status.durability, Some(PREFERRED));
        assert_eq!(condition(&status), Some(("False".into(), "PrimaryAlone".into())));
        // Told once.
        let (_, again) = pass(&database_with(status), None);
        assert!(again.is_empty(), "{:?}", again.events);
    }

    fn database_with(status: DatabaseServiceStatus) -> DatabaseService {
        database(serde_json::json!({}), status)
    }

    #[test]
    fn a_new_database_starts_with_its_durability_untold() {
        let database = database(serde_json::json!({}), DatabaseServiceStatus::default());
        let (status, journal) = pass(&database, None);
        assert!(journal.is_empty());
        assert_eq!(status.durability, Some(PREFERRED));
    }

    #[test]
    fn the_primarys_fallback_and_return_are_told_and_counted_by_the_failover() {
        let mut status = running();
        status.durability = Some(PREFERRED);
        let (status, journal) = pass(&database_with(status), Some(&report(Some(&["db-2", "db-1"]))));
        assert!(journal.is_empty(), "the first word is no news");
        let both = vec!["db-1".to_string(), "db-2".to_string()];
        assert_eq!(status.failover.primary_waits_for, Some(both.clone()));
        assert_eq!(condition(&status), Some(("True".into(), "StandbysConfirm".into())));
        assert_eq!(synchronous_in_force(&database_with(status.clone()), &status), (1, Some(both)));

        let (status, journal) = pass(&database_with(status), Some(&report(Some(&["db-2"]))));
        assert!(journal.is_empty(), "one standby fewer among several is no fallback");
        assert_eq!(synchronous_in_force(&database_with(status.clone()), &status), (1, Some(vec!["db-2".into()])));

        let (status, journal) = pass(&database_with(status), Some(&report(Some(&[]))));
        assert_eq!(journal.reasons(), [DEGRADED]);
        assert!(journal.events[0].warning);
        assert_eq!(journal.entries[0].action, DEGRADED);
        assert_eq!(condition(&status), Some(("False".into(), "PrimaryAlone".into())));
        assert_eq!(synchronous_in_force(&database_with(status.clone()), &status), (0, None));

        // No word (the primary's pod is gone): the last one stands.
        let (status, journal) = pass(&database_with(status), None);
        assert!(journal.is_empty());
        let (status, journal) = pass(&database_with(status), Some(&report(Some(&["db-1"]))));
        assert_eq!(journal.reasons(), [RESTORED]);
        assert!(!journal.events[0].warning);
        assert_eq!(status.failover.primary_waits_for, Some(vec!["db-1".to_string()]));
    }

    #[test]
    fn after_a_failover_the_new_primary_is_not_counted_as_its_own_standby() {
        // db-0 waited for db-1; db-1 is the primary now and has not said whom it waits for.
        let mut status = running();
        status.durability = Some(PREFERRED);
        status.failover.primary_waits_for = Some(vec!["db-1".into()]);
        status.failover.current_primary = Some("db-1".into());
        let (status, _) = pass(&database_with(status), None);
        assert_eq!(condition(&status), Some(("False".into(), "PrimaryAlone".into())), "no stale True");
        assert_eq!(synchronous_in_force(&database_with(status.clone()), &status), (0, None));
        // Its own word restores the condition.
        let (status, _) = pass(&database_with(status), Some(&report(Some(&["db-0"]))));
        assert_eq!(condition(&status), Some(("True".into(), "StandbysConfirm".into())));
    }

    #[test]
    fn required_counts_at_once_and_none_never() {
        let required = database(serde_json::json!({"synchronousStandbys": 1}), running());
        assert_eq!(synchronous_in_force(&required, required.status.as_ref().unwrap()), (1, None));
        let (status, journal) = pass(&required, None);
        assert!(journal.is_empty(), "required was in force before the mode existed");
        assert_eq!(condition(&status), Some(("True".into(), "Required".into())));

        let mut status = running();
        status.durability = Some(PREFERRED);
        status.failover.primary_waits_for = Some(vec!["db-1".into()]);
        let none = database(serde_json::json!({"dataDurability": "none"}), status);
        let until_recorded = synchronous_in_force(&none, none.status.as_ref().unwrap());
        assert_eq!(until_recorded, (1, Some(vec!["db-1".into()])));
        let (status, journal) = pass(&none, None);
        assert_eq!(journal.reasons(), [CHANGED]);
        assert!(journal.events[0].warning);
        assert_eq!((status.durability, status.failover.primary_waits_for.clone()), (Some(Durability::NONE), None));
        assert_eq!(condition(&status), None);
    }
}
