//! The instance report when a publish lands but its answer is lost (a connection dropped after
//! the request went out): the agent cannot know what the API holds, so it publishes again even a
//! report equal to the last one known to have landed. Seen in CI: a standby's "not streaming"
//! landed unanswered, streaming resumed, and the API showed "not streaming" for good.

#[path = "support/loopback.rs"]
mod loopback;
#[path = "support/ports.rs"]
mod ports;

use loopback::Cluster;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_whose_answer_was_lost_is_published_again() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, &["db-0", "db-1"]).await;
    cluster.wait_streaming("db-1").await;
    let world = cluster.world.clone();
    // From now on db-1's publishes land but fail; its stream is cut once (it reconnects within
    // about a second), so it publishes "not streaming".
    world.lock().unwrap().answers_lost.insert("db-1".into());
    let primary = cluster.port("db-0");
    let cut = "SELECT count(pg_terminate_backend(pid))::text FROM pg_stat_replication WHERE application_name = 'db-1'";
    cluster
        .wait_for("db-1's 'not streaming' to land", Duration::from_secs(30), async || {
            if world.lock().unwrap().reports.get("db-1").is_some_and(|report| !report.wal_receiver) {
                return true;
            }
            let _ = loopback::query(primary, cut).await;
            false
        })
        .await;
    // Streaming again: the API must come to say so, although every answer is still lost (each
    // publish lands; only the agent cannot know it).
    cluster
        .wait_for("db-1's 'streaming' to be published again", Duration::from_secs(30), async || {
            world.lock().unwrap().reports.get("db-1").is_some_and(|report| report.wal_receiver && report.postgres_ready)
        })
        .await;
    world.lock().unwrap().answers_lost.clear();
    cluster.shutdown().await;
}
