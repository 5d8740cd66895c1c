//! Publishes `events.k8s.io/v1` Events, folding repeats into a series as kube's `Recorder` does,
//! but remembering each series in about 100 bytes instead of a whole Event (kube's recorder keeps
//! the full Event and its reference for six minutes: about 4 KB per event, most of the memory
//! 1,000 new databases leave behind after their creation burst).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as KubernetesEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Client};
use serde_json::json;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// How long a repeat still counts as part of the same series (kube's recorder uses the same).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// Series remembered at most; beyond that the oldest are forgotten (a repeat then starts a new
/// Event), so a storm of distinct events cannot grow the process.
const MAX_SERIES: usize = 20_000;

/// Where a series' Event lives and how often it was seen.
#[derive(Clone, Debug, PartialEq)]
struct Series {
    name: Box<str>,
    namespace: Box<str>,
    count: i32,
    last_observed: Timestamp,
}

/// Publishes Events for the objects the operator manages.
pub struct EventPublisher {
    client: Client,
    controller: String,
    instance: String,
    series: Mutex<SeriesMemory>,
}

/// The series seen within the window, bounded by [`MAX_SERIES`].
#[derive(Default)]
struct SeriesMemory {
    by_key: HashMap<u64, Series>,
}

impl SeriesMemory {
    /// The live series for `key`, after forgetting the expired ones.
    fn live(&mut self, key: u64, now: Timestamp) -> Option<Series> {
        self.by_key.retain(|_, series| series.last_observed + SERIES_WINDOW > now);
        self.by_key.get(&key).cloned()
    }

    fn remember(&mut self, key: u64, series: Series) {
        if self.by_key.len() >= MAX_SERIES && !self.by_key.contains_key(&key) {
            let oldest = self.by_key.iter().min_by_key(|(_, series)| series.last_observed).map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                self.by_key.remove(&oldest);
            }
        }
        self.by_key.insert(key, series);
    }
}

impl EventPublisher {
    /// A publisher reporting as `controller`, instance `instance` (the pod's identity).
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Self { client, controller: controller.into(), instance: instance.into(), series: Mutex::default() }
    }

    /// Creates the Event, or counts a repeat of one published within the series window (same type,
    /// reason, action and object) on the existing Event.
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = series_key(event, regarding);
        let repeat = self.memory().live(key, now);
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let events: Api<KubernetesEvent> = Api::namespaced(self.client.clone(), &namespace);
        let series = match repeat {
            Some(mut series) => {
                series.count += 1;
                series.last_observed = now;
                let patch = json!({"series": {"count": series.count, "lastObservedTime": MicroTime(now)}});
                events.patch(&series.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                series
            }
            None => {
                let created = events.create(&PostParams::default(), &self.new_event(event, regarding, now)).await?;
                Series {
                    name: created.metadata.name.unwrap_or_default().into(),
                    namespace: namespace.into(),
                    count: 1,
                    last_observed: now,
                }
            }
        };
        self.memory().remember(key, series);
        Ok(())
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, SeriesMemory> {
        // Nothing panics while holding the lock, so poisoning cannot happen; recover anyway.
        self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn new_event(&self, event: &Event, regarding: &ObjectReference, now: Timestamp) -> KubernetesEvent {
        KubernetesEvent {
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                // Unique per publisher and time, as the apiserver's own recorders name events.
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(&self.controller),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(event_type(event.type_).into()),
            ..Default::default()
        }
    }
}

fn event_type(kind: EventType) -> &'static str {
    match kind {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// Identity of a series: what kube's recorder keys on, hashed (the note may differ between
/// repeats; the first one stays, as with kube's recorder).
fn series_key(event: &Event, regarding: &ObjectReference) -> u64 {
    let mut hasher = DefaultHasher::new();
    event_type(event.type_).hash(&mut hasher);
    event.reason.hash(&mut hasher);
    event.action.hash(&mut hasher);
    for reference in std::iter::once(regarding).chain(event.secondary.as_ref()) {
        reference.uid.hash(&mut hasher);
        reference.kind.hash(&mut hasher);
        reference.namespace.hash(&mut hasher);
        reference.name.hash(&mut hasher);
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(reason: &str, note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Reconcile".into(),
            secondary: None,
        }
    }

    fn reference(name: &str) -> ObjectReference {
        ObjectReference {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            uid: Some("u1".into()),
            ..Default::default()
        }
    }

    fn series(name: &str, last_observed: Timestamp) -> Series {
        Series { name: name.into(), namespace: "shop".into(), count: 1, last_observed }
    }

    #[test]
    fn a_series_is_forgotten_after_the_window() {
        let start: Timestamp = "2026-12-01T00:00:00Z".parse().unwrap();
        let mut memory = SeriesMemory::default();
        memory.remember(7, series("orders.1", start));
        assert_eq!(memory.live(7, start + SignedDuration::from_mins(5)), Some(series("orders.1", start)));
        assert_eq!(memory.live(7, start + SignedDuration::from_mins(6)), None);
        assert!(memory.by_key.is_empty(), "expired series are dropped, not only hidden");
    }

    #[test]
    fn the_memory_is_bounded_by_forgetting_the_oldest_series() {
        let start: Timestamp = "2026-12-01T00:00:00Z".parse().unwrap();
        let mut memory = SeriesMemory::default();
        for key in 0..MAX_SERIES as u64 {
            memory.remember(key, series("e", start + SignedDuration::from_millis(key as i64 + 1)));
        }
        memory.remember(0, series("again", start));
        assert_eq!(memory.by_key.len(), MAX_SERIES, "updating a known series takes no new room");
        memory.remember(u64::MAX, series("new", start + SignedDuration::from_secs(60)));
        assert_eq!(memory.by_key.len(), MAX_SERIES);
        assert!(!memory.by_key.contains_key(&0), "the oldest series made room");
        assert!(memory.by_key.contains_key(&u64::MAX));
    }

    #[test]
    fn a_repeat_with_another_note_continues_the_series_but_another_reason_or_object_does_not() {
        let first = series_key(&event("RestartFailed", "attempt 1"), &reference("orders"));
        assert_eq!(first, series_key(&event("RestartFailed", "attempt 2"), &reference("orders")));
        assert_ne!(first, series_key(&event("Degraded", "attempt 1"), &reference("orders")));
        assert_ne!(first, series_key(&event("RestartFailed", "attempt 1"), &reference("billing")));
    }
}
