//! Settings the operator owns, kept (issue 37). A role allowed to `ALTER SYSTEM` (a superuser,
//! or a role granted `ALTER SYSTEM ON PARAMETER` on PostgreSQL 15+) writes postgresql.auto.conf,
//! which overrides postgresql.conf at the next reload or start: `wal_level`, `archive_command`,
//! `synchronous_standby_names` and the other settings of [`owned_by`] would silently stop being
//! what the operator set. Every [`CHECK_INTERVAL`] the agent reads `pg_file_settings` (the files
//! as they are now, applied or not) and puts back each owned setting found in postgresql.auto.conf
//! that the operator did not write: `ALTER SYSTEM RESET` when the operator writes no value for
//! it there, `ALTER SYSTEM SET` to the operator's value when it does (its own settings live in
//! that same file, see [`standby::persistent_settings`]), then a reload. A setting that takes a
//! restart is thus put back before any restart applies it.
//!
//! `ALTER DATABASE/ROLE ... SET` cannot reach these settings: every owned setting takes a reload
//! or a restart (context sighup or postmaster), which PostgreSQL refuses per database or role.

use crate::api::failover::OwnedSettingsReverted;
use crate::api::parameters::owned_by;
use crate::instance::standby;
use crate::instance::InstanceConfig;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How often the agent reads the owned settings of postgresql.auto.conf: a changed one is put
/// back within this and a step, well within a minute.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(15);

/// The file `ALTER SYSTEM` writes, in the data directory.
const AUTO_CONF: &str = "postgresql.auto.conf";

/// Settings the agent itself writes into postgresql.auto.conf with a value that changes as the
/// database does (the upstream, its slot, the archive a standby reads).
const WRITTEN_WITH_ANY_VALUE: &[&str] = &["primary_conninfo", "primary_slot_name", "restore_command"];

/// One row of `pg_catalog.pg_file_settings`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSetting {
    /// Setting name, as written in the file.
    pub name: String,
    /// Full path of the file.
    pub sourcefile: String,
    /// Value, as written in the file.
    pub setting: Option<String>,
}

/// What the operator writes into postgresql.auto.conf for one setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Written {
    /// This value.
    Value(String),
    /// A value of its own choosing, whatever it is now.
    AnyValue,
}

/// How one owned setting is put back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutBack {
    /// `ALTER SYSTEM RESET name`: the operator writes no value for it in postgresql.auto.conf.
    Reset(String),
    /// `ALTER SYSTEM SET name = value`: the operator's value.
    Set(String, String),
}

impl PutBack {
    /// The setting's name (lowercase).
    pub fn name(&self) -> &str {
        match self {
            PutBack::Reset(name) | PutBack::Set(name, _) => name,
        }
    }
}

/// Whether `name` may go into an `ALTER SYSTEM` statement as it is: a setting the operator owns,
/// lowercase, of letters, digits and `_` only.
pub fn safe_name(name: &str) -> bool {
    let identifier = name.chars().next().is_some_and(|first| first.is_ascii_lowercase() || first == '_')
        && name
            .chars()
            .all(|character| character.is_ascii_lowercase() || character.is_ascii_digit() || character == '_');
    identifier && owned_by(name).is_some()
}

/// What the operator writes into postgresql.auto.conf: the settings every start writes, the
/// standby's upstream settings, and `synchronous_standby_names` as last applied (any value
/// while the agent has not set it yet).
pub fn operator_written(config: &InstanceConfig, synchronous_applied: Option<&str>) -> BTreeMap<String, Written> {
    let mut written: BTreeMap<String, Written> = standby::persistent_settings(config)
        .into_iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), Written::Value(value)))
        .collect();
    for name in WRITTEN_WITH_ANY_VALUE {
        written.insert(name.to_string(), Written::AnyValue);
    }
    let synchronous = synchronous_applied.map_or(Written::AnyValue, |value| Written::Value(value.to_string()));
    written.insert("synchronous_standby_names".into(), synchronous);
    written
}

/// The owned settings of postgresql.auto.conf in `rows` (in file order) that differ from what
/// the operator writes there (`written`), each once, by name. A name written more than once
/// counts by its last line, the one the server applies.
pub fn put_backs(rows: &[FileSetting], written: &BTreeMap<String, Written>) -> Vec<PutBack> {
    let mut last = BTreeMap::new();
    for row in rows {
        let in_auto_conf = std::path::Path::new(&row.sourcefile).file_name().is_some_and(|file| file == AUTO_CONF);
        let name = row.name.to_ascii_lowercase();
        if in_auto_conf && safe_name(&name) {
            last.insert(name, row.setting.as_ref());
        }
    }
    last.into_iter()
        .filter_map(|(name, setting)| match written.get(&name) {
            None => Some(PutBack::Reset(name)),
            Some(Written::AnyValue) => None,
            Some(Written::Value(value)) if setting == Some(value) => None,
            Some(Written::Value(value)) => Some(PutBack::Set(name, value.clone())),
        })
        .collect()
}

/// When the owned settings were last checked, and the last time some were put back (for the
/// agent's report); the agent reads and writes the server (see `Agent::keep_owned_settings`).
#[derive(Debug, Default)]
pub struct OwnedSettingsKeeper {
    checked: Option<Instant>,
    reverted: Option<OwnedSettingsReverted>,
}

