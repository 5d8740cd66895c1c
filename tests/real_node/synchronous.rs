//! Synchronous replication on the real node (issue 11): three instances with
//! `spec.failover.synchronousStandbys: 1`, the writer pod of tests/real_node/failover.rs committing
//! through Service `ha` the whole time. Deleting the primary's pod and SIGKILLing PostgreSQL in it
//! must lose no acknowledged commit; each scenario prints `[figure] ...: RTO <s>, <n> lost`.

use crate::environment::{
    admin_client, install_chart, psql, real_database, real_namespace, real_node_or_skip, wait_running, Target,
};
use crate::failover::{
    epoch_now, exec_in, figures, last_id, settled, start_writer, wait_settled_instances, DATABASE, SETTLE_TIMEOUT,
};
use crate::support::{eventually, kubectl};
use dbservice_operator::api::database_service::{DatabaseService, FailoverSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use std::time::Duration;

const INSTANCES: usize = 3;

/// `ANY 1 ("…","…")` over every instance but `primary`.
fn expected_names(primary: &str) -> String {
    let others: Vec<String> = (0..INSTANCES)
        .map(|ordinal| format!("{DATABASE}-{ordinal}"))
        .filter(|name| name != primary)
        .map(|name| format!("\"{name}\""))
        .collect();
    format!("ANY 1 ({})", others.join(","))
}

async fn synchronous_names(client: &kube::Client, node: &crate::environment::RealNode, namespace: &str) -> String {
    let sql = "select current_setting('synchronous_standby_names')";
    eventually("synchronous_standby_names read on the primary", Duration::from_secs(60), || async {
        psql(client, node, namespace, DATABASE, Target::Uri, sql).await.ok().map(|text| text.trim().to_string())
    })
    .await
}

/// Where the time of a failover went: the ledger's entries and the promoted agent's log lines
/// about the hand-over, relative to the failure.
fn explain_timing(namespace: &str, promoted: &str, failed_at: f64) {
    for action in ["FailoverStarted", "Failover"] {
        for entry in crate::failover::ledger_entries(namespace, action) {
            eprintln!(
                "[timing] ledger {} {} {} -> {}: {}",
                entry.time, entry.action, entry.from, entry.to, entry.outcome
            );
        }
    }
    let log = kubectl(&["-n", namespace, "logs", promoted, "-c", "postgres", "--timestamps"]);
    let wanted =
        ["waiting for the old primary", "did not arrive", "promoting", "following", "synchronous standbys set"];
    for line in log.lines().filter(|line| wanted.iter().any(|word| line.contains(word))) {
        eprintln!("[timing] {promoted}: {}", line.chars().take(300).collect::<String>());
    }
    eprintln!("[timing] failure at epoch {failed_at:.3}");
}

#[tokio::test]
async fn synchronous_replication_loses_no_acknowledged_commit_when_the_primary_fails() {
    let Some(node) = real_node_or_skip("synchronous_replication_loses_no_acknowledged_commit_when_the_primary_fails")
    else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "synchronous").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut database = real_database(node, DATABASE, INSTANCES as i32, "Delete");
    database.spec.failover = Some(FailoverSpec { synchronous_standbys: Some(1), ..Default::default() });
    databases.create(&PostParams::default(), &database).await.unwrap();
    let took = wait_running(&client, ns, DATABASE, INSTANCES as i32, Duration::from_secs(300)).await;
    eprintln!("[figure] synchronous DatabaseService with {INSTANCES} instances Running in {:.1} s", took.as_secs_f64());
    let primary = wait_settled_instances(&client, ns, INSTANCES).await;
    assert_eq!(synchronous_names(&client, node, ns).await, expected_names(&primary));
    start_writer(&client, node, ns).await;

    // 1. The primary's pod is deleted.
    let primary = wait_settled_instances(&client, ns, INSTANCES).await;
    let since = last_id(ns);
    let failed_at = epoch_now();
    pods.delete(&primary, &DeleteParams::default()).await.unwrap();
    let new_primary = eventually("a new primary", SETTLE_TIMEOUT, || async {
        settled(&client, ns, INSTANCES).await.filter(|now| *now != primary)
    })
    .await;
    let (rto, lost) = figures(&client, node, ns, "synchronous: primary pod deleted", failed_at, since).await;
    explain_timing(ns, &new_primary, failed_at);
    assert_eq!(lost, 0, "synchronous replication lost {lost} acknowledged commits when the primary pod was deleted");
    assert!(rto <= 60.0, "RTO {rto:.1} s");
    assert_eq!(synchronous_names(&client, node, ns).await, expected_names(&new_primary));

    // 2. PostgreSQL SIGKILLed inside the primary (its agent lives on).
    let primary = wait_settled_instances(&client, ns, INSTANCES).await;
    let since = last_id(ns);
    let failed_at = epoch_now();
    exec_in(ns, &primary, r#"kill -KILL "$(head -n 1 "$PGDATA/postmaster.pid")""#);
    let after = wait_settled_instances(&client, ns, INSTANCES).await;
    let (rto, lost) =
        figures(&client, node, ns, "synchronous: PostgreSQL killed in the primary", failed_at, since).await;
    assert_eq!(lost, 0, "synchronous replication lost {lost} acknowledged commits when PostgreSQL was killed");
    eprintln!(
        "[figure] synchronous: PostgreSQL killed in the primary: primary now {after} ({}), RTO {rto:.2} s",
        if after == primary { "restarted in place by its agent" } else { "failed over" }
    );
    let _ = pods.delete("writer", &DeleteParams::default()).await;
}
