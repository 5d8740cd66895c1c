//! Turning a data directory into a standby of another instance: standby configuration,
//! pg_rewind of a former primary, and a fresh clone when rewinding is impossible. The previous
//! data directory is moved aside, never deleted.

use crate::instance::{InstanceConfig, Upstream};
use crate::lsn::Lsn;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;

/// Preparing a standby failed.
#[derive(Debug, thiserror::Error)]
pub enum StandbyError {
    /// A PostgreSQL tool could not run or failed.
    #[error("{tool} failed: {detail}")]
    Tool {
        /// pg_rewind, pg_basebackup or pg_controldata.
        tool: &'static str,
        /// Its exit status and last output line.
        detail: String,
    },
    /// Writing the configuration or moving the directory failed.
    #[error("prepare data directory {path}: {source}")]
    Files {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn files(path: &Path) -> impl FnOnce(std::io::Error) -> StandbyError + '_ {
    move |source| StandbyError::Files { path: path.to_path_buf(), source }
}

/// Quotes a libpq conninfo value: `'value'` with `\` and `'` backslash-escaped.
fn conninfo_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Conninfo to stream from (or rewind from) `upstream`, with the password when `with_password`
/// (the configuration file needs it; tools get it through a password file instead of argv).
pub fn conninfo(config: &InstanceConfig, upstream: &Upstream, with_password: bool) -> String {
    let mut parts = vec![
        format!("host={}", conninfo_value(&upstream.host)),
        format!("port={}", upstream.port),
        format!("user={}", conninfo_value(&config.replication_user)),
        format!("application_name={}", conninfo_value(&config.name)),
        // pg_rewind connects to a database (streaming and pg_basebackup ignore it).
        "dbname=postgres".to_string(),
        "connect_timeout=5".to_string(),
    ];
    // Over TLS, the peer verified as the database CA's certificate for its host name.
    parts.extend(config.tls.as_ref().map(crate::instance::tls::client_conninfo));
    if with_password {
        parts.push(format!("password={}", conninfo_value(&config.replication_password)));
    }
    parts.join(" ")
}

/// Settings failover relies on. They are written into postgresql.auto.conf rather than passed
/// as `-c` flags, because pg_rewind's single-user crash recovery of a killed primary reads only the
/// configuration files: it would record wal_log_hints=off in pg_control (after which pg_rewind
/// refuses the directory) and recycle the WAL that wal_keep_size should have kept (after which
/// pg_rewind cannot find the last common checkpoint).
const REQUIRED_SETTINGS: &[(&str, &str)] = &[
    ("wal_level", "replica"),
    ("hot_standby", "on"),
    ("wal_log_hints", "on"),
    // A crashed primary is restarted by the agent, which first checks that it still holds the lease.
    ("restart_after_crash", "off"),
    // A standby whose primary restarted reconnects within a second (default 5 s): a primary that
    // steps down soon after waits for one to stream before its clean stop.
    ("wal_retrieve_retry_interval", "1s"),
];

/// The settings every start writes into postgresql.auto.conf: the required ones and the
/// configured ones (replication, archiving).
pub fn persistent_settings(config: &InstanceConfig) -> Vec<(&str, String)> {
    REQUIRED_SETTINGS
        .iter()
        .map(|(name, value)| (*name, value.to_string()))
        .chain(config.settings.iter().map(|(name, value)| (name.as_str(), value.clone())))
        .collect()
}

/// Sets `settings` in postgresql.auto.conf (replacing earlier values of the same names).
pub fn set_auto_conf(config: &InstanceConfig, settings: &[(&str, String)]) -> Result<(), StandbyError> {
    let name_of = |line: &str| line.split('=').next().unwrap_or("").trim().to_string();
    rewrite_auto_conf(config, |existing| {
        let mut text: String = existing
            .lines()
            .filter(|line| !settings.iter().any(|(name, _)| name_of(line) == *name))
            .map(|line| format!("{line}\n"))
            .collect();
        for (name, value) in settings {
            text.push_str(&format!("{name} = '{}'\n", value.replace('\\', "\\\\").replace('\'', "''")));
        }
        text
    })
}

/// Replaces postgresql.auto.conf with `edit` of its text, atomically; the file stays private
/// (0600), as it may hold a password.
pub fn rewrite_auto_conf(config: &InstanceConfig, edit: impl FnOnce(&str) -> String) -> Result<(), StandbyError> {
    use std::os::unix::fs::OpenOptionsExt;
    let auto = config.pgdata.join("postgresql.auto.conf");
    let text = edit(&std::fs::read_to_string(&auto).unwrap_or_default());
    let temporary = config.pgdata.join("postgresql.auto.conf.dbservice.tmp");
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .map_err(files(&temporary))?;
        file.write_all(text.as_bytes()).map_err(files(&temporary))?;
    }
    std::fs::rename(&temporary, &auto).map_err(files(&auto))?;
    config.chown(&[&auto]);
    Ok(())
}

