//! Which base backup a recovery starts from. A backup can reach a point only if it was
//! consistent before it, so backups are chosen by their **end** (cnpg#264), never their start.

use crate::lsn::Lsn;
use crate::store::manifest::BackupManifest;
use chrono::{DateTime, Utc};

/// Where recovery stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryTarget {
    /// Replay every archived WAL file.
    Latest,
    /// Stop before the first commit after this time.
    Time(DateTime<Utc>),
    /// Stop after this LSN.
    Lsn(Lsn),
    /// Stop after this transaction commits.
    Xid(u64),
    /// Stop at this restore point (`pg_create_restore_point`).
    Name(String),
}

impl RecoveryTarget {
    /// The kind, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            RecoveryTarget::Latest => "latest",
            RecoveryTarget::Time(_) => "time",
            RecoveryTarget::Lsn(_) => "lsn",
            RecoveryTarget::Xid(_) => "xid",
            RecoveryTarget::Name(_) => "name",
        }
    }
}

/// Why no backup can serve a target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectBackupError {
    /// The store holds no completed backup.
    #[error("the object store holds no completed base backup")]
    NoBackups,
    /// The named backup does not exist.
    #[error("backup {0:?} does not exist")]
    UnknownBackup(String),
    /// Every backup ended after the target: none was consistent by then.
    #[error("no base backup ended before the {kind} target {target} (earliest end: {earliest})")]
    TargetBeforeFirstBackup {
        /// Target kind.
        kind: &'static str,
        /// The target.
        target: String,
        /// End of the earliest backup.
        earliest: String,
    },
    /// The chosen backup ended after the target.
    #[error("backup {id} ended at {end}, after the {kind} target {target}")]
    BackupEndsAfterTarget {
        /// Backup id.
        id: String,
        /// Its end.
        end: String,
        /// Target kind.
        kind: &'static str,
        /// The target.
        target: String,
    },
    /// Transaction ids and restore point names do not say when they happened.
    #[error("a {0} target needs an explicit backup: the store cannot tell which backups precede it")]
    NeedsExplicitBackup(&'static str),
}

/// Picks the backup to recover from: `requested` if given (checked against the target),
/// otherwise the latest backup that ended before the target.
pub fn select_backup<'a>(
    backups: &'a [BackupManifest],
    target: &RecoveryTarget,
    requested: Option<&str>,
) -> Result<&'a BackupManifest, SelectBackupError> {
    if let Some(id) = requested {
        let backup = backups
            .iter()
            .find(|backup| backup.id == id)
            .ok_or_else(|| SelectBackupError::UnknownBackup(id.to_string()))?;
        let too_late = match target {
            RecoveryTarget::Time(time) => (backup.end_time > *time).then(|| backup.end_time.to_rfc3339()),
            RecoveryTarget::Lsn(lsn) => (backup.end_lsn > *lsn).then(|| backup.end_lsn.to_string()),
            _ => None,
        };
        return match too_late {
            Some(end) => Err(SelectBackupError::BackupEndsAfterTarget {
                id: backup.id.clone(),
                end,
                kind: target.kind(),
                target: describe(target),
            }),
            None => Ok(backup),
        };
    }
    if backups.is_empty() {
        return Err(SelectBackupError::NoBackups);
    }
    let candidates = backups.iter().filter(|backup| match target {
        RecoveryTarget::Latest => true,
        RecoveryTarget::Time(time) => backup.end_time <= *time,
        RecoveryTarget::Lsn(lsn) => backup.end_lsn <= *lsn,
        RecoveryTarget::Xid(_) | RecoveryTarget::Name(_) => false,
    });
    if let RecoveryTarget::Xid(_) | RecoveryTarget::Name(_) = target {
        return Err(SelectBackupError::NeedsExplicitBackup(target.kind()));
    }
    candidates.max_by_key(|backup| (backup.end_time, backup.end_lsn)).ok_or_else(|| {
        let earliest = backups.iter().min_by_key(|backup| backup.end_time).expect("not empty");
        SelectBackupError::TargetBeforeFirstBackup {
            kind: target.kind(),
            target: describe(target),
            earliest: match target {
                RecoveryTarget::Lsn(_) => earliest.end_lsn.to_string(),
                _ => earliest.end_time.to_rfc3339(),
            },
        }
    })
}

