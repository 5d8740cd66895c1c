//! Synchronous replication (spec.failover.synchronousStandbys): which standbys must confirm a
//! commit before the primary acknowledges it, and how many of their final positions a failover
//! needs before it may promote one of them.
//!
//! The primary sets `synchronous_standby_names = 'ANY k ("<every other instance>")'`: every
//! acknowledged commit is on at least k of those N standbys. So once N - k + 1 of them have
//! reported their final positions, the most advanced of those holds every acknowledged commit
//! (any k of the N and any N - k + 1 of them share one instance). Until then a failover waits:
//! promoting a standby outside that quorum could lose acknowledged commits.
//!
//! With fewer than k standbys connected, commits wait in the `required` mode (durability over
//! availability); in the `preferred` mode (the default with two or more instances) the primary's
//! agent stops waiting for them, and says so (see [`DataDurability`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How sure an acknowledged commit is to survive a failover (`spec.failover.dataDurability`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DataDurability {
    /// Every acknowledged commit is on `synchronousStandbys` standbys first; with fewer of them
    /// streaming, commits wait.
    Required,
    /// As `required` while enough standbys stream; when they do not, the primary stops waiting
    /// for them (a Warning event, the condition SynchronousReplication False and a ledger entry
    /// say so) and waits again once they are back.
    Preferred,
    /// Asynchronous replication: a failover may lose the last commits (at most
    /// `maximumLagBytes` of WAL).
    None,
}

impl std::fmt::Display for DataDurability {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            DataDurability::Required => "required",
            DataDurability::Preferred => "preferred",
            DataDurability::None => "none",
        })
    }
}

/// The durability a spec asks for, with the defaults applied: the mode and its standby count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Durability {
    /// required, preferred or none.
    pub mode: DataDurability,
    /// Standbys that confirm each commit while the mode is kept (0 with `none`).
    pub standbys: u32,
}

impl Durability {
    /// Asynchronous replication.
    pub const NONE: Durability = Durability { mode: DataDurability::None, standbys: 0 };
}

/// The durability of a spec: an explicit `dataDurability` wins (with `synchronousStandbys`, 1 by
/// default); without one, `synchronousStandbys: 0` means `none` and k > 0 `required` (as before
/// the mode existed); with neither, two or more instances get `preferred` with 1 standby, unless
/// `synchronous_commit` is off or local (the user chose asynchronous commits: `none`).
pub fn durability(
    mode: Option<DataDurability>,
    synchronous_standbys: Option<u32>,
    replicas: i32,
    synchronous_commit: Option<&str>,
) -> Durability {
    let asynchronous_commits = synchronous_commit.is_some_and(acknowledges_alone);
    match (mode, synchronous_standbys) {
        (Some(DataDurability::None), _) | (None, Some(0)) => Durability::NONE,
        (Some(mode), standbys) => Durability { mode, standbys: standbys.unwrap_or(1).max(1) },
        (None, Some(standbys)) => Durability { mode: DataDurability::Required, standbys },
        (None, None) if replicas >= 2 && !asynchronous_commits => {
            Durability { mode: DataDurability::Preferred, standbys: 1 }
        }
        (None, None) => Durability::NONE,
    }
}

/// `synchronous_standby_names` for instance `me` were it the primary: `ANY count ("a","b")` over
/// every other instance, or `''` (asynchronous) when `count` is 0. Every instance keeps it in its
/// configuration (a standby ignores it), so a promoted standby applies it from its first commit.
pub fn synchronous_standby_names(instances: &[String], count: u32, me: &str) -> String {
    if count == 0 {
        return String::new();
    }
    let others: Vec<String> = instances
        .iter()
        .filter(|name| name.as_str() != me)
        .map(|name| format!("\"{}\"", name.replace('"', "")))
        .collect();
    if others.is_empty() {
        return String::new();
    }
    format!("ANY {} ({})", count.min(others.len() as u32), others.join(","))
}

