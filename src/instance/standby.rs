//! Turning a data directory into a standby of another instance: standby configuration,
//! pg_rewind of a former primary, and a fresh clone when rewinding is impossible. The previous
//! data directory is moved aside, never deleted.

use super::{InstanceConfig, Upstream};
use crate::failover::Lsn;
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
/// (the configuration file needs it; tools get it through PGPASSWORD instead of argv).
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
];

fn persistent_settings(config: &InstanceConfig) -> Vec<(&str, String)> {
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
/// required settings.
pub fn write_standby_config(config: &InstanceConfig, upstream: Option<&Upstream>) -> Result<(), StandbyError> {
    let value = upstream.map(|upstream| conninfo(config, upstream, true)).unwrap_or_default();
    let mut settings = persistent_settings(config);
    settings.push(("primary_conninfo", value));
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
    let mut command = Command::new(config.pg_bin.join(tool));
    command
        .args(args)
        .env("PGPASSWORD", &config.replication_password)
        .env("PGCONNECT_TIMEOUT", "5")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some((uid, gid)) = config.os_user {
        command.uid(uid).gid(gid);
    }
    let output = tokio::time::timeout(limit, command.output())
        .await
        .map_err(|_| StandbyError::Tool { tool, detail: format!("no result within {limit:?}") })?
        .map_err(|error| StandbyError::Tool { tool, detail: error.to_string() })?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        return Ok(stdout + &String::from_utf8_lossy(&output.stderr));
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("").to_string();
    Err(StandbyError::Tool { tool, detail: format!("{}: {last}", output.status) })
}

/// The latest checkpoint of a stopped data directory and whether it was shut down cleanly.
pub async fn shutdown_checkpoint(config: &InstanceConfig) -> Result<(Lsn, bool), StandbyError> {
    let args = ["-D".to_string(), config.pgdata.display().to_string()];
    let out = run_tool(config, "pg_controldata", &args, Duration::from_secs(30)).await?;
    let field = |name: &str| {
        out.lines().find_map(|line| line.strip_prefix(name).map(|rest| rest.trim_start_matches(':').trim().to_string()))
    };
    let detail = |what: &str| StandbyError::Tool { tool: "pg_controldata", detail: format!("no {what} in its output") };
    let location = field("Latest checkpoint location").ok_or_else(|| detail("checkpoint location"))?;
    let lsn = location.parse().map_err(|_| detail("valid checkpoint location"))?;
    let state = field("Database cluster state").ok_or_else(|| detail("cluster state"))?;
    Ok((lsn, state == "shut down"))
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
    use crate::failover::lease::LeaseTimings;
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
            replication_user: "replicator".into(),
            replication_password: r"it's a \secret".into(),
            settings: vec![("wal_keep_size".into(), "256MB".into())],
            log_file: PathBuf::new(),
            os_user: None,
            health_timeout: Duration::from_secs(1),
            tick: Duration::from_secs(1),
            lease: LeaseTimings::default(),
            stop_grace: Duration::from_secs(1),
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
}
