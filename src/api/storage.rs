//! Automatic growth of the data volumes (`spec.storageGrowth`) and what an agent reports about
//! its volume for it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default `whenUsedPercent`: room for a step's worth of writes before the volume fills.
pub const DEFAULT_WHEN_USED_PERCENT: u8 = 80;
/// Default `stepPercent`: few resizes (a cloud may allow one per volume every few hours).
pub const DEFAULT_STEP_PERCENT: u16 = 50;
/// Fewest and most `whenUsedPercent` admitted: growth comes before the alert DBServiceDiskAlmostFull
/// (under 10 % free) can fire.
pub const WHEN_USED_PERCENT_RANGE: std::ops::RangeInclusive<u8> = 50..=85;
/// Fewest and most `stepPercent` admitted: at least 20 %, so that a grown volume's file system
/// (a few percent smaller than its claim) is always larger than the whole volume was before.
pub const STEP_PERCENT_RANGE: std::ops::RangeInclusive<u16> = 20..=200;
/// An agent rounds its volume's use down to a multiple of this, so that it republishes its report
/// a few times between empty and full instead of at every write.
pub const USED_PERCENT_GRANULARITY: u8 = 5;

/// spec.storageGrowth: the operator grows every data volume when one of them fills past
/// `whenUsedPercent`, by `stepPercent`, never past `limit`. The StorageClass must allow volume
/// expansion. The volumes never shrink, also when this is removed.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageGrowthSpec {
    /// Largest size a data volume is grown to, a Kubernetes quantity such as "100Gi"; at least
    /// spec.storageSize.
    #[schemars(length(max = 32))]
    pub limit: String,
    /// Grow when a volume is this full (percent, 50 to 85: below the 90 % of the alert
    /// DBServiceDiskAlmostFull, which so fires only when growth could not help). Defaults to 80.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 50, max = 85))]
    pub when_used_percent: Option<u8>,
    /// Grow by this much of the current size (percent, 20 to 200). Defaults to 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 20, max = 200))]
    pub step_percent: Option<u16>,
}

impl StorageGrowthSpec {
    /// `whenUsedPercent` or its default.
    pub fn when_used_percent(&self) -> u8 {
        self.when_used_percent.unwrap_or(DEFAULT_WHEN_USED_PERCENT)
    }

    /// `stepPercent` or its default.
    pub fn step_percent(&self) -> u16 {
        self.step_percent.unwrap_or(DEFAULT_STEP_PERCENT)
    }
}

/// An instance's data volume as its agent sees it (statvfs of the mount).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeReport {
    /// Size of the file system.
    pub size_bytes: u64,
    /// Share of it in use (what PostgreSQL can no longer write to), rounded down to a multiple of
    /// [`USED_PERCENT_GRANULARITY`].
    pub used_percent: u8,
}

impl VolumeReport {
    /// The report of a file system of `size` bytes with `available` bytes left.
    pub fn of(size: u64, available: u64) -> Option<VolumeReport> {
        if size == 0 {
            return None;
        }
        let used = size.saturating_sub(available.min(size));
        let percent = (u128::from(used) * 100 / u128::from(size)) as u8;
        let used_percent = percent - percent % USED_PERCENT_GRANULARITY;
        Some(VolumeReport { size_bytes: size, used_percent })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_is_rounded_down_to_the_granularity() {
        assert_eq!(VolumeReport::of(1000, 210), Some(VolumeReport { size_bytes: 1000, used_percent: 75 }));
        assert_eq!(VolumeReport::of(1000, 200), Some(VolumeReport { size_bytes: 1000, used_percent: 80 }));
        assert_eq!(VolumeReport::of(1000, 0).map(|report| report.used_percent), Some(100));
        assert_eq!(VolumeReport::of(1000, 5000).map(|report| report.used_percent), Some(0));
        assert_eq!(VolumeReport::of(0, 0), None);
    }
}
