//! Base backups and point-in-time recovery with real PostgreSQL 15 and moto_server on loopback.
//!
//! A primary archives its WAL through `dbservice-operator wal-archive`; `dbservice-operator
//! backup` streams a base backup to the store; more rows are written in numbered batches with a
//! time, an LSN, a transaction id and a restore point between them. Then `dbservice-operator
//! restore` fills a fresh data directory once per target kind and PostgreSQL, replaying WAL
//! through `wal-restore`, must hold exactly the batches before the target. Finally the primary is
//! lost, a restored copy is promoted (timeline 2) and writes more, and a recovery from the same
//! timeline-1 backup to a time on timeline 2 must follow the switch.
//!
//! Without PostgreSQL or moto_server the test is skipped, except under CI=true, where it first
//! tries to install moto_server with pip and otherwise fails.

#[path = "support/object_store.rs"]
mod object_store;
#[path = "support/ports.rs"]
mod ports;

use object_store::*;
use std::time::Duration;

/// Batch `n` holds `10 + n` rows, so a wrong batch also has a wrong count.
async fn write_batch(client: &tokio_postgres::Client, batch: i32) {
    client.execute("insert into rows (batch) select $1 from generate_series(1, 10 + $1)", &[&batch]).await.unwrap();
}

/// (batch, rows) as stored.
async fn batches(client: &tokio_postgres::Client) -> Vec<(i32, i64)> {
    client
        .query("select batch, count(*) from rows group by batch order by batch", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

fn expected(through: i32) -> Vec<(i32, i64)> {
    (0..=through).map(|batch| (batch, i64::from(10 + batch))).collect()
}

async fn scalar(client: &tokio_postgres::Client, sql: &str) -> String {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// Switches WAL on `client`'s server and waits until the switched segment is archived.
async fn switch_and_wait_archived(client: &tokio_postgres::Client) -> String {
    let segment = scalar(client, "select pg_walfile_name(pg_switch_wal())").await;
    wait_for(&format!("{segment} to be archived"), Duration::from_secs(60), async || {
        let last = scalar(client, "select coalesce(last_archived_wal, '') from pg_stat_archiver").await;
        (last >= segment).then_some(())
    })
    .await;
    segment
}

/// Waits for a restored server to finish recovery and promote; panics with its log otherwise.
async fn wait_promoted(postgres: &Postgres) -> tokio_postgres::Client {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(client) = connect(postgres.port).await {
            if let Ok(row) = client.query_one("select pg_is_in_recovery()", &[]).await {
                if !row.get::<_, bool>(0) {
                    return client;
                }
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} did not finish recovery within 90s; log:\n{}",
            postgres.pgdata.display(),
            postgres.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Restores into a fresh directory with `target_flags`, starts PostgreSQL there, waits for the
/// promotion and returns the server and a client.
async fn restore_and_start(
    sandbox: &Sandbox,
    name: &str,
    target_flags: &[&str],
    settings: &[&str],
) -> (Postgres, tokio_postgres::Client, serde_json::Value) {
    let pgdata = sandbox.directory(name);
    let mut args = vec!["restore", "--pgdata", pgdata.to_str().unwrap()];
    args.extend_from_slice(target_flags);
    let used: serde_json::Value = serde_json::from_str(&sandbox.run(&args)).expect("restore prints the backup used");
    let postgres = sandbox.start(&pgdata, settings);
    let client = wait_promoted(&postgres).await;
    (postgres, client, used)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base_backup_and_point_in_time_recovery_to_every_target_kind() {
    let Some(Loopback { directory: _directory, store, sandbox }) = Loopback::start_or_skip("dbservice-pitr-").await
    else {
        return;
    };
    let bin = sandbox.bin.clone();

    let primary_data = sandbox.initdb("primary");
    let mut primary = sandbox.start(&primary_data, &[]);
    let client = wait_for("the primary to accept connections", Duration::from_secs(30), async || {
        connect(primary.port).await.ok()
    })
    .await;
    client
        .batch_execute(
            "create table rows (id bigserial primary key, batch int not null, \
             written_at timestamptz not null default clock_timestamp())",
        )
        .await
        .unwrap();
    write_batch(&client, 0).await;

    // The base backup: streamed, compressed, described by its manifest.
    let port = primary.port.to_string();
    let backup = sandbox.base_backup(primary.port);
    let backup_id = backup["id"].as_str().unwrap().to_string();
    assert_eq!(backup["timeline"], 1);
    assert_eq!(backup["postgresMajorVersion"], 15);
    assert_eq!(backup["fromStandby"], false);
    assert_eq!(backup["compression"], "zstd");
    let begin: dbservice_operator::lsn::Lsn = backup["beginLsn"].as_str().unwrap().parse().unwrap();
    let end: dbservice_operator::lsn::Lsn = backup["endLsn"].as_str().unwrap().parse().unwrap();
    assert!(begin < end, "begin {begin} must precede end {end}");
    let (size, stored) = (backup["sizeBytes"].as_u64().unwrap(), backup["storedBytes"].as_u64().unwrap());
    assert!(size > 20 * 1024 * 1024 && stored < size / 2, "size {size}, stored {stored}: not a compressed cluster");
    let end_wal = backup["endWal"].as_str().unwrap();
    let end_wal_key = format!("{PREFIX}/{SERVER_NAME}/wal/{}/{end_wal}.zst", &end_wal[..8]);
    assert!(store.client.head_object(&end_wal_key).await.unwrap().is_some(), "{end_wal} is not archived");
    let manifest_key = format!("{PREFIX}/{SERVER_NAME}/base/{backup_id}/backup.json");
    assert!(store.client.head_object(&manifest_key).await.unwrap().is_some(), "no {manifest_key}");
    // The same id again is refused, and leaves the first backup alone.
    let again = sandbox.try_run(&["backup", &format!("--port={port}"), &format!("--backup-id={backup_id}")]);
    assert!(again.unwrap_err().contains("already exists"));

    // Batches after the backup, with one target of each kind between them.
    write_batch(&client, 1).await;
    let target_time = scalar(&client, "select to_json(clock_timestamp())#>>'{}'").await;
    write_batch(&client, 2).await;
    let target_lsn = scalar(&client, "select pg_current_wal_lsn()::text").await;
    client.batch_execute("begin").await.unwrap();
    write_batch(&client, 3).await;
    let target_xid = scalar(&client, "select txid_current()::text").await;
    client.batch_execute("commit").await.unwrap();
    write_batch(&client, 4).await;
    client.execute("select pg_create_restore_point('before-batch-5')", &[]).await.unwrap();
    write_batch(&client, 5).await;
    switch_and_wait_archived(&client).await;
    assert_eq!(batches(&client).await, expected(5));

    let restored_settings = ["archive_mode=off"];
    let cases: Vec<(&str, Vec<String>, i32)> = vec![
        ("latest", vec![], 5),
        ("time", vec![format!("--target-time={target_time}")], 1),
        ("lsn", vec![format!("--target-lsn={target_lsn}")], 2),
        ("xid", vec![format!("--target-xid={target_xid}"), format!("--backup-id={backup_id}")], 3),
        ("name", vec!["--target-name=before-batch-5".to_string(), format!("--backup-id={backup_id}")], 4),
    ];
    for (kind, flags, through) in &cases {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let (restored, restored_client, used) =
            restore_and_start(&sandbox, &format!("restore-{kind}"), &flags, &restored_settings).await;
        assert_eq!(used["id"], backup_id.as_str());
        assert_eq!(batches(&restored_client).await, expected(*through), "target {kind}: wrong rows restored");
        if *kind == "latest" {
            // A backup whose last WAL never reaches the store (this copy does not archive) fails
            // after its wait and leaves nothing behind: failures do not pile up.
            let error = sandbox
                .try_run(&[
                    "backup",
                    &format!("--port={}", restored.port),
                    &format!("--pg-bin-dir={}", bin.display()),
                    "--backup-id=never-consistent",
                    "--wal-wait-seconds=2",
                ])
                .unwrap_err();
            assert!(error.contains("was not archived within 2s"), "{error}");
            let leftovers =
                store.client.list_objects(&format!("{PREFIX}/{SERVER_NAME}/base/never-consistent/")).await.unwrap();
            assert!(leftovers.is_empty(), "a failed backup left {leftovers:?}");
        }
        drop(restored_client);
        drop(restored);
    }

    // Without an explicit backup a restore point cannot be placed: refused before touching data.
    let refused = sandbox.directory("restore-refused");
    let error = sandbox
        .try_run(&["restore", "--pgdata", refused.to_str().unwrap(), "--target-name=before-batch-5"])
        .unwrap_err();
    assert!(error.contains("needs an explicit backup"), "{error}");
    assert_eq!(std::fs::read_dir(&refused).unwrap().count(), 0, "a refused restore wrote into the directory");

    // The primary is lost; a restored copy takes over on timeline 2 and archives to the same place.
    drop(client);
    primary.kill();
    let (promoted, promoted_client, _) = restore_and_start(&sandbox, "promoted", &[], &["archive_mode=on"]).await;
    let timeline = scalar(&promoted_client, "select timeline_id::text from pg_control_checkpoint()").await;
    let current = scalar(&promoted_client, "select pg_walfile_name(pg_current_wal_lsn())").await;
    assert!(
        current.starts_with("00000002"),
        "the promoted copy writes {current}, not timeline 2 (checkpoint says {timeline})"
    );
    assert_eq!(batches(&promoted_client).await, expected(5));
    write_batch(&promoted_client, 6).await;
    let time_on_timeline_2 = scalar(&promoted_client, "select to_json(clock_timestamp())#>>'{}'").await;
    write_batch(&promoted_client, 7).await;
    switch_and_wait_archived(&promoted_client).await;
    let history = format!("{PREFIX}/{SERVER_NAME}/wal/00000002/00000002.history.zst");
    assert!(store.client.head_object(&history).await.unwrap().is_some(), "the promotion archived no {history}");

    // PITR from the timeline-1 backup to a time on timeline 2 follows the switch.
    let (_across, across_client, used) = restore_and_start(
        &sandbox,
        "restore-across-timelines",
        &[&format!("--target-time={time_on_timeline_2}")],
        &restored_settings,
    )
    .await;
    assert_eq!(used["timeline"], 1);
    assert_eq!(batches(&across_client).await, expected(6), "recovery did not follow timeline 2 to the target");
    drop(across_client);

    // A second backup, on timeline 2; then retention, evaluated two days ahead with a one-day
    // window, keeps only it (the newest backup always stays) and the WAL it needs.
    let second: serde_json::Value = serde_json::from_str(&sandbox.run(&[
        "backup",
        &format!("--port={}", promoted.port),
        &format!("--pg-bin-dir={}", bin.display()),
        "--wal-wait-seconds=60",
    ]))
    .unwrap();
    assert_eq!(second["timeline"], 2);
    let listed: serde_json::Value = serde_json::from_str(&sandbox.run(&["backup-list"])).unwrap();
    let ids: Vec<&str> =
        listed["backups"].as_array().unwrap().iter().map(|backup| backup["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![backup_id.as_str(), second["id"].as_str().unwrap()]);
    assert_eq!(listed["recoverableWindow"]["firstRecoverabilityPoint"], backup["endTime"]);
    let in_two_days = (chrono::Utc::now() + chrono::Duration::days(2)).to_rfc3339();
    // The chunk of a backup whose Job was killed before its backup.json: abandoned after a day.
    let abandoned = format!("{PREFIX}/{SERVER_NAME}/base/20261101T000000Z/data.tar.zst.00000");
    store.client.put_object(&abandoned, bytes::Bytes::from_static(b"partial"), &[]).await.unwrap();
    let wal_before: Vec<String> = store.wal_keys().await;
    let prune = ["backup-prune", "--retention=1d", &format!("--at={in_two_days}")];
    let dry_run: serde_json::Value =
        serde_json::from_str(&sandbox.run(&[prune[0], prune[1], prune[2], "--dry-run"])).unwrap();
    assert_eq!(store.wal_keys().await, wal_before, "a dry run deleted WAL");
    let pruned: serde_json::Value = serde_json::from_str(&sandbox.run(&prune)).unwrap();
    assert_eq!(pruned["expiredBackups"], dry_run["expiredBackups"]);
    assert_eq!(pruned["expiredBackups"], serde_json::json!([backup_id]));
    assert_eq!(pruned["abandonedBackups"], serde_json::json!(["20261101T000000Z"]));
    assert_eq!(dry_run["abandonedBackups"], pruned["abandonedBackups"]);
    assert!(store.client.get_object(&abandoned, 1024).await.unwrap().is_none(), "the abandoned chunk remains");
    let first_prefix = format!("{PREFIX}/{SERVER_NAME}/base/{backup_id}/");
    assert!(store.client.list_objects(&first_prefix).await.unwrap().is_empty(), "chunks of the expired backup remain");
    let second_begin = second["beginWal"].as_str().unwrap().to_string();
    let wal_after = store.wal_keys().await;
    for key in &wal_before {
        let name = key.rsplit('/').next().unwrap().trim_end_matches(".zst");
        let needed = name.ends_with(".history") || name[8..24] >= second_begin[8..24];
        assert_eq!(
            wal_after.contains(key),
            needed,
            "{key}: kept must equal needed (second backup begins at {second_begin})"
        );
    }
    assert!(wal_after.len() < wal_before.len(), "retention deleted no WAL");

    // What is left still recovers everything.
    let (_latest, latest_client, used) =
        restore_and_start(&sandbox, "restore-after-retention", &[], &restored_settings).await;
    assert_eq!(used["id"], second["id"]);
    assert_eq!(batches(&latest_client).await, expected(7));

    // A damaged chunk is detected by its recorded SHA-256: the restore fails, naming it.
    let chunk = format!("{PREFIX}/{SERVER_NAME}/base/{}/data.tar.zst.00000", second["id"].as_str().unwrap());
    let original = store.client.get_object(&chunk, 1 << 30).await.unwrap().expect("first chunk").body;
    let mut damaged = original.to_vec();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0xFF;
    store.client.put_object(&chunk, damaged.into(), &[]).await.unwrap();
    let target = sandbox.directory("restore-damaged");
    let error = sandbox.try_run(&["restore", "--pgdata", target.to_str().unwrap()]).unwrap_err();
    assert!(error.contains(&chunk) && error.contains("differs from the recorded"), "{error}");
    drop(promoted);
}
