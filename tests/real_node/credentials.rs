//! Credentials reach processes as files only (issue 37), read as an administrator would audit
//! it: every pod and Job pod template of a namespace with a pooled, archived and backed-up
//! database, their containers and init containers, hold no Secret reference to a credential key
//! and no value of any Secret of the namespace. And the application's Secret in the form an
//! operator before TLS wrote it (a `uri` without `sslmode=verify-full`, the replication keys) is
//! brought back to today's form with its password kept, and the ledger says so.

use crate::backups::{archiving, BRIDGE_ADDRESS};
use crate::environment::{
    admin_client, install_chart, psql, real_database, real_namespace, real_node_or_skip, wait_running, Target,
};
use crate::object_store::{moto_server, Store};
use crate::support::{create_store_secret, eventually, kubectl};
use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::api::database_service_backup::{DatabaseServiceBackup, DatabaseServiceBackupSpec};
use dbservice_operator::operator::ledger;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, PodSpec, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use std::collections::BTreeSet;
use std::time::Duration;

const DATABASE: &str = "pg";
/// Keys whose values identify or are public (an environment may hold them: PGPORT=5432).
const PUBLIC_KEYS: &[&str] = &["username", "database", "host", "port", "ca.crt", "tls.crt", "replication-username"];
/// Keys a Secret reference of an environment variable may name.
const IDENTIFYING_KEYS: &[&str] = &["username", "database"];

/// Every value of every Secret of `namespace` that is a credential (not of [`PUBLIC_KEYS`]).
async fn credential_values(secrets: &Api<Secret>) -> BTreeSet<String> {
    let listed = secrets.list(&ListParams::default()).await.unwrap().items;
    let mut values = BTreeSet::new();
    for secret in listed {
        for (key, value) in secret.data.unwrap_or_default() {
            let text = String::from_utf8_lossy(&value.0).to_string();
            if !PUBLIC_KEYS.contains(&key.as_str()) && text.len() >= 6 {
                values.insert(text);
            }
        }
    }
    values
}

/// What `pod` (named `what`) has in its environment that it should not.
fn environment_problems(what: &str, pod: &PodSpec, credentials: &BTreeSet<String>) -> Vec<String> {
    let mut found = Vec::new();
    for container in pod.init_containers.iter().flatten().chain(&pod.containers) {
        let at = format!("{what}/{}", container.name);
        if container.env_from.iter().flatten().any(|from| from.secret_ref.is_some()) {
            found.push(format!("{at}: envFrom a Secret"));
        }
        for variable in container.env.iter().flatten() {
            let reference = variable.value_from.as_ref().and_then(|from| from.secret_key_ref.as_ref());
            if let Some(reference) = reference.filter(|reference| !IDENTIFYING_KEYS.contains(&reference.key.as_str())) {
                found.push(format!("{at}: {} from key {} of secret {}", variable.name, reference.key, reference.name));
            }
            let value = variable.value.as_deref().unwrap_or_default();
            if credentials.iter().any(|credential| value.contains(credential.as_str())) {
                found.push(format!("{at}: {} holds a value of a Secret", variable.name));
            }
        }
    }
    found
}

#[tokio::test]
async fn no_pod_or_job_of_a_pooled_backed_up_database_has_a_credential_in_its_environment() {
    let test = "no_pod_or_job_of_a_pooled_backed_up_database_has_a_credential_in_its_environment";
    let Some(node) = real_node_or_skip(test) else { return };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "credentials").await;
    let ns = namespace.name.as_str();
    let mut database = real_database(node, DATABASE, 1, "Delete");
    database.spec.pooler =
        Some(serde_json::from_value(serde_json::json!({"instances": 1, "image": node.pgbouncer_image})).unwrap());
    // A store when the host has one (archiving and a backup Job); without, the pods are checked.
    let work = tempfile::Builder::new().prefix("dbservice-real-credentials-").tempdir_in("/tmp").unwrap();
    let store = match moto_server() {
        Some(moto) => Some(Store::start_on(&moto, &work.path().join("moto.log"), BRIDGE_ADDRESS).await),
        None => {
            eprintln!("{test}: no moto_server on the host: no archiving and no backup Job checked");
            None
        }
    };
    if let Some(store) = &store {
        create_store_secret(&client, ns).await;
        database.spec.backup = Some(archiving(&store.endpoint, DATABASE));
    }
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_running(&client, ns, DATABASE, 1, Duration::from_secs(240)).await;
    eventually("the pooler pod ready", Duration::from_secs(180), || async {
        let pooler = databases.get(DATABASE).await.ok()?.status?.pooler?;
        (pooler.ready_instances == 1).then_some(())
    })
    .await;
    if store.is_some() {
        let backups: Api<DatabaseServiceBackup> = Api::namespaced(client.clone(), ns);
        let spec = DatabaseServiceBackupSpec { database_service: DATABASE.into(), target: None };
        backups.create(&PostParams::default(), &DatabaseServiceBackup::new("audit", spec)).await.unwrap();
        crate::recovery::completed(&backups, "audit").await;
    }

    let credentials = credential_values(&Api::namespaced(client.clone(), ns)).await;
    assert!(credentials.len() >= 6, "the passwords and the pooler's token were read: {}", credentials.len());
    let pods: Vec<Pod> = Api::namespaced(client.clone(), ns).list(&ListParams::default()).await.unwrap().items;
    let jobs: Vec<Job> = Api::namespaced(client.clone(), ns).list(&ListParams::default()).await.unwrap().items;
    let components: BTreeSet<String> =
        pods.iter().filter_map(|pod| pod.labels().get("app.kubernetes.io/component").cloned()).collect();
    assert!(components.contains("pooler"), "the pooler pod is among those checked: {components:?}");
    assert_eq!(jobs.len(), usize::from(store.is_some()), "the backup Job is among those checked");
    let mut found = Vec::new();
    for pod in &pods {
        found.extend(environment_problems(
            &format!("pod {}", pod.name_any()),
            pod.spec.as_ref().unwrap(),
            &credentials,
        ));
    }
    for job in &jobs {
        let template = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        found.extend(environment_problems(&format!("job {}", job.name_any()), template, &credentials));
    }
    assert!(found.is_empty(), "credentials in environments: {found:#?}");
}

