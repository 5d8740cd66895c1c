//! PostgreSQL write-ahead log positions (`pg_lsn`, printed like `16/B374D848`) and the WAL file
//! names derived from them: one type for failover (who is ahead) and for the archive (which
//! segments a backup needs).

use std::fmt;
use std::str::FromStr;

/// A PostgreSQL log sequence number, written `X/Y` (two hexadecimal 32-bit halves).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// Bytes by which `self` is ahead of `other` (0 when it is not ahead).
    pub fn bytes_ahead_of(self, other: Lsn) -> u64 {
        self.0.saturating_sub(other.0)
    }
}

/// Why a text is not an LSN.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not an LSN (two hexadecimal numbers separated by '/', e.g. 0/3000028)")]
pub struct ParseLsnError(pub String);

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(text: &str) -> Result<Lsn, ParseLsnError> {
        // At most 40 characters of the text: it may come from anywhere and ends up in messages.
        let bad = || ParseLsnError(text.chars().take(40).collect());
        let (high, low) = text.trim().split_once('/').ok_or_else(bad)?;
        let half = |part: &str| {
            if part.is_empty() || part.len() > 8 {
                return Err(bad());
            }
            u32::from_str_radix(part, 16).map_err(|_| bad())
        };
        Ok(Lsn((u64::from(half(high)?) << 32) | u64::from(half(low)?)))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl serde::Serialize for Lsn {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Lsn {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Lsn, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for Lsn {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Lsn".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "pattern": "^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$" })
    }
}

/// The name of the WAL segment holding the byte at `lsn` on `timeline`.
pub fn wal_file_name(timeline: u32, lsn: Lsn, segment_size: u64) -> String {
    let segment = lsn.0 / segment_size;
    let segments_per_id = 0x1_0000_0000 / segment_size;
    format!("{timeline:08X}{:08X}{:08X}", segment / segments_per_id, segment % segments_per_id)
}

/// The segment a backup needs last: the one holding the byte just before `end` (a backup
/// ending exactly on a segment boundary needs nothing of the next segment).
pub fn last_needed_wal_file(timeline: u32, end: Lsn, segment_size: u64) -> String {
    wal_file_name(timeline, Lsn(end.0.saturating_sub(1)), segment_size)
}

/// Every segment name of `timeline` from the one holding `begin` to the one holding the byte
/// before `end` (what a backup between them needs from the archive), at most `limit` of them.
pub fn wal_file_names_between(timeline: u32, begin: Lsn, end: Lsn, segment_size: u64, limit: usize) -> Vec<String> {
    let first = begin.0 / segment_size;
    let last = end.0.saturating_sub(1).max(begin.0) / segment_size;
    (first..=last)
        .take(limit)
        .map(|segment| wal_file_name(timeline, Lsn(segment * segment_size), segment_size))
        .collect()
}

/// (timeline, position) of a WAL segment name (the first 24 characters of any WAL file name),
/// where position orders segments within and across timelines' shared LSN space.
pub fn segment_position(name: &str) -> Option<(u32, u64)> {
    let digits = name.get(..24)?;
    if !digits.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return None;
    }
    let timeline = u32::from_str_radix(&digits[..8], 16).ok()?;
    let log = u64::from_str_radix(&digits[8..16], 16).ok()?;
    let segment = u64::from_str_radix(&digits[16..24], 16).ok()?;
    Some((timeline, (log << 32) | segment))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIXTEEN_MIB: u64 = 16 * 1024 * 1024;

    #[test]
    fn lsns_round_trip_and_order() {
        let lsn: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(lsn.0, 0x16_B374_D848);
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert!("0/3000028".parse::<Lsn>().unwrap() < "1/0".parse::<Lsn>().unwrap());
        for bad in ["", "0", "0/", "/1", "x/1", "123456789/0", "0/1/2"] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn wal_file_names_follow_postgres() {
        let lsn: Lsn = "0/3000028".parse().unwrap();
        assert_eq!(wal_file_name(1, lsn, SIXTEEN_MIB), "000000010000000000000003");
        assert_eq!(wal_file_name(2, "1/FF000000".parse().unwrap(), SIXTEEN_MIB), "0000000200000001000000FF");
        assert_eq!(last_needed_wal_file(1, "0/4000000".parse().unwrap(), SIXTEEN_MIB), "000000010000000000000003");
        assert_eq!(last_needed_wal_file(1, "0/4000001".parse().unwrap(), SIXTEEN_MIB), "000000010000000000000004");
        assert_eq!(wal_file_name(1, "0/3000000".parse().unwrap(), 64 * 1024 * 1024), "000000010000000000000000");
    }

    #[test]
    fn a_backup_needs_every_segment_from_its_begin_to_its_end() {
        let names =
            wal_file_names_between(1, "0/FE000028".parse().unwrap(), "1/1000100".parse().unwrap(), SIXTEEN_MIB, 100);
        assert_eq!(
            names,
            [
                "0000000100000000000000FE",
                "0000000100000000000000FF",
                "000000010000000100000000",
                "000000010000000100000001"
            ]
        );
        let one =
            wal_file_names_between(2, "0/3000028".parse().unwrap(), "0/3000100".parse().unwrap(), SIXTEEN_MIB, 100);
        assert_eq!(one, ["000000020000000000000003"]);
    }

    #[test]
    fn segment_positions_compare_across_log_ids() {
        let (timeline, first) = segment_position("0000000200000000000000FF").unwrap();
        let (_, second) = segment_position("000000020000000100000000.partial").unwrap();
        assert_eq!(timeline, 2);
        assert!(first < second);
        assert_eq!(segment_position("00000002.history"), None);
    }

    #[test]
    fn parses_and_prints_like_postgresql() {
        for (text, value) in [("0/0", 0u64), ("0/3000060", 0x300_0060), ("16/B374D848", 0x16_B374_D848)] {
            let lsn: Lsn = text.parse().unwrap();
            assert_eq!(lsn, Lsn(value));
            assert_eq!(lsn.to_string(), text);
        }
    }

    #[test]
    fn rejects_malformed_positions() {
        for text in ["", "0", "/1", "1/", "G/1", "1/2/3", "123456789/0", "-1/0"] {
            assert!(text.parse::<Lsn>().is_err(), "{text:?} must be rejected");
        }
    }

    #[test]
    fn orders_by_position_and_measures_lag() {
        let low: Lsn = "0/FFFFFFFF".parse().unwrap();
        let high: Lsn = "1/0".parse().unwrap();
        assert!(high > low);
        assert_eq!(high.bytes_ahead_of(low), 1);
        assert_eq!(low.bytes_ahead_of(high), 0);
    }

    #[test]
    fn round_trips_through_json_as_a_string() {
        let json = serde_json::to_string(&Lsn(0x1_0000_0010)).unwrap();
        assert_eq!(json, "\"1/10\"");
        assert_eq!(serde_json::from_str::<Lsn>(&json).unwrap(), Lsn(0x1_0000_0010));
        assert!(serde_json::from_str::<Lsn>("\"nope\"").is_err());
    }
}
