//! The pooler's metrics (pure): PgBouncer's SHOW POOLS and SHOW STATS rows, and the agent's own
//! pause counters, as OpenMetrics families.

use crate::instance::openmetrics::{Family, MetricKind};
use std::collections::BTreeMap;

/// The rows one PgBouncer answered, or None when it did not.
#[derive(Clone, Debug, Default)]
pub struct PoolRows {
    /// `rw` or `ro`.
    pub pool: &'static str,
    /// SHOW POOLS.
    pub pools: Option<Vec<BTreeMap<String, String>>>,
    /// SHOW STATS.
    pub stats: Option<Vec<BTreeMap<String, String>>>,
}

/// The agent's own counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PauseCounters {
    /// The read-write pool is paused now.
    pub paused: bool,
    /// Pauses so far.
    pub pauses: u64,
    /// Seconds the last pause lasted.
    pub last_pause_seconds: f64,
}

fn number(row: &BTreeMap<String, String>, column: &str) -> Option<f64> {
    row.get(column)?.parse().ok()
}

fn family(name: &str, help: &str, kind: MetricKind) -> Family {
    Family { name: name.into(), help: help.into(), kind, samples: Vec::new() }
}

/// Every family, in a fixed order.
pub fn families(rows: &[PoolRows], counters: &PauseCounters) -> Vec<Family> {
    let mut up = family("dbservice_pooler_up", "1 when the PgBouncer's admin console answered", MetricKind::Gauge);
    let mut clients = family("dbservice_pooler_client_connections", "Client connections by state", MetricKind::Gauge);
    let mut servers = family("dbservice_pooler_server_connections", "Server connections by state", MetricKind::Gauge);
    let mut max_wait =
        family("dbservice_pooler_max_wait_seconds", "Longest wait of a client in the queue now", MetricKind::Gauge);
    let mut transactions = family("dbservice_pooler_transactions", "Transactions pooled", MetricKind::Counter);
    let mut queries = family("dbservice_pooler_queries", "Queries pooled", MetricKind::Counter);
    let mut waited =
        family("dbservice_pooler_client_wait_seconds", "Time clients spent waiting for a server", MetricKind::Counter);
    for pool in rows {
        let pool_label = ("pool".to_string(), pool.pool.to_string());
        up.samples.push((vec![pool_label.clone()], f64::from(u8::from(pool.pools.is_some()))));
        for row in pool.pools.iter().flatten() {
            let labels = |state: &str| {
                vec![
                    pool_label.clone(),
                    ("datname".into(), row.get("database").cloned().unwrap_or_default()),
                    ("user".into(), row.get("user").cloned().unwrap_or_default()),
                    ("state".into(), state.into()),
                ]
            };
            for (column, state) in [("cl_active", "active"), ("cl_waiting", "waiting")] {
                clients.samples.extend(number(row, column).map(|value| (labels(state), value)));
            }
            for (column, state) in [
                ("sv_active", "active"),
                ("sv_idle", "idle"),
                ("sv_used", "used"),
                ("sv_tested", "tested"),
                ("sv_login", "login"),
            ] {
                servers.samples.extend(number(row, column).map(|value| (labels(state), value)));
            }
            let wait = number(row, "maxwait").unwrap_or(0.0) + number(row, "maxwait_us").unwrap_or(0.0) / 1e6;
            let mut wait_labels = labels("");
            wait_labels.pop();
            max_wait.samples.push((wait_labels, wait));
        }
        for row in pool.stats.iter().flatten() {
            let labels = vec![pool_label.clone(), ("datname".into(), row.get("database").cloned().unwrap_or_default())];
            transactions.samples.extend(number(row, "total_xact_count").map(|value| (labels.clone(), value)));
            queries.samples.extend(number(row, "total_query_count").map(|value| (labels.clone(), value)));
            waited.samples.extend(number(row, "total_wait_time").map(|value| (labels.clone(), value / 1e6)));
        }
    }
    let mut paused = Family::gauge(
        "dbservice_pooler_paused",
        "1 while the read-write pool is paused for a switchover",
        f64::from(u8::from(counters.paused)),
    );
    paused.samples.truncate(1);
    let mut pauses = family("dbservice_pooler_pauses", "Pauses for switchovers", MetricKind::Counter);
    pauses.samples.push((Vec::new(), counters.pauses as f64));
    let last = Family::gauge(
        "dbservice_pooler_last_pause_seconds",
        "How long the last pause held the clients",
        counters.last_pause_seconds,
    );
    vec![up, clients, servers, max_wait, transactions, queries, waited, paused, pauses, last]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
    }

    #[test]
    fn pools_and_stats_become_labelled_samples_and_a_silent_pgbouncer_is_down() {
        let rows = [
            PoolRows {
                pool: "rw",
                pools: Some(vec![row(&[
                    ("database", "app"),
                    ("user", "app_user"),
                    ("cl_active", "3"),
                    ("cl_waiting", "2"),
                    ("sv_active", "1"),
                    ("sv_idle", "4"),
                    ("maxwait", "1"),
                    ("maxwait_us", "500000"),
                ])]),
                stats: Some(vec![row(&[
                    ("database", "app"),
                    ("total_xact_count", "42"),
                    ("total_wait_time", "2000000"),
                ])]),
            },
            PoolRows { pool: "ro", pools: None, stats: None },
        ];
        let text = crate::instance::openmetrics::render(&families(
            &rows,
            &PauseCounters { paused: true, pauses: 2, last_pause_seconds: 0.25 },
        ));
        assert!(text.contains("dbservice_pooler_up{pool=\"rw\"} 1\n"), "{text}");
        assert!(text.contains("dbservice_pooler_up{pool=\"ro\"} 0\n"), "{text}");
        assert!(text.contains(
            "dbservice_pooler_client_connections{pool=\"rw\",datname=\"app\",user=\"app_user\",state=\"waiting\"} 2\n"
        ));
        assert!(text.contains("dbservice_pooler_max_wait_seconds{pool=\"rw\",datname=\"app\",user=\"app_user\"} 1.5\n"));
        assert!(text.contains("dbservice_pooler_transactions_total{pool=\"rw\",datname=\"app\"} 42\n"));
        assert!(text.contains("dbservice_pooler_client_wait_seconds_total{pool=\"rw\",datname=\"app\"} 2\n"));
        assert!(text.contains("dbservice_pooler_paused 1\n"));
        assert!(text.contains("dbservice_pooler_pauses_total 2\n"));
    }
}
