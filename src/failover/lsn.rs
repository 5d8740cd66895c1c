//! PostgreSQL write-ahead log positions (`pg_lsn`), as PostgreSQL prints them: `16/B374D848`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A position in the write-ahead log: a byte offset, ordered like PostgreSQL's `pg_lsn`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

/// A string that is not a `pg_lsn`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid WAL position {0:?}: expected two hexadecimal numbers separated by '/'")]
pub struct ParseLsnError(pub String);

impl Lsn {
    /// Bytes by which `self` is ahead of `other` (0 when it is not ahead).
    pub fn bytes_ahead_of(self, other: Lsn) -> u64 {
        self.0.saturating_sub(other.0)
    }
}

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || ParseLsnError(text.chars().take(40).collect());
        let (high, low) = text.trim().split_once('/').ok_or_else(invalid)?;
        let part = |hex: &str| {
            if hex.is_empty() || hex.len() > 8 {
                return Err(invalid());
            }
            u32::from_str_radix(hex, 16).map_err(|_| invalid())
        };
        Ok(Lsn((u64::from(part(high)?) << 32) | u64::from(part(low)?)))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl Serialize for Lsn {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Lsn {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
