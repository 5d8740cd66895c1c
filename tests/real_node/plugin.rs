//! The `kubectl dbservice` verbs that touch PostgreSQL, on real pods: `psql` into the primary, a
//! standby and as the superuser, `logs` of every instance prefixed, `switchover` carried out by the
//! operator, a rolling `restart` (the standby before the primary) and a `reload` (every instance
//! reads its files again), and `report` with the instances' logs and no value of the database's
//! Secrets.

use crate::environment::{
    admin_client, install_chart, password_of, real_database, real_namespace, real_node_or_skip, wait_running,
};
use crate::support::{admin_kubeconfig, eventually, tool};
use dbservice_operator::api::database_service::DatabaseService;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use std::process::Output;
use std::time::Duration;

fn verb(arguments: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_dbservice-operator"))
        .args(arguments)
        .env("KUBECONFIG", admin_kubeconfig().expect("cluster"))
        .env("DBSERVICE_KUBECTL", tool("kubectl"))
        .output()
        .expect("the binary runs")
}

fn succeeded(output: &Output) -> String {
    assert!(output.status.success(), "failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).to_string()
}

#[tokio::test]
async fn psql_logs_switchover_restart_reload_and_report_work_on_real_pods() {
    let Some(node) = real_node_or_skip("psql_logs_switchover_restart_reload_and_report_work_on_real_pods") else {
        return;
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "plugin").await;
    let ns = namespace.name.as_str();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    databases.create(&PostParams::default(), &real_database(node, "pg", 2, "Delete")).await.unwrap();
    wait_running(&client, ns, "pg", 2, Duration::from_secs(300)).await;

    let sql = "select current_user, pg_is_in_recovery()";
    let primary = succeeded(&verb(&["psql", "pg", "-n", ns, "--", "-Atc", sql]));
    assert_eq!(primary.trim(), "app_user|f", "the primary, as the application");
    let standby = succeeded(&verb(&["psql", "pg", "-n", ns, "--standby", "--", "-Atc", sql]));
    assert_eq!(standby.trim(), "app_user|t", "a standby");
    let superuser = succeeded(&verb(&["psql", "pg", "-n", ns, "--superuser", "--", "-Atc", sql]));
    assert_eq!(superuser.trim(), "postgres|f", "the superuser over the local socket");

    let logs = succeeded(&verb(&["logs", "pg", "-n", ns, "--tail", "50"]));
    for pod in ["pg-0", "pg-1"] {
        assert!(
            logs.lines().any(|line| line.starts_with(&format!("[pod/{pod}/postgres] "))),
            "{pod}'s lines in:\n{logs}"
        );
    }

    let status = databases.get("pg").await.unwrap().status.unwrap();
    let old = status.failover.current_primary.clone().expect("a primary");
    let target = if old == "pg-0" { "pg-1" } else { "pg-0" };
    succeeded(&verb(&["switchover", "pg", target, "-n", ns]));
    eventually(&format!("{target} primary after the verb's switchover"), Duration::from_secs(120), || async {
        let status = databases.get("pg").await.ok()?.status?;
        (status.failover.current_primary.as_deref() == Some(target) && status.ready_replicas == 2).then_some(())
    })
    .await;
    let after = succeeded(&verb(&["psql", "pg", "-n", ns, "--", "-Atc", "select pg_is_in_recovery()"]));
    assert_eq!(after.trim(), "f", "psql follows the new primary");

    // A rolling restart: every pod replaced, the standby before the primary (which is switched
    // away from first); then a reload: every instance reads its files again, nothing restarts.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let uids =
        |listed: &[Pod]| listed.iter().map(|pod| (pod.name_any(), pod.uid().unwrap_or_default())).collect::<Vec<_>>();
    let before = uids(&pods.list(&ListParams::default().labels("app.kubernetes.io/instance=pg")).await.unwrap().items);
    let primary = databases.get("pg").await.unwrap().status.unwrap().failover.current_primary.unwrap();
    let restarted = succeeded(&verb(&["restart", "pg", "-n", ns, "--wait", "--wait-seconds", "300"]));
    assert!(restarted.contains("rolling restart of"), "{restarted}");
    let after = pods.list(&ListParams::default().labels("app.kubernetes.io/instance=pg")).await.unwrap().items;
    for (name, uid) in &before {
        let now = after.iter().find(|pod| &pod.name_any() == name).expect("the pod is back");
        assert_ne!(now.uid().as_ref(), Some(uid), "{name} was replaced");
    }
    let created = |name: &str| after.iter().find(|pod| pod.name_any() == name).unwrap().creation_timestamp().unwrap();
    let standby = if primary == "pg-0" { "pg-1" } else { "pg-0" };
    assert!(created(standby) < created(&primary), "the standby {standby} restarted before the primary {primary}");
    let loaded = "select pg_conf_load_time()";
    let load_times = |instance: &'static str| {
        succeeded(&verb(&["psql", "pg", "-n", ns, "--instance", instance, "--superuser", "--", "-Atc", loaded]))
    };
    let (zero, one) = (load_times("0"), load_times("1"));
    let reloaded = succeeded(&verb(&["reload", "pg", "-n", ns, "--wait", "--wait-seconds", "120"]));
    assert!(reloaded.contains("reload of"), "{reloaded}");
    assert!(load_times("0") != zero && load_times("1") != one, "both instances read their files again");

    let bundle = succeeded(&verb(&["report", "pg", "-n", ns]));
    assert!(bundle.contains("RestartRequested") && bundle.contains("Reloaded"), "the requests are in the Events");
    assert!(bundle.contains("[pg-0/postgres] ") && bundle.contains("[pg-1/postgres] "), "the instances' logs");
    assert!(bundle.contains("SwitchoverCompleted"), "the switchover is in the Events");
    let password = password_of(&client, ns, "pg").await;
    assert!(!bundle.contains(&password), "the application's password is not in the report");
}
