//! Pooling with PgBouncer (issue 25) on the real node: a database of two instances with
//! `spec.pooler` (two pooler pods, PgBouncer of the default image's version, 1.24.1, built from
//! source by tests/cluster/images.sh), clients through Services
//! `ha-pooler` (read-write) and `ha-pooler-replicas` (read-only), TLS verified against the
//! database's CA, every user looked up by `auth_query`.
//!
//! In order: a planned switchover under a session writer (one pooler session, as an application
//! with a connection pool) and pgbench on both pools (persistent connections), which must see no
//! error and lose no commit, the longest wait printed, and under a writer opening a pooler
//! connection per commit (a login during the pause waits for it, within its 10 s connect timeout); a
//! failover (the primary's pod deleted), errors and RTO printed; the pooler pods rolled (a new
//! parameter) under pgbench with a connection per transaction (no client aborted, no transaction
//! failed; the session writer committing again); the superuser refused by the pooler; the pools' metrics; the
//! benchmark of short-lived clients with and without the pooler (`[figure]` lines, not
//! asserted); a parameter of the operator's refused at admission; the pooler removed.

use crate::environment::{
    admin_client, install_chart, psql, real_database, real_namespace, real_node_or_skip, trust_database_ca,
    wait_running, RealNode, Target,
};
use crate::failover::{epoch_now, settled, DATABASE, SETTLE_TIMEOUT};
use crate::support::{eventually, kubectl};
use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use std::collections::BTreeSet;
use std::time::Duration;

/// Commits through the read-write pooler Service, a new client connection each time (what an
/// application without its own pool does); one line per attempt: `ack <id> <epoch> <microseconds
/// it took>` or `fail <id> <epoch> <message>`.
/// Its connect timeout is longer than a switchover's pause (about 3 s): a login that arrives
/// during the pause waits for it, like the transactions do.
const POOLED_WRITER: &str = r#"
export PGCONNECT_TIMEOUT=10 PGHOST="$DATABASE-pooler.$NAMESPACE.svc" PGSSLMODE=verify-full
until psql -X -q -c "create table if not exists pooled (id bigint primary key, at double precision)"; do sleep 1; done
echo ready
i=0
while :; do
  i=$((i + 1))
  started=$EPOCHREALTIME
  if error=$(busybox timeout -s KILL 20 psql -X -q -v ON_ERROR_STOP=1 -c "insert into pooled values ($i, $EPOCHREALTIME)" 2>&1); then
    echo "ack $i $started $(( ${EPOCHREALTIME/./} - ${started/./} ))"
  else
    echo "fail $i $started exit $?: $(echo "$error" | tr '\n' ' ' | cut -c1-160)"
    sleep 0.2
  fi
  sleep 0.05
done
"#;

/// Commits through the read-write pooler Service on one session (what an application with its
/// own connection pool does), every 50 ms; one line per commit: `ack <id> <server's epoch>`, and
/// `fail 0 <epoch> ...` when the session broke (it is opened again).
const SESSION_WRITER: &str = r#"
export PGCONNECT_TIMEOUT=3 PGHOST="$DATABASE-pooler.$NAMESPACE.svc" PGSSLMODE=verify-full
until psql -X -q -c "create table if not exists session_commits (id bigserial primary key, at double precision)"; do sleep 1; done
echo ready
while :; do
  while :; do
    echo "insert into session_commits (at) values (extract(epoch from clock_timestamp())) returning 'ack', id, at;"
    sleep 0.05
  done | psql -X -q -A -t -F ' ' -v ON_ERROR_STOP=1 2>&1
  echo "fail 0 $EPOCHREALTIME the session ended"
  sleep 0.5
done
"#;

/// Runs pgbench against `$TARGET` with `$ARGUMENTS`; prints its report and `done <exit code>`.
const PGBENCH: &str = r#"
export PGCONNECT_TIMEOUT=5 PGSSLMODE=verify-full PGHOST="$TARGET"
pgbench -n $ARGUMENTS 2>&1
echo "done $?"
sleep 3600
"#;

