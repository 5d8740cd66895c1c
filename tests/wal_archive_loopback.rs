//! Continuous WAL archiving with real PostgreSQL and a real S3-compatible server on loopback.
//!
//! PostgreSQL runs with `archive_command = dbservice-operator wal-archive %p %f`; the store is
//! moto_server (`pip install 'moto[server]'`, started by tests/support/object_store.rs), reached
//! through a TCP relay owned by the test so that "the store is down" (connection refused), "it
//! answers 500" and "it is back" need no restart of moto, whose state lives in memory.
//!
//! The first test asserts that switched segments land in the bucket, that while the store is down
//! PostgreSQL keeps failing and retrying without losing a segment, that archiving catches up once
//! it is back, and that `wal-restore` returns each segment byte for byte. The second runs the real
//! instance agent (tests/support/loopback.rs) and follows its archiving report and the operator's
//! ContinuousArchiving condition through 500s, refused connections and recovery (issue 12).
//!
//! Without PostgreSQL or moto_server the tests are skipped, except under CI=true, where they first
//! try to install them and otherwise fail.

#[path = "support/loopback.rs"]
mod loopback;
#[path = "support/object_store.rs"]
mod object_store;
#[path = "support/ports.rs"]
mod ports;

use dbservice_operator::api::backup::BackupSpec;
use dbservice_operator::api::failover::{ArchivingReport, FailoverSettings};
use dbservice_operator::operator::database::archiving::{
    decide_archiving, FAILING_EVENT, FAILING_REASON, FAILING_TOO_LONG_REASON, RECOVERED_EVENT,
};
use dbservice_operator::operator::journal::Journal;
use object_store::{
    connect, free_port, moto_server, run_as, skip_or_fail, store_environment, wait_for, Sandbox, Store, BINARY, PREFIX,
    SERVER_NAME,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP relay to the store that the test can stop (connection refused), start again, or turn
/// into a server that answers every request with 500 Internal Server Error.
struct Relay {
    address: SocketAddr,
    target: SocketAddr,
    failing: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Relay {
    async fn start(address: SocketAddr, target: SocketAddr) -> Relay {
        let mut relay = Relay { address, target, failing: Arc::default(), task: None };
        relay.resume().await;
        relay
    }

    async fn resume(&mut self) {
        let listener = TcpListener::bind(self.address).await.expect("bind relay");
        let (target, failing) = (self.target, self.failing.clone());
        self.task = Some(tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                let failing = failing.load(Ordering::SeqCst);
                connections.spawn(async move {
                    if failing {
                        answer_500(&mut inbound).await;
                    } else if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        }));
    }

    /// Closes the listening socket and every relayed connection (the JoinSet aborts on drop).
    async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// New connections get 500s (true) or reach the store (false).
    fn fail_with_500(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
}

/// Reads a request head and answers 500, closing the connection (a store that is up but broken).
async fn answer_500(stream: &mut TcpStream) {
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") && head.len() < 64 * 1024 {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await {
            Ok(Ok(read)) if read > 0 => head.extend_from_slice(&buffer[..read]),
            _ => return,
        }
    }
    let body = "<Error><Code>InternalError</Code><Message>injected by the test</Message></Error>";
    let response = format!(
        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// PostgreSQL's binaries and moto_server, or None once it was said why the test is skipped
/// (under CI=true their absence fails the test).
fn tools() -> Option<(PathBuf, PathBuf)> {
    let bin = loopback::pg_bin()?;
    let Some(moto) = moto_server() else {
        skip_or_fail("no moto_server (python3 -m pip install 'moto[server]')");
        return None;
    };
    Some((bin, moto))
}

/// A directory the PostgreSQL user may use, and moto_server behind a relay the test controls.
struct Harness {
    temporary: tempfile::TempDir,
    owner: Option<(u32, u32)>,
    /// The store, reached directly (not through the relay the test breaks).
    store: Store,
    relay: Relay,
    /// The relay's endpoint, which PostgreSQL archives to.
    endpoint: String,
}

impl Harness {
    async fn start(moto: &Path) -> Harness {
        let owner = run_as();
        let temporary = tempfile::Builder::new().prefix("dbservice-wal-archive-").tempdir_in("/tmp").unwrap();
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(temporary.path(), Some(uid), Some(gid)).unwrap();
        }
        let store = Store::start(moto, &temporary.path().join("moto.log")).await;
        let target: SocketAddr = store.endpoint.trim_start_matches("http://").parse().unwrap();
        let address: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let relay = Relay::start(address, target).await;
        Harness { temporary, owner, store, relay, endpoint: format!("http://{address}") }
    }

    fn base(&self) -> PathBuf {
        self.temporary.path().to_path_buf()
    }
}

/// (archived_count, last_archived_wal, failed_count) from pg_stat_archiver.
async fn archiver(client: &tokio_postgres::Client) -> (i64, String, i64) {
    let row = client
        .query_one("select archived_count, coalesce(last_archived_wal, ''), failed_count from pg_stat_archiver", &[])
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// Writes rows, switches to a new segment and returns the name of the segment just completed.
async fn write_and_switch(client: &tokio_postgres::Client, rows: i32) -> String {
    client
        .execute("insert into items (payload) select repeat('x', 200) from generate_series(1, $1)", &[&rows])
        .await
        .unwrap();
    let row = client.query_one("select pg_walfile_name(pg_switch_wal())", &[]).await.unwrap();
    row.get(0)
}

fn segment_key(segment: &str) -> String {
    format!("{PREFIX}/{SERVER_NAME}/wal/{}/{segment}.zst", &segment[..8])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_archive_survives_a_store_outage_and_restores_byte_for_byte() {
    let Some((bin, moto)) = tools() else { return };
    let Harness { temporary, owner, store, mut relay, endpoint } = Harness::start(&moto).await;
    let base = temporary.path().to_path_buf();
    let sandbox = Sandbox { bin, base: base.clone(), owner, endpoint: endpoint.clone() };
    let pgdata = sandbox.initdb("pgdata");
    let postgres = sandbox.start(&pgdata, &["wal_keep_size=2GB"]);
    let client = wait_for("PostgreSQL to accept connections", Duration::from_secs(30), async || {
        connect(postgres.port).await.ok()
    })
    .await;
    client.batch_execute("create table items (id bigserial primary key, payload text not null)").await.unwrap();

    // 1. Segments land in the bucket, as PostgreSQL switches them.
    let started = Instant::now();
    let mut segments = Vec::new();
    for _ in 0..8 {
        segments.push(write_and_switch(&client, 2000).await);
    }
    let last = segments.last().unwrap().clone();
    wait_for("the first segments to be archived", Duration::from_secs(60), async || {
        (archiver(&client).await.1 >= last).then_some(())
    })
    .await;
    let elapsed = started.elapsed();
    eprintln!(
        "archived {} segments in {:.2}s ({:.1} segments/s, debug build, loopback moto_server)",
        segments.len(),
        elapsed.as_secs_f64(),
        segments.len() as f64 / elapsed.as_secs_f64()
    );
    let listed = store.wal_keys().await;
    for segment in &segments {
        assert!(listed.contains(&segment_key(segment)), "{segment} not in the bucket: {listed:?}");
    }

    // 2. The store goes away: PostgreSQL keeps the segments and retries.
    relay.stop().await;
    let (_, _, failed_before) = archiver(&client).await;
    let mut during_outage = Vec::new();
    for _ in 0..2 {
        during_outage.push(write_and_switch(&client, 2000).await);
    }
    wait_for("archive failures to be counted", Duration::from_secs(60), async || {
        (archiver(&client).await.2 >= failed_before + 2).then_some(())
    })
    .await;
    let (_, last_archived, _) = archiver(&client).await;
    assert_eq!(last_archived, last, "nothing may count as archived while the store is down");
    for segment in &during_outage {
        let ready = postgres.pgdata.join("pg_wal/archive_status").join(format!("{segment}.ready"));
        assert!(ready.exists(), "{segment} is no longer waiting for the archiver");
        assert!(postgres.pgdata.join("pg_wal").join(segment).exists(), "{segment} left pg_wal");
    }

    // 3. The store is back: archiving catches up, in order, without a gap.
    relay.resume().await;
    let nudge = write_and_switch(&client, 10).await;
    wait_for("archiving to catch up", Duration::from_secs(120), async || {
        (archiver(&client).await.1 >= nudge).then_some(())
    })
    .await;
    for segment in during_outage.iter().chain([&nudge]) {
        assert!(
            store.client.head_object(&segment_key(segment)).await.unwrap().is_some(),
            "{segment} missing after recovery"
        );
    }

    // 4. wal-restore returns every archived segment byte for byte; a missing one is an error exit.
    for segment in segments.iter().chain(&during_outage) {
        let restored = base.join(format!("restored-{segment}"));
        let status = Command::new(BINARY)
            .args(["wal-restore", segment, restored.to_str().unwrap()])
            .envs(store_environment(&endpoint))
            .status()
            .unwrap();
        assert!(status.success(), "wal-restore {segment} failed");
        let original = std::fs::read(postgres.pgdata.join("pg_wal").join(segment)).unwrap();
        assert!(std::fs::read(&restored).unwrap() == original, "{segment} differs after restore");
    }
    let missing = Command::new(BINARY)
        .args(["wal-restore", "0000000100000000000000FF", base.join("missing").to_str().unwrap()])
        .envs(store_environment(&endpoint))
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!missing.success() && !base.join("missing").exists(), "a missing segment must fail wal-restore");

    // 5. Archiving the same segment again succeeds; another file under its name is refused.
    let segment_path = postgres.pgdata.join("pg_wal").join(&segments[0]);
    let archive = |path: &Path| {
        Command::new(BINARY)
            .args(["wal-archive", path.to_str().unwrap(), &segments[0]])
            .envs(store_environment(&endpoint))
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    assert!(archive(&segment_path), "archiving the same segment twice must succeed");
    let impostor = base.join("impostor");
    std::fs::write(&impostor, vec![7u8; 1024]).unwrap();
    assert!(!archive(&impostor), "a different file under an archived name must be refused");

    // 6. DELETE removes an object (what retention will use); deleting it again is not an error.
    let key = segment_key(&segments[0]);
    store.client.delete_object(&key).await.unwrap();
    assert!(store.client.head_object(&key).await.unwrap().is_none(), "{key} still there after DeleteObject");
    store.client.delete_object(&key).await.unwrap();

    // 7. An object without wal-archive's checksum (written by something else) is never restored.
    let original = std::fs::read(postgres.pgdata.join("pg_wal").join(&segments[1])).unwrap();
    let stranger = "0000000100000000000000FE";
    store.client.put_object(&segment_key(stranger), original.into(), &[]).await.unwrap();
    let output = Command::new(BINARY)
        .args(["wal-restore", stranger, base.join("stranger").to_str().unwrap()])
        .envs(store_environment(&endpoint))
        .output()
        .unwrap();
    assert!(!output.status.success() && !base.join("stranger").exists(), "an unverified object was restored");
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("checksum"), "{message}");

    // 8. Another database system (a re-created DatabaseService) never archives into this place.
    let other = sandbox.initdb("other");
    let first_segment = std::fs::read_dir(other.join("pg_wal"))
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .find(|name| name.len() == 24)
        .expect("initdb wrote a first segment");
    let output = Command::new(BINARY)
        .args(["wal-archive", other.join("pg_wal").join(&first_segment).to_str().unwrap(), &first_segment])
        .envs(store_environment(&endpoint))
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "another system archived into this archive");
    assert!(message.contains("belongs to database system"), "{message}");
    drop(client);
}

/// pg_stat_archiver of a loopback-harness instance, over TCP: (last_archived_wal, failed_count).
async fn archiver_over_tcp(port: u16) -> (String, i64) {
    let rows = loopback::query(port, "select coalesce(last_archived_wal, ''), failed_count from pg_stat_archiver")
        .await
        .unwrap();
    (rows[0].get(0), rows[0].get(1))
}

/// Writes rows over TCP, switches to a new segment and returns the one just completed.
async fn write_and_switch_over_tcp(port: u16) -> String {
    loopback::query(port, "insert into items (payload) select repeat('x', 200) from generate_series(1, 2000)")
        .await
        .unwrap();
    loopback::query(port, "select pg_walfile_name(pg_switch_wal())").await.unwrap()[0].get(0)
}

/// Segment number of a WAL file name (16 MiB segments: 256 per "log").
fn segment_number(segment: &str) -> u64 {
    let log = u64::from_str_radix(&segment[8..16], 16).unwrap();
    let number = u64::from_str_radix(&segment[16..24], 16).unwrap();
    log * 0x100 + number
}

/// The operator's view of `report` at `now`: (condition "status/reason", event reasons).
fn operator_view(
    backup: &BackupSpec,
    report: Option<&ArchivingReport>,
    status: &mut dbservice_operator::api::database_service::DatabaseServiceStatus,
    now: chrono::DateTime<chrono::Utc>,
) -> (String, Vec<String>) {
    let mut journal = Journal::default();
    decide_archiving(Some(backup), Some("db-0"), report, status, &mut journal, 1, now);
    let condition = status
        .conditions
        .iter()
        .find(|condition| condition.type_ == "ContinuousArchiving")
        .map(|condition| format!("{}/{}", condition.status, condition.reason))
        .unwrap_or_default();
    (condition, journal.reasons().into_iter().map(String::from).collect())
}

/// The real instance agent runs PostgreSQL archiving through `wal-archive` to moto_server behind a
/// relay; the store answers 500s, then refuses connections, then comes back. Asserts that
/// PostgreSQL keeps the segments (.ready in pg_wal) and retries, that the agent publishes exactly
/// one report when archiving starts failing (none per archived segment or per retry) and one
/// when it recovers, that the operator's ContinuousArchiving condition turns False, warns after
/// the threshold and recovers, and that the archive then holds every segment without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_failures_turn_the_report_and_condition_false_and_nothing_is_lost() {
    let Some((bin, moto)) = tools() else { return };
    let mut harness = Harness::start(&moto).await;
    let (base, endpoint) = (harness.base(), harness.endpoint.clone());
    // The pod's archive_command is the binary with the store in its environment; here a script
    // carries that environment (the agent starts PostgreSQL with the test's own).
    let script = base.join("wal-archive.sh");
    let exports: String =
        store_environment(&endpoint).iter().map(|(name, value)| format!("export {name}='{value}'\n")).collect();
    std::fs::write(&script, format!("#!/bin/sh\n{exports}exec '{BINARY}' wal-archive \"$1\" \"$2\"\n")).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let archive_command = format!("'{}' %p %f", script.display());
    let settings = [("archive_mode", "on"), ("archive_command", archive_command.as_str())];
    let cluster =
        loopback::Cluster::start_with_server_settings(bin, &["db-0"], FailoverSettings::default(), &settings).await;
    let (port, pgdata) = (cluster.port("db-0"), cluster.pgdata("db-0"));
    let world = cluster.world.clone();
    let report = move || world.lock().unwrap().reports.get("db-0").and_then(|report| report.archiving.clone());
    let world = cluster.world.clone();
    let publishes = move || world.lock().unwrap().publishes;
    let backup = BackupSpec { archive_failure_warning_seconds: Some(30), ..Default::default() };
    let mut status = dbservice_operator::api::database_service::DatabaseServiceStatus::default();

    // 1. Archiving works: the report says so once, and archived segments publish nothing.
    wait_for("a healthy archiving report", Duration::from_secs(60), async || report().filter(|report| !report.failing))
        .await;
    loopback::query(port, "create table items (id bigserial primary key, payload text not null)").await.unwrap();
    let published_healthy = publishes();
    let mut segments = Vec::new();
    for _ in 0..6 {
        segments.push(write_and_switch_over_tcp(port).await);
    }
    let last = segments.last().unwrap().clone();
    wait_for("the first segments to be archived", Duration::from_secs(60), async || {
        (archiver_over_tcp(port).await.0 >= last).then_some(())
    })
    .await;
    assert_eq!(operator_view(&backup, report().as_ref(), &mut status, chrono::Utc::now()).0, "True/Archiving");

    // 2. The store answers 500: PostgreSQL keeps the segments and retries; one report says so.
    harness.relay.fail_with_500(true);
    let failed_before = archiver_over_tcp(port).await.1;
    let mut outage = Vec::new();
    for _ in 0..2 {
        outage.push(write_and_switch_over_tcp(port).await);
    }
    let failing = wait_for("the agent to report failing archiving", Duration::from_secs(60), async || {
        report().filter(|report| report.failing)
    })
    .await;
    assert_eq!(failing.failed_wal.as_deref(), Some(outage[0].as_str()), "{failing:?}");
    let since = failing.failing_since.expect("the start of the failing streak");
    assert_eq!(publishes(), published_healthy + 1, "6 archived segments and a failure: one report, the failure");
    let (condition, events) = operator_view(&backup, Some(&failing), &mut status, chrono::Utc::now());
    assert_eq!((condition.as_str(), events.len()), (format!("False/{FAILING_REASON}").as_str(), 0));
    assert!(status.conditions[0].message.contains(&outage[0]), "{}", status.conditions[0].message);
    // More segments and retries: PostgreSQL fails again and again; the report does not move.
    outage.push(write_and_switch_over_tcp(port).await);
    wait_for("PostgreSQL to retry", Duration::from_secs(60), async || {
        (archiver_over_tcp(port).await.1 >= failed_before + 4).then_some(())
    })
    .await;
    assert_eq!(archiver_over_tcp(port).await.0, last, "nothing may count as archived while the store fails");
    for segment in &outage {
        let ready = pgdata.join("pg_wal/archive_status").join(format!("{segment}.ready"));
        assert!(ready.exists(), "{segment} is no longer waiting for the archiver");
        assert!(pgdata.join("pg_wal").join(segment).exists(), "{segment} left pg_wal");
    }

    // 3. The store goes away altogether: the same streak; past the threshold the operator warns.
    harness.relay.stop().await;
    harness.relay.fail_with_500(false);
    outage.push(write_and_switch_over_tcp(port).await);
    let warned = wait_for("the warning threshold", Duration::from_secs(90), async || {
        let now = chrono::Utc::now();
        let view = operator_view(&backup, report().as_ref(), &mut status, now);
        (view.0 == format!("False/{FAILING_TOO_LONG_REASON}")).then_some(view.1)
    })
    .await;
    assert_eq!(warned, [FAILING_EVENT], "the warning fires once, when the threshold is crossed");
    assert_eq!(report().and_then(|report| report.failing_since), Some(since), "a streak keeps its start");
    assert_eq!(publishes(), published_healthy + 1, "retries publish nothing");

    // 4. The store is back: archiving catches up; one report, and the operator records recovery.
    harness.relay.resume().await;
    let nudge = write_and_switch_over_tcp(port).await;
    wait_for("archiving to catch up", Duration::from_secs(120), async || {
        (archiver_over_tcp(port).await.0 >= nudge).then_some(())
    })
    .await;
    let healthy =
        wait_for("a healthy report again", Duration::from_secs(30), async || report().filter(|report| !report.failing))
            .await;
    assert_eq!(publishes(), published_healthy + 2, "one report for the failure, one for the recovery");
    let (condition, events) = operator_view(&backup, Some(&healthy), &mut status, chrono::Utc::now());
    assert_eq!((condition.as_str(), events), ("True/Archiving", vec![RECOVERED_EVENT.to_string()]));

    // 5. Nothing is lost: the archive holds every segment from the first to the last, without a
    //    gap, and a segment of the outage restores byte for byte.
    let listed = harness.store.wal_keys().await;
    let archived: std::collections::BTreeSet<u64> = listed
        .iter()
        .filter_map(|key| {
            key.rsplit('/').next()?.strip_suffix(".zst").filter(|name| name.len() == 24).map(segment_number)
        })
        .collect();
    let first = segment_number(&segments[0]);
    for number in first..=segment_number(&nudge) {
        assert!(archived.contains(&number), "segment number {number:X} missing from the archive: {listed:?}");
    }
    let restored = base.join("restored");
    let status_code = Command::new(BINARY)
        .args(["wal-restore", &outage[0], restored.to_str().unwrap()])
        .envs(store_environment(&endpoint))
        .status()
        .unwrap();
    assert!(status_code.success(), "wal-restore {} failed", outage[0]);
    let original = std::fs::read(pgdata.join("pg_wal").join(&outage[0])).unwrap();
    assert!(std::fs::read(&restored).unwrap() == original, "{} differs after restore", outage[0]);
    eprintln!(
        "archived {} segments ({} across the outage) with {} reports published in all",
        segment_number(&nudge) - first + 1,
        outage.len(),
        publishes()
    );
    cluster.shutdown().await;
}

/// Issue 38: with the object store unreachable, a promotion asked for five files and waited 3 s
/// for each (15 s of a switchover). A standby's `wal-restore` remembers a store that did not answer
/// (`--unanswered-mark`) and, for the next seconds, answers "not there" at once; after the window
/// it asks again. Without `--standby` (a recovery, which must not skip the archive) it always asks.
#[test]
fn a_standby_remembers_a_store_that_did_not_answer_for_a_few_seconds() {
    // A store that accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming() {
            held.push(stream);
        }
    });
    let work = tempfile::tempdir().unwrap();
    let mark = work.path().join("unanswered");
    let restore = |file: &str, standby: bool| {
        let mut command = Command::new(BINARY);
        command.arg("wal-restore").arg("--timeout-seconds=1").arg(format!("--unanswered-mark={}", mark.display()));
        if standby {
            command.arg("--standby");
        }
        let started = Instant::now();
        let output = command
            .args([file, work.path().join(file).to_str().unwrap()])
            .envs(store_environment(&endpoint))
            .output()
            .unwrap();
        assert!(!output.status.success(), "{file} restored from a store that never answers");
        (String::from_utf8_lossy(&output.stderr).into_owned(), started.elapsed())
    };

    let (message, took) = restore("000000010000000000000005", true);
    assert!(took >= Duration::from_millis(900), "the first request took {took:?}: {message}");
    assert!(mark.exists(), "the unanswered store is remembered: {message}");
    let (message, took) = restore("00000002.history", true);
    assert!(took < Duration::from_millis(500), "asked again within the window ({took:?}): {message}");
    assert!(message.contains("did not answer"), "{message}");

    let (message, took) = restore("00000002.history", false);
    assert!(took >= Duration::from_millis(900), "a recovery skipped the archive ({took:?}): {message}");

    let past = std::time::SystemTime::now() - Duration::from_secs(11);
    std::fs::File::options().write(true).open(&mark).unwrap().set_modified(past).unwrap();
    let (message, took) = restore("00000003.history", true);
    assert!(took >= Duration::from_millis(900), "did not ask again after the window ({took:?}): {message}");
}
