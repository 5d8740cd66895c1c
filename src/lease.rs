//! Rules of the leases: the one expiry rule shared by the operator's leader Lease and each
//! database's primary Lease ([`expired`]), and for the primary Lease: who may take it, when a holder must renew, and when a
//! holder that could not renew must fence itself. Pure: the caller stores the record (a Kubernetes
//! Lease, or memory in tests) with compare-and-swap and measures time on its own clock.
//!
//! Safety argument: a holder renews every `renew_period` and fences itself once `renew_deadline`
//! has passed since it *sent* its last successful renewal. Anyone else takes a held lease only
//! after seeing the record unchanged for a full `duration` on its own clock, which starts no
//! earlier than that send. So the old holder has stopped writing `duration - renew_deadline`
//! before a new primary may be promoted, whatever the clock offset between the two machines. The
//! fence itself is kept by a watchdog outside the agent's loop (`instance::watchdog`, polling every
//! 100 ms), so no blocking step and no frozen agent can delay it past that margin (at least 1 s).

use crate::lsn::Lsn;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Timings of the primary Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTimings {
    /// A held lease that stays unchanged this long may be taken by another instance.
    pub duration: Duration,
    /// A holder that has not renewed for this long fences itself.
    pub renew_deadline: Duration,
    /// A healthy holder renews this often: the only periodic API write of a database.
    pub renew_period: Duration,
}

impl Default for LeaseTimings {
    /// [`LeaseTimings::DEFAULT`].
    fn default() -> Self {
        LeaseTimings::DEFAULT
    }
}

impl LeaseTimings {
    /// 10 s / 7 s / 3 s: a primary that cannot renew (its agent frozen, the API out of reach) has
    /// fenced itself 3 s before the Lease lapses, and the operator's watch of the Lease starts a
    /// failover at that lapse: a recovery within about 13 s (issue 38's target is 15 s), at one
    /// write per 3 s per database. A primary that cannot reach the API for 7 s stops.
    pub const DEFAULT: LeaseTimings = LeaseTimings {
        duration: Duration::from_secs(10),
        renew_deadline: Duration::from_secs(7),
        renew_period: Duration::from_secs(3),
    };
}

/// Lease timings that cannot keep the guarantee.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LeaseTimingsError {
    /// The renew period is below the floor.
    #[error("lease renew period must be at least 1s, got {0:?}")]
    RenewPeriodTooShort(Duration),
    /// Fewer than 1.2 renew periods fit in the renew deadline.
    #[error("lease renew deadline ({deadline:?}) must be at least 1.2 times the renew period ({period:?})")]
    DeadlineTooShort {
        /// Renew deadline.
        deadline: Duration,
        /// Renew period.
        period: Duration,
    },
    /// No time is left between self-fencing and another's promotion.
    #[error("lease duration ({duration:?}) must exceed the renew deadline ({deadline:?}) by at least 1s")]
    DurationTooShort {
        /// Lease duration.
        duration: Duration,
        /// Renew deadline.
        deadline: Duration,
    },
}

impl LeaseTimings {
    /// Checks duration > renew deadline + 1 s and renew deadline ≥ 1.2 × renew period ≥ 1.2 s.
    pub fn validate(&self) -> Result<(), LeaseTimingsError> {
        if self.renew_period < Duration::from_secs(1) {
            return Err(LeaseTimingsError::RenewPeriodTooShort(self.renew_period));
        }
        if self.renew_deadline.as_millis() * 5 < self.renew_period.as_millis() * 6 {
            return Err(LeaseTimingsError::DeadlineTooShort {
                deadline: self.renew_deadline,
                period: self.renew_period,
            });
        }
        if self.duration < self.renew_deadline + Duration::from_secs(1) {
            return Err(LeaseTimingsError::DurationTooShort { duration: self.duration, deadline: self.renew_deadline });
        }
        Ok(())
    }

    /// Steady-state API writes per second for one database: one renewal per period.
    pub fn writes_per_second(&self) -> f64 {
        1.0 / self.renew_period.as_secs_f64()
    }
}

/// The stored lease (in Kubernetes: a `coordination.k8s.io/v1` Lease named `<database>-primary`,
/// `holderIdentity` plus annotations for the positions).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRecord {
    /// Instance holding the lease: the only one allowed to run as primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The holder's WAL position at its last renewal: the reference for the failover lag limit,
    /// carried by the renewal write so that no extra heartbeat is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_lsn: Option<Lsn>,
    /// Timeline of the holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<u32>,
    /// Set when the last holder released the lease after a clean shutdown: its shutdown
    /// checkpoint, which a successor must have received before promoting (no lost commit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at_lsn: Option<Lsn>,
    /// The duration the holder wrote (`spec.leaseDurationSeconds`, not in the annotation): a holder
    /// with longer timings (an older agent, during a rolling update) fences later, so nobody may
    /// take its Lease before that duration either.
    #[serde(skip)]
    pub duration: Option<Duration>,
}

