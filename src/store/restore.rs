//! `dbservice-operator restore`: fills an empty data directory from a base backup and configures
//! PostgreSQL to replay archived WAL (`restore_command` = our `wal-restore`) up to a target, then
//! promote. Starting PostgreSQL is the caller's job (the pod, or the test).

use crate::store::catalog::{list_backups, CatalogError};
use crate::store::client::S3Client;
use crate::store::config::{RestoreArgs, StoreConfigError};
use crate::store::manifest::{BackupChunk, BackupManifest};
use crate::store::selection::{select_backup, RecoveryTarget, SelectBackupError};
use crate::store::signing::sha256_hex;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why a restore failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// Bad settings.
    #[error(transparent)]
    Config(#[from] StoreConfigError),
    /// The store could not be read.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// No backup fits the target.
    #[error(transparent)]
    Select(#[from] SelectBackupError),
    /// The data directory is not empty: a restore never overwrites data.
    #[error("data directory {0} is not empty; restore only into an empty or new directory")]
    NotEmpty(String),
    /// The target does not parse.
    #[error("{flag}: {message}")]
    Target {
        /// The flag.
        flag: &'static str,
        /// Why.
        message: String,
    },
    /// The backup could not be read or unpacked.
    #[error("unpack backup {id} into {directory}: {message}")]
    Unpack {
        /// Backup id.
        id: String,
        /// Data directory.
        directory: String,
        /// Why.
        message: String,
    },
    /// The recovery settings could not be written.
    #[error("write {path}: {error}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
}

/// Reads the chunks of a backup, in order, each checked against its recorded SHA-256.
struct ChunkReader<'a> {
    runtime: tokio::runtime::Handle,
    client: &'a S3Client,
    chunks: std::slice::Iter<'a, BackupChunk>,
    current: std::io::Cursor<bytes::Bytes>,
}

impl Read for ChunkReader<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let read = self.current.read(buffer)?;
            if read > 0 || buffer.is_empty() {
                return Ok(read);
            }
            let Some(chunk) = self.chunks.next() else { return Ok(0) };
            let limit = usize::try_from(chunk.bytes).map_err(std::io::Error::other)?;
            let object = self
                .runtime
                .block_on(self.client.get_object(&chunk.key, limit))
                .map_err(std::io::Error::other)?
                .ok_or_else(|| std::io::Error::other(format!("{} is missing", chunk.key)))?;
            let actual = sha256_hex(&object.body);
            if !actual.eq_ignore_ascii_case(&chunk.sha256) {
                return Err(std::io::Error::other(format!(
                    "{}: sha256 {actual} differs from the recorded {}",
                    chunk.key, chunk.sha256
                )));
            }
            self.current = std::io::Cursor::new(object.body);
        }
    }
}

/// The target the flags describe.
pub fn target_of(args: &RestoreArgs) -> Result<RecoveryTarget, RestoreError> {
    let bad = |flag: &'static str, message: String| RestoreError::Target { flag, message };
    if let Some(time) = &args.target_time {
        let parsed = chrono::DateTime::parse_from_rfc3339(time)
            .map_err(|error| bad("--target-time", format!("{time:?} is not an RFC 3339 time: {error}")))?;
        return Ok(RecoveryTarget::Time(parsed.with_timezone(&chrono::Utc)));
    }
    if let Some(lsn) = &args.target_lsn {
        return Ok(RecoveryTarget::Lsn(
            lsn.parse().map_err(|error: crate::lsn::ParseLsnError| bad("--target-lsn", error.to_string()))?,
        ));
    }
    if let Some(xid) = args.target_xid {
        return Ok(RecoveryTarget::Xid(xid));
    }
    if let Some(name) = &args.target_name {
        if name.is_empty() || name.len() > 63 {
            return Err(bad("--target-name", "a restore point name has 1 to 63 characters".to_string()));
        }
        return Ok(RecoveryTarget::Name(name.clone()));
    }
    Ok(RecoveryTarget::Latest)
}

