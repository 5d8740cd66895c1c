//! Harness for the backup tests on loopback: moto_server as the S3-compatible store and
//! PostgreSQL servers run as processes (as the `postgres` user when the test runs as root).

#![allow(dead_code)]

use dbservice_operator::store::client::{Addressing, S3Client, StoreSettings};
use dbservice_operator::store::signing::AccessKey;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BUCKET: &str = "backup-test";
pub const PREFIX: &str = "loopback";
pub const SERVER_NAME: &str = "orders";
pub const BINARY: &str = env!("CARGO_BIN_EXE_dbservice-operator");

pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value == "true")
}

/// Skips (prints why) outside CI; fails under CI=true.
pub fn skip_or_fail(what: &str) {
    assert!(!is_ci(), "CI=true but {what}");
    eprintln!("SKIPPED: {what}");
}

pub fn pg_bin() -> Option<PathBuf> {
    if let Ok(bin) = std::env::var("DBSERVICE_TEST_PG_BIN") {
        return Some(PathBuf::from(bin));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| Some((entry.file_name().to_str()?.parse().ok()?, entry.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| bin.join("postgres").is_file() && bin.join("pg_basebackup").is_file())
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
pub fn moto_server() -> Option<PathBuf> {
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
pub fn run_as() -> Option<(u32, u32)> {
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

/// A TCP port for a server started later (see `ports`).
pub fn free_port() -> u16 {
    crate::ports::unused_port()
}

/// Kills a child process when dropped (also when the test panics).
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub async fn connect(port: u16) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"),
        tokio_postgres::NoTls,
    )
    .await?;
    tokio::spawn(connection);
    Ok(client)
}

pub async fn wait_for<T>(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The store settings `wal-archive`, `wal-restore`, `backup` and `restore` read.
pub fn store_environment(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("DBSERVICE_S3_ENDPOINT", endpoint.to_string()),
        ("DBSERVICE_S3_BUCKET", BUCKET.to_string()),
        ("DBSERVICE_S3_PATH", PREFIX.to_string()),
        ("DBSERVICE_BACKUP_SERVER_NAME", SERVER_NAME.to_string()),
        ("DBSERVICE_S3_REGION", "us-east-1".to_string()),
        ("AWS_ACCESS_KEY_ID", "test-key".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "test-secret".to_string()),
        ("DBSERVICE_S3_TIMEOUT_SECONDS", "20".to_string()),
    ]
}

/// A moto_server with our bucket.
pub struct Store {
    pub endpoint: String,
    pub client: S3Client,
    _server: Process,
}

impl Store {
    pub async fn start(moto: &Path, log: &Path) -> Store {
        Store::start_on(moto, log, "127.0.0.1").await
    }

    /// moto_server listening on `host` (e.g. the real node's bridge address, for pods).
    pub async fn start_on(moto: &Path, log: &Path, host: &str) -> Store {
        let port = crate::ports::unused_port();
        let log = std::fs::File::create(log).unwrap();
        let server = Process(
            Command::new(moto)
                .args(["-H", host, "-p", &port.to_string()])
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("start moto_server"),
        );
        let endpoint = format!("http://{host}:{port}");
        let client = S3Client::new(StoreSettings {
            endpoint: endpoint.clone(),
            bucket: BUCKET.to_string(),
            region: "us-east-1".to_string(),
            access_key: AccessKey { id: "test-key".into(), secret: "test-secret".into() },
            ca_file: None,
            timeout: Duration::from_secs(20),
            connect_timeout: None,
            addressing: Addressing::Path,
        })
        .unwrap();
        wait_for("moto_server to create the bucket", Duration::from_secs(30), async || {
            client.create_bucket().await.ok()
        })
        .await;
        Store { endpoint, client, _server: server }
    }
}

impl Store {
    /// Keys of every archived WAL file of the test's server.
    pub async fn wal_keys(&self) -> Vec<String> {
        self.client
            .list_objects(&format!("{PREFIX}/{SERVER_NAME}/wal/"))
            .await
            .unwrap()
            .into_iter()
            .map(|object| object.key)
            .collect()
    }
}

/// A PostgreSQL server process.
pub struct Postgres {
    pub port: u16,
    pub pgdata: PathBuf,
    pub log: PathBuf,
    server: Option<Process>,
}

impl Postgres {
    /// The end of the server log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Kills the server at once (a crash, as far as its WAL is concerned).
    pub fn kill(&mut self) {
        self.server.take();
    }
}

/// Test directories and the user PostgreSQL runs as.
pub struct Sandbox {
    pub bin: PathBuf,
    pub base: PathBuf,
    pub owner: Option<(u32, u32)>,
    pub endpoint: String,
}

impl Sandbox {
    pub fn as_owner<'a>(&self, command: &'a mut Command) -> &'a mut Command {
        if let Some((uid, gid)) = self.owner {
            command.uid(uid).gid(gid);
        }
        command
    }

    /// A directory under the base owned by the PostgreSQL user.
    pub fn directory(&self, name: &str) -> PathBuf {
        let path = self.base.join(name);
        std::fs::create_dir_all(&path).unwrap();
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
        }
        path
    }

    /// initdb with archiving to the store through our binary.
    pub fn initdb(&self, name: &str) -> PathBuf {
        let pgdata = self.base.join(name);
        let mut initdb = Command::new(self.bin.join("initdb"));
        initdb
            .args(["-D", pgdata.to_str().unwrap(), "-U", "postgres", "--auth=trust", "--no-sync"])
            .stdout(Stdio::null());
        assert!(self.as_owner(&mut initdb).status().expect("run initdb").success(), "initdb failed");
        let settings = format!(
            "\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\narchive_mode = on\n\
             archive_command = '\"{BINARY}\" wal-archive %p %f'\nfsync = off\n",
            self.base.display()
        );
        let configuration = pgdata.join("postgresql.conf");
        let mut content = std::fs::read_to_string(&configuration).unwrap();
        content.push_str(&settings);
        std::fs::write(&configuration, content).unwrap();
        pgdata
    }

    /// Starts PostgreSQL on `pgdata` with extra `-c` settings, the store in its environment.
    pub fn start(&self, pgdata: &Path, settings: &[&str]) -> Postgres {
        let port = free_port();
        let name = pgdata.file_name().unwrap().to_string_lossy().to_string();
        let log = self.base.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(&log, Some(uid), Some(gid)).unwrap();
        }
        let mut postgres = Command::new(self.bin.join("postgres"));
        postgres.args(["-D", pgdata.to_str().unwrap(), "-c", &format!("port={port}")]);
        for setting in settings {
            postgres.args(["-c", setting]);
        }
        postgres.envs(store_environment(&self.endpoint)).stdout(file.try_clone().unwrap()).stderr(file);
        let server = Process(self.as_owner(&mut postgres).spawn().expect("start postgres"));
        Postgres { port, pgdata: pgdata.to_path_buf(), log, server: Some(server) }
    }

    /// Runs the operator binary with the store environment; returns stdout, panics on failure.
    pub fn run(&self, args: &[&str]) -> String {
        let mut command = Command::new(BINARY);
        command.args(args).envs(store_environment(&self.endpoint));
        let output = self.as_owner(&mut command).output().expect("run dbservice-operator");
        assert!(
            output.status.success(),
            "dbservice-operator {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// Like [`Sandbox::run`] but returns stderr of a failure instead of panicking.
    pub fn try_run(&self, args: &[&str]) -> Result<String, String> {
        let mut command = Command::new(BINARY);
        command.args(args).envs(store_environment(&self.endpoint));
        let output = self.as_owner(&mut command).output().expect("run dbservice-operator");
        if output.status.success() {
            Ok(String::from_utf8(output.stdout).unwrap())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).to_string())
        }
    }
}

