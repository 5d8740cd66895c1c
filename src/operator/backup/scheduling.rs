//! When a scheduled backup is due (pure, the clock passed in). After downtime there is no
//! catch-up storm: of all the cron times missed, only the latest is run.

use crate::schedule::Schedule;
use chrono::{DateTime, Utc};

/// Cron times looked at, at most, between the last run and now (a minutely schedule missed for
/// about 70 days); the latest one seen is run.
const MAX_STEPS: usize = 100_000;

/// The cron time to run now, if any: the latest time the schedule fired after `last_run` (or
/// after `since`, the DatabaseService's creation, when nothing ran yet) and at or before `now`.
pub fn due_run(
    schedule: &Schedule,
    last_run: Option<DateTime<Utc>>,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let mut cursor = last_run.unwrap_or(since);
    let mut due = None;
    for _ in 0..MAX_STEPS {
        match schedule.next_after(cursor) {
            Some(next) if next <= now => {
                due = Some(next);
                cursor = next;
            }
            _ => break,
        }
    }
    due
}

/// The name of the backup object for the cron time `at`: the same for every replica and every
/// retry, so creating it twice is a conflict, never a second backup.
pub fn scheduled_backup_name(database: &str, at: DateTime<Utc>) -> String {
    format!("{database}-{}", at.format("%Y%m%d%H%M"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    fn daily() -> Schedule {
        "0 1 * * *".parse().unwrap()
    }

    #[test]
    fn nothing_is_due_before_the_first_cron_time() {
        let created = at("2026-12-01T00:10:00Z");
        assert_eq!(due_run(&daily(), None, created, at("2026-12-01T00:59:59Z")), None);
        assert_eq!(due_run(&daily(), None, created, at("2026-12-01T01:00:00Z")), Some(at("2026-12-01T01:00:00Z")));
    }

    #[test]
    fn a_run_is_due_once_per_cron_time() {
        let created = at("2026-11-01T00:00:00Z");
        let last = Some(at("2026-12-01T01:00:00Z"));
        assert_eq!(due_run(&daily(), last, created, at("2026-12-01T01:00:30Z")), None);
        assert_eq!(due_run(&daily(), last, created, at("2026-12-02T00:59:00Z")), None);
        assert_eq!(due_run(&daily(), last, created, at("2026-12-02T01:00:10Z")), Some(at("2026-12-02T01:00:00Z")));
    }

    #[test]
    fn after_downtime_only_the_latest_missed_run_is_due() {
        let created = at("2026-11-01T00:00:00Z");
        let last = Some(at("2026-11-20T01:00:00Z"));
        let now = at("2026-12-01T12:00:00Z");
        assert_eq!(due_run(&daily(), last, created, now), Some(at("2026-12-01T01:00:00Z")));
        // Once that run exists, nothing more is due until the next cron time.
        assert_eq!(due_run(&daily(), Some(at("2026-12-01T01:00:00Z")), created, now), None);
        let minutely: Schedule = "* * * * *".parse().unwrap();
        assert_eq!(
            due_run(&minutely, Some(at("2026-11-01T00:00:00Z")), created, at("2026-12-01T12:34:56Z")),
            Some(at("2026-12-01T12:34:00Z"))
        );
    }

    #[test]
    fn a_schedule_that_never_fires_is_never_due() {
        let never: Schedule = "0 0 30 2 *".parse().unwrap();
        assert_eq!(due_run(&never, None, at("2026-01-01T00:00:00Z"), at("2030-12-31T00:00:00Z")), None);
    }

    #[test]
    fn names_are_stable_per_cron_time() {
        assert_eq!(scheduled_backup_name("orders", at("2026-12-01T01:00:00Z")), "orders-202612010100");
    }
}
