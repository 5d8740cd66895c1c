//! Continuous WAL archiving with real PostgreSQL and a real S3-compatible server on loopback.
//!
//! PostgreSQL runs with `archive_command = dbservice-operator wal-archive %p %f`; the store is
//! moto_server (`pip install 'moto[server]'`), reached through a TCP relay owned by the test so
//! that "the store is down" (connection refused) and "it is back" need no restart of moto, whose
//! state lives in memory. The test asserts that switched segments land in the bucket, that while
//! the store is down PostgreSQL keeps failing and retrying without losing a segment, that archiving
//! catches up once it is back, and that `wal-restore` returns each segment byte for byte.
//!
//! Without PostgreSQL or moto_server the test is skipped, except under CI=true, where it first
//! tries to install moto_server with pip and otherwise fails.

use dbservice_operator::backup::client::{Addressing, S3Client, StoreSettings};
use dbservice_operator::backup::signing::AccessKey;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

const BUCKET: &str = "wal-archive-test";
const PREFIX: &str = "loopback";
const SERVER_NAME: &str = "orders";
const BINARY: &str = env!("CARGO_BIN_EXE_dbservice-operator");

fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value == "true")
}

fn skip_or_fail(what: &str) -> bool {
    assert!(!is_ci(), "CI=true but {what}");
    eprintln!("SKIPPED: {what}");
    false
}

fn pg_bin() -> Option<PathBuf> {
    if let Ok(bin) = std::env::var("DBSERVICE_TEST_PG_BIN") {
        return Some(PathBuf::from(bin));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| Some((entry.file_name().to_str()?.parse().ok()?, entry.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| bin.join("postgres").is_file() && bin.join("initdb").is_file())
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|directory| directory.join(name))
        .find(|candidate| candidate.is_file())
}

/// moto_server, installed with pip under CI when missing.
fn moto_server() -> Option<PathBuf> {
    if let Some(found) = find_on_path("moto_server") {
        return Some(found);
    }
    if is_ci() {
        let _ = Command::new("python3").args(["-m", "pip", "install", "-q", "moto[server]"]).status();
        let scripts = Command::new("python3")
            .args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"])
            .output()
            .ok()
            .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()).join("moto_server"));
        return find_on_path("moto_server").or(scripts.filter(|path| path.is_file()));
    }
    None
}

/// (uid, gid) to run PostgreSQL as when the test runs as root: it refuses to run as root.
fn run_as() -> Option<(u32, u32)> {
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    ["postgres", "nobody"]
        .iter()
        .find_map(|wanted| {
            passwd.lines().map(|line| line.split(':').collect::<Vec<_>>()).find_map(|fields| {
                (fields.len() > 3 && fields[0] == *wanted)
                    .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))?
            })
        })
        .or_else(|| panic!("running as root, but no postgres or nobody user to run PostgreSQL"))
}