impl OwnedSettingsKeeper {
    /// Whether a check is due (none for [`CHECK_INTERVAL`]); a due check counts as made, so a
    /// failed one is tried again at the next interval.
    pub fn due(&mut self) -> bool {
        if self.checked.is_some_and(|checked| checked.elapsed() < CHECK_INTERVAL) {
            return false;
        }
        self.checked = Some(Instant::now());
        true
    }

    /// Notes that `settings` were put back now.
    pub fn put_back(&mut self, settings: Vec<String>) {
        let count = self.reverted.as_ref().map_or(0, |reverted| reverted.count) + 1;
        let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        self.reverted = Some(OwnedSettingsReverted { at, settings, count });
    }

    /// The last revert, once there was one.
    pub fn reverted(&self) -> Option<&OwnedSettingsReverted> {
        self.reverted.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AUTO: &str = "/var/lib/postgresql/data/pgdata/postgresql.auto.conf";

    fn row(name: &str, sourcefile: &str, setting: &str) -> FileSetting {
        FileSetting { name: name.into(), sourcefile: sourcefile.into(), setting: Some(setting.into()) }
    }

    fn written() -> BTreeMap<String, Written> {
        [
            ("wal_level".to_string(), Written::Value("replica".into())),
            ("synchronous_standby_names".to_string(), Written::Value("ANY 1 (\"db-1\")".into())),
            ("primary_conninfo".to_string(), Written::AnyValue),
        ]
        .into()
    }

    #[test]
    fn an_owned_setting_the_operator_does_not_write_is_reset() {
        let rows = [row("archive_timeout", AUTO, "1"), row("Wal_Log_Hints", AUTO, "off")];
        assert_eq!(
            put_backs(&rows, &written()),
            [PutBack::Reset("archive_timeout".into()), PutBack::Reset("wal_log_hints".into())]
        );
    }

    #[test]
    fn an_owned_setting_the_operator_writes_gets_its_value_back_only_when_it_differs() {
        let changed = [row("wal_level", AUTO, "minimal"), row("synchronous_standby_names", AUTO, "")];
        assert_eq!(
            put_backs(&changed, &written()),
            [
                PutBack::Set("synchronous_standby_names".into(), "ANY 1 (\"db-1\")".into()),
                PutBack::Set("wal_level".into(), "replica".into()),
            ]
        );
        let kept = [row("wal_level", AUTO, "replica"), row("synchronous_standby_names", AUTO, "ANY 1 (\"db-1\")")];
        assert_eq!(put_backs(&kept, &written()), []);
    }

    #[test]
    fn the_operators_own_upstream_other_files_and_settings_it_does_not_own_are_left_alone() {
        let rows = [
            row("primary_conninfo", AUTO, "host=db-0 password=secret"),
            row("wal_level", "/var/lib/postgresql/data/pgdata/postgresql.conf", "logical"),
            row("wal_level", "/etc/postgresql.auto.conf.d/x.conf", "logical"),
            row("work_mem", AUTO, "64MB"),
            row("synchronous_commit", AUTO, "off"),
        ];
        assert_eq!(put_backs(&rows, &written()), []);
    }

    #[test]
    fn a_setting_written_twice_is_put_back_once_and_judged_by_its_last_line() {
        let rows = [row("archive_mode", AUTO, "off"), row("ARCHIVE_MODE", AUTO, "off")];
        assert_eq!(put_backs(&rows, &written()), [PutBack::Reset("archive_mode".into())]);
        // The operator's own settings may name one twice: the last line is the one applied.
        let operators = [row("wal_level", AUTO, "minimal"), row("wal_level", AUTO, "replica")];
        assert_eq!(put_backs(&operators, &written()), []);
        let changed = [row("wal_level", AUTO, "replica"), row("wal_level", AUTO, "minimal")];
        assert_eq!(put_backs(&changed, &written()), [PutBack::Set("wal_level".into(), "replica".into())]);
    }

    #[test]
    fn a_check_is_due_once_per_interval_and_each_revert_has_its_number() {
        let mut keeper = OwnedSettingsKeeper::default();
        assert!(keeper.due());
        assert!(!keeper.due());
        assert_eq!(keeper.reverted(), None);
        keeper.put_back(vec!["wal_level".into()]);
        keeper.put_back(vec!["archive_mode".into()]);
        let reverted = keeper.reverted().unwrap();
        assert_eq!((reverted.settings.as_slice(), reverted.count), (&["archive_mode".to_string()][..], 2));
    }

    #[test]
    fn only_owned_lowercase_identifiers_are_safe_in_a_statement() {
        assert!(safe_name("wal_level") && safe_name("archive_command"));
        for unsafe_name in ["WAL_LEVEL", "wal_level; DROP TABLE x", "work_mem", "", "wal-level", "\"wal_level\""] {
            assert!(!safe_name(unsafe_name), "{unsafe_name}");
        }
    }

    #[test]
    fn every_owned_setting_takes_a_reload_or_a_restart_so_no_role_or_database_can_set_it() {
        use crate::api::parameters::{catalogue, catalogued_majors, Context};
        for major in catalogued_majors() {
            for setting in catalogue(major).unwrap().values().filter(|setting| owned_by(&setting.name).is_some()) {
                assert_ne!(setting.context, Context::Session, "{} in {major}", setting.name);
            }
        }
    }
}
