//! Object key layout in the bucket:
//!
//! ```text
//! <path>/<server>/wal/<timeline>/<wal file name>[.zst]   segments, .history, .backup, .partial
//! <path>/<server>/base/<backup id>/data.tar[.zst].<NNNNN> base backup: the pg_basebackup -Ft stream, in chunks
//! <path>/<server>/base/<backup id>/backup.json           base backup description, written last
//! ```
//!
//! `<timeline>` is the 8 hex digits every WAL file name starts with, so that listing one
//! timeline (retention, recovery across a failover) is one prefix.

use crate::store::compression::Compression;

/// Why a name is not accepted in an object key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// Not one of the names PostgreSQL gives WAL files; refusing it also refuses path traversal.
    #[error("{0:?} is not a WAL file name (24 hex digits, optionally .partial, or a .history or .backup file)")]
    NotWalFileName(String),
    /// A prefix or server name with characters outside `[A-Za-z0-9._-]`, or an empty segment.
    #[error("{what} {value:?} must be segments of [A-Za-z0-9._-] separated by '/'")]
    BadComponent {
        /// Which setting.
        what: &'static str,
        /// The refused value.
        value: String,
    },
}

/// The kind of a WAL file, from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalFileKind {
    /// `000000010000000000000003`
    Segment,
    /// `000000010000000000000003.partial` (the last segment of an old timeline at promotion)
    Partial,
    /// `00000002.history`
    History,
    /// `000000010000000000000003.00000028.backup`
    BackupLabel,
}

/// A validated WAL file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalFileName {
    name: String,
    kind: WalFileKind,
}

fn is_hex(value: &str, length: usize) -> bool {
    value.len() == length && value.bytes().all(|byte| byte.is_ascii_hexdigit())
}

impl WalFileName {
    /// Accepts exactly the file names PostgreSQL archives.
    pub fn parse(name: &str) -> Result<WalFileName, KeyError> {
        let kind = match name.split('.').collect::<Vec<_>>().as_slice() {
            [segment] if is_hex(segment, 24) => WalFileKind::Segment,
            [segment, "partial"] if is_hex(segment, 24) => WalFileKind::Partial,
            [timeline, "history"] if is_hex(timeline, 8) => WalFileKind::History,
            [segment, offset, "backup"] if is_hex(segment, 24) && is_hex(offset, 8) => WalFileKind::BackupLabel,
            _ => return Err(KeyError::NotWalFileName(name.to_string())),
        };
        Ok(WalFileName { name: name.to_string(), kind })
    }

    /// The file name as PostgreSQL knows it.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// What kind of file this is.
    pub fn kind(&self) -> WalFileKind {
        self.kind
    }

    /// The timeline, as the 8 hex digits the name starts with.
    pub fn timeline(&self) -> &str {
        &self.name[..8]
    }
}

/// Where one server's backups live: `<path>/<server>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    root: String,
}

fn check_component(what: &'static str, value: &str, allow_empty: bool) -> Result<(), KeyError> {
    let bad = || KeyError::BadComponent { what, value: value.to_string() };
    if value.is_empty() {
        return if allow_empty { Ok(()) } else { Err(bad()) };
    }
    let segment_ok = |segment: &str| {
        !segment.is_empty()
            && segment != "."
            && segment != ".."
            && segment.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"._-".contains(&byte))
    };
    if value.split('/').all(segment_ok) {
        Ok(())
    } else {
        Err(bad())
    }
}

impl KeyLayout {
    /// `path` may be empty (the bucket root); leading and trailing slashes are ignored.
    pub fn new(path: &str, server: &str) -> Result<KeyLayout, KeyError> {
        let path = path.trim_matches('/');
        check_component("path", path, true)?;
        check_component("server name", server, false)?;
        if server.contains('/') {
            return Err(KeyError::BadComponent { what: "server name", value: server.to_string() });
        }
        let root = if path.is_empty() { format!("{server}/") } else { format!("{path}/{server}/") };
        Ok(KeyLayout { root })
    }

    /// `<path>/<server>/`, the prefix of everything this server stores.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// `<path>/<server>/wal/`
    pub fn wal_prefix(&self) -> String {
        format!("{}wal/", self.root)
    }

    /// The key of one WAL file.
    pub fn wal_key(&self, file: &WalFileName, compression: Compression) -> String {
        format!("{}wal/{}/{}{}", self.root, file.timeline(), file.as_str(), compression.suffix())
    }

    /// `<path>/<server>/base/<id>/`
    pub fn base_backup_prefix(&self, backup_id: &str) -> Result<String, KeyError> {
        check_component("backup id", backup_id, false)?;
        if backup_id.contains('/') {
            return Err(KeyError::BadComponent { what: "backup id", value: backup_id.to_string() });
        }
        Ok(format!("{}base/{backup_id}/", self.root))
    }

