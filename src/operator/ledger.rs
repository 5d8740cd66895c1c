//! The ledger (seed 000): status is the present, the ledger is the past. A ConfigMap NAME-ledger
//! holds a bounded, append-only history of what happened to a DatabaseService, oldest dropped first.

use serde::{Deserialize, Serialize};

/// Key of the ConfigMap holding the entries, one JSON object per line.
pub const LEDGER_KEY: &str = "ledger.jsonl";
/// Most entries kept.
pub const MAX_ENTRIES: usize = 200;
/// Most bytes kept (well under the 1 MiB object limit).
pub const MAX_BYTES: usize = 128 * 1024;

/// One thing that happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// RFC 3339 time.
    pub time: String,
    /// metadata.generation of the DatabaseService at the time.
    pub generation: i64,
    /// What was done: Created, SpecChanged, Upgrade, RolledBack, DriftCorrected, Restarted, Degraded, Recovered, Deleted...
    pub action: String,
    /// State before.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub from: String,
    /// State after.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub to: String,
    /// Outcome or explanation.
    pub outcome: String,
}

impl LedgerEntry {
    /// An entry stamped now.
    pub fn now(
        generation: i64,
        action: &str,
        from: impl Into<String>,
        to: impl Into<String>,
        outcome: impl Into<String>,
    ) -> Self {
        Self::at(chrono::Utc::now(), generation, action, from, to, outcome)
    }

    /// An entry stamped `time` (the pure stages get the time passed in).
    pub fn at(
        time: chrono::DateTime<chrono::Utc>,
        generation: i64,
        action: &str,
        from: impl Into<String>,
        to: impl Into<String>,
        outcome: impl Into<String>,
    ) -> Self {
        Self {
            time: time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            generation,
            action: action.into(),
            from: from.into(),
            to: to.into(),
            outcome: outcome.into(),
        }
    }
}

/// Parses the stored lines, skipping any that do not parse.
pub fn parse(text: &str) -> Vec<LedgerEntry> {
    text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

/// The timeline a primary change's outcome names (`... timeline 3`): each promotion has its own.
fn promotion_timeline(entry: &LedgerEntry) -> Option<&str> {
    let promotion = matches!(entry.action.as_str(), "Failover" | "Switchover");
    promotion.then(|| entry.outcome.rsplit_once("timeline ").map(|(_, timeline)| timeline)).flatten()
}

/// Whether `entry` records a primary change the ledger holds already. The ledger append is not
/// atomic with the status write: a pass whose status write was refused (a leader that lost its
/// term, a conflict) is decided again, and a promotion must not be recorded twice.
fn recorded(existing: &[LedgerEntry], entry: &LedgerEntry) -> bool {
    let Some(timeline) = promotion_timeline(entry) else { return false };
    existing.iter().any(|old| {
        old.action == entry.action
            && old.from == entry.from
            && old.to == entry.to
            && promotion_timeline(old) == Some(timeline)
    })
}

/// Appends and trims: at most [`MAX_ENTRIES`] entries and [`MAX_BYTES`] bytes, oldest first out.
pub fn append(existing: &str, new_entries: &[LedgerEntry]) -> String {
    let mut lines: Vec<String> = existing.lines().filter(|line| !line.trim().is_empty()).map(str::to_string).collect();
    let stored = parse(existing);
    let fresh = new_entries.iter().filter(|entry| !recorded(&stored, entry));
    lines.extend(fresh.map(|entry| serde_json::to_string(entry).expect("entries serialize")));
    let mut total: usize = lines.iter().map(|line| line.len() + 1).sum();
    let mut drop = lines.len().saturating_sub(MAX_ENTRIES);
    total -= lines.iter().take(drop).map(|line| line.len() + 1).sum::<usize>();
    while total > MAX_BYTES && drop < lines.len() {
        total -= lines[drop].len() + 1;
        drop += 1;
    }
    let mut text = lines[drop..].join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    text
}

/// The ledger as a table a person can read.
pub fn render_table(entries: &[LedgerEntry]) -> String {
    let headers = ["TIME", "GEN", "ACTION", "FROM", "TO", "OUTCOME"];
    let rows: Vec<[String; 6]> = entries
        .iter()
        .map(|entry| {
            [
                entry.time.clone(),
                entry.generation.to_string(),
                entry.action.clone(),
                entry.from.clone(),
                entry.to.clone(),
                entry.outcome.clone(),
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row.iter()).take(5) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: [&str; 6]| {
        let mut text = String::new();
        for (index, cell) in cells.iter().enumerate() {
            if index < 5 {
                text.push_str(&format!("{cell:<width$}  ", width = widths[index]));
            } else {
                text.push_str(cell);
            }
        }
        text.trim_end().to_string() + "\n"
    };
    let mut output = line(headers);
    for row in &rows {
        output.push_str(&line([&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]]));
    }
    output
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_promotion_decided_again_is_recorded_once() {
        let failover = |timeline: u32, seconds: &str| {
            LedgerEntry::now(1, "Failover", "ha-0", "ha-1", format!("completed in {seconds}, timeline {timeline}"))
        };
        let once = append("", &[failover(6, "3.1s")]);
        let again = append(&once, &[failover(6, "0.0s")]);
        assert_eq!(parse(&again).len(), 1, "{again}");
        // Another promotion between the same instances has another timeline: recorded.
        assert_eq!(parse(&append(&again, &[failover(8, "2.0s")])).len(), 2);
        // Other entries are never deduplicated.
        let restart = LedgerEntry::now(1, "Restarted", "", "", "restart 1");
        assert_eq!(parse(&append(&append("", std::slice::from_ref(&restart)), &[restart])).len(), 2);
    }
    use super::*;

    fn entry(index: usize) -> LedgerEntry {
        LedgerEntry {
            time: "2026-01-01T00:00:00Z".into(),
            generation: index as i64,
            action: "Restarted".into(),
            from: String::new(),
            to: String::new(),
            outcome: "x".repeat(100),
        }
    }

    #[test]
    fn keeps_at_most_max_entries_dropping_the_oldest() {
        let entries: Vec<LedgerEntry> = (0..MAX_ENTRIES + 10).map(entry).collect();
        let text = append("", &entries);
        let kept = parse(&text);
        assert_eq!(kept.len(), MAX_ENTRIES);
        assert_eq!(kept.first().unwrap().generation, 10);
        assert_eq!(kept.last().unwrap().generation, (MAX_ENTRIES + 9) as i64);
    }

    #[test]
    fn keeps_under_the_byte_cap() {
        let big = LedgerEntry { outcome: "y".repeat(10_000), ..entry(0) };
        let text = append("", &vec![big; 50]);
        assert!(text.len() <= MAX_BYTES, "{} bytes", text.len());
        assert!(!parse(&text).is_empty());
    }

    #[test]
    fn appends_after_existing_entries() {
        let first = append("", &[entry(1)]);
        let second = append(&first, &[entry(2)]);
        assert_eq!(parse(&second).iter().map(|entry| entry.generation).collect::<Vec<_>>(), vec![1, 2]);
    }
}
