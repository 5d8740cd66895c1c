//! The instance agent's `/metrics` (issue 23) against real PostgreSQL on loopback: a primary with
//! a streaming standby reports up, role, timeline, per-standby lag, WAL, the archiver,
//! connections and their limit, database sizes, transaction ID age, checkpoints and deadlocks;
//! scrapes close together share one; a server that does not answer is `up 0`.

#[path = "support/loopback.rs"]
mod loopback;
#[path = "support/ports.rs"]
mod ports;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use dbservice_operator::instance::custom_queries::QueriesSource;
use dbservice_operator::instance::metrics::{CONTENT_TYPE, METRIC_NAMES};
use dbservice_operator::instance::InstanceConfig;
use http_body_util::BodyExt;
use loopback::Cluster;
use tower::ServiceExt;

async fn scrape(router: axum::Router) -> String {
    let response = router.oneshot(Request::get("/metrics").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers().get(header::CONTENT_TYPE).unwrap(), CONTENT_TYPE);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// The metrics router of `config` without user queries.
fn router(config: InstanceConfig) -> axum::Router {
    dbservice_operator::instance::metrics::router(config, QueriesSource::None)
}

/// The value of the sample whose line starts with `prefix` (name and labels).
fn value(text: &str, prefix: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(prefix)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_and_its_standby_report_postgresql_in_openmetrics() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, &["db-0", "db-1"]).await;
    cluster.wait_streaming("db-1").await;
    let primary = router(cluster.config("db-0"));
    let text = scrape(primary.clone()).await;
    assert!(text.ends_with("# EOF\n"), "{text}");
    for family in text.lines().filter_map(|line| line.strip_prefix("# TYPE ")) {
        let name = family.split(' ').next().unwrap();
        assert!(METRIC_NAMES.contains(&name), "{name} is missing from METRIC_NAMES");
    }
    assert_eq!(value(&text, "dbservice_postgres_up"), Some(1.0), "{text}");
    assert_eq!(value(&text, "dbservice_postgres_primary"), Some(1.0), "{text}");
    assert_eq!(value(&text, "dbservice_postgres_timeline"), Some(1.0), "{text}");
    assert_eq!(value(&text, "dbservice_postgres_scrape_errors"), Some(0.0), "{text}");
    assert_eq!(value(&text, "dbservice_postgres_replication_streaming{standby=\"db-1\"}"), Some(1.0), "{text}");
    assert!(value(&text, "dbservice_postgres_replication_lag_bytes{standby=\"db-1\"}").is_some(), "{text}");
    assert!(value(&text, "dbservice_postgres_replication_lag_seconds{standby=\"db-1\"}").is_some(), "{text}");
    assert!(value(&text, "dbservice_postgres_wal_written_bytes_total").is_some_and(|bytes| bytes > 0.0), "{text}");
    assert!(value(&text, "dbservice_postgres_max_connections").is_some_and(|limit| limit >= 10.0), "{text}");
    assert!(
        value(&text, "dbservice_postgres_database_size_bytes{datname=\"postgres\"}").is_some_and(|size| size > 1e6),
        "{text}"
    );
    assert!(value(&text, "dbservice_postgres_transaction_id_age{datname=\"template0\"}").is_some(), "{text}");
    assert!(value(&text, "dbservice_postgres_checkpoints_total{kind=\"requested\"}").is_some(), "{text}");
    assert!(value(&text, "dbservice_postgres_deadlocks_total{datname=\"postgres\"}").is_some(), "{text}");
    assert!(value(&text, "dbservice_postgres_archive_failures_total").is_some(), "{text}");
    assert!(value(&text, "dbservice_postgres_longest_transaction_seconds").is_some(), "{text}");

    // A scrape right after gets the same text: many scrapers cost one.
    assert_eq!(scrape(primary).await, text);

    // An open transaction shows as the longest one.
    let port = cluster.port("db-0");
    let (client, connection) = tokio_postgres::connect(&loopback::conninfo(port), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client.batch_execute("BEGIN; SELECT txid_current()").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
    let text = scrape(router(cluster.config("db-0"))).await;
    assert!(value(&text, "dbservice_postgres_longest_transaction_seconds").is_some_and(|age| age >= 2.0), "{text}");
    assert!(
        value(&text, "dbservice_postgres_connections{state=\"idle in transaction\"}").is_some_and(|count| count >= 1.0),
        "{text}"
    );
    drop(client);

    // The standby: role 0, no per-standby lag of its own.
    let text = scrape(router(cluster.config("db-1"))).await;
    assert_eq!(value(&text, "dbservice_postgres_up"), Some(1.0), "{text}");
    assert_eq!(value(&text, "dbservice_postgres_primary"), Some(0.0), "{text}");
    assert!(!text.contains("dbservice_postgres_replication_lag_bytes"), "{text}");
    assert!(!text.contains("dbservice_postgres_wal_written_bytes"), "{text}");
    assert_eq!(value(&text, "dbservice_postgres_wal_receiver_streaming"), Some(1.0), "{text}");
    let free = value(&text, "dbservice_instance_volume_free_bytes").expect("volume free bytes");
    let size = value(&text, "dbservice_instance_volume_size_bytes").expect("volume size");
    assert!(free > 0.0 && free <= size, "{text}");

    // No server behind the socket: up 0 and nothing else.
    let missing = InstanceConfig { socket_dir: "/nonexistent".into(), ..cluster.config("db-0") };
    let text = scrape(router(missing)).await;
    assert_eq!(value(&text, "dbservice_postgres_up"), Some(0.0), "{text}");
    assert!(!text.contains("dbservice_postgres_primary"), "{text}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_queries_run_as_the_application_role_read_only_and_a_bad_one_costs_only_itself() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, &["db-0"]).await;
    let port = cluster.port("db-0");
    for sql in ["CREATE ROLE shop_app LOGIN", "CREATE DATABASE shop OWNER shop_app"] {
        loopback::query(port, sql).await.unwrap();
    }
    let shop = loopback::conninfo(port).replace("dbname=postgres", "dbname=shop");
    let (client, connection) = tokio_postgres::connect(&shop, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE TABLE orders (region text, shipped bool); ALTER TABLE orders OWNER TO shop_app;
             INSERT INTO orders VALUES ('eu', false), ('eu', false), ('us', false), ('us', true);
             CREATE TABLE secrets (x int); REVOKE ALL ON secrets FROM PUBLIC;
             CREATE SEQUENCE orders_numbers; ALTER SEQUENCE orders_numbers OWNER TO shop_app",
        )
        .await
        .unwrap();
    let queries = r#"[
      {"name": "orders_pending", "help": "Orders not shipped", "labels": ["region"],
       "query": "SELECT region, count(*) AS value FROM orders WHERE NOT shipped GROUP BY region;"},
      {"name": "orders_seen", "kind": "counter", "query": "SELECT count(*) AS value FROM orders"},
      {"name": "superuser_file", "query": "SELECT length(pg_read_file('/etc/hostname')) AS value"},
      {"name": "not_the_apps", "query": "SELECT count(*) AS value FROM secrets"},
      {"name": "writes", "query": "SELECT nextval('orders_numbers') AS value"},
      {"name": "Bad-Name", "query": "SELECT 1 AS value"}
    ]"#;
    let custom = QueriesSource::Fixed {
        texts: vec![queries.into(), "not json".into()],
        application_user: "shop_app".into(),
        database: "shop".into(),
    };
    let text = scrape(dbservice_operator::instance::metrics::router(cluster.config("db-0"), custom)).await;
    assert_eq!(value(&text, "dbservice_user_orders_pending{region=\"eu\"}"), Some(2.0), "{text}");
    assert_eq!(value(&text, "dbservice_user_orders_pending{region=\"us\"}"), Some(1.0), "{text}");
    assert!(text.contains("# HELP dbservice_user_orders_pending Orders not shipped"), "{text}");
    assert_eq!(value(&text, "dbservice_user_orders_seen_total"), Some(4.0), "{text}");
    // The application's role may not read the server's files nor another role's table, and a
    // failing query, a malformed entry and a text that is no JSON each count once.
    assert!(!text.contains("dbservice_user_superuser_file") && !text.contains("dbservice_user_not_the_apps"), "{text}");
    assert!(!text.contains("dbservice_user_writes"), "read-only: {text}");
    assert_eq!(value(&text, "dbservice_postgres_scrape_errors"), Some(5.0), "{text}");
    // The agent's own families are still there.
    assert_eq!(value(&text, "dbservice_postgres_up"), Some(1.0), "{text}");
    cluster.shutdown().await;
}

/// The conditions of the chart's alerts `DBServiceArchivingFailing` and
/// `DBServiceReplicationBroken` (files/database-alerts.yaml), caused for real: archiving that
/// fails sets `dbservice_postgres_last_archive_failed` on the primary, and a standby whose primary
/// is gone reports `dbservice_postgres_wal_receiver_streaming 0` (with `primary 0`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_archiving_and_broken_replication_show_as_the_alerts_conditions() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let settings = dbservice_operator::api::failover::FailoverSettings::default();
    let mut cluster = Cluster::start_with_server_settings(
        pg_bin,
        &["db-0", "db-1"],
        settings,
        &[("archive_mode", "on"), ("archive_command", "false")],
    )
    .await;
    cluster.wait_streaming("db-1").await;
    let port = cluster.port("db-0");
    loopback::query(port, "CREATE TABLE filler AS SELECT 1 AS n").await.unwrap();
    loopback::query(port, "SELECT pg_switch_wal()::text").await.unwrap();
    let primary = cluster.config("db-0");
    let failed = async || {
        let text = scrape(router(primary.clone())).await;
        value(&text, "dbservice_postgres_last_archive_failed") == Some(1.0)
            && value(&text, "dbservice_postgres_archive_failures_total").is_some_and(|failures| failures >= 1.0)
    };
    cluster.wait_for("the archiver to report its failure", std::time::Duration::from_secs(30), failed).await;

    // The operator makes no pass (no failover): the standby just loses its primary.
    cluster.world.lock().unwrap().operator_paused = true;
    cluster.kill_pod("db-0");
    let standby = cluster.config("db-1");
    let broken = async || {
        let text = scrape(router(standby.clone())).await;
        value(&text, "dbservice_postgres_primary") == Some(0.0)
            && value(&text, "dbservice_postgres_wal_receiver_streaming") == Some(0.0)
    };
    cluster.wait_for("the standby to report its broken stream", std::time::Duration::from_secs(30), broken).await;
    cluster.shutdown().await;
}
