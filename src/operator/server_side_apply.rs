//! The one way the operator writes what it owns: server-side apply under one field manager
//! ([`FIELD_MANAGER`]), forced (we are the only intended owner of these fields; a hand edit is
//! drift to undo). Bodies are built here and nowhere else.

use crate::api::database_service::FIELD_MANAGER;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::fmt::Debug;

/// The apply body of a whole object: its fields plus `apiVersion` and `kind`.
pub fn object_body<K>(object: &K) -> Value
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let mut body = serde_json::to_value(object).expect("objects serialize");
    body["apiVersion"] = Value::String(K::api_version(&()).to_string());
    body["kind"] = Value::String(K::kind(&()).to_string());
    body
}

/// The apply body of a status: conditional on `resource_version` when given (a status decided
/// from a stale object is refused with 409 instead of written).
pub fn status_body<K>(name: &str, resource_version: Option<&str>, status: &impl Serialize) -> Value
where
    K: Resource<DynamicType = ()>,
{
    let mut metadata = json!({ "name": name });
    if let Some(version) = resource_version {
        metadata["resourceVersion"] = Value::String(version.to_string());
    }
    json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": metadata,
        "status": status,
    })
}

fn params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Applies `object` (see [`object_body`]); returns the object as written.
pub async fn apply<K>(api: &Api<K>, object: &K) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    api.patch(&name, &params(), &Patch::Apply(&object_body(object))).await
}

/// Applies a status body made by [`status_body`]; returns the object as written.
pub async fn apply_status<K>(api: &Api<K>, name: &str, body: &Value) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
{
    api.patch_status(name, &params(), &Patch::Apply(body)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::database_service::DatabaseService;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn an_object_body_names_its_kind() {
        let mut config_map = ConfigMap::default();
        config_map.metadata.name = Some("ledger".into());
        let body = object_body(&config_map);
        assert_eq!((body["apiVersion"].as_str(), body["kind"].as_str()), (Some("v1"), Some("ConfigMap")));
        assert_eq!(body["metadata"]["name"], "ledger");
    }

    #[test]
    fn a_status_body_is_conditional_only_when_asked() {
        let body = status_body::<DatabaseService>("demo", Some("42"), &json!({"phase": "Deleting"}));
        assert_eq!(body["kind"], "DatabaseService");
        assert_eq!(body["apiVersion"], "dbservice.dev/v1");
        assert_eq!(body["metadata"], json!({"name": "demo", "resourceVersion": "42"}));
        assert_eq!(body["status"]["phase"], "Deleting");
        let unconditional = status_body::<DatabaseService>("demo", None, &json!({}));
        assert_eq!(unconditional["metadata"], json!({"name": "demo"}));
    }
}
