//! Retention: which base backups and WAL files may go. A recovery window of N days keeps every
//! backup that ended inside the window, plus the newest one that ended before it (recovering to
//! the window's first moment starts from that one), and the newest backup always. WAL is deleted
//! only below the first segment the oldest kept backup needs; history files and names we do not
//! recognise are never deleted.

use crate::lsn::segment_position;
use crate::store::manifest::BackupManifest;
use chrono::{DateTime, Utc};
use std::str::FromStr;

/// A recovery window such as `30d`, `4w` or `1m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Length of the window.
    pub window: chrono::Duration,
}

/// Why a retention policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "retention policy {0:?} must be a positive number followed by d (days), w (weeks) or m (30-day months), e.g. 30d"
)]
pub struct ParseRetentionError(pub String);

impl FromStr for RetentionPolicy {
    type Err = ParseRetentionError;

    fn from_str(text: &str) -> Result<RetentionPolicy, ParseRetentionError> {
        let bad = || ParseRetentionError(text.to_string());
        let unit = text.chars().last().ok_or_else(bad)?;
        let digits = &text[..text.len() - unit.len_utf8()];
        if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err(bad());
        }
        let count: i64 = digits.parse().map_err(|_| bad())?;
        let days = match unit {
            'd' => Some(count),
            'w' => count.checked_mul(7),
            'm' => count.checked_mul(30),
            _ => None,
        }
        .filter(|days| *days <= 36_500)
        .ok_or_else(bad)?;
        Ok(RetentionPolicy { window: chrono::Duration::days(days) })
    }
}

/// What retention deletes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RetentionPlan {
    /// Ids of the base backups to delete.
    pub expired_backups: Vec<String>,
    /// Keys of the WAL objects to delete.
    pub expired_wal: Vec<String>,
    /// Ids of abandoned backups (chunks without `backup.json`, untouched for
    /// [`ABANDONED_AFTER`]: a backup Job killed before it finished), deleted by `enforce`.
    pub abandoned_backups: Vec<String>,
}

/// How long a backup's chunks may sit without its `backup.json` before they count as abandoned:
/// far longer than any backup writes nothing (a backup in progress writes a chunk at least every
/// few minutes and its manifest once its WAL is archived).
pub const ABANDONED_AFTER: chrono::Duration = chrono::Duration::hours(24);

/// The ids of backups under `base_prefix` that have chunks but no `backup.json` and whose newest
/// object is older than [`ABANDONED_AFTER`] at `now` (pure). An object whose time cannot be read
/// keeps its backup: nothing is deleted on doubt.
pub fn abandoned_backups(
    objects: &[crate::store::xml::ListedObject],
    base_prefix: &str,
    now: DateTime<Utc>,
) -> Vec<String> {
    let mut backups: std::collections::BTreeMap<&str, (bool, Option<DateTime<Utc>>)> = Default::default();
    for object in objects {
        let Some((id, file)) = object.key.strip_prefix(base_prefix).and_then(|rest| rest.split_once('/')) else {
            continue;
        };
        let modified = DateTime::parse_from_rfc3339(&object.last_modified).ok().map(|time| time.with_timezone(&Utc));
        let entry = backups.entry(id).or_insert((false, Some(DateTime::<Utc>::MIN_UTC)));
        entry.0 |= file == "backup.json";
        entry.1 = match (entry.1, modified) {
            (Some(newest), Some(modified)) => Some(newest.max(modified)),
            _ => None,
        };
    }
    backups
        .into_iter()
        .filter(|(_, (complete, newest))| !complete && newest.is_some_and(|newest| now - newest > ABANDONED_AFTER))
        .map(|(id, _)| id.to_string())
        .collect()
}

/// The WAL file name of an object key (`…/wal/<timeline>/<name>[.zst]`).
fn wal_file_of(key: &str) -> &str {
    let name = key.rsplit('/').next().unwrap_or(key);
    name.strip_suffix(".zst").unwrap_or(name)
}

