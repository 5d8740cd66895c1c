//! A compact cached object: metadata as usual, spec and status kept as JSON text. The typed
//! k8s-openapi structs are mostly empty Options, and a StatefulSet costs about 30 KiB in memory as
//! a struct but about 3 KiB as text; the caches hold one per DatabaseService (three Services), so
//! the text form is what keeps 10 000 DatabaseServices within the operator's memory budget. A pass
//! expands the one object it needs. Kinds whose labels nothing reads from the cache keep them as
//! text as well ([`Compact::fold_labels`]): a label map costs ~700 B in memory, its text ~120 B.

use kube::api::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::fmt::Debug;
use std::marker::PhantomData;

/// An object of kind `K` with its spec and status as compact JSON text.
#[derive(Deserialize, Serialize)]
#[serde(bound = "")]
pub struct Compact<K> {
    /// Metadata, as cached.
    pub metadata: ObjectMeta,
    /// The labels as JSON text once folded out of the metadata.
    #[serde(skip)]
    labels: Option<Box<str>>,
    /// The spec as JSON text.
    #[serde(
        default,
        deserialize_with = "to_text",
        serialize_with = "from_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub spec: Option<Box<str>>,
    /// The status as JSON text.
    #[serde(
        default,
        deserialize_with = "to_text",
        serialize_with = "from_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub status: Option<Box<str>>,
    #[serde(skip)]
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            labels: self.labels.clone(),
            spec: self.spec.clone(),
            status: self.status.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> Debug for Compact<K> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Compact")
            .field("metadata", &self.metadata)
            .field("labels", &self.labels)
            .field("spec", &self.spec)
            .field("status", &self.status)
            .finish()
    }
}

fn to_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Box<str>>, D::Error> {
    let value = Option::<Value>::deserialize(deserializer)?;
    Ok(value.filter(|value| !value.is_null()).map(|value| value.to_string().into_boxed_str()))
}

fn from_text<S: Serializer>(text: &Option<Box<str>>, serializer: S) -> Result<S::Ok, S::Error> {
    let value: Option<Value> =
        text.as_deref().map(serde_json::from_str).transpose().map_err(serde::ser::Error::custom)?;
    value.serialize(serializer)
}

impl<K: k8s_openapi::Resource> k8s_openapi::Resource for Compact<K> {
    const API_VERSION: &'static str = K::API_VERSION;
    const GROUP: &'static str = K::GROUP;
    const KIND: &'static str = K::KIND;
    const VERSION: &'static str = K::VERSION;
    const URL_PATH_SEGMENT: &'static str = K::URL_PATH_SEGMENT;
    type Scope = K::Scope;
}

impl<K: k8s_openapi::Resource> k8s_openapi::Metadata for Compact<K> {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<K: Serialize + DeserializeOwned> Compact<K> {
    /// The compact form of `object`.
    pub fn from_object(object: &K) -> Self {
        serde_json::from_value(serde_json::to_value(object).expect("objects serialize")).expect("objects deserialize")
    }

    /// Moves the labels out of the metadata into text; [`Compact::to_value`] and
    /// [`Compact::expand`] put them back. Only for kinds whose cached labels nothing reads.
    pub fn fold_labels(&mut self) {
        if let Some(labels) = self.metadata.labels.take() {
            self.labels = Some(serde_json::to_string(&labels).expect("labels serialize").into_boxed_str());
        }
    }

    /// The object as JSON (for comparing with a desired object), folded labels included.
    pub fn to_value(&self) -> Value {
        let mut value = serde_json::to_value(self).expect("compact objects serialize");
        if let (Some(labels), Some(metadata)) = (&self.labels, value.get_mut("metadata")) {
            metadata["labels"] = serde_json::from_str(labels).expect("folded labels are JSON");
        }
        value
    }

    /// The typed object; None if the text no longer parses as `K` (never for what the apiserver sent).
    pub fn expand(&self) -> Option<K> {
        serde_json::from_value(self.to_value()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSet;

    #[test]
    fn an_object_survives_the_compact_form_and_is_far_smaller() {
        let object: StatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "ns", "generation": 3},
            "spec": {"replicas": 2, "serviceName": "db-headless", "selector": {"matchLabels": {"a": "b"}},
                     "template": {"spec": {"containers": [{"name": "postgres", "image": "postgres:16.4"}]}}},
            "status": {"replicas": 2, "readyReplicas": 1, "observedGeneration": 3}
        }))
        .unwrap();
        let compact = Compact::from_object(&object);
        assert_eq!(compact.expand(), Some(object.clone()));
        assert_eq!(compact.metadata.generation, Some(3));
        let parsed: Compact<StatefulSet> = serde_json::from_str(&serde_json::to_string(&object).unwrap()).unwrap();
        assert_eq!(parsed.spec, compact.spec);
        assert!(std::mem::size_of::<Compact<StatefulSet>>() < std::mem::size_of::<StatefulSet>() / 2);
    }

    #[test]
    fn folded_labels_leave_the_metadata_and_come_back_in_the_object() {
        let object: StatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "labels": {"app.kubernetes.io/instance": "db", "team": "a"}},
            "spec": {"serviceName": "db", "selector": {}, "template": {}}
        }))
        .unwrap();
        let mut compact = Compact::from_object(&object);
        compact.fold_labels();
        assert_eq!(compact.metadata.labels, None);
        assert_eq!(compact.to_value()["metadata"]["labels"]["team"], "a");
        assert_eq!(compact.clone().expand(), Some(object));
    }
}
