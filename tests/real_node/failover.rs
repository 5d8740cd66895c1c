//! Failover, switchover and fencing on the real node (issue 11): real PostgreSQL in real pods, the
//! instance agent in each of them, and a writer pod that commits through Service `<name>` the whole
//! time and logs every acknowledged commit with its time. Each scenario prints its figures:
//! `[figure] <scenario>: RTO <s> (failure to the first acknowledged commit after the outage), <n>
//! acknowledged commits lost`, and ends with one primary behind the Service and the others streaming.
//!
//! Scenarios, in order, on one database of two instances: a planned switchover (annotation), the
//! primary's pod deleted, PostgreSQL SIGKILLed inside the primary, PostgreSQL hung (SIGSTOP), and the
//! primary's pod deleted with the operator's leader restarted in the middle of the failover.

use crate::environment::{
    admin_client, install_chart, lease_holder, operator_pods, operator_pods_lock, psql, real_database, real_namespace,
    real_node_or_skip, wait_running, RealNode, Target,
};
use crate::support::operator::RELEASE_NAMESPACE;
use crate::support::{eventually, kubectl};
use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::api::failover::SWITCHOVER_ANNOTATION;
use dbservice_operator::operator::ledger::{self, LedgerEntry};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) const DATABASE: &str = "ha";
const WRITER: &str = "writer";
/// How long a scenario may take to end in one primary and streaming standbys.
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(180);

/// Commits through the Secret's uri (Service `ha`) in a loop; one line per attempt:
/// `ack <id> <epoch seconds>` or `fail <id> <epoch seconds>`. Each attempt is bounded like an
/// application's request: a connection to a server whose pod vanished mid-statement would otherwise
/// wait for TCP's retransmissions (minutes; seen once in CI as a writer silent after a failover),
/// and the outage measured would be the client's.
const WRITER_SCRIPT: &str = r#"
export PGCONNECT_TIMEOUT=2
DATABASE_URI="$DATABASE_URI&tcp_user_timeout=3000&keepalives_idle=1&keepalives_interval=1&keepalives_count=2"
until psql "$DATABASE_URI" -X -q -c "create table if not exists acks (id bigint primary key, at double precision)"; do sleep 1; done
echo ready
i=0
while :; do
  i=$((i + 1))
  if busybox timeout -s KILL 10 psql "$DATABASE_URI" -X -q -v ON_ERROR_STOP=1 -c "insert into acks values ($i, $EPOCHREALTIME)" >/dev/null 2>&1; then
    echo "ack $i $EPOCHREALTIME"
  else
    echo "fail $i $EPOCHREALTIME"
    sleep 0.2 2>/dev/null || :
  fi
done
"#;

pub(crate) fn epoch_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// One line of the writer's log.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attempt {
    pub(crate) id: i64,
    pub(crate) at: f64,
    pub(crate) acknowledged: bool,
}

/// The writer's log so far (empty while its container starts).
pub(crate) fn writer_log(namespace: &str) -> Vec<Attempt> {
    crate::environment::pod_logs(namespace, WRITER)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let acknowledged = match fields.next()? {
                "ack" => true,
                "fail" => false,
                _ => return None,
            };
            Some(Attempt { acknowledged, id: fields.next()?.parse().ok()?, at: fields.next()?.parse().ok()? })
        })
        .collect()
}

pub(crate) async fn start_writer(client: &kube::Client, node: &RealNode, namespace: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut pod = serde_json::json!({
        "metadata": {"name": WRITER},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 999},
            "containers": [{
                "name": "writer",
                "image": node.postgres_image,
                "command": ["/bin/bash", "-c", WRITER_SCRIPT],
                "env": [{"name": "DATABASE_URI", "valueFrom": {"secretKeyRef": {"name": format!("{DATABASE}-credentials"), "key": "uri"}}}],
            }],
        }
    });
    crate::environment::trust_database_ca(&mut pod, DATABASE);
    let pod: Pod = serde_json::from_value(pod).unwrap();
    pods.create(&PostParams::default(), &pod).await.expect("writer pod created");
    eventually("the writer committing", Duration::from_secs(120), || async {
        (writer_log(namespace).iter().filter(|attempt| attempt.acknowledged).count() >= 20).then_some(())
    })
    .await;
}

