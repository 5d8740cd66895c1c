//! A libpq password file (`PGPASSFILE`) for one run of a PostgreSQL tool (pg_basebackup,
//! pg_rewind): the password reaches the tool as a file only its owner can read, in a directory
//! of its own removed afterwards, never in its environment (which `/proc/PID/environ` shows to
//! every process of the same user) or its arguments.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A password file; removed with its directory when dropped.
pub struct PasswordFile {
    _directory: tempfile::TempDir,
    path: PathBuf,
}

/// Escapes `:` and `\` as the password file format wants.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace(':', "\\:")
}

impl PasswordFile {
    /// A file with `password` for `user` on every host, port and database, owned by `owner`
    /// (uid, gid) when given (a tool run as another user than this process), else by this process.
    pub fn new(user: &str, password: &str, owner: Option<(u32, u32)>) -> std::io::Result<Self> {
        let directory = tempfile::Builder::new().prefix("dbservice-pgpass-").tempdir()?;
        std::fs::set_permissions(directory.path(), std::fs::Permissions::from_mode(0o700))?;
        let path = directory.path().join("pgpass");
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
        file.write_all(format!("*:*:*:{}:{}\n", escape(user), escape(password)).as_bytes())?;
        file.sync_all()?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(directory.path(), Some(uid), Some(gid))?;
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
        }
        Ok(Self { _directory: directory, path })
    }

    /// Where it is (the tool's `PGPASSFILE`).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_the_owners_only_escapes_the_separators_and_goes_when_dropped() {
        let file = PasswordFile::new("replicator", r"pa:ss\word", None).unwrap();
        let text = std::fs::read_to_string(file.path()).unwrap();
        assert_eq!(text, "*:*:*:replicator:pa\\:ss\\\\word\n");
        let mode = std::fs::metadata(file.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let path = file.path().to_path_buf();
        drop(file);
        assert!(!path.exists());
    }
}