/// Whether an instance may take the lease now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireVerdict {
    /// Nobody holds it.
    Free,
    /// The caller holds it already.
    AlreadyHeld,
    /// The holder has not renewed for a full lease duration.
    Expired {
        /// The holder that let it lapse.
        previous: String,
    },
    /// Someone else holds it and may still be writing.
    HeldByOther {
        /// The holder.
        holder: String,
        /// Time until it expires if the holder stays silent.
        remaining: Duration,
    },
}

impl AcquireVerdict {
    /// The caller may write itself as holder.
    pub fn may_acquire(&self) -> bool {
        !matches!(self, AcquireVerdict::HeldByOther { .. })
    }
}

/// The one expiry rule of every lease here (the operator's leader Lease, a database's primary
/// Lease): a held lease may be taken once the one who wants it has seen it unchanged for a full
/// `duration` on its own clock. Never from the holder's timestamps: clocks of two machines differ.
pub fn expired(unchanged_for: Duration, duration: Duration) -> bool {
    unchanged_for >= duration
}

/// Whether `me` may take the lease, given how long the caller has seen `record` unchanged.
pub fn acquire_verdict(
    record: &LeaseRecord,
    me: &str,
    unchanged_for: Duration,
    timings: &LeaseTimings,
) -> AcquireVerdict {
    // The longer of the two: the holder fences by its own renew deadline, which its own duration
    // exceeds (a 10 s standby must not take a 15 s holder's Lease after 10 s).
    let duration = record.duration.map_or(timings.duration, |written| written.max(timings.duration));
    match &record.holder {
        None => AcquireVerdict::Free,
        Some(holder) if holder == me => AcquireVerdict::AlreadyHeld,
        Some(holder) if expired(unchanged_for, duration) => AcquireVerdict::Expired { previous: holder.clone() },
        Some(holder) => AcquireVerdict::HeldByOther { holder: holder.clone(), remaining: duration - unchanged_for },
    }
}

/// A holder whose last successful renewal is this old must stop accepting writes now.
pub fn must_fence(since_last_renewal: Duration, timings: &LeaseTimings) -> bool {
    since_last_renewal >= timings.renew_deadline
}

/// A holder renews once a period has passed since its last renewal.
pub fn renewal_due(since_last_renewal: Duration, timings: &LeaseTimings) -> bool {
    since_last_renewal >= timings.renew_period
}

/// Lease annotation holding the [`LeaseRecord`] positions (JSON, without the holder, which is
/// `spec.holderIdentity`).
pub const LEASE_RECORD_ANNOTATION: &str = "dbservice.dev/primary";

/// The Lease as a [`LeaseRecord`].
pub fn lease_record(lease: &Lease) -> LeaseRecord {
    let mut record: LeaseRecord = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(LEASE_RECORD_ANNOTATION))
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    record.holder =
        lease.spec.as_ref().and_then(|spec| spec.holder_identity.clone()).filter(|holder| !holder.is_empty());
    record.duration = lease
        .spec
        .as_ref()
        .and_then(|spec| spec.lease_duration_seconds)
        .and_then(|seconds| u64::try_from(seconds).ok())
        .map(Duration::from_secs);
    record
}

/// The Lease's duration as its holder wrote it (the default when it wrote none).
pub fn lease_duration(lease: &Lease) -> Duration {
    lease_record(lease).duration.unwrap_or(LeaseTimings::DEFAULT.duration)
}

