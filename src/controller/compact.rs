//! A compact cached object: metadata as usual, every other field (spec, status, data) kept as one
//! packed JSON object ([`Packed`]: zstd against a dictionary of the operator's own children). The
//! typed k8s-openapi structs are mostly empty Options, and a StatefulSet costs about 30 KiB in
//! memory as a struct, about 3 KiB as text and a few hundred bytes packed; the caches hold one per
//! DatabaseService (three Services), so the packed form is what keeps 10 000 DatabaseServices within
//! the operator's memory budget. A pass expands the one object it needs. Labels that nothing reads
//! from the cache are packed as well ([`Compact::fold_labels`]): a label map costs ~700 B in memory
//! (a B-tree node holds room for 11 entries), its packed text a few dozen bytes. The instance label
//! stays readable, since watches map events by it and every pass selects children by it.

use super::names::INSTANCE_LABEL;
use super::packed::Packed;
use kube::api::ObjectMeta;
use serde::de::{DeserializeOwned, Error as _};
use serde::ser::{Error as _, SerializeMap};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::fmt::Debug;
use std::marker::PhantomData;

/// An object of kind `K` with everything but its metadata as packed JSON text.
pub struct Compact<K> {
    /// Metadata, as cached.
    pub metadata: ObjectMeta,
    /// The labels as packed JSON text once folded out of the metadata.
    labels: Option<Packed>,
    /// The instance label's value once the labels are folded.
    instance: Option<Box<str>>,
    /// Every field but metadata, apiVersion and kind, as one packed JSON object.
    body: Option<Packed>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            labels: self.labels.clone(),
            instance: self.instance.clone(),
            body: self.body.clone(),
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
            .field("body", &self.body)
            .finish()
    }
}

impl<'de, K> Deserialize<'de> for Compact<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut fields = Map::<String, Value>::deserialize(deserializer)?;
        let metadata = match fields.remove("metadata") {
            Some(metadata) => ObjectMeta::deserialize(metadata).map_err(D::Error::custom)?,
            None => ObjectMeta::default(),
        };
        // The kind is the type's; nulls are what absent Options serialize to.
        fields.remove("apiVersion");
        fields.remove("kind");
        fields.retain(|_, value| !value.is_null());
        let body = (!fields.is_empty()).then(|| Packed::new(&Value::Object(fields).to_string()));
        Ok(Self { metadata, labels: None, instance: None, body, kind: PhantomData })
    }
}

impl<K> Serialize for Compact<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields: Map<String, Value> = match &self.body {
            Some(body) => serde_json::from_str(&body.text()).map_err(S::Error::custom)?,
            None => Map::new(),
        };
        let mut map = serializer.serialize_map(Some(fields.len() + 1))?;
        map.serialize_entry("metadata", &self.metadata)?;
        for (key, value) in &fields {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
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

impl<K> Compact<K> {
    /// The value of the instance label, folded or not.
    pub fn instance(&self) -> Option<&str> {
        match &self.labels {
            Some(_) => self.instance.as_deref(),
            None => self.metadata.labels.as_ref()?.get(INSTANCE_LABEL).map(String::as_str),
        }
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
            self.instance = labels.get(INSTANCE_LABEL).map(|instance| instance.as_str().into());
            self.labels = Some(Packed::new(&serde_json::to_string(&labels).expect("labels serialize")));
        }
    }

    /// The object as JSON (for comparing with a desired object), folded labels included.
    pub fn to_value(&self) -> Value {
        let mut value = serde_json::to_value(self).expect("compact objects serialize");
        if let (Some(labels), Some(metadata)) = (&self.labels, value.get_mut("metadata")) {
            metadata["labels"] = serde_json::from_str(&labels.text()).expect("folded labels are JSON");
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
        assert_eq!(parsed.body, compact.body);
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
        assert_eq!(compact.instance(), Some("db"));
        assert_eq!(compact.to_value()["metadata"]["labels"]["team"], "a");
        assert_eq!(compact.clone().expand(), Some(object));
    }

    #[test]
    fn every_field_besides_the_metadata_is_kept_whatever_the_kind() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let object: ConfigMap = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "db-scripts", "labels": {"app.kubernetes.io/instance": "db"}},
            "data": {"fingerprint": "0123456789abcdef"}, "immutable": false
        }))
        .unwrap();
        let compact = Compact::from_object(&object);
        assert_eq!(compact.instance(), Some("db"));
        assert_eq!(compact.expand(), Some(object));
        assert_eq!(compact.to_value()["data"]["fingerprint"], "0123456789abcdef");
        let empty: Compact<ConfigMap> = serde_json::from_str(r#"{"metadata": {"name": "x"}, "data": null}"#).unwrap();
        assert!(empty.body.is_none());
        assert!(serde_json::from_str::<Compact<ConfigMap>>(r#"{"metadata": 5}"#).is_err());
    }
}