/// The primary and standbys as the status shows them, once there is exactly one primary behind
/// the Service (the only pod labelled primary) and every other instance streams from it.
/// Waits until the durability asked for is in force: with `required` or `preferred` (the default)
/// the condition SynchronousReplication is True (a new database, and one whose old primary has
/// just rejoined, acknowledges alone until its standbys stream), so that a fault hits a database
/// that is not degraded and may lose nothing.
pub(crate) async fn durability_in_force(client: &kube::Client, namespace: &str) {
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), namespace);
    eventually("the durability asked for in force", Duration::from_secs(120), || async {
        let status = databases.get(DATABASE).await.ok()?.status?;
        let mode = status.durability?.mode;
        let synchronous = status
            .conditions
            .iter()
            .any(|condition| condition.type_ == "SynchronousReplication" && condition.status == "True");
        (mode == dbservice_operator::api::synchronous::DataDurability::None || synchronous).then_some(())
    })
    .await;
}

pub(crate) async fn settled(client: &kube::Client, namespace: &str, instances: usize) -> Option<String> {
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), namespace);
    let status = databases.get(DATABASE).await.ok()?.status?;
    let primary = status.failover.current_primary.clone()?;
    if status.failover.target_primary.as_ref() != Some(&primary) || status.instances.len() != instances {
        return None;
    }
    let primaries: Vec<_> = status.instances.iter().filter(|instance| instance.role == "primary").collect();
    let streaming = status
        .instances
        .iter()
        .filter(|instance| instance.role == "standby" && instance.ready && instance.streaming)
        .count();
    if primaries.len() != 1 || primaries[0].name != primary || !primaries[0].ready || streaming != instances - 1 {
        return None;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let labelled = pods.list(&ListParams::default().labels("dbservice.dev/role=primary")).await.ok()?;
    let names: Vec<_> = labelled.items.iter().filter_map(|pod| pod.metadata.name.clone()).collect();
    (names == [primary.clone()]).then_some(primary)
}

async fn wait_settled(client: &kube::Client, namespace: &str) -> String {
    wait_settled_instances(client, namespace, 2).await
}

/// Waits until one primary is behind the Service and the `instances - 1` others stream from it.
pub(crate) async fn wait_settled_instances(client: &kube::Client, namespace: &str, instances: usize) -> String {
    eventually("one primary behind the Service, the other instances streaming", SETTLE_TIMEOUT, || {
        settled(client, namespace, instances)
    })
    .await
}

/// The other instance of a two-instance database.
pub(crate) fn other_of_two(primary: &str) -> String {
    let ordinal = if primary.ends_with("-0") { 1 } else { 0 };
    format!("{DATABASE}-{ordinal}")
}

/// The events of reason `reason` about the DatabaseService: whether each is a Warning, and its
/// note (a repeat within the series window counts on the first event and keeps its note).
pub(crate) fn database_events(namespace: &str, reason: &str) -> Vec<(bool, String)> {
    let events: serde_json::Value =
        serde_json::from_str(&kubectl(&["-n", namespace, "get", "events", "-o", "json"])).unwrap();
    events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|event| {
            event["reason"] == reason
                && event["regarding"]["kind"].as_str().or(event["involvedObject"]["kind"].as_str())
                    == Some("DatabaseService")
        })
        .map(|event| {
            let note = event["note"].as_str().or(event["message"].as_str()).unwrap_or_default();
            (event["type"] == "Warning", note.to_string())
        })
        .collect()
}

/// The entries of the ledger of DATABASE with action `action`.
pub(crate) fn ledger_entries(namespace: &str, action: &str) -> Vec<LedgerEntry> {
    let text = kubectl(&[
        "-n",
        namespace,
        "get",
        "configmap",
        &format!("{DATABASE}-ledger"),
        "-o",
        "jsonpath={.data.ledger\\.jsonl}",
    ]);
    ledger::parse(&text).into_iter().filter(|entry| entry.action == action).collect()
}

