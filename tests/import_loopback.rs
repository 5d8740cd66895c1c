//! `spec.bootstrap.import` (issue 24) with real PostgreSQL on loopback: the primary's agent of a
//! new cluster copies a database from another server with pg_dump | pg_restore, once; a wrong
//! password is reported with the tool's words (never the password) and retried until the Secret
//! is right; standbys get the imported rows by replication.

#[path = "support/loopback.rs"]
mod loopback;
#[path = "support/ports.rs"]
mod ports;

use dbservice_operator::api::import::{ImportPhase, ImportSource, ImportSpec, ImportStatus};
use dbservice_operator::api::roles::PasswordSecret;
use dbservice_operator::instance::import::{progress, PROGRESS_FILE};
use loopback::{query, Cluster, PASSWORD, SUPERUSER};
use std::time::Duration;

const ROWS: i64 = 5000;

fn report_is_ready(world: &loopback::World, name: &str) -> bool {
    world.reports.get(name).is_some_and(|report| report.postgres_ready)
}

/// The database `shop` of the loopback server on `port`, password from Secret `legacy`.
fn import_of_shop(port: u16, roles: Option<bool>) -> ImportSpec {
    ImportSpec {
        source: ImportSource {
            host: "127.0.0.1".into(),
            port: Some(i32::from(port)),
            username: SUPERUSER.into(),
            password_secret: PasswordSecret { name: "legacy".into(), key: None },
            ssl_mode: Some("disable".into()),
        },
        databases: vec!["shop".into()],
        roles,
    }
}