/// A loopback test's world: its temporary directory (owned by the PostgreSQL user), moto_server
/// and the sandbox. None (skipped; under CI=true a failure) without PostgreSQL or moto_server.
pub struct Loopback {
    pub directory: tempfile::TempDir,
    pub store: Store,
    pub sandbox: Sandbox,
}

impl Loopback {
    pub async fn start_or_skip(prefix: &str) -> Option<Loopback> {
        let Some(bin) = pg_bin() else {
            skip_or_fail("no PostgreSQL binaries (apt-get install postgresql-15, or set DBSERVICE_TEST_PG_BIN)");
            return None;
        };
        let Some(moto) = moto_server() else {
            skip_or_fail("no moto_server (python3 -m pip install 'moto[server]')");
            return None;
        };
        let directory = tempfile::Builder::new().prefix(prefix).tempdir_in("/tmp").unwrap();
        let base = directory.path().to_path_buf();
        let owner = run_as();
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&base, Some(uid), Some(gid)).unwrap();
        }
        let store = Store::start(&moto, &base.join("moto.log")).await;
        let sandbox = Sandbox { bin, base, owner, endpoint: store.endpoint.clone() };
        Some(Loopback { directory, store, sandbox })
    }
}

impl Sandbox {
    /// `dbservice-operator backup` of the server on `port` (as postgres); its manifest.
    pub fn base_backup(&self, port: u16) -> serde_json::Value {
        serde_json::from_str(&self.run(&[
            "backup",
            "--host=127.0.0.1",
            &format!("--port={port}"),
            "--user=postgres",
            &format!("--pg-bin-dir={}", self.bin.display()),
            "--wal-wait-seconds=60",
        ]))
        .expect("backup prints its manifest")
    }
}
