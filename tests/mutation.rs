//! Table-driven tests of `mutation::default_patch`: the cases live in
//! `tests/fixtures/mutation/*.yaml` (one case or a list of cases per file).
//!
//! Besides the exact expected patch, every case checks idempotency: the apiserver may call a
//! mutating webhook again on its own output (reinvocationPolicy), and a second pass must add nothing.

#[path = "support/fixtures.rs"]
mod fixtures;

use dbservice_operator::admission::mutation::default_patch;
use dbservice_operator::api::database_service::DatabaseService;
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    description: String,
    object: DatabaseService,
    #[serde(default)]
    old: Option<DatabaseService>,
    /// The exact JSONPatch operations; an empty list means `default_patch` returns None.
    patch: Vec<Value>,
}

fn load_cases() -> Vec<(String, Case)> {
    fixtures::load_cases("mutation")
}

/// The operations of a patch as plain JSON, for comparison with the fixture.
fn operations(patch: &json_patch::Patch) -> Vec<Value> {
    match serde_json::to_value(patch).expect("patches serialize") {
        Value::Array(operations) => operations,
        other => panic!("a JSONPatch serializes to an array, got {other}"),
    }
}

fn check(case: &Case) -> Option<String> {
    let patch = default_patch(&case.object, case.old.as_ref());
    let actual = patch.as_ref().map(operations).unwrap_or_default();
    if actual != case.patch {
        return Some(format!(
            "patch differs\n  expected: {}\n  actual:   {}",
            serde_json::to_string_pretty(&case.patch).unwrap(),
            serde_json::to_string_pretty(&actual).unwrap()
        ));
    }
    // No patch (as expected): nothing left to check.
    let patch = patch?;
    if patch.0.is_empty() {
        return Some("Some(empty patch) returned: an empty patch must be None".into());
    }
    // Apply the patch as the apiserver would, then mutate again: nothing more may be added.
    let mut document = serde_json::to_value(&case.object).expect("the object serializes");
    if let Err(error) = json_patch::patch(&mut document, &patch) {
        return Some(format!("the patch does not apply to the object: {error}"));
    }
    let patched: DatabaseService = match serde_json::from_value(document) {
        Ok(patched) => patched,
        Err(error) => return Some(format!("the patched object is no longer a DatabaseService: {error}")),
    };
    default_patch(&patched, case.old.as_ref()).map(|second| {
        format!(
            "not idempotent: a second pass over the patched object gives {}",
            serde_json::to_string(&second).unwrap()
        )
    })
}

#[test]
fn every_mutation_fixture_gives_its_expected_patch_and_is_idempotent() {
    fixtures::assert_cases("mutation", &load_cases(), |case| &case.description, check);
}

#[test]
fn mutation_fixture_descriptions_are_unique() {
    fixtures::assert_unique_descriptions(&load_cases(), |case| &case.description);
}

/// The patched object carries exactly the defaults the rest of the operator assumes.
#[test]
fn patched_minimal_object_has_every_default() {
    let object: DatabaseService = serde_saphyr::from_str(
        r#"
apiVersion: dbservice.dev/v1
kind: DatabaseService
metadata: {name: orders, namespace: shop, finalizers: [example.com/backup]}
spec: {version: "18.1", storageSize: 10Gi, databaseName: app, username: app_user}
"#,
    )
    .unwrap();
    let patch = default_patch(&object, None).expect("a minimal object needs defaults");
    let mut document = serde_json::to_value(&object).unwrap();
    json_patch::patch(&mut document, &patch).unwrap();
    let patched: DatabaseService = serde_json::from_value(document).unwrap();
    assert_eq!(patched.spec.replicas, Some(1));
    assert_eq!(patched.spec.deletion_policy, Some(dbservice_operator::api::database_service::DeletionPolicy::Retain));
    assert_eq!(patched.spec.image.as_deref(), Some("postgres:18.1"));
    assert_eq!(
        patched.metadata.finalizers,
        Some(vec!["example.com/backup".to_string(), dbservice_operator::api::database_service::FINALIZER.to_string()])
    );
    // The rest of the spec is untouched.
    assert_eq!(
        (patched.spec.version.as_str(), patched.spec.storage_size.as_str(), patched.spec.username.as_str()),
        ("18.1", "10Gi", "app_user")
    );
}
