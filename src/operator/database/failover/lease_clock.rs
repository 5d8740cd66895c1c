//! The primary Leases on this process's own clock: since when the operator has seen each Lease's
//! current version, so that it can tell a lapsed one (held, unchanged for a whole Lease duration)
//! without waiting for a pod's readiness probe or a standby's own clock.
//!
//! Why this is safe to act on: a holder fences itself once its renew deadline has passed since it
//! *sent* its last renewal (`crate::lease`), and this process saw that renewal no earlier than it
//! was sent. So once this process has seen one version unchanged for a Lease duration (longer than
//! the renew deadline), the holder's server has been stopped for at least their difference, whatever
//! the clocks of the two machines say: the same rule as a standby's (`lease::expired`). The operator
//! then starts the failover at once and releases the Lease by compare-and-swap on that version, so
//! the standbys need not wait for their own clocks, which start only when they first read it.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One Lease as last seen.
#[derive(Clone, Debug)]
struct Seen {
    version: String,
    holder: Option<String>,
    duration: Duration,
    since: Instant,
    /// Its lapse was announced already (a pass is triggered once per version).
    announced: bool,
}

/// A Lease: its namespace and name.
pub type LeaseKey = (String, String);

/// Since when this process has seen each primary Lease's version (fed by a watch).
#[derive(Debug, Default)]
pub struct LeaseClock {
    seen: Mutex<HashMap<LeaseKey, Seen>>,
    /// Keys seen since a relist began (`None` when no relist is under way).
    relisting: Mutex<Option<HashSet<LeaseKey>>>,
}

impl LeaseClock {
    /// Notes `version` of a Lease as seen at `now` (its clock restarts when the version changed).
    pub fn observe(&self, key: LeaseKey, version: &str, holder: Option<String>, duration: Duration, now: Instant) {
        if let Some(relisting) = self.relisting.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).as_mut() {
            relisting.insert(key.clone());
        }
        let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match seen.get_mut(&key) {
            Some(entry) if entry.version == version => {}
            _ => {
                seen.insert(key, Seen { version: version.to_string(), holder, duration, since: now, announced: false });
            }
        }
    }

    /// Forgets a deleted Lease.
    pub fn forget(&self, key: &LeaseKey) {
        self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(key);
    }

    /// A relist of the watch begins: Leases it does not list again are forgotten when it ends.
    pub fn relist_started(&self) {
        *self.relisting.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(HashSet::new());
    }

    /// The relist ended: forgets the Leases it did not list (deleted while the watch was away).
    pub fn relist_done(&self) {
        let listed = self.relisting.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(listed) = listed {
            self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).retain(|key, _| listed.contains(key));
        }
    }

    /// The version of the Lease `key` if it is held and this process has seen it unchanged for a
    /// whole Lease duration at `now`: its holder has fenced itself.
    pub fn lapsed(&self, key: &LeaseKey, now: Instant) -> Option<String> {
        let seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = seen.get(key)?;
        (entry.holder.is_some() && crate::lease::expired(now.saturating_duration_since(entry.since), entry.duration))
            .then(|| entry.version.clone())
    }

    /// Leases that lapsed since the last call (each version once): the passes to run now.
    pub fn newly_lapsed(&self, now: Instant) -> Vec<LeaseKey> {
        let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut lapsed = Vec::new();
        for (key, entry) in seen.iter_mut() {
            let expired = crate::lease::expired(now.saturating_duration_since(entry.since), entry.duration);
            if entry.holder.is_some() && expired && !entry.announced {
                entry.announced = true;
                lapsed.push(key.clone());
            }
        }
        lapsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> LeaseKey {
        ("default".into(), name.into())
    }

    const DURATION: Duration = Duration::from_secs(10);

    #[test]
    fn a_held_lease_lapses_a_whole_duration_after_this_process_saw_its_version() {
        let clock = LeaseClock::default();
        let start = Instant::now();
        clock.observe(key("db-primary"), "7", Some("db-0".into()), DURATION, start);
        assert_eq!(clock.lapsed(&key("db-primary"), start + Duration::from_secs(9)), None);
        assert!(clock.newly_lapsed(start + Duration::from_secs(9)).is_empty());
        // Seen again at the same version: the clock does not restart.
        clock.observe(key("db-primary"), "7", Some("db-0".into()), DURATION, start + Duration::from_secs(5));
        assert_eq!(clock.lapsed(&key("db-primary"), start + DURATION), Some("7".into()));
        assert_eq!(clock.newly_lapsed(start + DURATION), vec![key("db-primary")]);
        // Announced once per version.
        assert!(clock.newly_lapsed(start + DURATION * 2).is_empty());
        assert_eq!(clock.lapsed(&key("db-primary"), start + DURATION * 2), Some("7".into()));
    }

    #[test]
    fn a_renewal_restarts_the_clock_and_a_free_lease_never_lapses() {
        let clock = LeaseClock::default();
        let start = Instant::now();
        clock.observe(key("db-primary"), "7", Some("db-0".into()), DURATION, start);
        clock.observe(key("db-primary"), "8", Some("db-0".into()), DURATION, start + Duration::from_secs(3));
        assert_eq!(clock.lapsed(&key("db-primary"), start + DURATION), None);
        assert_eq!(clock.lapsed(&key("db-primary"), start + Duration::from_secs(13)), Some("8".into()));
        clock.observe(key("free-primary"), "1", None, DURATION, start);
        assert_eq!(clock.lapsed(&key("free-primary"), start + DURATION * 10), None);
        assert_eq!(clock.newly_lapsed(start + DURATION * 10), vec![key("db-primary")]);
    }

    #[test]
    fn a_lease_not_listed_again_by_a_relist_is_forgotten() {
        let clock = LeaseClock::default();
        let start = Instant::now();
        clock.observe(key("kept-primary"), "1", Some("kept-0".into()), DURATION, start);
        clock.observe(key("gone-primary"), "2", Some("gone-0".into()), DURATION, start);
        clock.relist_started();
        clock.observe(key("kept-primary"), "1", Some("kept-0".into()), DURATION, start + Duration::from_secs(4));
        clock.relist_done();
        assert_eq!(clock.lapsed(&key("gone-primary"), start + DURATION), None);
        // The kept Lease keeps its first sighting: its version did not change.
        assert_eq!(clock.lapsed(&key("kept-primary"), start + DURATION), Some("1".into()));
        clock.forget(&key("kept-primary"));
        assert!(clock.newly_lapsed(start + DURATION).is_empty());
    }
}
