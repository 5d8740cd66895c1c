//! `backup.json`: what a base backup holds and what recovering from it needs. It is written
//! last, after every chunk and the backup's last WAL segment are in the store, so a backup
//! exists for readers exactly when it is usable.

use crate::lsn::Lsn;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Name of the description object in a backup's directory.
pub const MANIFEST_FILE: &str = "backup.json";

/// One stored piece of the compressed tar stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupChunk {
    /// Object key.
    pub key: String,
    /// Stored (compressed) size in bytes.
    pub bytes: u64,
    /// SHA-256 of the stored bytes, hexadecimal.
    pub sha256: String,
}

/// Description of one completed base backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupManifest {
    /// Backup id, also its directory name.
    pub id: String,
    /// Server name the backup belongs to.
    pub server_name: String,
    /// LSN where WAL replay starts (the backup's checkpoint redo point).
    pub begin_lsn: Lsn,
    /// LSN from which the restored data directory is consistent.
    pub end_lsn: Lsn,
    /// First WAL segment recovery needs.
    pub begin_wal: String,
    /// Last WAL segment recovery needs to become consistent.
    pub end_wal: String,
    /// When pg_basebackup started.
    pub start_time: DateTime<Utc>,
    /// When the backup was complete (its last WAL archived); the earliest time it can recover to.
    pub end_time: DateTime<Utc>,
    /// Timeline the backup was taken on.
    pub timeline: u32,
    /// PostgreSQL major version (15 for 15.18).
    pub postgres_major_version: u32,
    /// `pg_control_system().system_identifier`: restores refuse WAL of another cluster.
    pub system_identifier: String,
    /// Whether it was taken from a standby.
    pub from_standby: bool,
    /// Size of the uncompressed tar stream.
    pub size_bytes: u64,
    /// Size stored, all chunks together.
    pub stored_bytes: u64,
    /// `zstd` or `none`.
    pub compression: String,
    /// The compressed tar stream, in order.
    pub chunks: Vec<BackupChunk>,
}

/// Extracts `(begin LSN, timeline)` from a `backup_label` file.
pub fn parse_backup_label(label: &str) -> Option<(Lsn, u32)> {
    let field = |name: &str| {
        label.lines().find_map(|line| line.strip_prefix(name).map(|rest| rest.trim_start_matches(':').trim()))
    };
    let begin = field("START WAL LOCATION")?.split_whitespace().next()?.parse().ok()?;
    let timeline = field("START TIMELINE")?.parse().ok()?;
    Some((begin, timeline))
}

/// Extracts `(end LSN, timeline at the end)` from the tail of a `backup_manifest` (its last
/// `WAL-Ranges` entry); the tail is enough because the ranges close the document.
pub fn parse_wal_ranges_end(manifest_tail: &str) -> Option<(Lsn, u32)> {
    let ranges = &manifest_tail[manifest_tail.rfind("\"WAL-Ranges\"")?..];
    let array_start = ranges.find('[')?;
    let array_end = ranges.find(']')?;
    let entries: Vec<serde_json::Value> = serde_json::from_str(&ranges[array_start..=array_end]).ok()?;
    let last = entries.last()?;
    let end = last.get("End-LSN")?.as_str()?.parse().ok()?;
    let timeline = u32::try_from(last.get("Timeline")?.as_u64()?).ok()?;
    Some((end, timeline))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_label_fields() {
        let label = "START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nCHECKPOINT LOCATION: 0/2000060\n\
                     BACKUP METHOD: streamed\nBACKUP FROM: standby\nSTART TIME: 2026-12-01 00:25:00 UTC\n\
                     LABEL: pg_basebackup base backup\nSTART TIMELINE: 3\n";
        assert_eq!(parse_backup_label(label), Some(("0/2000028".parse().unwrap(), 3)));
        assert_eq!(parse_backup_label("START TIMELINE: 1\n"), None);
    }

    #[test]
    fn wal_range_end_from_a_manifest_tail() {
        let tail = "0\" },\n{ \"Path\": \"global/pg_control\", \"Size\": 8192 }\n],\n\"WAL-Ranges\": [\n\
                    { \"Timeline\": 1, \"Start-LSN\": \"0/2000028\", \"End-LSN\": \"0/3000000\" },\n\
                    { \"Timeline\": 2, \"Start-LSN\": \"0/3000000\", \"End-LSN\": \"0/3000100\" }\n],\n\
                    \"Manifest-Checksum\": \"abc\"}\n";
        assert_eq!(parse_wal_ranges_end(tail), Some(("0/3000100".parse().unwrap(), 2)));
        assert_eq!(parse_wal_ranges_end("{}"), None);
    }
}