/// Whether a `synchronous_commit` value (`off`, `local` and their spellings) acknowledges a
/// commit before any standby has it.
pub fn acknowledges_alone(synchronous_commit: &str) -> bool {
    crate::api::postgresql::is_off(synchronous_commit) || synchronous_commit.trim().eq_ignore_ascii_case("local")
}

/// The durability in force: the one the operator recorded in the status once announced, or
/// before it did, `required` from the spec (a user's explicit choice, carried out at once, as
/// before the mode existed) and `none` otherwise. Agents and failovers follow this, never the
/// spec alone, so that a new default reaches a database only after it was announced.
pub fn in_force(asked: Durability, recorded: Option<Durability>) -> Durability {
    recorded.or_else(|| (asked.mode == DataDurability::Required).then_some(asked)).unwrap_or(Durability::NONE)
}

/// How many of `members` synchronous standbys must report final positions before a failover may
/// promote the most advanced of them: N - k + 1 (0 for asynchronous replication).
pub fn quorum(members: usize, count: u32) -> usize {
    if count == 0 {
        return 0;
    }
    let count = (count as usize).min(members);
    members - count + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|ordinal| format!("db-{ordinal}")).collect()
    }

    #[test]
    fn every_other_instance_is_a_quorum_member() {
        assert_eq!(synchronous_standby_names(&names(3), 1, "db-0"), r#"ANY 1 ("db-1","db-2")"#);
        assert_eq!(synchronous_standby_names(&names(3), 1, "db-1"), r#"ANY 1 ("db-0","db-2")"#);
        assert_eq!(synchronous_standby_names(&names(3), 2, "db-2"), r#"ANY 2 ("db-0","db-1")"#);
        assert_eq!(synchronous_standby_names(&names(2), 1, "db-0"), r#"ANY 1 ("db-1")"#);
    }

    #[test]
    fn asynchronous_or_alone_means_empty() {
        assert_eq!(synchronous_standby_names(&names(3), 0, "db-0"), "");
        assert_eq!(synchronous_standby_names(&names(1), 1, "db-0"), "");
    }

    #[test]
    fn the_count_never_exceeds_the_members() {
        assert_eq!(synchronous_standby_names(&names(2), 5, "db-0"), r#"ANY 1 ("db-1")"#);
    }

    #[test]
    fn the_quorum_intersects_every_set_that_acknowledged_a_commit() {
        assert_eq!(quorum(2, 0), 0);
        assert_eq!(quorum(2, 1), 2);
        assert_eq!(quorum(2, 2), 1);
        assert_eq!(quorum(4, 2), 3);
        assert_eq!(quorum(1, 3), 1);
        // Property: any `count` members and any `quorum` members share one (pigeonhole).
        for members in 1..6usize {
            for count in 1..=members as u32 {
                assert!(count as usize + quorum(members, count) > members, "{members} {count}");
            }
        }
    }

    #[test]
    fn two_instances_default_to_preferred_and_explicit_choices_win() {
        use DataDurability::{Preferred, Required};
        let preferred = Durability { mode: Preferred, standbys: 1 };
        assert_eq!(durability(None, None, 2, None), preferred);
        assert_eq!(durability(None, None, 3, Some("on")), preferred);
        assert_eq!(durability(None, None, 1, None), Durability::NONE);
        assert_eq!(durability(None, None, 2, Some("local")), Durability::NONE);
        assert_eq!(durability(None, None, 2, Some(" OFF ")), Durability::NONE);
        assert_eq!(durability(None, Some(0), 3, None), Durability::NONE);
        assert_eq!(durability(None, Some(2), 3, None), Durability { mode: Required, standbys: 2 });
        assert_eq!(durability(Some(Required), None, 2, None), Durability { mode: Required, standbys: 1 });
        assert_eq!(durability(Some(Preferred), Some(2), 3, None), Durability { mode: Preferred, standbys: 2 });
        assert_eq!(durability(Some(DataDurability::None), Some(2), 3, None), Durability::NONE);
    }
}
