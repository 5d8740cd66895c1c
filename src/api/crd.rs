//! The CustomResourceDefinition, generated from the Rust types, with the CEL rules and defaults
//! that keep the API safe when the admission webhooks are not installed (defence in depth).

use crate::api::database_service::{DatabaseService, DEFAULT_REPLICAS};
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
    properties["bootstrap"]["x-kubernetes-validations"] =
        json!([{"rule": "self == oldSelf", "message": "field is immutable"}]);
    properties["storageSize"]["x-kubernetes-validations"] = json!([{
        "rule": "!isQuantity(self) || !isQuantity(oldSelf) || quantity(self).compareTo(quantity(oldSelf)) >= 0",
        "message": "may grow but never shrink"
    }]);
    spec_schema["x-kubernetes-validations"] = json!([{
        "rule": "has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)",
        "message": "storageClassName is immutable"
    }, {
        "rule": "!self.version.matches('^[0-9]+([.][0-9]+){0,2}$') || !oldSelf.version.matches('^[0-9]+([.][0-9]+){0,2}$') || int(self.version.split('.')[0]) >= int(oldSelf.version.split('.')[0])",
        "message": "a major version never goes down: recover a backup into a new DatabaseService instead"
    }]);
    let root = &mut definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    cap_sizes(&mut root["properties"]["spec"]);
    cap_sizes(&mut root["properties"]["status"]);
    strip_nulls(&mut definition);
    known_integer_formats(&mut definition);
    serde_json::from_value(definition).expect("the amended CRD deserializes")
}

/// Default caps for strings, lists and maps that the types do not cap themselves: with them, the
/// largest DatabaseService the schema accepts stays far below the webhook's 1 MiB body limit
/// (hundreds of thousands of `resources.claims` used to be accepted, a 3 MiB object).
pub const DEFAULT_MAX_LENGTH: u64 = 1024;
/// Default `maxItems` of a list.
pub const DEFAULT_MAX_ITEMS: u64 = 16;
/// Default `maxProperties` of a map (`additionalProperties`).
pub const DEFAULT_MAX_PROPERTIES: u64 = 16;
/// Condition messages may be long (Kubernetes' own limit for them).
const CONDITION_MESSAGE_MAX_LENGTH: u64 = 32768;

/// Adds maxLength to every string, maxItems to every list and maxProperties to every map of
/// the schema that has none. int-or-string nodes (quantities) have no `type` and are left as
/// they are: a structural schema allows no string validation on them.
pub(crate) fn cap_sizes(schema: &mut Value) {
    let Value::Object(node) = schema else {
        return;
    };
    match node.get("type").and_then(Value::as_str) {
        Some("string") => {
            let cap = match node.get("description").and_then(Value::as_str) {
                Some(description) if description.starts_with("message is a human readable message") => {
                    CONDITION_MESSAGE_MAX_LENGTH
                }
                _ => DEFAULT_MAX_LENGTH,
            };
            node.entry("maxLength").or_insert(json!(cap));
        }
        Some("array") => {
            node.entry("maxItems").or_insert(json!(DEFAULT_MAX_ITEMS));
        }
        Some("object") if node.contains_key("additionalProperties") => {
            node.entry("maxProperties").or_insert(json!(DEFAULT_MAX_PROPERTIES));
        }
        _ => {}
    }
    if let Some(Value::Object(properties)) = node.get_mut("properties") {
        properties.values_mut().for_each(cap_sizes);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = node.get_mut(key) {
            cap_sizes(child);
        }
    }
}

