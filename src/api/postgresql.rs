//! `spec.postgresql` (server parameters and extra pg_hba rules) and `spec.bootstrap.initdb`
//! (issue 23), with the pure helpers the operator and the agent share: which parameters need a
//! restart, their fingerprint, and how they are written into PostgreSQL's configuration.

use crate::api::parameters::{catalogue, Context};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most entries of `spec.postgresql.parameters`.
pub const MAX_PARAMETERS: usize = 256;
/// Longest value of one parameter.
pub const MAX_PARAMETER_VALUE_LENGTH: usize = 4096;
/// Most entries of `spec.postgresql.pgHba`.
pub const MAX_HBA_RULES: usize = 64;
/// Longest pg_hba rule.
pub const MAX_HBA_RULE_LENGTH: usize = 512;

/// spec.postgresql: the server's own configuration.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresqlSpec {
    /// Server settings (`name: value`, values as strings such as "256MB" or "on"), checked at
    /// admission against the `pg_settings` catalogue of the major version. Settings the operator
    /// controls are refused with the field that controls them. A change reloads the servers;
    /// one of a setting that needs a restart rolls the instances (standbys first, a switchover,
    /// then the old primary).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
    /// Extra pg_hba.conf rules, one per entry, placed after the operator's own (which reject
    /// network logins as the superuser unless allowed, and every connection without TLS) and
    /// before the image's catch-all rule. `trust`, `password` and include directives are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub pg_hba: Vec<String>,
}

/// spec.bootstrap.initdb: how the first data directory is made; immutable after creation.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InitdbSpec {
    /// Locale of the new cluster (`initdb --locale`), e.g. "C" or "en_US.UTF-8"; the image's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub locale: Option<String>,
    /// Encoding (`initdb --encoding`), e.g. "UTF8"; UTF8 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub encoding: Option<String>,
    /// Page checksums (`initdb --data-checksums`): corruption is detected when a page is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_checksums: Option<bool>,
    /// WAL segment size in megabytes (`initdb --wal-segsize`): a power of two from 1 to 1024; 16 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_segment_size_megabytes: Option<u32>,
}

impl InitdbSpec {
    /// The `initdb` options it asks for (the value of the image's POSTGRES_INITDB_ARGS), or None
    /// when it asks for nothing.
    pub fn arguments(&self) -> Option<String> {
        let mut arguments = Vec::new();
        if let Some(locale) = &self.locale {
            arguments.push(format!("--locale={locale}"));
        }
        if let Some(encoding) = &self.encoding {
            arguments.push(format!("--encoding={encoding}"));
        }
        if self.data_checksums == Some(true) {
            arguments.push("--data-checksums".to_string());
        }
        if let Some(size) = self.wal_segment_size_megabytes {
            arguments.push(format!("--wal-segsize={size}"));
        }
        (!arguments.is_empty()).then(|| arguments.join(" "))
    }
}

/// Whether a change of `name` takes a restart on `major`: settings of context postmaster, and
/// extension settings (a dotted name), whose context is unknown until their library is loaded.
pub fn needs_restart(major: u32, name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    if lower.contains('.') {
        return true;
    }
    catalogue(major)
        .and_then(|settings| settings.get(&lower))
        .is_some_and(|setting| setting.context == Context::Postmaster)
}

/// The parameters of `parameters` whose change takes a restart on `major`.
pub fn restart_parameters(major: u32, parameters: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    parameters.iter().filter(|(name, _)| needs_restart(major, name)).map(|(n, v)| (n.clone(), v.clone())).collect()
}

/// A fingerprint of `parameters` that stays the same across versions of this binary (FNV-1a,
/// 64 bits, as 16 hex digits): the agent reports the one it applied, the operator compares.
pub fn fingerprint(parameters: &BTreeMap<String, String>) -> String {
    let bytes: Vec<u8> =
        parameters.iter().flat_map(|(name, value)| name.bytes().chain([0]).chain(value.bytes()).chain([0])).collect();
    format!("{:016x}", fnv1a(&bytes))
}

/// FNV-1a, 64 bits: a hash that stays the same across versions of this binary and of Rust.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

/// A value quoted for a PostgreSQL configuration file (quotes doubled, backslashes escaped).
pub fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// The configuration file holding `parameters` (included at the end of postgresql.conf).
pub fn parameters_file(parameters: &BTreeMap<String, String>) -> String {
    let mut text =
        String::from("# Written by dbservice-operator from spec.postgresql.parameters; edits are replaced.\n");
    for (name, value) in parameters {
        text.push_str(&format!("{} = {}\n", name.to_ascii_lowercase(), quoted(value)));
    }
    text
}

/// Whether a boolean setting's `value` is one of PostgreSQL's spellings of off.
pub fn is_off(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "off" | "false" | "no" | "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect()
    }

    #[test]
    fn postmaster_and_extension_settings_need_a_restart_others_reload() {
        assert!(needs_restart(15, "shared_buffers"));
        assert!(needs_restart(15, "max_connections"));
        assert!(needs_restart(15, "pg_stat_statements.max"));
        assert!(!needs_restart(15, "work_mem"));
        assert!(!needs_restart(15, "log_min_duration_statement"));
        let parameters = map(&[("work_mem", "8MB"), ("shared_buffers", "256MB")]);
        assert_eq!(restart_parameters(15, &parameters), map(&[("shared_buffers", "256MB")]));
    }

    #[test]
    fn the_fingerprint_follows_names_and_values() {
        let one = fingerprint(&map(&[("work_mem", "8MB")]));
        assert_eq!(one.len(), 16);
        assert_eq!(one, fingerprint(&map(&[("work_mem", "8MB")])));
        assert_ne!(one, fingerprint(&map(&[("work_mem", "9MB")])));
        assert_ne!(fingerprint(&map(&[("a", "bc")])), fingerprint(&map(&[("ab", "c")])));
        assert_eq!(fingerprint(&BTreeMap::new()), "cbf29ce484222325");
    }

    #[test]
    fn the_file_quotes_every_value() {
        let text = parameters_file(&map(&[("DateStyle", "ISO, DMY"), ("search_path", r"'a\b'")]));
        assert!(text.contains("datestyle = 'ISO, DMY'\n"), "{text}");
        assert!(text.contains(r"search_path = '''a\\b'''"), "{text}");
    }

    #[test]
    fn initdb_options_become_arguments() {
        assert_eq!(InitdbSpec::default().arguments(), None);
        let spec = InitdbSpec {
            locale: Some("C".into()),
            encoding: Some("UTF8".into()),
            data_checksums: Some(true),
            wal_segment_size_megabytes: Some(32),
        };
        assert_eq!(spec.arguments().unwrap(), "--locale=C --encoding=UTF8 --data-checksums --wal-segsize=32");
    }
}