/// Figures of one scenario from the writer's log: the time from `failed_at` to the first
/// acknowledged commit after the first failed attempt (0 when no attempt failed), the acknowledged
/// commits since `since_id` missing from the table, and how many were acknowledged.
pub(crate) async fn figures(
    client: &kube::Client,
    node: &RealNode,
    namespace: &str,
    scenario: &str,
    failed_at: f64,
    since_id: i64,
) -> (f64, usize) {
    // The outage is over once the writer has committed for a while after it.
    let log = eventually("the writer committing again after the outage", Duration::from_secs(120), || async {
        let log = writer_log(namespace);
        let first_failure = log.iter().find(|attempt| attempt.at >= failed_at && !attempt.acknowledged);
        let after = |from: f64| log.iter().filter(|attempt| attempt.acknowledged && attempt.at > from).count();
        (after(first_failure.map_or(failed_at, |failure| failure.at)) >= 20).then_some(log)
    })
    .await;
    let first_failure = log.iter().find(|attempt| attempt.at >= failed_at && !attempt.acknowledged).copied();
    // RTO counts from the fault; a switchover's target counts the writes refused (from the first
    // refused attempt), since writes go on while its target catches up.
    let (rto, refused) = match first_failure {
        None => (0.0, 0.0),
        Some(failure) => {
            let back =
                log.iter().find(|attempt| attempt.acknowledged && attempt.at > failure.at).expect("a commit after").at;
            (back - failed_at, back - failure.at)
        }
    };
    let acknowledged: Vec<i64> =
        log.iter().filter(|attempt| attempt.acknowledged && attempt.id >= since_id).map(|attempt| attempt.id).collect();
    let sql = format!("select coalesce(string_agg(id::text, ','), '') from acks where id >= {since_id}");
    let stored = eventually("the acknowledged commits read back", Duration::from_secs(120), || async {
        psql(client, node, namespace, DATABASE, Target::Uri, &sql).await.ok()
    })
    .await;
    let stored: BTreeSet<i64> = stored.trim().split(',').filter_map(|id| id.parse().ok()).collect();
    let lost = acknowledged.iter().filter(|id| !stored.contains(id)).count();
    let failed = log.iter().filter(|attempt| !attempt.acknowledged && attempt.at >= failed_at).count();
    eprintln!(
        "[figure] {scenario}: RTO {rto:.2} s (failure to the first acknowledged commit after the outage), \
         writes refused {refused:.2} s, {lost} of {} acknowledged commits lost, {failed} failed attempts",
        acknowledged.len()
    );
    (rto, lost)
}

pub(crate) fn last_id(namespace: &str) -> i64 {
    writer_log(namespace).last().map_or(0, |attempt| attempt.id)
}

pub(crate) fn exec_in(namespace: &str, pod: &str, script: &str) {
    kubectl(&["-n", namespace, "exec", pod, "-c", "postgres", "--", "/bin/bash", "-c", script]);
}

/// SIGSTOPs the postmaster and every child of it: the whole server hangs, the agent does not.
pub(crate) const HANG_POSTGRES: &str = r#"
pid=$(head -n 1 "$PGDATA/postmaster.pid")
kill -STOP "$pid"
for stat in /proc/[0-9]*/stat; do
  read -r child _ _ parent _ < "$stat" 2>/dev/null || continue
  [ "$parent" = "$pid" ] && kill -STOP "$child"
done
true
"#;

