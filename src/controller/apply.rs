//! The one write path for desired objects: server-side apply under one field manager, and only
//! when the live object does not already contain what we want. A converged cluster costs no write.

use crate::api::FIELD_MANAGER;
use crate::metrics::Metrics;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::fmt::Debug;

/// What applying did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The object did not exist and was created.
    Created,
    /// The object existed but differed and was corrected.
    Updated,
    /// The object already matched: nothing was written.
    Unchanged,
}

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

/// Applies `desired` unless `live` already contains it.
pub async fn apply<K>(
    api: &Api<K>,
    desired: &K,
    live: Option<&K>,
    metrics: &Metrics,
) -> Result<ApplyOutcome, kube::Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
{
    let desired_value = serde_json::to_value(desired).expect("objects serialize");
    if let Some(live) = live {
        let live_value = serde_json::to_value(live).expect("objects serialize");
        let mut wanted = desired_value.clone();
        // Identity fields are compared by name, not by how the server renders them.
        if let Some(object) = wanted.as_object_mut() {
            object.remove("apiVersion");
            object.remove("kind");
        }
        if contains(&live_value, &wanted) {
            return Ok(ApplyOutcome::Unchanged);
        }
    }
    let name = desired.meta().name.clone().unwrap_or_default();
    let mut body = desired_value;
    body["apiVersion"] = Value::String(K::api_version(&()).to_string());
    body["kind"] = Value::String(K::kind(&()).to_string());
    // force: we are the only intended owner of these fields; a hand edit is drift to undo.
    api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await?;
    metrics.count_write(&K::kind(&()), "apply");
    Ok(if live.is_some() { ApplyOutcome::Updated } else { ApplyOutcome::Created })
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
