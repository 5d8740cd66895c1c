//! Admission rules of `spec.backup` and `spec.bootstrap.recovery`, called by the one shared
//! validation function ([`crate::admission::validation::validate`]); and the rules that need the store's
//! contents ([`check_recovery_against_store`]), for whoever has read it.

use crate::admission::field_error::{FieldError, FieldErrorKind};
use crate::api::backup::{
    ObjectStore, RecoverySpec, ARCHIVE_FAILURE_WARNING_SECONDS_RANGE, ARCHIVE_TIMEOUT_SECONDS_RANGE,
};
use crate::api::database_service::DatabaseServiceSpec;
use crate::schedule::Schedule;
use crate::store::catalog::RecoverableWindow;
use crate::store::keys::KeyLayout;
use crate::store::manifest::BackupManifest;
use crate::store::retention::RetentionPolicy;
use crate::store::selection::{select_backup, RecoveryTarget};

fn invalid(path: &str, value: impl std::fmt::Display, detail: impl Into<String>) -> FieldError {
    FieldError { path: path.to_string(), kind: FieldErrorKind::Invalid(value.to_string()), detail: detail.into() }
}

fn is_bucket_name(bucket: &str) -> bool {
    (3..=63).contains(&bucket.len())
        && bucket.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || b".-".contains(&byte))
        && bucket.starts_with(|first: char| first.is_ascii_alphanumeric())
        && bucket.ends_with(|last: char| last.is_ascii_alphanumeric())
}

fn is_secret_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn is_secret_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-._".contains(&byte))
}

fn validate_object_store(path: &str, store: &ObjectStore, name: &str, errors: &mut Vec<FieldError>) {
    match store.endpoint.parse::<http::Uri>() {
        Ok(uri)
            if matches!(uri.scheme_str(), Some("http" | "https"))
                && uri.authority().is_some()
                && matches!(uri.path(), "" | "/")
                && uri.query().is_none() => {}
        _ => errors.push(invalid(
            &format!("{path}.endpoint"),
            &store.endpoint,
            "must be http(s)://host[:port] without a path",
        )),
    }
    if !is_bucket_name(&store.bucket) {
        errors.push(invalid(
            &format!("{path}.bucket"),
            &store.bucket,
            "must be a bucket name: 3 to 63 lowercase letters, digits, '.' or '-', starting and ending with a letter or digit",
        ));
    }
    if let Err(error) = KeyLayout::new(store.path.as_deref().unwrap_or(""), store.server_name_or(name)) {
        let field = if error.to_string().starts_with("path") { "path" } else { "serverName" };
        errors.push(invalid(&format!("{path}.{field}"), error.to_string(), "must be segments of [A-Za-z0-9._-]"));
    }
    if let Some(region) = &store.region {
        if region.is_empty()
            || !region.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
        {
            errors.push(invalid(&format!("{path}.region"), region, "must be a region name such as us-east-1"));
        }
    }
    let secret = &store.credentials_secret;
    if !is_secret_name(&secret.name) {
        errors.push(invalid(&format!("{path}.credentialsSecret.name"), &secret.name, "must be a Secret name"));
    }
    for (field, key) in
        [("accessKeyIdKey", &secret.access_key_id_key), ("secretAccessKeyKey", &secret.secret_access_key_key)]
    {
        if let Some(key) = key.as_deref().filter(|key| !is_secret_key(key)) {
            errors.push(invalid(
                &format!("{path}.credentialsSecret.{field}"),
                key,
                "must be a Secret key ([-._a-zA-Z0-9]+)",
            ));
        }
    }
    if let Some(ca) = &store.ca_secret {
        if !is_secret_name(&ca.name) {
            errors.push(invalid(&format!("{path}.caSecret.name"), &ca.name, "must be a Secret name"));
        }
        if !is_secret_key(&ca.key) {
            errors.push(invalid(&format!("{path}.caSecret.key"), &ca.key, "must be a Secret key ([-._a-zA-Z0-9]+)"));
        }
    }
}

