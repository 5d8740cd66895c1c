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
//! With fewer than k standbys connected, commits wait (durability over availability): a database
//! that asked for synchronous commits never silently acknowledges one that only its primary has.

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
}
