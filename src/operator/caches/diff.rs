//! Whether a live object already holds what we want (pure): only fields we set are compared, so
//! server defaults and other managers' fields never look like drift and a converged cluster costs
//! no write.

use crate::operator::caches::Compact;
use crate::operator::caches::Slim;
use k8s_openapi::api::core::v1::ConfigMap;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// True when every field set in `desired` has the same value in `live`. Fields the server
/// defaults or other managers own are ignored, so that defaulting never looks like drift.
pub fn contains(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (Value::Object(live), Value::Object(desired)) => desired.iter().all(|(key, desired_value)| {
            desired_value.is_null() || live.get(key).is_some_and(|live_value| contains(live_value, desired_value))
        }),
        (Value::Array(live), Value::Array(desired)) => {
            live.len() == desired.len()
                && live.iter().zip(desired).all(|(live_item, desired_item)| contains(live_item, desired_item))
        }
        (Value::Number(live), Value::Number(desired)) => live.as_f64() == desired.as_f64(),
        _ => live == desired,
    }
}

/// A cached object as JSON, for comparing with a desired object.
pub trait LiveValue {
    /// The object as JSON.
    fn live_value(&self) -> Value;
}

impl LiveValue for ConfigMap {
    fn live_value(&self) -> Value {
        serde_json::to_value(self).expect("objects serialize")
    }
}

impl<K: Serialize + DeserializeOwned> LiveValue for Compact<K> {
    fn live_value(&self) -> Value {
        self.to_value()
    }
}

/// Whether the cached (slimmed) `live` object contains `desired`, slimmed the same way.
pub fn contains_object<K: Serialize + Slim + Clone>(live: &impl LiveValue, desired: &K) -> bool {
    let mut desired = desired.clone();
    desired.slim();
    let live_value = live.live_value();
    let mut wanted = serde_json::to_value(&desired).expect("objects serialize");
    // Identity fields are compared by name, not by how the server renders them.
    if let Some(object) = wanted.as_object_mut() {
        object.remove("apiVersion");
        object.remove("kind");
    }
    contains(&live_value, &wanted)
}

#[cfg(test)]
mod tests {
    use super::contains;
    use serde_json::json;

    #[test]
    fn server_defaults_are_not_drift() {
        let live = json!({"spec": {"replicas": 1, "revisionHistoryLimit": 10, "template": {"containers": [{"name": "a", "image": "x", "imagePullPolicy": "IfNotPresent"}]}}});
        let desired = json!({"spec": {"replicas": 1, "template": {"containers": [{"name": "a", "image": "x"}]}}});
        assert!(contains(&live, &desired));
    }

    #[test]
    fn changed_values_and_missing_items_are_drift() {
        let live = json!({"spec": {"replicas": 3, "template": {"containers": [{"name": "a", "image": "y"}]}}});
        assert!(!contains(&live, &json!({"spec": {"replicas": 1}})));
        assert!(!contains(&live, &json!({"spec": {"template": {"containers": [{"name": "a", "image": "x"}]}}})));
        assert!(!contains(&json!({"spec": {}}), &json!({"spec": {"ports": [{"port": 5432}]}})));
    }
}
