//! Failover timers on this process's own clock. The status stores when a timer started (the
//! failover delay from `primaryFailingSince`, the switchover and candidate timeouts from
//! `transition.startedAt`) as wall-clock times, for people and for the next leader. Judged against
//! another machine's wall clock, they fire early or late by the clock offset: a leader whose clock
//! is a minute ahead would abandon every switchover at once. So a timer counts, on this process's
//! monotonic clock, from when this process first saw it (at once for the timers it starts): a new
//! leader may extend a timer by the time it ran before the takeover, never shorten it.

use crate::api::failover::FailoverStatus;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Timers not seen for this long are forgotten (a database's timers last minutes at most).
const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

/// A timer: the database's uid and when the timer started (as stored).
type TimerKey = (String, DateTime<Utc>);

/// When this process first and last saw each running timer.
#[derive(Debug, Default)]
pub struct TimerClock {
    seen: Mutex<HashMap<TimerKey, (Instant, Instant)>>,
}

/// The timer that runs in `status`: a change's start, else since when the primary fails.
pub fn running_timer(status: &FailoverStatus) -> Option<DateTime<Utc>> {
    status.transition.as_ref().map(|transition| transition.started_at).or(status.primary_failing_since)
}

/// The time at which the failover decision judges the timer `since` that this process has seen
/// for `seen`: `since + seen`, whatever the wall clocks say.
pub fn judged_at(since: DateTime<Utc>, seen: Duration) -> DateTime<Utc> {
    since + chrono::Duration::from_std(seen).unwrap_or(chrono::Duration::MAX)
}

impl TimerClock {
    /// How long this process has seen the timer `since` of database `uid` (zero the first time).
    pub fn seen_for(&self, uid: &str, since: DateTime<Utc>) -> Duration {
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = seen.entry((uid.to_string(), since)).or_insert((now, now));
        entry.1 = now;
        now.duration_since(entry.0)
    }

    /// Notes a timer this process started now (it counts from now, not from its next pass).
    pub fn started(&self, uid: &str, since: DateTime<Utc>) {
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        seen.retain(|_, (_, last)| now.duration_since(*last) < FORGET_AFTER);
        seen.entry((uid.to_string(), since)).or_insert((now, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::failover::{Transition, TransitionKind};

    #[test]
    fn a_timer_counts_from_when_this_process_first_saw_it() {
        let clock = TimerClock::default();
        // Started a minute ago by a leader whose clock was a minute ahead (or by a previous leader).
        let since = Utc::now() - chrono::Duration::seconds(60);
        assert_eq!(clock.seen_for("uid", since), Duration::ZERO);
        let judged = judged_at(since, clock.seen_for("uid", since));
        assert!(judged - since < chrono::Duration::seconds(1), "the inherited timer starts at zero here");
        // The same timer of another database is another timer.
        assert_eq!(clock.seen_for("other", since), Duration::ZERO);
        std::thread::sleep(Duration::from_millis(20));
        assert!(clock.seen_for("uid", since) >= Duration::from_millis(20));
    }

    #[test]
    fn the_running_timer_is_the_change_else_the_failing_primary() {
        let failing = Utc::now();
        let mut status = FailoverStatus { primary_failing_since: Some(failing), ..Default::default() };
        assert_eq!(running_timer(&status), Some(failing));
        let started = failing + chrono::Duration::seconds(5);
        status.transition =
            Some(Transition { kind: TransitionKind::Switchover, from: "db-0".into(), started_at: started });
        assert_eq!(running_timer(&status), Some(started));
        assert_eq!(running_timer(&FailoverStatus::default()), None);
    }
}
