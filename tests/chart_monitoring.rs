//! The chart's PostgreSQL alerts and dashboard (issue 23) name only metrics the instance agents
//! export (`METRIC_NAMES`), every alert has a summary, a severity and a duration, and the
//! dashboard is valid JSON whose every panel has a query. What Prometheus makes of the
//! expressions is for a real Prometheus; this catches a renamed metric the moment it happens.

use dbservice_operator::instance::metrics::METRIC_NAMES;
use std::collections::BTreeSet;

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/dbservice-operator/files");

/// The `dbservice_…` metric names in a PromQL expression (`_total` of counters removed).
fn metric_names(expression: &str) -> BTreeSet<String> {
    let pattern = regex::Regex::new(r"dbservice_[a-z_]+").unwrap();
    pattern
        .find_iter(expression)
        .map(|found| found.as_str().strip_suffix("_total").unwrap_or(found.as_str()).to_string())
        .collect()
}

fn assert_exported(where_: &str, expression: &str) {
    let names = metric_names(expression);
    assert!(!names.is_empty(), "{where_}: no dbservice metric in {expression:?}");
    for name in names {
        assert!(METRIC_NAMES.contains(&name.as_str()), "{where_}: {name} is not exported by the agents ({expression})");
    }
}

#[test]
fn every_alert_names_exported_metrics_and_says_what_and_how_bad() {
    let text = std::fs::read_to_string(format!("{CHART}/database-alerts.yaml")).unwrap();
    let rules: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let mut alerts = BTreeSet::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            assert!(alerts.insert(name.to_string()), "{name} twice");
            let expression = rule["expr"].as_str().unwrap();
            assert_exported(name, expression);
            // A hibernated database has no agent and so no series: an alert on missing series
            // would fire for every sleeping database (docs/manual/src/hibernation.md).
            assert!(!expression.contains("absent"), "{name}: absent() fires for hibernated databases");
            assert!(rule["for"].as_str().is_some_and(|duration| !duration.is_empty()), "{name}: no `for`");
            assert!(["warning", "critical"].contains(&rule["labels"]["severity"].as_str().unwrap_or("")), "{name}");
            assert!(rule["annotations"]["summary"].as_str().is_some_and(|summary| !summary.is_empty()), "{name}");
        }
    }
    // What the issue asks for, by name.
    for wanted in [
        "DBServiceNoPrimary",
        "DBServiceReplicationBroken",
        "DBServiceArchivingFailing",
        "DBServiceWraparoundNear",
        "DBServiceDiskAlmostFull",
    ] {
        assert!(alerts.contains(wanted), "{wanted} missing");
    }
}

#[test]
fn every_dashboard_panel_queries_exported_metrics() {
    let text = std::fs::read_to_string(format!("{CHART}/database-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            assert_exported(title, target["expr"].as_str().unwrap());
        }
    }
}
