//! Expectations: after a pass writes, the next pass waits until the caches show those writes.
//! Otherwise a pass woken by one watch (say, the StatefulSet's) could decide from a DatabaseService
//! whose cached status predates our own last write, and undo it (a restart stamp put back, a
//! "Recreated" reported for a child that is only not cached yet). Waiting costs a short requeue.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an expectation is kept at most: a watch that lags longer is not waited for.
const EXPECTATION_LIFETIME: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Expected {
    kind: &'static str,
    name: String,
    resource_version: u64,
    since: Instant,
}

/// Writes of recent passes, per DatabaseService (namespace/name), not yet seen in the caches.
#[derive(Debug, Default)]
pub struct Expectations {
    pending: Mutex<HashMap<String, Vec<Expected>>>,
}

impl Expectations {
    /// Records that the cache of `kind` should show `name` at `resource_version` or later.
    pub fn expect(&self, key: &str, kind: &'static str, name: &str, resource_version: Option<String>) {
        // resourceVersions are opaque by contract but etcd revisions in practice; one that does
        // not parse is simply not waited for.
        let Some(resource_version) = resource_version.and_then(|version| version.parse().ok()) else { return };
        let mut pending = self.pending.lock().expect("expectations lock");
        let entries = pending.entry(key.to_string()).or_default();
        entries.retain(|entry| !(entry.kind == kind && entry.name == name));
        entries.push(Expected { kind, name: name.to_string(), resource_version, since: Instant::now() });
    }

    /// Whether the caches have caught up with every write recorded for `key`; `cached` gives the
    /// cached resourceVersion of (kind, name), None when the object is not cached.
    pub fn satisfied(&self, key: &str, cached: impl Fn(&str, &str) -> Option<String>) -> bool {
        let mut pending = self.pending.lock().expect("expectations lock");
        let Some(entries) = pending.get_mut(key) else { return true };
        entries.retain(|entry| {
            let seen = cached(entry.kind, &entry.name)
                .and_then(|version| version.parse::<u64>().ok())
                .is_some_and(|version| version >= entry.resource_version);
            !seen && entry.since.elapsed() < EXPECTATION_LIFETIME
        });
        let caught_up = entries.is_empty();
        if caught_up {
            pending.remove(key);
        }
        caught_up
    }

    /// Forgets everything about `key` (the DatabaseService is gone).
    pub fn forget(&self, key: &str) {
        self.pending.lock().expect("expectations lock").remove(key);
    }

    /// DatabaseServices with pending expectations.
    pub fn len(&self) -> usize {
        self.pending.lock().expect("expectations lock").len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_awaited_until_the_cache_shows_it_or_a_later_version() {
        let expectations = Expectations::default();
        expectations.expect("ns/db", "StatefulSet", "db", Some("120".into()));
        assert!(!expectations.satisfied("ns/db", |_, _| None), "not cached yet");
        assert!(!expectations.satisfied("ns/db", |_, _| Some("119".into())), "cache older than the write");
        assert!(expectations.satisfied("ns/db", |_, _| Some("125".into())), "a later version includes the write");
        assert!(expectations.is_empty());
        assert!(expectations.satisfied("ns/other", |_, _| None), "nothing written, nothing awaited");
    }
}
