//! The API reference of the manual (`docs/manual/src/reference/*.md`), rendered from a
//! CustomResourceDefinition's schema, so that the fields and their documentation are written once,
//! in the Rust types (`dbservice-operator crd --reference`, `make crd`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;
use std::fmt::Write;

/// One row of the reference: a field's path, its type and its documentation.
#[derive(Debug, PartialEq)]
struct Field {
    path: String,
    kind: String,
    description: String,
}

/// The reference page of `definition`: a title, how to read it, and a table of every field of
/// `spec` and `status` of its first version, depth first in the schema's order.
pub fn markdown(definition: &CustomResourceDefinition) -> String {
    let names = &definition.spec.names;
    let version = definition.spec.versions.first().expect("a CRD has a version");
    let schema = version
        .schema
        .as_ref()
        .and_then(|schema| schema.open_api_v3_schema.as_ref())
        .map(|schema| serde_json::to_value(schema).expect("a schema serializes"))
        .unwrap_or(Value::Null);
    let mut page = format!("# {} API\n\n", names.kind);
    let short_names = names.short_names.as_deref().unwrap_or_default();
    let _ = writeln!(
        page,
        "`{}/{}`, kind `{}`, {}{}. Generated from the Rust types by `make crd` (do not edit): \
         the same schema the apiserver enforces; the webhook's further rules are in \
         [Admission rules](rules.md).\n",
        definition.spec.group,
        version.name,
        names.kind,
        if definition.spec.scope == "Namespaced" { "namespaced" } else { "cluster-scoped" },
        if short_names.is_empty() {
            String::new()
        } else {
            format!(
                ", short names {}",
                short_names.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ")
            )
        },
    );
    for part in ["spec", "status"] {
        let Some(part_schema) = schema.pointer(&format!("/properties/{part}")) else { continue };
        let mut fields = Vec::new();
        collect(part, part_schema, &mut fields);
        let _ = writeln!(page, "## `{part}`\n\n| field | type | description |\n| --- | --- | --- |");
        for field in fields {
            let _ = writeln!(page, "| `{}` | {} | {} |", field.path, field.kind, field.description);
        }
        page.push('\n');
    }
    page
}

/// Fields whose value is a Kubernetes core type, documented by Kubernetes: listed, not descended.
const KUBERNETES_TYPES: [(&str, &str); 5] = [
    ("affinity", "Affinity"),
    ("resources", "ResourceRequirements"),
    ("tolerations", "Toleration"),
    ("topologySpreadConstraints", "TopologySpreadConstraint"),
    ("conditions", "Condition"),
];

/// Every field below `schema` (at `path`), depth first: objects' properties, array items (`[]`)
/// and map values (`.<key>`).
fn collect(path: &str, schema: &Value, fields: &mut Vec<Field>) {
    let required: Vec<&str> =
        schema["required"].as_array().map(|names| names.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    if let Some(properties) = schema["properties"].as_object() {
        for (name, child) in properties {
            let child_path = format!("{path}.{name}");
            let mut kind = kind_of(child, required.contains(&name.as_str()));
            let core = KUBERNETES_TYPES.iter().find(|(field, _)| field == name).map(|(_, core)| core);
            if let Some(core) = core {
                kind = format!("{kind} (Kubernetes [`{core}`](https://kubernetes.io/docs/reference/kubernetes-api/))");
            }
            fields.push(Field {
                path: child_path.clone(),
                kind,
                description: one_line(child["description"].as_str().unwrap_or_default()),
            });
            if core.is_none() {
                collect(&child_path, child, fields);
            }
        }
    }
    if schema["items"].is_object() {
        collect(&format!("{path}[]"), &schema["items"], fields);
    }
    if schema["additionalProperties"].is_object() {
        collect(&format!("{path}.<key>"), &schema["additionalProperties"], fields);
    }
}

/// A field's type for people: `string`, `integer (int32)`, `one of a, b`, `array of object`, …,
/// then `, required` and the schema's default.
fn kind_of(schema: &Value, required: bool) -> String {
    let mut kind = if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values.iter().map(|value| format!("`{}`", value.as_str().unwrap_or("?"))).collect();
        format!("one of {}", values.join(", "))
    } else if schema["x-kubernetes-int-or-string"].as_bool() == Some(true) {
        "integer or string".to_string()
    } else {
        let base = schema["type"].as_str().unwrap_or("any").to_string();
        match (base.as_str(), schema["format"].as_str()) {
            ("array", _) => format!("array of {}", schema["items"]["type"].as_str().unwrap_or("any")),
            ("object", _) if schema["additionalProperties"].is_object() => {
                format!("map of {}", schema["additionalProperties"]["type"].as_str().unwrap_or("any"))
            }
            (_, Some(format)) => format!("{base} ({format})"),
            _ => base,
        }
    };
    if required {
        kind.push_str(", required");
    }
    if !schema["default"].is_null() {
        let _ = write!(kind, ", default `{}`", schema["default"]);
    }
    kind
}

/// A description on one table line: paragraphs joined, pipes escaped, and `<` and `>` outside
/// code spans written as entities (`<version>` would be read as an HTML tag).
fn one_line(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|");
    joined
        .split('`')
        .enumerate()
        .map(
            |(index, part)| {
                if index % 2 == 1 {
                    part.to_string()
                } else {
                    part.replace('<', "&lt;").replace('>', "&gt;")
                }
            },
        )
        .collect::<Vec<_>>()
        .join("`")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_listed_with_its_type_and_documentation() {
        let page = markdown(&crate::api::crd::custom_resource_definition());
        assert!(page.starts_with("# DatabaseService API\n"), "{page}");
        assert!(page.contains("`dbservice.dev/v1`, kind `DatabaseService`, namespaced, short names `dbs`, `dbsvc`"));
        let version = page.lines().find(|line| line.starts_with("| `spec.version` |")).expect("spec.version");
        assert!(version.contains("| string, required |"), "{version}");
        let replicas = page.lines().find(|line| line.starts_with("| `spec.replicas` |")).expect("spec.replicas");
        assert!(replicas.contains("default `1`"), "{replicas}");
        assert!(page.contains("| `spec.roles[].name` |"), "array items are walked");
        assert!(page.contains("## `status`"));
        assert!(page.contains("| `spec.affinity` | object (Kubernetes [`Affinity`]"), "core types are named");
        assert!(!page.contains("spec.affinity.nodeAffinity"), "and not descended");
    }

    #[test]
    fn enums_maps_and_pipes_read_well_in_a_table() {
        let schema = serde_json::json!({"properties": {
            "policy": {"type": "string", "enum": ["Retain", "Delete"], "description": "keep <this>\n\nor | remove `<that>`"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}}
        }, "required": ["policy"]});
        let mut fields = Vec::new();
        collect("spec", &schema, &mut fields);
        assert_eq!(
            fields[1],
            Field {
                path: "spec.policy".into(),
                kind: "one of `Retain`, `Delete`, required".into(),
                description: "keep &lt;this&gt; or \\| remove `<that>`".into()
            }
        );
        assert_eq!(fields[0].kind, "map of string");
    }
}
