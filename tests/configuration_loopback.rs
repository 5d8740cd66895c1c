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

/// `SHOW name` on `port`.
async fn shown(port: u16, name: &str) -> Option<String> {
    loopback::query(port, &format!("SHOW {name}")).await.ok().map(|rows| rows[0].get::<_, String>(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_settings_changed_by_alter_system_are_put_back_and_reported() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, &["db-0"]).await;
    let port = cluster.port("db-0");
    // One the operator writes into postgresql.auto.conf itself ('1s'), one it does not (default 0).
    for statement in [
        "ALTER SYSTEM SET wal_retrieve_retry_interval = '7s'",
        "ALTER SYSTEM SET archive_timeout = '5min'",
        "ALTER SYSTEM SET work_mem = '9MB'",
        "SELECT pg_reload_conf()",
    ] {
        loopback::query(port, statement).await.unwrap_or_else(|error| panic!("{statement}: {error}"));
    }
    let put_back = async || {
        shown(port, "wal_retrieve_retry_interval").await.as_deref() == Some("1s")
            && shown(port, "archive_timeout").await.as_deref() == Some("0")
    };
    cluster.wait_for("both owned settings put back", Duration::from_secs(40), put_back).await;
    cluster
        .wait_for("the revert reported", Duration::from_secs(10), async || {
            let world = cluster.world.lock().unwrap();
            world
                .reports
                .get("db-0")
                .and_then(|report| report.owned_settings_reverted.as_ref())
                .is_some_and(|reverted| reverted.settings.contains(&"archive_timeout".to_string()))
        })
        .await;
    // A setting the operator does not own stays as the superuser set it.
    assert_eq!(shown(port, "work_mem").await.as_deref(), Some("9MB"));
    let left = "SELECT count(*)::text FROM pg_catalog.pg_file_settings WHERE sourcefile LIKE '%postgresql.auto.conf' \
                AND (name = 'archive_timeout' OR (name = 'wal_retrieve_retry_interval' AND setting <> '1s'))";
    assert_eq!(cluster.scalar(port, left).await, "0");
    let first = cluster.world.lock().unwrap().reports["db-0"].owned_settings_reverted.clone().unwrap();

    // Again: put back again, under a new number.
    loopback::query(port, "ALTER SYSTEM SET archive_timeout = '10min'").await.unwrap();
    loopback::query(port, "SELECT pg_reload_conf()").await.unwrap();
    cluster
        .wait_for("the repeated change put back and reported", Duration::from_secs(40), async || {
            let reverted = cluster.world.lock().unwrap().reports["db-0"].owned_settings_reverted.clone();
            reverted.is_some_and(|reverted| reverted.count > first.count && reverted.settings == ["archive_timeout"])
        })
        .await;
    assert_eq!(shown(port, "archive_timeout").await.as_deref(), Some("0"));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_request_reloads_every_instance_once_without_a_restart() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, &["db-0", "db-1"]).await;
    let loaded = "SELECT pg_conf_load_time()::text";
    let before =
        [cluster.scalar(cluster.port("db-0"), loaded).await, cluster.scalar(cluster.port("db-1"), loaded).await];
    let postmasters = cluster.scalar(cluster.port("db-1"), "SELECT pg_postmaster_start_time()::text").await;

    const REQUEST: &str = "2026-12-07T16:00:00Z";
    cluster.world.lock().unwrap().reload_requested = Some(REQUEST.into());
    cluster
        .wait_for("the request reported carried out by both", Duration::from_secs(30), async || {
            let world = cluster.world.lock().unwrap();
            ["db-0", "db-1"]
                .iter()
                .all(|name| world.reports.get(*name).is_some_and(|report| report.reloaded.as_deref() == Some(REQUEST)))
        })
        .await;
    for (name, before) in ["db-0", "db-1"].iter().zip(&before) {
        let after = cluster.scalar(cluster.port(name), loaded).await;
        assert_ne!(&after, before, "{name} read its configuration files again");
    }
    let now = cluster.scalar(cluster.port("db-1"), "SELECT pg_postmaster_start_time()::text").await;
    assert_eq!(now, postmasters, "a reload restarts nothing");
    // Carried out once: the agents' next steps (every second) leave the server alone.
    let settled = cluster.scalar(cluster.port("db-0"), loaded).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(cluster.scalar(cluster.port("db-0"), loaded).await, settled, "one reload per request");
    cluster.shutdown().await;
}
