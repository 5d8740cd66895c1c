//! Failover, switchover and fencing with real PostgreSQL on loopback (no cluster): every server is
//! run by a real instance agent (`dbservice_operator::instance::Agent`), the operator's decisions
//! come from the real `failover::decide`; only the API server is an in-memory stand-in. A writer
//! inserts one row per transaction through "Service <name>" and logs every acknowledged commit.
//!
//! Each test prints its timings (`cargo test --test failover_loopback -- --nocapture`).

#[path = "support/loopback.rs"]
mod loopback;
#[path = "support/ports.rs"]
mod ports;

use chrono::Utc;
use dbservice_operator::api::failover::{FailoverSettings, Transition, TransitionKind};
use dbservice_operator::instance::RELEASED_WAL_WAIT;
use dbservice_operator::lsn::Lsn;
use dbservice_operator::operator::database::failover::Action;
use loopback::{postmaster_alive, signal_postgres, Cluster};
use std::time::{Duration, Instant};

const NAMES: &[&str] = &["db-0", "db-1"];

/// When the writer's first commit acknowledged by the server on `port` after `since` came (waits for it).
async fn first_commit_after(cluster: &Cluster, since: Instant, port: u16, what: &str) -> Instant {
    cluster.wait_for(what, Duration::from_secs(30), async || cluster.first_ack_after(since, port).is_some()).await;
    cluster.first_ack_after(since, port).unwrap()
}

/// Stops the writer; returns every acknowledged commit and those missing from the server on `port`.
async fn acknowledged_and_lost(cluster: &mut Cluster, port: u16) -> (Vec<i64>, Vec<i64>) {
    let acknowledged = cluster.stop_writer().await;
    let stored = cluster.stored_ids(port).await;
    let lost = acknowledged.iter().copied().filter(|id| !stored.contains(id)).collect();
    (acknowledged, lost)
}

async fn writes_for(cluster: &Cluster, duration: Duration, at_least: usize) {
    let start = Instant::now();
    cluster
        .wait_for("the writer to commit", duration + Duration::from_secs(30), async || {
            start.elapsed() >= duration && cluster.acks.lock().unwrap().len() >= at_least
        })
        .await;
}