/// Plans retention at `now` over the completed `backups` and the keys of the archived WAL.
pub fn plan(
    backups: &[BackupManifest],
    wal_keys: &[String],
    policy: RetentionPolicy,
    now: DateTime<Utc>,
) -> RetentionPlan {
    let window_start = now - policy.window;
    let mut by_end: Vec<&BackupManifest> = backups.iter().collect();
    by_end.sort_by_key(|backup| (backup.end_time, backup.id.clone()));
    // The newest backup that ended before the window start still serves the window's first moment.
    let first_kept = by_end.iter().rposition(|backup| backup.end_time < window_start).unwrap_or(0);
    let (expired, kept) = by_end.split_at(first_kept);
    let Some(oldest_needed) =
        kept.iter().filter_map(|backup| segment_position(&backup.begin_wal)).map(|(_, p)| p).min()
    else {
        return RetentionPlan::default();
    };
    let expired_wal = wal_keys
        .iter()
        .filter(|key| {
            let name = wal_file_of(key);
            // History files are tiny and every later timeline's recovery reads them.
            !name.ends_with(".history") && segment_position(name).is_some_and(|(_, position)| position < oldest_needed)
        })
        .cloned()
        .collect();
    RetentionPlan {
        expired_backups: expired.iter().map(|backup| backup.id.clone()).collect(),
        expired_wal,
        abandoned_backups: Vec::new(),
    }
}

