//! The superuser and the application's role (issue 22) with real PostgreSQL on loopback: a
//! database made when the application's role was the superuser (the bootstrap role) is migrated
//! by the instance agent's `keep_roles`, keeping the application's data, ownership and password,
//! and the application can then no longer do what only a superuser may.

#[path = "support/loopback.rs"]
mod loopback;
#[path = "support/ports.rs"]
mod ports;

use dbservice_operator::instance::roles::{keep_roles, RoleSettings, MIGRATION_ROLE};
use dbservice_operator::instance::InstanceConfig;
use loopback::{Cluster, PASSWORD, SUPERUSER};
use std::time::Duration;

const SUPERUSER_PASSWORD: &str = "superuser 'secret";

fn settings() -> RoleSettings {
    RoleSettings {
        application_user: SUPERUSER.into(),
        // As the credentials Secret holds it: the password the role already has.
        application_password: PASSWORD.into(),
        database: "shop".into(),
        superuser_password: SUPERUSER_PASSWORD.into(),
        superuser_network_access: false,
    }
}

/// A client over TCP with a password, as an application connects.
async fn connect(port: u16, user: &str, password: &str, database: &str) -> Result<tokio_postgres::Client, String> {
    loopback::login(port, user, password, database).await
}

/// A client over the unix socket (trust), as the agent and `kubectl exec` connect.
async fn connect_locally(config: &InstanceConfig, user: &str, database: &str) -> tokio_postgres::Client {
    let mut pg_config = tokio_postgres::Config::new();
    pg_config.host_path(&config.socket_dir).port(config.port).user(user).dbname(database);
    let (client, connection) = pg_config.connect(tokio_postgres::NoTls).await.expect("local connection");
    tokio::spawn(connection);
    client
}

fn message(error: &tokio_postgres::Error) -> String {
    error.as_db_error().map(|db| db.message().to_string()).unwrap_or_else(|| error.to_string())
}

async fn scalar(client: &tokio_postgres::Client, sql: &str) -> String {
    client.query_one(sql, &[]).await.unwrap_or_else(|error| panic!("{sql}: {}", message(&error))).get(0)
}