async fn timeline(cluster: &Cluster, name: &str) -> u32 {
    let sql = "SELECT timeline_id::text FROM pg_control_checkpoint()";
    // The end-of-recovery checkpoint may lag the promotion by a moment.
    let mut value = 0;
    for _ in 0..50 {
        value = cluster.scalar(cluster.port(name), sql).await.parse().unwrap();
        if value > 1 {
            break;
        }
        let _ = loopback::query(cluster.port(name), "CHECKPOINT").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    value
}

fn primary_changes(cluster: &Cluster) -> Vec<(TransitionKind, String, String, u32, Duration)> {
    let world = cluster.world.lock().unwrap();
    world
        .actions
        .iter()
        .filter_map(|(_, action)| match action {
            Action::PrimaryChanged { kind, from, to, timeline, took } => {
                Some((*kind, from.clone(), to.clone(), *timeline, *took))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchover_under_writes_loses_no_acknowledged_commit_and_the_old_primary_follows() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster = Cluster::start(pg_bin, NAMES).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;

    let started = Instant::now();
    cluster.world.lock().unwrap().switchover_to = Some("db-1".into());
    cluster.wait_primary("db-1", Duration::from_secs(30)).await;
    let new_port = cluster.port("db-1");
    let switchover = first_commit_after(&cluster, started, new_port, "a commit on the new primary").await - started;
    writes_for(&cluster, Duration::from_millis(500), 0).await;
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, new_port).await;
    assert!(lost.is_empty(), "acknowledged commits lost on switchover: {lost:?}");
    assert_eq!(timeline(&cluster, "db-1").await, 2, "the new primary runs on a new timeline");
    assert_eq!(cluster.scalar(new_port, "SELECT pg_is_in_recovery()::text").await, "false");
    let changes = primary_changes(&cluster);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(
        (changes[0].0, changes[0].1.as_str(), changes[0].2.as_str()),
        (TransitionKind::Switchover, "db-0", "db-1")
    );
    assert_eq!(changes[0].3, 2);

    cluster.assert_follows("db-0", "db-1").await;
    assert_eq!(
        cluster.replaced_directories("db-0"),
        Vec::<std::path::PathBuf>::new(),
        "rejoined by pg_rewind, not a clone"
    );
    eprintln!(
        "FIGURES switchover: {:.2} s from request to the first commit on the new primary \
         (operator saw the promotion after {:.2} s); {} acknowledged commits, 0 lost",
        switchover.as_secs_f64(),
        changes[0].4.as_secs_f64(),
        acknowledged.len()
    );
    cluster.shutdown().await;
}

/// Issue 38: a switchover to a standby that is behind (its WAL receiver stopped, as over a link too
/// slow for the writes) stopped the primary at once and refused writes until the rest of the WAL
/// had crawled over (63 s on the real node, a throttled link). The primary now keeps taking writes
/// while the target catches up, and stops only once it is within a second of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_to_a_standby_behind_keeps_taking_writes_until_it_caught_up() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster = Cluster::start(pg_bin, NAMES).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;
    let (old_port, new_port) = (cluster.port("db-0"), cluster.port("db-1"));
    let receiver: i32 = cluster.scalar(new_port, "SELECT pid::text FROM pg_stat_wal_receiver").await.parse().unwrap();
    dbservice_operator::instance::postgres::signal_server(receiver as u32, libc::SIGSTOP);
    // The standby falls behind: its flush lag grows past a second.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let requested = Instant::now();
    cluster.world.lock().unwrap().switchover_to = Some("db-1".into());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let on_the_old_primary = cluster
        .acks
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, at, port)| *port == old_port && *at > requested + Duration::from_millis(2500))
        .count();
    dbservice_operator::instance::postgres::signal_server(receiver as u32, libc::SIGCONT);
    assert!(
        on_the_old_primary > 0,
        "the primary stopped taking writes while its switchover target was behind\n{}",
        cluster.diagnostics()
    );
    cluster.wait_primary("db-1", Duration::from_secs(30)).await;
    let resumed = requested + Duration::from_secs(3);
    let switched = first_commit_after(&cluster, resumed, new_port, "a commit on the new primary").await - resumed;
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, new_port).await;
    assert!(lost.is_empty(), "acknowledged commits lost on switchover: {lost:?}");
    eprintln!(
        "FIGURES switchover to a standby behind: {on_the_old_primary} commits on the old primary while the target \
         was stopped; first commit on the new primary {:.2} s after it resumed; {} acknowledged, 0 lost",
        switched.as_secs_f64(),
        acknowledged.len()
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_when_the_primary_pod_is_killed_and_the_old_primary_is_rewound() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster = Cluster::start(pg_bin, NAMES).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;

    let killed = Instant::now();
    cluster.kill_pod("db-0");
    cluster.wait_primary("db-1", Duration::from_secs(30)).await;
    let new_port = cluster.port("db-1");
    let recovery = first_commit_after(&cluster, killed, new_port, "a commit on the new primary").await - killed;
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, new_port).await;
    let lost = lost.len();
    assert_eq!(timeline(&cluster, "db-1").await, 2);
    let changes = primary_changes(&cluster);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!((changes[0].0, changes[0].2.as_str()), (TransitionKind::Failover, "db-1"));

    cluster.recreate_pod("db-0");
    cluster.assert_follows("db-0", "db-1").await;
    assert_eq!(timeline(&cluster, "db-0").await, 2, "the old primary follows the new timeline");
    assert_eq!(
        cluster.replaced_directories("db-0"),
        Vec::<std::path::PathBuf>::new(),
        "rejoined by pg_rewind, not a clone"
    );
    eprintln!(
        "FIGURES failover (pod killed): {:.2} s from SIGKILL to the first commit on the new primary; \
         {} acknowledged, {lost} lost (asynchronous replication)",
        recovery.as_secs_f64(),
        acknowledged.len()
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_when_the_primary_hangs_fences_it_and_it_rejoins() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster = Cluster::start(pg_bin, NAMES).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;

    let hung = Instant::now();
    signal_postgres(&cluster.pgdata("db-0"), libc::SIGSTOP);
    cluster.wait_primary("db-1", Duration::from_secs(40)).await;
    let new_port = cluster.port("db-1");
    let recovery = first_commit_after(&cluster, hung, new_port, "a commit on the new primary").await - hung;
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, new_port).await;
    let lost = lost.len();
    assert_eq!(timeline(&cluster, "db-1").await, 2);

    // The hung server was killed by its own agent, which then rewinds it into a standby.
    cluster.assert_follows("db-0", "db-1").await;
    assert_eq!(
        cluster.replaced_directories("db-0"),
        Vec::<std::path::PathBuf>::new(),
        "rejoined by pg_rewind, not a clone"
    );
    eprintln!(
        "FIGURES failover (primary hung by SIGSTOP): {:.2} s to the first commit on the new primary; \
         {} acknowledged, {lost} lost (asynchronous replication)",
        recovery.as_secs_f64(),
        acknowledged.len()
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_killed_by_its_fence_is_failed_over_not_restarted_in_place() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    // The fence comes first: the agents call a server unresponsive only after 10 s, the watchdog
    // kills it 3 s after its last renewal. A failover delay longer than a restart in place.
    let settings = FailoverSettings { failover_delay: Duration::from_secs(2), ..Default::default() };
    let adjust =
        |config: &mut dbservice_operator::instance::InstanceConfig| config.unresponsive_after = Duration::from_secs(10);
    let mut cluster = Cluster::start_with_agents(pg_bin, NAMES, settings, &[], adjust).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_millis(500), 5).await;
    let old_data = cluster.pgdata("db-0");
    let old_pid = loopback::postmaster_pid(&old_data);
    let hung = Instant::now();
    signal_postgres(&old_data, libc::SIGSTOP);
    cluster.wait_primary("db-1", Duration::from_secs(30)).await;
    let promoted = hung.elapsed();
    let new_port = cluster.port("db-1");
    first_commit_after(&cluster, hung, new_port, "a commit on the new primary").await;
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, new_port).await;
    let changes = primary_changes(&cluster);
    assert!(
        changes
            .iter()
            .any(|(kind, from, to, _, _)| *kind == TransitionKind::Failover && from == "db-0" && to == "db-1"),
        "the hung primary was failed over: {changes:?}"
    );
    // Killed, not merely replaced: the old postmaster is gone (its pid file keeps the pid until
    // the next start, which a loaded machine may not have reached yet).
    let old_state = old_pid.and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok());
    let old_alive = old_state
        .as_deref()
        .and_then(|stat| stat.rsplit_once(')'))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state != "Z" && state != "X");
    assert!(old_pid.is_some() && !old_alive, "the hung server was killed: {old_state:?}");
    cluster.assert_follows("db-0", "db-1").await;
    eprintln!(
        "FIGURES hung primary fenced before it was reported: db-1 promoted {:.2} s after the hang; {} acknowledged, {} lost (asynchronous)",
        promoted.as_secs_f64(),
        acknowledged.len(),
        lost.len()
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shorter_than_the_unresponsive_window_starts_no_failover() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster = Cluster::start(pg_bin, NAMES).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_millis(500), 5).await;
    let port = cluster.port("db-0");
    // The fault: the whole server stalls for 1.2 s, so that at least one health query fails
    // (started at most one 200 ms tick into the stall, it times out after 1 s; one failure started a
    // failover before issue 21). The loopback agents' window is 2 s and their renew deadline 3 s,
    // as production's 5 s is to a 2-second I/O stall. A stall of 1.5 s left too little margin on a
    // loaded machine (CI runs these clusters 16 at a time on 2 cores): the resumed server answered
    // so late that the primary missed its renew deadline and was failed over.
    let stall = Duration::from_millis(1200);
    let stalled = Instant::now();
    signal_postgres(&cluster.pgdata("db-0"), libc::SIGSTOP);
    tokio::time::sleep(stall).await;
    signal_postgres(&cluster.pgdata("db-0"), libc::SIGCONT);
    first_commit_after(&cluster, stalled + stall, port, "a commit after the stall").await;
    // Long enough for a failover the stall would have started to show: lease expiry and a promotion.
    let resumed = Instant::now();
    writes_for(&cluster, cluster.timings.duration, 20).await;
    assert!(resumed.elapsed() >= cluster.timings.duration);
    let failovers: Vec<_> = {
        let world = cluster.world.lock().unwrap();
        world
            .actions
            .iter()
            .filter(|(_, action)| matches!(action, Action::FailoverStarted { .. } | Action::PrimaryFailing { .. }))
            .map(|(_, action)| format!("{action:?}"))
            .collect()
    };
    assert!(failovers.is_empty(), "a {stall:?} stall started a failover: {failovers:?}");
    assert!(postmaster_alive(&cluster.pgdata("db-0")), "the stalled primary was killed");
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, port).await;
    assert!(lost.is_empty(), "{} of {} acknowledged commits lost", lost.len(), acknowledged.len());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_primary_fences_itself_before_a_standby_is_promoted() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, NAMES).await;
    let timings = cluster.timings;
    let old_data = cluster.pgdata("db-0");

    let isolated = Instant::now();
    cluster.world.lock().unwrap().partitioned.insert("db-0".into());
    cluster
        .wait_for("the isolated primary to stop", timings.renew_deadline + Duration::from_secs(5), async || {
            !postmaster_alive(&old_data)
        })
        .await;
    let fenced = isolated.elapsed();
    cluster.wait_primary("db-1", Duration::from_secs(30)).await;
    let promoted = isolated.elapsed();
    assert!(fenced <= timings.renew_deadline + Duration::from_secs(2), "fenced after {fenced:?}");
    assert!(promoted > fenced, "promoted at {promoted:?}, before the old primary stopped at {fenced:?}");
    assert!(
        promoted >= timings.duration,
        "the standby must wait for the lease to expire ({:?}), promoted at {promoted:?}",
        timings.duration
    );
    // While still cut off, the old primary never starts again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!postmaster_alive(&old_data), "a fenced primary restarted without the API");
    cluster.world.lock().unwrap().partitioned.remove("db-0");
    cluster.assert_follows("db-0", "db-1").await;
    eprintln!(
        "FIGURES isolation: fenced {:.2} s after losing the API (renew deadline {:?}), standby promoted after {:.2} s (lease {:?})",
        fenced.as_secs_f64(),
        timings.renew_deadline,
        promoted.as_secs_f64(),
        timings.duration
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_whose_agent_is_stuck_is_fenced_by_the_watchdog_before_a_standby_is_promoted() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster = Cluster::start(pg_bin, NAMES).await;
    let timings = cluster.timings;
    let old_data = cluster.pgdata("db-0");
    cluster.start_writer();
    writes_for(&cluster, Duration::from_millis(500), 5).await;
    // The fault: the primary's agent blocks in an API call and never runs its own fence check.
    let stuck = Instant::now();
    cluster.world.lock().unwrap().hung.insert("db-0".into());
    cluster
        .wait_for(
            "the stuck agent's server to be fenced",
            timings.renew_deadline + Duration::from_secs(5),
            async || !postmaster_alive(&old_data),
        )
        .await;
    let fenced = stuck.elapsed();
    assert!(fenced <= timings.renew_deadline + Duration::from_secs(1), "fenced after {fenced:?}");
    cluster.wait_primary("db-1", Duration::from_secs(30)).await;
    let promoted = stuck.elapsed();
    assert!(promoted > fenced, "promoted at {promoted:?}, before the old primary stopped at {fenced:?}");
    let new_port = cluster.port("db-1");
    first_commit_after(&cluster, stuck, new_port, "a commit on the new primary").await;
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, new_port).await;
    cluster.world.lock().unwrap().hung.remove("db-0");
    cluster.assert_follows("db-0", "db-1").await;
    eprintln!(
        "FIGURES stuck agent: fenced by the watchdog {:.2} s after its last step (renew deadline {:?}), standby promoted after {:.2} s; {} acknowledged, {} lost (asynchronous)",
        fenced.as_secs_f64(),
        timings.renew_deadline,
        promoted.as_secs_f64(),
        acknowledged.len(),
        lost.len()
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_writes_only_lease_renewals() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster = Cluster::start(pg_bin, NAMES).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_millis(500), 5).await;
    // From a settled state: a standby whose stream is still (re)connecting changes its report
    // legitimately (seen in CI under load: wal_receiver false at the first look, true later).
    cluster.wait_streaming("db-1").await;
    let before = {
        let world = cluster.world.lock().unwrap();
        (world.lease_writes, world.reports.clone())
    };
    let window = Duration::from_secs(5);
    tokio::time::sleep(window).await;
    let (renewals, reports) = {
        let world = cluster.world.lock().unwrap();
        (world.lease_writes - before.0, world.reports.clone())
    };
    let expected = window.as_secs_f64() / cluster.timings.renew_period.as_secs_f64();
    assert!((renewals as f64) <= expected + 1.0, "{renewals} lease writes in {window:?}");
    assert!(renewals >= 1, "the primary must renew its lease");
    assert_eq!(reports, before.1, "reports are republished only on change, even under writes");
    eprintln!("FIGURES steady state: {renewals} lease writes in {window:?}, no report writes, while committing");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_status_command_reports_role_timeline_and_positions() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let cluster = Cluster::start(pg_bin, NAMES).await;
    let status = |name: &str, extra: &[&str]| {
        let socket_dir = cluster.socket_dir(name);
        std::process::Command::new(env!("CARGO_BIN_EXE_dbservice-operator"))
            .args(["instance", "status", "--user", loopback::SUPERUSER, "--socket-dir"])
            .arg(socket_dir)
            .args(["--port", &cluster.port(name).to_string()])
            .args(extra)
            .output()
            .expect("run dbservice-operator")
    };
    for (name, in_recovery) in [("db-0", false), ("db-1", true)] {
        // A standby's stream legitimately reconnects once after start (it moves onto its
        // replication slot), so the standby's answer is polled until it streams, with a deadline.
        let deadline = Instant::now() + Duration::from_secs(60);
        let json = loop {
            let output = status(name, &[]);
            assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
            let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON line");
            if json["streaming"] == in_recovery || Instant::now() > deadline {
                break json;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(json["inRecovery"], in_recovery, "{json}");
        assert_eq!(json["timeline"], 1, "{json}");
        let position = if in_recovery { "receivedLsn" } else { "currentLsn" };
        let lsn: dbservice_operator::lsn::Lsn = json[position].as_str().expect(position).parse().unwrap();
        assert!(lsn.0 > 0, "{json}");
        assert_eq!(json["streaming"], in_recovery, "{json}");
    }
    let bad_flag = status("db-0", &["--timeout-seconds", "0"]);
    assert_eq!(bad_flag.status.code(), Some(2));
    let message = String::from_utf8_lossy(&bad_flag.stderr);
    assert_eq!(message.trim().lines().count(), 1, "{message}");
    assert!(message.contains("--timeout-seconds"), "{message}");
    let unreachable = std::process::Command::new(env!("CARGO_BIN_EXE_dbservice-operator"))
        .args(["instance", "status", "--socket-dir", "/nonexistent", "--timeout-seconds", "2"])
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unreachable.stderr).contains("connect to local postgres"));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_primary_whose_agent_holds_the_lease_restarts_in_place() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    // A failover delay longer than crash recovery: the restart in place wins.
    let settings = FailoverSettings { failover_delay: Duration::from_secs(10), ..Default::default() };
    let mut cluster = Cluster::start_with(pg_bin, NAMES, settings).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;

    let pgdata = cluster.pgdata("db-0");
    let old_pid = loopback::postmaster_pid(&pgdata);
    let crashed = Instant::now();
    signal_postgres(&pgdata, libc::SIGKILL);
    let port = cluster.port("db-0");
    cluster
        .wait_for("a new postmaster", Duration::from_secs(30), async || {
            loopback::postmaster_pid(&pgdata) != old_pid && postmaster_alive(&pgdata)
        })
        .await;
    let restarted = Instant::now();
    let recovery = first_commit_after(&cluster, restarted, port, "a commit after the restart").await - crashed;
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, port).await;
    assert!(lost.is_empty(), "crash recovery in place keeps every acknowledged commit: {lost:?}");
    assert!(primary_changes(&cluster).is_empty(), "no failover for a crash the agent recovers from");
    assert_eq!(cluster.scalar(port, "SELECT timeline_id::text FROM pg_control_checkpoint()").await, "1");
    cluster.assert_follows("db-1", "db-0").await;
    eprintln!(
        "FIGURES crash in place (postmaster SIGKILL, agent alive): {:.2} s to the next commit; {} acknowledged, 0 lost",
        recovery.as_secs_f64(),
        acknowledged.len()
    );
    cluster.shutdown().await;
}

