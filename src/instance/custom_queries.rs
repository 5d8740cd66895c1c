//! The user's own metrics (issue 23): queries kept in the ConfigMaps `spec.monitoring.customQueries`
//! names, run by the agent on every scrape of `/metrics` and exported as `dbservice_user_<name>`.
//!
//! A ConfigMap key holds a JSON list (the product reads no YAML), e.g.
//! `[{"name": "orders_pending", "help": "Orders not shipped", "labels": ["region"],
//!    "query": "SELECT region, count(*) AS value FROM orders WHERE NOT shipped GROUP BY region"}]`.
//! The query must return a numeric column `value` and a column per label. It runs as the
//! application's role (its own login over the socket: it reads what the application may read, and
//! no more), read-only, with a statement timeout, as one statement (the extended protocol refuses a
//! second), at most [`MAX_ROWS`] rows. A malformed or failing entry costs only itself: it is
//! counted in `dbservice_postgres_scrape_errors` and logged by name.

use crate::api::database_service::DatabaseService;
use crate::instance::openmetrics::{Family, MetricKind};
use crate::instance::roles::{connect_for, identifier};
use crate::instance::session::Sql;
use crate::instance::InstanceConfig;
use k8s_openapi::api::core::v1::ConfigMap;
use serde::Deserialize;
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::sync::watch;

/// Most queries run per scrape (all ConfigMaps together).
pub const MAX_QUERIES: usize = 32;
/// Most rows kept of one query.
pub const MAX_ROWS: usize = 1_000;
/// Longest query text.
pub const MAX_QUERY_LENGTH: usize = 4_096;
/// Most labels of one query.
pub const MAX_LABELS: usize = 8;
/// Longest wait for one ConfigMap read.
const READ_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the ConfigMaps' texts are reused: a scrape every few seconds must not read them from
/// the API server every time (a ConfigMap edit shows within this).
const CONFIG_MAP_REFRESH: Duration = Duration::from_secs(30);
/// statement_timeout of a user query.
const STATEMENT_TIMEOUT_MILLISECONDS: u32 = 2_000;

static NAME: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^[a-z_][a-z0-9_]{0,62}$").expect("metric name pattern compiles"));

/// One entry of a ConfigMap's list.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CustomQuery {
    /// Metric name after `dbservice_user_`.
    pub name: String,
    /// HELP text.
    #[serde(default)]
    pub help: Option<String>,
    /// One SELECT returning a numeric `value` column and the label columns.
    pub query: String,
    /// Columns that become labels, in order.
    #[serde(default)]
    pub labels: Vec<String>,
    /// `gauge` (default) or `counter`.
    #[serde(default)]
    pub kind: Option<String>,
    /// The database it runs in (`spec.databaseName` when absent).
    #[serde(default)]
    pub database: Option<String>,
}

/// Why an entry cannot run, if it cannot.
pub fn problem(query: &CustomQuery) -> Option<String> {
    if !NAME.is_match(&query.name) {
        return Some(format!("name {:?}: lowercase letters, digits and '_', at most 63", query.name));
    }
    if query.labels.len() > MAX_LABELS {
        return Some(format!("{}: at most {MAX_LABELS} labels", query.name));
    }
    if let Some(label) = query.labels.iter().find(|label| !NAME.is_match(label) || label.as_str() == "value") {
        return Some(format!("{}: label {label:?}: lowercase letters, digits and '_', not 'value'", query.name));
    }
    if query.database.as_deref().is_some_and(|database| !NAME.is_match(database)) {
        return Some(format!(
            "{}: database {:?} is not a plain name",
            query.name,
            query.database.as_deref().unwrap_or_default()
        ));
    }
    let text = statement_text(&query.query);
    if text.is_empty() || text.len() > MAX_QUERY_LENGTH {
        return Some(format!("{}: the query must have 1 to {MAX_QUERY_LENGTH} characters", query.name));
    }
    if !matches!(query.kind.as_deref(), None | Some("gauge") | Some("counter")) {
        return Some(format!("{}: kind {:?}: gauge or counter", query.name, query.kind.as_deref().unwrap_or_default()));
    }
    None
}

/// The query without surrounding space and trailing semicolons (it is wrapped in a subquery).
fn statement_text(query: &str) -> &str {
    query.trim().trim_end_matches(';').trim_end()
}

/// The statement run: the query as a subquery, its labels as text and its value as float8.
pub fn wrapped(query: &CustomQuery) -> String {
    let labels: Vec<String> = query.labels.iter().map(|label| format!("q.{}::text", identifier(label))).collect();
    let columns = labels.into_iter().chain(["q.\"value\"::float8".to_string()]).collect::<Vec<_>>().join(", ");
    format!("SELECT {columns} FROM ({}\n) AS q LIMIT {}", statement_text(&query.query), MAX_ROWS)
}