/// Writes the required settings and the configured ones into the data directory (before every
/// start and rewind).
pub fn write_required_settings(config: &InstanceConfig) -> Result<(), StandbyError> {
    set_auto_conf(config, &persistent_settings(config))
}

/// Writes standby.signal and `primary_conninfo` (empty when `upstream` is None), plus the
/// required settings. No slot yet (a clone copied the source's `primary_slot_name`, which is not
/// this instance's): the agent names it once it exists on the upstream. `restore_command` reads
/// the archive, when there is one: a standby that fell behind what the primary kept catches up
/// from there, and a promoted one sees every timeline's history before choosing its own.
pub fn write_standby_config(config: &InstanceConfig, upstream: Option<&Upstream>) -> Result<(), StandbyError> {
    let value = upstream.map(|upstream| conninfo(config, upstream, true)).unwrap_or_default();
    let mut settings = persistent_settings(config);
    settings.push(("primary_conninfo", value));
    settings.push(("primary_slot_name", String::new()));
    settings.push(("restore_command", config.standby_restore_command.clone().unwrap_or_default()));
    set_auto_conf(config, &settings)?;
    let signal = config.pgdata.join("standby.signal");
    std::fs::write(&signal, b"").map_err(files(&signal))?;
    config.chown(&[&signal]);
    Ok(())
}

async fn run_tool(
    config: &InstanceConfig,
    tool: &'static str,
    args: &[String],
    limit: Duration,
) -> Result<String, StandbyError> {
    let output = run_tool_output(config, tool, args, limit).await?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        return Ok(stdout + &String::from_utf8_lossy(&output.stderr));
    }
    Err(tool_failure(tool, &output))
}

fn tool_failure(tool: &'static str, output: &std::process::Output) -> StandbyError {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("").to_string();
    StandbyError::Tool { tool, detail: format!("{}: {last}", output.status) }
}

/// Runs a PostgreSQL tool as the server's user and returns its output, whatever its exit status.
async fn run_tool_output(
    config: &InstanceConfig,
    tool: &'static str,
    args: &[String],
    limit: Duration,
) -> Result<std::process::Output, StandbyError> {
    // The password as a file the tool alone reads, never in its environment.
    let password_file =
        crate::passfile::PasswordFile::new(&config.replication_user, &config.replication_password, config.os_user)
            .map_err(|error| StandbyError::Tool { tool, detail: format!("password file: {error}") })?;
    // No PGOPTIONS: pg_basebackup runs no SQL (replication protocol) and pg_rewind pins an empty
    // search_path on connect itself.
    let mut command = Command::new(config.pg_bin.join(tool));
    command
        .args(args)
        .env_remove("PGPASSWORD")
        .env("PGPASSFILE", password_file.path())
        .env("PGCONNECT_TIMEOUT", "5")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some((uid, gid)) = config.os_user {
        command.uid(uid).gid(gid);
    }
    tokio::time::timeout(limit, command.output())
        .await
        .map_err(|_| StandbyError::Tool { tool, detail: format!("no result within {limit:?}") })?
        .map_err(|error| StandbyError::Tool { tool, detail: error.to_string() })
}

/// What pg_controldata says about a stopped data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlData {
    /// "Latest checkpoint location": the start of the checkpoint record (after a clean stop,
    /// the shutdown checkpoint, the last record in the WAL).
    pub checkpoint: Lsn,
    /// The server was shut down cleanly.
    pub clean: bool,
    /// Timeline of that checkpoint.
    pub timeline: u32,
    /// WAL page size (XLOG_BLCKSZ).
    pub wal_block_bytes: u64,
    /// WAL segment size.
    pub wal_segment_bytes: u64,
}

