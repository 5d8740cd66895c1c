//! A compact cached object: of the metadata only what every pass reads without expanding the
//! object stays typed (name and namespace, the store's key; resourceVersion, which the expectations
//! compare; the DatabaseService it belongs to, by which watches map events and passes select
//! children: its controlling owner, else its instance label); everything
//! else (spec, status, data, the rest of the metadata) is one packed JSON object ([`Packed`]: zstd
//! against a dictionary of the operator's own children). The typed k8s-openapi structs are mostly
//! empty Options: a StatefulSet costs about 30 KiB in memory as a struct, about 3 KiB as text and a
//! few hundred bytes packed; a label map ~700 B (a B-tree node has room for 11 entries), owner
//! references ~300 B. The caches hold one StatefulSet, three Services, two ConfigMaps, and the
//! pods and claims of every DatabaseService, so the packed form is what keeps 10 000
//! DatabaseServices within the operator's memory budget. A pass expands the objects it needs.

use crate::api::database_service::DatabaseService;
use crate::api::names::INSTANCE_LABEL;
use crate::operator::caches::packed::Packed;
use kube::api::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, Error as _};
use serde::ser::{Error as _, SerializeMap};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::fmt::Debug;
use std::marker::PhantomData;

/// An object of kind `K` with everything but its name, namespace and resourceVersion packed.
pub struct Compact<K> {
    /// Name, namespace and resourceVersion; the rest of the metadata is in the packed body.
    pub metadata: ObjectMeta,
    /// The DatabaseService the object belongs to (see [`Compact::database`]).
    database: Option<Box<str>>,
    /// Every other field, the rest of the metadata included, as one packed JSON object.
    body: Option<Packed>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            database: self.database.clone(),
            body: self.body.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> Debug for Compact<K> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Compact").field("metadata", &self.metadata).field("body", &self.body).finish()
    }
}

impl<'de, K> Deserialize<'de> for Compact<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut fields = Map::<String, Value>::deserialize(deserializer)?;
        let mut rest = match fields.remove("metadata") {
            Some(Value::Object(metadata)) => metadata,
            None | Some(Value::Null) => Map::new(),
            Some(_) => return Err(D::Error::custom("metadata is not an object")),
        };
        let mut take = |key: &str| match rest.remove(key) {
            Some(Value::String(text)) => Ok(Some(text)),
            None | Some(Value::Null) => Ok(None),
            Some(_) => Err(D::Error::custom(format!("metadata.{key} is not a string"))),
        };
        let metadata = ObjectMeta {
            name: take("name")?,
            namespace: take("namespace")?,
            resource_version: take("resourceVersion")?,
            ..ObjectMeta::default()
        };
        // Nothing compares managedFields: only fields the operator sets are compared.
        rest.remove("managedFields");
        rest.retain(|_, value| !value.is_null());
        let database =
            controlling_database(&rest).or_else(|| rest.get("labels")?.get(INSTANCE_LABEL)?.as_str()).map(Into::into);
        // The kind is the type's; nulls are what absent Options serialize to.
        fields.remove("apiVersion");
        fields.remove("kind");
        fields.retain(|_, value| !value.is_null());
        if !rest.is_empty() {
            fields.insert("metadata".into(), Value::Object(rest));
        }
        let body = (!fields.is_empty()).then(|| Packed::new(&Value::Object(fields).to_string()));
        Ok(Self { metadata, database, body, kind: PhantomData })
    }
}

/// The name of the DatabaseService that controls an object, by its ownerReferences.
fn controlling_database(metadata: &Map<String, Value>) -> Option<&str> {
    let group = format!("{}/", DatabaseService::group(&()));
    metadata
        .get("ownerReferences")?
        .as_array()?
        .iter()
        .find(|reference| {
            reference["controller"] == Value::Bool(true)
                && reference["kind"] == "DatabaseService"
                && reference["apiVersion"].as_str().is_some_and(|version| version.starts_with(&group))
        })?
        .get("name")?
        .as_str()
}

