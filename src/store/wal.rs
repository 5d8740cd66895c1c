//! `wal-archive` and `wal-restore`. PostgreSQL retries a failed `archive_command` forever and
//! recycles a segment only after success, so every failure here is an error exit, never a
//! silent success; and as its documentation requires, archiving a file that is already in the
//! archive with the same content succeeds, while a different file under the same name fails.

use crate::store::client::{S3Client, StoreError};
use crate::store::compression::{Compression, CompressionError};
use crate::store::config::{StoreConfigError, WalArchiveArgs, WalRestoreArgs};
use crate::store::keys::{KeyError, KeyLayout, WalFileKind, WalFileName};
use crate::store::signing::sha256_hex;
use bytes::Bytes;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Metadata holding the SHA-256 of the uncompressed file.
pub const SHA256_METADATA: &str = "dbservice-sha256";

/// Metadata naming the compression.
pub const COMPRESSION_METADATA: &str = "dbservice-compression";

/// The largest WAL segment PostgreSQL allows (`--wal-segsize` 1024 MiB).
pub const MAX_WAL_FILE_BYTES: u64 = 1024 * 1024 * 1024;

/// What to do with a file given what the archive already holds under its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveDecision {
    /// Nothing there: upload.
    Upload,
    /// The same content is already archived: succeed without uploading.
    AlreadyArchived,
    /// Different (or unverifiable) content under the same name: fail, never overwrite.
    Conflict {
        /// The stored SHA-256, if the object had one.
        stored_sha256: Option<String>,
    },
}

/// Decides from the stored object's metadata (`None`: no object) and the local file's SHA-256.
pub fn archive_decision(stored: Option<Option<&str>>, local_sha256: &str) -> ArchiveDecision {
    match stored {
        None => ArchiveDecision::Upload,
        Some(Some(stored)) if stored.eq_ignore_ascii_case(local_sha256) => ArchiveDecision::AlreadyArchived,
        Some(stored) => ArchiveDecision::Conflict { stored_sha256: stored.map(str::to_string) },
    }
}