/// The latest checkpoint of a stopped data directory and whether it was shut down cleanly.
pub async fn shutdown_checkpoint(config: &InstanceConfig) -> Result<ControlData, StandbyError> {
    let args = ["-D".to_string(), config.pgdata.display().to_string()];
    let out = run_tool(config, "pg_controldata", &args, Duration::from_secs(30)).await?;
    parse_control_data(&out)
}

fn parse_control_data(out: &str) -> Result<ControlData, StandbyError> {
    let field = |name: &str| {
        out.lines().find_map(|line| line.strip_prefix(name).map(|rest| rest.trim_start_matches(':').trim().to_string()))
    };
    let detail = |what: &str| StandbyError::Tool { tool: "pg_controldata", detail: format!("no {what} in its output") };
    let number =
        |name: &str, what: &str| field(name).and_then(|value| value.parse::<u64>().ok()).ok_or_else(|| detail(what));
    let location = field("Latest checkpoint location").ok_or_else(|| detail("checkpoint location"))?;
    let checkpoint = location.parse().map_err(|_| detail("valid checkpoint location"))?;
    let state = field("Database cluster state").ok_or_else(|| detail("cluster state"))?;
    let timeline = number("Latest checkpoint's TimeLineID", "timeline")?;
    Ok(ControlData {
        checkpoint,
        clean: state == "shut down",
        timeline: u32::try_from(timeline).map_err(|_| detail("valid timeline"))?,
        wal_block_bytes: number("WAL block size", "WAL block size")?,
        wal_segment_bytes: number("Bytes per WAL segment", "WAL segment size")?,
    })
}

/// How far before the shutdown's start the last commit is looked for: the stop's CHECKPOINT, a
/// background-writer snapshot or an autovacuum record after the last commit must not make the
/// successor wait for them.
const COMMIT_LOOKBACK_BYTES: u64 = 1024 * 1024;

/// Where the WAL a successor must have ends, after a clean stop whose fast shutdown began when the
/// server's insert position was `shutdown_began`: the end of the last commit record before the
/// shutdown checkpoint (see [`end_of_commits`]). Reads the stopped server's WAL with pg_waldump,
/// from up to [`COMMIT_LOOKBACK_BYTES`] before `shutdown_began` (within its segment: earlier ones
/// may have been recycled), so the output stays small.
pub async fn end_of_committed_wal(
    config: &InstanceConfig,
    shutdown_began: Lsn,
    control: &ControlData,
) -> Result<Lsn, StandbyError> {
    let segment_start = shutdown_began.0 - shutdown_began.0 % control.wal_segment_bytes;
    let from = Lsn(shutdown_began.0.saturating_sub(COMMIT_LOOKBACK_BYTES).max(segment_start));
    // To the end of the WAL, which pg_waldump reports as an error (exit status 1): `--end` at the
    // shutdown checkpoint fails after the SWITCH record a shutdown with archiving writes.
    let args = [
        "--path".to_string(),
        config.pgdata.join("pg_wal").display().to_string(),
        format!("--timeline={}", control.timeline),
        format!("--start={from}"),
    ];
    let output = run_tool_output(config, "pg_waldump", &args, Duration::from_secs(30)).await?;
    end_of_commits(&String::from_utf8_lossy(&output.stdout), shutdown_began, control)
        .ok_or_else(|| tool_failure("pg_waldump", &output))
}

/// A record that makes a transaction's outcome durable for its client: a commit, or a PREPARE
/// TRANSACTION (acknowledged before its COMMIT PREPARED). Every acknowledged commit's changes are
/// in records before its commit record.
fn commit_record(rmgr: &str, kind: &str) -> bool {
    rmgr == "Transaction" && matches!(kind, "COMMIT" | "COMMIT_PREPARED" | "PREPARE")
}

/// From pg_waldump's output for the records from before `shutdown_began` to the end of the WAL: the
/// end of the last [`commit_record`] before the shutdown checkpoint, or `shutdown_began` (as an end
/// position) when there is none. What follows the last commit carries no acknowledged commit: the
/// stop's own records (its CHECKPOINT's RUNNING_XACTS and CHECKPOINT_ONLINE, a segment SWITCH when
/// archiving, the shutdown checkpoint) and the changes and ABORT of the transactions the shutdown
/// ended. None unless the output reaches the shutdown checkpoint record (so nothing before it was
/// left unread) and every record line before it can be read.
fn end_of_commits(out: &str, shutdown_began: Lsn, control: &ControlData) -> Option<Lsn> {
    let mut end = None;
    for line in out.lines().filter(|line| line.starts_with("rmgr:")) {
        let rmgr = line.strip_prefix("rmgr:")?.split_whitespace().next()?;
        let total: u64 =
            line.split("len (rec/tot):").nth(1)?.split(',').next()?.split('/').nth(1)?.trim().parse().ok()?;
        let start: Lsn = line.split("lsn: ").nth(1)?.split(',').next()?.trim().parse().ok()?;
        let kind = line.split("desc: ").nth(1)?.split([' ', ';']).next()?;
        if start >= control.checkpoint {
            let reached = start == control.checkpoint;
            return reached.then(|| end.unwrap_or_else(|| as_end_position(shutdown_began, control)));
        }
        if commit_record(rmgr, kind) {
            end = Some(record_end(start, total, control));
        }
    }
    None
}