/// What the application may not do once it is an ordinary role: each must fail for lack of a
/// privilege (not for any other reason).
async fn assert_no_superuser_powers(client: &tokio_postgres::Client) {
    for sql in [
        "SELECT pg_read_file('/proc/self/environ')",
        "COPY (SELECT 1) TO PROGRAM 'id'",
        "CREATE TEMPORARY TABLE copied (line text); COPY copied FROM PROGRAM 'cat /proc/self/environ'",
        "ALTER SYSTEM SET synchronous_standby_names = ''",
        "CREATE EXTENSION file_fdw",
        "SET session_replication_role = replica",
    ] {
        let error = client.batch_execute(sql).await.expect_err(sql);
        let text = message(&error);
        assert!(text.contains("permission denied") || text.contains("must be superuser"), "{sql}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_whose_application_role_is_the_superuser_is_migrated_keeping_data_password_and_ownership() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    // Made as before issue 22: the application's role (SUPERUSER here) is the bootstrap superuser.
    let cluster = Cluster::start(pg_bin, &["db-0"]).await;
    let port = cluster.port("db-0");
    let legacy = connect(port, SUPERUSER, PASSWORD, "postgres").await.unwrap();
    legacy.batch_execute("CREATE DATABASE shop").await.unwrap();
    let shop = connect(port, SUPERUSER, PASSWORD, "shop").await.unwrap();
    shop.batch_execute(
        "CREATE SCHEMA sales;
         CREATE TABLE sales.orders (id serial PRIMARY KEY, item text NOT NULL);
         CREATE TABLE items (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text);
         CREATE SEQUENCE invoice_numbers;
         CREATE VIEW order_items AS SELECT item FROM sales.orders;
         CREATE TYPE state AS ENUM ('open', 'paid');
         CREATE DOMAIN positive AS integer CHECK (VALUE > 0);
         CREATE FUNCTION order_count() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM sales.orders';
         INSERT INTO sales.orders (item) VALUES ('tea'), ('coffee');",
    )
    .await
    .unwrap();
    let rolsuper = "SELECT rolsuper::text FROM pg_roles WHERE rolname = current_user";
    assert_eq!(scalar(&shop, rolsuper).await, "true", "made as before issue 22");
    drop((legacy, shop));

    let config = InstanceConfig { superuser: "postgres".into(), roles: Some(settings()), ..cluster.config("db-0") };
    let kept = keep_roles(&config, &settings()).await.expect("migration");
    assert!(kept.migrated, "{kept:?}");

    // The application logs in as before, with its password, and finds its data, now as an
    // ordinary role that owns what it made.
    let shop = connect(port, SUPERUSER, PASSWORD, "shop").await.expect("the application's password still works");
    assert_eq!(scalar(&shop, rolsuper).await, "false");
    assert_eq!(scalar(&shop, "SELECT order_count()::text").await, "2");
    shop.batch_execute(
        "INSERT INTO sales.orders (item) VALUES ('cake');
         INSERT INTO items (name) VALUES ('cup');
         SELECT nextval('invoice_numbers');
         ALTER TABLE sales.orders ADD COLUMN state state;
         CREATE TABLE after_migration (n positive)",
    )
    .await
    .unwrap_or_else(|error| panic!("the application's objects are its own: {}", message(&error)));
    let owners = "SELECT string_agg(DISTINCT owner, ',') FROM (
          SELECT datdba::regrole::text AS owner FROM pg_database WHERE datname = 'shop'
          UNION ALL SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'sales'
          UNION ALL SELECT relowner::regrole::text FROM pg_class WHERE relname IN ('orders', 'items', 'invoice_numbers', 'order_items', 'orders_id_seq')
          UNION ALL SELECT proowner::regrole::text FROM pg_proc WHERE proname = 'order_count'
          UNION ALL SELECT typowner::regrole::text FROM pg_type WHERE typname IN ('state', 'positive')) owners";
    assert_eq!(scalar(&shop, owners).await, SUPERUSER);
    assert_no_superuser_powers(&shop).await;

    // The bootstrap role is the superuser postgres now, with its own password; the migration's
    // temporary role is gone.
    let superuser = connect_locally(&config, "postgres", "postgres").await;
    assert_eq!(
        scalar(&superuser, "SELECT (oid = 10 AND rolsuper)::text FROM pg_roles WHERE rolname = 'postgres'").await,
        "true"
    );
    let leftover = format!("SELECT count(*)::text FROM pg_roles WHERE rolname = '{MIGRATION_ROLE}'");
    assert_eq!(scalar(&superuser, &leftover).await, "0");
    connect(port, "postgres", SUPERUSER_PASSWORD, "postgres").await.expect("the superuser's password is set");

    // Idempotent: a second run changes nothing.
    let again = keep_roles(&config, &settings()).await.expect("second run");
    assert!(!again.migrated && !again.superuser_taken_away, "{again:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_migrates_the_role_and_rejects_network_logins_as_the_superuser() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let settings = RoleSettings { database: "postgres".into(), ..settings() };
    let cluster = Cluster::start_with_agents(pg_bin, &["db-0"], Default::default(), &[], |config| {
        config.superuser = "postgres".into();
        config.roles = Some(settings.clone());
    })
    .await;
    let port = cluster.port("db-0");
    let migrated = async || {
        let Ok(client) = connect(port, SUPERUSER, PASSWORD, "postgres").await else { return false };
        client
            .query_one("SELECT NOT rolsuper FROM pg_roles WHERE rolname = current_user", &[])
            .await
            .is_ok_and(|row| row.get::<_, bool>(0))
    };
    cluster.wait_for("the agent to migrate the application role", Duration::from_secs(60), migrated).await;
    let application = connect(port, SUPERUSER, PASSWORD, "postgres").await.unwrap();
    assert_no_superuser_powers(&application).await;
    // The superuser logs in only through the socket: over the network it is rejected, even with
    // its password.
    let refused = connect(port, "postgres", SUPERUSER_PASSWORD, "postgres").await.expect_err("network superuser login");
    assert!(refused.contains("pg_hba.conf rejects connection"), "{refused}");
    let config = cluster.config("db-0");
    let superuser = connect_locally(&config, "postgres", "postgres").await;
    assert_eq!(scalar(&superuser, "SELECT rolsuper::text FROM pg_roles WHERE rolname = current_user").await, "true");
    // Made a superuser again by someone with superuser access: put back on the next primary start.
    superuser.batch_execute(&format!("ALTER ROLE {SUPERUSER} SUPERUSER")).await.unwrap();
    let kept = keep_roles(&config, &settings).await.unwrap();
    assert!(kept.superuser_taken_away && !kept.migrated, "{kept:?}");
    cluster.shutdown().await;
}