fn client_pod(node: &RealNode, name: &str, script: &str, environment: Vec<serde_json::Value>) -> Pod {
    let secret = format!("{DATABASE}-credentials");
    let from_secret = |variable: &str, key: &str| serde_json::json!({"name": variable, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}});
    let mut variables = vec![
        from_secret("PGUSER", "username"),
        from_secret("PGPASSWORD", "password"),
        from_secret("PGDATABASE", "database"),
    ];
    variables.extend(environment);
    let mut pod = serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 999},
            "containers": [{
                "name": "client",
                "image": node.postgres_image,
                "command": ["/bin/bash", "-c", script],
                "env": variables,
            }],
        }
    });
    trust_database_ca(&mut pod, DATABASE);
    serde_json::from_value(pod).unwrap()
}

fn plain(name: &str, value: &str) -> serde_json::Value {
    serde_json::json!({"name": name, "value": value})
}

/// One line of the pooled writer.
#[derive(Clone, Debug)]
struct Attempt {
    id: i64,
    at: f64,
    /// Seconds the commit took (acknowledged), or the error.
    outcome: Result<f64, String>,
}

fn attempts(namespace: &str) -> Vec<Attempt> {
    attempts_of(namespace, "pooled-writer")
}

fn attempts_of(namespace: &str, pod: &str) -> Vec<Attempt> {
    crate::environment::pod_logs(namespace, pod)
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(4, ' ');
            let kind = fields.next()?;
            let id = fields.next()?.parse().ok()?;
            let at = fields.next()?.parse().ok()?;
            let rest = fields.next().unwrap_or_default().to_string();
            match kind {
                "ack" => Some(Attempt { id, at, outcome: Ok(rest.parse::<f64>().unwrap_or(0.0) / 1e6) }),
                "fail" => Some(Attempt { id, at, outcome: Err(rest) }),
                _ => None,
            }
        })
        .collect()
}

async fn acknowledged_after(namespace: &str, from: f64, count: usize) -> Vec<Attempt> {
    eventually("commits through the pooler", Duration::from_secs(120), || async {
        let all = attempts(namespace);
        (all.iter().filter(|attempt| attempt.at > from && attempt.outcome.is_ok()).count() >= count).then_some(all)
    })
    .await
}

/// Longest outage of pooled clients in a failover (the primary's pod deleted), asserted: the
/// database's own failover and the pools' repointing, with `server_login_retry` at 1 s.
const POOLED_FAILOVER_RTO_SECONDS: f64 = 15.0;

/// The acknowledged ids of `log` since `since_id` that `table` lacks.
async fn lost_since(
    client: &kube::Client,
    node: &RealNode,
    namespace: &str,
    (log, table): (&[Attempt], &str),
    since_id: i64,
) -> usize {
    let sql = format!("select coalesce(string_agg(id::text, ','), '') from {table} where id >= {since_id}");
    let stored = eventually("the pooled commits read back", Duration::from_secs(120), || async {
        psql(client, node, namespace, DATABASE, Target::Uri, &sql).await.ok()
    })
    .await;
    let stored: BTreeSet<i64> = stored.trim().split(',').filter_map(|id| id.parse().ok()).collect();
    log.iter()
        .filter(|attempt| attempt.id >= since_id && attempt.outcome.is_ok() && !stored.contains(&attempt.id))
        .count()
}

/// The longest time between two acknowledged commits from `from` on (the session writer commits
/// every 50 ms: a gap is how long its commit waited).
fn longest_gap(log: &[Attempt], from: f64) -> f64 {
    let acknowledged: Vec<f64> =
        log.iter().filter(|attempt| attempt.outcome.is_ok() && attempt.at >= from).map(|attempt| attempt.at).collect();
    acknowledged.windows(2).map(|pair| pair[1] - pair[0]).fold(0.0, f64::max)
}

async fn run_pgbench(pods: &Api<Pod>, node: &RealNode, name: &str, target: &str, arguments: &str) {
    let pod = client_pod(node, name, PGBENCH, vec![plain("TARGET", target), plain("ARGUMENTS", arguments)]);
    pods.create(&PostParams::default(), &pod).await.expect("pgbench pod created");
}

async fn pgbench_report(namespace: &str, name: &str, seconds: u64) -> String {
    eventually(&format!("pgbench {name} done"), Duration::from_secs(seconds), || async {
        let text = crate::environment::pod_logs(namespace, name);
        text.lines().any(|line| line.starts_with("done ")).then_some(text)
    })
    .await
}