/// Why archiving failed.
#[derive(Debug, thiserror::Error)]
pub enum WalArchiveError {
    /// Bad settings.
    #[error(transparent)]
    Config(#[from] StoreConfigError),
    /// `%f` is not a WAL file name.
    #[error(transparent)]
    Name(#[from] KeyError),
    /// The file cannot be read or is too large.
    #[error("read {path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
    /// Compression failed.
    #[error(transparent)]
    Compress(#[from] CompressionError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The archive belongs to another database system, or its owner could not be checked.
    #[error(transparent)]
    Owner(#[from] crate::store::owner::ArchiveOwnerError),
    /// A different file with this name is already archived.
    #[error(
        "{key} already exists with different content (stored sha256 {stored}, local {local}); refusing to overwrite"
    )]
    Conflict {
        /// Object key.
        key: String,
        /// Stored checksum, or "none".
        stored: String,
        /// Local checksum.
        local: String,
    },
}

/// What `wal-archive` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveOutcome {
    /// Uploaded.
    Uploaded,
    /// Already there with the same content.
    AlreadyArchived,
}

/// Archives one file to `client` (the testable core of `wal-archive`).
pub async fn archive_file(
    client: &S3Client,
    key: &str,
    path: &Path,
    compression: Compression,
) -> Result<ArchiveOutcome, WalArchiveError> {
    let read_error = |message: String| WalArchiveError::Read { path: path.display().to_string(), message };
    let size = tokio::fs::metadata(path).await.map_err(|error| read_error(error.to_string()))?.len();
    if size > MAX_WAL_FILE_BYTES {
        return Err(read_error(format!("{size} bytes is larger than any WAL file ({MAX_WAL_FILE_BYTES})")));
    }
    let content = tokio::fs::read(path).await.map_err(|error| read_error(error.to_string()))?;
    let local_sha256 = sha256_hex(&content);
    let stored = client.head_object(key).await?;
    let stored_sha256 = stored.as_ref().map(|object| object.metadata.get(SHA256_METADATA).map(String::as_str));
    match archive_decision(stored_sha256, &local_sha256) {
        ArchiveDecision::AlreadyArchived => Ok(ArchiveOutcome::AlreadyArchived),
        ArchiveDecision::Conflict { stored_sha256 } => Err(WalArchiveError::Conflict {
            key: key.to_string(),
            stored: stored_sha256.unwrap_or_else(|| "none".to_string()),
            local: local_sha256,
        }),
        ArchiveDecision::Upload => {
            // Compression is CPU-bound: keep it off the runtime's I/O threads.
            let packed = tokio::task::spawn_blocking(move || compression.compress(&content))
                .await
                .map_err(|error| read_error(format!("compression task: {error}")))??;
            let compression_name = format!("{compression:?}").to_lowercase();
            client
                .put_object(
                    key,
                    Bytes::from(packed),
                    &[(SHA256_METADATA, &local_sha256), (COMPRESSION_METADATA, &compression_name)],
                )
                .await?;
            Ok(ArchiveOutcome::Uploaded)
        }
    }
}

/// `dbservice-operator wal-archive %p %f`.
pub async fn archive_command(args: WalArchiveArgs) -> Result<(), WalArchiveError> {
    let name = WalFileName::parse(&args.file_name)?;
    let (client, layout) = args.store.connect()?;
    crate::store::owner::check_owner(&client, &layout, &crate::store::owner::data_directory_of(&args.wal_path)).await?;
    let key = layout.wal_key(&name, args.store.compression);
    let outcome = archive_file(&client, &key, &args.wal_path, args.store.compression).await?;
    if outcome == ArchiveOutcome::AlreadyArchived {
        // PostgreSQL logs the command's stderr: say why nothing was uploaded.
        eprintln!("wal-archive: {} is already archived with the same content", name.as_str());
    }
    Ok(())
}

/// Why restoring failed.
#[derive(Debug, thiserror::Error)]
pub enum WalRestoreError {
    /// Bad settings.
    #[error(transparent)]
    Config(#[from] StoreConfigError),
    /// `%f` is not a WAL file name.
    #[error(transparent)]
    Name(#[from] KeyError),
    /// The archive does not have the file (the normal end of recovery, for PostgreSQL).
    #[error("{key} is not in the archive")]
    NotFound {
        /// Object key.
        key: String,
    },
    /// The archive lacks a segment although it holds later ones of the same timeline: recovery
    /// would stop silently at the gap, short of what was asked for.
    #[error("{missing} is not in the archive although the later {later} is: a gap in the archive, recovery stops here instead of ending early")]
    Gap {
        /// The missing segment.
        missing: String,
        /// A later segment of the same timeline that is archived.
        later: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A standby's: the store did not answer a moment ago (see `--unanswered-mark`), so the file
    /// is taken for not there without asking again.
    #[error("the object store did not answer {seconds_ago}s ago: taken as not in the archive without asking again")]
    Unanswered {
        /// Seconds since it did not answer.
        seconds_ago: u64,
    },
    /// Decompression failed.
    #[error(transparent)]
    Decompress(#[from] CompressionError),
    /// The restored content does not match the checksum stored at archive time.
    #[error("{key}: content sha256 {actual} differs from the archived {expected}")]
    Corrupt {
        /// Object key.
        key: String,
        /// Stored checksum.
        expected: String,
        /// Checksum of what was downloaded.
        actual: String,
    },
    /// The object has no checksum: `wal-archive` always stores one, so this object was written by
    /// something else (another tool, a partial copy) and is never trusted.
    #[error("{key} has no {SHA256_METADATA} checksum: it was not archived by wal-archive and is not restored")]
    Unverified {
        /// Object key.
        key: String,
    },
    /// Writing the file failed.
    #[error("write {path}: {error}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
}

/// Downloads one archived file into `destination` (the testable core of `wal-restore`). The
/// file appears under its name only once complete: it is written beside it and renamed.
pub async fn restore_file(
    client: &S3Client,
    key: &str,
    destination: &Path,
    compression: Compression,
) -> Result<(), WalRestoreError> {
    let object = client
        .get_object(key, MAX_WAL_FILE_BYTES as usize)
        .await?
        .ok_or_else(|| WalRestoreError::NotFound { key: key.to_string() })?;
    let expected = object
        .metadata
        .get(SHA256_METADATA)
        .cloned()
        .ok_or_else(|| WalRestoreError::Unverified { key: key.to_string() })?;
    let content = tokio::task::spawn_blocking(move || compression.decompress(&object.body, MAX_WAL_FILE_BYTES))
        .await
        .map_err(|error| WalRestoreError::Write { path: destination.display().to_string(), error: error.into() })??;
    let actual = sha256_hex(&content);
    if !expected.eq_ignore_ascii_case(&actual) {
        return Err(WalRestoreError::Corrupt { key: key.to_string(), expected, actual });
    }
    let destination = destination.to_path_buf();
    tokio::task::spawn_blocking(move || write_atomically(&destination, &content))
        .await
        .map_err(|error| WalRestoreError::Write { path: String::new(), error: error.into() })?
}

fn write_atomically(destination: &Path, content: &[u8]) -> Result<(), WalRestoreError> {
    let write_error = |path: &Path, error| WalRestoreError::Write { path: path.display().to_string(), error };
    let mut temporary = PathBuf::from(destination);
    temporary.as_mut_os_string().push(".dbservice-partial");
    let mut file = std::fs::File::create(&temporary).map_err(|error| write_error(&temporary, error))?;
    file.write_all(content).and_then(|()| file.sync_all()).map_err(|error| write_error(&temporary, error))?;
    std::fs::rename(&temporary, destination).map_err(|error| write_error(destination, error))
}

/// Exit status of `wal-restore` at a gap: above 125, which PostgreSQL takes for a failed command
/// rather than a missing file, so recovery fails with the message instead of ending at the gap.
pub const GAP_EXIT_STATUS: i32 = 200;

/// The exit status of `wal-restore` after `error` (1 means "not there" to PostgreSQL); a gap
/// stops a recovery, never a standby (see [`WalRestoreArgs::standby`]).
pub fn restore_exit_status(error: &WalRestoreError, standby: bool) -> i32 {
    match error {
        WalRestoreError::Gap { .. } if !standby => GAP_EXIT_STATUS,
        _ => 1,
    }
}

/// The segment name of an archived WAL key (its last component without the compression suffix),
/// if it is a whole segment (not a `.partial`, `.history` or `.backup` file).
fn archived_segment(key: &str) -> Option<String> {
    let file = key.rsplit('/').next()?;
    let file = file.strip_suffix(Compression::Zstd.suffix()).unwrap_or(file);
    let name = WalFileName::parse(file).ok()?;
    (name.kind() == WalFileKind::Segment).then(|| name.as_str().to_string())
}

/// Whether the archive holds a segment of `missing`'s timeline after it: then `missing` is a gap,
/// not the end of the archive. The first keys after it are enough: they sort by segment number.
async fn later_segment(
    client: &S3Client,
    layout: &KeyLayout,
    missing: &WalFileName,
) -> Result<Option<String>, StoreError> {
    let prefix = format!("{}{}/", layout.wal_prefix(), missing.timeline());
    let after = format!("{prefix}{}", missing.as_str());
    let listed = client.list_objects_after(&prefix, &after, 100).await?;
    Ok(listed
        .iter()
        .filter_map(|object| archived_segment(&object.key))
        .find(|segment| segment.as_str() > missing.as_str()))
}

/// `dbservice-operator wal-restore %f %p`.
pub async fn restore_command(args: WalRestoreArgs) -> Result<(), WalRestoreError> {
    let name = WalFileName::parse(&args.file_name)?;
    let mark = args.unanswered_mark.as_deref().filter(|_| args.standby);
    if let Some(ago) = mark.and_then(recently_unanswered) {
        return Err(WalRestoreError::Unanswered { seconds_ago: ago.as_secs() });
    }
    let outcome = restore_or_gap(&args, &name).await;
    if let Some(mark) = mark {
        remember_answer(mark, &outcome);
    }
    outcome
}

/// How long a standby's `wal-restore` takes an unanswered store for "not there" without asking.
pub const UNANSWERED_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// How long ago the store last did not answer, if within [`UNANSWERED_WINDOW`] (the mark's
/// modification time).
pub fn recently_unanswered(mark: &Path) -> Option<std::time::Duration> {
    let modified = std::fs::metadata(mark).ok()?.modified().ok()?;
    let ago = std::time::SystemTime::now().duration_since(modified).unwrap_or_default();
    (ago < UNANSWERED_WINDOW).then_some(ago)
}

/// Writes the mark when the store did not answer (a timeout or a failed connection), removes it
/// when it did (a file, or an answer that it is not there).
pub fn remember_answer(mark: &Path, outcome: &Result<(), WalRestoreError>) {
    let unanswered =
        matches!(outcome, Err(WalRestoreError::Store(StoreError::Timeout { .. } | StoreError::Transport { .. })));
    let _ = if unanswered { std::fs::write(mark, b"") } else { std::fs::remove_file(mark) };
}

async fn restore_or_gap(args: &WalRestoreArgs, name: &WalFileName) -> Result<(), WalRestoreError> {
    let (client, layout) = args.store.connect()?;
    let key = layout.wal_key(name, args.store.compression);
    match restore_file(&client, &key, &args.destination, args.store.compression).await {
        Err(WalRestoreError::NotFound { key }) if name.kind() == WalFileKind::Segment => {
            match later_segment(&client, &layout, name).await? {
                Some(later) => Err(WalRestoreError::Gap { missing: name.as_str().to_string(), later }),
                None => Err(WalRestoreError::NotFound { key }),
            }
        }
        outcome => outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_segments_count_as_later_segments() {
        let segment = "000000010000000000000007";
        assert_eq!(archived_segment(&format!("p/s/wal/00000001/{segment}.zst")).as_deref(), Some(segment));
        assert_eq!(archived_segment(&format!("p/s/wal/00000001/{segment}")).as_deref(), Some(segment));
        assert_eq!(archived_segment(&format!("p/s/wal/00000001/{segment}.partial.zst")), None);
        assert_eq!(archived_segment(&format!("p/s/wal/00000001/{segment}.00000028.backup")), None);
        assert_eq!(archived_segment("p/s/wal/00000002/00000002.history"), None);
    }

    #[test]
    fn a_gap_exits_with_a_status_postgresql_takes_for_a_failure() {
        let gap = WalRestoreError::Gap { missing: "a".into(), later: "b".into() };
        assert!(restore_exit_status(&gap, false) > 125);
        // A standby streams what the archive lacks.
        assert_eq!(restore_exit_status(&gap, true), 1);
        assert_eq!(restore_exit_status(&WalRestoreError::NotFound { key: "k".into() }, false), 1);
    }

    #[test]
    fn a_new_file_is_uploaded() {
        assert_eq!(archive_decision(None, "aa"), ArchiveDecision::Upload);
    }

    #[test]
    fn the_same_file_twice_succeeds_without_upload() {
        assert_eq!(archive_decision(Some(Some("ABCD")), "abcd"), ArchiveDecision::AlreadyArchived);
    }

    #[test]
    fn a_different_file_with_the_same_name_fails() {
        assert_eq!(
            archive_decision(Some(Some("abcd")), "ef01"),
            ArchiveDecision::Conflict { stored_sha256: Some("abcd".into()) }
        );
    }

    #[test]
    fn an_object_without_our_checksum_is_never_overwritten() {
        assert_eq!(archive_decision(Some(None), "ef01"), ArchiveDecision::Conflict { stored_sha256: None });
    }

    #[test]
    fn restored_files_appear_complete_or_not_at_all() {
        let directory = tempfile::tempdir().unwrap();
        let destination = directory.path().join("RECOVERYXLOG");
        write_atomically(&destination, b"segment").unwrap();
        assert_eq!(std::fs::read(&destination).unwrap(), b"segment");
        let names: Vec<_> =
            std::fs::read_dir(directory.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("RECOVERYXLOG")]);
    }

    #[test]
    fn the_unanswered_mark_is_written_on_no_answer_and_removed_on_an_answer() {
        let directory = tempfile::tempdir().unwrap();
        let mark = directory.path().join("unanswered");
        let timeout =
            Err(WalRestoreError::Store(StoreError::Timeout { operation: "GetObject", key: "k".into(), seconds: 3 }));
        remember_answer(&mark, &timeout);
        assert!(recently_unanswered(&mark).is_some_and(|ago| ago < UNANSWERED_WINDOW));
        remember_answer(&mark, &Err(WalRestoreError::NotFound { key: "k".into() }));
        assert!(!mark.exists() && recently_unanswered(&mark).is_none(), "an answer, even 'not there', clears it");
        let refused = Err(WalRestoreError::Store(StoreError::Transport {
            operation: "GetObject",
            key: "k".into(),
            message: "connection refused".into(),
        }));
        remember_answer(&mark, &refused);
        assert!(mark.exists());
        remember_answer(&mark, &Ok(()));
        assert!(!mark.exists());
    }
}
