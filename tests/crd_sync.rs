//! The chart ships the CRD spec as a file (charts/dbservice-operator/files/crd-spec.yaml) generated
//! from the Rust types; these tests fail when the two drift apart and check the parts of the CRD
//! that users and the apiserver rely on.

use dbservice_operator::api::crd::{crd_spec_yaml, custom_resource_definition};
use serde_json::Value;
use std::path::Path;

const CHART_CRD_SPEC: &str = "charts/dbservice-operator/files/crd-spec.yaml";
const REGENERATE: &str = "cargo run -q -- crd --spec-only > charts/dbservice-operator/files/crd-spec.yaml";

#[test]
fn chart_crd_spec_is_generated_from_the_rust_types() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(CHART_CRD_SPEC);
    let in_chart = std::fs::read_to_string(&path).unwrap_or_else(|error| {
        panic!("cannot read {CHART_CRD_SPEC} ({error}); generate it with `{REGENERATE}` (or `make crd`)")
    });
    let generated = crd_spec_yaml();
    if in_chart != generated {
        let first_difference = in_chart
            .lines()
            .zip(generated.lines())
            .enumerate()
            .find(|(_, (chart_line, generated_line))| chart_line != generated_line)
            .map(|(index, (chart_line, generated_line))| {
                format!("line {}: chart has {chart_line:?}, generated is {generated_line:?}", index + 1)
            })
            .unwrap_or_else(|| {
                format!(
                    "lengths differ: chart {} lines, generated {} lines",
                    in_chart.lines().count(),
                    generated.lines().count()
                )
            });
        panic!("{CHART_CRD_SPEC} is out of date with src/api/database_service.rs and src/api/crd.rs ({first_difference}); regenerate it with `{REGENERATE}` (or `make crd`)");
    }
}

/// The `make crd` target must run the same command the failure message tells people to run.
#[test]
fn make_crd_target_regenerates_the_chart_crd_spec() {
    let makefile = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Makefile")).unwrap();
    let recipe: Vec<&str> = makefile
        .lines()
        .skip_while(|line| !line.starts_with("crd:"))
        .skip(1)
        .take_while(|line| line.starts_with('\t'))
        .collect();
    let recipe = recipe.join("\n");
    assert!(recipe.contains("run -q -- crd --spec-only >"), "`make crd` does not run `crd --spec-only`:\n{recipe}");
    assert!(
        recipe.contains(CHART_CRD_SPEC) || makefile.contains(&format!(":= {CHART_CRD_SPEC}")),
        "`make crd` does not write {CHART_CRD_SPEC}:\n{recipe}"
    );
}

fn crd_json() -> Value {
    serde_json::to_value(custom_resource_definition()).expect("the CRD serializes")
}

#[test]
fn crd_names_group_scope_and_short_names() {
    let crd = crd_json();
    assert_eq!(crd["metadata"]["name"], "databaseservices.dbservice.dev");
    assert_eq!(crd["spec"]["group"], "dbservice.dev");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["names"]["kind"], "DatabaseService");
    assert_eq!(crd["spec"]["names"]["plural"], "databaseservices");
    assert_eq!(crd["spec"]["names"]["shortNames"], serde_json::json!(["dbs", "dbsvc"]));
    let versions = crd["spec"]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 1, "one served version");
    assert_eq!(versions[0]["name"], "v1");
    assert_eq!(versions[0]["served"], true);
    assert_eq!(versions[0]["storage"], true);
}

#[test]
fn crd_has_the_status_subresource() {
    let crd = crd_json();
    // The controller writes status through /status, so spec writes by users cannot clobber it.
    assert_eq!(crd["spec"]["versions"][0]["subresources"]["status"], serde_json::json!({}));
}