/// Parses a ConfigMap key's text: the runnable entries, and a message per one that is not.
pub fn parse(text: &str) -> Result<(Vec<CustomQuery>, Vec<String>), String> {
    let list: Vec<CustomQuery> =
        serde_json::from_str(text).map_err(|error| format!("not a JSON list of queries: {error}"))?;
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for query in list {
        match problem(&query) {
            Some(problem) => bad.push(problem),
            None => good.push(query),
        }
    }
    Ok((good, bad))
}

/// Where the agent finds its queries.
#[derive(Clone, Default)]
pub enum QueriesSource {
    /// No user queries.
    #[default]
    None,
    /// The DatabaseService the agent watches, and its namespace's ConfigMaps (the agents' Role
    /// may `get` the ones the spec names).
    Api {
        /// The DatabaseService, as watched.
        database: watch::Receiver<Option<Arc<DatabaseService>>>,
        /// ConfigMaps of the namespace.
        config_maps: Box<kube::Api<ConfigMap>>,
        /// The texts last read, reused for [`CONFIG_MAP_REFRESH`].
        cache: Arc<tokio::sync::Mutex<Option<ReadTexts>>>,
    },
    /// Fixed texts (tests on loopback): ConfigMap texts, the application's role and database.
    Fixed {
        /// The keys' texts.
        texts: Vec<String>,
        /// `spec.username`.
        application_user: String,
        /// `spec.databaseName`.
        database: String,
    },
}

/// The ConfigMap texts of one read.
pub struct ReadTexts {
    /// The references read (name, key), in the spec's order.
    references: Vec<(String, String)>,
    /// When.
    read_at: std::time::Instant,
    /// The keys' texts found.
    texts: Vec<String>,
    /// References that could not be read.
    unreadable: u32,
}

impl QueriesSource {
    /// Queries from the DatabaseService the agent watches and its namespace's ConfigMaps.
    pub fn from_api(
        database: watch::Receiver<Option<Arc<DatabaseService>>>,
        config_maps: kube::Api<ConfigMap>,
    ) -> QueriesSource {
        QueriesSource::Api { database, config_maps: Box::new(config_maps), cache: Arc::default() }
    }
}

/// Reads the keys `references` name; the texts found and how many could not be read.
async fn read_config_maps(config_maps: &kube::Api<ConfigMap>, references: &[(String, String)]) -> (Vec<String>, u32) {
    let (mut found, mut unreadable) = (Vec::new(), 0);
    for (name, key) in references {
        let read = tokio::time::timeout(READ_TIMEOUT, config_maps.get_opt(name)).await;
        let text = match read {
            Ok(Ok(config_map)) => {
                config_map.and_then(|config_map| config_map.data).and_then(|mut data| data.remove(key))
            }
            Ok(Err(error)) => {
                tracing::warn!(config_map = %name, %error, "custom queries: cannot read the ConfigMap");
                None
            }
            Err(_) => None,
        };
        match text {
            Some(text) => found.push(text),
            None => {
                tracing::warn!(config_map = %name, %key, "custom queries: no such ConfigMap key");
                unreadable += 1;
            }
        }
    }
    (found, unreadable)
}

/// The queries' texts, the application's role and database, and the ConfigMaps that could not be read.
async fn texts(source: &QueriesSource) -> Option<(Vec<String>, String, String, u32)> {
    match source {
        QueriesSource::None => None,
        QueriesSource::Fixed { texts, application_user, database } => {
            Some((texts.clone(), application_user.clone(), database.clone(), 0))
        }
        QueriesSource::Api { database, config_maps, cache } => {
            let database = database.borrow().clone()?;
            let references: Vec<(String, String)> = database
                .spec
                .monitoring
                .iter()
                .flat_map(|monitoring| &monitoring.custom_queries)
                .map(|reference| (reference.name.clone(), reference.key_or_default().to_string()))
                .collect();
            if references.is_empty() {
                return None;
            }
            // One read at a time; scrapes in between reuse it.
            let mut cached = cache.lock().await;
            let fresh = cached
                .as_ref()
                .is_some_and(|read| read.references == references && read.read_at.elapsed() < CONFIG_MAP_REFRESH);
            if !fresh {
                let (texts, unreadable) = read_config_maps(config_maps, &references).await;
                *cached = Some(ReadTexts { references, read_at: std::time::Instant::now(), texts, unreadable });
            }
            let read = cached.as_ref().expect("just read");
            Some((
                read.texts.clone(),
                database.spec.username.clone(),
                database.spec.database_name.clone(),
                read.unreadable,
            ))
        }
    }
}

