//! The controller against the real control plane: children, status, events, self-healing,
//! rollback and deletion policies.

use crate::support::operator::shared;
use crate::support::{client_for, cluster_or_skip, eventually, sample_database, TestNamespace};
use dbservice_operator::api::database_service::{DatabaseService, DeletionPolicy, Phase};
use dbservice_operator::operator::ledger::LedgerEntry;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use std::time::Duration;

/// Image that the kwok stages of tests/cluster/stages make crash-loop.
pub const CRASHING_IMAGE_REPOSITORY: &str = "dbservice.test/crashloop";

pub async fn wait_for_phase(
    api: &Api<DatabaseService>,
    name: &str,
    phase: Phase,
    timeout: Duration,
) -> DatabaseService {
    eventually(&format!("{name} in phase {phase}"), timeout, || async {
        let database = api.get(name).await.ok()?;
        (database.status.as_ref()?.phase == Some(phase)).then_some(database)
    })
    .await
}

pub fn condition<'a>(
    database: &'a DatabaseService,
    kind: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    database.status.as_ref()?.conditions.iter().find(|condition| condition.type_ == kind)
}

pub use crate::support::ledger_entries;

/// Waits until the ledger of `name` has an entry with `action` (it is written right after the status).
pub async fn wait_for_ledger(client: &Client, namespace: &str, name: &str, action: &str) -> Vec<LedgerEntry> {
    eventually(&format!("ledger entry {action} for {name}"), Duration::from_secs(30), || async {
        let entries = ledger_entries(client, namespace, name).await;
        entries.iter().any(|entry| entry.action == action).then_some(entries)
    })
    .await
}

pub async fn event_reasons(client: &Client, namespace: &str, name: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    events
        .list(&ListParams::default())
        .await
        .map(|list| list.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|event| event.regarding.as_ref().and_then(|regarding| regarding.name.as_deref()) == Some(name))
        .filter_map(|event| event.reason)
        .collect()
}

pub async fn wait_for_event(client: &Client, namespace: &str, name: &str, reason: &str) {
    eventually(&format!("event {reason} on {name}"), Duration::from_secs(60), || async {
        event_reasons(client, namespace, name).await.iter().any(|found| found == reason).then_some(())
    })
    .await;
}

