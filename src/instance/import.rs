//! `spec.bootstrap.import` (issue 24): the first primary's agent copies named databases from an
//! existing PostgreSQL with `pg_dump | pg_restore`, once. Each database is restored in a single
//! transaction, so it is either as it was or complete; a database that already holds objects is
//! never restored into (it was imported, by this agent or by a primary before a failover: the
//! objects replicate, the record below does not). Done databases are recorded in
//! [`PROGRESS_FILE`] in the data directory, and once the status says Completed the operator no
//! longer hands the import to the agents at all. Objects are owned by the application's role
//! (`--no-owner --role`), without the source's grants.
//!
//! The source's password reaches `pg_dump` and `psql` as a password file only they read (never
//! an argument or environment variable, never logged).

use crate::api::import::{ImportPhase, ImportSpec, ImportStatus, ImportedDatabase};
use crate::instance::import_roles::role_statements;
use crate::instance::roles::{connect, identifier, STATEMENT_TIMEOUT};
use crate::instance::session;
use crate::instance::{InstanceConfig, SecretReader};
use crate::passfile::PasswordFile;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// File in the data directory listing the databases imported, one per line; `complete` last.
pub const PROGRESS_FILE: &str = "dbservice-import-progress";
/// Last line of [`PROGRESS_FILE`] once every database is in.
const COMPLETE: &str = "complete";
/// Line of [`PROGRESS_FILE`] once the roles are in (no database name has a `:`).
const ROLES_DONE: &str = ":roles";
/// Longest copy of one database.
const DATABASE_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
/// Pause after the first failed attempt, doubled up to [`MAX_RETRY_PAUSE`].
const FIRST_RETRY_PAUSE: Duration = Duration::from_secs(10);
/// Longest pause between attempts.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(300);
/// Longest message kept from a tool's output.
const MAX_MESSAGE_LENGTH: usize = 1000;

/// The databases already imported (and whether all are), from the data directory.
pub fn progress(pgdata: &Path) -> (Vec<String>, bool) {
    let text = std::fs::read_to_string(pgdata.join(PROGRESS_FILE)).unwrap_or_default();
    let lines: Vec<String> = text.lines().map(str::to_string).filter(|line| !line.is_empty()).collect();
    let complete = lines.last().is_some_and(|line| line == COMPLETE);
    (lines.into_iter().filter(|line| line != COMPLETE).collect(), complete)
}

fn record(config: &InstanceConfig, line: &str) -> Result<(), String> {
    use std::io::Write;
    let path = config.pgdata.join(PROGRESS_FILE);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|error| format!("record the import in {}: {error}", path.display()))?;
    writeln!(file, "{line}").and_then(|()| file.sync_all()).map_err(|error| format!("record the import: {error}"))?;
    config.chown(&[&path]);
    Ok(())
}

