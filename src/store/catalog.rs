//! What the store holds for one server: its completed base backups (their `backup.json`) and
//! its archived WAL, and from both the window a recovery can reach.

use crate::store::client::{S3Client, StoreError};
use crate::store::keys::KeyLayout;
use crate::store::manifest::{BackupManifest, MANIFEST_FILE};
use crate::store::xml::ListedObject;
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
    let bounds = CatalogBounds { objects: usize::MAX, manifest_bytes: MANIFEST_LIMIT, keep_chunks: true };
    Ok(list_backups_bounded(client, layout, &bounds).await?.0)
}

/// How much of a store a bounded read looks at.
#[derive(Debug, Clone, Copy)]
pub struct CatalogBounds {
    /// Most objects listed under one prefix.
    pub objects: usize,
    /// Largest manifest read.
    pub manifest_bytes: usize,
    /// Keep the chunk lists (a restore needs them; a check of the window does not).
    pub keep_chunks: bool,
}

/// The completed base backups among the first `bounds.objects` objects of the base prefix,
/// oldest end first, and whether the listing was cut short.
pub async fn list_backups_bounded(
    client: &S3Client,
    layout: &KeyLayout,
    bounds: &CatalogBounds,
) -> Result<(Vec<BackupManifest>, bool), CatalogError> {
    let mut backups = Vec::new();
    let (objects, truncated) = client.list_objects_bounded(&layout.base_prefix(), bounds.objects).await?;
    for object in objects {
        if !object.key.ends_with(&format!("/{MANIFEST_FILE}")) {
            continue;
        }
        // Deleted between listing and reading (retention): not a backup any more.
        let Some(found) = client.get_object(&object.key, bounds.manifest_bytes).await? else { continue };
        let mut manifest: BackupManifest = serde_json::from_slice(&found.body)
            .map_err(|error| CatalogError::Manifest { key: object.key.clone(), error })?;
        if !bounds.keep_chunks {
            manifest.chunks = Vec::new();
        }
        backups.push(manifest);
    }
    backups.sort_by_key(|backup| (backup.end_time, backup.id.clone()));
    Ok((backups, truncated))
}

/// Every archived WAL object of the server, in key order.
pub async fn list_wal(client: &S3Client, layout: &KeyLayout) -> Result<Vec<ListedObject>, CatalogError> {
    Ok(client.list_objects(&layout.wal_prefix()).await?)
}

/// The span of time a recovery can reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
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
