//! `preferred` durability on the primary (issue 38): commits wait for k of the standbys that
//! stream, and for none when fewer than k do, so that a lost standby costs a few seconds of
//! waiting commits, not the database's availability.
//!
//! The primary sets `synchronous_standby_names = 'ANY k (<the standbys that stream>)'`. A failover
//! promotes safely by a quorum over that set, or over any larger one (any |S'| - k + 1 of a
//! superset S' hold |S| - k + 1 of S), never a smaller one. So the operator's record of the set
//! (`status.primaryWaitsFor`) must always contain the applied one: the agent offers a
//! set (its report) and applies only what the operator has recorded; it drops members first and
//! reports it after.

use std::collections::BTreeSet;
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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StandbysSeen {
    /// Standbys of this database streaming with a reply newer than [`STALE_REPLY`].
    pub streaming: BTreeSet<String>,
    /// Some commit has waited for them longer than [`STALLED_COMMIT`].
    pub commit_stalled: bool,
}

/// The `preferred` decision of one primary, kept between steps.
#[derive(Debug, Default)]
pub struct PreferredKeeper {
    /// Since when enough standbys have streamed without a stalled commit.
    healthy_since: Option<Instant>,
    /// Whether the last decision was to wait: None before the first one of this primary.
    waits: Option<bool>,
}

impl PreferredKeeper {
    /// The standbys whose confirmations commits should wait for now (`count` of them): the ones
    /// streaming, or none when fewer than `count` stream or a commit stalled.
    pub fn decide(&mut self, seen: &StandbysSeen, count: u32, now: Instant) -> BTreeSet<String> {
        if (seen.streaming.len() as u64) < u64::from(count.max(1)) || seen.commit_stalled {
            self.healthy_since = None;
            self.waits = Some(false);
            return BTreeSet::new();
        }
        let since = *self.healthy_since.get_or_insert(now);
        // Waiting already, or a fresh start with its standbys there: no reason to stop. After
        // it stopped, only standbys back for a while make it wait again.
        let waits = self.waits != Some(false) || now.duration_since(since) >= BACK_AFTER;
        self.waits = Some(waits);
        if waits {
            seen.streaming.clone()
        } else {
            BTreeSet::new()
        }
    }

    /// Forgets everything (this server is no longer a primary, or restarted).
    pub fn reset(&mut self) {
        *self = PreferredKeeper::default();
    }
}

/// What to apply given the `wanted` set and the one the operator `recorded`: only recorded
/// members, and only if k of them remain; otherwise nobody (the primary acknowledges alone).
pub fn applicable(wanted: &BTreeSet<String>, recorded: &BTreeSet<String>, count: u32) -> BTreeSet<String> {
    let both: BTreeSet<String> = wanted.intersection(recorded).cloned().collect();
    if both.is_empty() || (both.len() as u64) < u64::from(count.max(1)) {
        return BTreeSet::new();
    }
    both
}

/// The recorded standbys that are members of the database (a promoted standby finds itself in
/// its former primary's record).
pub fn recorded_members(members: &[String], recorded: &[String]) -> BTreeSet<String> {
    recorded.iter().filter(|name| members.contains(name)).cloned().collect()
}

/// `ANY count (<standbys>)`, or '' for none.
pub fn names(standbys: &BTreeSet<String>, count: u32) -> String {
    let standbys: Vec<String> = standbys.iter().cloned().collect();
    crate::api::synchronous::synchronous_standby_names(&standbys, count, "")
}

