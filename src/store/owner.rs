//! Which database system an archive belongs to. A DatabaseService re-created under the same name
//! (or another database given the same `path` and `serverName`) would otherwise archive into a
//! place that holds another system's WAL: its segments' names collide with the old ones (archiving
//! then fails forever on a "different content" conflict), and a backup could be cut from one
//! system's base and another's WAL. So the first archive of a server claims its place with the
//! system identifier of its data directory (`<path>/<server>/system-identifier`), and every later
//! archive checks that claim; a claim by another system is a clear error, never a silent mix.
//!
//! The check costs one GET per server start, not per segment: the verified claim is remembered
//! in the data directory (`dbservice-archive-owner`), which a clone or a restore brings along only
//! for the same system.

use crate::store::client::{S3Client, StoreError};
use crate::store::keys::KeyLayout;
use bytes::Bytes;
use std::path::{Path, PathBuf};

/// Name of the claim object in the server's place.
pub const OWNER_OBJECT: &str = "system-identifier";
/// File in the data directory remembering a verified claim: `<root> <system identifier>`.
pub const VERIFIED_FILE: &str = "dbservice-archive-owner";

/// The archive's owner could not be checked, or it is another system.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveOwnerError {
    /// pg_control could not be read.
    #[error("read the system identifier from {path}: {message}")]
    Control {
        /// pg_control's path.
        path: String,
        /// Why.
        message: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another database system archives there.
    #[error(
        "the archive {root} belongs to database system {owner}, this server is system {local}: a re-created or \
         different database never archives into another one's WAL; give spec.backup.objectStore a new path or \
         serverName (or remove the old archive if it is no longer needed)"
    )]
    Foreign {
        /// The server's place in the store.
        root: String,
        /// The system identifier that claimed it.
        owner: String,
        /// This data directory's.
        local: u64,
    },
}

/// The data directory a WAL file path (`%p`, `pg_wal/<name>` relative to it, or absolute) is in.
pub fn data_directory_of(wal_path: &Path) -> PathBuf {
    match wal_path.parent().and_then(Path::parent) {
        Some(directory) if !directory.as_os_str().is_empty() => directory.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The system identifier of the data directory `pgdata`: the first field of `global/pg_control`
/// (a native-endian 64-bit integer, as PostgreSQL writes it).
pub fn system_identifier(pgdata: &Path) -> Result<u64, ArchiveOwnerError> {
    let path = pgdata.join("global/pg_control");
    let error = |message: String| ArchiveOwnerError::Control { path: path.display().to_string(), message };
    let bytes = std::fs::read(&path).map_err(|io| error(io.to_string()))?;
    let first: [u8; 8] =
        bytes.get(..8).and_then(|slice| slice.try_into().ok()).ok_or_else(|| error("too short".into()))?;
    Ok(u64::from_ne_bytes(first))
}

/// Checks that the place of `layout` belongs to the system of `pgdata`, claiming it if nobody has.
pub async fn check_owner(client: &S3Client, layout: &KeyLayout, pgdata: &Path) -> Result<(), ArchiveOwnerError> {
    let local = system_identifier(pgdata)?;
    let remembered = format!("{} {local}", layout.root());
    let verified = pgdata.join(VERIFIED_FILE);
    if std::fs::read_to_string(&verified).is_ok_and(|text| text.trim() == remembered) {
        return Ok(());
    }
    let key = format!("{}{OWNER_OBJECT}", layout.root());
    let foreign = |owner: String| ArchiveOwnerError::Foreign { root: layout.root().to_string(), owner, local };
    match client.get_object(&key, 64).await? {
        Some(object) => {
            let owner = String::from_utf8_lossy(&object.body).trim().to_string();
            if owner != local.to_string() {
                return Err(foreign(owner));
            }
        }
        None => {
            client.put_object(&key, Bytes::from(local.to_string()), &[]).await?;
            // Two systems claiming at once: the one whose write lost finds out here.
            let owner = client
                .get_object(&key, 64)
                .await?
                .map(|object| String::from_utf8_lossy(&object.body).trim().to_string());
            if owner.as_deref() != Some(local.to_string().as_str()) {
                return Err(foreign(owner.unwrap_or_default()));
            }
        }
    }
    // Remembering is an optimisation: a failure costs one GET next time.
    let _ = std::fs::write(&verified, remembered);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_directory_is_two_levels_above_the_wal_file() {
        assert_eq!(data_directory_of(Path::new("pg_wal/000000010000000000000001")), PathBuf::from("."));
        assert_eq!(
            data_directory_of(Path::new("/data/pgdata/pg_wal/000000010000000000000001")),
            PathBuf::from("/data/pgdata")
        );
        assert_eq!(data_directory_of(Path::new("000000010000000000000001")), PathBuf::from("."));
    }

    #[test]
    fn the_system_identifier_is_the_first_field_of_pg_control() {
        let directory = tempfile::tempdir().unwrap();
        std::fs::create_dir(directory.path().join("global")).unwrap();
        let mut control = 7_337_000_000_000_000_123u64.to_ne_bytes().to_vec();
        control.extend([0u8; 100]);
        std::fs::write(directory.path().join("global/pg_control"), control).unwrap();
        assert_eq!(system_identifier(directory.path()).unwrap(), 7_337_000_000_000_000_123);
        let missing = system_identifier(&directory.path().join("nowhere")).unwrap_err();
        assert!(missing.to_string().contains("global/pg_control"), "{missing}");
    }
}
