//! Streaming-replication test of the PostgreSQL pod scripts (src/operator/database/build/scripts/*.sh).
//!
//! Runs the very scripts the operator ships in the `NAME-scripts` ConfigMap, outside a container
//! (`DBSERVICE_ENTRYPOINT_MODE=standalone`), against Debian's PostgreSQL binaries:
//!   * `pgtest-0` (primary) initializes a cluster, creates the replication role and starts;
//!   * `pgtest-1` (standby) is started at the same time, waits for the primary, clones it with
//!     pg_basebackup and streams from it;
//!   * a row written on the primary must show up on the standby, which must be in recovery;
//!   * both are restarted on their existing data directories and replication must resume.
//!
//! PostgreSQL refuses to run as root: when the test runs as root the scripts run as the `postgres`
//! OS user (or `nobody`). Binaries: $DBSERVICE_TEST_PG_BIN, else the newest
//! /usr/lib/postgresql/*/bin, else `pg_config --bindir`. Without binaries the test is skipped,
//! except under CI=true, where it first tries `apt-get install postgresql` and otherwise fails.

#[path = "support/ports.rs"]
mod ports;

use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The scripts exactly as embedded into the ConfigMap (file name, content).
const SCRIPTS: &[(&str, &str)] = &[
    ("entrypoint.sh", include_str!("../src/operator/database/build/scripts/entrypoint.sh")),
    ("primary-init.sh", include_str!("../src/operator/database/build/scripts/primary-init.sh")),
];

const STATEFULSET: &str = "pgtest";
const POSTGRES_USER: &str = "app";
const POSTGRES_PASSWORD: &str = "app-Secret 42";
const POSTGRES_DB: &str = "appdb";
const REPLICATION_USER: &str = "replicator";
/// Quotes, backslash, dollar and spaces: exercises every quoting layer (SQL literal, conninfo,
/// postgresql.auto.conf).
const REPLICATION_PASSWORD: &str = r#"re'pl "pa$$ \w0rd"#;

const READY_TIMEOUT: Duration = Duration::from_secs(180);
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(90);

fn is_ci() -> bool {
    std::env::var("CI").map(|v| v == "true").unwrap_or(false)
}

fn current_uid() -> u32 {
    fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX)
}

fn has_pg_binaries(dir: &Path) -> bool {
    ["postgres", "initdb", "pg_ctl", "psql", "pg_basebackup", "pg_isready"].iter().all(|b| dir.join(b).is_file())
}

fn find_pg_bin() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("DBSERVICE_TEST_PG_BIN") {
        let dir = PathBuf::from(dir);
        return has_pg_binaries(&dir).then_some(dir);
    }
    let mut candidates: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            has_pg_binaries(&bin).then_some((version, bin))
        })
        .collect();
    candidates.sort();
    if let Some((_, bin)) = candidates.pop() {
        return Some(bin);
    }
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && has_pg_binaries(&dir)).then_some(dir)
}

/// Under CI (as root, with apt): install Debian's PostgreSQL, as the CI machine may be fresh.
fn try_apt_install() {
    if !(is_ci() && current_uid() == 0 && Path::new("/usr/bin/apt-get").exists()) {
        return;
    }
    eprintln!("replication test: PostgreSQL not found; trying apt-get install postgresql");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "postgresql"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !install() {
        let _ = Command::new("apt-get").arg("update").stdin(Stdio::null()).status();
        install();
    }
}

/// (uid, gid) of the OS user that runs the scripts, `None` = the current user.
fn run_as() -> Option<(u32, u32)> {
    if current_uid() != 0 {
        return None;
    }
    let passwd = fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    for wanted in ["postgres", "nobody"] {
        for line in passwd.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() >= 4 && f[0] == wanted {
                if let (Ok(uid), Ok(gid)) = (f[2].parse(), f[3].parse()) {
                    return Some((uid, gid));
                }
            }
        }
    }
    panic!("running as root, but neither a `postgres` nor a `nobody` user exists to run PostgreSQL");
}

