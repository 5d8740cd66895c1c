//! Physical replication slots (issue 21, hole 5): each standby streams through a slot of its own
//! on the primary, so the primary keeps the WAL a standby has not received yet instead of
//! recycling it after `wal_keep_size`. `max_slot_wal_keep_size` bounds what a slot may keep (a
//! quarter of the data volume), so a standby that is gone for long cannot fill the primary's disk;
//! past that bound its slot is invalidated and it catches up from the archive (its
//! `restore_command`) when there is one.
//!
//! The standby creates its slot on the primary it follows (`pg_receivewal --create-slot`, over the
//! replication connection it streams with), so that it works with a primary whatever version of
//! the agent runs there and right after a failover. Every server drops the inactive slots nobody
//! should use: a primary keeps those of the database's other instances, a standby none (a slot
//! left from the time it was primary would hold its WAL back). A slot made this way holds WAL from
//! the first position its standby confirms (within `wal_receiver_status_interval` of streaming
//! through it); until then `wal_keep_size` and the archive are what a standby can fall back on.

use crate::instance::standby::{self, StandbyError};
use crate::instance::{InstanceConfig, Upstream};
use futures::FutureExt;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// Prefix of the slots the agent keeps (others, made by hand, are never touched).
pub const SLOT_PREFIX: &str = "dbsvc_";

/// How long a failed creation waits before the next attempt.
const CREATE_RETRY: Duration = Duration::from_secs(15);

/// How often a server looks for slots to drop.
pub const CLEANUP_INTERVAL: Duration = Duration::from_secs(30);

/// The slot instance `instance` streams through: the prefix and the pod name with `_` for `-`
/// (slot names allow lowercase letters, digits and `_`; pod names of at most 56 characters keep it
/// within the 63 PostgreSQL allows).
pub fn slot_name(instance: &str) -> String {
    let name: String = instance
        .chars()
        .map(|character| if character.is_ascii_alphanumeric() { character.to_ascii_lowercase() } else { '_' })
        .collect();
    let mut slot = format!("{SLOT_PREFIX}{name}");
    slot.truncate(63);
    slot
}

/// A replication slot as `pg_replication_slots` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicationSlot {
    /// Its name.
    pub name: String,
    /// A WAL sender streams through it now.
    pub active: bool,
}

/// The slots to drop on a server: ours ([`SLOT_PREFIX`]), inactive, and not one of `keep`'s.
pub fn obsolete_slots(existing: &[ReplicationSlot], keep: &[String]) -> Vec<String> {
    existing
        .iter()
        .filter(|slot| slot.name.starts_with(SLOT_PREFIX) && !slot.active && !keep.contains(&slot.name))
        .map(|slot| slot.name.clone())
        .collect()
}

/// The slots a server keeps: a primary those of the other instances of `instances`, a standby none.
pub fn wanted_slots(me: &str, instances: &[String], primary: bool) -> Vec<String> {
    if !primary {
        return Vec::new();
    }
    instances.iter().filter(|instance| instance.as_str() != me).map(|instance| slot_name(instance)).collect()
}

/// `max_slot_wal_keep_size` for a data volume of `volume_bytes`: a quarter of it in megabytes,
/// at least 64MB (a slot never keeps more than the volume can spare beside the data).
pub fn max_slot_wal_keep_size(volume_bytes: u64) -> String {
    let megabytes = volume_bytes / 4 / (1024 * 1024);
    format!("{}MB", megabytes.max(64))
}

/// The standby's own slot on the primary it follows: created in the background (the step loop
/// never waits for the primary), retried after a failure, once per upstream.
#[derive(Default)]
pub struct StandbySlot {
    upstream: Option<Upstream>,
    created: bool,
    tried_at: Option<Instant>,
    creating: Option<JoinHandle<Result<(), StandbyError>>>,
}

impl StandbySlot {
    /// Forgets the slot: the server's configuration names none now (a start, a new upstream).
    pub fn reset(&mut self) {
        if let Some(task) = self.creating.take() {
            task.abort();
        }
        *self = StandbySlot::default();
    }

    /// Moves the creation on `upstream` along; true once it exists there and the server should
    /// stream through it (then not again for this upstream).
    pub fn created_on(&mut self, config: &InstanceConfig, upstream: &Upstream) -> bool {
        if self.upstream.as_ref() != Some(upstream) {
            self.reset();
            self.upstream = Some(upstream.clone());
        }
        if self.created {
            return false;
        }
        if let Some(task) = self.creating.take_if(|task| task.is_finished()) {
            match task.now_or_never() {
                Some(Ok(Ok(()))) => {
                    self.created = true;
                    return true;
                }
                Some(Ok(Err(error))) => {
                    tracing::warn!(instance = %config.name, %error, "could not create the replication slot on the primary: streaming without one")
                }
                _ => {}
            }
        }
        let due = self.tried_at.is_none_or(|tried| tried.elapsed() >= CREATE_RETRY);
        if self.creating.is_none() && due {
            let (config, upstream) = (config.clone(), upstream.clone());
            self.creating = Some(tokio::spawn(async move {
                standby::create_slot_on(&config, &upstream, &slot_name(&config.name)).await
            }));
            self.tried_at = Some(Instant::now());
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_are_valid_and_fit() {
        assert_eq!(slot_name("orders-1"), "dbsvc_orders_1");
        let long = format!("{}-12", "a".repeat(52));
        assert_eq!(slot_name(&long).len(), 61);
        assert!(slot_name(&"b".repeat(80)).len() <= 63);
    }

    #[test]
    fn a_primary_keeps_its_peers_slots_and_drops_inactive_leftovers_only() {
        let instances = vec!["db-0".to_string(), "db-1".to_string(), "db-2".to_string()];
        let keep = wanted_slots("db-0", &instances, true);
        assert_eq!(keep, vec!["dbsvc_db_1", "dbsvc_db_2"]);
        let slot = |name: &str, active| ReplicationSlot { name: name.into(), active };
        let existing = [
            slot("dbsvc_db_1", false),
            slot("dbsvc_db_3", false), // scaled away
            slot("dbsvc_db_4", true),  // still streaming: dropped once it stops
            slot("dbsvc_db_0", false), // named for itself: nobody streams from itself
            slot("made_by_hand", false),
        ];
        assert_eq!(obsolete_slots(&existing, &keep), vec!["dbsvc_db_3", "dbsvc_db_0"]);
        // A standby keeps none of them.
        assert_eq!(obsolete_slots(&existing, &wanted_slots("db-0", &instances, false)).len(), 3);
    }

    #[test]
    fn the_slot_bound_is_a_quarter_of_the_volume() {
        assert_eq!(max_slot_wal_keep_size(1024 * 1024 * 1024), "256MB");
        assert_eq!(max_slot_wal_keep_size(100 * 1024 * 1024), "64MB");
    }
}
