//! PostgreSQL itself in Prometheus (issue 23): the agent serves `/metrics` (OpenMetrics) from its
//! own server: up, role, timeline, replication lag per standby (bytes and seconds), WAL written,
//! the archiver, connections by state and the limit, database sizes, transaction ID age
//! (wraparound), checkpoints, deadlocks and the longest open transaction.
//!
//! Each scrape is bounded: one scrape at a time, its result reused for [`MIN_SCRAPE_INTERVAL`]
//! (many scrapers cost one), one connection over the unix socket with a statement timeout and a
//! deadline for the whole scrape; a query that fails costs only its family
//! (`dbservice_postgres_scrape_errors`).

use crate::instance::custom_queries::{run_custom_queries, QueriesSource};
pub use crate::instance::openmetrics::{render, Family, MetricKind};
use crate::instance::postgres::{free_bytes, volume_bytes};
use crate::instance::roles::connect;
use crate::instance::InstanceConfig;
use axum::extract::State;
use axum::response::IntoResponse;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

/// A scrape within this long of the last one gets the last one's text.
pub const MIN_SCRAPE_INTERVAL: Duration = Duration::from_secs(2);
/// Longest scrape (Prometheus' default scrape timeout is 10 s).
pub const SCRAPE_DEADLINE: Duration = Duration::from_secs(5);
/// Shortest scrape deadline, whatever timeout the scraper announces.
const MIN_SCRAPE_DEADLINE: Duration = Duration::from_millis(250);
/// The header in which Prometheus announces its scrape timeout, in seconds.
const SCRAPE_TIMEOUT_HEADER: &str = "x-prometheus-scrape-timeout-seconds";
/// statement_timeout of the scrape's queries.
const STATEMENT_TIMEOUT_MILLISECONDS: u32 = 2_000;
/// The OpenMetrics content type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every family the agent may export (counters without `_total`): the chart's alerts and
/// dashboard may name only these (tests/chart_monitoring.rs).
pub const METRIC_NAMES: &[&str] = &[
    "dbservice_instance_volume_free_bytes",
    "dbservice_instance_volume_size_bytes",
    "dbservice_postgres_archive_failures",
    "dbservice_postgres_archived_wal",
    "dbservice_postgres_checkpoints",
    "dbservice_postgres_connections",
    "dbservice_postgres_database_size_bytes",
    "dbservice_postgres_deadlocks",
    "dbservice_postgres_last_archive_failed",
    "dbservice_postgres_last_archived_age_seconds",
    "dbservice_postgres_longest_transaction_seconds",
    "dbservice_postgres_max_connections",
    "dbservice_postgres_primary",
    "dbservice_postgres_replication_lag_bytes",
    "dbservice_postgres_replication_lag_seconds",
    "dbservice_postgres_replication_streaming",
    "dbservice_postgres_scrape_errors",
    "dbservice_postgres_server_version",
    "dbservice_postgres_standby_replay_delay_seconds",
    "dbservice_postgres_timeline",
    "dbservice_postgres_transaction_id_age",
    "dbservice_postgres_up",
    "dbservice_postgres_wal_receiver_streaming",
    "dbservice_postgres_wal_written_bytes",
];

/// One query's rows, or why not.
async fn rows(client: &Client, sql: &str) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let parameters: &[&(dyn ToSql + Sync)] = &[];
    client.query(sql, parameters).await
}

/// A family per query: (name, help, kind, SQL returning (label value?, value), label name, primary
/// only). Values are cast to float8 in SQL so one reader fits all.
struct Query {
    name: &'static str,
    help: &'static str,
    kind: MetricKind,
    sql: &'static str,
    label: Option<&'static str>,
    primary_only: bool,
}