/// The recovery target a spec asks for, or the field error saying why it is not one.
pub fn recovery_target(recovery: &RecoverySpec) -> Result<RecoveryTarget, FieldError> {
    const PATH: &str = "spec.bootstrap.recovery.target";
    let Some(target) = &recovery.target else { return Ok(RecoveryTarget::Latest) };
    let set = [target.time.is_some(), target.lsn.is_some(), target.xid.is_some(), target.name.is_some()];
    if set.iter().filter(|set| **set).count() != 1 {
        return Err(invalid(
            PATH,
            "",
            "set exactly one of time, lsn, xid and name (or leave target out for the latest point)",
        ));
    }
    if let Some(time) = &target.time {
        let parsed = chrono::DateTime::parse_from_rfc3339(time).map_err(|error| {
            invalid(
                &format!("{PATH}.time"),
                time,
                format!("must be an RFC 3339 time such as 2026-12-01T00:30:00Z: {error}"),
            )
        })?;
        return Ok(RecoveryTarget::Time(parsed.with_timezone(&chrono::Utc)));
    }
    if let Some(lsn) = &target.lsn {
        return lsn
            .parse()
            .map(RecoveryTarget::Lsn)
            .map_err(|error: crate::lsn::ParseLsnError| invalid(&format!("{PATH}.lsn"), lsn, error.to_string()));
    }
    let explicit_backup = |field: &str| {
        if recovery.backup_id.is_none() {
            return Err(invalid(
                &format!("{PATH}.{field}"),
                "",
                "needs spec.bootstrap.recovery.backupId: the store cannot tell which backups precede a transaction id or restore point",
            ));
        }
        Ok(())
    };
    if let Some(xid) = target.xid {
        explicit_backup("xid")?;
        return u64::try_from(xid)
            .ok()
            .filter(|xid| *xid >= 3)
            .map(RecoveryTarget::Xid)
            .ok_or_else(|| invalid(&format!("{PATH}.xid"), xid, "must be a normal transaction id (3 or more)"));
    }
    let name = target.name.clone().unwrap_or_default();
    explicit_backup("name")?;
    if name.is_empty() || name.len() > 63 {
        return Err(invalid(&format!("{PATH}.name"), &name, "a restore point name has 1 to 63 bytes"));
    }
    Ok(RecoveryTarget::Name(name))
}