#[tokio::test]
async fn children_are_created_and_the_database_becomes_ready() {
    let Some(kubeconfig) = cluster_or_skip("children_are_created_and_the_database_becomes_ready") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "ready").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = sample_database("orders");
    database.spec.replicas = Some(2);
    api.create(&PostParams::default(), &database).await.unwrap();
    let ready = wait_for_phase(&api, "orders", Phase::Running, Duration::from_secs(120)).await;
    let status = ready.status.clone().unwrap();
    assert_eq!(status.ready_replicas, 2);
    assert_eq!(status.current_version.as_deref(), Some("16.4"));
    assert_eq!(status.last_stable_version.as_deref(), Some("16.4"));
    assert_eq!(status.observed_generation, ready.metadata.generation);
    for kind in ["Ready", "StorageReady", "CredentialsReady"] {
        assert_eq!(
            condition(&ready, kind).map(|condition| condition.status.as_str()),
            Some("True"),
            "{kind} in {:?}",
            status.conditions
        );
    }

    let secret: Secret = Api::namespaced(client.clone(), ns).get("orders-credentials").await.unwrap();
    let data = secret.data.unwrap();
    for key in ["username", "password", "database", "host", "port", "uri"] {
        assert!(data.contains_key(key), "credentials lack {key}");
    }
    assert!(data["password"].0.len() >= 22, "password shorter than 128 bits of base64");
    assert_eq!(String::from_utf8_lossy(&data["username"].0), "app_user");

    let stateful_set: StatefulSet = Api::namespaced(client.clone(), ns).get("orders").await.unwrap();
    assert_eq!(stateful_set.spec.replicas, Some(2));
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    for service in ["orders", "orders-replicas", "orders-headless"] {
        services.get(service).await.unwrap_or_else(|error| panic!("service {service}: {error}"));
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually("role labels on pods", Duration::from_secs(30), || async {
        let primary = pods.get("orders-0").await.ok()?;
        let standby = pods.get("orders-1").await.ok()?;
        let role = |pod: &Pod| pod.metadata.labels.clone().unwrap_or_default().get("dbservice.dev/role").cloned();
        (role(&primary).as_deref() == Some("primary") && role(&standby).as_deref() == Some("standby")).then_some(())
    })
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let owned = eventually("PVCs owned by the DatabaseService", Duration::from_secs(30), || async {
        let list = claims.list(&ListParams::default().labels("app.kubernetes.io/instance=orders")).await.ok()?;
        let uid = ready.metadata.uid.clone()?;
        (list.items.len() == 2
            && list.items.iter().all(|claim| {
                claim.metadata.owner_references.clone().unwrap_or_default().iter().any(|reference| reference.uid == uid)
            }))
        .then_some(list.items.len())
    })
    .await;
    assert_eq!(owned, 2);

    let entries = wait_for_ledger(&client, ns, "orders", "Ready").await;
    let actions: Vec<&str> = entries.iter().map(|entry| entry.action.as_str()).collect();
    assert!(actions.contains(&"Created") && actions.contains(&"Ready"), "ledger: {actions:?}");
    wait_for_event(&client, ns, "orders", "CredentialsCreated").await;
    wait_for_event(&client, ns, "orders", "Ready").await;

    // The ledger command prints the history and the status.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_dbservice-operator"))
        .args(["ledger", "orders", "-n", ns])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        printed.contains("phase: Running") && printed.contains("Created") && printed.contains("ACTION"),
        "{printed}"
    );
    assert!(
        !printed.contains(&String::from_utf8_lossy(&data["password"].0).to_string()),
        "the ledger must never show the password"
    );
    // The status view: the same object for people, the ledger's newest entries included.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_dbservice-operator"))
        .args(["status", "orders", "-n", ns])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for expected in [
        &format!("DatabaseService {ns}/orders"),
        "phase: Running",
        "ready: 2/2",
        "Instances",
        "Certificates",
        "Recent ledger",
        "Created",
    ] {
        assert!(printed.contains(expected), "{expected:?} missing from:\n{printed}");
    }
    assert!(
        !printed.contains(&String::from_utf8_lossy(&data["password"].0).to_string()),
        "the status view must never show the password"
    );
    // The same view as a kubectl plugin: the binary installed as `kubectl-dbservice` on PATH.
    let plugins = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_dbservice-operator"), plugins.path().join("kubectl-dbservice"))
        .unwrap();
    let path = format!("{}:{}", plugins.path().display(), std::env::var("PATH").unwrap_or_default());
    let output = std::process::Command::new(crate::support::tool("kubectl"))
        .args(["dbservice", "status", "orders", "-n", ns])
        .env("KUBECONFIG", &kubeconfig)
        .env("PATH", path)
        .output()
        .unwrap();
    let plugin_printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "kubectl dbservice: {}", String::from_utf8_lossy(&output.stderr));
    assert!(plugin_printed.contains(&format!("DatabaseService {ns}/orders")), "{plugin_printed}");
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_dbservice-operator"))
        .args(["status", "no-such-database", "-n", ns])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no DatabaseService \"no-such-database\""));
}

#[tokio::test]
async fn deleted_children_are_recreated_and_a_lost_secret_is_reported() {
    let Some(kubeconfig) = cluster_or_skip("deleted_children_are_recreated_and_a_lost_secret_is_reported") else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "recreate").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &sample_database("heal")).await.unwrap();
    wait_for_phase(&api, "heal", Phase::Running, Duration::from_secs(120)).await;
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let old_uid = services.get("heal").await.unwrap().metadata.uid;
    services.delete("heal", &DeleteParams::default()).await.unwrap();
    eventually("the primary Service recreated", Duration::from_secs(60), || async {
        let service = services.get_opt("heal").await.ok()??;
        (service.metadata.uid != old_uid).then_some(())
    })
    .await;
    wait_for_event(&client, ns, "heal", "Recreated").await;

    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let old_password = secrets.get("heal-credentials").await.unwrap().data.unwrap()["password"].clone();
    secrets.delete("heal-credentials", &DeleteParams::default()).await.unwrap();
    let recreated = eventually("the credentials recreated", Duration::from_secs(60), || async {
        secrets.get_opt("heal-credentials").await.ok()?
    })
    .await;
    assert_ne!(recreated.data.unwrap()["password"], old_password, "a new password is generated");
    let reported = eventually("CredentialsReady=False", Duration::from_secs(60), || async {
        let database = api.get("heal").await.ok()?;
        let condition = condition(&database, "CredentialsReady")?.clone();
        (condition.status == "False").then_some(condition)
    })
    .await;
    assert_eq!(reported.reason, "SecretRecreated");
    assert!(reported.message.contains("still has the old"), "{}", reported.message);
    wait_for_event(&client, ns, "heal", "CredentialsRecreated").await;
}

