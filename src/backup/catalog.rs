//! What the store holds for one server: its completed base backups (their `backup.json`) and
//! its archived WAL, and from both the window a recovery can reach.

use crate::backup::client::{S3Client, StoreError};
use crate::backup::keys::KeyLayout;
use crate::backup::manifest::{BackupManifest, MANIFEST_FILE};
use crate::backup::xml::ListedObject;
use chrono::{DateTime, Utc};

/// A manifest lists every chunk: 100 000 chunks take about 15 MB.
const MANIFEST_LIMIT: usize = 64 * 1024 * 1024;

/// Why the store could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A manifest is not valid JSON of the expected shape.
    #[error("{key}: {error}")]
    Manifest {
        /// Object key.
        key: String,
        /// Parse error.
        error: serde_json::Error,
    },
}

/// Every completed base backup of the server, oldest end first.
pub async fn list_backups(client: &S3Client, layout: &KeyLayout) -> Result<Vec<BackupManifest>, CatalogError> {
    let mut backups = Vec::new();
    for object in client.list_objects(&layout.base_prefix()).await? {
        if !object.key.ends_with(&format!("/{MANIFEST_FILE}")) {
            continue;
        }
        // Deleted between listing and reading (retention): not a backup any more.
        let Some(found) = client.get_object(&object.key, MANIFEST_LIMIT).await? else { continue };
        let manifest: BackupManifest = serde_json::from_slice(&found.body)
            .map_err(|error| CatalogError::Manifest { key: object.key.clone(), error })?;
        backups.push(manifest);
    }
    backups.sort_by_key(|backup| (backup.end_time, backup.id.clone()));
    Ok(backups)
}

/// Every archived WAL object of the server, in key order.
pub async fn list_wal(client: &S3Client, layout: &KeyLayout) -> Result<Vec<ListedObject>, CatalogError> {
    Ok(client.list_objects(&layout.wal_prefix()).await?)
}

/// The span of time a recovery can reach.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoverableWindow {
    /// End of the oldest backup: the earliest consistent point.
    pub first_recoverability_point: Option<DateTime<Utc>>,
    /// Upload time of the newest archived WAL file: nothing later can be recovered.
    pub last_archived_wal_time: Option<DateTime<Utc>>,
}

/// The window given the backups and the WAL listing.
pub fn recoverable_window(backups: &[BackupManifest], wal: &[ListedObject]) -> RecoverableWindow {
    RecoverableWindow {
        first_recoverability_point: backups.iter().map(|backup| backup.end_time).min(),
        last_archived_wal_time: wal
            .iter()
            .filter_map(|object| DateTime::parse_from_rfc3339(&object.last_modified).ok())
            .map(|time| time.with_timezone(&Utc))
            .max(),
    }
}