/// The instance that is the current primary (settled).
fn current_primary(cluster: &Cluster) -> String {
    cluster.world.lock().unwrap().status.current_primary.clone().expect("a current primary")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_replication_keeps_every_acknowledged_commit_through_a_failover() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let names = &["db-0", "db-1", "db-2"];
    let settings = FailoverSettings { synchronous_standbys: 1, ..Default::default() };
    let mut cluster = Cluster::start_with(pg_bin, names, settings).await;
    let old_port = cluster.port("db-0");
    let show = "SELECT current_setting('synchronous_standby_names')";
    assert_eq!(cluster.scalar(old_port, show).await, r#"ANY 1 ("db-1","db-2")"#);

    // With no standby connected, a commit waits instead of being acknowledged by the primary alone.
    cluster.kill_pod("db-1");
    cluster.kill_pod("db-2");
    let waiting = tokio::spawn(loopback::query(old_port, "CREATE TABLE durability_probe (id int)"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "a commit was acknowledged with no synchronous standby connected");
    cluster.recreate_pod("db-2");
    let committed = tokio::time::timeout(Duration::from_secs(60), waiting).await;
    assert!(committed.is_ok_and(|joined| joined.unwrap().is_ok()), "the commit completes once a standby is back");
    cluster.recreate_pod("db-1");
    cluster.wait_streaming("db-1").await;
    cluster.wait_streaming("db-2").await;

    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;
    let killed = Instant::now();
    cluster.kill_pod("db-0");
    cluster
        .wait_for("a standby promoted", Duration::from_secs(30), async || {
            let world = cluster.world.lock().unwrap();
            let status = &world.status;
            status.current_primary.as_deref().is_some_and(|primary| primary != "db-0")
                && status.current_primary == status.target_primary
        })
        .await;
    let primary = current_primary(&cluster);
    let new_port = cluster.port(&primary);
    let recovery = first_commit_after(&cluster, killed, new_port, "a commit on the new primary").await - killed;
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, new_port).await;
    assert!(lost.is_empty(), "synchronous replication lost acknowledged commits: {lost:?}");
    let others: Vec<String> = names.iter().filter(|name| **name != primary).map(|name| format!("\"{name}\"")).collect();
    assert_eq!(cluster.scalar(new_port, show).await, format!("ANY 1 ({})", others.join(",")));
    let quorum_waits = cluster
        .world
        .lock()
        .unwrap()
        .actions
        .iter()
        .filter(|(_, action)| matches!(action, Action::WaitingForSynchronousQuorum { .. }))
        .count();
    cluster.recreate_pod("db-0");
    cluster.assert_follows("db-0", &primary).await;
    eprintln!(
        "FIGURES synchronous failover (pod killed, 3 instances, ANY 1): {:.2} s from SIGKILL to the first commit \
         on {primary}; {} acknowledged, 0 lost; {quorum_waits} operator passes waited for the quorum",
        recovery.as_secs_f64(),
        acknowledged.len()
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_primary_pod_hands_over_cleanly_without_losing_commits() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster = Cluster::start(pg_bin, NAMES).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;

    let deleted = Instant::now();
    cluster.delete_pod("db-0").await;
    cluster.wait_primary("db-1", Duration::from_secs(30)).await;
    let new_port = cluster.port("db-1");
    let recovery = first_commit_after(&cluster, deleted, new_port, "a commit on the new primary").await - deleted;
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, new_port).await;
    assert!(lost.is_empty(), "a clean hand-over lost acknowledged commits: {lost:?}");
    cluster.recreate_pod("db-0");
    cluster.assert_follows("db-0", "db-1").await;
    eprintln!(
        "FIGURES primary pod deleted (clean stop by its agent): {:.2} s to the first commit on the new primary; \
         {} acknowledged, 0 lost",
        recovery.as_secs_f64(),
        acknowledged.len()
    );
    cluster.shutdown().await;
}

/// Seen on the real node (object store unreachable, primary pod deleted: 23.5 s): a fast shutdown
/// waits for the archiver's last attempts, which with a store that does not answer last until the
/// server is killed, and the Lease was released only once the server had exited. Emulated: an
/// archive command that hangs. The Lease is released with the end of the commits as soon as the
/// shutdown checkpoint is written, while the server still waits for its archiver: the standby is
/// promoted without waiting for it, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_primary_whose_archiver_hangs_hands_over_at_its_shutdown_checkpoint() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let settings = [("archive_mode", "on"), ("archive_command", "sleep 60")];
    let mut cluster = Cluster::start_with_server_settings(pg_bin, NAMES, FailoverSettings::default(), &settings).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;

    let deleted = Instant::now();
    cluster.terminate_pod("db-0");
    cluster.wait_primary("db-1", Duration::from_secs(30)).await;
    let promoted = deleted.elapsed();
    assert!(
        loopback::postmaster_alive(&cluster.pgdata("db-0")),
        "the old primary had exited before the promotion {promoted:?} later (by its fence watchdog at the renew deadline, or \
         its archiver did not hang): the hand-over waited for the server's exit\n{}",
        cluster.diagnostics()
    );
    assert!(
        promoted < Duration::from_secs(3),
        "the promotion took {promoted:?}: the hand-over waited for the archiver\n{}",
        cluster.diagnostics()
    );
    let new_port = cluster.port("db-1");
    first_commit_after(&cluster, deleted, new_port, "a commit on the new primary").await;
    cluster.delete_pod("db-0").await;
    let released = released_at(&cluster);
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, new_port).await;
    assert!(lost.is_empty(), "acknowledged commits lost: {lost:?}");
    eprintln!(
        "FIGURES primary pod deleted, its archiver hanging: promoted after {:.2} s (Lease released at {released}); \
         {} acknowledged, 0 lost",
        promoted.as_secs_f64(),
        acknowledged.len()
    );
    cluster.shutdown().await;
}