fn describe(target: &RecoveryTarget) -> String {
    match target {
        RecoveryTarget::Latest => "latest".to_string(),
        RecoveryTarget::Time(time) => time.to_rfc3339(),
        RecoveryTarget::Lsn(lsn) => lsn.to_string(),
        RecoveryTarget::Xid(xid) => xid.to_string(),
        RecoveryTarget::Name(name) => format!("{name:?}"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::TimeZone;

    /// A backup that began at `begin` minutes and ended at `end` minutes after midnight, with
    /// LSNs one segment (16 MiB) per minute.
    pub(crate) fn backup(id: &str, begin: i64, end: i64) -> BackupManifest {
        let at = |minute: i64| Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap() + chrono::Duration::minutes(minute);
        let lsn = |minute: i64| Lsn(minute as u64 * 0x100_0000);
        BackupManifest {
            id: id.to_string(),
            server_name: "orders".to_string(),
            begin_lsn: lsn(begin),
            end_lsn: lsn(end),
            begin_wal: crate::lsn::wal_file_name(1, lsn(begin), 0x100_0000),
            end_wal: crate::lsn::last_needed_wal_file(1, lsn(end), 0x100_0000),
            start_time: at(begin),
            end_time: at(end),
            timeline: 1,
            postgres_major_version: 15,
            system_identifier: "7400000000000000001".to_string(),
            from_standby: true,
            size_bytes: 1,
            stored_bytes: 1,
            compression: "zstd".to_string(),
            chunks: Vec::new(),
        }
    }

    fn minute(minute: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap() + chrono::Duration::minutes(minute)
    }

    // `b` starts before `a` ends but ends later: choosing by start would pick `b` for minute 25.
    fn backups() -> Vec<BackupManifest> {
        vec![backup("a", 10, 30), backup("b", 20, 40), backup("c", 50, 55)]
    }

    #[test]
    fn latest_takes_the_newest_end() {
        assert_eq!(select_backup(&backups(), &RecoveryTarget::Latest, None).unwrap().id, "c");
    }

    #[test]
    fn time_takes_the_latest_backup_that_ended_before_it() {
        let backups = backups();
        assert_eq!(select_backup(&backups, &RecoveryTarget::Time(minute(35)), None).unwrap().id, "a");
        assert_eq!(select_backup(&backups, &RecoveryTarget::Time(minute(40)), None).unwrap().id, "b");
        assert_eq!(select_backup(&backups, &RecoveryTarget::Time(minute(54)), None).unwrap().id, "b");
        assert!(matches!(
            select_backup(&backups, &RecoveryTarget::Time(minute(25)), None),
            Err(SelectBackupError::TargetBeforeFirstBackup { kind: "time", .. })
        ));
    }

    #[test]
    fn lsn_takes_the_latest_backup_consistent_before_it() {
        let backups = backups();
        let lsn = |minute: u64| RecoveryTarget::Lsn(Lsn(minute * 0x100_0000));
        assert_eq!(select_backup(&backups, &lsn(45), None).unwrap().id, "b");
        assert_eq!(select_backup(&backups, &lsn(30), None).unwrap().id, "a");
        assert!(select_backup(&backups, &lsn(29), None).is_err());
    }

    #[test]
    fn xid_and_name_need_an_explicit_backup() {
        let backups = backups();
        for target in [RecoveryTarget::Xid(900), RecoveryTarget::Name("before-migration".into())] {
            assert_eq!(
                select_backup(&backups, &target, None),
                Err(SelectBackupError::NeedsExplicitBackup(target.kind()))
            );
            assert_eq!(select_backup(&backups, &target, Some("b")).unwrap().id, "b");
        }
    }

    #[test]
    fn an_explicit_backup_must_exist_and_end_before_the_target() {
        let backups = backups();
        assert_eq!(select_backup(&backups, &RecoveryTarget::Time(minute(60)), Some("a")).unwrap().id, "a");
        assert!(matches!(
            select_backup(&backups, &RecoveryTarget::Time(minute(35)), Some("b")),
            Err(SelectBackupError::BackupEndsAfterTarget { .. })
        ));
        assert_eq!(
            select_backup(&backups, &RecoveryTarget::Latest, Some("zz")),
            Err(SelectBackupError::UnknownBackup("zz".into()))
        );
        assert_eq!(select_backup(&[], &RecoveryTarget::Latest, None), Err(SelectBackupError::NoBackups));
    }
}
