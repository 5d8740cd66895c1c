//! The user's server configuration (`spec.postgresql`, issue 23) in the data directory:
//! the parameters in their own file, included at the end of postgresql.conf (so they override
//! the image's defaults, while postgresql.auto.conf, where the operator's own settings live, and
//! the command line still override them), and the extra pg_hba rules in a block of their own
//! after the operator's blocks (which the user's rules therefore cannot loosen).
//!
//! Both are written before every start (a clone or a rewind copies the source's files) and when
//! the spec changes, followed by a reload; settings the reload cannot apply are reported as
//! pending a restart, which the rollout of the StatefulSet brings (the operator rolls the pods
//! when such a setting changes).

use crate::api::postgresql::{fingerprint, parameters_file};
use crate::instance::hba::{joined, without_block};
use crate::instance::postgres::{Postgres, PostgresError};
use crate::instance::{InstanceConfig, ServerConfiguration};
use std::path::Path;

/// The file holding `spec.postgresql.parameters`, in the data directory.
pub const PARAMETERS_FILE: &str = "dbservice-parameters.conf";
/// The line of postgresql.conf that reads it.
pub const INCLUDE_LINE: &str = "include_if_exists = 'dbservice-parameters.conf'";
/// First line of the block of the user's pg_hba rules.
pub const HBA_BEGIN: &str = "# BEGIN spec.postgresql.pgHba";
/// Last line of it.
pub const HBA_END: &str = "# END spec.postgresql.pgHba";

