//! The first instance's recovery procedure (`dbservice_operator::instance::recovery::recover`, what
//! `instance run` does for `spec.bootstrap.recovery`) with real PostgreSQL 15 and moto_server on
//! loopback: a source archives and is backed up, rows are written in batches around a target
//! time, and the recovery must leave a data directory that starts as a primary holding exactly
//! the batches before the target, without any recovery setting left. A target beyond the archive
//! must fail with PostgreSQL's reason and leave the data directory empty.
//!
//! Without PostgreSQL or moto_server the test is skipped, except under CI=true, where it fails.

#[path = "support/object_store.rs"]
mod object_store;
#[path = "support/ports.rs"]
mod ports;

use dbservice_operator::api::backup::{CredentialsSecret, ObjectStore, RecoveryTargetSpec};
use dbservice_operator::api::recovery::{RecoveryPhase, RecoveryPlan, RecoveryStatus};
use dbservice_operator::instance::recovery::recover;
use dbservice_operator::instance::InstanceConfig;
use dbservice_operator::lease::LeaseTimings;
use object_store::*;
use std::path::Path;
use std::time::Duration;

async fn batches(client: &tokio_postgres::Client) -> Vec<(i32, i64)> {
    client
        .query("select batch, count(*) from rows group by batch order by batch", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

fn instance_config(sandbox: &Sandbox, bin: &Path, pgdata: &Path) -> InstanceConfig {
    InstanceConfig {
        name: "restored-0".into(),
        pg_bin: bin.to_path_buf(),
        pgdata: pgdata.to_path_buf(),
        port: free_port(),
        socket_dir: sandbox.base.clone(),
        listen_addresses: String::new(),
        superuser: "postgres".into(),
        roles: None,
        replication_user: "replicator".into(),
        replication_password: "new-replication-password".into(),
        settings: vec![("fsync".into(), "off".into())],
        standby_restore_command: None,
        log_file: sandbox.base.join("agent.log"),
        os_user: sandbox.owner,
        health_timeout: Duration::from_secs(2),
        tick: Duration::from_millis(200),
        lease: LeaseTimings::default(),
        stop_grace: Duration::from_secs(10),
        unresponsive_after: Duration::from_secs(2),
        watchdog_binary: None,
        tls: None,
    }
}

fn plan(endpoint: &str, time: &str) -> RecoveryPlan {
    RecoveryPlan {
        source: ObjectStore {
            endpoint: endpoint.into(),
            bucket: BUCKET.into(),
            path: Some(PREFIX.into()),
            server_name: Some(SERVER_NAME.into()),
            credentials_secret: CredentialsSecret { name: "unused".into(), ..Default::default() },
            ..Default::default()
        },
        backup_id: None,
        target: Some(RecoveryTargetSpec { time: Some(time.into()), ..Default::default() }),
    }
}

/// Runs one attempt; returns the reported phases and the outcome.
async fn attempt(
    sandbox: &Sandbox,
    bin: &Path,
    pgdata: &Path,
    plan: &RecoveryPlan,
    credentials: &Path,
) -> (Vec<RecoveryPhase>, Result<RecoveryStatus, (RecoveryStatus, String)>) {
    let config = instance_config(sandbox, bin, pgdata);
    let args = dbservice_operator::instance::recovery::restore_args(
        plan,
        pgdata,
        Path::new(BINARY),
        credentials,
        &sandbox.base.join("no-ca"),
    );
    let (_stop_sender, mut stop) = tokio::sync::watch::channel(false);
    let mut phases = Vec::new();
    let mut report = async |status: &RecoveryStatus| phases.push(status.phase);
    let outcome = recover(&config, plan, args, "new-password", 1, &mut stop, &mut report)
        .await
        .map_err(|(status, error)| (status, error.to_string()));
    (phases, outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_instance_recovers_to_a_time_and_starts_as_a_clean_primary() {
    let Some(Loopback { directory: _directory, store, sandbox }) = Loopback::start_or_skip("dbservice-recovery-").await
    else {
        return;
    };
    let bin = sandbox.bin.clone();
    // The source store's access key as the pod mounts it: files of a Secret volume.
    let credentials = sandbox.directory("credentials");
    for (file, value) in [("accessKeyId", "test-key"), ("secretAccessKey", "test-secret")] {
        std::fs::write(credentials.join(file), value).unwrap();
    }

    let source_data = sandbox.initdb("source");
    let source = sandbox.start(&source_data, &[]);
    let client =
        wait_for("the source to accept connections", Duration::from_secs(30), async || connect(source.port).await.ok())
            .await;
    client
        .batch_execute(
            "create table rows (batch int not null, written_at timestamptz not null default clock_timestamp());
             insert into rows (batch) select 0 from generate_series(1, 10)",
        )
        .await
        .unwrap();
    sandbox.base_backup(source.port);
    client.batch_execute("insert into rows (batch) select 1 from generate_series(1, 11)").await.unwrap();
    let target: String = client.query_one("select to_json(clock_timestamp())#>>'{}'", &[]).await.unwrap().get(0);
    client.batch_execute("insert into rows (batch) select 2 from generate_series(1, 12)").await.unwrap();
    let segment: String = client.query_one("select pg_walfile_name(pg_switch_wal())", &[]).await.unwrap().get(0);
    wait_for(&format!("{segment} archived"), Duration::from_secs(60), async || {
        let last: String =
            client.query_one("select coalesce(last_archived_wal, '') from pg_stat_archiver", &[]).await.ok()?.get(0);
        (last >= segment).then_some(())
    })
    .await;

    // Recovery to the time between batches 1 and 2.
    let parent = sandbox.directory("restored");
    let pgdata = parent.join("pgdata");
    let (phases, outcome) = attempt(&sandbox, &bin, &pgdata, &plan(&store.endpoint, &target), &credentials).await;
    let status = outcome.unwrap_or_else(|(_, error)| panic!("recovery failed: {error}"));
    assert_eq!(phases, [RecoveryPhase::Restoring, RecoveryPhase::Replaying]);
    assert_eq!(status.phase, RecoveryPhase::Completed);
    assert!(status.backup_id.is_some() && status.restored_bytes.unwrap() > 0 && status.completed_at.is_some());
    eprintln!(
        "recovery: restore {:.2} s ({:.1} MiB/s of {} bytes), replay and promotion {:.2} s",
        status.restore_seconds.unwrap(),
        status.restore_mib_per_second().unwrap_or(0.0),
        status.restored_bytes.unwrap(),
        status.replay_seconds.unwrap()
    );
    assert!(!dbservice_operator::api::recovery::staging_directory(&pgdata).exists());
    assert!(!pgdata.join("recovery.signal").exists() && !pgdata.join("standby.signal").exists());
    let auto_conf = std::fs::read_to_string(pgdata.join("postgresql.auto.conf")).unwrap();
    for forgotten in ["restore_command", "recovery_target", "archive_command"] {
        assert!(!auto_conf.contains(forgotten), "{forgotten} left in postgresql.auto.conf:\n{auto_conf}");
    }

    // It starts as a primary with exactly the rows before the target and the new passwords.
    let recovered = sandbox.start(&pgdata, &["archive_mode=off", "listen_addresses=127.0.0.1"]);
    let client =
        wait_for("the recovered server", Duration::from_secs(30), async || connect(recovered.port).await.ok()).await;
    let in_recovery: bool = client.query_one("select pg_is_in_recovery()", &[]).await.unwrap().get(0);
    assert!(!in_recovery, "log:\n{}", recovered.log_tail());
    assert_eq!(batches(&client).await, [(0, 10), (1, 11)], "recovery to {target}");
    let timeline: i32 = client.query_one("select timeline_id from pg_control_checkpoint()", &[]).await.unwrap().get(0);
    assert_eq!(timeline, 2, "the promotion at the target starts timeline 2");
    let replication: bool = client
        .query_one(
            "select rolreplication and rolpassword like 'SCRAM-SHA-256$%' from pg_authid where rolname = 'replicator'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(replication, "the replication role exists with a SCRAM password");

    // A target after the end of the archive: PostgreSQL's reason, and PGDATA stays empty.
    let late = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let failed_data = sandbox.directory("failed").join("pgdata");
    let (phases, outcome) = attempt(&sandbox, &bin, &failed_data, &plan(&store.endpoint, &late), &credentials).await;
    let (status, error) = outcome.expect_err("a target beyond the archive cannot be reached");
    assert_eq!(phases, [RecoveryPhase::Restoring, RecoveryPhase::Replaying]);
    assert_eq!(status.phase, RecoveryPhase::Failed);
    assert!(error.contains("recovery ended before configured recovery target was reached"), "{error}");
    assert_eq!(status.error.as_deref(), Some(error.as_str()));
    assert!(!failed_data.join("PG_VERSION").exists(), "a failed recovery leaves PGDATA empty");
}

/// Recovery to the end of the archive ("latest") must not stop silently at a missing segment:
/// PostgreSQL takes a missing file for the end of the archive, so `wal-restore` tells a gap (a
/// later segment of the same timeline is archived) from the end, and the recovery fails naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_to_the_latest_point_fails_at_a_gap_in_the_archive() {
    let Some(Loopback { directory: _directory, store, sandbox }) = Loopback::start_or_skip("dbservice-gap-").await
    else {
        return;
    };
    let bin = sandbox.bin.clone();
    let credentials = sandbox.directory("credentials");
    for (file, value) in [("accessKeyId", "test-key"), ("secretAccessKey", "test-secret")] {
        std::fs::write(credentials.join(file), value).unwrap();
    }
    let source_data = sandbox.initdb("source");
    let source = sandbox.start(&source_data, &[]);
    let client =
        wait_for("the source to accept connections", Duration::from_secs(30), async || connect(source.port).await.ok())
            .await;
    client.batch_execute("create table rows (batch int not null, written_at timestamptz)").await.unwrap();
    sandbox.base_backup(source.port);
    let mut segments = Vec::new();
    for batch in 1..=3 {
        client
            .batch_execute(&format!("insert into rows (batch) select {batch} from generate_series(1, 10)"))
            .await
            .unwrap();
        let segment: String = client.query_one("select pg_walfile_name(pg_switch_wal())", &[]).await.unwrap().get(0);
        segments.push(segment);
    }
    let last = segments.last().unwrap().clone();
    wait_for(&format!("{last} archived"), Duration::from_secs(60), async || {
        let archived: String =
            client.query_one("select coalesce(last_archived_wal, '') from pg_stat_archiver", &[]).await.ok()?.get(0);
        (archived >= last).then_some(())
    })
    .await;
    // The segment holding batch 2 goes missing; the one holding batch 3 is still there.
    let keys = store.wal_keys().await;
    let missing = keys.iter().find(|key| key.contains(&segments[1])).expect("the middle segment archived").clone();
    store.client.delete_object(&missing).await.unwrap();

    let mut latest = plan(&store.endpoint, "unused");
    latest.target = None;
    let pgdata = sandbox.directory("restored").join("pgdata");
    let (_, outcome) = attempt(&sandbox, &bin, &pgdata, &latest, &credentials).await;
    let (status, error) = outcome.expect_err("a recovery to the latest point must not stop at a gap");
    assert_eq!(status.phase, RecoveryPhase::Failed);
    assert!(error.contains("a gap in the WAL archive"), "{error}");
    assert!(error.contains(&format!("could not restore file \"{}\"", segments[1])), "{error}");
    assert!(!pgdata.join("PG_VERSION").exists(), "a failed recovery leaves PGDATA empty");
}