#[tokio::test]
async fn failover_switchover_and_fencing_keep_one_primary_under_a_writer() {
    let Some(node) = real_node_or_skip("failover_switchover_and_fencing_keep_one_primary_under_a_writer") else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "failover").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    databases.create(&PostParams::default(), &real_database(node, DATABASE, 2, "Delete")).await.unwrap();
    let took = wait_running(&client, ns, DATABASE, 2, Duration::from_secs(300)).await;
    eprintln!("[figure] DatabaseService with 2 instances (agents) Running in {:.1} s", took.as_secs_f64());
    let first = wait_settled(&client, ns).await;
    assert_eq!(first, format!("{DATABASE}-0"), "the first instance bootstraps the database");
    start_writer(&client, node, ns).await;

    // 1. Planned switchover by hand: the annotation names the standby.
    let primary = wait_settled(&client, ns).await;
    durability_in_force(&client, ns).await;
    let target = other_of_two(&primary);
    let since = last_id(ns);
    let failed_at = epoch_now();
    let patch = Patch::Merge(serde_json::json!({"metadata": {"annotations": {SWITCHOVER_ANNOTATION: target}}}));
    databases.patch(DATABASE, &PatchParams::default(), &patch).await.unwrap();
    let switched = eventually("the standby promoted", SETTLE_TIMEOUT, || async {
        settled(&client, ns, 2).await.filter(|now| *now == target)
    })
    .await;
    assert_eq!(switched, target);
    let (rto, lost) = figures(&client, node, ns, "switchover by annotation", failed_at, since).await;
    assert_eq!(lost, 0, "a switchover loses no acknowledged commit");
    assert!(rto <= 30.0, "switchover took {rto:.1} s");
    let database = databases.get(DATABASE).await.unwrap();
    assert!(
        !database.metadata.annotations.unwrap_or_default().contains_key(SWITCHOVER_ANNOTATION),
        "the request is cleared once done"
    );
    let timeline = database.status.unwrap().failover.timeline.unwrap();
    assert!(timeline >= 2, "a promotion starts a new timeline, got {timeline}");

    // 2. The primary's pod is deleted.
    let primary = wait_settled(&client, ns).await;
    durability_in_force(&client, ns).await;
    let since = last_id(ns);
    let failed_at = epoch_now();
    pods.delete(&primary, &DeleteParams::default()).await.unwrap();
    let new_primary = eventually("a new primary", SETTLE_TIMEOUT, || async {
        settled(&client, ns, 2).await.filter(|now| *now != primary)
    })
    .await;
    let (_, lost) = figures(&client, node, ns, "primary pod deleted", failed_at, since).await;
    assert_ne!(new_primary, primary);
    assert_eq!(lost, 0, "preferred durability: the primary pod's deletion lost acknowledged commits");

    // 3. PostgreSQL SIGKILLed inside the primary (its agent lives on).
    let primary = wait_settled(&client, ns).await;
    durability_in_force(&client, ns).await;
    let since = last_id(ns);
    let failed_at = epoch_now();
    let postmaster = |pod: &str| {
        let output = std::process::Command::new(crate::support::tool("kubectl"))
            .args(["-n", ns, "exec", pod, "-c", "postgres", "--", "/bin/bash", "-c"])
            .arg(r#"head -n 1 "$PGDATA/postmaster.pid""#)
            .env("KUBECONFIG", crate::support::admin_kubeconfig().expect("cluster"))
            .output()
            .expect("kubectl runs");
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    let killed = postmaster(&primary);
    assert!(!killed.is_empty(), "the primary's postmaster runs");
    exec_in(ns, &primary, r#"kill -KILL "$(head -n 1 "$PGDATA/postmaster.pid")""#);
    let after = wait_settled(&client, ns).await;
    let (rto, lost) = figures(&client, node, ns, "PostgreSQL killed in the primary", failed_at, since).await;
    // Issue 38: SIGKILL the instant after commits were acknowledged (the writer commits all the
    // time): every one of them is on the primary after, restarted in place or failed over.
    assert_eq!(lost, 0, "preferred durability: a killed primary lost acknowledged commits");
    let replaced = eventually("a new postmaster on the killed instance", SETTLE_TIMEOUT, || async {
        let now = postmaster(&primary);
        (!now.is_empty() && now != killed).then_some(now)
    })
    .await;
    eprintln!(
        "[figure] PostgreSQL killed in the primary: postmaster {killed} replaced by {replaced}; primary now {after} \
         ({}), RTO {rto:.2} s",
        if after == primary { "restarted in place by its agent" } else { "failed over" }
    );

    // 4. PostgreSQL hangs (SIGSTOP): the agent fences it and the standby takes over.
    let primary = wait_settled(&client, ns).await;
    durability_in_force(&client, ns).await;
    let since = last_id(ns);
    let failed_at = epoch_now();
    exec_in(ns, &primary, HANG_POSTGRES);
    let new_primary = eventually("a new primary after the hang", SETTLE_TIMEOUT, || async {
        settled(&client, ns, 2).await.filter(|now| *now != primary)
    })
    .await;
    let (rto, lost) = figures(&client, node, ns, "PostgreSQL hung in the primary", failed_at, since).await;
    assert_ne!(new_primary, primary);
    assert_eq!(lost, 0, "preferred durability: a hung primary's failover lost acknowledged commits");
    assert!(rto <= 60.0, "a hung primary was replaced after {rto:.1} s");

    // 5. The primary's pod is deleted and the operator's leader restarts in the middle.
    let _operator_pods_move = operator_pods_lock().write().await;
    let primary = wait_settled(&client, ns).await;
    durability_in_force(&client, ns).await;
    let since = last_id(ns);
    let failed_at = epoch_now();
    let leader = lease_holder();
    pods.delete(&primary, &DeleteParams::default()).await.unwrap();
    kubectl(&["-n", RELEASE_NAMESPACE, "delete", "pod", &leader, "--wait=false"]);
    let new_primary = eventually("a new primary under a new operator leader", SETTLE_TIMEOUT, || async {
        settled(&client, ns, 2).await.filter(|now| *now != primary)
    })
    .await;
    figures(&client, node, ns, "primary pod deleted + operator leader restarted", failed_at, since).await;
    assert_ne!(new_primary, primary);
    eventually("2 operator pods again", Duration::from_secs(180), || async {
        (operator_pods().len() == 2).then_some(())
    })
    .await;

    // The ledger records every change with its timing, each once (one switchover was once recorded
    // twice: its status write was refused after the request annotation had been cleared).
    let switchovers = ledger_entries(ns, "Switchover");
    assert_eq!(switchovers.len(), 1, "one switchover, one ledger entry: {switchovers:?}");
    assert!(switchovers[0].outcome.starts_with("completed in"), "{switchovers:?}");
    let failovers = ledger_entries(ns, "Failover");
    assert!(!failovers.is_empty(), "failovers in the ledger");
    let started = ledger_entries(ns, "FailoverStarted").len();
    assert!(failovers.len() <= started, "each failover recorded once ({started} started): {failovers:?}");
    let events = kubectl(&["-n", ns, "get", "events", "-o", "json"]);
    assert!(events.contains("SwitchoverCompleted") && events.contains("FailoverCompleted"));
    let _ = pods.delete(WRITER, &DeleteParams::default()).await;

    // Issue 39: minutes of running left no refused login in the servers' logs (the readiness
    // probe's logins as the superuser over TCP were refused every 10 s, two FATAL lines each), and
    // every clean stop (the switchover's, the deleted pods') read its last WAL records with
    // pg_waldump (a failure is a warning, and a release at the shutdown checkpoint instead).
    for instance in [format!("{DATABASE}-0"), format!("{DATABASE}-1")] {
        let log = kubectl(&["-n", ns, "logs", &instance, "-c", "postgres"]);
        let refused: Vec<&str> = log.lines().filter(|line| line.contains("FATAL:  pg_hba.conf rejects")).collect();
        assert!(refused.is_empty(), "{instance} refused logins: {:?}", &refused[..refused.len().min(3)]);
        let unread: Vec<&str> =
            log.lines().filter(|line| line.contains("could not read the last WAL records")).collect();
        assert!(unread.is_empty(), "{instance}: pg_waldump failed: {unread:?}");
    }
}
