//! Table-driven tests of `validation::validate`: every case lives in
//! `tests/fixtures/validation/*.yaml` (one case or a list of cases per file).
//!
//! A case names the exact error strings, in order, and one substring per expected warning, in
//! order; a warning that no case expects is a failure too, so a fixture cannot pass by accident.

#[path = "support/fixtures.rs"]
mod fixtures;

use chrono::NaiveDate;
use dbservice_operator::admission::validation::{validate, ValidationSettings};
use dbservice_operator::api::database_service::DatabaseService;
use serde::Deserialize;

/// The date every case is judged on unless it sets `today`: 13 and 14 are past their end of life.
const FIXED_TODAY: &str = "2026-11-30";
/// The operator's default `--min-storage-size`.
const MIN_STORAGE_SIZE: &str = "1Gi";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    description: String,
    object: DatabaseService,
    #[serde(default)]
    old: Option<DatabaseService>,
    /// Exact messages (`FieldError` Display), in the order `validate` reports them.
    errors: Vec<String>,
    /// One substring per warning, in order.
    warnings: Vec<String>,
    /// Overrides [`FIXED_TODAY`] (for end-of-life boundaries).
    #[serde(default)]
    today: Option<NaiveDate>,
}

fn load_cases() -> Vec<(String, Case)> {
    fixtures::load_cases("validation")
}

fn settings(today: NaiveDate) -> ValidationSettings {
    ValidationSettings { today, ..ValidationSettings::new(MIN_STORAGE_SIZE).expect("1Gi is a quantity") }
}

/// What is wrong with the outcome of one case, or None when it matches.
fn check(case: &Case) -> Option<String> {
    let today = case.today.unwrap_or_else(|| FIXED_TODAY.parse().expect("fixed date parses"));
    let outcome = validate(&case.object, case.old.as_ref(), &settings(today));
    let errors: Vec<String> = outcome.errors.iter().map(ToString::to_string).collect();
    let mut problems = Vec::new();
    if errors != case.errors {
        problems.push(format!("errors differ\n  expected: {:#?}\n  actual:   {:#?}", case.errors, errors));
    }
    let warnings_match = outcome.warnings.len() == case.warnings.len()
        && outcome.warnings.iter().zip(&case.warnings).all(|(warning, expected)| warning.contains(expected.as_str()));
    if !warnings_match {
        problems.push(format!(
            "warnings differ (one substring per warning, in order)\n  expected: {:#?}\n  actual:   {:#?}",
            case.warnings, outcome.warnings
        ));
    }
    if outcome.is_allowed() != case.errors.is_empty() {
        problems.push(format!("is_allowed() is {} with errors {:?}", outcome.is_allowed(), errors));
    }
    (!problems.is_empty()).then(|| problems.join("\n"))
}

#[test]
fn every_validation_fixture_gives_its_expected_errors_and_warnings() {
    fixtures::assert_cases("validation", &load_cases(), |case| &case.description, check);
}

/// Guards the table itself: a duplicated description makes a failure report ambiguous.
#[test]
fn validation_fixture_descriptions_are_unique() {
    fixtures::assert_unique_descriptions(&load_cases(), |case| &case.description);
}

/// The denial message joins every field error with ", " (as Kubernetes does), in order.
#[test]
fn message_joins_every_error_in_order() {
    let object: DatabaseService = serde_saphyr::from_str(
        r#"
apiVersion: dbservice.dev/v1
kind: DatabaseService
metadata: {name: orders}
spec: {version: "12", storageSize: 10Gi, databaseName: app, username: postgres}
"#,
    )
    .unwrap();
    let outcome = validate(&object, None, &settings(FIXED_TODAY.parse().unwrap()));
    assert_eq!(
        outcome.message(),
        "spec.version: Unsupported value: \"12\": supported major versions are 14 to 18, \
         spec.username: Forbidden: \"postgres\" is reserved: \"postgres\" and names starting with \"pg_\" belong to PostgreSQL, \"replicator\" to replication"
    );
}

/// The minimum storage size comes from the operator's flag, and the message quotes the flag.
#[test]
fn minimum_storage_size_follows_the_settings() {
    let object: DatabaseService = serde_saphyr::from_str(
        r#"
apiVersion: dbservice.dev/v1
kind: DatabaseService
metadata: {name: orders}
spec: {version: "16", storageSize: 5Gi, databaseName: app, username: app_user}
"#,
    )
    .unwrap();
    let strict = ValidationSettings { today: FIXED_TODAY.parse().unwrap(), ..ValidationSettings::new("10Gi").unwrap() };
    let errors: Vec<String> = validate(&object, None, &strict).errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors, vec!["spec.storageSize: Invalid value: \"5Gi\": must be at least 10Gi".to_string()]);
    assert!(validate(&object, None, &settings(FIXED_TODAY.parse().unwrap())).is_allowed());
}