const QUERIES: &[Query] = &[
    Query { name: "dbservice_postgres_replication_lag_bytes", help: "WAL the standby has not replayed yet, per standby (on the primary)", kind: MetricKind::Gauge,
        sql: "SELECT application_name::text, COALESCE(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), replay_lsn), 0)::float8 FROM pg_catalog.pg_stat_replication", label: Some("standby"), primary_only: true },
    Query { name: "dbservice_postgres_replication_lag_seconds", help: "Replay lag per standby as the primary measured it (on the primary)", kind: MetricKind::Gauge,
        sql: "SELECT application_name::text, COALESCE(EXTRACT(EPOCH FROM replay_lag), 0)::float8 FROM pg_catalog.pg_stat_replication", label: Some("standby"), primary_only: true },
    Query { name: "dbservice_postgres_replication_streaming", help: "1 per standby streaming from this primary", kind: MetricKind::Gauge,
        sql: "SELECT application_name::text, (state = 'streaming')::int::float8 FROM pg_catalog.pg_stat_replication", label: Some("standby"), primary_only: true },
    Query { name: "dbservice_postgres_wal_written_bytes", help: "WAL written since the cluster was made (position of the primary)", kind: MetricKind::Counter,
        sql: "SELECT NULL::text, pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), '0/0')::float8", label: None, primary_only: true },
    Query { name: "dbservice_postgres_archived_wal", help: "WAL files archived (pg_stat_archiver, since the statistics were reset)", kind: MetricKind::Counter,
        sql: "SELECT NULL::text, archived_count::float8 FROM pg_catalog.pg_stat_archiver", label: None, primary_only: false },
    Query { name: "dbservice_postgres_archive_failures", help: "Failed attempts to archive a WAL file", kind: MetricKind::Counter,
        sql: "SELECT NULL::text, failed_count::float8 FROM pg_catalog.pg_stat_archiver", label: None, primary_only: false },
    Query { name: "dbservice_postgres_last_archived_age_seconds", help: "Seconds since the last WAL file was archived (absent before the first)", kind: MetricKind::Gauge,
        sql: "SELECT NULL::text, EXTRACT(EPOCH FROM pg_catalog.now() - last_archived_time)::float8 FROM pg_catalog.pg_stat_archiver WHERE last_archived_time IS NOT NULL", label: None, primary_only: false },
    Query { name: "dbservice_postgres_last_archive_failed", help: "1 when the last archiving attempt failed (its failure is newer than its last success)", kind: MetricKind::Gauge,
        sql: "SELECT NULL::text, (last_failed_time IS NOT NULL AND (last_archived_time IS NULL OR last_failed_time > last_archived_time))::int::float8 FROM pg_catalog.pg_stat_archiver", label: None, primary_only: false },
    Query { name: "dbservice_postgres_connections", help: "Client connections by state", kind: MetricKind::Gauge,
        sql: "SELECT COALESCE(state, 'unknown')::text, pg_catalog.count(*)::float8 FROM pg_catalog.pg_stat_activity WHERE backend_type = 'client backend' GROUP BY 1", label: Some("state"), primary_only: false },
    Query { name: "dbservice_postgres_max_connections", help: "max_connections", kind: MetricKind::Gauge,
        sql: "SELECT NULL::text, pg_catalog.current_setting('max_connections')::float8", label: None, primary_only: false },
    Query { name: "dbservice_postgres_database_size_bytes", help: "Size of each database", kind: MetricKind::Gauge,
        sql: "SELECT datname::text, pg_catalog.pg_database_size(oid)::float8 FROM pg_catalog.pg_database WHERE datallowconn", label: Some("datname"), primary_only: false },
    Query { name: "dbservice_postgres_transaction_id_age", help: "Age of each database's oldest unfrozen transaction ID (wraparound at 2^31)", kind: MetricKind::Gauge,
        sql: "SELECT datname::text, pg_catalog.age(datfrozenxid)::float8 FROM pg_catalog.pg_database", label: Some("datname"), primary_only: false },
    Query { name: "dbservice_postgres_deadlocks", help: "Deadlocks detected per database", kind: MetricKind::Counter,
        sql: "SELECT datname::text, deadlocks::float8 FROM pg_catalog.pg_stat_database WHERE datname IS NOT NULL", label: Some("datname"), primary_only: false },
    Query { name: "dbservice_postgres_longest_transaction_seconds", help: "Age of the oldest open client transaction (0 when none)", kind: MetricKind::Gauge,
        sql: "SELECT NULL::text, COALESCE(pg_catalog.max(EXTRACT(EPOCH FROM pg_catalog.now() - xact_start)), 0)::float8 FROM pg_catalog.pg_stat_activity WHERE backend_type = 'client backend' AND xact_start IS NOT NULL", label: None, primary_only: false },
];

/// Checkpoints by kind from pg_stat_checkpointer (17 on).
const CHECKPOINTS: Query = Query {
    name: "dbservice_postgres_checkpoints",
    help: "Checkpoints by kind (timed, requested)",
    kind: MetricKind::Counter,
    sql: "SELECT 'timed'::text, num_timed::float8 FROM pg_catalog.pg_stat_checkpointer UNION ALL SELECT 'requested', num_requested::float8 FROM pg_catalog.pg_stat_checkpointer",
    label: Some("kind"),
    primary_only: false,
};

