//! The pooler agent's credentials (issue 37): PgBouncer's admin password, the pooler role's
//! password and the control token, read from the files of Secret NAME-pooler the pod mounts,
//! never from the environment (which `/proc/PID/environ` shows to every process of the user and
//! `kubectl get pod -o yaml` names). Read once at start: Secret NAME-pooler is created once and
//! never overwritten, so there is nothing to reload.

use std::path::{Path, PathBuf};

/// Reading a credential file failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadCredentialsError {
    /// The file could not be read.
    #[error("read credential file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is empty (or holds only a line end).
    #[error("read credential file {0}: it is empty")]
    Empty(PathBuf),
}

/// What the agent logs in and authenticates with.
#[derive(Clone)]
pub struct AgentCredentials {
    /// PgBouncer's admin console password.
    pub admin_password: String,
    /// The pooler role's password.
    pub auth_password: String,
    /// The bearer token POST /pause needs.
    pub control_token: String,
}

// Never prints a value.
impl std::fmt::Debug for AgentCredentials {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("AgentCredentials").finish_non_exhaustive()
    }
}

/// One credential: the file's text without a trailing line end (an editor's, or `echo`'s).
pub fn read_credential(path: &Path) -> Result<String, ReadCredentialsError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ReadCredentialsError::Read { path: path.to_path_buf(), source })?;
    let value = text.trim_end_matches(['\n', '\r']);
    if value.is_empty() {
        return Err(ReadCredentialsError::Empty(path.to_path_buf()));
    }
    Ok(value.to_string())
}

impl AgentCredentials {
    /// Reads the three files.
    pub fn read(
        admin_password: &Path,
        auth_password: &Path,
        control_token: &Path,
    ) -> Result<Self, ReadCredentialsError> {
        Ok(Self {
            admin_password: read_credential(admin_password)?,
            auth_password: read_credential(auth_password)?,
            control_token: read_credential(control_token)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_the_files_text_without_its_line_end_and_an_empty_file_is_refused() {
        let directory = tempfile::tempdir().unwrap();
        let path = |name: &str| directory.path().join(name);
        std::fs::write(path("admin"), "a:b\n").unwrap();
        std::fs::write(path("auth"), "c d").unwrap();
        std::fs::write(path("token"), "\n").unwrap();
        assert_eq!(read_credential(&path("admin")).unwrap(), "a:b");
        assert_eq!(read_credential(&path("auth")).unwrap(), "c d");
        let empty = AgentCredentials::read(&path("admin"), &path("auth"), &path("token")).unwrap_err();
        assert!(empty.to_string().contains("is empty"), "{empty}");
        let missing = read_credential(&path("absent")).unwrap_err();
        assert!(missing.to_string().starts_with("read credential file"), "{missing}");
        std::fs::write(path("token"), "t").unwrap();
        let read = AgentCredentials::read(&path("admin"), &path("auth"), &path("token")).unwrap();
        assert_eq!(read.control_token, "t");
        assert!(!format!("{read:?}").contains("a:b"), "Debug never shows a value");
    }
}