/// Seen on the real node: PostgreSQL killed in the primary, restarted in place by its agent a
/// moment later, and a failover started anyway (the operator saw the crash, not the restart). The
/// standby's stream had ended with the crash and it reconnects only on its retry interval, so the
/// old primary's clean stop sent its last commits to no one and the promotion went ahead without
/// them (12 acknowledged commits lost). Emulated: the stream ends and the standby's reconnection
/// fails once (replication refused for a moment, as by a server still in crash recovery); then a
/// failover starts with the primary healthy. The primary waits for a standby to stream before its
/// clean stop: nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_started_while_the_standby_reconnects_loses_no_acknowledged_commit() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster = Cluster::start(pg_bin, NAMES).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;
    let hba = cluster.pgdata("db-0").join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    end_the_stream(&cluster).await;
    let old_port = cluster.port("db-0");
    std::fs::write(&hba, rules).unwrap();
    cluster.scalar(old_port, "SELECT pg_reload_conf()::text").await;
    let started = Instant::now();
    {
        let mut world = cluster.world.lock().unwrap();
        world.status.target_primary = Some(dbservice_operator::api::failover::PENDING.into());
        world.status.transition =
            Some(Transition { kind: TransitionKind::Failover, from: "db-0".into(), started_at: Utc::now() });
    }
    cluster.wait_primary("db-1", Duration::from_secs(40)).await;
    let new_port = cluster.port("db-1");
    let recovery = first_commit_after(&cluster, started, new_port, "a commit on the new primary").await - started;
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, new_port).await;
    assert!(lost.is_empty(), "the old primary stopped before its standby streamed again: {lost:?}");
    eprintln!(
        "FIGURES failover while the standby reconnects: {:.2} s to the first commit on the new primary; \
         {} acknowledged, 0 lost",
        recovery.as_secs_f64(),
        acknowledged.len()
    );
    cluster.shutdown().await;
}