async fn import_status(cluster: &Cluster, phase: ImportPhase, limit: Duration) -> ImportStatus {
    let world = cluster.world.clone();
    cluster
        .wait_for(&format!("the import {phase:?}"), limit, async || {
            let world = world.lock().unwrap();
            world
                .reports
                .get("db-0")
                .and_then(|report| report.import.as_ref())
                .is_some_and(|status| status.phase == phase)
        })
        .await;
    let world = world.lock().unwrap();
    world.reports["db-0"].import.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_is_imported_once_after_a_refused_password_is_corrected() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let source = Cluster::start(pg_bin.clone(), &["src-0"]).await;
    let source_port = source.port("src-0");
    query(source_port, "CREATE DATABASE shop").await.unwrap();
    let shop = format!("{} dbname=shop", loopback::conninfo(source_port));
    let (client, connection) = tokio_postgres::connect(&shop, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "CREATE TABLE orders (id bigint PRIMARY KEY, item text NOT NULL);
             INSERT INTO orders SELECT i, 'item ' || i FROM generate_series(1, {ROWS}) i;
             CREATE INDEX orders_item ON orders (item);
             CREATE VIEW big_orders AS SELECT * FROM orders WHERE id > 100;"
        ))
        .await
        .unwrap();

    let target = Cluster::start(pg_bin, &["db-0", "db-1"]).await;
    let wrong_password = "not-the-password";
    {
        let mut world = target.world.lock().unwrap();
        world.secrets.set("legacy", "password", wrong_password);
        world.import = Some(import_of_shop(source_port, None));
    }
    let failed = import_status(&target, ImportPhase::Failed, Duration::from_secs(60)).await;
    let message = failed.message.clone().unwrap_or_default();
    assert!(message.contains("password authentication failed"), "{failed:?}");
    assert!(!message.contains(wrong_password), "the message must not carry the password: {message}");
    assert!(!progress(&target.pgdata("db-0")).1);

    target.world.lock().unwrap().secrets.set("legacy", "password", PASSWORD);
    let completed = import_status(&target, ImportPhase::Completed, Duration::from_secs(120)).await;
    assert!(completed.attempts >= 2, "{completed:?}");
    assert_eq!(completed.databases.len(), 1, "{completed:?}");
    assert!(completed.source_version.is_some(), "{completed:?}");
    let imported = format!("{} dbname=shop", loopback::conninfo(target.port("db-0")));
    let (client, connection) = tokio_postgres::connect(&imported, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let count: i64 = client.query_one("SELECT count(*) FROM big_orders", &[]).await.unwrap().get(0);
    assert_eq!(count, ROWS - 100);
    let indexed: i64 =
        client.query_one("SELECT count(*) FROM pg_indexes WHERE indexname = 'orders_item'", &[]).await.unwrap().get(0);
    assert_eq!(indexed, 1);
    let (done, complete) = progress(&target.pgdata("db-0"));
    assert_eq!((done, complete), (vec!["shop".to_string()], true));
    eprintln!("FIGURES import: {ROWS} rows in {} ms ({completed:?})", completed.databases[0].milliseconds);

    // Never twice: new rows at the source stay there.
    query(source_port, "SELECT 1").await.unwrap();
    let (source_client, connection) = tokio_postgres::connect(&shop, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    source_client.batch_execute("INSERT INTO orders VALUES (0, 'late')").await.unwrap();
    let standby = format!("{} dbname=shop", loopback::conninfo(target.port("db-1")));
    let world = target.world.clone();
    target
        .wait_for("the standby to have the imported rows", Duration::from_secs(60), async || {
            let Ok((client, connection)) = tokio_postgres::connect(&standby, tokio_postgres::NoTls).await else {
                return false;
            };
            tokio::spawn(connection);
            client.query_one("SELECT count(*) FROM orders", &[]).await.is_ok_and(|row| row.get::<_, i64>(0) == ROWS)
        })
        .await;
    assert_eq!(
        world.lock().unwrap().reports["db-0"].import.as_ref().map(|status| status.phase),
        Some(ImportPhase::Completed)
    );
    let count: i64 = client.query_one("SELECT count(*) FROM orders", &[]).await.unwrap().get(0);
    assert_eq!(count, ROWS, "imported once");

    // A primary without the record (a standby promoted, or a lost file) finds the objects and
    // does not restore again: the rows stay as they were, the late source row stays away.
    let mut target = target;
    target.delete_pod("db-0").await;
    std::fs::remove_file(target.pgdata("db-0").join(PROGRESS_FILE)).unwrap();
    target.recreate_pod("db-0");
    let world = target.world.clone();
    target
        .wait_for("a primary to report the import completed again", Duration::from_secs(120), async || {
            let world = world.lock().unwrap();
            let Some(primary) = world.status.current_primary.clone() else { return false };
            world
                .reports
                .get(&primary)
                .and_then(|report| report.import.as_ref())
                .is_some_and(|status| status.phase == ImportPhase::Completed && report_is_ready(&world, &primary))
        })
        .await;
    let primary = world.lock().unwrap().status.current_primary.clone().unwrap();
    let on_primary = format!("{} dbname=shop", loopback::conninfo(target.port(&primary)));
    let (client, connection) = tokio_postgres::connect(&on_primary, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let count: i64 = client.query_one("SELECT count(*) FROM orders", &[]).await.unwrap().get(0);
    assert_eq!(count, ROWS, "never imported twice (primary {primary})");
    assert!(progress(&target.pgdata(&primary)).1, "the new primary recorded the import");
    target.shutdown().await;
    source.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sources_roles_come_along_without_superuser_and_objects_keep_their_owners_and_grants() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let source = Cluster::start(pg_bin.clone(), &["src-0"]).await;
    let source_port = source.port("src-0");
    for statement in [
        "CREATE ROLE readers NOLOGIN",
        "CREATE ROLE reporting LOGIN CONNECTION LIMIT 3 IN ROLE readers",
        "CREATE ROLE boss SUPERUSER LOGIN",
        "CREATE DATABASE shop",
    ] {
        query(source_port, statement).await.unwrap();
    }
    let shop = format!("{} dbname=shop", loopback::conninfo(source_port));
    let (client, connection) = tokio_postgres::connect(&shop, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY); INSERT INTO orders SELECT generate_series(1, 10);
             ALTER TABLE orders OWNER TO reporting; GRANT SELECT ON orders TO readers;",
        )
        .await
        .unwrap();

    let target = Cluster::start(pg_bin, &["db-0"]).await;
    {
        let mut world = target.world.lock().unwrap();
        world.secrets.set("legacy", "password", PASSWORD);
        world.import = Some(import_of_shop(source_port, Some(true)));
    }
    let completed = import_status(&target, ImportPhase::Completed, Duration::from_secs(120)).await;
    assert_eq!(completed.roles_created, Some(3), "boss, readers and reporting: {completed:?}");
    let port = target.port("db-0");
    let scalar = |sql: &'static str| {
        let target = &target;
        async move { target.scalar(port, sql).await }
    };
    assert_eq!(scalar("SELECT rolsuper::text FROM pg_roles WHERE rolname = 'boss'").await, "false");
    assert_eq!(scalar("SELECT rolconnlimit::text FROM pg_roles WHERE rolname = 'reporting'").await, "3");
    assert_eq!(scalar("SELECT pg_has_role('reporting', 'readers', 'member')::text").await, "true");
    let imported = format!("{} dbname=shop", loopback::conninfo(port));
    let (client, connection) = tokio_postgres::connect(&imported, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT tableowner::text, has_table_privilege('readers', 'orders', 'SELECT'), (SELECT count(*) FROM orders) \
             FROM pg_tables WHERE tablename = 'orders'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "reporting", "the owner is kept");
    assert!(row.get::<_, bool>(1), "the grant is kept");
    assert_eq!(row.get::<_, i64>(2), 10);
    target.shutdown().await;
    source.shutdown().await;
}

