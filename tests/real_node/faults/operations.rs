//! Faults a person or an application causes without meaning harm: the managed-by label removed from
//! the primary's pod, the DatabaseService's status lost, and the application holding every
//! connection. None may move the primary, lose a commit or let two servers accept writes.

use super::Bed;
use crate::failover::{epoch_now, ledger_entries, DATABASE};
use crate::support::{admin_kubeconfig, eventually, tool};
use dbservice_operator::api::names::{MANAGED_BY, MANAGED_BY_LABEL};
use dbservice_operator::api::synchronous::DataDurability;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use std::time::Duration;

/// Sessions the storm opens: more than `max_connections` (100).
const STORM_SESSIONS: usize = 110;

/// How long each of the storm's sessions holds its connection.
const STORM_SECONDS: u32 = 20;

/// The storm pod's log so far (empty while its container starts).
fn storm_logs(namespace: &str) -> String {
    let output = std::process::Command::new(tool("kubectl"))
        .args(["-n", namespace, "logs", "storm"])
        .env("KUBECONFIG", admin_kubeconfig().expect("cluster"))
        .output()
        .expect("kubectl runs");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn assert_nothing_moved(bed_namespace: &str, fault: &str, outcome: &super::Outcome) {
    let started = ledger_entries(bed_namespace, "FailoverStarted");
    assert!(started.is_empty(), "{fault}: a failover started: {started:?}");
    assert_eq!(outcome.lost, 0, "{fault}: {outcome:?}");
    assert!(outcome.overlaps.is_empty(), "{fault}: two writable primaries: {:?}", outcome.overlaps);
}

#[tokio::test]
async fn a_primary_whose_managed_by_label_is_removed_stays_primary_and_gets_it_back() {
    label_removed("managed-by label removed from the primary's pod", None).await;
}

/// Issue 38: the same under `required` durability (3 instances).
#[tokio::test]
async fn a_primary_whose_managed_by_label_is_removed_under_required_durability_stays_primary() {
    let fault = "managed-by label removed from the primary's pod, required durability, 3 instances";
    label_removed(fault, Some(DataDurability::Required)).await;
}

async fn label_removed(fault: &str, durability: Option<DataDurability>) {
    let Some(bed) = Bed::start_in_mode(fault, durability).await else { return };
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), bed.ns());
    let primary = bed.primary().await;
    let (since, failed_at) = (bed.last_id(), epoch_now());
    let patch = Patch::Merge(serde_json::json!({"metadata": {"labels": {MANAGED_BY_LABEL: null}}}));
    pods.patch(&primary, &PatchParams::default(), &patch).await.unwrap();
    eventually("the label put back", Duration::from_secs(120), || async {
        let pod = pods.get(&primary).await.ok()?;
        (pod.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)).then_some(())
    })
    .await;
    let outcome = bed.conclude(fault, failed_at, since).await;
    assert_eq!(bed.primary().await, primary, "removing a label moved the primary");
    assert_nothing_moved(bed.ns(), fault, &outcome);
}

#[tokio::test]
async fn a_lost_status_keeps_the_primary_that_holds_the_lease() {
    status_wiped("the DatabaseService's status wiped", None).await;
}

/// Issue 38: the same under `required` durability (3 instances).
#[tokio::test]
async fn a_lost_status_under_required_durability_keeps_the_primary_that_holds_the_lease() {
    status_wiped(
        "the DatabaseService's status wiped, required durability, 3 instances",
        Some(DataDurability::Required),
    )
    .await;
}

async fn status_wiped(fault: &str, durability: Option<DataDurability>) {
    let Some(bed) = Bed::start_in_mode(fault, durability).await else { return };
    // Not ordinal 0: a lost status must not make the bootstrap instance primary again.
    let primary = bed.primary().await;
    if primary.ends_with("-0") {
        bed.request_switchover(&bed.other_than(&primary)).await;
    }
    let primary = eventually("the primary on ordinal 1", crate::failover::SETTLE_TIMEOUT, || async {
        crate::failover::settled(&bed.client, bed.ns(), bed.instances).await.filter(|now| now.ends_with("-1"))
    })
    .await;
    let (since, failed_at) = (bed.last_id(), epoch_now());
    let patch = serde_json::json!({"status": null});
    bed.databases().patch_status(DATABASE, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let outcome = bed.conclude(fault, failed_at, since).await;
    assert_eq!(bed.primary().await, primary, "a lost status moved the primary");
    assert_nothing_moved(bed.ns(), fault, &outcome);
}

#[tokio::test]
async fn the_application_holding_every_connection_starts_no_failover() {
    connection_storm("the application holding every connection", None).await;
}

/// Issue 38: the same under `required` durability (3 instances).
#[tokio::test]
async fn the_application_holding_every_connection_under_required_durability_starts_no_failover() {
    let fault = "the application holding every connection, required durability, 3 instances";
    connection_storm(fault, Some(DataDurability::Required)).await;
}

async fn connection_storm(fault: &str, durability: Option<DataDurability>) {
    let Some(bed) = Bed::start_in_mode(fault, durability).await else { return };
    let primary = bed.primary().await;
    let (since, failed_at) = (bed.last_id(), epoch_now());
    let script = format!(
        "for i in $(eval echo {{1..{STORM_SESSIONS}}}); do psql \"$DATABASE_URI\" -Atc 'select pg_sleep({STORM_SECONDS})' \
         >/dev/null & done; wait; echo storm over"
    );
    let mut pod = serde_json::json!({
        "metadata": {"name": "storm"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 999},
            "containers": [{
                "name": "storm",
                "image": bed.node.postgres_image,
                "command": ["/bin/bash", "-c", script],
                "env": [{"name": "DATABASE_URI", "valueFrom": {"secretKeyRef": {"name": format!("{DATABASE}-credentials"), "key": "uri"}}}],
            }],
        }
    });
    crate::environment::trust_database_ca(&mut pod, DATABASE);
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), bed.ns());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    // Refused sessions prove that every slot was taken.
    eventually("sessions refused for want of a slot", Duration::from_secs(90), || async {
        let logs = storm_logs(bed.ns());
        (logs.contains("too many clients") || logs.contains("connection slots are reserved")).then_some(())
    })
    .await;
    eventually("the storm over", Duration::from_secs(120), || async {
        storm_logs(bed.ns()).contains("storm over").then_some(())
    })
    .await;
    let outcome = bed.conclude(fault, failed_at, since).await;
    assert_eq!(bed.primary().await, primary, "a connection storm moved the primary");
    assert_nothing_moved(bed.ns(), fault, &outcome);
}