async fn run_one(config: &InstanceConfig, user: &str, database: &str, query: &CustomQuery) -> Result<Family, String> {
    // The user's own SQL, as the monitoring role: it names the application's tables unqualified,
    // so the database's search_path stays (a pinned one would break it). Only the timeouts apply:
    // the role holds no privilege the application could borrow through a shadowed function
    // beyond reading statistics, and the query's author chose its names.
    let client = connect_for(config, user, database, Sql::UserWritten).await.map_err(|error| error.to_string())?;
    let setup = format!(
        "SET default_transaction_read_only = on; SET statement_timeout = {STATEMENT_TIMEOUT_MILLISECONDS}; SET application_name = 'dbservice-metrics'"
    );
    client.batch_execute(&setup).await.map_err(|error| error.to_string())?;
    let deadline = Duration::from_millis(u64::from(STATEMENT_TIMEOUT_MILLISECONDS) + 1_000);
    let rows = tokio::time::timeout(deadline, client.query(wrapped(query).as_str(), &[]))
        .await
        .map_err(|_| "no answer in time".to_string())?
        .map_err(|error| error.as_db_error().map(|db| db.message().to_string()).unwrap_or_else(|| error.to_string()))?;
    let samples = rows
        .iter()
        .filter_map(|row| {
            let value: Option<f64> = row.get(query.labels.len());
            let labels = query
                .labels
                .iter()
                .enumerate()
                .map(|(index, label)| (label.clone(), row.get::<_, Option<String>>(index).unwrap_or_default()))
                .collect();
            value.map(|value| (labels, value))
        })
        .collect();
    Ok(Family {
        name: format!("dbservice_user_{}", query.name),
        help: query.help.clone().unwrap_or_else(|| "A query of spec.monitoring.customQueries".into()),
        kind: if query.kind.as_deref() == Some("counter") { MetricKind::Counter } else { MetricKind::Gauge },
        samples,
    })
}

/// Runs the user's queries: their families, and how many entries failed.
pub async fn run_custom_queries(config: &InstanceConfig, source: &QueriesSource) -> (Vec<Family>, u32) {
    let Some((texts, user, default_database, mut errors)) = texts(source).await else { return (Vec::new(), 0) };
    let mut queries = Vec::new();
    for text in texts {
        match parse(&text) {
            Ok((good, bad)) => {
                for problem in bad {
                    tracing::warn!(%problem, "custom query skipped");
                    errors += 1;
                }
                queries.extend(good);
            }
            Err(problem) => {
                tracing::warn!(%problem, "custom queries skipped");
                errors += 1;
            }
        }
    }
    if queries.len() > MAX_QUERIES {
        tracing::warn!(queries = queries.len(), "custom queries: only the first {MAX_QUERIES} run");
        errors += u32::try_from(queries.len() - MAX_QUERIES).unwrap_or(u32::MAX);
        queries.truncate(MAX_QUERIES);
    }
    let mut families: Vec<Family> = Vec::new();
    for query in &queries {
        if families.iter().any(|family| family.name == format!("dbservice_user_{}", query.name)) {
            tracing::warn!(name = %query.name, "custom query skipped: its name is taken");
            errors += 1;
            continue;
        }
        let database = query.database.clone().unwrap_or_else(|| default_database.clone());
        match run_one(config, &user, &database, query).await {
            Ok(family) => families.push(family),
            Err(problem) => {
                tracing::warn!(name = %query.name, %problem, "custom query failed");
                errors += 1;
            }
        }
    }
    (families, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, sql: &str, labels: &[&str]) -> CustomQuery {
        CustomQuery {
            name: name.into(),
            help: None,
            query: sql.into(),
            labels: labels.iter().map(|label| label.to_string()).collect(),
            kind: None,
            database: None,
        }
    }

    #[test]
    fn entries_are_parsed_and_the_malformed_ones_named() {
        let text = r#"[{"name": "orders_pending", "query": "SELECT region, count(*) AS value FROM orders GROUP BY 1;", "labels": ["region"]},
                       {"name": "Bad-Name", "query": "SELECT 1 AS value"},
                       {"name": "no_query", "query": "  ;"},
                       {"name": "odd_kind", "query": "SELECT 1 AS value", "kind": "histogram"},
                       {"name": "value_label", "query": "SELECT 1 AS value", "labels": ["value"]}]"#;
        let (good, bad) = parse(text).unwrap();
        assert_eq!(good.len(), 1);
        assert_eq!(bad.len(), 4, "{bad:?}");
        assert!(bad[0].contains("Bad-Name") && bad[2].contains("histogram"), "{bad:?}");
        assert!(parse(r#"{"name": "x"}"#).unwrap_err().contains("not a JSON list"));
        assert!(parse(r#"[{"name": "x", "query": "SELECT 1", "unknown": 1}]"#).is_err());
    }

    #[test]
    fn the_query_is_wrapped_as_one_subquery_with_text_labels_and_a_float_value() {
        let sql =
            wrapped(&query("pending", " SELECT region, count(*) AS value FROM orders GROUP BY 1 ;; ", &["region"]));
        assert_eq!(
            sql,
            "SELECT q.\"region\"::text, q.\"value\"::float8 FROM (SELECT region, count(*) AS value FROM orders GROUP BY 1\n) AS q LIMIT 1000"
        );
    }
}