/// The same family from pg_stat_bgwriter (before 17).
const CHECKPOINTS_BEFORE_17: Query = Query {
    sql: "SELECT 'timed'::text, checkpoints_timed::float8 FROM pg_catalog.pg_stat_bgwriter UNION ALL SELECT 'requested', checkpoints_req::float8 FROM pg_catalog.pg_stat_bgwriter",
    ..CHECKPOINTS
};

/// The checkpoints family of a server of `server_version_num` `version`.
fn checkpoints(version: i32) -> &'static Query {
    if version >= 170_000 {
        &CHECKPOINTS
    } else {
        &CHECKPOINTS_BEFORE_17
    }
}

/// Families only a standby has.
const STANDBY_QUERIES: [Query; 2] = [
    Query {
        name: "dbservice_postgres_standby_replay_delay_seconds",
        help: "On a standby: seconds since the last replayed transaction's commit time (grows while the primary is idle)",
        kind: MetricKind::Gauge,
        sql: "SELECT NULL::text, EXTRACT(EPOCH FROM pg_catalog.now() - pg_catalog.pg_last_xact_replay_timestamp())::float8 WHERE pg_catalog.pg_last_xact_replay_timestamp() IS NOT NULL",
        label: None,
        primary_only: false,
    },
    Query {
        name: "dbservice_postgres_wal_receiver_streaming",
        help: "On a standby: 1 while its WAL receiver streams from the primary",
        kind: MetricKind::Gauge,
        sql: "SELECT NULL::text, pg_catalog.count(*)::float8 FROM pg_catalog.pg_stat_wal_receiver WHERE status = 'streaming'",
        label: None,
        primary_only: false,
    },
];

async fn family(client: &Client, query: &Query) -> Result<Family, tokio_postgres::Error> {
    let samples = rows(client, query.sql)
        .await?
        .iter()
        .filter_map(|row| {
            let value: Option<f64> = row.get(1);
            let labels = match query.label {
                Some(label) => vec![(label.to_string(), row.get::<_, Option<String>>(0).unwrap_or_default())],
                None => Vec::new(),
            };
            value.map(|value| (labels, value))
        })
        .collect();
    Ok(Family { name: query.name.into(), help: query.help.into(), kind: query.kind, samples })
}

/// Reads every family from the local server (`up` 0 and nothing else when it does not answer),
/// and the user's queries from `custom`.
pub async fn collect(config: &InstanceConfig, custom: &QueriesSource) -> Vec<Family> {
    let up = |value| Family::gauge("dbservice_postgres_up", "1 when the local PostgreSQL answers", value);
    let Ok(client) = connect(config, &config.superuser, "postgres").await else { return vec![up(0.0)] };
    let setup =
        format!("SET statement_timeout = {STATEMENT_TIMEOUT_MILLISECONDS}; SET application_name = 'dbservice-metrics'");
    if client.batch_execute(&setup).await.is_err() {
        return vec![up(0.0)];
    }
    let facts = "SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('server_version_num')::int, \
        (SELECT timeline_id FROM pg_catalog.pg_control_checkpoint())";
    let Ok(row) = client.query_one(facts, &[]).await else { return vec![up(0.0)] };
    let (standby, version, timeline): (bool, i32, i32) = (row.get(0), row.get(1), row.get(2));
    let mut families = vec![
        up(1.0),
        Family::gauge(
            "dbservice_postgres_primary",
            "1 on the primary, 0 on a standby",
            if standby { 0.0 } else { 1.0 },
        ),
        Family::gauge("dbservice_postgres_timeline", "Timeline of the last checkpoint", f64::from(timeline)),
        Family::gauge("dbservice_postgres_server_version", "server_version_num", f64::from(version)),
    ];
    let mut errors = 0.0;
    let standby_queries: &[Query] = if standby { &STANDBY_QUERIES } else { &[] };
    let wanted = QUERIES
        .iter()
        .filter(|query| !(standby && query.primary_only))
        .chain(std::iter::once(checkpoints(version)))
        .chain(standby_queries);
    for query in wanted {
        match family(&client, query).await {
            Ok(family) => families.push(family),
            Err(error) => {
                errors += 1.0;
                tracing::debug!(metric = query.name, %error, "metrics query failed");
            }
        }
    }
    // The data volume (PGDATA's parent: the mount), for "disk almost full" without kubelet metrics.
    let volume = config.pgdata.parent().unwrap_or(&config.pgdata);
    if let (Some(free), Some(size)) = (free_bytes(volume), volume_bytes(volume)) {
        families.push(Family::gauge(
            "dbservice_instance_volume_free_bytes",
            "Bytes free on the data volume",
            free as f64,
        ));
        families.push(Family::gauge("dbservice_instance_volume_size_bytes", "Size of the data volume", size as f64));
    }
    let (user_families, user_errors) = run_custom_queries(config, custom).await;
    families.extend(user_families);
    errors += f64::from(user_errors);
    families.push(Family::gauge("dbservice_postgres_scrape_errors", "Queries of this scrape that failed", errors));
    families
}