/// The tool's last lines of standard error, without its name prefix repeated.
fn last_lines(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    let mut message = lines[lines.len().saturating_sub(3)..].join("; ");
    if message.len() > MAX_MESSAGE_LENGTH {
        let mut cut = MAX_MESSAGE_LENGTH;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    message
}

/// A tool of the server's major connected to the source (host, port, user, sslmode, password file).
fn source_command(config: &InstanceConfig, spec: &ImportSpec, tool: &str, password_file: &PasswordFile) -> Command {
    let mut command = Command::new(config.pg_bin.join(tool));
    // No PGOPTIONS: pg_dump and pg_dumpall pin an empty search_path on connect themselves
    // (CVE-2018-1058), and they read the source, not a database the application writes here.
    // The agent's own libpq settings (PGDATA, PGPORT, a password) must not reach the source.
    for (variable, _) in std::env::vars_os() {
        if variable.to_string_lossy().starts_with("PG") {
            command.env_remove(variable);
        }
    }
    command
        .env("PGHOST", &spec.source.host)
        .env("PGPORT", spec.source.port_or_default().to_string())
        .env("PGUSER", &spec.source.username)
        .env("PGSSLMODE", spec.source.ssl_mode_or_default())
        .env("PGPASSFILE", password_file.path())
        .env("PGCONNECT_TIMEOUT", "10")
        .env("PGAPPNAME", "dbservice-import")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some((uid, gid)) = config.os_user {
        command.uid(uid).gid(gid);
    }
    command
}

async fn source_version(
    config: &InstanceConfig,
    spec: &ImportSpec,
    password_file: &PasswordFile,
) -> Result<String, String> {
    let mut command = source_command(config, spec, "psql", password_file);
    command.args(["-X", "-A", "-t", "-d", &spec.databases[0], "-c", "SHOW server_version"]);
    let output = tokio::time::timeout(STATEMENT_TIMEOUT, command.output())
        .await
        .map_err(|_| format!("the source did not answer within {STATEMENT_TIMEOUT:?}"))?
        .map_err(|error| format!("run psql: {error}"))?;
    if !output.status.success() {
        return Err(format!("connect to the source: {}", last_lines(&output.stderr)));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// Makes the local database `name` when missing, owned by `owner`.
async fn ensure_database(config: &InstanceConfig, name: &str, owner: &str) -> Result<(), String> {
    let client = connect(config, &config.superuser, "postgres").await.map_err(|error| error.to_string())?;
    let exists = tokio::time::timeout(
        STATEMENT_TIMEOUT,
        client.query_opt("SELECT 1 FROM pg_catalog.pg_database WHERE datname = $1", &[&name]),
    )
    .await
    .map_err(|_| "look up the database: no answer".to_string())?
    .map_err(|error| format!("look up the database: {error}"))?;
    if exists.is_none() {
        let sql = format!("CREATE DATABASE {} OWNER {}", identifier(name), identifier(owner));
        tokio::time::timeout(STATEMENT_TIMEOUT, client.batch_execute(&sql))
            .await
            .map_err(|_| "create the database: no answer".to_string())?
            .map_err(|error| format!("create the database {name:?}: {}", crate::instance::roles::detail(&error)))?;
    }
    Ok(())
}

/// Whether the local database `name` holds anything a restore would have made: relations,
/// functions, types or schemas outside PostgreSQL's own, or extensions besides plpgsql.
async fn holds_objects(config: &InstanceConfig, name: &str) -> Result<bool, String> {
    const SQL: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
          WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_(toast|temp_|toast_temp_)') \
        OR EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
          WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')) \
        OR EXISTS (SELECT 1 FROM pg_catalog.pg_namespace \
          WHERE nspname NOT IN ('public', 'pg_catalog', 'information_schema') AND nspname !~ '^pg_') \
        OR EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname <> 'plpgsql')";
    let client = connect(config, &config.superuser, name).await.map_err(|error| error.to_string())?;
    let row = tokio::time::timeout(STATEMENT_TIMEOUT, client.query_one(SQL, &[]))
        .await
        .map_err(|_| format!("look into {name:?}: no answer"))?
        .map_err(|error| format!("look into {name:?}: {error}"))?;
    Ok(row.get(0))
}

/// `pg_dump -Fc` of the source's `name` piped into `pg_restore` of the local one, in one transaction.
async fn copy_database(
    config: &InstanceConfig,
    spec: &ImportSpec,
    name: &str,
    owner: &str,
    password_file: &PasswordFile,
) -> Result<(), String> {
    let mut dump = source_command(config, spec, "pg_dump", password_file);
    dump.arg("--format=custom");
    if !spec.with_roles() {
        dump.args(["--no-owner", "--no-privileges"]);
    }
    dump.args(["-d", name]).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut dump = dump.spawn().map_err(|error| format!("run pg_dump: {error}"))?;
    let dump_output: Stdio = dump.stdout.take().expect("piped").try_into().map_err(|error| format!("pipe: {error}"))?;
    let mut restore = Command::new(config.pg_bin.join("pg_restore"));
    // No PGOPTIONS: pg_restore pins an empty search_path on connect, and the dump sets its own.
    restore.env_remove("PGPASSWORD").env_remove("PGHOST").args(["--exit-on-error", "--single-transaction"]);
    // With the source's roles here, owners and grants are kept, which takes the superuser; without,
    // the application's role restores and owns all. It logs in as itself (the local socket trusts
    // it), not as the superuser with --role: code the dump runs (a CHECK constraint's function
    // during COPY) could SET ROLE back to a superuser session user.
    let restoring_user = if spec.with_roles() {
        &config.superuser
    } else {
        restore.args(["--no-owner", "--no-privileges"]);
        owner
    };
    restore
        .arg("-h")
        .arg(&config.socket_dir)
        .args(["-p", &config.port.to_string(), "-U", restoring_user, "-d", name])
        .stdin(dump_output)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some((uid, gid)) = config.os_user {
        restore.uid(uid).gid(gid);
    }
    let restore = restore.spawn().map_err(|error| format!("run pg_restore: {error}"))?;
    let mut dump_stderr = dump.stderr.take().expect("piped");
    let both = async {
        let mut dump_errors = Vec::new();
        let (dump_read, restore_output) =
            tokio::join!(dump_stderr.read_to_end(&mut dump_errors), restore.wait_with_output());
        let _ = dump_read;
        let dump_status = dump.wait().await;
        (dump_status, dump_errors, restore_output)
    };
    let (dump_status, dump_errors, restore_output) = tokio::time::timeout(DATABASE_TIMEOUT, both)
        .await
        .map_err(|_| format!("copying {name:?} took longer than {DATABASE_TIMEOUT:?}"))?;
    let dump_ok = dump_status.as_ref().is_ok_and(|status| status.success());
    if !dump_ok {
        return Err(format!("pg_dump of {name:?}: {}", last_lines(&dump_errors)));
    }
    let restore_output = restore_output.map_err(|error| format!("pg_restore: {error}"))?;
    if !restore_output.status.success() {
        return Err(format!("pg_restore into {name:?}: {}", last_lines(&restore_output.stderr)));
    }
    Ok(())
}

/// Creates the source's roles here (see [`crate::instance::import_roles`]) in one transaction;
/// returns how many were created. Safe to run again: existing roles are not created twice.
async fn import_roles(
    config: &InstanceConfig,
    spec: &ImportSpec,
    owner: &str,
    password_file: &PasswordFile,
) -> Result<u32, String> {
    let mut dump = source_command(config, spec, "pg_dumpall", password_file);
    dump.args(["--roles-only", "--no-role-passwords", "-l", &spec.databases[0]]);
    let output = tokio::time::timeout(STATEMENT_TIMEOUT * 4, dump.output())
        .await
        .map_err(|_| "pg_dumpall --roles-only: no result in time".to_string())?
        .map_err(|error| format!("run pg_dumpall: {error}"))?;
    if !output.status.success() {
        return Err(format!("pg_dumpall --roles-only: {}", last_lines(&output.stderr)));
    }
    let client = connect(config, &config.superuser, "postgres").await.map_err(|error| error.to_string())?;
    let rows =
        tokio::time::timeout(STATEMENT_TIMEOUT, client.query("SELECT rolname::text FROM pg_catalog.pg_roles", &[]))
            .await
            .map_err(|_| "list the roles: no answer".to_string())?
            .map_err(|error| format!("list the roles: {error}"))?;
    let existing: BTreeSet<String> = rows.iter().map(|row| row.get(0)).collect();
    let reserved: BTreeSet<String> = [config.superuser.as_str(), config.replication_user.as_str(), "postgres"]
        .into_iter()
        .map(String::from)
        .collect();
    let statements = role_statements(&String::from_utf8_lossy(&output.stdout), &reserved, owner, &existing)?;
    let created = statements.iter().filter(|statement| statement.starts_with("CREATE ROLE ")).count();
    let mut psql = Command::new(config.pg_bin.join("psql"));
    // psql leaves search_path as the database has it: pinned for the superuser's session.
    psql.env_remove("PGPASSWORD")
        .env("PGOPTIONS", session::tool_options())
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction", "-h"])
        .arg(&config.socket_dir)
        .args(["-p", &config.port.to_string(), "-U", &config.superuser, "-d", "postgres"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some((uid, gid)) = config.os_user {
        psql.uid(uid).gid(gid);
    }
    let mut child = psql.spawn().map_err(|error| format!("run psql: {error}"))?;
    let mut input = child.stdin.take().expect("piped");
    let script = statements.join("\n") + "\n";
    use tokio::io::AsyncWriteExt;
    input.write_all(script.as_bytes()).await.map_err(|error| format!("psql input: {error}"))?;
    drop(input);
    let output = tokio::time::timeout(STATEMENT_TIMEOUT * 4, child.wait_with_output())
        .await
        .map_err(|_| "creating the imported roles: no result in time".to_string())?
        .map_err(|error| format!("psql: {error}"))?;
    if !output.status.success() {
        return Err(format!("creating the imported roles: {}", last_lines(&output.stderr)));
    }
    Ok(u32::try_from(created).unwrap_or(u32::MAX))
}

/// One attempt: every database not yet imported, in order.
async fn attempt(
    config: &InstanceConfig,
    spec: &ImportSpec,
    owner: &str,
    secrets: &SecretReader,
    status: &mut ImportStatus,
) -> Result<(), String> {
    let secret = &spec.source.password_secret;
    let password = secrets
        .read(&secret.name, secret.key_or_default())
        .await
        .map_err(|error| error.to_string())?
        .ok_or_else(|| format!("Secret {:?} has no key {:?}", secret.name, secret.key_or_default()))?;
    let password_file = PasswordFile::new(&spec.source.username, &password, config.os_user)
        .map_err(|error| format!("password file: {error}"))?;
    status.source_version = Some(source_version(config, spec, &password_file).await?);
    let (done, _) = progress(&config.pgdata);
    if spec.with_roles() && !done.iter().any(|line| line == ROLES_DONE) {
        let created = import_roles(config, spec, owner, &password_file).await?;
        record(config, ROLES_DONE)?;
        tracing::info!(instance = %config.name, created, "imported the source's roles");
        status.roles_created = Some(created);
    }
    for name in &spec.databases {
        if done.contains(name) {
            continue;
        }
        let started = Instant::now();
        ensure_database(config, name, owner).await?;
        if holds_objects(config, name).await? {
            tracing::info!(instance = %config.name, database = %name, "already imported (it holds objects): not restored again");
            record(config, name)?;
            continue;
        }
        copy_database(config, spec, name, owner, &password_file).await?;
        record(config, name)?;
        let milliseconds = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(instance = %config.name, database = %name, milliseconds, "imported");
        status.databases.push(ImportedDatabase { name: name.clone(), milliseconds });
    }
    record(config, COMPLETE)
}

/// Runs the import on a ready primary until it is complete, with a growing pause between
/// failed attempts; keeps the last outcome for the report.
#[derive(Debug, Default)]
pub struct ImportKeeper {
    wanted: Option<ImportSpec>,
    running: Option<tokio::task::JoinHandle<ImportStatus>>,
    status: Option<ImportStatus>,
    next_attempt: Option<Instant>,
}

impl ImportKeeper {
    /// The import as the API has it now (None: none, or unknown).
    pub fn want(&mut self, spec: Option<&ImportSpec>) {
        if let Some(spec) = spec {
            self.wanted = Some(spec.clone());
        }
    }

    /// Called on every step of a ready primary whose own roles are kept: starts an attempt when
    /// one is due, or collects the finished one.
    pub fn keep(&mut self, config: &InstanceConfig, secrets: &SecretReader) {
        let Some(spec) = &self.wanted else { return };
        if self.settled() {
            // Done: no file read on every step.
            return;
        }
        if let Some(task) = &self.running {
            if !task.is_finished() {
                return;
            }
            use futures::FutureExt;
            let task = self.running.take().expect("checked");
            if let Some(Ok(status)) = task.now_or_never() {
                if status.phase == ImportPhase::Failed {
                    let pause = FIRST_RETRY_PAUSE
                        .saturating_mul(2u32.saturating_pow(status.attempts.saturating_sub(1).min(8)))
                        .min(MAX_RETRY_PAUSE);
                    tracing::warn!(instance = %config.name, message = ?status.message, ?pause, "import failed; trying again");
                    self.next_attempt = Some(Instant::now() + pause);
                }
                self.status = Some(status);
            }
            return;
        }
        let (_, complete) = progress(&config.pgdata);
        if complete {
            if self.status.as_ref().is_none_or(|status| status.phase != ImportPhase::Completed) {
                let attempts = self.status.as_ref().map_or(0, |status| status.attempts);
                self.status = Some(ImportStatus {
                    phase: ImportPhase::Completed,
                    attempts,
                    databases: self.status.take().map(|status| status.databases).unwrap_or_default(),
                    message: None,
                    source_version: None,
                    roles_created: None,
                });
            }
            return;
        }
        if self.next_attempt.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let attempts = self.status.as_ref().map_or(0, |status| status.attempts) + 1;
        let owner = config.roles.as_ref().map_or(config.superuser.clone(), |roles| roles.application_user.clone());
        let running = ImportStatus {
            phase: ImportPhase::Running,
            attempts,
            databases: Vec::new(),
            message: None,
            source_version: self.status.as_ref().and_then(|status| status.source_version.clone()),
            roles_created: None,
        };
        self.status = Some(running.clone());
        tracing::info!(instance = %config.name, attempts, databases = ?spec.databases, host = %spec.source.host, "importing");
        let (config, secrets, spec) = (config.clone(), secrets.clone(), spec.clone());
        self.running = Some(tokio::spawn(async move {
            let mut status = running;
            match attempt(&config, &spec, &owner, &secrets, &mut status).await {
                Ok(()) => status.phase = ImportPhase::Completed,
                Err(message) => {
                    status.phase = ImportPhase::Failed;
                    status.message = Some(message);
                }
            }
            status
        }));
    }

    /// Whether nothing is left to import (none asked for, or complete): the declared roles and
    /// databases wait for it, since a declared extension would make an imported database look
    /// imported already.
    pub fn settled(&self) -> bool {
        self.wanted.is_none() || self.status.as_ref().is_some_and(|status| status.phase == ImportPhase::Completed)
    }

    /// The last outcome (None with nothing to import, or before the first attempt).
    pub fn status(&self) -> Option<&ImportStatus> {
        self.status.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lists_the_imported_databases_and_whether_all_are() {
        let directory = tempfile::tempdir().unwrap();
        assert_eq!(progress(directory.path()), (vec![], false));
        std::fs::write(directory.path().join(PROGRESS_FILE), "app\n").unwrap();
        assert_eq!(progress(directory.path()), (vec!["app".to_string()], false));
        std::fs::write(directory.path().join(PROGRESS_FILE), "app\nreports\ncomplete\n").unwrap();
        assert_eq!(progress(directory.path()), (vec!["app".to_string(), "reports".to_string()], true));
    }

    #[test]
    fn a_tool_message_keeps_its_last_lines_within_the_limit() {
        assert_eq!(last_lines(b"one\n\ntwo\nthree\nfour\n"), "two; three; four");
        assert!(last_lines("é".repeat(2000).as_bytes()).len() <= MAX_MESSAGE_LENGTH);
    }
}