/// Replaces the unsigned integer formats schemars writes (`uint8` … `uint64`, `uint`), which the
/// apiserver does not know (every apply of the CRD printed `Warning: unrecognized format`), by
/// `int32`/`int64`, keeping the bounds as `minimum`/`maximum`.
pub(crate) fn known_integer_formats(value: &mut Value) {
    match value {
        Value::Object(node) => {
            let replacement = match node.get("format").and_then(Value::as_str) {
                Some("uint8") => Some(("int32", Some(u64::from(u8::MAX)))),
                Some("uint16") => Some(("int32", Some(u64::from(u16::MAX)))),
                Some("uint32") => Some(("int64", Some(u64::from(u32::MAX)))),
                Some("uint64" | "uint") => Some(("int64", None)),
                _ => None,
            };
            if let Some((format, maximum)) = replacement {
                node.insert("format".into(), json!(format));
                node.entry("minimum").or_insert(json!(0));
                if let Some(maximum) = maximum {
                    node.entry("maximum").or_insert(json!(maximum));
                }
            }
            node.values_mut().for_each(known_integer_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(known_integer_formats),
        _ => {}
    }
}

pub(crate) fn strip_nulls(value: &mut Value) {
    if let Value::Object(map) = value {
        map.retain(|_, child| !child.is_null());
        map.values_mut().for_each(strip_nulls);
    } else if let Value::Array(items) = value {
        items.iter_mut().for_each(strip_nulls);
    }
}

/// The CRD as YAML, as printed by `dbservice-operator crd`.
pub fn crd_yaml() -> String {
    crate::api::yaml::to_string(&custom_resource_definition()).expect("the CRD serializes to YAML")
}

/// Only the CRD's `.spec` as YAML: the chart wraps it with its own metadata.
pub fn crd_spec_yaml() -> String {
    crate::api::yaml::to_string(&custom_resource_definition().spec).expect("the CRD spec serializes to YAML")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `format` in `value`, with its JSON path.
    fn formats(value: &Value, path: &str, found: &mut Vec<(String, String)>) {
        match value {
            Value::Object(node) => {
                if let Some(format) = node.get("format").and_then(Value::as_str) {
                    found.push((path.to_string(), format.to_string()));
                }
                for (key, child) in node {
                    formats(child, &format!("{path}.{key}"), found);
                }
            }
            Value::Array(items) => {
                items.iter().enumerate().for_each(|(index, child)| formats(child, &format!("{path}[{index}]"), found))
            }
            _ => {}
        }
    }

    #[test]
    fn both_crds_use_only_formats_the_apiserver_knows() {
        // The formats kube-openapi's validation recognizes for the types used here.
        let known = ["int32", "int64", "date-time", "byte", "double", "float", "date"];
        for (kind, definition) in [
            ("DatabaseService", serde_json::to_value(custom_resource_definition()).unwrap()),
            (
                "DatabaseServiceBackup",
                serde_json::to_value(crate::api::database_service_backup::custom_resource_definition()).unwrap(),
            ),
        ] {
            let mut found = Vec::new();
            formats(&definition, "", &mut found);
            let unknown: Vec<_> = found.iter().filter(|(_, format)| !known.contains(&format.as_str())).collect();
            assert!(unknown.is_empty(), "{kind}: unknown formats {unknown:?}");
        }
    }

    #[test]
    fn unsigned_formats_keep_their_bounds() {
        let mut schema = json!({"properties": {
            "small": {"type": "integer", "format": "uint32", "minimum": 0},
            "large": {"type": "integer", "format": "uint64", "minimum": 0, "maximum": 1000},
            "plain": {"type": "integer", "format": "int32"}
        }});
        known_integer_formats(&mut schema);
        assert_eq!(
            schema["properties"]["small"],
            json!({"type": "integer", "format": "int64", "minimum": 0, "maximum": 4294967295u64})
        );
        assert_eq!(
            schema["properties"]["large"],
            json!({"type": "integer", "format": "int64", "minimum": 0, "maximum": 1000})
        );
        assert_eq!(schema["properties"]["plain"], json!({"type": "integer", "format": "int32"}));
    }

    /// Every string, list and map of spec and status has a size cap (int-or-string quantities
    /// excepted: a structural schema allows no string validation on them).
    #[test]
    fn every_string_list_and_map_is_capped() {
        fn uncapped(schema: &Value, path: &str, found: &mut Vec<String>) {
            let Value::Object(node) = schema else { return };
            let cap = match node.get("type").and_then(Value::as_str) {
                Some("string") => Some("maxLength"),
                Some("array") => Some("maxItems"),
                Some("object") if node.contains_key("additionalProperties") => Some("maxProperties"),
                _ => None,
            };
            if let Some(cap) = cap.filter(|cap| !node.contains_key(*cap)) {
                found.push(format!("{path}: no {cap}"));
            }
            if let Some(Value::Object(properties)) = node.get("properties") {
                for (name, child) in properties {
                    uncapped(child, &format!("{path}.{name}"), found);
                }
            }
            for key in ["items", "additionalProperties"] {
                if let Some(child) = node.get(key) {
                    uncapped(child, &format!("{path}[]"), found);
                }
            }
        }
        let definition = serde_json::to_value(custom_resource_definition()).unwrap();
        let root = &definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        let mut found = Vec::new();
        uncapped(&root["spec"], "spec", &mut found);
        uncapped(&root["status"], "status", &mut found);
        assert!(found.is_empty(), "uncapped: {found:#?}");
        let spec = &root["spec"]["properties"];
        assert_eq!(spec["resources"]["properties"]["claims"]["maxItems"], 16);
        assert_eq!(spec["image"]["maxLength"], crate::admission::validation::MAX_IMAGE_LENGTH);
        assert_eq!(spec["storageClassName"]["maxLength"], crate::admission::validation::MAX_DNS_SUBDOMAIN_LENGTH);
    }
}