/// The rules of `spec.backup` and `spec.bootstrap.recovery` that need nothing but the object.
pub fn validate_backup_spec(name: &str, spec: &DatabaseServiceSpec, errors: &mut Vec<FieldError>) {
    if let Some(backup) = &spec.backup {
        validate_object_store("spec.backup.objectStore", &backup.object_store, name, errors);
        if let Some(schedule) = &backup.schedule {
            match schedule.parse::<Schedule>() {
                Err(error) => errors.push(invalid("spec.backup.schedule", schedule, error.to_string())),
                Ok(parsed) if parsed.next_after(chrono::Utc::now()).is_none() => {
                    errors.push(invalid("spec.backup.schedule", schedule, "never fires"));
                }
                Ok(_) => {}
            }
        }
        if let Some(retention) = &backup.retention_policy {
            if let Err(error) = retention.parse::<RetentionPolicy>() {
                errors.push(invalid("spec.backup.retentionPolicy", retention, error.to_string()));
            }
        }
        for (path, value, range) in [
            ("spec.backup.archiveTimeoutSeconds", backup.archive_timeout_seconds, ARCHIVE_TIMEOUT_SECONDS_RANGE),
            (
                "spec.backup.archiveFailureWarningSeconds",
                backup.archive_failure_warning_seconds,
                ARCHIVE_FAILURE_WARNING_SECONDS_RANGE,
            ),
        ] {
            if let Some(value) = value.filter(|value| !range.contains(value)) {
                errors.push(invalid(path, value, format!("must be between {} and {}", range.start(), range.end())));
            }
        }
        for (path, limit) in [
            ("spec.backup.successfulBackupsHistoryLimit", backup.successful_backups_history_limit),
            ("spec.backup.failedBackupsHistoryLimit", backup.failed_backups_history_limit),
        ] {
            if let Some(limit) = limit.filter(|limit| !(1..=100).contains(limit)) {
                errors.push(invalid(path, limit, "must be between 1 and 100"));
            }
        }
    }
    let Some(recovery) = spec.bootstrap.as_ref().and_then(|bootstrap| bootstrap.recovery.as_ref()) else { return };
    validate_object_store("spec.bootstrap.recovery.source", &recovery.source, name, errors);
    if let Some(id) = &recovery.backup_id {
        if KeyLayout::new("", "x").and_then(|layout| layout.base_backup_prefix(id)).is_err() {
            errors.push(invalid("spec.bootstrap.recovery.backupId", id, "must be a backup id ([A-Za-z0-9._-])"));
        }
    }
    if let Err(error) = recovery_target(recovery) {
        errors.push(error);
    }
    if let Some(backup) = &spec.backup {
        let own = &backup.object_store;
        let source = &recovery.source;
        if own.endpoint == source.endpoint
            && own.bucket == source.bucket
            && own.path.as_deref().unwrap_or("").trim_matches('/')
                == source.path.as_deref().unwrap_or("").trim_matches('/')
            && own.server_name_or(name) == source.server_name_or(name)
        {
            errors.push(FieldError {
                path: "spec.backup.objectStore".to_string(),
                kind: FieldErrorKind::Forbidden,
                detail: "archives into the recovery source: give the new database its own path or serverName"
                    .to_string(),
            });
        }
    }
}

