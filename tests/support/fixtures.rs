//! Loading YAML fixture cases shared by the fixture-driven tests: every `*.yaml` file of a
//! directory under tests/fixtures, each holding one case or a list of cases.

use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// Every case of every fixture file in tests/fixtures/`directory`, labelled "file #index".
pub fn load_cases<Case: DeserializeOwned>(directory: &str) -> Vec<(String, Case)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(directory);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .map(|entry| entry.expect("directory entry is readable").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "yaml"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&file).unwrap_or_else(|error| panic!("{name}: {error}"));
        let document: serde_json::Value =
            serde_saphyr::from_str(&text).unwrap_or_else(|error| panic!("{name}: not YAML: {error}"));
        let items = match document {
            serde_json::Value::Array(items) => items,
            single => vec![single],
        };
        assert!(!items.is_empty(), "{name} holds no case");
        for (index, item) in items.into_iter().enumerate() {
            let case: Case = serde_json::from_value(item)
                .unwrap_or_else(|error| panic!("{name} case #{index}: not a {directory} case: {error}"));
            cases.push((format!("{name} #{index}"), case));
        }
    }
    cases
}

/// Runs `check` on every case (None means it passed) and fails once, listing every failing case
/// with its location and description, so one run shows all that is wrong.
pub fn assert_cases<Case>(
    kind: &str,
    cases: &[(String, Case)],
    describe: impl Fn(&Case) -> &str,
    check: impl Fn(&Case) -> Option<String>,
) {
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(location, case)| {
            check(case).map(|problem| format!("FAILED [{location}] {}\n{problem}", describe(case)))
        })
        .collect();
    for failure in &failures {
        eprintln!("{failure}\n");
    }
    assert!(
        failures.is_empty(),
        "{} of {} {kind} cases failed:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// Fails when two cases share a description: a duplicate makes a failure report ambiguous.
pub fn assert_unique_descriptions<Case>(cases: &[(String, Case)], describe: impl Fn(&Case) -> &str) {
    let mut seen = std::collections::HashSet::new();
    for (location, case) in cases {
        assert!(seen.insert(describe(case).to_string()), "[{location}] duplicate description {:?}", describe(case));
    }
}
