//! The `pg_settings` catalogue of each supported major (issue 23): name, context, type, unit,
//! range and enum values of every setting, generated from real PostgreSQL by
//! `scripts/pg-settings.sh` into `pgNN.tsv` beside this file, and the settings the operator
//! owns (refused in `spec.postgresql.parameters`, naming the field that controls them).

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

/// When a setting takes effect (`pg_settings.context`, "internal" ones left out of the tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    /// Only at server start: a change takes a restart.
    Postmaster,
    /// On reload (SIGHUP).
    Sighup,
    /// On reload; sessions may also set it (user, superuser, backend, superuser-backend).
    Session,
}

/// The type of a setting's value (`pg_settings.vartype`).
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// on/off.
    Bool,
    /// A whole number, in `unit` when the setting has one.
    Integer,
    /// A floating-point number.
    Real,
    /// One of `enum_values`.
    Enum,
    /// Free text.
    String,
}

/// One row of `pg_settings`.
#[derive(Clone, Debug, PartialEq)]
pub struct Setting {
    /// Its name, lowercase.
    pub name: String,
    /// When a change takes effect.
    pub context: Context,
    /// Type of its value.
    pub kind: Kind,
    /// Unit of a number without one ("8kB", "kB", "MB", "ms", "s", "min"...), empty if none.
    pub unit: String,
    /// Smallest value, in `unit` (numbers only).
    pub minimum: Option<f64>,
    /// Largest value, in `unit` (numbers only).
    pub maximum: Option<f64>,
    /// Allowed values of an enum.
    pub enum_values: Vec<String>,
}

/// The tables kept in the repository, by major (`scripts/pg-settings.sh` makes them).
const TABLES: &[(u32, &str)] = &[
    (14, include_str!("pg14.tsv")),
    (15, include_str!("pg15.tsv")),
    (16, include_str!("pg16.tsv")),
    (17, include_str!("pg17.tsv")),
    (18, include_str!("pg18.tsv")),
];

/// A major's settings by lowercase name.
pub type Catalogue = HashMap<String, Setting>;

static CATALOGUES: LazyLock<BTreeMap<u32, Catalogue>> =
    LazyLock::new(|| TABLES.iter().map(|(major, table)| (*major, parse_table(table))).collect());

/// The catalogue of `major`, when the repository has one.
pub fn catalogue(major: u32) -> Option<&'static Catalogue> {
    CATALOGUES.get(&major)
}

/// The majors with a catalogue.
pub fn catalogued_majors() -> Vec<u32> {
    TABLES.iter().map(|(major, _)| *major).collect()
}

fn parse_table(table: &str) -> Catalogue {
    table.lines().filter_map(parse_row).map(|setting| (setting.name.clone(), setting)).collect()
}

fn parse_row(line: &str) -> Option<Setting> {
    let columns: Vec<&str> = line.split('\t').collect();
    let [name, context, kind, unit, minimum, maximum, enum_values] = columns[..] else { return None };
    let context = match context {
        "postmaster" => Context::Postmaster,
        "sighup" => Context::Sighup,
        "user" | "superuser" | "backend" | "superuser-backend" => Context::Session,
        _ => return None,
    };
    let kind = match kind {
        "bool" => Kind::Bool,
        "integer" => Kind::Integer,
        "real" => Kind::Real,
        "enum" => Kind::Enum,
        _ => Kind::String,
    };
    Some(Setting {
        name: name.to_ascii_lowercase(),
        context,
        kind,
        unit: unit.to_string(),
        minimum: minimum.parse().ok(),
        maximum: maximum.parse().ok(),
        enum_values: enum_values.split(',').filter(|value| !value.is_empty()).map(str::to_string).collect(),
    })
}

/// Settings the operator sets itself, with what controls them instead.
const OWNED: &[(&[&str], &str)] = &[
    (
        &["archive_mode", "archive_command", "archive_library", "archive_timeout", "archive_cleanup_command"],
        "set by the operator from spec.backup (WAL archiving)",
    ),
    (
        &[
            "restore_command",
            "recovery_end_command",
            "recovery_target",
            "recovery_target_action",
            "recovery_target_inclusive",
            "recovery_target_lsn",
            "recovery_target_name",
            "recovery_target_time",
            "recovery_target_timeline",
            "recovery_target_xid",
        ],
        "set by the operator from spec.bootstrap.recovery and for its standbys",
    ),
    (
        &[
            "primary_conninfo",
            "primary_slot_name",
            "promote_trigger_file",
            "hot_standby",
            "wal_log_hints",
            "max_wal_senders",
            "wal_keep_size",
            "max_slot_wal_keep_size",
            "restart_after_crash",
            "wal_retrieve_retry_interval",
        ],
        "set by the operator for replication and failover (spec.replicas, spec.storageSize)",
    ),
    (&["synchronous_standby_names"], "set by the operator from spec.failover.synchronousStandbys"),
    (
        &["wal_level"],
        "set by the operator to replica (standbys and archiving need it; logical decoding is not offered yet)",
    ),
    (
        &[
            "ssl",
            "ssl_cert_file",
            "ssl_key_file",
            "ssl_ca_file",
            "ssl_crl_file",
            "ssl_crl_dir",
            "ssl_min_protocol_version",
            "ssl_passphrase_command",
        ],
        "set by the operator from spec.tls",
    ),
    (
        &[
            "listen_addresses",
            "port",
            "unix_socket_directories",
            "unix_socket_group",
            "unix_socket_permissions",
            "data_directory",
            "config_file",
            "hba_file",
            "ident_file",
            "external_pid_file",
        ],
        "set by the operator (where the server listens and keeps its files)",
    ),
    (
        &["logging_collector", "log_destination", "log_directory", "log_filename", "event_source"],
        "set by the operator (the agent collects PostgreSQL's output)",
    ),
];

/// What controls `name` when the operator owns it (None: the user may set it).
pub fn owned_by(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    OWNED.iter().find(|(names, _)| names.contains(&lower.as_str())).map(|(_, controlled_by)| *controlled_by)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_parses_completely() {
        for (major, table) in TABLES {
            let rows = table.lines().count();
            let parsed = catalogue(*major).unwrap();
            assert_eq!(parsed.len(), rows, "major {major}: a row did not parse");
            assert!(rows > 300, "major {major}: {rows} rows");
        }
    }

    #[test]
    fn the_catalogue_knows_types_units_ranges_and_contexts() {
        let settings = catalogue(15).unwrap();
        let shared_buffers = &settings["shared_buffers"];
        assert_eq!((shared_buffers.context, &shared_buffers.kind), (Context::Postmaster, &Kind::Integer));
        assert_eq!((shared_buffers.unit.as_str(), shared_buffers.minimum), ("8kB", Some(16.0)));
        assert_eq!(settings["work_mem"].context, Context::Session);
        assert!(settings["wal_level"].enum_values.contains(&"logical".to_string()));
        assert_eq!(settings["datestyle"].kind, Kind::String);
        // Settings of a newer major only.
        assert!(catalogue(17).unwrap().contains_key("summarize_wal"));
        assert!(!settings.contains_key("summarize_wal"));
    }

    #[test]
    fn owned_settings_name_what_controls_them_and_exist_in_some_major() {
        assert_eq!(owned_by("Archive_Command"), Some("set by the operator from spec.backup (WAL archiving)"));
        assert_eq!(owned_by("work_mem"), None);
        for (names, _) in OWNED {
            for name in *names {
                assert!(
                    catalogued_majors().iter().any(|major| catalogue(*major).unwrap().contains_key(*name)),
                    "{name} is in no catalogue"
                );
            }
        }
    }
}