/// The rules that need the source's backups, its recoverable window and whether the new
/// database's own archive path already holds WAL.
pub fn check_recovery_against_store(
    spec: &DatabaseServiceSpec,
    backups: &[BackupManifest],
    window: &RecoverableWindow,
    own_archive_is_empty: bool,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let Some(recovery) = spec.bootstrap.as_ref().and_then(|bootstrap| bootstrap.recovery.as_ref()) else {
        return errors;
    };
    let target = match recovery_target(recovery) {
        Ok(target) => target,
        Err(error) => return vec![error],
    };
    if let RecoveryTarget::Time(time) = target {
        // The store's times have whole seconds (S3's LastModified): a target within the second
        // of the last archived WAL may be covered by it, and only a certain miss is refused.
        let certainly_after = |last: &chrono::DateTime<chrono::Utc>| time >= *last + chrono::Duration::seconds(1);
        if let Some(last) = window.last_archived_wal_time.filter(certainly_after) {
            errors.push(invalid(
                "spec.bootstrap.recovery.target.time",
                time.to_rfc3339(),
                format!("is after the last archived WAL ({}): outside the recoverable window", last.to_rfc3339()),
            ));
        }
    }
    match select_backup(backups, &target, recovery.backup_id.as_deref()) {
        Err(error) => errors.push(invalid("spec.bootstrap.recovery", target.kind(), error.to_string())),
        Ok(backup) => {
            let wanted = crate::api::version::major_version(&spec.version);
            if wanted.is_some_and(|major| major != backup.postgres_major_version) {
                errors.push(invalid(
                    "spec.version",
                    &spec.version,
                    format!(
                        "backup {} is of PostgreSQL {}: recovery needs the same major version",
                        backup.id, backup.postgres_major_version
                    ),
                ));
            }
        }
    }
    if !own_archive_is_empty && spec.backup.is_some() && recovery.allow_non_empty_archive != Some(true) {
        errors.push(FieldError {
            path: "spec.backup.objectStore".to_string(),
            kind: FieldErrorKind::Forbidden,
            detail: "the archive path already holds WAL; set spec.bootstrap.recovery.allowNonEmptyArchive to share it"
                .to_string(),
        });
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::backup::{BackupSpec, BootstrapSpec, CredentialsSecret, RecoveryTargetSpec};

    fn store(path: &str) -> ObjectStore {
        ObjectStore {
            endpoint: "http://10.85.0.1:9000".to_string(),
            bucket: "backups".to_string(),
            path: Some(path.to_string()),
            credentials_secret: CredentialsSecret { name: "s3-credentials".to_string(), ..Default::default() },
            ..Default::default()
        }
    }

    fn spec_with(backup: Option<BackupSpec>, recovery: Option<RecoverySpec>) -> DatabaseServiceSpec {
        DatabaseServiceSpec {
            version: "15".to_string(),
            backup,
            bootstrap: recovery.map(|recovery| BootstrapSpec { recovery: Some(recovery), ..Default::default() }),
            ..Default::default()
        }
    }

    fn errors(spec: &DatabaseServiceSpec) -> Vec<String> {
        let mut errors = Vec::new();
        validate_backup_spec("orders", spec, &mut errors);
        errors.iter().map(ToString::to_string).collect()
    }

    fn recovery(target: RecoveryTargetSpec, backup_id: Option<&str>) -> RecoverySpec {
        RecoverySpec {
            source: store("prod"),
            backup_id: backup_id.map(str::to_string),
            target: Some(target),
            allow_non_empty_archive: None,
        }
    }

    #[test]
    fn a_complete_backup_spec_is_accepted() {
        let backup = BackupSpec {
            object_store: store("prod"),
            schedule: Some("0 1 * * *".to_string()),
            retention_policy: Some("30d".to_string()),
            archive_timeout_seconds: Some(60),
            archive_failure_warning_seconds: Some(600),
            successful_backups_history_limit: Some(5),
            failed_backups_history_limit: Some(3),
        };
        assert_eq!(errors(&spec_with(Some(backup), None)), Vec::<String>::new());
    }

    #[test]
    fn every_bad_backup_field_is_named() {
        let mut object_store = store("../escape");
        object_store.endpoint = "ftp://host/path".to_string();
        object_store.bucket = "No_Such".to_string();
        object_store.credentials_secret.name = "Bad Name".to_string();
        let backup = BackupSpec {
            object_store,
            schedule: Some("0 0 0 1 * *".to_string()),
            retention_policy: Some("30 days".to_string()),
            archive_timeout_seconds: Some(5),
            archive_failure_warning_seconds: Some(10),
            successful_backups_history_limit: Some(0),
            failed_backups_history_limit: None,
        };
        let found = errors(&spec_with(Some(backup), None));
        for path in [
            "spec.backup.objectStore.endpoint",
            "spec.backup.objectStore.bucket",
            "spec.backup.objectStore.path",
            "spec.backup.objectStore.credentialsSecret.name",
            "spec.backup.schedule",
            "spec.backup.retentionPolicy",
            "spec.backup.successfulBackupsHistoryLimit",
            "spec.backup.archiveTimeoutSeconds",
            "spec.backup.archiveFailureWarningSeconds",
        ] {
            assert!(found.iter().any(|error| error.starts_with(path)), "{path} not reported: {found:#?}");
        }
        assert_eq!(found.len(), 9, "{found:#?}");
    }

    #[test]
    fn a_schedule_that_never_fires_is_refused() {
        let backup = BackupSpec { object_store: store("p"), schedule: Some("0 0 30 2 *".into()), ..Default::default() };
        assert!(errors(&spec_with(Some(backup), None))[0].contains("never fires"));
    }

    #[test]
    fn recovery_targets_are_one_of_a_kind_and_well_formed() {
        let time = RecoveryTargetSpec { time: Some("2026-12-01T00:30:00Z".into()), ..Default::default() };
        assert!(errors(&spec_with(None, Some(recovery(time.clone(), None)))).is_empty());
        let lsn = RecoveryTargetSpec { lsn: Some("0/3000028".into()), ..Default::default() };
        assert!(errors(&spec_with(None, Some(recovery(lsn, None)))).is_empty());
        let two = RecoveryTargetSpec { lsn: Some("0/3000028".into()), ..time };
        assert!(errors(&spec_with(None, Some(recovery(two, None))))[0].contains("exactly one"));
        let bad_time = RecoveryTargetSpec { time: Some("yesterday".into()), ..Default::default() };
        assert!(errors(&spec_with(None, Some(recovery(bad_time, None))))[0]
            .starts_with("spec.bootstrap.recovery.target.time"));
        let bad_lsn = RecoveryTargetSpec { lsn: Some("12".into()), ..Default::default() };
        assert!(errors(&spec_with(None, Some(recovery(bad_lsn, None))))[0]
            .starts_with("spec.bootstrap.recovery.target.lsn"));
    }

    #[test]
    fn xid_and_name_targets_need_a_backup_id() {
        let xid = RecoveryTargetSpec { xid: Some(741), ..Default::default() };
        assert!(errors(&spec_with(None, Some(recovery(xid.clone(), None))))[0]
            .contains("needs spec.bootstrap.recovery.backupId"));
        assert!(errors(&spec_with(None, Some(recovery(xid, Some("20261201T000000Z"))))).is_empty());
        let name = RecoveryTargetSpec { name: Some("before-migration".into()), ..Default::default() };
        assert!(errors(&spec_with(None, Some(recovery(name.clone(), None))))[0].contains("backupId"));
        assert!(errors(&spec_with(None, Some(recovery(name, Some("20261201T000000Z"))))).is_empty());
    }

    #[test]
    fn a_recovered_database_may_not_archive_into_its_source() {
        let backup = BackupSpec { object_store: store("prod"), ..Default::default() };
        let found = errors(&spec_with(Some(backup), Some(recovery(RecoveryTargetSpec::default(), None))));
        assert!(found.iter().any(|error| error.contains("archives into the recovery source")), "{found:#?}");
        let elsewhere = BackupSpec { object_store: store("restored"), ..Default::default() };
        let latest = RecoverySpec { target: None, ..recovery(RecoveryTargetSpec::default(), None) };
        assert!(errors(&spec_with(Some(elsewhere), Some(latest))).is_empty());
    }

    #[test]
    fn targets_outside_the_window_or_of_another_major_version_are_refused() {
        let backups = vec![crate::store::selection::tests::backup("b", 10, 20)];
        let end = backups[0].end_time;
        let window = RecoverableWindow {
            first_recoverability_point: Some(end),
            last_archived_wal_time: Some(end + chrono::Duration::minutes(30)),
        };
        let at = |minutes: i64| RecoveryTargetSpec {
            time: Some((end + chrono::Duration::minutes(minutes)).to_rfc3339()),
            ..Default::default()
        };
        let check = |spec: &DatabaseServiceSpec, empty: bool| -> Vec<String> {
            check_recovery_against_store(spec, &backups, &window, empty).iter().map(ToString::to_string).collect()
        };
        assert!(check(&spec_with(None, Some(recovery(at(10), None))), true).is_empty());
        assert!(check(&spec_with(None, Some(recovery(at(-5), None))), true)[0].contains("no base backup ended before"));
        assert!(
            check(&spec_with(None, Some(recovery(at(40), None))), true)[0].contains("outside the recoverable window")
        );
        let mut newer = spec_with(None, Some(recovery(at(10), None)));
        newer.version = "16".to_string();
        assert!(check(&newer, true)[0].contains("recovery needs the same major version"));
        let archiving = spec_with(
            Some(BackupSpec { object_store: store("restored"), ..Default::default() }),
            Some(recovery(at(10), None)),
        );
        assert!(check(&archiving, false)[0].contains("allowNonEmptyArchive"));
        let mut allowed = archiving.clone();
        allowed.bootstrap.as_mut().unwrap().recovery.as_mut().unwrap().allow_non_empty_archive = Some(true);
        assert!(check(&allowed, false).is_empty());
    }
}