/// `pg_last_wal_receive_lsn()` of the standby on `port`.
async fn received_lsn(cluster: &Cluster, port: u16) -> Lsn {
    cluster.scalar(port, "SELECT pg_last_wal_receive_lsn()::text").await.parse().unwrap()
}

/// "Latest checkpoint location" of a stopped data directory.
fn checkpoint_location(cluster: &Cluster, name: &str) -> Lsn {
    let output = std::process::Command::new(cluster.pg_bin.join("pg_controldata"))
        .arg("-D")
        .arg(cluster.pgdata(name))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().find(|line| line.starts_with("Latest checkpoint location:")).expect("checkpoint location");
    line.split(':').nth(1).unwrap().trim().parse().unwrap()
}

/// The primary's stream to the standby ends and cannot come back (as when a deleted pod's address
/// stops answering): the primary refuses replication connections, its walsender is terminated.
async fn end_the_stream(cluster: &Cluster) {
    let old_port = cluster.port("db-0");
    // The stream ends and cannot come back: replication connections refused, the walsender ended.
    let hba = cluster.pgdata("db-0").join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("host replication all all reject\n{rules}")).unwrap();
    cluster.scalar(old_port, "SELECT pg_reload_conf()::text").await;
    cluster
        .wait_for("the primary to refuse replication connections", Duration::from_secs(30), async || {
            let sql = "SELECT count(*)::text FROM pg_hba_file_rules WHERE auth_method = 'reject'";
            cluster.scalar(old_port, sql).await == "1"
        })
        .await;
    let terminated = "SELECT count(pg_terminate_backend(pid))::text FROM pg_stat_replication";
    assert_eq!(cluster.scalar(old_port, terminated).await, "1", "one walsender");
    let world = cluster.world.clone();
    cluster
        .wait_for("the standby to stop streaming", Duration::from_secs(30), async || {
            world.lock().unwrap().reports.get("db-1").is_some_and(|report| !report.wal_receiver)
        })
        .await;
}

