//! The first data directory of a recovered database (`spec.bootstrap.recovery`): restore the base
//! backup into a staging directory, let PostgreSQL (socket only) replay the source's WAL up to the
//! target and promote, give the roles this database's passwords, stop cleanly, drop the recovery
//! settings, and only then move the directory to PGDATA. An interrupted or failed attempt leaves
//! PGDATA empty (the staging copy is a copy of the store and is discarded), so a retry starts
//! over and a half-recovered directory can never start as the primary.

use crate::api::recovery::{
    staging_directory, RecoveryPhase, RecoveryPlan, RecoveryStatus, CA_DIRECTORY, CA_FILE, CREDENTIALS_DIRECTORY,
};
use crate::instance::postgres::{initialized, LocalState, Postgres, PostgresError};
use crate::instance::standby::{self, StandbyError};
use crate::instance::InstanceConfig;
use crate::store::config::{RestoreArgs, StoreArgs};
use crate::store::restore::{restore, without_recovery_settings, RestoreError};
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Why a recovery attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    /// Restoring the base backup failed.
    #[error(transparent)]
    Restore(#[from] RestoreError),
    /// Writing settings failed.
    #[error(transparent)]
    Settings(#[from] StandbyError),
    /// The temporary server failed.
    #[error(transparent)]
    Postgres(#[from] PostgresError),
    /// PostgreSQL exited during replay, usually at the target (the log line says why).
    #[error("postgresql stopped during recovery: {0}")]
    Replay(String),
    /// Neither the superuser nor the application's role is a role of the source database.
    #[error("cannot connect as {user:?}: {detail} (the source database must have a superuser postgres, or spec.username as its superuser)")]
    Superuser {
        /// The superuser's name.
        user: String,
        /// PostgreSQL's answer.
        detail: String,
    },
    /// The recovered server did not stop cleanly.
    #[error("the recovered server did not stop cleanly")]
    Unclean,
    /// A file operation on the data directories failed.
    #[error("{path}: {error}")]
    Files {
        /// The path.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// SIGTERM arrived.
    #[error("interrupted by termination")]
    Interrupted,
}

fn files(path: &Path) -> impl FnOnce(std::io::Error) -> RecoverError + '_ {
    move |error| RecoverError::Files { path: path.display().to_string(), error }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// An SQL identifier.
fn identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// An SQL string literal (standard_conforming_strings is on since PostgreSQL 9.1).
fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// Statements giving the superuser, the application's role and the replication role this
/// database's passwords (the restored roles carry the source's). A source made before issue 22
/// has no role `superuser` (its application role is the superuser; the primary's agent migrates
/// it later, see `roles`), a foreign source may lack the application's: only existing ones are
/// set. No statement is logged, even when it fails.
fn password_statements(logins: &[(&str, &str)], replication_user: &str, replication_password: &str) -> String {
    let replication = identifier(replication_user);
    let set_if_exists = |(role, password): &(&str, &str)| {
        format!(
            "DO $dbservice$BEGIN IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = {}) THEN ALTER ROLE {} WITH LOGIN PASSWORD {}; END IF; END$dbservice$",
            literal(role),
            identifier(role),
            literal(password)
        )
    };
    let mut statements = vec![
        "SET log_statement = 'none'".to_string(),
        "SET log_min_error_statement = 'panic'".to_string(),
        "SET password_encryption = 'scram-sha-256'".to_string(),
        format!(
            "DO $$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = {}) THEN CREATE ROLE {replication}; END IF; END$$",
            literal(replication_user)
        ),
        format!("ALTER ROLE {replication} WITH REPLICATION LOGIN PASSWORD {}", literal(replication_password)),
    ];
    statements.extend(logins.iter().map(set_if_exists));
    statements.join(";\n")
}

/// The roles whose passwords the restored database gets: the superuser's, and the
/// application's when the agent keeps roles.
fn logins<'a>(config: &'a InstanceConfig, superuser_password: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut logins = vec![(config.superuser.as_str(), superuser_password)];
    if let Some(roles) = &config.roles {
        logins.push((roles.application_user.as_str(), roles.application_password.as_str()));
    }
    logins
}

/// The last FATAL or PANIC lines of a server log, for the condition message; a wal-restore that
/// stopped recovery at a gap in the archive is named as such (its own message goes to the
/// container log, PostgreSQL's only says which exit code).
fn fatal_lines(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|line| line.contains("FATAL:") || line.contains("PANIC:")).collect();
    let last = &lines[lines.len().saturating_sub(2)..];
    if last.is_empty() {
        return "no FATAL line in its log (see the container log)".into();
    }
    let text = last.iter().map(|line| line.trim()).collect::<Vec<_>>().join(" / ");
    let gap = format!("exit code {}", crate::store::wal::GAP_EXIT_STATUS);
    if text.contains(&gap) {
        return format!(
            "a gap in the WAL archive: a segment is missing although later ones are archived, so recovery cannot \
             reach the end of the archive ({text})"
        );
    }
    text
}

/// Reads the temporary server's log, copies its tail to standard error (kubectl logs), removes it.
fn drain_log(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let tail = &text[text.len().saturating_sub(64 * 1024)..];
    let tail = tail.get(tail.find('\n').map_or(0, |newline| newline + 1)..).unwrap_or(tail);
    eprint!("{tail}");
    let _ = std::fs::remove_file(path);
    text
}

/// Hands a restored tree to the user PostgreSQL runs as (an agent running as root: tests).
fn chown_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// One recovery attempt: the report of each phase goes to `report`; the completed status is
/// returned. `stop` interrupts it (PGDATA stays empty).
pub async fn recover(
    config: &InstanceConfig,
    plan: &RecoveryPlan,
    restore_args: RestoreArgs,
    superuser_password: &str,
    attempt: u32,
    stop: &mut watch::Receiver<bool>,
    report: &mut impl AsyncFnMut(&RecoveryStatus),
) -> Result<RecoveryStatus, (RecoveryStatus, RecoverError)> {
    let mut status = RecoveryStatus {
        phase: RecoveryPhase::Restoring,
        instance: config.name.clone(),
        target: plan.target_description(),
        backup_id: plan.backup_id.clone(),
        attempt,
        started_at: now(),
        restored_at: None,
        completed_at: None,
        restored_bytes: None,
        restore_seconds: None,
        replay_seconds: None,
        error: None,
    };
    report(&status).await;
    match attempt_recovery(config, restore_args, superuser_password, stop, &mut status, report).await {
        Ok(()) => Ok(status),
        Err(error) => {
            status.phase = RecoveryPhase::Failed;
            status.error = Some(error.to_string());
            Err((status, error))
        }
    }
}

async fn attempt_recovery(
    config: &InstanceConfig,
    restore_args: RestoreArgs,
    superuser_password: &str,
    stop: &mut watch::Receiver<bool>,
    status: &mut RecoveryStatus,
    report: &mut impl AsyncFnMut(&RecoveryStatus),
) -> Result<(), RecoverError> {
    let staging = staging_directory(&config.pgdata);
    if staging.exists() {
        // An earlier attempt's copy of the store: nothing of its own.
        std::fs::remove_dir_all(&staging).map_err(files(&staging))?;
    }
    let started = Instant::now();
    let restoring = restore(RestoreArgs { pgdata: staging.clone(), ..restore_args });
    let backup = tokio::select! {
        restored = restoring => restored?,
        _ = stop.changed() => return Err(RecoverError::Interrupted),
    };
    if let Some((uid, gid)) = config.os_user {
        chown_tree(&staging, uid, gid).map_err(files(&staging))?;
    }
    status.phase = RecoveryPhase::Replaying;
    status.backup_id = Some(backup.id.clone());
    status.restored_at = Some(now());
    status.restored_bytes = Some(backup.size_bytes);
    status.restore_seconds = Some(started.elapsed().as_secs_f64());
    tracing::info!(backup = %backup.id, bytes = backup.size_bytes, seconds = status.restore_seconds, "base backup restored: replaying WAL");
    report(status).await;

    let replay_started = Instant::now();
    let log_file = staging.with_extension("recovery-log");
    let temporary = InstanceConfig {
        pgdata: staging.clone(),
        // Socket only: nobody reaches the database before it is recovered.
        listen_addresses: String::new(),
        log_file: log_file.clone(),
        ..config.clone()
    };
    standby::write_required_settings(&temporary)?;
    let mut postgres = Postgres::new(temporary.clone());
    postgres.start()?;
    let promoted = wait_for_promotion(&mut postgres, &temporary, stop).await;
    let promoted = match promoted {
        Ok(()) => postgres
            .execute(&password_statements(
                &logins(config, superuser_password),
                &config.replication_user,
                &config.replication_password,
            ))
            .await
            .map_err(RecoverError::from),
        Err(error) => Err(error),
    };
    postgres.checkpoint().await;
    let clean = postgres.stop(config.stop_grace).await;
    let log = drain_log(&log_file);
    match promoted {
        Err(RecoverError::Replay(_)) => return Err(RecoverError::Replay(fatal_lines(&log))),
        Err(error) => return Err(error),
        Ok(()) if !clean => return Err(RecoverError::Unclean),
        Ok(()) => {}
    }
    standby::rewrite_auto_conf(&temporary, without_recovery_settings)?;
    let signal = staging.join("recovery.signal");
    if signal.exists() {
        std::fs::remove_file(&signal).map_err(files(&signal))?;
    }
    if config.pgdata.exists() {
        // Empty (checked by the caller through initialized()); anything else is refused by rmdir.
        std::fs::remove_dir(&config.pgdata).map_err(files(&config.pgdata))?;
    }
    std::fs::rename(&staging, &config.pgdata).map_err(files(&config.pgdata))?;
    debug_assert!(initialized(&config.pgdata));
    status.phase = RecoveryPhase::Completed;
    status.completed_at = Some(now());
    status.replay_seconds = Some(replay_started.elapsed().as_secs_f64());
    status.error = None;
    Ok(())
}

/// Waits until the server left recovery (PostgreSQL promotes itself at the target:
/// recovery_target_action = 'promote'); an exit on the way is a failed replay. No deadline: a
/// replay takes as long as the WAL it has to apply.
async fn wait_for_promotion(
    postgres: &mut Postgres,
    config: &InstanceConfig,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), RecoverError> {
    let mut last_logged = Instant::now();
    loop {
        if !postgres.is_running() {
            return Err(RecoverError::Replay(String::new()));
        }
        match postgres.observe().await {
            LocalState::Ready(sample) if !sample.in_recovery => return Ok(()),
            LocalState::Ready(sample) if last_logged.elapsed() > Duration::from_secs(30) => {
                last_logged = Instant::now();
                tracing::info!(replayed = ?sample.replay_lsn, "replaying the source's WAL");
            }
            LocalState::NotReady(reason) if reason.contains("does not exist") && reason.contains("role") => {
                return Err(RecoverError::Superuser { user: config.superuser.clone(), detail: reason });
            }
            _ => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => return Err(RecoverError::Interrupted),
        }
    }
}

/// The `restore` settings of `plan` for the data directory `pgdata`, with the credentials
/// files under `credentials_directory` (and the CA under `ca_directory`) as the pod mounts them.
pub fn restore_args(
    plan: &RecoveryPlan,
    pgdata: &Path,
    binary: &Path,
    credentials_directory: &Path,
    ca_directory: &Path,
) -> RestoreArgs {
    let source = &plan.source;
    let target = plan.target.clone().unwrap_or_default();
    RestoreArgs {
        pgdata: pgdata.to_path_buf(),
        backup_id: plan.backup_id.clone(),
        target_time: target.time,
        target_lsn: target.lsn,
        target_xid: target.xid.and_then(|xid| u64::try_from(xid).ok()),
        target_name: target.name,
        restore_command_binary: Some(binary.to_path_buf()),
        store: StoreArgs {
            endpoint: source.endpoint.clone(),
            bucket: source.bucket.clone(),
            path: source.path.clone().unwrap_or_default(),
            server_name: source.server_name.clone().unwrap_or_default(),
            region: source.region.clone().unwrap_or_else(|| "us-east-1".into()),
            access_key_id: None,
            access_key_id_file: Some(credentials_directory.join("accessKeyId")),
            secret_access_key: None,
            secret_access_key_file: Some(credentials_directory.join("secretAccessKey")),
            ca_file: source.ca_secret.as_ref().map(|_| ca_directory.join(CA_FILE)),
            timeout_seconds: 60,
            connect_timeout_seconds: None,
            addressing: crate::store::client::Addressing::Path,
            compression: crate::store::compression::Compression::Zstd,
        },
    }
}

/// [`restore_args`] with the pod's mount points.
pub fn restore_args_in_pod(plan: &RecoveryPlan, pgdata: &Path, binary: &Path) -> RestoreArgs {
    restore_args(plan, pgdata, binary, Path::new(CREDENTIALS_DIRECTORY), Path::new(CA_DIRECTORY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_set_as_literals_without_logging() {
        let statements = password_statements(&[("postgres", "su"), ("app_user", "it's secret")], "replicator", "r\"pl");
        assert!(statements.starts_with("SET log_statement = 'none'"));
        assert!(statements.contains("THEN ALTER ROLE \"app_user\" WITH LOGIN PASSWORD 'it''s secret'; END IF"));
        assert!(
            statements.contains("WHERE rolname = 'postgres') THEN ALTER ROLE \"postgres\" WITH LOGIN PASSWORD 'su'")
        );
        assert!(statements.contains("ALTER ROLE \"replicator\" WITH REPLICATION LOGIN PASSWORD 'r\"pl'"));
        assert!(statements.contains("WHERE rolname = 'replicator') THEN CREATE ROLE \"replicator\""));
    }

    #[test]
    fn the_failure_names_the_fatal_line() {
        let log = "LOG:  starting\nLOG:  restored log file\nFATAL:  recovery ended before configured recovery target was reached\nLOG:  startup process exited\n";
        assert_eq!(fatal_lines(log), "FATAL:  recovery ended before configured recovery target was reached");
        assert!(fatal_lines("LOG: fine\n").contains("no FATAL line"));
    }
}