#[test]
fn crd_printer_columns_are_phase_ready_version_replicas_primary_age() {
    let crd = crd_json();
    let columns: Vec<(String, String, String)> = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .expect("printer columns are set")
        .iter()
        .map(|column| {
            (
                column["name"].as_str().unwrap().to_string(),
                column["type"].as_str().unwrap().to_string(),
                column["jsonPath"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("Phase", "string", ".status.phase"),
        ("Ready", "string", ".status.conditions[?(@.type==\"Ready\")].status"),
        ("Version", "string", ".status.currentVersion"),
        ("Replicas", "integer", ".spec.replicas"),
        ("Primary", "string", ".status.currentPrimary"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    .map(|(name, kind, path)| (name.to_string(), kind.to_string(), path.to_string()));
    assert_eq!(columns, expected);
}

fn spec_schema(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
}

fn rules(validations: &Value) -> Vec<String> {
    validations
        .as_array()
        .map(|items| items.iter().map(|item| item["rule"].as_str().unwrap_or_default().to_string()).collect())
        .unwrap_or_default()
}

/// Without the webhooks, these CEL rules still keep storage from shrinking and names immutable.
#[test]
fn crd_carries_cel_rules_on_storage_size_database_name_and_username() {
    let crd = crd_json();
    let properties = &spec_schema(&crd)["properties"];
    let storage = rules(&properties["storageSize"]["x-kubernetes-validations"]);
    assert_eq!(storage.len(), 1, "{storage:?}");
    // The comparison is guarded by isQuantity so that a malformed value reaches the webhook's message.
    assert!(storage[0].contains("quantity(self).compareTo(quantity(oldSelf)) >= 0"), "{storage:?}");
    assert!(storage[0].starts_with("!isQuantity(self) || !isQuantity(oldSelf) ||"), "{storage:?}");
    for field in ["databaseName", "username"] {
        assert_eq!(
            rules(&properties[field]["x-kubernetes-validations"]),
            vec!["self == oldSelf".to_string()],
            "{field} must be immutable by CEL"
        );
    }
    let spec_rules = rules(&spec_schema(&crd)["x-kubernetes-validations"]);
    assert!(spec_rules.iter().any(|rule| rule.contains("storageClassName")), "storageClassName rule: {spec_rules:?}");
    assert!(spec_rules.iter().any(|rule| rule.contains("self.version.split('.')[0]")), "major rule: {spec_rules:?}");
}

#[test]
fn crd_schema_defaults_and_ranges_match_the_api() {
    let crd = crd_json();
    let spec = spec_schema(&crd);
    let properties = &spec["properties"];
    assert_eq!(properties["replicas"]["default"], 1);
    // schemars writes the range as floats (minimum: 1.0), which the apiserver accepts for integers.
    assert_eq!(properties["replicas"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(properties["replicas"]["maximum"].as_f64(), Some(5.0));
    assert_eq!(properties["deletionPolicy"]["default"], "Retain");
    assert_eq!(properties["deletionPolicy"]["enum"], serde_json::json!(["Retain", "Delete"]));
    let mut required: Vec<&str> =
        spec["required"].as_array().unwrap().iter().map(|value| value.as_str().unwrap()).collect();
    required.sort_unstable();
    assert_eq!(required, vec!["databaseName", "storageSize", "username", "version"]);
}

/// The operator's own YAML writer (src/api/yaml.rs) says exactly what the CRD types hold, read back
/// by a YAML parser.
#[test]
fn crd_yaml_reads_back_as_the_crd() {
    use dbservice_operator::api::database_service_backup as backup;
    let read = |text: String| serde_saphyr::from_str::<Value>(&text).unwrap();
    assert_eq!(read(crd_spec_yaml()), serde_json::to_value(custom_resource_definition().spec).unwrap());
    assert_eq!(
        read(dbservice_operator::api::crd::crd_yaml()),
        serde_json::to_value(custom_resource_definition()).unwrap()
    );
    assert_eq!(read(backup::crd_spec_yaml()), serde_json::to_value(backup::custom_resource_definition().spec).unwrap());
}

/// The apiserver rejects a structural schema holding nulls; the generator strips them.
#[test]
fn crd_spec_yaml_holds_no_null() {
    let spec: Value = serde_saphyr::from_str(&crd_spec_yaml()).unwrap();
    fn find_null(value: &Value, path: &str) -> Option<String> {
        match value {
            Value::Null => Some(path.to_string()),
            Value::Object(map) => map.iter().find_map(|(key, child)| find_null(child, &format!("{path}.{key}"))),
            Value::Array(items) => {
                items.iter().enumerate().find_map(|(index, child)| find_null(child, &format!("{path}[{index}]")))
            }
            _ => None,
        }
    }
    assert_eq!(find_null(&spec, "spec"), None);
}

/// Schema errors come before the validating webhook: a `pattern` on these fields would replace
/// the webhook's explanation with a bare regex. Only length caps (cheap CEL cost estimates).
#[test]
fn crd_leaves_field_syntax_to_the_webhook_and_caps_lengths() {
    let crd = crd_json();
    let properties = &spec_schema(&crd)["properties"];
    for field in ["version", "storageSize", "databaseName", "username", "image"] {
        assert!(properties[field].get("pattern").is_none(), "{field} has a schema pattern: {}", properties[field]);
    }
    assert_eq!(properties["version"]["maxLength"], 16);
    assert_eq!(properties["storageSize"]["maxLength"], 32);
    for field in ["databaseName", "username"] {
        assert_eq!(properties[field]["maxLength"], 63, "{field}");
        assert_eq!(properties[field]["minLength"], 1, "{field}");
    }
}

const CHART_BACKUP_CRD_SPEC: &str = "charts/dbservice-operator/files/backup-crd-spec.yaml";

/// The backup CRD in the chart is generated too, and `make crd` regenerates it.
#[test]
fn chart_backup_crd_spec_is_generated_from_the_rust_types() {
    use dbservice_operator::api::database_service_backup::crd_spec_yaml as backup_crd_spec_yaml;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(CHART_BACKUP_CRD_SPEC);
    let in_chart = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {CHART_BACKUP_CRD_SPEC} ({error}); run `make crd`"));
    assert!(
        in_chart == backup_crd_spec_yaml(),
        "{CHART_BACKUP_CRD_SPEC} is out of date with src/api/database_service_backup.rs; regenerate it with `make crd`"
    );
    let makefile = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Makefile")).unwrap();
    assert!(
        makefile.contains("crd --spec-only --kind backup > $(BACKUP_CRD_FILE)"),
        "`make crd` does not write the backup CRD"
    );
    assert!(makefile.contains(&format!("BACKUP_CRD_FILE := {CHART_BACKUP_CRD_SPEC}")));
}

/// Names, scope, status subresource, printer columns, the immutable spec and the size caps of
/// the backup CRD.
#[test]
fn backup_crd_names_status_columns_and_rules() {
    use dbservice_operator::api::database_service_backup::custom_resource_definition;
    let crd = serde_json::to_value(custom_resource_definition()).unwrap();
    assert_eq!(crd["metadata"]["name"], "databaseservicebackups.dbservice.dev");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["names"]["kind"], "DatabaseServiceBackup");
    assert_eq!(crd["spec"]["names"]["shortNames"], serde_json::json!(["dbsbackup"]));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1");
    assert_eq!(version["subresources"]["status"], serde_json::json!({}));
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|column| column["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Database", "Phase", "Backup", "Age"]);
    let schema = &version["schema"]["openAPIV3Schema"]["properties"];
    assert_eq!(rules(&schema["spec"]["x-kubernetes-validations"]), vec!["self == oldSelf".to_string()]);
    assert_eq!(schema["spec"]["required"], serde_json::json!(["databaseService"]));
    assert_eq!(schema["spec"]["properties"]["target"]["enum"], serde_json::json!(["standby", "primary"]));
    assert_eq!(
        schema["status"]["properties"]["phase"]["enum"],
        serde_json::json!(["Pending", "Running", "Completed", "Failed"])
    );
    for field in ["backupId", "beginWal", "endWal", "beginLsn", "endLsn", "startTime", "endTime", "message", "jobName"]
    {
        assert!(schema["status"]["properties"][field]["maxLength"].is_number(), "status.{field} is uncapped");
    }
    for field in ["timeline", "postgresMajorVersion", "sizeBytes"] {
        assert_eq!(schema["status"]["properties"][field]["type"], "integer", "status.{field}");
    }
}

/// The manual's API reference pages are rendered from the same CRDs (written once, in the types).
#[test]
fn the_manuals_api_reference_is_generated_from_the_rust_types() {
    use dbservice_operator::api::{database_service_backup, reference};
    for (page, definition) in [
        ("docs/manual/src/reference/api.md", custom_resource_definition()),
        ("docs/manual/src/reference/backup-api.md", database_service_backup::custom_resource_definition()),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(page);
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            written == reference::markdown(&definition),
            "{page} is out of date with the Rust types; regenerate it with `make crd`"
        );
    }
}