/// Without roles the application's role restores as itself (not the superuser with --role, which
/// code in the dump could undo): here it is no superuser, and owns what was imported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_roles_the_application_role_restores_as_itself() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let source = Cluster::start(pg_bin.clone(), &["src-0"]).await;
    let source_port = source.port("src-0");
    query(source_port, "CREATE DATABASE shop").await.unwrap();
    let shop = format!("{} dbname=shop", loopback::conninfo(source_port));
    let (client, connection) = tokio_postgres::connect(&shop, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        // The rows pass their CHECK only in a session whose login is the role at work: what a
        // dump's code could exploit (SET ROLE back to a superuser login) is what this sees.
        .batch_execute(
            "CREATE FUNCTION restored_as_itself() RETURNS boolean LANGUAGE sql AS 'SELECT session_user = current_user';
             CREATE TABLE orders (id bigint PRIMARY KEY CHECK (restored_as_itself()));
             INSERT INTO orders VALUES (1), (2);",
        )
        .await
        .unwrap();

    let settings = dbservice_operator::instance::roles::RoleSettings {
        application_user: SUPERUSER.into(),
        application_password: PASSWORD.into(),
        database: "postgres".into(),
        superuser_password: "superuser-password".into(),
        superuser_network_access: false,
    };
    let target = Cluster::start_with_agents(pg_bin, &["db-0"], Default::default(), &[], |config| {
        config.superuser = "postgres".into();
        config.roles = Some(settings.clone());
    })
    .await;
    {
        let mut world = target.world.lock().unwrap();
        world.secrets.set("legacy", "password", PASSWORD);
        world.import = Some(import_of_shop(source_port, None));
    }
    import_status(&target, ImportPhase::Completed, Duration::from_secs(120)).await;
    let imported = format!("{} dbname=shop", loopback::conninfo(target.port("db-0")));
    let (client, connection) = tokio_postgres::connect(&imported, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT tableowner::text, (SELECT rolsuper FROM pg_roles WHERE rolname = tableowner), \
             (SELECT count(*) FROM orders) FROM pg_tables WHERE tablename = 'orders'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), SUPERUSER, "owned by the application's role");
    assert!(!row.get::<_, bool>(1), "which is no superuser here");
    assert_eq!(row.get::<_, i64>(2), 2);
    target.shutdown().await;
    source.shutdown().await;
}
