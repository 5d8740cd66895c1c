//! OpenMetrics text (pure): metric families and their rendering, shared by the agent's own
//! metrics and the user's queries.

use std::fmt::Write;

/// Gauge or counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// A value that goes up and down.
    Gauge,
    /// A value that only grows (its samples end in `_total`).
    Counter,
}

/// One metric family and its samples (labels, value).
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// Name without `_total`.
    pub name: String,
    /// HELP text.
    pub help: String,
    /// Its kind.
    pub kind: MetricKind,
    /// Samples.
    pub samples: Vec<(Vec<(String, String)>, f64)>,
}

impl Family {
    /// A family of one unlabelled gauge sample.
    pub fn gauge(name: &str, help: &str, value: f64) -> Self {
        Family { name: name.into(), help: help.into(), kind: MetricKind::Gauge, samples: vec![(Vec::new(), value)] }
    }
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The families as OpenMetrics text, ending with `# EOF`.
pub fn render(families: &[Family]) -> String {
    let mut out = String::new();
    for family in families {
        let (kind, suffix) = match family.kind {
            MetricKind::Gauge => ("gauge", ""),
            MetricKind::Counter => ("counter", "_total"),
        };
        let _ = writeln!(out, "# TYPE {} {kind}\n# HELP {} {}", family.name, family.name, family.help);
        for (labels, value) in &family.samples {
            let labels = if labels.is_empty() {
                String::new()
            } else {
                let pairs: Vec<String> =
                    labels.iter().map(|(name, value)| format!("{name}=\"{}\"", escape(value))).collect();
                format!("{{{}}}", pairs.join(","))
            };
            let _ = writeln!(out, "{}{suffix}{labels} {value}", family.name);
        }
    }
    out.push_str("# EOF\n");
    out
}