fn chown_tree(path: &Path, owner: Option<(u32, u32)>) {
    let Some((uid, gid)) = owner else { return };
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    if path.is_dir() {
        for entry in fs::read_dir(path).unwrap().flatten() {
            chown_tree(&entry.path(), owner);
        }
    }
}

/// Signal a whole process group (the scripts run in their own group: bash, pg_basebackup,
/// postgres and its children).
fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args(["-s", signal, "--", &format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

struct Node {
    name: String,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    logs: Vec<PathBuf>,
}

impl Node {
    fn pgdata(&self) -> PathBuf {
        self.dir.join("data").join("pgdata")
    }
}

/// Owns the temp dir and the servers. Dropping it (also on panic) stops every server before the
/// temp dir is removed (fields drop after `Drop::drop`, `_tmp` last).
struct Harness {
    pg_bin: PathBuf,
    scripts: PathBuf,
    owner: Option<(u32, u32)>,
    primary: Node,
    standby: Node,
    _tmp: tempfile::TempDir,
}

impl Harness {
    fn new(pg_bin: PathBuf) -> Harness {
        let owner = run_as();
        let mut builder = tempfile::Builder::new();
        builder.prefix("dbservice-replication-");
        // a root-only $TMPDIR would not be reachable by the postgres user
        let tmp =
            if owner.is_some() { builder.tempdir_in("/tmp") } else { builder.tempdir() }.expect("create temp dir");
        let base = tmp.path().to_path_buf();

        let scripts = base.join("scripts");
        fs::create_dir(&scripts).unwrap();
        for (name, content) in SCRIPTS {
            let path = scripts.join(name);
            fs::write(&path, content).unwrap();
            // ConfigMap volumes default to 0644: the scripts must not need the exec bit
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        }
        let primary_port = ports::unused_port();
        let standby_port = ports::unused_port();
        let node = |ordinal: u32, port: u16| {
            let dir = base.join(format!("{STATEFULSET}-{ordinal}"));
            // PGDATA is a subdirectory of the "volume" (data/), like in the pod
            fs::create_dir_all(dir.join("data")).unwrap();
            fs::create_dir_all(dir.join("run")).unwrap();
            Node { name: format!("{STATEFULSET}-{ordinal}"), port, dir, child: None, logs: Vec::new() }
        };
        let primary = node(0, primary_port);
        let standby = node(1, standby_port);
        chown_tree(&base, owner);
        Harness { pg_bin, scripts, owner, primary, standby, _tmp: tmp }
    }

    /// Start entrypoint.sh for a node, like the container command `/bin/bash /scripts/entrypoint.sh`.
    fn start(&mut self, standby: bool) {
        let primary_port = self.primary.port;
        let (pg_bin, scripts, owner) = (self.pg_bin.clone(), self.scripts.clone(), self.owner);
        let node = if standby { &mut self.standby } else { &mut self.primary };
        assert!(node.child.is_none(), "{} already running", node.name);
        let log_path = node.dir.join(format!("entrypoint-{}.log", node.logs.len() + 1));
        let log = File::create(&log_path).expect("create log file");
        // The passwords as the pods get them: files named by NAME_FILE, not the environment.
        let password_file = |name: &str, password: &str| {
            let path = node.dir.join(name);
            fs::write(&path, password).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o400)).unwrap();
            chown_tree(&path, owner);
            path
        };
        let superuser_password = password_file("superuser-password", POSTGRES_PASSWORD);
        let replication_password = password_file("replication-password", REPLICATION_PASSWORD);
        let mut cmd = Command::new("/bin/bash");
        cmd.arg(scripts.join("entrypoint.sh"))
            .current_dir(&node.dir)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &node.dir)
            .env("LANG", "C.UTF-8")
            .env("DBSERVICE_ENTRYPOINT_MODE", "standalone")
            .env("PG_BIN", &pg_bin)
            .env("POD_NAME", &node.name)
            .env("PRIMARY_HOST", "127.0.0.1")
            .env("PRIMARY_PORT", primary_port.to_string())
            .env("PGPORT", node.port.to_string())
            .env("PGDATA", node.pgdata())
            .env("PG_SOCKET_DIR", node.dir.join("run"))
            .env("LISTEN_ADDRESSES", "127.0.0.1")
            .env("POSTGRES_USER", POSTGRES_USER)
            // The test connects over TCP as the superuser.
            .env("SUPERUSER_NETWORK_ACCESS", "on")
            .env("POSTGRES_PASSWORD_FILE", superuser_password)
            .env("POSTGRES_DB", POSTGRES_DB)
            .env("REPLICATION_USER", REPLICATION_USER)
            .env("REPLICATION_PASSWORD_FILE", replication_password)
            .env("PRIMARY_WAIT_TIMEOUT", "150")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0);
        if let Some((uid, gid)) = owner {
            cmd.uid(uid).gid(gid);
        }
        node.child = Some(cmd.spawn().expect("spawn entrypoint.sh"));
        node.logs.push(log_path);
    }

    fn stop(node: &mut Node) {
        let Some(mut child) = node.child.take() else {
            return;
        };
        let pgid = child.id();
        // SIGINT = postgres "fast" shutdown
        signal_group(pgid, "INT");
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            sleep(Duration::from_millis(100));
        }
        signal_group(pgid, "KILL");
        let _ = child.kill();
        let _ = child.wait();
    }

    fn stop_all(&mut self) {
        Self::stop(&mut self.standby);
        Self::stop(&mut self.primary);
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for node in [&self.primary, &self.standby] {
            for log in &node.logs {
                out.push_str(&format!("===== {} ({}) =====\n", node.name, log.display()));
                out.push_str(&fs::read_to_string(log).unwrap_or_default());
            }
        }
        out
    }

    /// Run one SQL statement over TCP with password authentication, as POSTGRES_USER.
    fn psql(&self, port: u16, sql: &str) -> Result<String, String> {
        let out = Command::new(self.pg_bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .arg(format!("host=127.0.0.1 port={port} user={POSTGRES_USER} dbname={POSTGRES_DB} connect_timeout=5"))
            .args(["-c", sql])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("PGPASSWORD", POSTGRES_PASSWORD)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("run psql: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// Poll `sql` on a node until `check` accepts its output; fail with the logs on timeout or if
    /// the node's script exits.
    fn wait_for(
        &mut self,
        standby: bool,
        sql: &str,
        timeout: Duration,
        what: &str,
        check: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        let mut last;
        loop {
            let node = if standby { &mut self.standby } else { &mut self.primary };
            if let Some(child) = node.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let name = node.name.clone();
                    node.child = None;
                    panic!("{name} exited ({status}) while waiting for {what}\n{}", self.logs());
                }
            }
            let port = node.port;
            last = self.psql(port, sql);
            if let Ok(out) = &last {
                if check(out) {
                    return out.clone();
                }
            }
            if Instant::now() >= deadline {
                break;
            }
            sleep(Duration::from_millis(250));
        }
        panic!("timed out after {timeout:?} waiting for {what}; last result: {last:?}\n{}", self.logs());
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop_all();
    }
}

