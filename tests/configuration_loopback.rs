//! spec.postgresql applied by the agents with real PostgreSQL on loopback (issue 23): a
//! reload-only parameter reaches the primary and the standby without a restart, a restart-only
//! one is reported as pending a restart (the operator's rollout brings it), and the spec's
//! pg_hba rule lands after the operator's blocks.

#[path = "support/loopback.rs"]
mod loopback;
#[path = "support/ports.rs"]
mod ports;

use dbservice_operator::instance::ServerConfiguration;
use loopback::Cluster;
use std::time::Duration;

fn configuration(parameters: &[(&str, &str)], hba_rules: &[&str]) -> Option<ServerConfiguration> {
    Some(ServerConfiguration {
        parameters: parameters.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect(),
        hba_rules: hba_rules.iter().map(|rule| rule.to_string()).collect(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_reload_on_every_instance_and_restart_only_ones_are_reported_pending() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, &["db-0", "db-1"]).await;
    let postmasters = cluster.scalar(cluster.port("db-1"), "SELECT pg_postmaster_start_time()::text").await;

    cluster.world.lock().unwrap().configuration = configuration(
        &[("work_mem", "12MB"), ("log_min_duration_statement", "250ms")],
        &["host all all 10.99.0.0/16 reject"],
    );
    for name in ["db-0", "db-1"] {
        let port = cluster.port(name);
        cluster
            .wait_for(&format!("work_mem 12MB on {name}"), Duration::from_secs(30), async || {
                loopback::query(port, "SHOW work_mem")
                    .await
                    .ok()
                    .is_some_and(|rows| rows[0].get::<_, String>(0) == "12MB")
            })
            .await;
        let rule =
            "SELECT count(*)::text FROM pg_hba_file_rules WHERE address = '10.99.0.0' AND auth_method = 'reject'";
        assert_eq!(cluster.scalar(port, rule).await, "1", "{name} has the spec's rule");
    }
    assert_eq!(cluster.scalar(cluster.port("db-1"), "SHOW log_min_duration_statement").await, "250ms");
    let now = cluster.scalar(cluster.port("db-1"), "SELECT pg_postmaster_start_time()::text").await;
    assert_eq!(now, postmasters, "a reload-only change restarted the standby");

    // A restart-only setting waits for the rollout, and the agents say so.
    cluster.world.lock().unwrap().configuration =
        configuration(&[("work_mem", "12MB"), ("max_connections", "90")], &[]);
    cluster
        .wait_for("max_connections reported pending a restart by both", Duration::from_secs(30), async || {
            let world = cluster.world.lock().unwrap();
            ["db-0", "db-1"].iter().all(|name| {
                world.reports.get(*name).is_some_and(|report| report.pending_restart == ["max_connections"])
            })
        })
        .await;
    let removed = "SELECT count(*)::text FROM pg_hba_file_rules WHERE address = '10.99.0.0'";
    assert_eq!(cluster.scalar(cluster.port("db-0"), removed).await, "0", "the rule left with the spec");
    assert_eq!(
        cluster.scalar(cluster.port("db-0"), "SHOW log_min_duration_statement").await,
        "-1",
        "back to its default"
    );
    cluster.shutdown().await;
}
