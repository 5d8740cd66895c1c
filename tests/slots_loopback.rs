//! Replication slots with real PostgreSQL on loopback (issue 21, hole 5): a standby streams
//! through a slot of its own on the primary, so a standby that was away while the primary
//! recycled its WAL catches up by streaming; after a switchover the slots follow the new primary
//! and the old one drops those it kept.

#[path = "support/loopback.rs"]
mod loopback;
#[path = "support/ports.rs"]
mod ports;

use loopback::Cluster;
use std::time::Duration;

/// Physical slots of the server on `port`: (name, active, wal_status).
async fn slots(port: u16) -> Vec<(String, bool, String)> {
    let sql = "SELECT slot_name::text, active, coalesce(wal_status, '') FROM pg_replication_slots ORDER BY 1";
    let rows = loopback::query(port, sql).await.unwrap_or_default();
    rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect()
}

async fn wait_for_slots(cluster: &Cluster, name: &str, wanted: &[(&str, bool)]) {
    let port = cluster.port(name);
    let wanted: Vec<(String, bool)> = wanted.iter().map(|(slot, active)| (slot.to_string(), *active)).collect();
    let what = format!("{name}'s slots to be {wanted:?}");
    cluster
        .wait_for(&what, Duration::from_secs(60), async || {
            slots(port).await.into_iter().map(|(slot, active, _)| (slot, active)).collect::<Vec<_>>() == wanted
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_away_while_the_primary_recycled_its_wal_catches_up_through_its_slot() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    // Without a slot, nothing would keep a segment past the next checkpoint.
    let settings = [("wal_keep_size", "0"), ("max_wal_size", "64MB"), ("min_wal_size", "32MB")];
    let mut cluster =
        Cluster::start_with_server_settings(pg_bin, &["db-0", "db-1"], Default::default(), &settings).await;
    wait_for_slots(&cluster, "db-0", &[("dbsvc_db_1", true)]).await;
    // A slot holds WAL from the first position its standby confirmed (the WAL receiver reports
    // every `wal_receiver_status_interval`); before that it keeps nothing.
    let primary = cluster.port("db-0");
    let confirmed = "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'dbsvc_db_1' AND restart_lsn IS NOT NULL";
    cluster
        .wait_for("the standby to confirm a position through its slot", Duration::from_secs(60), async || {
            loopback::query(primary, confirmed).await.is_ok_and(|rows| rows.len() == 1)
        })
        .await;

    cluster.delete_pod("db-1").await;
    // The segment holding the first byte the standby has not received (`+ 1`: the name of a
    // segment boundary is the segment before it).
    let needed = "SELECT pg_walfile_name(restart_lsn + 1) FROM pg_replication_slots WHERE slot_name = 'dbsvc_db_1'";
    let first = cluster.scalar(primary, needed).await;
    loopback::query(primary, "CREATE TABLE filler (id int, payload text)").await.expect("create a table");
    for round in 0..6 {
        let insert = format!("INSERT INTO filler SELECT {round}, repeat('x', 1000) FROM generate_series(1, 2000)");
        for sql in [insert.as_str(), "SELECT pg_switch_wal()::text", "CHECKPOINT"] {
            loopback::query(primary, sql).await.unwrap_or_else(|error| panic!("{sql}: {error}"));
        }
    }
    let kept =
        cluster.scalar(primary, &format!("SELECT count(*)::text FROM pg_ls_waldir() WHERE name = '{first}'")).await;
    assert_eq!(kept, "1", "the primary kept the segment the standby needs next");
    let status = slots(primary).await;
    assert_eq!(status.len(), 1, "{status:?}");
    assert!(matches!(status[0].2.as_str(), "reserved" | "extended"), "the slot still holds its WAL: {status:?}");

    cluster.recreate_pod("db-1");
    cluster.wait_streaming("db-1").await;
    cluster.assert_follows("db-1", "db-0").await;
    let rows = cluster.scalar(cluster.port("db-1"), "SELECT count(*)::text FROM filler").await;
    assert_eq!(rows, "12000", "the standby replayed everything it missed");
    wait_for_slots(&cluster, "db-0", &[("dbsvc_db_1", true)]).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_switchover_the_slots_are_on_the_new_primary_and_the_old_one_drops_its_own() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, &["db-0", "db-1", "db-2"]).await;
    wait_for_slots(&cluster, "db-0", &[("dbsvc_db_1", true), ("dbsvc_db_2", true)]).await;

    cluster.world.lock().unwrap().switchover_to = Some("db-1".into());
    cluster.wait_primary("db-1", Duration::from_secs(30)).await;
    cluster.assert_follows("db-0", "db-1").await;
    cluster.assert_follows("db-2", "db-1").await;
    wait_for_slots(&cluster, "db-1", &[("dbsvc_db_0", true), ("dbsvc_db_2", true)]).await;
    // The former primary, now a standby, keeps no slot: they would hold its WAL back.
    wait_for_slots(&cluster, "db-0", &[]).await;
    cluster.shutdown().await;
}
