//! Synchronous replication on the real node (issue 11): three instances with
//! `spec.failover.synchronousStandbys: 1`, the writer pod of tests/real_node/failover.rs committing
//! through Service `ha` the whole time. Deleting the primary's pod and SIGKILLing PostgreSQL in it
//! must lose no acknowledged commit; each scenario prints `[figure] ...: RTO <s>, <n> lost`.

use crate::environment::{
    admin_client, install_chart, psql, real_database, real_namespace, real_node_or_skip, wait_running, Target,
};
use crate::failover::{
    database_events, epoch_now, exec_in, figures, last_id, ledger_entries, other_of_two, settled, start_writer,
    wait_settled_instances, DATABASE, SETTLE_TIMEOUT,
};
use crate::support::{eventually, kubectl};
use dbservice_operator::api::database_service::{DatabaseService, FailoverSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use std::time::Duration;

const INSTANCES: usize = 3;
/// Event reasons and ledger actions of the preferred durability's fallback and return.
const DEGRADED: &str = "SynchronousReplicationDegraded";
const RESTORED: &str = "SynchronousReplicationRestored";

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
    // Failovers measured here: the tests that restart the operator wait (see faults::FaultSlot).
    let _operator_pods_stay = crate::environment::operator_pods_lock().read().await;
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

/// The SynchronousReplication condition's status and whether the status says the primary waits.
async fn durability_state(databases: &Api<DatabaseService>) -> Option<(String, Option<bool>)> {
    let status = databases.get(DATABASE).await.ok()?.status?;
    let condition = status.conditions.iter().find(|condition| condition.type_ == "SynchronousReplication")?;
    Some((condition.status.clone(), status.failover.primary_waits_for.map(|members| !members.is_empty())))
}

/// Issue 38: two instances with no durability in the spec get `preferred`; the primary's commits
/// wait for its standby, a failover loses none of them, and with the standby fenced the primary
/// acknowledges alone (Warning, condition, ledger) until it is back.
#[tokio::test]
async fn preferred_durability_is_the_default_loses_no_commit_and_falls_back_without_its_standby() {
    let Some(node) = real_node_or_skip("preferred_durability_is_the_default") else { return };
    install_chart(node);
    // Failovers measured here: the tests that restart the operator wait (see faults::FaultSlot).
    let _operator_pods_stay = crate::environment::operator_pods_lock().read().await;
    let client = admin_client().await;
    let namespace = real_namespace(&client, "preferred").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    databases.create(&PostParams::default(), &real_database(node, DATABASE, 2, "Delete")).await.unwrap();
    wait_running(&client, ns, DATABASE, 2, Duration::from_secs(300)).await;
    let primary = wait_settled_instances(&client, ns, 2).await;
    let standby = other_of_two(&primary);
    eventually("the primary waits for its standby", Duration::from_secs(60), || async {
        (durability_state(&databases).await? == ("True".to_string(), Some(true))).then_some(())
    })
    .await;
    assert_eq!(synchronous_names(&client, node, ns).await, format!("ANY 1 (\"{standby}\")"));
    let status = databases.get(DATABASE).await.unwrap().status.unwrap();
    assert_eq!(
        serde_json::to_value(status.durability).unwrap(),
        serde_json::json!({"mode": "preferred", "standbys": 1})
    );
    start_writer(&client, node, ns).await;

    // 1. The primary's pod deleted: its standby has every acknowledged commit.
    let since = last_id(ns);
    let failed_at = epoch_now();
    pods.delete(&primary, &DeleteParams::default()).await.unwrap();
    eventually("a new primary", SETTLE_TIMEOUT, || async {
        settled(&client, ns, 2).await.filter(|now| *now != primary)
    })
    .await;
    let (rto, lost) = figures(&client, node, ns, "preferred (default): primary pod deleted", failed_at, since).await;
    assert_eq!(lost, 0, "the default durability lost {lost} acknowledged commits when the primary's pod was deleted");
    assert!(rto <= 60.0, "RTO {rto:.1} s");

    // 2. The standby fenced: after at most a stalled commit's 5 s the primary acknowledges alone.
    let primary = wait_settled_instances(&client, ns, 2).await;
    let standby = other_of_two(&primary);
    eventually("the primary waits for its standby again", Duration::from_secs(120), || async {
        (durability_state(&databases).await? == ("True".to_string(), Some(true))).then_some(())
    })
    .await;
    // The failover itself left the new primary alone for a while: count from here.
    let (degraded, restored) = (ledger_entries(ns, DEGRADED).len(), ledger_entries(ns, RESTORED).len());
    let fenced = format!("dbservice.dev/fenced-instances={standby}");
    kubectl(&["-n", ns, "annotate", "databaseservice", DATABASE, &fenced]);
    let fenced_at = epoch_now();
    eventually("a Warning that the primary acknowledges alone", Duration::from_secs(60), || async {
        (ledger_entries(ns, DEGRADED).len() > degraded).then_some(())
    })
    .await;
    assert_eq!(durability_state(&databases).await, Some(("False".to_string(), Some(false))));
    assert_eq!(ledger_entries(ns, DEGRADED).len(), degraded + 1, "told once");
    assert!(database_events(ns, DEGRADED).iter().any(|(warning, _)| *warning), "a Warning event");
    let before = last_id(ns);
    eventually("the writer commits without the standby", Duration::from_secs(30), || async {
        (last_id(ns) >= before + 20).then_some(())
    })
    .await;
    let stalled = crate::failover::writer_log(ns)
        .windows(2)
        .filter(|pair| pair[0].at >= fenced_at)
        .map(|pair| pair[1].at - pair[0].at)
        .fold(0.0f64, f64::max);
    eprintln!("[figure] preferred: longest pause between commits after the standby was fenced: {stalled:.2} s");
    assert!(stalled <= 15.0, "commits waited {stalled:.1} s for a fenced standby");

    // 3. Back: after it streamed for 10 s, commits wait for it again.
    kubectl(&["-n", ns, "annotate", "databaseservice", DATABASE, "dbservice.dev/fenced-instances-"]);
    eventually("the primary waits for its standby once it is back", Duration::from_secs(180), || async {
        (durability_state(&databases).await? == ("True".to_string(), Some(true))).then_some(())
    })
    .await;
    eventually("a ledger entry that it waits again", Duration::from_secs(30), || async {
        (ledger_entries(ns, RESTORED).len() > restored).then_some(())
    })
    .await;
    assert!(!database_events(ns, RESTORED).is_empty(), "an event that it waits again");
    assert_eq!(synchronous_names(&client, node, ns).await, format!("ANY 1 (\"{standby}\")"));
    let _ = pods.delete("writer", &DeleteParams::default()).await;
}
