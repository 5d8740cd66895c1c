//! Real PostgreSQL under the operator: replication, pods deleted and coming back, deletion policies,
//! and the password kept out of logs, events and the ledger.

use crate::environment::{
    admin_client, install_chart, operator_pods, password_of, psql, psql_in_instance, real_database, real_namespace,
    real_node_or_skip, wait_running, Target,
};
use crate::support::operator::RELEASE_NAMESPACE;
use crate::support::{eventually, kubectl};
use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;
use std::time::{Duration, Instant};

const RUNNING_TIMEOUT: Duration = Duration::from_secs(240);

/// Every row of table `rows`, in order, through `target`.
async fn read_rows(
    client: &kube::Client,
    node: &crate::environment::RealNode,
    namespace: &str,
    target: Target<'_>,
) -> Result<String, String> {
    psql(client, node, namespace, "pg", target, "select string_agg(value, ',' order by id) from rows").await
}

#[tokio::test]
async fn two_instances_replicate_and_survive_their_pods_being_deleted() {
    let Some(node) = real_node_or_skip("two_instances_replicate_and_survive_their_pods_being_deleted") else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "replication").await;
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    databases.create(&PostParams::default(), &real_database(node, "pg", 2, "Delete")).await.unwrap();
    let took = wait_running(&client, &namespace.name, "pg", 2, RUNNING_TIMEOUT).await;
    eprintln!("[figure] DatabaseService with 2 instances Running in {:.1} s", took.as_secs_f64());

    // Writes through the Secret's uri (Service `pg`, the primary), reads from the standby's Service.
    let written = psql(
        &client,
        node,
        &namespace.name,
        "pg",
        Target::Uri,
        "create table rows (id int primary key, value text); insert into rows values (1, 'one'), (2, 'two'); \
         select count(*) from rows",
    )
    .await
    .expect("rows written through the uri");
    assert_eq!(written.trim(), "2");
    let from_standby = eventually("the rows on the standby", Duration::from_secs(60), || async {
        read_rows(&client, node, &namespace.name, Target::Service("pg-replicas"))
            .await
            .ok()
            .filter(|rows| rows.trim() == "one,two")
    })
    .await;
    assert_eq!(from_standby.trim(), "one,two");
    let in_recovery =
        psql(&client, node, &namespace.name, "pg", Target::Service("pg-replicas"), "select pg_is_in_recovery()")
            .await
            .unwrap();
    assert_eq!(in_recovery.trim(), "t", "pg-replicas must reach a standby");
    assert_eq!(psql_in_instance(&namespace.name, "pg-0", "select state from pg_stat_replication").trim(), "streaming");

    // The primary's pod is deleted: the standby takes over (failover), the old primary comes back on
    // its volume as a standby, and every row is there.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace.name);
    let old_uid = pods.get("pg-0").await.unwrap().metadata.uid;
    let deleted = Instant::now();
    pods.delete("pg-0", &DeleteParams::default()).await.unwrap();
    eventually("pg-0 replaced", Duration::from_secs(60), || async {
        (pods.get_opt("pg-0").await.ok().flatten()?.metadata.uid != old_uid).then_some(())
    })
    .await;
    let rows = eventually("the rows through the primary again", Duration::from_secs(180), || async {
        read_rows(&client, node, &namespace.name, Target::Uri).await.ok().filter(|rows| rows.trim() == "one,two")
    })
    .await;
    assert_eq!(rows.trim(), "one,two");
    eprintln!("[figure] primary pod deleted -> rows readable again in {:.1} s", deleted.elapsed().as_secs_f64());
    psql(&client, node, &namespace.name, "pg", Target::Uri, "insert into rows values (3, 'three')").await.unwrap();

    // The standby's pod is deleted: it re-joins and streams the new row.
    let databases_now = databases.get("pg").await.unwrap();
    let primary = databases_now.status.unwrap().failover.current_primary.expect("a current primary");
    let standby = if primary == "pg-0" { "pg-1" } else { "pg-0" };
    pods.delete(standby, &DeleteParams::default()).await.unwrap();
    eventually("the standby streaming again", Duration::from_secs(180), || async {
        let state = kubectl_quiet(&namespace.name, &primary, "select state from pg_stat_replication")?;
        (state.trim() == "streaming").then_some(())
    })
    .await;
    let rows = eventually("the new row on the re-joined standby", Duration::from_secs(60), || async {
        read_rows(&client, node, &namespace.name, Target::Service("pg-replicas"))
            .await
            .ok()
            .filter(|rows| rows.trim() == "one,two,three")
    })
    .await;
    assert_eq!(rows.trim(), "one,two,three");
    wait_running(&client, &namespace.name, "pg", 2, RUNNING_TIMEOUT).await;

    // The password never reaches the operator's logs, the namespace's events or the ledger.
    let password = password_of(&client, &namespace.name, "pg").await;
    assert!(password.len() >= 16, "a generated password");
    for pod in operator_pods() {
        let logs = kubectl(&["-n", RELEASE_NAMESPACE, "logs", &pod]);
        assert!(!logs.is_empty() || pod.is_empty());
        assert!(!logs.contains(&password), "the log of {pod} contains the password");
    }
    let events = kubectl(&["-n", &namespace.name, "get", "events", "-o", "json"]);
    assert!(events.contains("pg"), "events were recorded");
    assert!(!events.contains(&password), "an event contains the password");
    let ledger = kubectl(&["-n", &namespace.name, "get", "configmap", "pg-ledger", "-o", "json"]);
    assert!(!ledger.contains(&password), "the ledger contains the password");
}