/// Page header sizes: long at the start of a segment, short on every other page.
const LONG_PAGE_HEADER: u64 = 40;
const SHORT_PAGE_HEADER: u64 = 24;

fn page_header(position: u64, control: &ControlData) -> u64 {
    if position.is_multiple_of(control.wal_segment_bytes) {
        LONG_PAGE_HEADER
    } else {
        SHORT_PAGE_HEADER
    }
}

/// End of a record of `total` bytes starting at `start`: records take MAXALIGN'd space and skip
/// the header of every page they cross; an end that falls on a page boundary stays there (it is
/// what a standby that received the record reports).
fn record_end(start: Lsn, total: u64, control: &ControlData) -> Lsn {
    let block = control.wal_block_bytes;
    let mut position = start.0;
    let mut remaining = total.next_multiple_of(8);
    while remaining > 0 {
        if position.is_multiple_of(block) {
            position += page_header(position, control);
        }
        let room = block - position % block;
        let taken = remaining.min(room);
        position += taken;
        remaining -= taken;
    }
    Lsn(position)
}

/// An insert position right after a page header is, as the end of the record before it, the page
/// boundary.
fn as_end_position(insert: Lsn, control: &ControlData) -> Lsn {
    let offset = insert.0 % control.wal_block_bytes;
    let boundary = insert.0 - offset;
    if offset != 0 && offset == page_header(boundary, control) {
        Lsn(boundary)
    } else {
        insert
    }
}

/// Creates the physical replication slot `slot` on `upstream` unless it exists (see
/// [`crate::instance::slots`]), over a replication connection as the replication role.
pub async fn create_slot_on(config: &InstanceConfig, upstream: &Upstream, slot: &str) -> Result<(), StandbyError> {
    let args = [
        "--create-slot".to_string(),
        "--if-not-exists".to_string(),
        format!("--slot={slot}"),
        "--no-password".to_string(),
        format!("--dbname={}", conninfo(config, upstream, false)),
    ];
    run_tool(config, "pg_receivewal", &args, Duration::from_secs(15)).await.map(drop)
}

/// Rewinds a stopped former primary onto `upstream`'s timeline. Returns pg_rewind's output.
pub async fn rewind(config: &InstanceConfig, upstream: &Upstream) -> Result<String, StandbyError> {
    write_required_settings(config)?;
    let args = [
        format!("--target-pgdata={}", config.pgdata.display()),
        format!("--source-server={}", conninfo(config, upstream, false)),
    ];
    run_tool(config, "pg_rewind", &args, Duration::from_secs(600)).await
}

/// What a former primary's WAL holds beyond the point where the new primary's timeline forked
/// off: pg_rewind discards it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// Where the histories diverged.
    pub diverged_at: Lsn,
    /// The timeline the discarded WAL is on.
    pub timeline: u32,
    /// Commit records (and prepared transactions) after the divergence.
    pub commits: u64,
    /// Bytes of WAL after the divergence.
    pub bytes: u64,
}