/// The position the last release of the Lease named.
fn released_at(cluster: &Cluster) -> Lsn {
    let world = cluster.world.lock().unwrap();
    let release = world.lease_history.iter().rev().find(|record| record.holder.is_none());
    release.and_then(|record| record.released_at_lsn).expect("the old primary released the Lease with a position")
}

/// Seen on the real node: the standby of a deleted primary had lost its stream just before the
/// primary's clean stop, so it had every commit but not the records the stop writes (the agent's
/// CHECKPOINT and the shutdown checkpoint, 176 bytes). Emulated: the writer stops, the standby
/// catches up, the primary refuses replication connections (as a deleted pod's address stops
/// answering) and its walsender is terminated; then the pod is deleted. The Lease must name the end of the commits, not the shutdown checkpoint, so that the
/// promotion does not wait RELEASED_WAL_WAIT for records that never come; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_primary_whose_stream_ended_before_its_stop_hands_over_without_waiting() {
    stream_ended_before_the_stop(&[], "").await;
}

/// The same with WAL archiving on: the shutdown then switches to a new segment before its
/// checkpoint, so the standby is short by the rest of the segment, not 176 bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_archiving_a_deleted_primary_whose_stream_ended_before_its_stop_hands_over_without_waiting() {
    stream_ended_before_the_stop(&[("archive_mode", "on"), ("archive_command", "true")], " (archiving on)").await;
}

