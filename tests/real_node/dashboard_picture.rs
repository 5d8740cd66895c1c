//! The chart's Grafana dashboard as a picture, without Grafana (issue 43): its JSON laid out on
//! Grafana's 24-column grid, each panel drawn from the series a real Prometheus returned for its
//! queries (a stat or gauge shows its last values, a time series its lines). An SVG the manual
//! shows; `chart_monitoring.rs` checks that it has every panel of the JSON.

use serde_json::Value;
use std::fmt::Write;

/// One series of a panel: its legend and its (time, value) points.
pub type Series = (String, Vec<(f64, f64)>);

/// Grafana's grid: 24 columns over this width, rows of this height.
const WIDTH: f64 = 1200.0;
const ROW: f64 = 30.0;
const COLOURS: [&str; 6] = ["#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#b877d9", "#f2495c"];

/// `template` (Grafana's legend format, `{{label}}`) filled from `labels`.
pub fn legend(template: &str, labels: &Value) -> String {
    let pattern = regex::Regex::new(r"\{\{\s*([a-z_]+)\s*\}\}").unwrap();
    let filled = pattern
        .replace_all(template, |found: &regex::Captures| labels[&found[1]].as_str().unwrap_or_default().to_string());
    filled.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `value` as the panel's unit shows it.
fn shown(value: f64, unit: &str) -> String {
    let scaled = |value: f64, base: f64, units: &[&str]| {
        let mut value = value;
        let mut index = 0;
        while value.abs() >= base && index + 1 < units.len() {
            value /= base;
            index += 1;
        }
        format!("{value:.1} {}", units[index]).trim_end().to_string()
    };
    match unit {
        "bytes" => scaled(value, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB"]),
        "Bps" => scaled(value, 1024.0, &["B/s", "KiB/s", "MiB/s", "GiB/s"]),
        "s" => format!("{value:.1} s"),
        "percentunit" => format!("{:.1} %", value * 100.0),
        _ => scaled(value, 1000.0, &["", "k", "M", "G"]),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The SVG of `dashboard` with `series[i]` the data of its panel `i`.
pub fn render(dashboard: &Value, series: &[Vec<Series>]) -> String {
    let panels = dashboard["panels"].as_array().expect("panels");
    let bottom = panels
        .iter()
        .map(|panel| panel["gridPos"]["y"].as_f64().unwrap() + panel["gridPos"]["h"].as_f64().unwrap())
        .fold(0.0, f64::max);
    let height = bottom * ROW + 40.0;
    let mut svg = String::new();
    let title = escape(dashboard["title"].as_str().unwrap_or_default());
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif"><rect width="100%" height="100%" fill="#111217"/><text x="10" y="24" fill="#d8d9da" font-size="16">{title}</text>"##
    );
    for (panel, data) in panels.iter().zip(series) {
        let position = &panel["gridPos"];
        let column = WIDTH / 24.0;
        let (x, y) = (position["x"].as_f64().unwrap() * column + 4.0, position["y"].as_f64().unwrap() * ROW + 36.0);
        let (w, h) = (position["w"].as_f64().unwrap() * column - 8.0, position["h"].as_f64().unwrap() * ROW - 8.0);
        let unit = panel["fieldConfig"]["defaults"]["unit"].as_str().unwrap_or("none");
        let _ = write!(
            svg,
            r##"<g transform="translate({x:.0},{y:.0})"><rect width="{w:.0}" height="{h:.0}" rx="3" fill="#181b1f" stroke="#2c3235"/><text x="8" y="17" fill="#ccccdc" font-size="12">{}</text>"##,
            escape(panel["title"].as_str().unwrap_or_default())
        );
        match panel["type"].as_str() {
            Some("timeseries") => lines(&mut svg, data, unit, w, h),
            _ => last_values(&mut svg, data, unit, w, h),
        }
        svg.push_str("</g>");
    }
    svg.push_str("</svg>\n");
    svg
}

/// A stat or gauge: the last value of each series (up to three), large, with its legend.
fn last_values(svg: &mut String, data: &[Series], unit: &str, w: f64, h: f64) {
    let shown_series: Vec<&Series> = data.iter().filter(|(_, points)| !points.is_empty()).take(3).collect();
    let slot = w / shown_series.len().max(1) as f64;
    for (index, (label, points)) in shown_series.iter().enumerate() {
        let value = points.last().map_or(0.0, |(_, value)| *value);
        let centre = slot * (index as f64 + 0.5);
        let colour = COLOURS[index % COLOURS.len()];
        let _ = write!(
            svg,
            r##"<text x="{centre:.0}" y="{:.0}" fill="{colour}" font-size="28" text-anchor="middle">{}</text><text x="{centre:.0}" y="{:.0}" fill="#8e8e8e" font-size="10" text-anchor="middle">{}</text>"##,
            h / 2.0 + 12.0,
            escape(&shown(value, unit)),
            h - 10.0,
            escape(label)
        );
    }
}

/// A time series: one line per series on a shared scale, its highest value and the legends.
fn lines(svg: &mut String, data: &[Series], unit: &str, w: f64, h: f64) {
    let points = data.iter().flat_map(|(_, points)| points.iter());
    let (mut t0, mut t1, mut low, mut high) = (f64::MAX, f64::MIN, 0.0_f64, f64::MIN);
    for (time, value) in points {
        t0 = t0.min(*time);
        t1 = t1.max(*time);
        low = low.min(*value);
        high = high.max(*value);
    }
    if high <= low {
        high = low + 1.0;
    }
    let (left, top, right, bottom) = (8.0, 26.0, w - 8.0, h - 22.0);
    let _ = write!(
        svg,
        r##"<line x1="{left}" y1="{bottom:.0}" x2="{right:.0}" y2="{bottom:.0}" stroke="#2c3235"/><text x="{:.0}" y="{:.0}" fill="#8e8e8e" font-size="10" text-anchor="end">{}</text>"##,
        right,
        top + 8.0,
        escape(&shown(high, unit))
    );
    for (index, (label, points)) in data.iter().take(COLOURS.len()).enumerate() {
        let colour = COLOURS[index];
        let span = (t1 - t0).max(1.0);
        let path: Vec<String> = points
            .iter()
            .map(|(time, value)| {
                let px = left + (time - t0) / span * (right - left);
                let py = bottom - (value - low) / (high - low) * (bottom - top);
                format!("{px:.1},{py:.1}")
            })
            .collect();
        let _ = write!(
            svg,
            r##"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"##,
            path.join(" ")
        );
        if index < 3 {
            let _ = write!(
                svg,
                r##"<text x="{:.0}" y="{:.0}" fill="{colour}" font-size="10">{}</text>"##,
                left + index as f64 * (w / 3.0),
                h - 8.0,
                escape(label)
            );
        }
    }
}

#[test]
fn a_panel_is_drawn_where_the_grid_puts_it_with_its_title_and_values() {
    let dashboard = serde_json::json!({"title": "d", "panels": [
        {"type": "stat", "title": "Up <now>", "gridPos": {"x": 0, "y": 0, "w": 12, "h": 7}},
        {"type": "timeseries", "title": "Lag", "gridPos": {"x": 12, "y": 0, "w": 12, "h": 7},
         "fieldConfig": {"defaults": {"unit": "bytes"}}}
    ]});
    let series = vec![
        vec![("db-0".to_string(), vec![(0.0, 1.0)])],
        vec![("db-1".to_string(), vec![(0.0, 0.0), (10.0, 2048.0)])],
    ];
    let svg = render(&dashboard, &series);
    assert!(svg.contains(">Up &lt;now&gt;<") && svg.contains(">Lag<"), "titles, escaped");
    assert!(svg.contains(r#"translate(604,36)"#), "the second panel in the right half: {svg}");
    assert!(svg.contains(">2.0 KiB<") && svg.contains("<polyline"), "the line and its highest value");
    assert_eq!(
        legend(
            "{{namespace}}/{{database}} {{pod}}{{standby}}",
            &serde_json::json!({"namespace": "n", "database": "d", "pod": "p"})
        ),
        "n/d p"
    );
}