    /// `<path>/<server>/base/`
    pub fn base_prefix(&self) -> String {
        format!("{}base/", self.root)
    }

    /// `<path>/<server>/base/<id>/backup.json`
    pub fn backup_manifest_key(&self, backup_id: &str) -> Result<String, KeyError> {
        Ok(format!("{}{}", self.base_backup_prefix(backup_id)?, crate::store::manifest::MANIFEST_FILE))
    }

    /// `<path>/<server>/base/<id>/data.tar[.zst].<index>`: the index has five digits so that
    /// keys sort in stream order (100 000 chunks of 64 MiB are 6 TiB).
    pub fn backup_chunk_key(&self, backup_id: &str, index: u32, compression: Compression) -> Result<String, KeyError> {
        Ok(format!("{}data.tar{}.{index:05}", self.base_backup_prefix(backup_id)?, compression.suffix()))
    }

    /// The backup id of a key under [`KeyLayout::base_prefix`].
    pub fn backup_id_of<'a>(&self, key: &'a str) -> Option<&'a str> {
        key.strip_prefix(&self.root)?.strip_prefix("base/")?.split('/').next().filter(|id| !id.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wal_keys_are_grouped_by_timeline_and_carry_the_compression() {
        let layout = KeyLayout::new("/backups/prod/", "orders").unwrap();
        let segment = WalFileName::parse("00000002000000000000000A").unwrap();
        assert_eq!(
            layout.wal_key(&segment, Compression::Zstd),
            "backups/prod/orders/wal/00000002/00000002000000000000000A.zst"
        );
        assert_eq!(
            layout.wal_key(&segment, Compression::None),
            "backups/prod/orders/wal/00000002/00000002000000000000000A"
        );
        let history = WalFileName::parse("00000003.history").unwrap();
        assert_eq!(
            layout.wal_key(&history, Compression::Zstd),
            "backups/prod/orders/wal/00000003/00000003.history.zst"
        );
        assert_eq!(layout.wal_prefix(), "backups/prod/orders/wal/");
        assert_eq!(layout.base_backup_prefix("20261130T221500").unwrap(), "backups/prod/orders/base/20261130T221500/");
        assert_eq!(layout.base_prefix(), "backups/prod/orders/base/");
        assert_eq!(
            layout.backup_manifest_key("20261130T221500Z").unwrap(),
            "backups/prod/orders/base/20261130T221500Z/backup.json"
        );
        assert_eq!(
            layout.backup_chunk_key("20261130T221500Z", 7, Compression::Zstd).unwrap(),
            "backups/prod/orders/base/20261130T221500Z/data.tar.zst.00007"
        );
        assert_eq!(
            layout.backup_id_of("backups/prod/orders/base/20261130T221500Z/backup.json"),
            Some("20261130T221500Z")
        );
        assert_eq!(layout.backup_id_of("backups/prod/orders/wal/00000001/x"), None);
        assert!(layout.backup_manifest_key("../other").is_err());
    }

    #[test]
    fn an_empty_path_means_the_bucket_root() {
        assert_eq!(KeyLayout::new("", "orders").unwrap().root(), "orders/");
    }

    #[test]
    fn every_wal_file_kind_is_recognised() {
        let kind = |name| WalFileName::parse(name).map(|file| file.kind());
        assert_eq!(kind("000000010000000000000003"), Ok(WalFileKind::Segment));
        assert_eq!(kind("000000010000000000000003.partial"), Ok(WalFileKind::Partial));
        assert_eq!(kind("00000002.history"), Ok(WalFileKind::History));
        assert_eq!(kind("000000010000000000000003.00000028.backup"), Ok(WalFileKind::BackupLabel));
    }

    #[test]
    fn names_that_are_not_wal_files_are_refused() {
        for name in [
            "",
            "../../etc/passwd",
            "00000001000000000000003",
            "0000000100000000000000GG",
            "x.history",
            "RECOVERYHISTORY",
        ] {
            assert!(WalFileName::parse(name).is_err(), "{name} accepted");
        }
    }

    #[test]
    fn prefixes_cannot_escape_or_inject() {
        for (path, server) in [("a/../b", "s"), ("a//b", "s"), ("a b", "s"), ("ok", ""), ("ok", "a/b"), ("ok", "..")] {
            assert!(KeyLayout::new(path, server).is_err(), "{path:?} {server:?} accepted");
        }
        assert!(KeyLayout::new("ok", "s").unwrap().base_backup_prefix("../x").is_err());
    }
}