/// Reads, before [`rewind`], what it will discard: `pg_rewind --dry-run` names the divergence, and
/// pg_waldump counts this data directory's commits after it. None when nothing diverged (a clean
/// switchover's old primary).
pub async fn divergence(config: &InstanceConfig, upstream: &Upstream) -> Result<Option<Divergence>, StandbyError> {
    write_required_settings(config)?;
    let args = [
        format!("--target-pgdata={}", config.pgdata.display()),
        format!("--source-server={}", conninfo(config, upstream, false)),
        "--dry-run".to_string(),
    ];
    let out = run_tool(config, "pg_rewind", &args, Duration::from_secs(600)).await?;
    let Some((diverged_at, timeline)) = parse_divergence(&out) else { return Ok(None) };
    if out.contains("no rewind required") {
        return Ok(None);
    }
    let control = shutdown_checkpoint(config).await?;
    let args = [
        "--path".to_string(),
        config.pgdata.join("pg_wal").display().to_string(),
        format!("--timeline={timeline}"),
        format!("--start={diverged_at}"),
    ];
    // To the end of the WAL, which pg_waldump reports as an error (exit status 1).
    let output = run_tool_output(config, "pg_waldump", &args, Duration::from_secs(120)).await?;
    let (commits, end) = commits_and_end(&String::from_utf8_lossy(&output.stdout), &control);
    let bytes = end.map_or(0, |end| end.bytes_ahead_of(diverged_at));
    Ok(Some(Divergence { diverged_at, timeline, commits, bytes }))
}

/// pg_rewind's "servers diverged at WAL location X on timeline N".
fn parse_divergence(out: &str) -> Option<(Lsn, u32)> {
    let rest = out.split("servers diverged at WAL location ").nth(1)?;
    let mut words = rest.split_whitespace();
    let position = words.next()?.parse().ok()?;
    let timeline = rest.split("on timeline ").nth(1)?.split_whitespace().next()?.trim_end_matches('.').parse().ok()?;
    Some((position, timeline))
}

/// The [`commit_record`]s in pg_waldump's output, and the end of its last record.
fn commits_and_end(out: &str, control: &ControlData) -> (u64, Option<Lsn>) {
    let mut commits = 0;
    let mut end = None;
    for line in out.lines().filter(|line| line.starts_with("rmgr:")) {
        let fields = || -> Option<(&str, &str, u64, Lsn)> {
            let rmgr = line.strip_prefix("rmgr:")?.split_whitespace().next()?;
            let total =
                line.split("len (rec/tot):").nth(1)?.split(',').next()?.split('/').nth(1)?.trim().parse().ok()?;
            let start = line.split("lsn: ").nth(1)?.split(',').next()?.trim().parse().ok()?;
            let kind = line.split("desc: ").nth(1)?.split([' ', ';']).next()?;
            Some((rmgr, kind, total, start))
        };
        let Some((rmgr, kind, total, start)) = fields() else { continue };
        commits += u64::from(commit_record(rmgr, kind));
        end = Some(record_end(start, total, control));
    }
    (commits, end)
}