/// kubectl exec psql that returns None instead of panicking (the pod may be restarting).
pub(crate) fn kubectl_quiet(namespace: &str, pod: &str, sql: &str) -> Option<String> {
    let output = std::process::Command::new(crate::support::tool("kubectl"))
        .args(["-n", namespace, "exec", pod, "-c", "postgres", "--", "psql", "-X", "-h", "/var/run/postgresql"])
        .args(["-U", "postgres", "-d", "app", "-Atc", sql])
        .env("KUBECONFIG", crate::support::admin_kubeconfig()?)
        .output()
        .ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).to_string())
}

#[tokio::test]
async fn retain_keeps_data_and_password_and_delete_removes_them() {
    let Some(node) = real_node_or_skip("retain_keeps_data_and_password_and_delete_removes_them") else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "retention").await;
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    databases.create(&PostParams::default(), &real_database(node, "pg", 1, "Retain")).await.unwrap();
    let took = wait_running(&client, &namespace.name, "pg", 1, RUNNING_TIMEOUT).await;
    eprintln!("[figure] DatabaseService with 1 instance Running in {:.1} s", took.as_secs_f64());
    psql(
        &client,
        node,
        &namespace.name,
        "pg",
        Target::Uri,
        "create table rows (id int, value text); insert into rows values (1, 'kept')",
    )
    .await
    .unwrap();
    let password = password_of(&client, &namespace.name, "pg").await;

    // Retain: the DatabaseService goes, its volume and credentials stay, and a new one of the same name
    // starts on them: the old row and the old password work.
    databases.delete("pg", &DeleteParams::default()).await.unwrap();
    eventually("the DatabaseService gone", Duration::from_secs(120), || async {
        databases.get_opt("pg").await.ok()?.is_none().then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace.name);
    eventually("its pod gone", Duration::from_secs(120), || async {
        pods.get_opt("pg-0").await.ok()?.is_none().then_some(())
    })
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace.name);
    assert_eq!(claims.list(&ListParams::default()).await.unwrap().items.len(), 1, "the volume is kept");
    databases.create(&PostParams::default(), &real_database(node, "pg", 1, "Retain")).await.unwrap();
    wait_running(&client, &namespace.name, "pg", 1, RUNNING_TIMEOUT).await;
    assert_eq!(password_of(&client, &namespace.name, "pg").await, password, "the old password is kept");
    let rows = eventually("the old row", Duration::from_secs(60), || async {
        read_rows(&client, node, &namespace.name, Target::Uri).await.ok()
    })
    .await;
    assert_eq!(rows.trim(), "kept");

    // Delete: the volumes and credentials a DatabaseService's own operator made go with it. (The re-created
    // `pg` above never owns the data it inherited, so a fresh database shows this.)
    databases.create(&PostParams::default(), &real_database(node, "fresh", 1, "Delete")).await.unwrap();
    wait_running(&client, &namespace.name, "fresh", 1, RUNNING_TIMEOUT).await;
    psql(&client, node, &namespace.name, "fresh", Target::Uri, "create table gone (id int)").await.unwrap();
    let owned_by_fresh = ListParams::default().labels("app.kubernetes.io/instance=fresh");
    assert_eq!(claims.list(&owned_by_fresh).await.unwrap().items.len(), 1);
    databases.delete("fresh", &DeleteParams::default()).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace.name);
    eventually("fresh's volumes and credentials deleted", Duration::from_secs(180), || async {
        let claims_left = claims.list(&owned_by_fresh).await.ok()?.items.len();
        let secret_left = secrets.get_opt("fresh-credentials").await.ok()?.is_some()
            || secrets.get_opt("fresh-superuser").await.ok()?.is_some()
            || secrets.get_opt("fresh-replication").await.ok()?.is_some();
        (claims_left == 0 && !secret_left && databases.get_opt("fresh").await.ok()?.is_none()).then_some(())
    })
    .await;
    // The retained data of `pg` is untouched by that.
    assert!(secrets.get_opt("pg-credentials").await.unwrap().is_some());
    assert!(secrets.get_opt("pg-superuser").await.unwrap().is_some());
    assert!(secrets.get_opt("pg-replication").await.unwrap().is_some());
}