/// `lease` rewritten to hold `record` (same resourceVersion: the replace is a compare-and-swap).
pub fn with_record(mut lease: Lease, record: &LeaseRecord, duration: Duration) -> Lease {
    let positions = LeaseRecord { holder: None, ..record.clone() };
    let text = serde_json::to_string(&positions).expect("lease records serialize");
    lease.metadata.annotations.get_or_insert_with(Default::default).insert(LEASE_RECORD_ANNOTATION.into(), text);
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    if spec.holder_identity != record.holder {
        spec.acquire_time = record.holder.as_ref().map(|_| now.clone());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.holder_identity = record.holder.clone();
    spec.lease_duration_seconds = Some(duration.as_secs().max(1) as i32);
    spec.renew_time = Some(now);
    lease
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(value: u64) -> Duration {
        Duration::from_secs(value)
    }

    fn held_by(holder: &str) -> LeaseRecord {
        LeaseRecord { holder: Some(holder.into()), ..Default::default() }
    }

    #[test]
    fn defaults_are_valid_and_cost_one_write_per_three_seconds() {
        let timings = LeaseTimings::default();
        assert_eq!(timings.validate(), Ok(()));
        assert!((timings.writes_per_second() - 1.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn timings_that_break_the_guarantee_are_rejected() {
        let table = [
            (secs(15), secs(10), Duration::from_millis(500), "renew period must be at least 1s"),
            (secs(15), secs(5), secs(5), "at least 1.2 times"),
            (secs(10), secs(10), secs(5), "must exceed the renew deadline"),
            (Duration::from_millis(10_500), secs(10), secs(5), "must exceed the renew deadline"),
        ];
        for (duration, renew_deadline, renew_period, message) in table {
            let error = LeaseTimings { duration, renew_deadline, renew_period }.validate().unwrap_err();
            assert!(error.to_string().contains(message), "{error}");
        }
        assert_eq!(
            LeaseTimings { duration: secs(4), renew_deadline: secs(3), renew_period: secs(1) }.validate(),
            Ok(())
        );
    }

    #[test]
    fn acquire_table() {
        let timings = LeaseTimings::default();
        let table = [
            (LeaseRecord::default(), secs(0), AcquireVerdict::Free),
            (held_by("db-1"), secs(0), AcquireVerdict::AlreadyHeld),
            (held_by("db-0"), secs(10), AcquireVerdict::Expired { previous: "db-0".into() }),
            (held_by("db-0"), secs(9), AcquireVerdict::HeldByOther { holder: "db-0".into(), remaining: secs(1) }),
            (held_by("db-0"), secs(0), AcquireVerdict::HeldByOther { holder: "db-0".into(), remaining: secs(10) }),
        ];
        for (record, unchanged_for, expected) in table {
            let verdict = acquire_verdict(&record, "db-1", unchanged_for, &timings);
            assert_eq!(verdict, expected, "{record:?} unchanged for {unchanged_for:?}");
            assert_eq!(verdict.may_acquire(), !matches!(expected, AcquireVerdict::HeldByOther { .. }));
        }
    }

    #[test]
    fn a_holder_with_a_longer_duration_is_waited_for_as_long() {
        // An agent of before issue 38 (15 s / 10 s / 5 s) holds the Lease while a standby already
        // runs the new timings (10 s): the holder fences 10 s after its last renewal, so the
        // standby must wait the holder's 15 s, not its own 10 s.
        let timings = LeaseTimings::default();
        let old_holder = LeaseRecord { duration: Some(secs(15)), ..held_by("db-0") };
        assert!(!acquire_verdict(&old_holder, "db-1", secs(10), &timings).may_acquire());
        assert!(!acquire_verdict(&old_holder, "db-1", secs(14), &timings).may_acquire());
        assert!(acquire_verdict(&old_holder, "db-1", secs(15), &timings).may_acquire());
        // A shorter written duration never shortens this instance's own.
        let short = LeaseRecord { duration: Some(secs(3)), ..held_by("db-0") };
        assert!(!acquire_verdict(&short, "db-1", secs(9), &timings).may_acquire());
        // Written into the Lease and read back with it.
        let lease = with_record(Lease::default(), &held_by("db-0"), secs(15));
        assert_eq!(lease_record(&lease).duration, Some(secs(15)));
    }

    #[test]
    fn a_silent_holder_fences_before_anyone_may_acquire() {
        let timings = LeaseTimings::default();
        // The holder's clock starts at its last renewal; the other's no earlier than that.
        let mut elapsed = Duration::ZERO;
        while !acquire_verdict(&held_by("db-0"), "db-1", elapsed, &timings).may_acquire() {
            elapsed += Duration::from_millis(100);
        }
        assert!(must_fence(elapsed, &timings), "the holder must have fenced by {elapsed:?}");
        assert!(must_fence(timings.renew_deadline, &timings));
        assert!(!must_fence(timings.renew_deadline - Duration::from_millis(1), &timings));
    }

    #[test]
    fn renewal_is_due_once_per_period() {
        let timings = LeaseTimings::default();
        assert!(!renewal_due(secs(2), &timings));
        assert!(renewal_due(secs(3), &timings));
    }

    #[test]
    fn record_round_trips_through_json() {
        let record = LeaseRecord {
            holder: Some("db-0".into()),
            primary_lsn: Some(Lsn(0x3000060)),
            timeline: Some(2),
            released_at_lsn: None,
            duration: None,
        };
        let json = serde_json::to_string(&record).unwrap();
        assert_eq!(json, r#"{"holder":"db-0","primaryLsn":"0/3000060","timeline":2}"#);
        assert_eq!(serde_json::from_str::<LeaseRecord>(&json).unwrap(), record);
    }
}