/// Why enforcing retention stopped.
#[derive(Debug, thiserror::Error)]
pub enum EnforceRetentionError {
    /// The store could not be listed or read.
    #[error(transparent)]
    Catalog(#[from] crate::store::catalog::CatalogError),
    /// A delete failed (what was deleted before stays deleted; the next run continues).
    #[error(transparent)]
    Store(#[from] crate::store::client::StoreError),
}

/// Plans retention at `now` and carries it out: each expired backup loses its `backup.json`
/// first (from then on it is not a backup for any reader), then its chunks; WAL goes last.
pub async fn enforce(
    client: &crate::store::client::S3Client,
    layout: &crate::store::keys::KeyLayout,
    policy: RetentionPolicy,
    now: DateTime<Utc>,
) -> Result<RetentionPlan, EnforceRetentionError> {
    let backups = crate::store::catalog::list_backups(client, layout).await?;
    let wal: Vec<String> =
        crate::store::catalog::list_wal(client, layout).await?.into_iter().map(|object| object.key).collect();
    let plan = plan(&backups, &wal, policy, now);
    for id in &plan.expired_backups {
        // Ids come from listed manifests, which passed the key checks when written.
        if let (Ok(manifest), Ok(prefix)) = (layout.backup_manifest_key(id), layout.base_backup_prefix(id)) {
            client.delete_object(&manifest).await?;
            for object in client.list_objects(&prefix).await? {
                client.delete_object(&object.key).await?;
            }
        }
    }
    for key in &plan.expired_wal {
        client.delete_object(key).await?;
    }
    let base = client.list_objects(&layout.base_prefix()).await?;
    let abandoned = abandoned_backups(&base, &layout.base_prefix(), now);
    for id in &abandoned {
        let prefix = format!("{}{id}/", layout.base_prefix());
        for object in base.iter().filter(|object| object.key.starts_with(&prefix)) {
            client.delete_object(&object.key).await?;
        }
    }
    Ok(RetentionPlan { abandoned_backups: abandoned, ..plan })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::selection::tests::backup;
    use chrono::TimeZone;

    fn day(day: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, day, 0, 0, 0).unwrap()
    }

    /// A backup on day `day`, beginning at segment `day * 10` (so WAL positions grow with days).
    fn daily(day_of_month: u32) -> BackupManifest {
        let mut backup =
            backup(&format!("day{day_of_month:02}"), i64::from(day_of_month) * 10, i64::from(day_of_month) * 10 + 1);
        backup.end_time = day(day_of_month);
        backup.start_time = day(day_of_month) - chrono::Duration::minutes(5);
        backup
    }

    fn wal(segment: u32) -> String {
        format!("p/orders/wal/00000001/00000001000000000000{segment:04X}.zst")
    }

    #[test]
    fn policies_parse_and_bad_ones_are_named() {
        assert_eq!("30d".parse::<RetentionPolicy>().unwrap().window, chrono::Duration::days(30));
        assert_eq!("2w".parse::<RetentionPolicy>().unwrap().window, chrono::Duration::days(14));
        assert_eq!("1m".parse::<RetentionPolicy>().unwrap().window, chrono::Duration::days(30));
        for bad in ["", "d", "0d", "07d", "30", "30h", "-1d", "3.5d", "99999999999999999999d"] {
            let error = bad.parse::<RetentionPolicy>().unwrap_err();
            assert!(error.to_string().contains("e.g. 30d"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn backups_older_than_the_window_go_except_the_one_serving_its_start() {
        let backups: Vec<_> = [1, 5, 10, 20, 25].map(daily).to_vec();
        let policy = "10d".parse().unwrap();
        // Fake clock: day 28, window starts on day 18. Day 10 serves days 18-20; days 1 and 5 go.
        let plan = plan(&backups, &[], policy, day(28));
        assert_eq!(plan.expired_backups, vec!["day01", "day05"]);
        // A day later nothing changes; on day 31 (window from day 21) day 10 goes too.
        assert_eq!(super::plan(&backups, &[], policy, day(29)).expired_backups, vec!["day01", "day05"]);
        assert_eq!(super::plan(&backups, &[], policy, day(31)).expired_backups, vec!["day01", "day05", "day10"]);
    }

    #[test]
    fn the_newest_backup_is_kept_however_old() {
        let backups = vec![daily(1), daily(2)];
        let plan = plan(&backups, &[], "1d".parse().unwrap(), day(30));
        assert_eq!(plan.expired_backups, vec!["day01"]);
    }

    #[test]
    fn wal_goes_only_below_what_the_oldest_kept_backup_needs() {
        let backups: Vec<_> = [1, 5, 10, 20].map(daily).to_vec();
        // Kept: day 10 (begins at segment 100) and day 20.
        let keys: Vec<String> = [10, 49, 50, 99, 100, 101, 250]
            .map(wal)
            .into_iter()
            .chain([
                "p/orders/wal/00000002/00000002.history.zst".to_string(),
                "p/orders/wal/00000001/000000010000000000000010.00000028.backup.zst".to_string(),
                "p/orders/wal/00000001/000000010000000000000063.partial.zst".to_string(),
                "p/orders/wal/00000002/000000020000000000000064.zst".to_string(),
                "p/orders/wal/00000001/not-a-wal-file".to_string(),
            ])
            .collect();
        let plan = plan(&backups, &keys, "10d".parse().unwrap(), day(28));
        assert_eq!(plan.expired_backups, vec!["day01", "day05"]);
        assert_eq!(
            plan.expired_wal,
            vec![
                wal(10),
                wal(49),
                wal(50),
                wal(99),
                "p/orders/wal/00000001/000000010000000000000010.00000028.backup.zst".to_string(),
                "p/orders/wal/00000001/000000010000000000000063.partial.zst".to_string(),
            ]
        );
    }

    #[test]
    fn chunks_without_a_manifest_untouched_for_a_day_are_abandoned() {
        let object = |key: &str, hours_ago: i64| crate::store::xml::ListedObject {
            key: format!("p/s/base/{key}"),
            size: 1,
            last_modified: (day(20) - chrono::Duration::hours(hours_ago)).to_rfc3339(),
        };
        let objects = [
            object("killed/data.tar.zst.00000", 30),
            object("killed/data.tar.zst.00001", 25),
            object("running/data.tar.zst.00000", 30),
            object("running/data.tar.zst.00001", 1),
            object("complete/data.tar.zst.00000", 90),
            object("complete/backup.json", 90),
        ];
        assert_eq!(abandoned_backups(&objects, "p/s/base/", day(20)), ["killed"]);
        let mut unreadable = objects.to_vec();
        unreadable[1].last_modified = "yesterday".into();
        assert!(abandoned_backups(&unreadable, "p/s/base/", day(20)).is_empty(), "nothing is deleted on doubt");
    }

    #[test]
    fn without_backups_nothing_is_deleted() {
        let plan = plan(&[], &[wal(1)], "1d".parse().unwrap(), day(30));
        assert_eq!(plan, RetentionPlan::default());
    }
}