#[tokio::test]
async fn hand_edited_image_and_replicas_are_restored() {
    let Some(kubeconfig) = cluster_or_skip("hand_edited_image_and_replicas_are_restored") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "drift").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &sample_database("steady")).await.unwrap();
    wait_for_phase(&api, "steady", Phase::Running, Duration::from_secs(120)).await;
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let edit = serde_json::json!({"spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "postgres", "image": "postgres:15.1"}]}}}});
    stateful_sets.patch("steady", &PatchParams::default(), &Patch::Strategic(&edit)).await.unwrap();
    eventually("image and replicas restored", Duration::from_secs(60), || async {
        let stateful_set = stateful_sets.get("steady").await.ok()?;
        let spec = stateful_set.spec;
        let image = spec.template.spec?.containers.first()?.image.clone()?;
        (spec.replicas == Some(1) && image == "postgres:16.4").then_some(())
    })
    .await;
    // The ledger first: when it lacks the entry, the journal was lost, not only the event.
    eventually("DriftCorrected in the ledger", Duration::from_secs(60), || async {
        let entries = ledger_entries(&client, ns, "steady").await;
        entries
            .iter()
            .any(|entry| entry.action == "DriftCorrected" && entry.to.contains("StatefulSet/steady"))
            .then_some(())
    })
    .await;
    wait_for_event(&client, ns, "steady", "DriftCorrected").await;
}

#[tokio::test]
async fn crashing_pods_get_restarts_with_growing_backoff() {
    let Some(kubeconfig) = cluster_or_skip("crashing_pods_get_restarts_with_growing_backoff") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "crash").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = sample_database("flaky");
    database.spec.image = Some(format!("{CRASHING_IMAGE_REPOSITORY}:16.4"));
    api.create(&PostParams::default(), &database).await.unwrap();
    // Backoff starts at 10 s and doubles: restarts at t, t+20 s, t+60 s...
    let restarts = eventually("three restarts in the ledger", Duration::from_secs(150), || async {
        let restarts: Vec<LedgerEntry> = ledger_entries(&client, ns, "flaky")
            .await
            .into_iter()
            .filter(|entry| entry.action == "Restarted")
            .collect();
        (restarts.len() >= 3).then_some(restarts)
    })
    .await;
    let times: Vec<i64> =
        restarts.iter().map(|entry| chrono::DateTime::parse_from_rfc3339(&entry.time).unwrap().timestamp()).collect();
    let (first_gap, second_gap) = (times[1] - times[0], times[2] - times[1]);
    assert!(first_gap >= 19, "second restart after {first_gap}s, expected at least the 20 s backoff");
    assert!(
        second_gap >= 39 && second_gap > first_gap,
        "third restart after {second_gap}s, expected at least 40 s and a growing backoff"
    );
    let stateful_set: StatefulSet = Api::namespaced(client.clone(), ns).get("flaky").await.unwrap();
    let annotations = stateful_set.spec.template.metadata.unwrap().annotations.unwrap_or_default();
    assert!(annotations.contains_key("dbservice.dev/restartedAt"), "restart goes through the pod template annotation");
    wait_for_event(&client, ns, "flaky", "Restarted").await;
}

#[tokio::test]
async fn a_bad_minor_upgrade_rolls_back_and_leaves_the_spec_alone() {
    let Some(kubeconfig) = cluster_or_skip("a_bad_minor_upgrade_rolls_back_and_leaves_the_spec_alone") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "rollback").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &sample_database("upgrade")).await.unwrap();
    wait_for_phase(&api, "upgrade", Phase::Running, Duration::from_secs(120)).await;
    let patch = serde_json::json!({"spec": {"version": "16.5", "image": format!("{CRASHING_IMAGE_REPOSITORY}:16.5")}});
    api.patch("upgrade", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let rolled_back = eventually("RolledBack=True", Duration::from_secs(120), || async {
        let database = api.get("upgrade").await.ok()?;
        (condition(&database, "RolledBack")?.status == "True").then_some(database)
    })
    .await;
    assert_eq!(rolled_back.spec.version, "16.5", "the spec stays as the user wrote it");
    assert!(condition(&rolled_back, "RolledBack").unwrap().message.contains("16.4"));
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    eventually("the workload back on postgres:16.4 and Running", Duration::from_secs(120), || async {
        let stateful_set = stateful_sets.get("upgrade").await.ok()?;
        let image = stateful_set.spec.template.spec?.containers.first()?.image.clone()?;
        let database = api.get("upgrade").await.ok()?;
        let status = database.status?;
        (image == "postgres:16.4"
            && status.phase == Some(Phase::Running)
            && status.current_version.as_deref() == Some("16.4"))
        .then_some(())
    })
    .await;
    let entries = ledger_entries(&client, ns, "upgrade").await;
    assert!(
        entries.iter().any(|entry| entry.action == "RolledBack" && entry.from == "16.5" && entry.to == "16.4"),
        "{entries:?}"
    );
    wait_for_event(&client, ns, "upgrade", "RolledBack").await;
}