/// The scrape state: the last text and when it was made.
struct Scrapes {
    config: InstanceConfig,
    custom: QueriesSource,
    last: Mutex<Option<(Instant, String)>>,
}

/// How long a scrape may take: 80% of the timeout the scraper announces (Prometheus sends it in
/// [`SCRAPE_TIMEOUT_HEADER`]), within [`MIN_SCRAPE_DEADLINE`]..[`SCRAPE_DEADLINE`]. A hung server
/// must be reported as `up 0` before the scraper gives up, or the alert on it never sees a sample.
pub fn scrape_deadline(headers: &http::HeaderMap) -> Duration {
    let announced = headers
        .get(SCRAPE_TIMEOUT_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<f64>().ok())
        .filter(|seconds| seconds.is_finite() && *seconds > 0.0);
    match announced {
        Some(seconds) => {
            Duration::from_secs_f64((seconds * 0.8).min(SCRAPE_DEADLINE.as_secs_f64())).max(MIN_SCRAPE_DEADLINE)
        }
        None => SCRAPE_DEADLINE,
    }
}

async fn metrics(State(scrapes): State<Arc<Scrapes>>, headers: http::HeaderMap) -> axum::response::Response {
    let deadline = scrape_deadline(&headers);
    // One scrape at a time: the others wait for it and reuse its text.
    let mut last = scrapes.last.lock().await;
    if let Some((_, text)) = last.as_ref().filter(|(at, _)| at.elapsed() < MIN_SCRAPE_INTERVAL) {
        return ([(http::header::CONTENT_TYPE, CONTENT_TYPE)], text.clone()).into_response();
    }
    let families = tokio::time::timeout(deadline, collect(&scrapes.config, &scrapes.custom))
        .await
        .unwrap_or_else(|_| vec![Family::gauge("dbservice_postgres_up", "1 when the local PostgreSQL answers", 0.0)]);
    let text = render(&families);
    *last = Some((Instant::now(), text.clone()));
    ([(http::header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response()
}

/// The `/metrics` router of `config`'s server, with the user's queries from `custom`.
pub fn router(config: InstanceConfig, custom: QueriesSource) -> axum::Router {
    let scrapes = Arc::new(Scrapes { config, custom, last: Mutex::new(None) });
    axum::Router::new().route("/metrics", axum::routing::get(metrics)).with_state(scrapes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrape_deadline_follows_the_scrapers_announced_timeout() {
        let with = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(SCRAPE_TIMEOUT_HEADER, http::HeaderValue::from_str(value).unwrap());
            scrape_deadline(&headers)
        };
        assert_eq!(scrape_deadline(&http::HeaderMap::new()), SCRAPE_DEADLINE);
        assert_eq!(with("2"), Duration::from_millis(1600));
        assert_eq!(with("10"), SCRAPE_DEADLINE);
        assert_eq!(with("0.1"), MIN_SCRAPE_DEADLINE);
        for nonsense in ["0", "-3", "NaN", "inf", "soon"] {
            assert_eq!(with(nonsense), SCRAPE_DEADLINE, "{nonsense}");
        }
    }

    #[test]
    fn families_render_as_openmetrics_with_escaped_labels_and_an_eof() {
        let families = vec![
            Family::gauge("dbservice_postgres_up", "1 when up", 1.0),
            Family {
                name: "dbservice_postgres_deadlocks".into(),
                help: "Deadlocks".into(),
                kind: MetricKind::Counter,
                samples: vec![(vec![("datname".into(), "we\"ird\\db".into())], 2.0)],
            },
        ];
        let text = render(&families);
        assert_eq!(
            text,
            "# TYPE dbservice_postgres_up gauge\n# HELP dbservice_postgres_up 1 when up\ndbservice_postgres_up 1\n\
             # TYPE dbservice_postgres_deadlocks counter\n# HELP dbservice_postgres_deadlocks Deadlocks\n\
             dbservice_postgres_deadlocks_total{datname=\"we\\\"ird\\\\db\"} 2\n# EOF\n"
        );
    }

    #[test]
    fn checkpoints_come_from_the_view_the_major_has() {
        assert!(checkpoints(170_002).sql.contains("pg_stat_checkpointer"));
        assert!(checkpoints(150_010).sql.contains("pg_stat_bgwriter"));
        assert_eq!(checkpoints(150_010).name, checkpoints(180_000).name);
    }
}
