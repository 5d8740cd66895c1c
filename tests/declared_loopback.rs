//! `spec.roles` and `spec.databases` (issue 23) with real PostgreSQL on loopback: the primary's
//! pass creates what is declared, puts drift back, rotates a password from its Secret, removes a
//! role only when `ensure: absent` says so (its objects handed to the application's role first),
//! drops a database only when `ensure: absent` says so, reports what it could not do, and a running
//! agent does all of it on the primary and publishes the outcome.

#[path = "support/loopback.rs"]
mod loopback;
#[path = "support/ports.rs"]
mod ports;

use dbservice_operator::api::roles::{
    DatabaseSpec, Declarations, DeclaredObjectsStatus, Ensure, ExtensionSpec, ObjectState, PasswordSecret, RoleSpec,
};
use dbservice_operator::instance::declared::keep_declared;
use dbservice_operator::instance::SecretReader;
use loopback::{login, Cluster, SUPERUSER};
use std::time::Duration;

fn role(name: &str) -> RoleSpec {
    RoleSpec { name: name.into(), ..Default::default() }
}

fn declarations() -> Declarations {
    Declarations {
        roles: vec![
            RoleSpec { login: Some(false), ..role("readers") },
            RoleSpec {
                connection_limit: Some(3),
                in_roles: vec!["readers".into(), "pg_read_all_stats".into()],
                password_secret: Some(PasswordSecret { name: "reporting-password".into(), key: None }),
                ..role("reporting")
            },
            RoleSpec { create_database: Some(true), ..role("etl") },
        ],
        databases: vec![
            DatabaseSpec {
                name: "analytics".into(),
                owner: Some("etl".into()),
                extensions: vec![ExtensionSpec { name: "pgcrypto".into(), ensure: None }],
                ..Default::default()
            },
            DatabaseSpec { name: "scratch".into(), ..Default::default() },
        ],
        application_user: SUPERUSER.into(),
        pooled_databases: Vec::new(),
    }
}

fn state(status: &DeclaredObjectsStatus, name: &str) -> (ObjectState, String) {
    let object = status.roles.iter().chain(&status.databases).find(|object| object.name == name).expect(name);
    (object.state, object.message.clone().unwrap_or_default())
}