/// A word for `sh -c` (PostgreSQL runs restore_command through the shell).
fn shell_word(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// `restore_command`: our `wal-restore`, reading from the store the base backup came from (its
/// settings as flags, so that a pod archiving into another store still replays the source's WAL).
pub fn restore_command_line(binary: &Path, store: &crate::store::config::StoreArgs) -> String {
    let mut line = format!("{} wal-restore %f %p", shell_word(&binary.display().to_string()));
    for flag in store.flags_without_secrets() {
        line.push(' ');
        line.push_str(&shell_word(&flag));
    }
    line
}

/// A string literal for postgresql.conf.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// The lines appended to postgresql.auto.conf: how to fetch WAL, where to stop, what then.
pub fn recovery_settings(restore_command: &str, target: &RecoveryTarget, backup_id: &str) -> String {
    let mut lines = vec![
        format!("# dbservice-operator: recovery from base backup {backup_id}"),
        format!("restore_command = {}", quote(restore_command)),
        "recovery_target_timeline = 'latest'".to_string(),
        "recovery_target_action = 'promote'".to_string(),
    ];
    match target {
        RecoveryTarget::Latest => {}
        RecoveryTarget::Time(time) => lines
            .push(format!("recovery_target_time = {}", quote(&time.format("%Y-%m-%d %H:%M:%S%.6f+00").to_string()))),
        RecoveryTarget::Lsn(lsn) => lines.push(format!("recovery_target_lsn = {}", quote(&lsn.to_string()))),
        RecoveryTarget::Xid(xid) => lines.push(format!("recovery_target_xid = {}", quote(&xid.to_string()))),
        RecoveryTarget::Name(name) => lines.push(format!("recovery_target_name = {}", quote(name))),
    }
    lines.join("\n") + "\n"
}

fn prepare_directory(directory: &Path) -> Result<(), RestoreError> {
    let write_error = |error| RestoreError::Write { path: directory.display().to_string(), error };
    match std::fs::read_dir(directory) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(RestoreError::NotEmpty(directory.display().to_string()));
            }
            std::fs::set_permissions(directory, std::fs::Permissions::from_mode(0o700)).map_err(write_error)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(directory).map_err(write_error)
        }
        Err(error) => Err(write_error(error)),
    }
}

fn unpack(client: &S3Client, backup: &BackupManifest, directory: &Path) -> Result<(), RestoreError> {
    let unpack_error = |message: String| RestoreError::Unpack {
        id: backup.id.clone(),
        directory: directory.display().to_string(),
        message,
    };
    let reader = ChunkReader {
        runtime: tokio::runtime::Handle::current(),
        client,
        chunks: backup.chunks.iter(),
        current: std::io::Cursor::new(bytes::Bytes::new()),
    };
    let decoded: Box<dyn Read> = match backup.compression.as_str() {
        "zstd" => Box::new(zstd::stream::read::Decoder::new(reader).map_err(|error| unpack_error(error.to_string()))?),
        "none" => Box::new(reader),
        other => return Err(unpack_error(format!("unknown compression {other:?}"))),
    };
    let mut archive = tar::Archive::new(decoded);
    archive.set_preserve_permissions(true);
    archive.set_overwrite(false);
    archive.unpack(directory).map_err(|error| unpack_error(error_chain(&error)))
}

/// An error with its sources: tar wraps the cause (a damaged chunk, a store failure) in its own.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

fn write_recovery_configuration(
    directory: &Path,
    restore_command: &str,
    target: &RecoveryTarget,
    backup_id: &str,
) -> Result<(), RestoreError> {
    let write_error = |path: &Path, error| RestoreError::Write { path: path.display().to_string(), error };
    // A backup taken from a standby must come up in recovery from the archive, not as a standby.
    let standby_signal = directory.join("standby.signal");
    if standby_signal.exists() {
        std::fs::remove_file(&standby_signal).map_err(|error| write_error(&standby_signal, error))?;
    }
    for wal_directory in ["pg_wal", "pg_wal/archive_status"] {
        let path = directory.join(wal_directory);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&path)
            .map_err(|error| write_error(&path, error))?;
    }
    let auto_conf = directory.join("postgresql.auto.conf");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&auto_conf)
        .map_err(|error| write_error(&auto_conf, error))?;
    file.write_all(format!("\n{}", recovery_settings(restore_command, target, backup_id)).as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|error| write_error(&auto_conf, error))?;
    let signal = directory.join("recovery.signal");
    std::fs::write(&signal, b"").map_err(|error| write_error(&signal, error))
}

/// Settings of the source database that must not outlive a completed recovery: where WAL came
/// from and where replay stopped (a standby cloned with them would stop at the target and promote
/// itself), and how the source archived and streamed (the new database brings its own).
const SOURCE_ONLY_SETTINGS: &[&str] = &[
    "restore_command",
    "recovery_target",
    "recovery_target_time",
    "recovery_target_lsn",
    "recovery_target_xid",
    "recovery_target_name",
    "recovery_target_timeline",
    "recovery_target_action",
    "recovery_target_inclusive",
    "archive_mode",
    "archive_command",
    "archive_timeout",
    "primary_conninfo",
    "primary_slot_name",
];

