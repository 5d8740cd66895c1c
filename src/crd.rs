//! The CustomResourceDefinition, generated from the Rust types, with the CEL rules and defaults
//! that keep the API safe when the admission webhooks are not installed (defence in depth).

use crate::api::{DatabaseService, DEFAULT_REPLICAS};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{json, Value};

/// The CRD with schema defaults, patterns and x-kubernetes-validations added.
pub fn custom_resource_definition() -> CustomResourceDefinition {
    let mut definition = serde_json::to_value(DatabaseService::crd()).expect("the CRD serializes");
    let spec_schema = &mut definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let properties = &mut spec_schema["properties"];
    properties["replicas"]["default"] = json!(DEFAULT_REPLICAS);
    properties["deletionPolicy"]["default"] = json!("Retain");
    // No schema pattern on version or storageSize: schema errors come before the validating
    // webhook and would hide its clearer messages. Length caps keep the CEL cost estimate low.
    properties["version"]["maxLength"] = json!(16);
    properties["storageSize"]["maxLength"] = json!(32);
    for field in ["databaseName", "username"] {
        properties[field]["x-kubernetes-validations"] =
            json!([{"rule": "self == oldSelf", "message": "field is immutable"}]);
    }
    properties["storageSize"]["x-kubernetes-validations"] = json!([{
        "rule": "!isQuantity(self) || !isQuantity(oldSelf) || quantity(self).compareTo(quantity(oldSelf)) >= 0",
        "message": "may grow but never shrink"
    }]);
    spec_schema["x-kubernetes-validations"] = json!([{
        "rule": "has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)",
        "message": "storageClassName is immutable"
    }, {
        "rule": "self.version.split('.')[0] == oldSelf.version.split('.')[0]",
        "message": "changing the major version is not supported: major upgrades need pg_upgrade"
    }]);
    strip_nulls(&mut definition);
    serde_json::from_value(definition).expect("the amended CRD deserializes")
}

fn strip_nulls(value: &mut Value) {
    if let Value::Object(map) = value {
        map.retain(|_, child| !child.is_null());
        map.values_mut().for_each(strip_nulls);
    } else if let Value::Array(items) = value {
        items.iter_mut().for_each(strip_nulls);
    }
}

/// The CRD as YAML, as printed by `dbservice-operator crd`.
pub fn crd_yaml() -> String {
    serde_yaml::to_string(&custom_resource_definition()).expect("the CRD serializes to YAML")
}

/// Only the CRD's `.spec` as YAML: the chart wraps it with its own metadata.
pub fn crd_spec_yaml() -> String {
    serde_yaml::to_string(&custom_resource_definition().spec).expect("the CRD spec serializes to YAML")
}
