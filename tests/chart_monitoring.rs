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

/// The dashboard's panels as (title, x, y, w, h) of Grafana's 24-column grid.
fn panel_boxes(dashboard: &serde_json::Value) -> Vec<(String, i64, i64, i64, i64)> {
    let panels = dashboard["panels"].as_array().unwrap();
    panels
        .iter()
        .map(|panel| {
            let position = &panel["gridPos"];
            let at = |key: &str| position[key].as_i64().unwrap_or_else(|| panic!("{panel}: gridPos.{key}"));
            (panel["title"].as_str().unwrap().to_string(), at("x"), at("y"), at("w"), at("h"))
        })
        .collect()
}

#[test]
fn the_dashboard_panels_fit_the_grid_without_overlapping() {
    let text = std::fs::read_to_string(format!("{CHART}/database-dashboard.json")).unwrap();
    let boxes = panel_boxes(&serde_json::from_str(&text).unwrap());
    for (title, x, _, w, h) in &boxes {
        assert!(*x >= 0 && x + w <= 24 && *w > 0 && *h > 0, "{title} leaves the 24 columns");
    }
    for (index, (a, ax, ay, aw, ah)) in boxes.iter().enumerate() {
        for (b, bx, by, bw, bh) in &boxes[index + 1..] {
            let apart = ax + aw <= *bx || bx + bw <= *ax || ay + ah <= *by || by + bh <= *ay;
            assert!(apart, "panels {a:?} and {b:?} overlap");
        }
    }
    // The manual's picture of the dashboard (made by the real-node monitoring test) shows every
    // panel of this file: a panel added or renamed since needs the picture made again.
    let picture = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/manual/src/images/dashboard.svg"))
        .expect("docs/manual/src/images/dashboard.svg (DBSERVICE_WRITE_PICTURES=1 cargo test --test real_node prometheus_scrapes)");
    for (title, ..) in &boxes {
        let escaped = title.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        assert!(picture.contains(&format!(">{escaped}<")), "the picture lacks panel {title:?}");
    }
}
