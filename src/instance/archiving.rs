//! Archiving health as the agent learns it from pg_stat_archiver (issue 12): the counters and
//! times there change with every archived segment, so the agent reduces them to the state an
//! operator acts on — healthy, or failing since when and on which segment — and republishes only
//! when that state changes. A busy, healthy primary therefore writes nothing for archiving.

use crate::api::failover::ArchivingReport;
use chrono::{DateTime, Utc};

/// pg_stat_archiver of a primary with `archive_mode` on, as sampled.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiverSample {
    /// Failed attempts since the statistics were reset.
    pub failed_count: i64,
    /// Segment (or history file) of the last failed attempt.
    pub last_failed_wal: Option<String>,
    /// Time of the last failed attempt.
    pub last_failed_time: Option<DateTime<Utc>>,
    /// Segment of the last successful archive.
    pub last_archived_wal: Option<String>,
    /// Time of the last successful archive.
    pub last_archived_time: Option<DateTime<Utc>>,
}

impl ArchiverSample {
    /// The last attempt failed: a failure with no success after it. (PostgreSQL retries the same
    /// segment until it succeeds, so a success ends the streak.)
    pub fn failing(&self) -> bool {
        match (self.last_failed_time, self.last_archived_time) {
            (Some(failed), Some(archived)) => failed > archived,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

/// The archiving state to report, from the `previous` one and a new sample.
///
/// A failing streak keeps the start seen first (`failingSince` does not move with every retry);
/// a success after that start begins a new streak. The start is the first failure the agent saw:
/// an agent that restarts in the middle of a streak starts counting again from the latest failure.
pub fn archiving_report(previous: Option<&ArchivingReport>, sample: &ArchiverSample) -> ArchivingReport {
    if !sample.failing() {
        return ArchivingReport { failing: false, failing_since: None, failed_wal: None };
    }
    let continued = previous
        .filter(|previous| previous.failing)
        .and_then(|previous| previous.failing_since)
        .filter(|since| sample.last_archived_time.is_none_or(|archived| archived < *since));
    ArchivingReport {
        failing: true,
        failing_since: continued.or(sample.last_failed_time),
        failed_wal: sample.last_failed_wal.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(second: i64) -> Option<DateTime<Utc>> {
        Some(Utc.timestamp_opt(1_800_000_000 + second, 0).unwrap())
    }

    fn sample(failed: Option<(i64, &str)>, archived: Option<(i64, &str)>) -> ArchiverSample {
        ArchiverSample {
            failed_count: failed.map_or(0, |_| 1),
            last_failed_wal: failed.map(|(_, wal)| wal.to_string()),
            last_failed_time: failed.and_then(|(second, _)| at(second)),
            last_archived_wal: archived.map(|(_, wal)| wal.to_string()),
            last_archived_time: archived.and_then(|(second, _)| at(second)),
        }
    }

    fn failing(since: i64, wal: &str) -> ArchivingReport {
        ArchivingReport { failing: true, failing_since: at(since), failed_wal: Some(wal.into()) }
    }

    const HEALTHY: ArchivingReport = ArchivingReport { failing: false, failing_since: None, failed_wal: None };
    const A: &str = "000000010000000000000003";
    const B: &str = "000000010000000000000004";

    #[test]
    fn archiving_state_follows_streaks_not_counters() {
        let cases: [(&str, Option<ArchivingReport>, ArchiverSample, ArchivingReport); 8] = [
            ("nothing archived yet", None, sample(None, None), HEALTHY),
            ("only successes", None, sample(None, Some((10, A))), HEALTHY),
            ("a success after the last failure", None, sample(Some((5, A)), Some((10, A))), HEALTHY),
            ("first failure ever", None, sample(Some((20, A)), None), failing(20, A)),
            ("a failure after a success", Some(HEALTHY), sample(Some((20, B)), Some((10, A))), failing(20, B)),
            // Retries move last_failed_time; the streak keeps its start, so the report is unchanged.
            ("retries of a streak", Some(failing(20, B)), sample(Some((80, B)), Some((10, A))), failing(20, B)),
            // B went through and the next segment fails: a new streak, seen in one tick.
            (
                "a new streak between samples",
                Some(failing(20, A)),
                sample(Some((90, B)), Some((85, A))),
                failing(90, B),
            ),
            ("recovered", Some(failing(20, B)), sample(Some((80, B)), Some((95, B))), HEALTHY),
        ];
        for (name, previous, sample, expected) in cases {
            assert_eq!(archiving_report(previous.as_ref(), &sample), expected, "{name}");
        }
    }

    #[test]
    fn a_steady_state_yields_the_same_report_every_tick() {
        let mut report = None;
        let mut changes = 0;
        // 100 segments archived, one per tick: counters and times move, the report does not.
        for tick in 0..100 {
            let next = archiving_report(report.as_ref(), &sample(Some((1, A)), Some((10 + tick, B))));
            changes += usize::from(report.as_ref() != Some(&next));
            report = Some(next);
        }
        // 100 retries of one failing segment: one change when it starts failing.
        for tick in 0..100 {
            let next = archiving_report(report.as_ref(), &sample(Some((200 + tick, A)), Some((109, B))));
            changes += usize::from(report.as_ref() != Some(&next));
            report = Some(next);
        }
        assert_eq!(changes, 2, "one report when archiving is first seen healthy, one when it fails");
        assert_eq!(report, Some(failing(200, A)));
    }
}