/// The ledger entries of DATABASE in `namespace` with `action`.
fn ledger_entries(namespace: &str, action: &str) -> Vec<ledger::LedgerEntry> {
    let configmap = format!("{DATABASE}-ledger");
    let text = kubectl(&["-n", namespace, "get", "configmap", &configmap, "-o", "jsonpath={.data.ledger\\.jsonl}"]);
    ledger::parse(&text).into_iter().filter(|entry| entry.action == action).collect()
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    secret.data.as_ref()?.get(key).map(|value| String::from_utf8_lossy(&value.0).to_string())
}

#[tokio::test]
async fn a_pre_tls_application_secret_is_rewritten_with_its_password_kept() {
    let Some(node) = real_node_or_skip("a_pre_tls_application_secret_is_rewritten_with_its_password_kept") else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "pre-tls").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    databases.create(&PostParams::default(), &real_database(node, DATABASE, 1, "Delete")).await.unwrap();
    wait_running(&client, ns, DATABASE, 1, Duration::from_secs(240)).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let credentials = format!("{DATABASE}-credentials");
    let today = secrets.get(&credentials).await.unwrap();
    let (password, uri) = (text(&today, "password").unwrap(), text(&today, "uri").unwrap());
    assert!(uri.ends_with("?sslmode=verify-full"), "{uri}");
    let replication = text(&secrets.get(&format!("{DATABASE}-replication")).await.unwrap(), "password").unwrap();

    // What an operator before TLS and before Secret NAME-replication wrote.
    let old_uri = uri.trim_end_matches("?sslmode=verify-full").to_string();
    let old = serde_json::json!({"stringData": {
        "uri": old_uri, "replication-username": "replicator", "replication-password": replication,
    }});
    secrets.patch(&credentials, &PatchParams::default(), &Patch::Merge(&old)).await.unwrap();
    let rewritten = eventually("the credentials Secret rewritten", Duration::from_secs(60), || async {
        let secret = secrets.get(&credentials).await.ok()?;
        let data = secret.data.as_ref()?;
        let done = !data.contains_key("replication-password") && !data.contains_key("replication-username");
        (done && text(&secret, "uri").is_some_and(|uri| uri.ends_with("?sslmode=verify-full"))).then_some(secret)
    })
    .await;
    assert_eq!(text(&rewritten, "password").as_deref(), Some(password.as_str()), "the password is kept");
    assert_eq!(text(&rewritten, "uri").as_deref(), Some(uri.as_str()), "today's uri, the same password in it");
    let entries = eventually("a ledger entry CredentialsRewritten", Duration::from_secs(30), || async {
        Some(ledger_entries(ns, "CredentialsRewritten")).filter(|entries| !entries.is_empty())
    })
    .await;
    assert!(entries[0].outcome.contains("replication-password removed"), "{entries:?}");
    let ca = format!("ConfigMap {DATABASE}-ca");
    assert!(
        entries[0].outcome.contains("requires sslmode=verify-full") && entries[0].outcome.contains(&ca),
        "{entries:?}"
    );
    assert!(!entries[0].outcome.contains(&password), "no value in the ledger: {entries:?}");
    let logged_in = psql(&client, node, ns, DATABASE, Target::Uri, "select current_user").await;
    assert_eq!(logged_in.expect("the application logs in with the rewritten uri").trim(), "app_user");
}
