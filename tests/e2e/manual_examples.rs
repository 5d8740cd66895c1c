//! Every YAML example of the manual and the README is admitted by the real apiserver and the
//! operator's webhook (server-side dry-run: validated, defaulted, nothing stored). A whole object is
//! tried as written (in a namespace of the test); a `spec:` fragment is tried merged into the
//! getting-started DatabaseService. An example the API or the webhook would refuse fails here, with
//! the file and the refusal.

use crate::support::operator::shared;
use crate::support::{admin_kubeconfig, client_for, cluster_or_skip, repository, tool, TestNamespace};
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};

/// The `yaml` blocks of every page of the manual and of the README: (file, block).
fn yaml_examples() -> Vec<(String, String)> {
    let root = repository();
    let mut pages = vec![root.join("README.md")];
    let mut directories = vec![root.join("docs/manual/src")];
    while let Some(directory) = directories.pop() {
        for entry in std::fs::read_dir(&directory).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                directories.push(path);
            } else if path.extension().is_some_and(|extension| extension == "md") {
                pages.push(path);
            }
        }
    }
    let block = regex::Regex::new(r"(?s)```ya?ml\n(.*?)```").unwrap();
    let mut examples = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(&root).unwrap().display().to_string();
        for found in block.captures_iter(&text) {
            examples.push((name.clone(), found[1].to_string()));
        }
    }
    examples
}

/// Merges `patch` into `base` as a JSON merge patch does (objects key by key, the rest replaced).
fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                merge(base.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
        (base, patch) => *base = patch.clone(),
    }
}

/// The objects to try for one example: its documents as written, or a fragment merged into the
/// getting-started DatabaseService.
fn objects_of(example: &str) -> Vec<Value> {
    let mut objects = Vec::new();
    for document in example.split("\n---\n").filter(|document| !document.trim().is_empty()) {
        let value: Value = serde_saphyr::from_str(document).expect("the example is YAML");
        if value.get("apiVersion").is_some() && value.get("kind").is_some() {
            objects.push(value);
        } else {
            let mut database = json!({
                "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService", "metadata": {"name": "example"},
                "spec": {"version": "16.4", "storageSize": "1Gi", "databaseName": "app", "username": "app_user"}
            });
            merge(&mut database, &value);
            objects.push(database);
        }
    }
    objects
}

/// `kubectl apply --dry-run=server` of `object` in `namespace`: Err with kubectl's message.
fn dry_run(namespace: &str, object: &Value) -> Result<(), String> {
    let mut child = Command::new(tool("kubectl"))
        .args(["apply", "--dry-run=server", "-n", namespace, "-f", "-"])
        .env("KUBECONFIG", admin_kubeconfig().expect("cluster"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child.stdin.take().unwrap().write_all(object.to_string().as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).to_string())
    }
}

#[tokio::test]
async fn every_yaml_example_of_the_manual_and_the_readme_is_admitted() {
    let Some(kubeconfig) = cluster_or_skip("every_yaml_example_of_the_manual_and_the_readme_is_admitted") else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "examples").await;
    let examples = yaml_examples();
    let mut tried = 0;
    let mut refused = Vec::new();
    for (page, example) in &examples {
        // mdBook's include of the chart's values: `helm lint` and charts/check.sh read that file.
        if example.contains("{{#include") {
            continue;
        }
        for mut object in objects_of(example) {
            // The test's namespace, whatever the example says.
            if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                metadata.remove("namespace");
            }
            tried += 1;
            if let Err(message) = dry_run(&namespace.name, &object) {
                refused.push(format!("{page}: {} {}: {message}", object["kind"], object["metadata"]["name"]));
            }
        }
    }
    assert!(tried >= 12, "only {tried} objects found in {} examples: the extraction broke", examples.len());
    assert!(refused.is_empty(), "examples refused:\n{}", refused.join("\n"));
}