/// Clones `upstream` into the data directory with pg_basebackup (the data directory's parent must
/// be writable by the server's user); an existing directory is moved
/// aside to `<pgdata>.replaced-<unix time>` first (never deleted: it may hold the only copy of
/// commits that did not reach the new primary).
pub async fn clone_from(config: &InstanceConfig, upstream: &Upstream) -> Result<Option<PathBuf>, StandbyError> {
    let pgdata = &config.pgdata;
    let mut moved = None;
    if pgdata.exists() && std::fs::read_dir(pgdata).map_err(files(pgdata))?.next().is_some() {
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        let aside = PathBuf::from(format!("{}.replaced-{stamp}", pgdata.display()));
        std::fs::rename(pgdata, &aside).map_err(files(pgdata))?;
        moved = Some(aside);
    }
    let staging = PathBuf::from(format!("{}.clone", pgdata.display()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(files(&staging))?;
    }
    let args = [
        "-D".to_string(),
        staging.display().to_string(),
        "-X".to_string(),
        "stream".to_string(),
        "--checkpoint=fast".to_string(),
        "-d".to_string(),
        conninfo(config, upstream, false),
    ];
    run_tool(config, "pg_basebackup", &args, Duration::from_secs(3600)).await?;
    if pgdata.exists() {
        std::fs::remove_dir(pgdata).map_err(files(pgdata))?;
    }
    std::fs::rename(&staging, pgdata).map_err(files(pgdata))?;
    write_standby_config(config, Some(upstream))?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LeaseTimings;
    use std::os::unix::fs::PermissionsExt;

    fn config(pgdata: &Path) -> InstanceConfig {
        InstanceConfig {
            name: "db-1".into(),
            pg_bin: PathBuf::new(),
            pgdata: pgdata.to_path_buf(),
            port: 5432,
            socket_dir: PathBuf::new(),
            listen_addresses: "*".into(),
            superuser: "postgres".into(),
            roles: None,
            replication_user: "replicator".into(),
            replication_password: r"it's a \secret".into(),
            settings: vec![("wal_keep_size".into(), "256MB".into())],
            standby_restore_command: None,
            log_file: PathBuf::new(),
            os_user: None,
            health_timeout: Duration::from_secs(1),
            tick: Duration::from_secs(1),
            lease: LeaseTimings::default(),
            stop_grace: Duration::from_secs(1),
            unresponsive_after: Duration::from_secs(1),
            watchdog_binary: None,
            tls: None,
        }
    }

    #[test]
    fn conninfo_quotes_every_value_and_keeps_the_password_out_unless_asked() {
        let directory = tempfile::tempdir().unwrap();
        let config = config(directory.path());
        let upstream = Upstream { host: "db-0.db-headless.ns.svc".into(), port: 5433 };
        assert_eq!(
            conninfo(&config, &upstream, false),
            "host='db-0.db-headless.ns.svc' port=5433 user='replicator' application_name='db-1' dbname=postgres connect_timeout=5"
        );
        assert!(conninfo(&config, &upstream, true).ends_with(r"password='it\'s a \\secret'"));
    }

    #[test]
    fn standby_config_replaces_earlier_values_and_stays_private() {
        let directory = tempfile::tempdir().unwrap();
        let config = config(directory.path());
        let auto = directory.path().join("postgresql.auto.conf");
        std::fs::write(&auto, "# header\nprimary_conninfo = 'old'\nwal_log_hints = 'off'\nwork_mem = '8MB'\n").unwrap();
        let upstream = Upstream { host: "db-0".into(), port: 5432 };
        write_standby_config(&config, Some(&upstream)).unwrap();
        write_standby_config(&config, Some(&upstream)).unwrap();
        let text = std::fs::read_to_string(&auto).unwrap();
        assert_eq!(text.matches("primary_conninfo").count(), 1, "{text}");
        assert_eq!(text.matches("wal_log_hints").count(), 1, "{text}");
        assert!(text.contains("wal_log_hints = 'on'") && text.contains("wal_keep_size = '256MB'"), "{text}");
        assert!(text.contains("work_mem = '8MB'") && text.starts_with("# header\n"), "{text}");
        // Conninfo escaping inside the configuration file's: the server reads back
        // password='it\'s a \\secret', which libpq reads as the original password.
        assert!(text.contains(r"password=''it\\''s a \\\\secret'''"), "{text}");
        assert!(directory.path().join("standby.signal").exists());
        assert_eq!(std::fs::metadata(&auto).unwrap().permissions().mode() & 0o777, 0o600);

        write_standby_config(&config, None).unwrap();
        assert!(std::fs::read_to_string(&auto).unwrap().contains("primary_conninfo = ''"));
    }

    #[test]
    fn a_standby_reads_the_archive_and_names_no_slot_of_its_source() {
        let directory = tempfile::tempdir().unwrap();
        let auto = directory.path().join("postgresql.auto.conf");
        // A clone of a primary that was once a standby: its slot name is not this one's.
        std::fs::write(&auto, "primary_slot_name = 'dbsvc_db_0'\nrestore_command = 'old'\n").unwrap();
        let config = InstanceConfig {
            standby_restore_command: Some("/dbservice/bin/dbservice-operator wal-restore --standby %f %p".into()),
            ..config(directory.path())
        };
        write_standby_config(&config, Some(&Upstream { host: "db-1".into(), port: 5432 })).unwrap();
        let text = std::fs::read_to_string(&auto).unwrap();
        assert!(text.contains("primary_slot_name = ''") && !text.contains("dbsvc_db_0"), "{text}");
        assert!(
            text.contains("restore_command = '/dbservice/bin/dbservice-operator wal-restore --standby %f %p'"),
            "{text}"
        );
        // Without archiving, no restore_command (none left from before either).
        write_standby_config(&InstanceConfig { standby_restore_command: None, ..config }, None).unwrap();
        assert!(std::fs::read_to_string(&auto).unwrap().contains("restore_command = ''"));
    }
}

#[cfg(test)]
mod wal_tests {
    use super::*;

    const CONTROL: ControlData = ControlData {
        checkpoint: Lsn(0x0151_6820),
        clean: true,
        timeline: 1,
        wal_block_bytes: 8192,
        wal_segment_bytes: 16 * 1024 * 1024,
    };

    /// pg_waldump (PostgreSQL 15) between a commit and a clean stop's shutdown checkpoint.
    const DUMP: &str = "\
first record is after 0/15165D0, at 0/15165D8, skipping over 8 bytes
rmgr: Transaction len (rec/tot):    405/   405, tx:        724, lsn: 0/015165D8, prev 0/01516598, desc: COMMIT 2026-12-01 04:27:46.060607 UTC; inval msgs: catcache 80
rmgr: Standby     len (rec/tot):     50/    50, tx:          0, lsn: 0/01516770, prev 0/015165D8, desc: RUNNING_XACTS nextXid 725 latestCompletedXid 724 oldestRunningXid 725
rmgr: XLOG        len (rec/tot):    114/   114, tx:          0, lsn: 0/015167A8, prev 0/01516770, desc: CHECKPOINT_ONLINE redo 0/1516770; tli 1; prev tli 1; fpw true
rmgr: XLOG        len (rec/tot):    114/   114, tx:          0, lsn: 0/01516820, prev 0/015167A8, desc: CHECKPOINT_SHUTDOWN redo 0/1516820; tli 1; prev tli 1; fpw true
pg_waldump: error: error in WAL record at 0/1516820: invalid record length at 0/1516898: wanted 24, got 0
";
    const SHUTDOWN: &str = "rmgr: XLOG        len (rec/tot):    114/   114, tx:          0, lsn: 0/01516820, prev 0/015167A8, desc: CHECKPOINT_SHUTDOWN redo 0/1516820";

    #[test]
    fn pg_controldata_fields() {
        let out = "Database cluster state:               shut down\n\
                   Latest checkpoint location:           0/1516820\n\
                   Latest checkpoint's TimeLineID:       3\n\
                   WAL block size:                       8192\n\
                   Bytes per WAL segment:                16777216\n";
        let control = parse_control_data(out).unwrap();
        assert_eq!(control, ControlData { timeline: 3, ..CONTROL });
        assert!(parse_control_data("Database cluster state: shut down\n").is_err());
    }

    #[test]
    fn the_last_commit_ends_what_a_successor_needs() {
        // 176 bytes before the shutdown checkpoint: RUNNING_XACTS (56) and CHECKPOINT_ONLINE (120).
        assert_eq!(end_of_commits(DUMP, Lsn(0x0151_65D0), &CONTROL), Some(Lsn(0x0151_6770)));
        assert_eq!(CONTROL.checkpoint.bytes_ahead_of(Lsn(0x0151_6770)), 176);
        // A record without a commit between the last commit and the shutdown's start (a background
        // writer's RUNNING_XACTS, say) is not waited for either.
        assert_eq!(end_of_commits(DUMP, Lsn(0x0151_67A8), &CONTROL), Some(Lsn(0x0151_6770)));
        // Read right before the fast shutdown, after the stop's CHECKPOINT: where the shutdown
        // checkpoint then went.
        assert_eq!(end_of_commits(DUMP, CONTROL.checkpoint, &CONTROL), Some(Lsn(0x0151_6770)));
    }

    #[test]
    fn without_a_commit_the_position_before_the_shutdown_is_the_end() {
        let only_stop = DUMP.lines().filter(|line| !line.contains("COMMIT ")).collect::<Vec<_>>().join("\n");
        let aborted = format!(
            "rmgr: Heap        len (rec/tot):     59/    59, tx:        725, lsn: 0/01516770, prev 0/015165D8, desc: INSERT off 3 flags 0x00\n\
             rmgr: Transaction len (rec/tot):     34/    34, tx:        725, lsn: 0/015167B0, prev 0/01516770, desc: ABORT 2026-12-01 04:27:46.060607 UTC\n{SHUTDOWN}"
        );
        assert_eq!(end_of_commits(&aborted, Lsn(0x0151_6770), &CONTROL), Some(Lsn(0x0151_6770)));
        let prepared = format!(
            "rmgr: Transaction len (rec/tot):     90/    90, tx:        725, lsn: 0/01516770, prev 0/015165D8, desc: PREPARE gid t1\n{SHUTDOWN}"
        );
        assert_eq!(end_of_commits(&prepared, Lsn(0x0151_6770), &CONTROL), Some(Lsn(0x0151_67D0)));
        assert_eq!(end_of_commits(&only_stop, Lsn(0x0151_6770), &CONTROL), Some(Lsn(0x0151_6770)));
        // An insert position right after a page header: the record before ended at the boundary.
        assert_eq!(end_of_commits(SHUTDOWN, Lsn(0x0151_6018), &CONTROL), Some(Lsn(0x0151_6000)));
        let control = ControlData { checkpoint: Lsn(0x0300_0028), ..CONTROL };
        let shutdown = SHUTDOWN.replace("0/01516820", "0/03000028");
        assert_eq!(end_of_commits(&shutdown, Lsn(0x0200_0028), &control), Some(Lsn(0x0200_0000)));
    }

    #[test]
    fn an_answer_needs_every_record_up_to_the_shutdown_checkpoint() {
        // Cut short (a missing segment, say): no answer, the caller falls back to the checkpoint.
        let cut = DUMP.lines().take(3).collect::<Vec<_>>().join("\n");
        assert_eq!(end_of_commits(&cut, Lsn(0x0151_65D0), &CONTROL), None);
        assert_eq!(end_of_commits("", Lsn(0x0151_65D0), &CONTROL), None);
        // Past the checkpoint without a record at it: not the WAL the checkpoint belongs to.
        let past = SHUTDOWN.replace("0/01516820", "0/01516828");
        assert_eq!(end_of_commits(&past, Lsn(0x0151_65D0), &CONTROL), None);
        assert_eq!(end_of_commits(&format!("rmgr: Heap len\n{SHUTDOWN}"), Lsn(0), &CONTROL), None);
    }

    #[test]
    fn a_switch_before_the_shutdown_checkpoint_is_read_through() {
        // archive_mode=on: the shutdown switches segments first (pg_waldump of PostgreSQL 15.18).
        let out = "\
rmgr: Transaction len (rec/tot):     34/    34, tx:        726, lsn: 0/02000160, prev 0/02000128, desc: COMMIT 2026-12-01 04:41:00.000000 UTC
rmgr: Standby     len (rec/tot):     50/    50, tx:          0, lsn: 0/02000188, prev 0/02000160, desc: RUNNING_XACTS nextXid 727
rmgr: XLOG        len (rec/tot):    114/   114, tx:          0, lsn: 0/020001C0, prev 0/02000188, desc: CHECKPOINT_ONLINE redo 0/2000188; tli 1
rmgr: XLOG        len (rec/tot):     24/    24, tx:          0, lsn: 0/02000238, prev 0/020001C0, desc: SWITCH 
rmgr: XLOG        len (rec/tot):    114/   114, tx:          0, lsn: 0/03000028, prev 0/02000238, desc: CHECKPOINT_SHUTDOWN redo 0/3000028; tli 1
pg_waldump: error: error in WAL record at 0/3000028: invalid record length at 0/30000A0: wanted 24, got 0
";
        let control = ControlData { checkpoint: Lsn(0x0300_0028), ..CONTROL };
        assert_eq!(end_of_commits(out, Lsn(0x0200_0188), &control), Some(Lsn(0x0200_0188)));
    }

    #[test]
    fn record_ends_are_aligned_and_skip_page_headers() {
        assert_eq!(record_end(Lsn(0x0151_6770), 50, &CONTROL), Lsn(0x0151_67A8));
        // 120 bytes from 8 bytes before a page boundary: 8, the short header, 112.
        assert_eq!(record_end(Lsn(0x1FF8), 114, &CONTROL), Lsn(0x2000 + 24 + 112));
        // Into a new segment: the long header.
        assert_eq!(record_end(Lsn(0x00FF_FFF8), 114, &CONTROL), Lsn(0x0100_0000 + 40 + 112));
        // Ending exactly on a boundary stays there.
        assert_eq!(record_end(Lsn(0x1F88), 120, &CONTROL), Lsn(0x2000));
    }

    #[test]
    fn what_a_rewind_discards() {
        let out = "pg_rewind: servers diverged at WAL location 0/15165D8 on timeline 1\n\
                   pg_rewind: rewinding from last common checkpoint at 0/1516598 on timeline 1\n";
        assert_eq!(parse_divergence(out), Some((Lsn(0x0151_65D8), 1)));
        assert_eq!(parse_divergence("pg_rewind: no rewind required\n"), None);
        // From the divergence on: one commit, then the stop's records up to the shutdown checkpoint.
        let (commits, end) = commits_and_end(DUMP, &CONTROL);
        assert_eq!(commits, 1);
        assert_eq!(end, Some(Lsn(0x0151_6820 + 120)));
        assert_eq!(commits_and_end("pg_waldump: error: could not find a valid record\n", &CONTROL), (0, None));
    }
}