async fn stream_ended_before_the_stop(server_settings: &[(&str, &str)], what: &str) {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster =
        Cluster::start_with_server_settings(pg_bin, NAMES, FailoverSettings::default(), server_settings).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;
    let acknowledged = cluster.stop_writer().await;
    let (old_port, new_port) = (cluster.port("db-0"), cluster.port("db-1"));
    let primary_end: Lsn = cluster.scalar(old_port, "SELECT pg_current_wal_flush_lsn()::text").await.parse().unwrap();
    cluster
        .wait_for("the standby to receive every commit", Duration::from_secs(30), async || {
            received_lsn(&cluster, new_port).await >= primary_end
        })
        .await;

    end_the_stream(&cluster).await;
    let received = received_lsn(&cluster, new_port).await;

    let deleted = Instant::now();
    cluster.delete_pod("db-0").await;
    cluster.wait_primary("db-1", Duration::from_secs(30)).await;
    let promoted = deleted.elapsed();

    let checkpoint = checkpoint_location(&cluster, "db-0");
    assert!(
        checkpoint > received,
        "the gap was not reproduced: standby at {received}, shutdown checkpoint {checkpoint}"
    );
    let released = released_at(&cluster);
    assert!(released <= received, "released at {released}, beyond what the standby had ({received})");
    assert!(released >= primary_end, "released at {released}, before the last commit ({primary_end})");
    assert!(
        promoted < RELEASED_WAL_WAIT,
        "the promotion took {promoted:?}: it waited for WAL that carries no commit\n{}",
        cluster.diagnostics()
    );
    let stored = cluster.stored_ids(new_port).await;
    let lost: Vec<i64> = acknowledged.iter().copied().filter(|id| !stored.contains(id)).collect();
    assert!(lost.is_empty(), "acknowledged commits lost: {lost:?}");
    eprintln!(
        "FIGURES primary pod deleted after its stream ended{what}: promoted after {:.2} s; the standby was {} \
         bytes short of the shutdown checkpoint {checkpoint}, the Lease released at {released}; {} acknowledged, \
         0 lost",
        promoted.as_secs_f64(),
        checkpoint.bytes_ahead_of(received),
        acknowledged.len()
    );
    cluster.shutdown().await;
}

/// The other side of that check: when the stream ends while commits go on, the Lease names the
/// last of them, beyond what the standby has, so the promotion waits for them (RELEASED_WAL_WAIT,
/// then goes on without them: the known limit of a hand-over whose stream broke, see
/// docs/failover.md). Shows that the end of the data is not cut short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_primary_whose_stream_ended_under_writes_names_the_commits_the_standby_lacks() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster = Cluster::start(pg_bin, NAMES).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;
    let (old_port, new_port) = (cluster.port("db-0"), cluster.port("db-1"));
    end_the_stream(&cluster).await;
    let cut = Instant::now();
    first_commit_after(&cluster, cut, old_port, "a commit after the stream ended").await;
    let received = received_lsn(&cluster, new_port).await;

    let deleted = Instant::now();
    cluster.delete_pod("db-0").await;
    cluster.wait_primary("db-1", Duration::from_secs(30)).await;
    let promoted = deleted.elapsed();
    let (_, lost) = acknowledged_and_lost(&mut cluster, new_port).await;

    let released = released_at(&cluster);
    let checkpoint = checkpoint_location(&cluster, "db-0");
    assert!(released > received, "released at {released}, not beyond the standby's {received}");
    // Commits go on until the fast shutdown, so the last one may end where the shutdown checkpoint begins.
    assert!(released <= checkpoint, "released at {released}, after the shutdown checkpoint {checkpoint}");
    assert!(promoted >= RELEASED_WAL_WAIT, "promoted after {promoted:?} without the missing commits");
    assert!(!lost.is_empty(), "the commits after the stream ended cannot have reached the standby");

    // Issue 38: the old primary rejoins and says how many commits its rewind discarded (counted
    // before pg_rewind): at least every acknowledged one lost.
    cluster.recreate_pod("db-0");
    cluster.assert_follows("db-0", "db-1").await;
    let discarded = cluster.world.lock().unwrap().reports["db-0"].discarded_on_rejoin.clone();
    let discarded = discarded.expect("the former primary reports the commits its rewind discarded");
    assert!(
        discarded.commits >= lost.len() as u64,
        "{} commits discarded, but {} acknowledged ones are missing: {discarded:?}",
        discarded.commits,
        lost.len()
    );
    assert!(discarded.diverged_at.parse::<Lsn>().unwrap() >= received, "{discarded:?} before the standby's {received}");
    eprintln!(
        "FIGURES primary pod deleted after its stream ended under writes: the Lease named {} bytes the standby \
         lacked; promoted after {:.2} s without them, {} acknowledged commits lost; the old primary's rewind \
         discarded {} commits ({} bytes)",
        released.bytes_ahead_of(received),
        promoted.as_secs_f64(),
        lost.len(),
        discarded.commits,
        discarded.bytes
    );
    cluster.shutdown().await;
}

