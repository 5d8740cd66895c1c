//! What a pass decided to tell: Kubernetes events and ledger entries, collected by the pure
//! stages and written once by `publish`. Also the time helpers every stage shares.

use crate::operator::conditions;
use crate::operator::ledger::LedgerEntry;
use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// One Kubernetes event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalEvent {
    /// Warning rather than Normal.
    pub warning: bool,
    /// CamelCase reason, such as Restarted.
    pub reason: String,
    /// What happened, for people.
    pub note: String,
    /// The action taken (usually the reason).
    pub action: String,
}

/// One change worth telling, recorded at once by [`Journal::transition`]: the condition it sets,
/// the event that announces it and, when it belongs in the history, its ledger entry.
#[derive(Clone, Debug)]
pub struct Transition<'a> {
    /// Condition type set, such as `Degraded`.
    pub condition: &'a str,
    /// The condition's new status.
    pub status: bool,
    /// The condition's reason, such as `InsufficientResources`.
    pub condition_reason: &'a str,
    /// The event's reason, such as `Degraded`.
    pub event_reason: &'a str,
    /// A Warning event rather than a Normal one.
    pub warning: bool,
    /// What happened, for people: the event's note and the condition's message.
    pub message: String,
    /// The ledger entry, when the change belongs in the history.
    pub entry: Option<LedgerEntry>,
}

/// Events and ledger entries of one pass, published at its end.
#[derive(Clone, Debug, Default)]
pub struct Journal {
    /// Ledger entries, oldest first.
    pub entries: Vec<LedgerEntry>,
    /// Events, in the order they happened.
    pub events: Vec<JournalEvent>,
}

/// A position in a [`Journal`]: how many entries and events it held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalMark {
    entries: usize,
    events: usize,
}

impl Journal {
    /// Records an event (Warning when `warning`) and optionally a ledger entry.
    pub fn record(&mut self, warning: bool, reason: &str, note: String, entry: Option<LedgerEntry>) {
        self.events.push(JournalEvent { warning, reason: reason.into(), note, action: reason.into() });
        self.entries.extend(entry);
    }

    /// Records a [`Transition`]: sets its condition in `conditions` and records its event and
    /// ledger entry, so that the three never disagree.
    pub fn transition(
        &mut self,
        conditions: &mut Vec<Condition>,
        transition: Transition<'_>,
        generation: i64,
        now: DateTime<Utc>,
    ) {
        let Transition { condition, status, condition_reason, event_reason, warning, message, entry } = transition;
        conditions::set(conditions, condition, status, condition_reason, message.clone(), Some(generation), now);
        self.record(warning, event_reason, message, entry);
    }

    /// Like [`Journal::transition`], told once: the event and the ledger entry only when the
    /// condition's status or reason changes (a pass that finds the same state again keeps the
    /// condition's message current and tells nobody).
    pub fn transition_on_change(
        &mut self,
        conditions: &mut Vec<Condition>,
        transition: Transition<'_>,
        generation: i64,
        now: DateTime<Utc>,
    ) {
        let status = if transition.status { "True" } else { "False" };
        let unchanged = conditions.iter().any(|existing| {
            existing.type_ == transition.condition
                && existing.status == status
                && existing.reason == transition.condition_reason
        });
        if unchanged {
            let Transition { condition, status, condition_reason, message, .. } = transition;
            conditions::set(conditions, condition, status, condition_reason, message, Some(generation), now);
        } else {
            self.transition(conditions, transition, generation, now);
        }
    }

    /// Appends everything recorded in `other`.
    pub fn extend(&mut self, other: Journal) {
        self.entries.extend(other.entries);
        self.events.extend(other.events);
    }

    /// Where the journal stands now, for [`Journal::since`].
    pub fn mark(&self) -> JournalMark {
        JournalMark { entries: self.entries.len(), events: self.events.len() }
    }

    /// What was recorded after `mark`.
    pub fn since(&self, mark: JournalMark) -> Journal {
        Journal {
            entries: self.entries.get(mark.entries..).unwrap_or_default().to_vec(),
            events: self.events.get(mark.events..).unwrap_or_default().to_vec(),
        }
    }

    /// Reasons of the recorded events, for tests and logs.
    pub fn reasons(&self) -> Vec<&str> {
        self.events.iter().map(|event| event.reason.as_str()).collect()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.events.is_empty()
    }
}