/// The query behind [`StandbysSeen`]: `$1` the names of the other instances.
pub const STANDBYS_SEEN_QUERY: &str = "SELECT
  ARRAY(SELECT application_name::text FROM pg_catalog.pg_stat_replication
    WHERE state = 'streaming' AND application_name = ANY($1::text[])
      AND reply_time > pg_catalog.now() - $2::float8 * interval '1 second'),
  EXISTS (SELECT FROM pg_catalog.pg_stat_activity
    WHERE wait_event = 'SyncRep' AND pg_catalog.now() - $3::float8 * interval '1 second' > query_start)";

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    fn seen(streaming: &[&str], commit_stalled: bool) -> StandbysSeen {
        StandbysSeen { streaming: set(streaming), commit_stalled }
    }

    #[test]
    fn a_primary_with_its_standbys_streaming_waits_for_them_from_the_start() {
        let mut keeper = PreferredKeeper::default();
        assert_eq!(keeper.decide(&seen(&["db-1", "db-2"], false), 1, Instant::now()), set(&["db-1", "db-2"]));
    }

    #[test]
    fn too_few_standbys_or_a_stalled_commit_stop_the_waiting() {
        let start = Instant::now();
        let mut keeper = PreferredKeeper::default();
        assert!(keeper.decide(&seen(&[], false), 1, start).is_empty());
        let mut keeper = PreferredKeeper::default();
        assert_eq!(keeper.decide(&seen(&["db-1"], false), 1, start), set(&["db-1"]));
        assert!(keeper.decide(&seen(&["db-1"], true), 1, start + Duration::from_secs(1)).is_empty());
        let mut keeper = PreferredKeeper::default();
        assert!(keeper.decide(&seen(&["db-1"], false), 2, start).is_empty());
    }

    #[test]
    fn a_standby_lost_among_several_leaves_the_others_waited_for() {
        let start = Instant::now();
        let mut keeper = PreferredKeeper::default();
        assert_eq!(keeper.decide(&seen(&["db-1", "db-2"], false), 1, start), set(&["db-1", "db-2"]));
        assert_eq!(keeper.decide(&seen(&["db-2"], false), 1, start + Duration::from_secs(1)), set(&["db-2"]));
    }

    #[test]
    fn after_stopping_it_waits_again_only_once_the_standbys_stayed() {
        let start = Instant::now();
        let at = |seconds| start + Duration::from_secs(seconds);
        let mut keeper = PreferredKeeper::default();
        assert!(keeper.decide(&seen(&[], false), 1, start).is_empty());
        assert!(keeper.decide(&seen(&["db-1"], false), 1, at(1)).is_empty());
        assert!(keeper.decide(&seen(&["db-1"], false), 1, at(10)).is_empty());
        // Gone again in between: the time counts from its return.
        assert!(keeper.decide(&seen(&[], false), 1, at(11)).is_empty());
        assert!(keeper.decide(&seen(&["db-1"], false), 1, at(12)).is_empty());
        assert!(keeper.decide(&seen(&["db-1"], false), 1, at(21)).is_empty());
        assert_eq!(keeper.decide(&seen(&["db-1"], false), 1, at(22)), set(&["db-1"]));
        assert_eq!(keeper.decide(&seen(&["db-1"], false), 1, at(23)), set(&["db-1"]));
    }

    #[test]
    fn a_reset_forgets_the_fallback() {
        let start = Instant::now();
        let mut keeper = PreferredKeeper::default();
        assert!(keeper.decide(&seen(&[], false), 1, start).is_empty());
        keeper.reset();
        assert_eq!(keeper.decide(&seen(&["db-1"], false), 1, start), set(&["db-1"]));
    }

    #[test]
    fn only_recorded_members_are_applied_and_only_k_or_more() {
        let wanted = set(&["db-1", "db-2"]);
        assert_eq!(applicable(&wanted, &set(&["db-1", "db-2"]), 1), wanted);
        assert_eq!(applicable(&wanted, &set(&["db-1"]), 1), set(&["db-1"]));
        assert!(applicable(&wanted, &set(&["db-1"]), 2).is_empty());
        assert!(applicable(&wanted, &set(&[]), 1).is_empty());
        assert!(applicable(&set(&[]), &wanted, 1).is_empty());
    }
}