pub async fn delete_and_wait_gone(api: &Api<DatabaseService>, name: &str) {
    api.delete(name, &DeleteParams::default()).await.unwrap();
    eventually(&format!("{name} gone"), Duration::from_secs(60), || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn delete_with_retain_keeps_volumes_and_credentials() {
    let Some(kubeconfig) = cluster_or_skip("delete_with_retain_keeps_volumes_and_credentials") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "retain").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &sample_database("keep")).await.unwrap();
    wait_for_phase(&api, "keep", Phase::Running, Duration::from_secs(120)).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    eventually("the PVC owned", Duration::from_secs(30), || async {
        let claim = claims.get("data-keep-0").await.ok()?;
        (!claim.metadata.owner_references.unwrap_or_default().is_empty()).then_some(())
    })
    .await;
    delete_and_wait_gone(&api, "keep").await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    // The StatefulSet is collected (it is owned); PVC and Secret must survive that same collection.
    eventually("the StatefulSet collected", Duration::from_secs(90), || async {
        stateful_sets.get_opt("keep").await.ok()?.is_none().then_some(())
    })
    .await;
    let claim = claims.get("data-keep-0").await.expect("the PVC is retained");
    assert!(
        claim.metadata.deletion_timestamp.is_none() && claim.metadata.owner_references.unwrap_or_default().is_empty()
    );
    for retained in ["keep-credentials", "keep-replication", "keep-superuser"] {
        let secret = secrets.get(retained).await.unwrap_or_else(|_| panic!("{retained} is retained"));
        assert!(secret.metadata.owner_references.unwrap_or_default().is_empty(), "{retained}");
    }
    let entries = ledger_entries(&client, ns, "keep").await;
    assert_eq!(entries.last().map(|entry| entry.action.as_str()), Some("Deleted"), "{entries:?}");
}

#[tokio::test]
async fn delete_with_delete_removes_volumes_and_credentials() {
    let Some(kubeconfig) = cluster_or_skip("delete_with_delete_removes_volumes_and_credentials") else { return };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "purge").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = sample_database("gone");
    database.spec.deletion_policy = Some(DeletionPolicy::Delete);
    api.create(&PostParams::default(), &database).await.unwrap();
    wait_for_phase(&api, "gone", Phase::Running, Duration::from_secs(120)).await;
    delete_and_wait_gone(&api, "gone").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    eventually("PVC and Secret deleted", Duration::from_secs(120), || async {
        let claim_gone = claims.get_opt("data-gone-0").await.ok()?.is_none();
        let secret_gone = secrets.get_opt("gone-credentials").await.ok()?.is_none()
            && secrets.get_opt("gone-replication").await.ok()?.is_none();
        (claim_gone && secret_gone).then_some(())
    })
    .await;
}

/// A database made when the replication password lived in its credentials Secret: the operator
/// makes NAME-replication with that same password (its servers and standbys use it), and the
/// application's Secret of a new database holds none.
#[tokio::test]
async fn the_replication_password_moves_to_its_own_secret_unchanged() {
    let Some(kubeconfig) = cluster_or_skip("the_replication_password_moves_to_its_own_secret_unchanged") else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "replication-secret").await;
    let ns = namespace.name.as_str();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    // The credentials Secret as an earlier operator version made it (its labels: ours).
    let earlier: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "older-credentials", "labels": {
            "app.kubernetes.io/name": "postgresql", "app.kubernetes.io/instance": "older",
            "app.kubernetes.io/managed-by": "dbservice-operator"}},
        "stringData": {"username": "app_user", "password": "application-secret", "database": "app",
                       "replication-username": "replicator", "replication-password": "streaming-secret"}
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &earlier).await.unwrap();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &sample_database("older")).await.unwrap();
    api.create(&PostParams::default(), &sample_database("newer")).await.unwrap();
    wait_for_phase(&api, "older", Phase::Running, Duration::from_secs(120)).await;
    wait_for_phase(&api, "newer", Phase::Running, Duration::from_secs(120)).await;
    let text = |secret: &Secret, key: &str| {
        secret.data.as_ref().and_then(|data| data.get(key)).map(|value| String::from_utf8_lossy(&value.0).into_owned())
    };
    let moved = secrets.get("older-replication").await.expect("the replication Secret is made");
    assert_eq!(text(&moved, "password").as_deref(), Some("streaming-secret"), "the password it had");
    assert_eq!(text(&moved, "username").as_deref(), Some("replicator"));
    let newer = secrets.get("newer-credentials").await.unwrap();
    assert!(newer.data.unwrap().keys().all(|key| !key.contains("replication")), "the application's Secret");
    let replication = secrets.get("newer-replication").await.unwrap();
    assert!(text(&replication, "password").is_some_and(|password| password.len() >= 40));
}