fn all_as_declared(status: &DeclaredObjectsStatus) -> bool {
    status.roles.iter().chain(&status.databases).all(|object| object.state != ObjectState::Failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_roles_and_databases_are_made_kept_rotated_and_removed_only_when_absent() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, &["db-0"]).await;
    let port = cluster.port("db-0");
    let config = cluster.config("db-0");
    let first_password = "first 'pass\\word";
    let secrets = SecretReader::fixed([("reporting-password", "password", first_password)]);
    let wanted = declarations();

    let status = keep_declared(&config, &wanted, &secrets).await;
    assert!(all_as_declared(&status), "{status:?}");
    assert_eq!(status.declarations.as_deref(), Some(wanted.fingerprint().as_str()));
    let reporting = login(port, "reporting", first_password, "analytics").await.expect("the declared password");
    let facts = "SELECT r.rolconnlimit::text || ',' || pg_has_role('reporting', 'readers', 'MEMBER')::text || ','
        || pg_has_role('reporting', 'pg_read_all_stats', 'MEMBER')::text || ',' || r.rolsuper::text
        || ',' || (SELECT rolcanlogin::text FROM pg_roles WHERE rolname = 'readers')
        || ',' || (SELECT rolcreatedb::text FROM pg_roles WHERE rolname = 'etl')
        || ',' || (SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'analytics')
        FROM pg_roles r WHERE r.rolname = 'reporting'";
    let expected = "3,true,true,false,false,true,etl";
    assert_eq!(cluster.scalar(port, facts).await, expected);
    assert_eq!(
        cluster.scalar(port, "SELECT count(*)::text FROM pg_database WHERE datname IN ('analytics', 'scratch')").await,
        "2"
    );
    let extension = reporting.query_one("SELECT extname::text FROM pg_extension WHERE extname = 'pgcrypto'", &[]).await;
    assert!(extension.is_ok(), "pgcrypto made in analytics: {extension:?}");
    drop(reporting);

    // Someone with superuser access changes things by hand: the next pass puts them back.
    let superuser = loopback::query;
    superuser(port, "ALTER ROLE reporting CONNECTION LIMIT 50 SUPERUSER").await.unwrap();
    superuser(port, "REVOKE readers FROM reporting").await.unwrap();
    superuser(port, "GRANT etl TO reporting").await.unwrap();
    superuser(port, &format!("ALTER DATABASE analytics OWNER TO {SUPERUSER}")).await.unwrap();
    let status = keep_declared(&config, &wanted, &secrets).await;
    assert!(all_as_declared(&status), "{status:?}");
    assert_eq!(cluster.scalar(port, facts).await, expected);
    assert_eq!(cluster.scalar(port, "SELECT pg_has_role('reporting', 'etl', 'MEMBER')::text").await, "false");

    // The Secret rotated: the new password works, the old one no longer does. Unchanged, the
    // password is not set again (the verifier and its salt stay).
    let verifier = "SELECT rolpassword FROM pg_authid WHERE rolname = 'reporting'";
    let before = cluster.scalar(port, verifier).await;
    keep_declared(&config, &wanted, &secrets).await;
    assert_eq!(cluster.scalar(port, verifier).await, before, "an unchanged password is not set again");
    let rotated = SecretReader::fixed([("reporting-password", "password", "second-password")]);
    let status = keep_declared(&config, &wanted, &rotated).await;
    assert!(all_as_declared(&status), "{status:?}");
    login(port, "reporting", "second-password", "postgres").await.expect("the rotated password");
    let old = login(port, "reporting", first_password, "postgres").await.expect_err("the old password");
    assert!(old.contains("password authentication failed"), "{old}");

    // A Secret that lost its key: the role is reported, its password left as it is, the rest kept.
    let status = keep_declared(&config, &wanted, &SecretReader::default()).await;
    let (reporting_state, message) = state(&status, "reporting");
    assert_eq!(reporting_state, ObjectState::Failed, "{status:?}");
    assert!(message.contains("reporting-password") && !message.contains("second-password"), "{message}");
    assert_eq!(state(&status, "analytics").0, ObjectState::Present);
    login(port, "reporting", "second-password", "postgres").await.expect("the password is left as it was");

    // An extension the image does not have: that database fails with why, the others do not.
    let mut missing_extension = wanted.clone();
    missing_extension.databases[1].extensions = vec![ExtensionSpec { name: "no_such_extension".into(), ensure: None }];
    let status = keep_declared(&config, &missing_extension, &rotated).await;
    let (scratch_state, message) = state(&status, "scratch");
    assert_eq!(scratch_state, ObjectState::Failed, "{status:?}");
    assert!(message.contains("no_such_extension"), "{message}");
    assert_eq!(state(&status, "analytics").0, ObjectState::Present);

    // A role removed from the spec is left alone; `ensure: absent` removes it, its table going
    // to the application's role with its rows. A database removed from the spec stays;
    // `ensure: absent` drops it.
    for sql in [
        "CREATE TABLE etl_owned (n int)",
        "INSERT INTO etl_owned VALUES (1), (2)",
        "ALTER TABLE etl_owned OWNER TO etl",
    ] {
        superuser(port, sql).await.unwrap();
    }
    let mut fewer = wanted.clone();
    fewer.databases[0].owner = None;
    fewer.roles.retain(|role| role.name != "readers");
    fewer.databases.retain(|database| database.name != "scratch");
    keep_declared(&config, &fewer, &rotated).await;
    assert_eq!(cluster.scalar(port, "SELECT count(*)::text FROM pg_roles WHERE rolname = 'readers'").await, "1");
    assert_eq!(cluster.scalar(port, "SELECT count(*)::text FROM pg_database WHERE datname = 'scratch'").await, "1");
    let mut absent = fewer.clone();
    absent.roles.retain(|role| role.name != "etl");
    absent.roles.push(RoleSpec { ensure: Some(Ensure::Absent), ..role("etl") });
    absent.databases.push(DatabaseSpec { name: "scratch".into(), ensure: Some(Ensure::Absent), ..Default::default() });
    let status = keep_declared(&config, &absent, &rotated).await;
    assert!(all_as_declared(&status), "{status:?}");
    assert_eq!(state(&status, "etl").0, ObjectState::Absent);
    assert_eq!(cluster.scalar(port, "SELECT count(*)::text FROM pg_roles WHERE rolname = 'etl'").await, "0");
    assert_eq!(cluster.scalar(port, "SELECT count(*)::text FROM pg_database WHERE datname = 'scratch'").await, "0");
    assert_eq!(
        cluster.scalar(port, "SELECT pg_get_userbyid(relowner)::text || ',' || (SELECT count(*) FROM etl_owned)::text FROM pg_class WHERE relname = 'etl_owned'").await,
        format!("{SUPERUSER},2")
    );
    assert_eq!(
        cluster.scalar(port, "SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = 'analytics'").await,
        SUPERUSER
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primarys_agent_keeps_the_declarations_and_publishes_them_and_standbys_get_them_by_replication() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, &["db-0", "db-1"]).await;
    {
        let mut world = cluster.world.lock().unwrap();
        // The agents share the world's table: set, not replaced.
        world.secrets.set("reporting-password", "password", "agent-password");
        world.declarations = Some(declarations());
    }
    let world = cluster.world.clone();
    cluster
        .wait_for("the primary's agent to publish its pass", Duration::from_secs(60), async || {
            let world = world.lock().unwrap();
            world.reports.get("db-0").and_then(|report| report.declared.as_ref()).is_some_and(|status| {
                status.declarations.as_deref() == Some(declarations().fingerprint().as_str()) && all_as_declared(status)
            })
        })
        .await;
    assert!(
        world.lock().unwrap().reports.get("db-1").is_some_and(|report| report.declared.is_none()),
        "a standby publishes no pass"
    );
    login(cluster.port("db-0"), "reporting", "agent-password", "analytics").await.expect("the primary has the role");
    let standby = cluster.port("db-1");
    cluster
        .wait_for("the standby to replay the role", Duration::from_secs(30), async || {
            login(standby, "reporting", "agent-password", "analytics").await.is_ok()
        })
        .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pooler_role_looks_up_login_roles_but_never_a_superuser_and_nobody_else_may() {
    use dbservice_operator::api::pooler::{AUTH_PASSWORD_KEY, POOLER_ROLE};
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, &["db-0"]).await;
    let port = cluster.port("db-0");
    let config = cluster.config("db-0");
    let pooler = RoleSpec {
        password_secret: Some(PasswordSecret { name: "orders-pooler".into(), key: Some(AUTH_PASSWORD_KEY.into()) }),
        ..role(POOLER_ROLE)
    };
    let application = RoleSpec {
        password_secret: Some(PasswordSecret { name: "application".into(), key: None }),
        ..role("application")
    };
    let wanted = Declarations {
        roles: vec![application, pooler],
        databases: vec![],
        application_user: SUPERUSER.into(),
        pooled_databases: vec!["postgres".into()],
    };
    let secrets = SecretReader::fixed([
        ("orders-pooler", AUTH_PASSWORD_KEY, "pooler-password"),
        ("application", "password", "application-password"),
    ]);
    let status = keep_declared(&config, &wanted, &secrets).await;
    assert!(all_as_declared(&status), "{status:?}");

    let lookup = "SELECT coalesce(string_agg(usename || ':' || left(passwd, 14), ','), 'none') \
        FROM dbservice_pooler.user_password($1)";
    let pooler = login(port, POOLER_ROLE, "pooler-password", "postgres").await.expect("the pooler role logs in");
    let found = |role: &'static str| {
        let pooler = &pooler;
        async move { pooler.query_one(lookup, &[&role]).await.unwrap().get::<_, String>(0) }
    };
    assert_eq!(found("application").await, "application:SCRAM-SHA-256$");
    assert_eq!(found(SUPERUSER).await, "none", "never a superuser");
    // No row at all, not a row of NULLs: PgBouncer answers a NULL row with "bouncer config
    // error" instead of an authentication failure.
    let rows = "SELECT count(*) FROM dbservice_pooler.user_password($1)";
    let count: i64 = pooler.query_one(rows, &[&SUPERUSER]).await.unwrap().get(0);
    assert_eq!(count, 0, "the superuser's lookup returns no row");
    assert_eq!(found(POOLER_ROLE).await, "none", "not itself");
    assert_eq!(found("replicator").await, "none");
    let catalog = pooler.query_one("SELECT count(*) FROM pg_authid", &[]).await.expect_err("no catalog access");
    assert!(catalog.to_string().contains("permission denied") || format!("{catalog:?}").contains("permission denied"));
    let application = login(port, "application", "application-password", "postgres").await.unwrap();
    let refused = application.query_one(lookup, &[&"application"]).await.expect_err("only the pooler role");
    assert!(format!("{refused:?}").contains("permission denied"), "{refused:?}");

    // Kept as made: a second pass writes nothing (the function's row is the same version).
    let version = "SELECT p.xmin::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
        WHERE n.nspname = 'dbservice_pooler'";
    let before = cluster.scalar(port, version).await;
    let status = keep_declared(&config, &wanted, &secrets).await;
    assert!(all_as_declared(&status), "{status:?}");
    assert_eq!(cluster.scalar(port, version).await, before);
    // Someone opened it to everyone: put back.
    loopback::query(port, "GRANT EXECUTE ON FUNCTION dbservice_pooler.user_password(text) TO PUBLIC").await.unwrap();
    keep_declared(&config, &wanted, &secrets).await;
    let refused = application.query_one(lookup, &[&"application"]).await.expect_err("closed again");
    assert!(format!("{refused:?}").contains("permission denied"), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_schema_the_application_made_first_is_replaced_by_the_superusers() {
    use dbservice_operator::api::pooler::{AUTH_PASSWORD_KEY, POOLER_ROLE};
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, &["db-0"]).await;
    let port = cluster.port("db-0");
    let config = cluster.config("db-0");
    for sql in
        ["CREATE ROLE application LOGIN PASSWORD 'application-password'", "CREATE DATABASE orders OWNER application"]
    {
        loopback::query(port, sql).await.unwrap();
    }
    // The application owns its database: it makes the schema before the pooler reaches it, with
    // a user_password as made but its own, answering a verifier of its choosing.
    let application = login(port, "application", "application-password", "orders").await.unwrap();
    let impostor = "CREATE SCHEMA dbservice_pooler; \
        CREATE FUNCTION dbservice_pooler.user_password(role_name text, OUT usename name, OUT passwd text) \
        RETURNS record LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp \
        AS $f$ SELECT role_name::name, 'chosen-by-the-application'::text $f$";
    application.batch_execute(impostor).await.unwrap();

    let pooler = RoleSpec {
        password_secret: Some(PasswordSecret { name: "orders-pooler".into(), key: Some(AUTH_PASSWORD_KEY.into()) }),
        ..role(POOLER_ROLE)
    };
    let wanted = Declarations {
        roles: vec![pooler],
        databases: vec![],
        application_user: SUPERUSER.into(),
        pooled_databases: vec!["orders".into()],
    };
    let secrets = SecretReader::fixed([("orders-pooler", AUTH_PASSWORD_KEY, "pooler-password")]);
    let status = keep_declared(&config, &wanted, &secrets).await;
    assert!(all_as_declared(&status), "{status:?}");

    let superuser = login(port, SUPERUSER, loopback::PASSWORD, "orders").await.unwrap();
    let owners = "SELECT pg_get_userbyid(n.nspowner)::text || ',' || pg_get_userbyid(p.proowner)::text \
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'dbservice_pooler'";
    let rows = superuser.query(owners, &[]).await.unwrap();
    let owners: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(owners, [format!("{SUPERUSER},{SUPERUSER}")], "the schema and its one function are the superuser's");
    let pooler = login(port, POOLER_ROLE, "pooler-password", "orders").await.expect("the pooler role logs in");
    let lookup = "SELECT passwd FROM dbservice_pooler.user_password('application')";
    let verifier: String = pooler.query_one(lookup, &[]).await.unwrap().get(0);
    assert!(verifier.starts_with("SCRAM-SHA-256$"), "the server's verifier, not the application's: {verifier}");
    let refused = application.batch_execute("DROP FUNCTION dbservice_pooler.user_password(text)").await;
    assert!(refused.is_err(), "the application cannot replace it now");

    // Kept as made: a second pass writes nothing.
    let version = "SELECT p.xmin::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
        WHERE n.nspname = 'dbservice_pooler'";
    let before: String = superuser.query_one(version, &[]).await.unwrap().get(0);
    let status = keep_declared(&config, &wanted, &secrets).await;
    assert!(all_as_declared(&status), "{status:?}");
    assert_eq!(superuser.query_one(version, &[]).await.unwrap().get::<_, String>(0), before);
}
