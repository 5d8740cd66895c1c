//! `preferred` durability on the primary (issue 38): commits wait for the standbys while enough
//! of them stream, and stop waiting when they do not, so that a lost standby costs a few seconds
//! of waiting commits, not the database's availability.
//!
//! The failover must never believe the primary acknowledges commits alone while it makes them
//! wait for standbys (it would promote a standby without the quorum rule). So the agent offers
//! to wait (its report's `waitsForStandbys: true`), and waits only once the operator has recorded
//! it in `status.failover.primaryWaitsForStandbys`; it stops waiting first and reports it after.

use std::time::{Duration, Instant};

/// A commit that waited this long for its standbys makes the primary stop waiting for them: a
/// standby cut off may look streaming until `wal_sender_timeout` (60 s).
pub const STALLED_COMMIT: Duration = Duration::from_secs(5);
/// A standby whose last reply is older than this is not counted (they reply at least every
/// `wal_receiver_status_interval`, 10 s, and at every flush while WAL flows).
pub const STALE_REPLY: Duration = Duration::from_secs(15);
/// After it stopped waiting, the primary waits again only once enough standbys have streamed for
/// this long (so that a flapping standby does not make every commit wait and give up in turns).
pub const BACK_AFTER: Duration = Duration::from_secs(10);

/// What the primary sees of its standbys, one health query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StandbysSeen {
    /// Standbys of this database streaming with a reply newer than [`STALE_REPLY`].
    pub streaming: u32,
    /// Some commit has waited for them longer than [`STALLED_COMMIT`].
    pub commit_stalled: bool,
}

/// The `preferred` decision of one primary, kept between steps.
#[derive(Debug, Default)]
pub struct PreferredKeeper {
    /// Since when enough standbys have streamed without a stalled commit.
    healthy_since: Option<Instant>,
    /// The last decision: None before the first one of this primary.
    waits: Option<bool>,
}

impl PreferredKeeper {
    /// Whether commits should wait for `needed` standbys now.
    pub fn decide(&mut self, seen: StandbysSeen, needed: u32, now: Instant) -> bool {
        if seen.streaming < needed.max(1) || seen.commit_stalled {
            self.healthy_since = None;
            self.waits = Some(false);
            return false;
        }
        let since = *self.healthy_since.get_or_insert(now);
        // Waiting already, or a fresh start with its standbys there: no reason to stop. After
        // it stopped, only a standby back for a while makes it wait again.
        let waits = self.waits != Some(false) || now.duration_since(since) >= BACK_AFTER;
        self.waits = Some(waits);
        waits
    }

    /// Whether the last decision was to stop waiting.
    pub fn stopped(&self) -> bool {
        self.waits == Some(false)
    }

    /// Forgets everything (this server is no longer a primary, or restarted).
    pub fn reset(&mut self) {
        *self = PreferredKeeper::default();
    }
}

/// The query behind [`StandbysSeen`]: `$1` the names of the other instances.
pub const STANDBYS_SEEN_QUERY: &str = "SELECT
  (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_replication
    WHERE state = 'streaming' AND application_name = ANY($1::text[])
      AND reply_time > pg_catalog.now() - $2::float8 * interval '1 second')::int4,
  EXISTS (SELECT FROM pg_catalog.pg_stat_activity
    WHERE wait_event = 'SyncRep' AND pg_catalog.now() - $3::float8 * interval '1 second' > query_start)";

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(streaming: u32, commit_stalled: bool) -> StandbysSeen {
        StandbysSeen { streaming, commit_stalled }
    }

    #[test]
    fn a_primary_with_its_standby_streaming_waits_for_it_from_the_start() {
        let mut keeper = PreferredKeeper::default();
        assert!(keeper.decide(seen(1, false), 1, Instant::now()));
    }

    #[test]
    fn no_standby_or_a_stalled_commit_stops_the_waiting() {
        let start = Instant::now();
        let mut keeper = PreferredKeeper::default();
        assert!(!keeper.decide(seen(0, false), 1, start));
        let mut keeper = PreferredKeeper::default();
        assert!(keeper.decide(seen(1, false), 1, start));
        assert!(!keeper.decide(seen(1, true), 1, start + Duration::from_secs(1)));
        assert!(!keeper.decide(seen(1, false), 2, start));
    }

    #[test]
    fn after_stopping_it_waits_again_only_once_the_standbys_stayed() {
        let start = Instant::now();
        let mut keeper = PreferredKeeper::default();
        assert!(!keeper.decide(seen(0, false), 1, start));
        assert!(!keeper.decide(seen(1, false), 1, start + Duration::from_secs(1)));
        assert!(!keeper.decide(seen(1, false), 1, start + Duration::from_secs(10)));
        // Gone again in between: the time counts from its return.
        assert!(!keeper.decide(seen(0, false), 1, start + Duration::from_secs(11)));
        assert!(!keeper.decide(seen(1, false), 1, start + Duration::from_secs(12)));
        assert!(!keeper.decide(seen(1, false), 1, start + Duration::from_secs(21)));
        assert!(keeper.decide(seen(1, false), 1, start + Duration::from_secs(22)));
        assert!(keeper.decide(seen(1, false), 1, start + Duration::from_secs(23)));
    }

    #[test]
    fn a_reset_forgets_the_fallback() {
        let start = Instant::now();
        let mut keeper = PreferredKeeper::default();
        assert!(!keeper.decide(seen(0, false), 1, start));
        keeper.reset();
        assert!(keeper.decide(seen(1, false), 1, start));
    }
}
