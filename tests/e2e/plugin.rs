//! The `kubectl dbservice` verbs against the real apiserver: each writes what its documented
//! annotation or object is, refuses what does not apply with a message naming it, and the report
//! bundles a database without any value of its Secrets.

use crate::controller::wait_for_phase;
use crate::support::operator::shared;
use crate::support::{client_for, cluster_or_skip, sample_database, TestNamespace};
use dbservice_operator::api::database_service::{DatabaseService, Phase};
use dbservice_operator::api::failover::{
    FENCED_ANNOTATION, RELOAD_ANNOTATION, RESTART_ANNOTATION, SWITCHOVER_ANNOTATION,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

fn verb(kubeconfig: &Path, arguments: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_dbservice-operator"))
        .args(arguments)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("the binary runs")
}

fn succeeded(output: &Output) -> String {
    assert!(output.status.success(), "failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn failed(output: &Output) -> String {
    assert!(!output.status.success(), "should have failed: {}", String::from_utf8_lossy(&output.stdout));
    String::from_utf8_lossy(&output.stderr).to_string()
}

fn annotation(database: &DatabaseService, key: &str) -> Option<String> {
    database.metadata.annotations.as_ref()?.get(key).cloned()
}

#[tokio::test]
async fn the_verbs_write_their_annotations_and_objects_and_refuse_what_does_not_apply() {
    let Some(kubeconfig) = cluster_or_skip("the_verbs_write_their_annotations_and_objects") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "plugin").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = sample_database("orders");
    database.spec.replicas = Some(2);
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_for_phase(&databases, "orders", Phase::Running, Duration::from_secs(120)).await;
    // Paused from here: the operator acts on nothing, so what the verbs wrote stays to be read
    // (what the operator does with each annotation is tested with it elsewhere).
    let pause = Patch::Merge(serde_json::json!({"spec": {"paused": true}}));
    databases.patch("orders", &PatchParams::default(), &pause).await.unwrap();

    let data = succeeded(&verb(&kubeconfig, &["status", "orders", "-n", ns, "-o", "json"]));
    let document: serde_json::Value = serde_json::from_str(&data).expect("status -o json is JSON");
    assert_eq!((document["name"].as_str(), document["spec"]["paused"].as_bool()), (Some("orders"), Some(true)));
    assert_eq!(document["status"]["currentPrimary"], "orders-0", "{document}");
    let yaml = succeeded(&verb(&kubeconfig, &["status", "orders", "-n", ns, "-o", "yaml"]));
    assert!(yaml.contains("currentPrimary: orders-0"), "{yaml}");

    let printed = succeeded(&verb(&kubeconfig, &["switchover", "orders", "1", "-n", ns]));
    assert!(printed.contains("switchover of") && printed.contains("orders-1"), "{printed}");
    let stored = databases.get("orders").await.unwrap();
    assert_eq!(annotation(&stored, SWITCHOVER_ANNOTATION).as_deref(), Some("orders-1"));
    let refused = failed(&verb(&kubeconfig, &["promote", "orders", "orders-0", "-n", ns]));
    assert!(refused.contains("orders-0 is already the primary"), "{refused}");
    let refused = failed(&verb(&kubeconfig, &["switchover", "orders", "orders-7", "-n", ns]));
    assert!(refused.contains("orders-7 is not an instance of DatabaseService orders"), "{refused}");

    succeeded(&verb(&kubeconfig, &["fence", "orders", "orders-1", "-n", ns]));
    succeeded(&verb(&kubeconfig, &["fence", "orders", "0", "-n", ns]));
    let stored = databases.get("orders").await.unwrap();
    assert_eq!(annotation(&stored, FENCED_ANNOTATION).as_deref(), Some("orders-1,orders-0"));
    succeeded(&verb(&kubeconfig, &["unfence", "orders", "orders-1", "-n", ns]));
    succeeded(&verb(&kubeconfig, &["unfence", "orders", "orders-0", "-n", ns]));
    let stored = databases.get("orders").await.unwrap();
    assert_eq!(annotation(&stored, FENCED_ANNOTATION), None, "the annotation goes with the last instance");

    let refused = failed(&verb(&kubeconfig, &["backup-now", "orders", "-n", ns]));
    assert!(refused.contains("has no spec.backup"), "{refused}");

    // restart and reload write their annotation with the time; a new call writes a new value.
    for (name, key) in [("restart", RESTART_ANNOTATION), ("reload", RELOAD_ANNOTATION)] {
        let printed = succeeded(&verb(&kubeconfig, &[name, "orders", "-n", ns]));
        assert!(printed.contains("requested"), "{printed}");
        let first = annotation(&databases.get("orders").await.unwrap(), key).expect("the annotation");
        assert!(chrono::DateTime::parse_from_rfc3339(&first).is_ok(), "{key}: {first}");
        succeeded(&verb(&kubeconfig, &[name, "orders", "-n", ns]));
        assert_ne!(annotation(&databases.get("orders").await.unwrap(), key), Some(first), "asked again");
    }
    // hibernate and wake set spec.hibernated; the verbs that need instances refuse meanwhile.
    succeeded(&verb(&kubeconfig, &["hibernate", "orders", "-n", ns]));
    assert_eq!(databases.get("orders").await.unwrap().spec.hibernated, Some(true));
    let refused = failed(&verb(&kubeconfig, &["restart", "orders", "-n", ns]));
    assert!(refused.contains("DatabaseService orders is hibernated"), "{refused}");
    succeeded(&verb(&kubeconfig, &["wake", "orders", "-n", ns]));
    assert_eq!(databases.get("orders").await.unwrap().spec.hibernated, Some(false));
    let missing = failed(&verb(&kubeconfig, &["fence", "no-such-database", "0", "-n", ns]));
    assert!(missing.contains(&format!("no DatabaseService \"no-such-database\" in namespace \"{ns}\"")), "{missing}");

    // Without -n, the kubeconfig context's namespace, as kubectl.
    let directory = tempfile::tempdir().unwrap();
    let contextual = directory.path().join("kubeconfig");
    std::fs::copy(&kubeconfig, &contextual).unwrap();
    let set = std::process::Command::new(crate::support::tool("kubectl"))
        .args(["config", "set-context", "--current", "--namespace", ns])
        .env("KUBECONFIG", &contextual)
        .output()
        .unwrap();
    succeeded(&set);
    let ledger = succeeded(&verb(&contextual, &["ledger", "orders", "-o", "json"]));
    let ledger: serde_json::Value = serde_json::from_str(&ledger).expect("ledger -o json is JSON");
    assert_eq!(ledger["entries"][0]["action"], "Created", "{ledger}");
    let shown = succeeded(&verb(&contextual, &["status", "orders", "-o", "json"]));
    assert!(shown.contains("\"currentPrimary\""), "found in the context's namespace: {shown}");

    // The plugin is the same binary installed as kubectl-dbservice.
    let plugins = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_dbservice-operator"), plugins.path().join("kubectl-dbservice"))
        .unwrap();
    let path = format!("{}:{}", plugins.path().display(), std::env::var("PATH").unwrap_or_default());
    let output = std::process::Command::new(crate::support::tool("kubectl"))
        .args(["dbservice", "fence", "orders", "1", "-n", ns])
        .env("KUBECONFIG", &kubeconfig)
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(succeeded(&output).contains("orders-1 fenced"));
    let completion = succeeded(&verb(&kubeconfig, &["completion", "bash"]));
    assert!(completion.contains("switchover") && completion.contains("kubectl-dbservice"), "completes the verbs");
}

#[tokio::test]
async fn the_report_bundles_a_database_and_no_value_of_its_secrets() {
    let Some(kubeconfig) = cluster_or_skip("the_report_bundles_a_database_and_no_value_of_its_secrets") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "report").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    databases.create(&PostParams::default(), &sample_database("orders")).await.unwrap();
    wait_for_phase(&databases, "orders", Phase::Running, Duration::from_secs(120)).await;
    let bundle_file = tempfile::NamedTempFile::new().unwrap();
    let bundle_path = bundle_file.path().to_str().unwrap();
    succeeded(&verb(&kubeconfig, &["report", "orders", "-n", ns, "-o", bundle_path]));
    let bundle = std::fs::read_to_string(bundle_path).unwrap();
    for section in [
        "==== DatabaseService",
        "==== Secrets (values redacted)",
        "==== Events",
        "==== Ledger",
        "==== Objects",
        "==== Instance logs",
        "==== Operator logs",
    ] {
        assert!(bundle.contains(section), "{section} missing from the bundle");
    }
    assert!(bundle.contains("Secret orders-credentials") && bundle.contains("password: <redacted>"), "keys are named");
    assert!(bundle.contains("--- # StatefulSet orders") && bundle.contains("--- # Pod orders-0"), "children are in it");
    // No secret value of the database's Secrets appears anywhere (names, hosts and public
    // certificates are not secrets: the report keeps mentioning them).
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let list = secrets.list(&Default::default()).await.unwrap();
    let mut checked = 0;
    for secret in list
        .items
        .iter()
        .filter(|secret| secret.metadata.name.as_deref().is_some_and(|name| name.starts_with("orders")))
    {
        for (key, value) in secret.data.iter().flatten() {
            let text = String::from_utf8_lossy(&value.0);
            let public = ["username", "user", "database", "dbname", "host", "port", "ca.crt", "tls.crt"];
            if text.len() >= 16 && !public.contains(&key.as_str()) {
                assert!(
                    !bundle.contains(text.as_ref()),
                    "the value of {key} in {:?} is in the bundle",
                    secret.metadata.name
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 2, "the password and the uri at least were checked ({checked})");
    let missing = failed(&verb(&kubeconfig, &["report", "nothing-here", "-n", ns]));
    assert!(missing.contains("no DatabaseService \"nothing-here\""), "{missing}");
}
