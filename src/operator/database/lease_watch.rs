//! Wiring of the [`LeaseClock`]: one watch of the databases' primary Leases (managed-by label,
//! `--watch-namespace`) keeps it, and every [`LAPSE_CHECK`] the databases whose Lease has just
//! lapsed get a pass. A renewal triggers no pass (every primary renews every few seconds); only
//! a lapse does, once per version.

use crate::api::database_service::DatabaseService;
use crate::api::names::MANAGED_SELECTOR;
use crate::lease::{lease_duration, lease_record};
use crate::operator::caches::scoped;
use crate::operator::database::failover::lease_clock::{LeaseClock, LeaseKey};
use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the clock is asked for lapsed Leases: the most a lapse waits for its pass.
pub const LAPSE_CHECK: Duration = Duration::from_millis(250);

/// The Lease's key in the clock.
fn key(lease: &Lease) -> LeaseKey {
    (lease.namespace().unwrap_or_default(), lease.name_any())
}

/// Notes one watch event in the clock.
fn note(clock: &LeaseClock, event: watcher::Event<Lease>) {
    let now = Instant::now();
    let seen = |lease: &Lease| {
        let version = lease.resource_version().unwrap_or_default();
        clock.observe(key(lease), &version, lease_record(lease).holder, lease_duration(lease), now);
    };
    match event {
        watcher::Event::Apply(lease) | watcher::Event::InitApply(lease) => seen(&lease),
        watcher::Event::Delete(lease) => clock.forget(&key(&lease)),
        watcher::Event::Init => clock.relist_started(),
        watcher::Event::InitDone => clock.relist_done(),
    }
}

/// The database of a primary Lease (`NAME-primary`).
fn database_of((namespace, name): LeaseKey) -> Option<ObjectRef<DatabaseService>> {
    Some(ObjectRef::new(name.strip_suffix("-primary")?).within(&namespace))
}

/// The passes to run because a database's primary Lease lapsed, while the watch keeps `clock`.
pub fn lapse_triggers(
    client: &Client,
    namespace: Option<&str>,
    clock: Arc<LeaseClock>,
) -> impl Stream<Item = ObjectRef<DatabaseService>> + Send + 'static {
    let config = watcher::Config::default().labels(MANAGED_SELECTOR);
    let watched = {
        let clock = clock.clone();
        watcher(scoped::<Lease>(client, namespace), config).default_backoff().filter_map(move |event| {
            match event {
                Ok(event) => note(&clock, event),
                Err(error) => tracing::warn!(%error, "watch of the primary leases"),
            }
            std::future::ready(None::<Vec<ObjectRef<DatabaseService>>>)
        })
    };
    let checks = futures::stream::unfold((), |()| async {
        tokio::time::sleep(LAPSE_CHECK).await;
        Some(((), ()))
    })
    .map(move |()| clock.newly_lapsed(Instant::now()).into_iter().filter_map(database_of).collect::<Vec<_>>());
    futures::stream::select(watched, checks).flat_map(futures::stream::iter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::api::ObjectMeta;

    fn lease(version: &str, holder: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("db-primary".into()),
                namespace: Some("team".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(10),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn watch_events_keep_the_clock_and_an_empty_holder_is_no_holder() {
        let clock = LeaseClock::default();
        let start = Instant::now();
        note(&clock, watcher::Event::Apply(lease("5", Some("db-0"))));
        let key = ("team".to_string(), "db-primary".to_string());
        assert_eq!(clock.lapsed(&key, start + Duration::from_secs(11)), Some("5".into()));
        note(&clock, watcher::Event::Apply(lease("6", Some(""))));
        assert_eq!(clock.lapsed(&key, start + Duration::from_secs(30)), None);
        note(&clock, watcher::Event::Apply(lease("7", Some("db-1"))));
        note(&clock, watcher::Event::Delete(lease("7", Some("db-1"))));
        assert_eq!(clock.lapsed(&key, start + Duration::from_secs(30)), None);
    }

    #[test]
    fn a_primary_lease_names_its_database() {
        let database = database_of(("team".into(), "orders-primary".into())).unwrap();
        assert_eq!((database.name.as_str(), database.namespace.as_deref()), ("orders", Some("team")));
        assert!(database_of(("team".into(), "unrelated".into())).is_none());
    }
}