/// A planned switchover promises every acknowledged commit. Its target lost the stream while the
/// old primary went on committing (the operator had accepted the switchover while it streamed):
/// the target must not promote with the gap (before: after RELEASED_WAL_WAIT, losing those
/// commits); the switchover is abandoned at its timeout and the old primary, which holds every
/// commit, is primary again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_whose_target_misses_the_last_wal_is_abandoned_and_the_old_primary_keeps_every_commit() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let settings = FailoverSettings { switchover_timeout: Duration::from_secs(8), ..Default::default() };
    let mut cluster = Cluster::start_with(pg_bin, NAMES, settings).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;
    end_the_stream(&cluster).await;
    let old_port = cluster.port("db-0");
    let stream_ended = Instant::now();
    first_commit_after(&cluster, stream_ended, old_port, "commits the target will lack").await;
    // As the operator decided it a moment earlier, while the target still streamed.
    let requested = Instant::now();
    {
        let mut world = cluster.world.lock().unwrap();
        world.status.target_primary = Some("db-1".into());
        world.status.transition =
            Some(Transition { kind: TransitionKind::Switchover, from: "db-0".into(), started_at: Utc::now() });
    }
    let world = cluster.world.clone();
    cluster
        .wait_for("the switchover to be abandoned", Duration::from_secs(30), async || {
            world.lock().unwrap().actions.iter().any(|(_, action)| {
                matches!(action, Action::TransitionAbandoned { kind: TransitionKind::Switchover, .. })
            })
        })
        .await;
    cluster.wait_primary("db-0", Duration::from_secs(30)).await;
    first_commit_after(&cluster, requested + Duration::from_secs(8), old_port, "a commit on the old primary again")
        .await;
    let outage = cluster.first_ack_after(requested + Duration::from_secs(1), old_port).map(|at| at - requested);
    let promoted_elsewhere: Vec<_> =
        primary_changes(&cluster).into_iter().filter(|(_, _, to, _, _)| to != "db-0").collect();
    assert!(promoted_elsewhere.is_empty(), "the target promoted with a gap: {promoted_elsewhere:?}");
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, old_port).await;
    assert!(lost.is_empty(), "{} of {} acknowledged commits lost: {lost:?}", lost.len(), acknowledged.len());
    eprintln!(
        "FIGURES switchover whose target missed the last WAL: abandoned, old primary back after {:.2} s; {} acknowledged, 0 lost",
        outage.unwrap_or_default().as_secs_f64(),
        acknowledged.len()
    );
    cluster.shutdown().await;
}

/// A former primary whose data is on an older timeline than the Lease names never starts as
/// primary, even when a stale status names it: another instance was promoted since, and starting
/// it would fork the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_primary_never_starts_as_primary_behind_the_lease_timeline() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster = Cluster::start(pg_bin, NAMES).await;
    cluster.kill_pod("db-0");
    cluster.wait_primary("db-1", Duration::from_secs(40)).await;
    let world = cluster.world.clone();
    cluster
        .wait_for("the new primary's timeline in the Lease", Duration::from_secs(30), async || {
            world.lock().unwrap().lease.timeline == Some(2)
        })
        .await;
    // The fault: the operator's view goes stale and names the old primary (timeline 1) again.
    let stale_from = {
        let mut world = world.lock().unwrap();
        world.operator_paused = true;
        world.status.current_primary = Some("db-0".into());
        world.status.target_primary = Some("db-0".into());
        world.status.timeline = Some(1);
        world.lease_history.len()
    };
    let new_data = cluster.pgdata("db-1");
    cluster
        .wait_for("db-1 to step down and release the Lease", Duration::from_secs(30), async || {
            !postmaster_alive(&new_data) && world.lock().unwrap().lease.holder.is_none()
        })
        .await;
    cluster.recreate_pod("db-0");
    let old_data = cluster.pgdata("db-0");
    // Several agent steps (200 ms each) with the Lease free and the status naming db-0.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        assert!(!postmaster_alive(&old_data), "db-0 started as primary on timeline 1 behind a Lease on timeline 2");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let holders: Vec<_> =
        world.lock().unwrap().lease_history[stale_from..].iter().filter_map(|record| record.holder.clone()).collect();
    assert!(!holders.contains(&"db-0".to_string()), "db-0 took the Lease: {holders:?}");
    world.lock().unwrap().operator_paused = false;
    cluster.shutdown().await;
}

/// Two primaries lost within seconds, three instances: the second failover's standbys may still
/// be on the first primary's timeline (they had not followed the new primary yet), so they are no
/// candidates (promoting one would drop the new timeline's commits and reuse its number). The
/// database comes back once the second primary's pod is back, with every commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_primaries_lost_within_seconds_come_back_without_forking_the_history() {
    let Some(pg_bin) = loopback::pg_bin() else { return };
    let mut cluster = Cluster::start(pg_bin, &["db-0", "db-1", "db-2"]).await;
    cluster.start_writer();
    writes_for(&cluster, Duration::from_secs(1), 20).await;
    cluster.kill_pod("db-0");
    let world = cluster.world.clone();
    let second = {
        let mut second = None;
        cluster
            .wait_for("the first failover's new primary", Duration::from_secs(40), async || {
                second = world.lock().unwrap().status.current_primary.clone().filter(|now| now != "db-0");
                second.is_some()
            })
            .await;
        second.unwrap()
    };
    cluster.kill_pod(&second);
    cluster.recreate_pod("db-0");
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.recreate_pod(&second);
    let primary = {
        let mut settled = None;
        cluster
            .wait_for("one primary again", Duration::from_secs(150), async || {
                let world = world.lock().unwrap();
                let status = &world.status;
                settled = status
                    .current_primary
                    .clone()
                    .filter(|current| status.target_primary.as_ref() == Some(current) && status.transition.is_none());
                settled.as_ref().is_some_and(|current| {
                    world.reports.get(current).is_some_and(|report| {
                        report.postgres_ready && report.role == dbservice_operator::api::failover::Role::Primary
                    })
                })
            })
            .await;
        settled.unwrap()
    };
    let port = cluster.port(&primary);
    let (acknowledged, lost) = acknowledged_and_lost(&mut cluster, port).await;
    eprintln!(
        "FIGURES two primaries lost: {primary} primary; {} acknowledged, {} lost",
        acknowledged.len(),
        lost.len()
    );
    cluster.shutdown().await;
}