#[test]
fn primary_and_standby_replicate_through_the_pod_scripts() {
    let pg_bin = match find_pg_bin().or_else(|| {
        try_apt_install();
        find_pg_bin()
    }) {
        Some(bin) => bin,
        None if is_ci() => panic!(
            "CI=true but no PostgreSQL server binaries were found (looked in $DBSERVICE_TEST_PG_BIN, \
             /usr/lib/postgresql/*/bin and `pg_config --bindir`); install them with \
             `apt-get install -y postgresql`"
        ),
        None => {
            eprintln!(
                "SKIPPED replication test: no PostgreSQL binaries found \
                 (apt-get install -y postgresql, or set DBSERVICE_TEST_PG_BIN)"
            );
            return;
        }
    };
    eprintln!("replication test: using PostgreSQL binaries from {}", pg_bin.display());

    let mut h = Harness::new(pg_bin);

    // Both pods start together, like a StatefulSet with Parallel pod management: the standby's
    // script must wait for the primary on its own.
    h.start(false);
    h.start(true);
    let any = |_: &str| true;
    h.wait_for(false, "SELECT 1", READY_TIMEOUT, "the primary to accept connections", any);
    h.wait_for(true, "SELECT 1", READY_TIMEOUT, "the standby to accept connections", any);

    // Roles.
    let recovery = |out: &str| out == "t";
    assert_eq!(h.psql(h.primary.port, "SELECT pg_is_in_recovery()").unwrap(), "f", "primary must not be in recovery");
    h.wait_for(true, "SELECT pg_is_in_recovery()", REPLICATION_TIMEOUT, "the standby to be in recovery", recovery);
    let role = h
        .psql(
            h.primary.port,
            &format!("SELECT rolreplication, rolcanlogin, rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid WHERE rolname = '{REPLICATION_USER}'"),
        )
        .unwrap();
    assert_eq!(role, "t|t|t", "replication role must have REPLICATION LOGIN and a SCRAM password");

    // A write on the primary reaches the standby.
    h.psql(h.primary.port, "CREATE TABLE replication_probe (id int PRIMARY KEY, note text NOT NULL)").unwrap();
    h.psql(h.primary.port, "INSERT INTO replication_probe VALUES (1, 'written on the primary')").unwrap();
    h.wait_for(
        true,
        "SELECT note FROM replication_probe WHERE id = 1",
        REPLICATION_TIMEOUT,
        "row 1 to replicate to the standby",
        |out| out == "written on the primary",
    );
    let streaming = format!("SELECT state FROM pg_stat_replication WHERE application_name = '{}'", h.standby.name);
    h.wait_for(false, &streaming, REPLICATION_TIMEOUT, "the standby to stream from the primary", |out| {
        out == "streaming"
    });
    let write = h.psql(h.standby.port, "INSERT INTO replication_probe VALUES (99, 'must fail')");
    assert!(
        write.as_ref().is_err_and(|e| e.contains("read-only transaction")),
        "writes on the standby must be refused, got {write:?}"
    );

    // Restart both on their existing data directories: no re-initialization, no new base backup,
    // and replication resumes.
    h.stop_all();
    h.start(false);
    h.start(true);
    h.wait_for(false, "SELECT 1", READY_TIMEOUT, "the restarted primary", any);
    h.wait_for(true, "SELECT pg_is_in_recovery()", READY_TIMEOUT, "the restarted standby in recovery", recovery);
    h.psql(h.primary.port, "INSERT INTO replication_probe VALUES (2, 'written after restart')").unwrap();
    h.wait_for(
        true,
        "SELECT string_agg(note, ',' ORDER BY id) FROM replication_probe",
        REPLICATION_TIMEOUT,
        "row 2 to replicate after the restart",
        |out| out == "written on the primary,written after restart",
    );
    h.wait_for(false, &streaming, REPLICATION_TIMEOUT, "streaming after the restart", |out| out == "streaming");
    let restarted_primary = fs::read_to_string(&h.primary.logs[1]).unwrap();
    let restarted_standby = fs::read_to_string(&h.standby.logs[1]).unwrap();
    assert!(restarted_primary.contains("skipping initialization"), "{}", h.logs());
    assert!(restarted_standby.contains("skipping base backup"), "{}", h.logs());
    assert!(!restarted_standby.contains("pg_basebackup"), "{}", h.logs());

    h.stop_all();

    // Secrets never reach the logs.
    let logs = h.logs();
    assert!(logs.contains("base backup complete"), "{logs}");
    for secret in [REPLICATION_PASSWORD, POSTGRES_PASSWORD] {
        assert!(!logs.contains(secret), "a password leaked into the logs:\n{logs}");
    }
}