fn assert_no_client_error(name: &str, report: &str) {
    assert!(report.contains("done 0"), "{name} ended with an error:\n{report}");
    assert!(!report.contains("aborted"), "{name} had clients aborted:\n{report}");
    let failed = report.lines().find(|line| line.starts_with("number of failed transactions"));
    assert!(failed.is_none_or(|line| line.contains(": 0 ")), "{name}: {failed:?}\n{report}");
}

fn figure(report: &str, field: &str) -> String {
    report.lines().find(|line| line.starts_with(field)).unwrap_or("").to_string()
}

#[tokio::test]
async fn pgbouncer_pools_switch_over_without_client_errors_fail_over_roll_and_measure() {
    let Some(node) = real_node_or_skip("pgbouncer_pools_switch_over_without_client_errors_fail_over_roll_and_measure")
    else {
        return;
    };
    let _slot = crate::faults::slot().await;
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "pooler").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut database = real_database(node, DATABASE, 2, "Delete");
    database.spec.pooler = Some(
        serde_json::from_value(
            serde_json::json!({"instances": 2, "image": node.pgbouncer_image, "defaultPoolSize": 10}),
        )
        .unwrap(),
    );
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_running(&client, ns, DATABASE, 2, Duration::from_secs(300)).await;
    let started = std::time::Instant::now();
    eventually("both pooler pods ready", Duration::from_secs(180), || async {
        let pooler = databases.get(DATABASE).await.ok()?.status?.pooler?;
        (pooler.ready_instances == 2).then_some(())
    })
    .await;
    eprintln!("[figure] pooler: 2 pods ready {:.1} s after the database", started.elapsed().as_secs_f64());
    // The PgBouncer under test is the one of the image the operator defaults to (issue 39).
    let pooler_pod = pooler_pods(&pods).await.into_iter().next().unwrap();
    let container = kubectl(&["-n", ns, "get", "pod", &pooler_pod, "-o", "jsonpath={.spec.containers[1].name}"]);
    let running = kubectl(&["-n", ns, "exec", &pooler_pod, "-c", container.trim(), "--", "pgbouncer", "--version"]);
    let default_version = dbservice_operator::api::pooler::DEFAULT_POOLER_IMAGE.rsplit(':').next().unwrap();
    assert!(
        running.starts_with(&format!("PgBouncer {default_version}\n")),
        "{running} (default image's {default_version})"
    );
    // A real Prometheus scrapes the pooler pods as the chart's PodMonitor says.
    let work = tempfile::Builder::new().prefix("dbservice-pooler-prometheus-").tempdir_in("/tmp").unwrap();
    let kubeconfig = crate::support::admin_kubeconfig().expect("the cluster's kubeconfig");
    let scrape = crate::monitoring::scrape_config(&crate::monitoring::render_pooler_pod_monitor(), ns, &kubeconfig);
    let prometheus = crate::monitoring::Prometheus::start(work.path(), &scrape, &serde_json::json!({"groups": []}));
    let primary = crate::failover::wait_settled_instances(&client, ns, 2).await;

    // Read-only through the standbys' pool, read-write through the primary's.
    let read_only =
        psql(&client, node, ns, DATABASE, Target::Service("ha-pooler-replicas"), "select pg_is_in_recovery()")
            .await
            .expect("a read through the read-only pool");
    assert_eq!(read_only.trim(), "t", "the read-only pool reaches a standby");
    let read_write = psql(&client, node, ns, DATABASE, Target::Service("ha-pooler"), "select pg_is_in_recovery()")
        .await
        .expect("a query through the read-write pool");
    assert_eq!(read_write.trim(), "f", "the read-write pool reaches the primary");
    psql(&client, node, ns, DATABASE, Target::Uri, "select 1").await.unwrap();
    let initialize = client_pod(
        node,
        "pgbench-init",
        PGBENCH,
        vec![plain("TARGET", &format!("{DATABASE}.{ns}.svc")), plain("ARGUMENTS", "-i -s 2 -q")],
    );
    pods.create(&PostParams::default(), &initialize).await.unwrap();
    let report = pgbench_report(ns, "pgbench-init", 180).await;
    assert!(report.contains("done 0"), "pgbench -i:\n{report}");

    // 1. A planned switchover: pools paused, nothing refused, nothing lost.
    let writer =
        client_pod(node, "pooled-writer", POOLED_WRITER, vec![plain("DATABASE", DATABASE), plain("NAMESPACE", ns)]);
    pods.create(&PostParams::default(), &writer).await.unwrap();
    let session =
        client_pod(node, "session-writer", SESSION_WRITER, vec![plain("DATABASE", DATABASE), plain("NAMESPACE", ns)]);
    pods.create(&PostParams::default(), &session).await.unwrap();
    acknowledged_after(ns, 0.0, 20).await;
    eventually("the session writer committing", Duration::from_secs(120), || async {
        (attempts_of(ns, "session-writer").len() >= 20).then_some(())
    })
    .await;
    let session_since = attempts_of(ns, "session-writer").last().map_or(0, |attempt| attempt.id);
    let pooler_rw = format!("{DATABASE}-pooler.{ns}.svc");
    let pooler_ro = format!("{DATABASE}-pooler-replicas.{ns}.svc");
    run_pgbench(&pods, node, "pgbench-rw", &pooler_rw, "-c 8 -j 2 -T 40 -P 5 --protocol=simple").await;
    run_pgbench(&pods, node, "pgbench-ro", &pooler_ro, "-S -c 4 -j 2 -T 40 -P 5 --protocol=simple").await;
    tokio::time::sleep(Duration::from_secs(8)).await; // pgbench connected and running before the switchover
    let since = attempts(ns).last().map_or(0, |attempt| attempt.id);
    let switched_at = epoch_now();
    let target = crate::failover::other_of_two(&primary);
    let annotation = dbservice_operator::api::failover::SWITCHOVER_ANNOTATION;
    let patch = Patch::Merge(serde_json::json!({"metadata": {"annotations": {annotation: target}}}));
    databases.patch(DATABASE, &PatchParams::default(), &patch).await.unwrap();
    eventually("the switchover done", SETTLE_TIMEOUT, || async {
        settled(&client, ns, 2).await.filter(|now| *now == target)
    })
    .await;
    let log = acknowledged_after(ns, epoch_now(), 20).await;
    let during: Vec<&Attempt> = log.iter().filter(|attempt| attempt.at >= switched_at - 1.0).collect();
    let errors: Vec<String> = during
        .iter()
        .filter_map(|attempt| Some(format!("{:.2} {}", attempt.at, attempt.outcome.as_ref().err()?)))
        .collect();
    let longest = during.iter().filter_map(|attempt| attempt.outcome.as_ref().ok()).fold(0.0f64, |a, b| a.max(*b));
    let lost = lost_since(&client, node, ns, (&log, "pooled"), since).await;
    let session_log = attempts_of(ns, "session-writer");
    let session_errors: Vec<&Attempt> =
        session_log.iter().filter(|attempt| attempt.at >= switched_at - 1.0 && attempt.outcome.is_err()).collect();
    let session_commits = session_log.iter().filter(|attempt| attempt.id > session_since).count();
    let session_lost = lost_since(&client, node, ns, (&session_log, "session_commits"), session_since).await;
    let session_wait = longest_gap(&session_log, switched_at - 1.0);
    let rw_report = pgbench_report(ns, "pgbench-rw", 120).await;
    let ro_report = pgbench_report(ns, "pgbench-ro", 120).await;
    eprintln!(
        "[figure] switchover through the pooler: one session: {session_commits} commits, {} errors, {session_lost} lost, \
         longest wait {session_wait:.2} s; a connection per commit: {} commits, {} errors {errors:?}, {lost} lost, \
         longest wait {longest:.2} s; pgbench rw {} / {}; ro {}",
        session_errors.len(),
        during.len(),
        errors.len(),
        figure(&rw_report, "tps"),
        figure(&rw_report, "number of failed"),
        figure(&ro_report, "tps"),
    );
    assert!(session_errors.is_empty(), "an application session saw errors during a switchover: {session_errors:?}");
    assert_eq!(session_lost, 0, "a switchover loses no acknowledged commit of the session");
    assert_eq!(lost, 0, "a switchover loses no acknowledged commit");
    assert!(errors.is_empty(), "a new connection during a switchover failed (its connect timeout is 10 s): {errors:?}");
    assert_no_client_error("pgbench-rw", &rw_report);
    assert_no_client_error("pgbench-ro", &ro_report);
    let reasons = kubectl(&["-n", ns, "get", "events", "-o", "jsonpath={.items[*].reason}"]);
    assert!(reasons.contains("PoolerPaused"), "an event PoolerPaused: {reasons}");

    // 2. A failover: the pools follow the new primary within the failover's time, and lose no
    // acknowledged commit: two instances are `preferred` by default, so once the old primary
    // streams again as a standby every commit waits for it.
    let primary = target;
    crate::failover::durability_in_force(&client, ns).await;
    let since = attempts(ns).last().map_or(0, |attempt| attempt.id);
    let failed_at = epoch_now();
    pods.delete(&primary, &DeleteParams::default()).await.unwrap();
    let promoted = eventually("another primary", SETTLE_TIMEOUT, || async {
        let status = databases.get(DATABASE).await.ok()?.status?;
        status.failover.current_primary.filter(|now| *now != primary && status.failover.transition.is_none())
    })
    .await;
    let log = acknowledged_after(ns, epoch_now(), 20).await;
    let first_error =
        log.iter().find(|attempt| attempt.at >= failed_at && attempt.outcome.is_err()).map(|attempt| attempt.at);
    let back = log.iter().find(|attempt| attempt.at > first_error.unwrap_or(failed_at) && attempt.outcome.is_ok());
    let rto = first_error.map_or(0.0, |_| back.map_or(f64::NAN, |attempt| attempt.at - failed_at));
    let errors = log.iter().filter(|attempt| attempt.at >= failed_at && attempt.outcome.is_err()).count();
    let lost = lost_since(&client, node, ns, (&log, "pooled"), since).await;
    let mut kinds: Vec<&str> = log
        .iter()
        .filter(|attempt| attempt.at >= failed_at)
        .filter_map(|attempt| attempt.outcome.as_ref().err().map(String::as_str))
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds.truncate(4);
    eprintln!(
        "[figure] failover through the pooler: {promoted} promoted, RTO {rto:.2} s, {errors} client errors, {lost} of \
         the acknowledged lost (preferred: synchronous while the standby streams); errors such as {kinds:?}"
    );
    assert_eq!(lost, 0, "a failover with a streaming standby (preferred durability) lost acknowledged commits");
    // The README's figure: the pools follow within the database's own failover time (3.8-10.5 s
    // measured; PgBouncer's default server_login_retry alone added up to 15 s).
    assert!(
        rto.is_finite() && rto <= POOLED_FAILOVER_RTO_SECONDS,
        "pooled clients waited {rto:.2} s for a failover (at most {POOLED_FAILOVER_RTO_SECONDS} s)"
    );
    crate::failover::wait_settled_instances(&client, ns, 2).await;

    // 3. The pooler pods rolled (a new parameter) under clients that connect per transaction.
    run_pgbench(&pods, node, "pgbench-roll", &pooler_rw, "-C -c 4 -j 2 -T 60 -P 10 --protocol=simple").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before: BTreeSet<String> = pooler_pods(&pods).await;
    let patch = Patch::Merge(serde_json::json!({"spec": {"pooler": {"parameters": {"server_lifetime": "600"}}}}));
    databases.patch(DATABASE, &PatchParams::default(), &patch).await.unwrap();
    eventually("the pooler pods replaced", Duration::from_secs(120), || async {
        let now = pooler_pods(&pods).await;
        let ready = databases.get(DATABASE).await.ok()?.status?.pooler?.ready_instances == 2;
        (ready && now.len() == 2 && now.is_disjoint(&before)).then_some(())
    })
    .await;
    let roll_report = pgbench_report(ns, "pgbench-roll", 120).await;
    let aborted = roll_report.lines().filter(|line| line.contains("aborted while")).count();
    let session_log = attempts_of(ns, "session-writer");
    let rolled_at =
        session_log.iter().filter(|attempt| attempt.outcome.is_err()).map(|attempt| attempt.at).fold(0.0, f64::max);
    eprintln!(
        "[figure] pooler pods rolled: pgbench -C {} / {} / {aborted} clients aborted at connect; the session writer's \
         sessions broken so far: {}",
        figure(&roll_report, "tps"),
        figure(&roll_report, "number of failed"),
        session_log.iter().filter(|attempt| attempt.outcome.is_err()).count(),
    );
    if aborted > 0 {
        // What the pods that replaced the old ones said, before the assertion below fails.
        let output = std::process::Command::new(crate::support::tool("kubectl"))
            .args(["-n", ns, "logs", "-l", "app.kubernetes.io/component=pooler", "--all-containers", "--prefix"])
            .arg("--tail=30")
            .env("KUBECONFIG", crate::support::admin_kubeconfig().expect("cluster"))
            .output()
            .expect("kubectl runs");
        let text = String::from_utf8_lossy(&output.stdout);
        eprintln!("[pooler] the new pooler pods after a roll that aborted clients:\n{text}");
    }
    assert_eq!(aborted, 0, "a roll of the pooler pods aborted clients at connect:\n{roll_report}");
    let failed = roll_report.lines().find(|line| line.starts_with("number of failed transactions"));
    assert!(failed.is_none_or(|line| line.contains(": 0 ")), "a roll failed transactions: {failed:?}");
    // Whatever a roll costs a connected session, the application's next session commits again.
    eventually("the session writer committing after the roll", Duration::from_secs(60), || async {
        let log = attempts_of(ns, "session-writer");
        (log.iter().filter(|attempt| attempt.outcome.is_ok() && attempt.at > rolled_at).count() >= 20).then_some(())
    })
    .await;

    // 4. The superuser is never let in by the pooler (auth_query returns no superuser).
    let superuser_script = format!(
        "PGPASSWORD=$(cat /superuser/password) psql 'host={DATABASE}-pooler.{ns}.svc user=postgres dbname=app sslmode=verify-full connect_timeout=5' -Atc 'select 1' 2>&1; echo \"exit $?\"; sleep 3600"
    );
    let mut refused = client_pod(node, "superuser-through-pooler", &superuser_script, vec![]);
    let superuser_volume =
        serde_json::json!({"name": "superuser", "secret": {"secretName": format!("{DATABASE}-superuser")}});
    let mut value = serde_json::to_value(&refused).unwrap();
    value["spec"]["volumes"].as_array_mut().unwrap().push(superuser_volume);
    value["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "superuser", "mountPath": "/superuser", "readOnly": true}));
    refused = serde_json::from_value(value).unwrap();
    pods.create(&PostParams::default(), &refused).await.unwrap();
    let answer = eventually("the superuser's attempt", Duration::from_secs(60), || async {
        let text = crate::environment::pod_logs(ns, "superuser-through-pooler");
        text.contains("exit ").then_some(text)
    })
    .await;
    assert!(!answer.contains("exit 0"), "the superuser got in through the pooler: {answer}");
    // Refused for the reason the check names (the pooler found no such login), not because the
    // name did not resolve, TLS failed or the pooler did not answer.
    let lowered = answer.to_lowercase();
    assert!(
        ["password authentication failed", "sasl authentication failed", "no such user"]
            .iter()
            .any(|reason| lowered.contains(reason)),
        "the superuser was refused for another reason than its login: {answer}"
    );

    // 5. The pools' metrics in Prometheus: both pooler pods discovered, labelled with their
    // database, both PgBouncers up; the traffic, the waits and the switchover's pause recorded.
    let targets = eventually("both pooler pods scraped", Duration::from_secs(60), || async {
        let data = prometheus.get("/api/v1/targets", &[("state", "active")]).await?;
        let targets = data["activeTargets"].as_array()?.clone();
        let up: Vec<serde_json::Value> = targets.into_iter().filter(|target| target["health"] == "up").collect();
        (up.len() == 2).then_some(up)
    })
    .await;
    for target in &targets {
        assert_eq!(target["labels"]["database"], DATABASE, "{target}");
    }
    for expression in [
        "count(dbservice_pooler_up == 1) == 4",
        "sum(dbservice_pooler_transactions_total{pool=\"rw\", datname=\"app\"}) > 0",
        "dbservice_pooler_client_connections{pool=\"rw\"}",
        "dbservice_pooler_client_wait_seconds_total{pool=\"rw\"}",
        "dbservice_pooler_max_wait_seconds",
        "max(max_over_time(dbservice_pooler_pauses_total[30m])) >= 1",
    ] {
        eventually(&format!("Prometheus: {expression}"), Duration::from_secs(30), || async {
            (!prometheus.query(expression).await.is_empty()).then_some(())
        })
        .await;
    }
    eprintln!("[pooler] Prometheus scraped both pooler pods: up, transactions, waits and the switchover's pause");

    // 5b. A renewed server certificate reaches the PgBouncers without a restart: the Secret
    // removed, the operator issues a new one, the kubelet swaps the files, the agent RELOADs.
    let pooler_pod = pooler_pods(&pods).await.into_iter().next().unwrap();
    let address = kubectl(&["-n", ns, "get", "pod", &pooler_pod, "-o", "jsonpath={.status.podIP}"]);
    let before = served_certificate_serial(address.trim()).expect("the read-write PgBouncer serves a certificate");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
    secrets.delete(&format!("{DATABASE}-tls"), &DeleteParams::default()).await.unwrap();
    let renewed_at = std::time::Instant::now();
    let after = eventually("PgBouncer serving the renewed certificate", Duration::from_secs(240), || async {
        served_certificate_serial(address.trim()).filter(|serial| *serial != before)
    })
    .await;
    assert!(pooler_pods(&pods).await.contains(&pooler_pod), "the pod was not replaced");
    eprintln!(
        "[figure] pooler: a renewed certificate served {:.0} s after the old Secret was removed (serial {before} to {after}), no restart",
        renewed_at.elapsed().as_secs_f64()
    );

    // 6. The benchmark: many short-lived clients, straight to PostgreSQL and through the pooler.
    let direct = format!("{DATABASE}.{ns}.svc");
    for (name, target) in [("bench-direct", direct.as_str()), ("bench-pooler", pooler_rw.as_str())] {
        run_pgbench(&pods, node, name, target, "-C -S -c 16 -j 2 -T 15 --protocol=simple").await;
        let report = pgbench_report(ns, name, 120).await;
        eprintln!(
            "[figure] {name} (pgbench -C -S -c 16 -j 2 -T 15): {} ; {}",
            figure(&report, "tps"),
            figure(&report, "average connection time")
        );
        assert_no_client_error(name, &report);
    }

    // 7. Admission (the real webhook): a parameter that is the operator's is refused with why.
    let patch = Patch::Merge(serde_json::json!({"spec": {"pooler": {"parameters": {"auth_type": "trust"}}}}));
    let refused = databases.patch(DATABASE, &PatchParams::default(), &patch).await.expect_err("refused");
    assert!(refused.to_string().contains("spec.pooler.parameters.auth_type"), "{refused}");

    // 8. Without spec.pooler the pooler goes, the database stays.
    let patch = Patch::Merge(serde_json::json!({"spec": {"pooler": null}}));
    databases.patch(DATABASE, &PatchParams::default(), &patch).await.unwrap();
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), ns);
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), ns);
    eventually("the pooler removed", Duration::from_secs(60), || async {
        let gone = deployments.get_opt("ha-pooler").await.ok()?.is_none()
            && services.get_opt("ha-pooler").await.ok()?.is_none()
            && services.get_opt("ha-pooler-replicas").await.ok()?.is_none();
        let status = databases.get(DATABASE).await.ok()?.status?;
        (gone && status.pooler.is_none()).then_some(())
    })
    .await;
    psql(&client, node, ns, DATABASE, Target::Uri, "select count(*) from pooled").await.expect("the database stays");
}

/// The serial of the certificate the read-write PgBouncer at `address` serves (openssl on the
/// host, PostgreSQL's STARTTLS), None when it cannot be read.
fn served_certificate_serial(address: &str) -> Option<String> {
    let script = format!(
        "timeout 10 openssl s_client -connect {address}:6432 -starttls postgres </dev/null 2>/dev/null | \
         openssl x509 -noout -serial"
    );
    let output = std::process::Command::new("sh").args(["-c", &script]).output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout).trim().to_string();
    text.strip_prefix("serial=").map(String::from)
}

async fn pooler_pods(pods: &Api<Pod>) -> BTreeSet<String> {
    let listed = pods.list(&ListParams::default().labels("app.kubernetes.io/component=pooler")).await.unwrap();
    listed
        .items
        .into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| pod.metadata.name)
        .collect()
}