/// The current time; only the reconcile entry point reads the clock, the stages get it passed in.
pub fn now() -> DateTime<Utc> {
    Utc::now()
}

/// RFC 3339 in whole seconds, as written to status and the ledger.
pub fn rfc3339(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Parses a time written by [`rfc3339`]; None when absent or unreadable.
pub fn parse_time(text: &Option<String>) -> Option<DateTime<Utc>> {
    text.as_deref().and_then(|text| DateTime::parse_from_rfc3339(text).ok()).map(|time| time.with_timezone(&Utc))
}

/// Seconds from `since` to `now` (negative when `since` is in the future).
pub fn seconds_between(since: DateTime<Utc>, now: DateTime<Utc>) -> i64 {
    (now - since).num_seconds()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transition_sets_its_condition_and_records_its_event_and_entry_together() {
        let mut journal = Journal::default();
        let mut conditions = Vec::new();
        let at = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().with_timezone(&Utc);
        let transition = Transition {
            condition: "Degraded",
            status: true,
            condition_reason: "InsufficientResources",
            event_reason: "Degraded",
            warning: true,
            message: "running 1 of 3 instances".into(),
            entry: Some(LedgerEntry::at(at, 4, "Degraded", "3", "1", "standbys scaled away")),
        };
        journal.transition(&mut conditions, transition, 4, at);
        assert_eq!(conditions.len(), 1);
        let condition = &conditions[0];
        assert_eq!(
            (condition.type_.as_str(), condition.status.as_str(), condition.reason.as_str()),
            ("Degraded", "True", "InsufficientResources")
        );
        assert_eq!((condition.message.as_str(), condition.observed_generation), ("running 1 of 3 instances", Some(4)));
        assert_eq!(journal.events.len(), 1);
        assert!(journal.events[0].warning);
        assert_eq!(
            (journal.events[0].reason.as_str(), journal.events[0].note.as_str()),
            ("Degraded", "running 1 of 3 instances")
        );
        assert_eq!(journal.entries.len(), 1);
        assert_eq!(journal.entries[0].action, "Degraded");
    }

    #[test]
    fn a_transition_on_change_is_told_once_and_again_when_its_reason_changes() {
        let mut journal = Journal::default();
        let mut conditions = Vec::new();
        let at = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().with_timezone(&Utc);
        let invalid = |reason, message: &str| Transition {
            condition: "InvalidSpec",
            status: true,
            condition_reason: reason,
            event_reason: "InvalidSpec",
            warning: true,
            message: message.into(),
            entry: Some(LedgerEntry::at(at, 2, "InvalidSpec", "", "", message)),
        };
        journal.transition_on_change(&mut conditions, invalid("ValidationFailed", "first"), 2, at);
        journal.transition_on_change(&mut conditions, invalid("ValidationFailed", "second"), 3, at);
        assert_eq!((journal.events.len(), journal.entries.len()), (1, 1), "the same state is told once");
        assert_eq!((conditions[0].message.as_str(), conditions[0].observed_generation), ("second", Some(3)));
        journal.transition_on_change(&mut conditions, invalid("ImageNotAllowed", "third"), 3, at);
        assert_eq!((journal.events.len(), journal.entries.len()), (2, 2), "a new reason is told");
    }

    #[test]
    fn since_a_mark_gives_only_what_was_recorded_after_it() {
        let mut journal = Journal::default();
        let at = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().with_timezone(&Utc);
        journal.record(false, "Restarted", "decided".into(), Some(LedgerEntry::at(at, 1, "Restarted", "", "", "")));
        let mark = journal.mark();
        journal.record(
            true,
            "DriftCorrected",
            "applied".into(),
            Some(LedgerEntry::at(at, 1, "DriftCorrected", "", "", "")),
        );
        journal.record(false, "Updated", "applied".into(), None);
        let applied = journal.since(mark);
        assert_eq!(applied.reasons(), ["DriftCorrected", "Updated"]);
        assert_eq!(applied.entries.iter().map(|entry| entry.action.as_str()).collect::<Vec<_>>(), ["DriftCorrected"]);
        assert!(journal.since(journal.mark()).is_empty());
    }
}