/// The configuration-file errors of one operation.
#[derive(Debug, thiserror::Error)]
pub enum ConfigureError {
    /// A file of the data directory could not be written.
    #[error("writing {path}: {source}")]
    Files {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The server did not reload or answer.
    #[error(transparent)]
    Server(#[from] PostgresError),
}

/// `hba` with the user's rules in their block, right after the operator's own blocks (which
/// open the file) and before every other rule (the image's catch-all among them).
pub fn with_user_rules(hba: &str, rules: &[String]) -> String {
    let mut kept = without_block(hba, HBA_BEGIN, HBA_END);
    // The operator's blocks are the leading lines between "# BEGIN dbservice-operator" and
    // "# END dbservice-operator" markers.
    let mut position = 0;
    while kept.get(position).is_some_and(|line| line.starts_with("# BEGIN dbservice-operator")) {
        match kept[position..].iter().position(|line| line.starts_with("# END dbservice-operator")) {
            Some(end) => position += end + 1,
            None => break,
        }
    }
    if !rules.is_empty() {
        let block: Vec<&str> =
            std::iter::once(HBA_BEGIN).chain(rules.iter().map(String::as_str)).chain([HBA_END]).collect();
        kept.splice(position..position, block);
    }
    joined(&kept)
}

/// `conf` (postgresql.conf) ending with the line that includes the parameters file.
pub fn with_include(conf: &str) -> Option<String> {
    if conf.lines().any(|line| line.trim() == INCLUDE_LINE) {
        return None;
    }
    let mut text = conf.to_string();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("# The operator's file of spec.postgresql.parameters (keep this line last).\n");
    text.push_str(INCLUDE_LINE);
    text.push('\n');
    Some(text)
}

fn write_file(config: &InstanceConfig, path: &Path, text: &str) -> Result<(), ConfigureError> {
    let failed = |source| ConfigureError::Files { path: path.to_path_buf(), source };
    if std::fs::read_to_string(path).is_ok_and(|existing| existing == text) {
        return Ok(());
    }
    let temporary = path.with_extension("dbservice.tmp");
    std::fs::write(&temporary, text).map_err(failed)?;
    std::fs::set_permissions(&temporary, std::os::unix::fs::PermissionsExt::from_mode(0o600)).map_err(failed)?;
    config.chown(&[&temporary]);
    std::fs::rename(&temporary, path).map_err(failed)
}

/// Writes `wanted` into the data directory (parameters file, include line, pg_hba block); a
/// data directory without postgresql.conf (not made yet) is left alone.
pub fn write(config: &InstanceConfig, wanted: &ServerConfiguration) -> Result<(), ConfigureError> {
    let conf_path = config.pgdata.join("postgresql.conf");
    let Ok(conf) = std::fs::read_to_string(&conf_path) else { return Ok(()) };
    write_file(config, &config.pgdata.join(PARAMETERS_FILE), &parameters_file(&wanted.parameters))?;
    if let Some(text) = with_include(&conf) {
        write_file(config, &conf_path, &text)?;
    }
    crate::instance::hba::rewrite(config, |hba| with_user_rules(hba, &wanted.hba_rules))
        .map_err(|source| ConfigureError::Files { path: config.pgdata.join("pg_hba.conf"), source })
}

/// Keeps the running server on the configuration the operator last asked for.
#[derive(Debug, Default)]
pub struct ConfigurationKeeper {
    wanted: Option<ServerConfiguration>,
    applied: Option<ServerConfiguration>,
    /// `pg_settings.pending_restart` after the last start or reload (None: to be read).
    pending_restart: Option<Vec<String>>,
    /// When the server was last told to reload: its sessions take the new files a moment later.
    reloaded_at: Option<std::time::Instant>,
}

/// How long after a reload `pending_restart` is read (the signal reaches the agent's session
/// after the postmaster has read the files).
const RELOAD_SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

impl ConfigurationKeeper {
    /// Notes what the operator asks for now (None: unknown, the last wish stays).
    pub fn want(&mut self, wanted: Option<&ServerConfiguration>) {
        if let Some(wanted) = wanted {
            self.wanted = Some(wanted.clone());
        }
    }

    /// Writes the wanted configuration before a start (the server reads it then).
    pub fn before_start(&mut self, config: &InstanceConfig) -> Result<(), ConfigureError> {
        self.applied = None;
        self.pending_restart = None;
        if let Some(wanted) = &self.wanted {
            write(config, wanted)?;
            self.applied = Some(wanted.clone());
        }
        Ok(())
    }

    /// On a ready server: writes and reloads a changed configuration, then reads what waits for
    /// a restart. Failures are retried on the next step.
    pub async fn keep(&mut self, config: &InstanceConfig, postgres: &mut Postgres) {
        if let Some(wanted) = self.wanted.clone().filter(|wanted| self.applied.as_ref() != Some(wanted)) {
            let outcome = match write(config, &wanted) {
                Ok(()) => postgres.reload().await.map_err(ConfigureError::from),
                Err(error) => Err(error),
            };
            match outcome {
                Ok(()) => {
                    tracing::info!(instance = %config.name, parameters = wanted.parameters.len(), hba_rules = wanted.hba_rules.len(), "spec.postgresql written and reloaded");
                    self.applied = Some(wanted);
                    self.pending_restart = None;
                    self.reloaded_at = Some(std::time::Instant::now());
                }
                Err(error) => {
                    tracing::warn!(instance = %config.name, %error, "could not apply spec.postgresql");
                    return;
                }
            }
        }
        let settled = self.reloaded_at.is_none_or(|reloaded| reloaded.elapsed() >= RELOAD_SETTLE);
        if self.pending_restart.is_none() && settled {
            match postgres.pending_restart().await {
                Ok(names) => self.pending_restart = Some(names),
                Err(error) => tracing::warn!(instance = %config.name, %error, "could not read pending_restart"),
            }
        }
    }

    /// Fingerprint of the parameters the server runs with, once applied.
    pub fn applied_fingerprint(&self) -> Option<String> {
        self.applied.as_ref().map(|applied| fingerprint(&applied.parameters))
    }

    /// Settings the running server applies only after a restart.
    pub fn pending_restart(&self) -> Vec<String> {
        self.pending_restart.clone().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_rules_go_after_the_operators_blocks_and_before_the_rest() {
        let hba =
            "# BEGIN dbservice-operator superuser\nhost all postgres all reject\n# END dbservice-operator superuser\n\
                   # BEGIN dbservice-operator tls\nhostnossl all all all reject\n# END dbservice-operator tls\n\
                   local all all trust\nhost all all all scram-sha-256\n";
        let rules = vec!["host all all 10.1.0.0/16 reject".to_string()];
        let with = with_user_rules(hba, &rules);
        let lines: Vec<&str> = with.lines().collect();
        assert_eq!(lines[6..9], [HBA_BEGIN, "host all all 10.1.0.0/16 reject", HBA_END]);
        assert_eq!(lines[9], "local all all trust");
        // Idempotent, and an empty list removes the block.
        assert_eq!(with_user_rules(&with, &rules), with);
        assert_eq!(with_user_rules(&with, &[]), hba);
        // Without operator blocks the rules come first.
        assert!(with_user_rules("local all all trust\n", &rules).starts_with(HBA_BEGIN));
    }

    #[test]
    fn the_include_line_is_appended_once() {
        let conf = with_include("max_connections = 100").unwrap();
        assert!(conf.ends_with(&format!("{INCLUDE_LINE}\n")), "{conf}");
        assert_eq!(with_include(&conf), None);
    }
}