fn free_port() -> u16 {
    StdTcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Kills a child process when dropped (also when the test panics).
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TCP relay to the store that the test can stop (connection refused) and start again.
struct Relay {
    address: SocketAddr,
    target: SocketAddr,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Relay {
    async fn start(address: SocketAddr, target: SocketAddr) -> Relay {
        let mut relay = Relay { address, target, task: None };
        relay.resume().await;
        relay
    }

    async fn resume(&mut self) {
        let listener = TcpListener::bind(self.address).await.expect("bind relay");
        let target = self.target;
        self.task = Some(tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
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
}

struct Postgres {
    port: u16,
    pgdata: PathBuf,
    _server: Process,
}

async fn connect(port: u16) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"),
        tokio_postgres::NoTls,
    )
    .await?;
    tokio::spawn(connection);
    Ok(client)
}

async fn wait_for<T>(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn store_environment(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("DBSERVICE_S3_ENDPOINT", endpoint.to_string()),
        ("DBSERVICE_S3_BUCKET", BUCKET.to_string()),
        ("DBSERVICE_S3_PATH", PREFIX.to_string()),
        ("DBSERVICE_BACKUP_SERVER_NAME", SERVER_NAME.to_string()),
        ("DBSERVICE_S3_REGION", "us-east-1".to_string()),
        ("AWS_ACCESS_KEY_ID", "test-key".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "test-secret".to_string()),
        ("DBSERVICE_S3_TIMEOUT_SECONDS", "5".to_string()),
    ]
}

fn start_postgres(bin: &Path, base: &Path, owner: Option<(u32, u32)>, endpoint: &str) -> Postgres {
    let pgdata = base.join("pgdata");
    let as_owner = |command: &mut Command| {
        if let Some((uid, gid)) = owner {
            command.uid(uid).gid(gid);
        }
    };
    let mut initdb = Command::new(bin.join("initdb"));
    initdb.args(["-D", pgdata.to_str().unwrap(), "-U", "postgres", "--auth=trust", "--no-sync"]).stdout(Stdio::null());
    as_owner(&mut initdb);
    assert!(initdb.status().expect("run initdb").success(), "initdb failed");
    let port = free_port();
    let settings = format!(
        "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\narchive_mode = on\n\
         archive_command = '\"{BINARY}\" wal-archive %p %f'\nwal_keep_size = '2GB'\nfsync = off\n",
        base.display()
    );
    let configuration = pgdata.join("postgresql.conf");
    let mut content = std::fs::read_to_string(&configuration).unwrap();
    content.push_str(&settings);
    std::fs::write(&configuration, content).unwrap();
    let log = std::fs::File::create(base.join("postgres.log")).unwrap();
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(base.join("postgres.log"), Some(uid), Some(gid)).unwrap();
    }
    let mut postgres = Command::new(bin.join("postgres"));
    postgres
        .args(["-D", pgdata.to_str().unwrap()])
        .envs(store_environment(endpoint))
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    as_owner(&mut postgres);
    let server = Process(postgres.spawn().expect("start postgres"));
    Postgres { port, pgdata, _server: server }
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
    let Some(bin) = pg_bin() else {
        skip_or_fail("no PostgreSQL binaries (apt-get install postgresql-15, or set DBSERVICE_TEST_PG_BIN)");
        return;
    };
    let Some(moto) = moto_server() else {
        skip_or_fail("no moto_server (python3 -m pip install 'moto[server]')");
        return;
    };
    let owner = run_as();
    let temporary = tempfile::Builder::new().prefix("dbservice-wal-archive-").tempdir_in("/tmp").unwrap();
    let base = temporary.path().to_path_buf();
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(&base, Some(uid), Some(gid)).unwrap();
    }

    let moto_port = free_port();
    let moto_log = std::fs::File::create(base.join("moto.log")).unwrap();
    let _moto = Process(
        Command::new(&moto)
            .args(["-H", "127.0.0.1", "-p", &moto_port.to_string()])
            .stdout(moto_log.try_clone().unwrap())
            .stderr(moto_log)
            .spawn()
            .expect("start moto_server"),
    );
    let relay_address: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut relay = Relay::start(relay_address, format!("127.0.0.1:{moto_port}").parse().unwrap()).await;
    let endpoint = format!("http://{relay_address}");
    let store = S3Client::new(StoreSettings {
        endpoint: endpoint.clone(),
        bucket: BUCKET.to_string(),
        region: "us-east-1".to_string(),
        access_key: AccessKey { id: "test-key".into(), secret: "test-secret".into() },
        ca_file: None,
        timeout: Duration::from_secs(5),
        addressing: Addressing::Path,
    })
    .unwrap();
    wait_for("moto_server to create the bucket", Duration::from_secs(30), async || store.create_bucket().await.ok())
        .await;

    let postgres = start_postgres(&bin, &base, owner, &endpoint);
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
    let listed: Vec<String> = store
        .list_objects(&format!("{PREFIX}/{SERVER_NAME}/wal/"))
        .await
        .unwrap()
        .into_iter()
        .map(|object| object.key)
        .collect();
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
        assert!(store.head_object(&segment_key(segment)).await.unwrap().is_some(), "{segment} missing after recovery");
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
    store.delete_object(&key).await.unwrap();
    assert!(store.head_object(&key).await.unwrap().is_none(), "{key} still there after DeleteObject");
    store.delete_object(&key).await.unwrap();
    drop(client);
}