impl<K> Serialize for Compact<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut fields: Map<String, Value> = match &self.body {
            Some(body) => serde_json::from_str(&body.text()).map_err(S::Error::custom)?,
            None => Map::new(),
        };
        let mut metadata = match fields.remove("metadata") {
            Some(Value::Object(rest)) => rest,
            _ => Map::new(),
        };
        for (key, value) in [
            ("name", &self.metadata.name),
            ("namespace", &self.metadata.namespace),
            ("resourceVersion", &self.metadata.resource_version),
        ] {
            if let Some(value) = value {
                metadata.insert(key.into(), Value::String(value.clone()));
            }
        }
        let mut map = serializer.serialize_map(Some(fields.len() + 1))?;
        map.serialize_entry("metadata", &metadata)?;
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
    /// The DatabaseService the object belongs to: its controlling owner (as `owns` would map it),
    /// else its instance label (pods are owned by the StatefulSet, claims until adopted by nobody).
    pub fn database(&self) -> Option<&str> {
        self.database.as_deref()
    }
}

impl<K: Serialize + DeserializeOwned> Compact<K> {
    /// The compact form of `object`.
    pub fn from_object(object: &K) -> Self {
        serde_json::from_value(serde_json::to_value(object).expect("objects serialize")).expect("objects deserialize")
    }

    /// The object as JSON (for comparing with a desired object), all of its metadata included.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("compact objects serialize")
    }

    /// The typed object; None if the text no longer parses as `K` (never for what the apiserver sent).
    pub fn expand(&self) -> Option<K> {
        serde_json::from_value(self.to_value()).ok()
    }

    /// Reduces the object as its typed form is reduced (by `Slim`, in the caches), keeping the
    /// DatabaseService it arrived with (a ConfigMap's labels go into its data's fingerprint).
    pub fn reduce(&mut self, slim: impl FnOnce(&mut K)) {
        if let Some(mut object) = self.expand() {
            slim(&mut object);
            let database = self.database.take();
            *self = Compact::from_object(&object);
            self.database = database;
        }
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
        assert_eq!(compact.metadata.generation, None, "packed with the rest of the metadata");
        assert_eq!(compact.to_value()["metadata"]["generation"], 3);
        let parsed: Compact<StatefulSet> = serde_json::from_str(&serde_json::to_string(&object).unwrap()).unwrap();
        assert_eq!(parsed.body, compact.body);
        assert!(std::mem::size_of::<Compact<StatefulSet>>() < std::mem::size_of::<StatefulSet>() / 2);
    }

    #[test]
    fn packed_metadata_comes_back_in_the_object_and_managed_fields_are_dropped() {
        let object: StatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "ns", "resourceVersion": "42", "uid": "u-1",
                         "labels": {"app.kubernetes.io/instance": "db", "team": "a"},
                         "ownerReferences": [{"apiVersion": "dbservice.dev/v1", "kind": "DatabaseService", "name": "db", "uid": "u-0", "controller": true}]},
            "spec": {"serviceName": "db", "selector": {}, "template": {}}
        }))
        .unwrap();
        let mut served = object.clone();
        served.metadata.managed_fields = Some(vec![Default::default()]);
        let compact = Compact::from_object(&served);
        assert_eq!(
            compact.metadata,
            ObjectMeta {
                name: Some("db".into()),
                namespace: Some("ns".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            }
        );
        assert_eq!(compact.database(), Some("db"));
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
        assert_eq!(compact.database(), Some("db"));
        assert_eq!(compact.expand(), Some(object));
        assert_eq!(compact.to_value()["data"]["fingerprint"], "0123456789abcdef");
        let empty: Compact<ConfigMap> = serde_json::from_str(r#"{"metadata": {"name": "x"}, "data": null}"#).unwrap();
        assert!(empty.body.is_none());
        assert!(serde_json::from_str::<Compact<ConfigMap>>(r#"{"metadata": 5}"#).is_err());
    }

    #[test]
    fn an_object_belongs_to_its_controlling_database_before_its_label() {
        use k8s_openapi::api::core::v1::PersistentVolumeClaim;
        let owned = |kind: &str, api_version: &str, controller: bool| {
            let object: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "data-db-0", "labels": {"app.kubernetes.io/instance": "label-name"},
                             "ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": "owner-name", "uid": "u", "controller": controller}]}
            }))
            .unwrap();
            Compact::from_object(&object).database().map(String::from)
        };
        assert_eq!(owned("DatabaseService", "dbservice.dev/v1", true).as_deref(), Some("owner-name"));
        assert_eq!(owned("DatabaseService", "dbservice.dev/v1", false).as_deref(), Some("label-name"));
        assert_eq!(owned("StatefulSet", "apps/v1", true).as_deref(), Some("label-name"));
        assert_eq!(owned("DatabaseService", "other.example/v1", true).as_deref(), Some("label-name"));
    }
}