/// postgresql.auto.conf without [`SOURCE_ONLY_SETTINGS`] and the recovery comment.
pub fn without_recovery_settings(auto_conf: &str) -> String {
    auto_conf
        .lines()
        .filter(|line| {
            let name = line.split('=').next().unwrap_or("").trim();
            !SOURCE_ONLY_SETTINGS.contains(&name) && !line.starts_with("# dbservice-operator: recovery from")
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

/// Restores into `args.pgdata`; returns the backup used.
pub async fn restore(args: RestoreArgs) -> Result<BackupManifest, RestoreError> {
    let target = target_of(&args)?;
    let (client, layout) = args.store.connect()?;
    prepare_directory(&args.pgdata)?;
    let backups = list_backups(&client, &layout).await?;
    let backup = select_backup(&backups, &target, args.backup_id.as_deref())?.clone();
    let directory = args.pgdata.clone();
    let unpacked = {
        let (client, chosen) = (client.clone(), backup.clone());
        tokio::task::spawn_blocking(move || unpack(&client, &chosen, &directory)).await.map_err(|error| {
            RestoreError::Unpack {
                id: backup.id.clone(),
                directory: args.pgdata.display().to_string(),
                message: error.to_string(),
            }
        })?
    };
    unpacked?;
    let binary = match &args.restore_command_binary {
        Some(binary) => binary.clone(),
        None => std::env::current_exe().unwrap_or_else(|_| PathBuf::from("dbservice-operator")),
    };
    let restore_command = restore_command_line(&binary, &args.store);
    write_recovery_configuration(&args.pgdata, &restore_command, &target, &backup.id)?;
    Ok(backup)
}

/// `dbservice-operator restore`: prints the backup used as one JSON line.
pub async fn restore_command(args: RestoreArgs) -> Result<(), RestoreError> {
    let backup = restore(args).await?;
    let mut summary = serde_json::to_value(&backup).expect("a manifest serializes");
    summary.as_object_mut().expect("an object").remove("chunks");
    println!("{summary}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn recovery_settings_per_target() {
        let command = "\"/dbservice/bin/dbservice-operator\" wal-restore %f %p";
        let latest = recovery_settings(command, &RecoveryTarget::Latest, "b1");
        assert!(latest.contains("restore_command = '\"/dbservice/bin/dbservice-operator\" wal-restore %f %p'"));
        assert!(latest.contains("recovery_target_timeline = 'latest'"));
        assert!(!latest.contains("recovery_target_time ="));
        let time = chrono::Utc.with_ymd_and_hms(2026, 12, 1, 0, 30, 5).unwrap();
        assert!(recovery_settings(command, &RecoveryTarget::Time(time), "b1")
            .contains("recovery_target_time = '2026-12-01 00:30:05.000000+00'"));
        assert!(recovery_settings(command, &RecoveryTarget::Lsn("0/3000028".parse().unwrap()), "b1")
            .contains("recovery_target_lsn = '0/3000028'"));
        assert!(recovery_settings(command, &RecoveryTarget::Xid(741), "b1").contains("recovery_target_xid = '741'"));
        assert!(recovery_settings(command, &RecoveryTarget::Name("it's done".into()), "b1")
            .contains("recovery_target_name = 'it''s done'"));
    }

    #[test]
    fn the_restore_command_reads_the_source_store_without_secrets() {
        use clap::Parser;
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            store: crate::store::config::StoreArgs,
        }
        let flags = Flags::try_parse_from([
            "test",
            "--endpoint=http://10.85.0.1:9000",
            "--bucket=backups",
            "--path=prod",
            "--server-name=orders",
            "--access-key-id=AKID",
            "--secret-access-key=very-secret",
            "--ca-file=/dbservice/recovery-ca/ca.crt",
        ])
        .unwrap();
        let line = restore_command_line(Path::new("/dbservice/bin/dbservice-operator"), &flags.store);
        assert!(line
            .starts_with("'/dbservice/bin/dbservice-operator' wal-restore %f %p '--endpoint=http://10.85.0.1:9000'"));
        assert!(line.contains("'--server-name=orders'") && line.contains("'--ca-file=/dbservice/recovery-ca/ca.crt'"));
        assert!(!line.contains("AKID") && !line.contains("very-secret"), "{line}");
        let mut from_files = flags.store.clone();
        from_files.access_key_id_file = Some("/dbservice/recovery-credentials/accessKeyId".into());
        assert!(restore_command_line(Path::new("/bin/x"), &from_files)
            .contains("'--access-key-id-file=/dbservice/recovery-credentials/accessKeyId'"));
    }

    #[test]
    fn a_completed_recovery_forgets_the_source_settings() {
        let auto_conf = "# Do not edit this file manually!\nwal_log_hints = 'on'\narchive_command = 'old'\n\n\
            # dbservice-operator: recovery from base backup b1\nrestore_command = 'x'\n\
            recovery_target_time = '2026-12-01 00:30:05+00'\nrecovery_target_action = 'promote'\nmax_wal_senders = '10'\n";
        let kept = without_recovery_settings(auto_conf);
        assert_eq!(kept, "# Do not edit this file manually!\nwal_log_hints = 'on'\n\nmax_wal_senders = '10'\n");
    }

    #[test]
    fn only_empty_directories_are_restored_into() {
        let directory = tempfile::tempdir().unwrap();
        std::fs::write(directory.path().join("PG_VERSION"), b"15").unwrap();
        assert!(matches!(prepare_directory(directory.path()), Err(RestoreError::NotEmpty(_))));
        let fresh = directory.path().join("new/pgdata");
        prepare_directory(&fresh).unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777, 0o700);
    }
}
