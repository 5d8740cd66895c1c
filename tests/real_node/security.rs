//! Data-plane security (issue 22), as an attacker with the application's credentials would try
//! it: the application's role is no superuser, and the superuser cannot log in over the network
//! unless `spec.enableSuperuserAccess` allows it, and no password is in the server's environment.

use crate::environment::{
    admin_client, install_chart, psql, real_database, real_namespace, real_node_or_skip, wait_running, Target,
};
use crate::support::eventually;
use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use std::time::Duration;

/// What only a superuser may do; each must fail for lack of a privilege.
const ATTACKS: &[&str] = &[
    // The pod's environment and files (the object store's keys, the replication password).
    "select pg_read_file('/proc/self/environ')",
    // A program on the server (the pod's ServiceAccount token is one file away).
    "copy (select 1) to program 'id'",
    // Durability settings the operator owns.
    "alter system set synchronous_standby_names = ''",
    // An untrusted extension (reads server files).
    "create extension file_fdw",
    // Triggers and foreign keys off.
    "set session_replication_role = replica",
];

#[tokio::test]
async fn the_application_cannot_act_as_superuser_and_the_superuser_logs_in_only_when_allowed() {
    let Some(node) =
        real_node_or_skip("the_application_cannot_act_as_superuser_and_the_superuser_logs_in_only_when_allowed")
    else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "security").await;
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    databases.create(&PostParams::default(), &real_database(node, "pg", 1, "Delete")).await.unwrap();
    wait_running(&client, &namespace.name, "pg", 1, Duration::from_secs(240)).await;
    let as_application = async |sql: &str| psql(&client, node, &namespace.name, "pg", Target::Uri, sql).await;

    // Running says the pod is Ready; kube-proxy may program the Service a moment later (its
    // minimum sync period is a second): the first login is retried until the Service answers.
    let role = eventually("the application logs in with its Secret's uri", Duration::from_secs(30), || async {
        as_application(
            "select rolsuper::text || ',' || (select datdba::regrole::text from pg_database where datname = current_database()) \
             from pg_roles where rolname = current_user",
        )
        .await
        .ok()
    })
    .await;
    assert_eq!(role.trim(), "false,app_user", "an ordinary role that owns its database");
    as_application("create table orders (id int primary key); insert into orders values (1)")
        .await
        .expect("the owner creates tables in its database");
    for attack in ATTACKS {
        let log = as_application(attack).await.expect_err(attack);
        assert!(log.contains("permission denied") || log.contains("must be superuser"), "{attack}: {log}");
    }

    // No password is in the environment of any process of the container (they reach the pod as
    // files): the agent, the watchdog, the postmaster and its children, read as their own user.
    // (A backend's own /proc/self/environ, what a superuser session could read, shows its process
    // title over it.)
    let environment = crate::support::kubectl(&[
        "-n",
        &namespace.name,
        "exec",
        "pg-0",
        "-c",
        "postgres",
        "--",
        "sh",
        "-c",
        "for process in /proc/[0-9]*; do tr '\\0' '\\n' < $process/environ 2>/dev/null; done",
    ]);
    assert!(environment.matches("PGDATA=").count() >= 3, "the processes' environments were read: {environment}");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace.name);
    for (secret, key) in [("pg-credentials", "password"), ("pg-replication", "password"), ("pg-superuser", "password")]
    {
        let data = secrets.get(secret).await.unwrap().data.unwrap();
        let password = String::from_utf8(data[key].0.clone()).unwrap();
        assert!(!environment.contains(&password), "{secret} {key} is in PostgreSQL's environment");
    }

    // The superuser's own Secret: refused over the network by default.
    let refused =
        psql(&client, node, &namespace.name, "pg", Target::SuperuserUri, "select 1").await.expect_err("superuser");
    assert!(refused.contains("pg_hba.conf rejects connection"), "{refused}");
    // Allowed: the instance restarts with the rule gone, and the superuser logs in.
    let patch = serde_json::json!({"spec": {"enableSuperuserAccess": true}});
    databases.patch("pg", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let superuser = eventually("the superuser logs in over the network", Duration::from_secs(240), || async {
        psql(
            &client,
            node,
            &namespace.name,
            "pg",
            Target::SuperuserUri,
            "select rolsuper from pg_roles where rolname = current_user",
        )
        .await
        .ok()
    })
    .await;
    assert_eq!(superuser.trim(), "t");
    let orders = as_application("select count(*) from orders").await.expect("the application's data is kept");
    assert_eq!(orders.trim(), "1");
}
