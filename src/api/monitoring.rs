//! `spec.monitoring` (issue 23): the user's own metrics, queries kept in ConfigMaps that the
//! instance agents run on every scrape of `/metrics` (see `instance::custom_queries`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most ConfigMaps `spec.monitoring.customQueries` may name.
pub const MAX_QUERY_CONFIG_MAPS: usize = 4;
/// The key read when `key` is absent.
pub const DEFAULT_QUERIES_KEY: &str = "queries.json";

/// A key of a ConfigMap of the DatabaseService's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyReference {
    /// The ConfigMap's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Its key; "queries.json" when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub key: Option<String>,
}

impl ConfigMapKeyReference {
    /// The key, with the default.
    pub fn key_or_default(&self) -> &str {
        self.key.as_deref().unwrap_or(DEFAULT_QUERIES_KEY)
    }
}

/// `spec.monitoring`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MonitoringSpec {
    /// ConfigMap keys holding a JSON list of queries (`name`, `query`, optional `help`, `labels`,
    /// `kind` gauge or counter, `database`), exported as `dbservice_user_<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub custom_queries: Vec<ConfigMapKeyReference>,
}

impl MonitoringSpec {
    /// The distinct ConfigMaps named (what the agents may read).
    pub fn config_maps(&self) -> Vec<String> {
        let mut names: Vec<String> = self.custom_queries.iter().map(|reference| reference.name.clone()).collect();
        names.sort();
        names.dedup();
        names
    }
}
