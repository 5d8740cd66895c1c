//! What the `kubectl dbservice` verbs write, as pure functions: each verb writes exactly what the
//! documented annotation or object does, so that GitOps users and plugin users see the same ledger.

use crate::api::database_service::DatabaseService;
use crate::api::database_service_backup::{BackupTarget, DatabaseServiceBackup, DatabaseServiceBackupSpec};
use crate::api::failover::{FENCED_ANNOTATION, SWITCHOVER_ANNOTATION};
use kube::ResourceExt;
use serde_json::{json, Value};

/// Why a verb cannot be carried out, found before anything is written.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerbError {
    /// The instance named is not one of the database's.
    #[error("{instance} is not an instance of DatabaseService {database} (its instances are {instances})")]
    NoSuchInstance { instance: String, database: String, instances: String },
    /// A switchover to the instance that already is the primary.
    #[error("{0} is already the primary")]
    AlreadyPrimary(String),
    /// A backup of a database without `spec.backup`.
    #[error("DatabaseService {0} has no spec.backup: name an object store before taking a backup")]
    NoObjectStore(String),
    /// A verb that needs running instances, on a hibernated database.
    #[error("DatabaseService {0} is hibernated: no instance runs; wake it first (kubectl dbservice wake {0})")]
    Hibernated(String),
}

/// Refuses a verb that needs running instances while the database is hibernated.
fn awake(database: &DatabaseService) -> Result<(), VerbError> {
    if database.spec.is_hibernated() {
        return Err(VerbError::Hibernated(database.name_any()));
    }
    Ok(())
}

/// The merge patch of `restart` or `reload`: annotation `key` set to `value` (the plugin writes
/// the time; any new value asks again).
pub fn request_patch(database: &DatabaseService, key: &str, value: &str) -> Result<Value, VerbError> {
    awake(database)?;
    Ok(json!({"metadata": {"annotations": {key: value}}}))
}

/// The merge patch of `hibernate` (`true`) or `wake` (`false`): `spec.hibernated`.
pub fn hibernation_patch(hibernated: bool) -> Value {
    json!({"spec": {"hibernated": hibernated}})
}

/// The instance `name` of `database`: a pod name (`NAME-1`) or an ordinal (`1`).
pub fn instance_of(database: &DatabaseService, name: &str) -> Result<String, VerbError> {
    let database_name = database.name_any();
    let replicas = database.spec.replicas_or_default();
    let instances: Vec<String> = (0..replicas).map(|ordinal| format!("{database_name}-{ordinal}")).collect();
    let pod = if name.chars().all(|c| c.is_ascii_digit()) { format!("{database_name}-{name}") } else { name.into() };
    if instances.contains(&pod) {
        Ok(pod)
    } else {
        Err(VerbError::NoSuchInstance {
            instance: name.into(),
            database: database_name,
            instances: instances.join(", "),
        })
    }
}

/// The merge patch of `switchover NAME INSTANCE`: the switchover annotation, as
/// `kubectl annotate dbs NAME dbservice.dev/switchover-to=INSTANCE` writes it.
pub fn switchover_patch(database: &DatabaseService, target: &str) -> Result<Value, VerbError> {
    awake(database)?;
    let target = instance_of(database, target)?;
    let primary = database.status.as_ref().and_then(|status| status.failover.current_primary.clone());
    if primary.as_deref() == Some(target.as_str()) {
        return Err(VerbError::AlreadyPrimary(target));
    }
    Ok(json!({"metadata": {"annotations": {SWITCHOVER_ANNOTATION: target}}}))
}

/// The merge patch of `fence` (`fenced`) or `unfence`: the fenced-instances annotation with
/// `instance` added or removed, the others kept in order; the annotation goes when none is left.
pub fn fence_patch(database: &DatabaseService, instance: &str, fenced: bool) -> Result<Value, VerbError> {
    awake(database)?;
    let instance = instance_of(database, instance)?;
    let mut list = crate::api::database_service::fenced_instances(database);
    list.retain(|name| name != &instance);
    if fenced {
        list.push(instance);
    }
    let value = if list.is_empty() { Value::Null } else { Value::String(list.join(",")) };
    Ok(json!({"metadata": {"annotations": {FENCED_ANNOTATION: value}}}))
}

/// The DatabaseServiceBackup `backup NAME` creates: named `name`, or after the database and the
/// time (`NAME-YYYYMMDDHHMMSS`).
pub fn backup_object(
    database: &DatabaseService,
    name: Option<&str>,
    target: Option<BackupTarget>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<DatabaseServiceBackup, VerbError> {
    let database_name = database.name_any();
    if database.spec.backup.is_none() {
        return Err(VerbError::NoObjectStore(database_name));
    }
    awake(database)?;
    let name = name.map(String::from).unwrap_or_else(|| format!("{database_name}-{}", now.format("%Y%m%d%H%M%S")));
    let mut backup =
        DatabaseServiceBackup::new(&name, DatabaseServiceBackupSpec { database_service: database_name, target });
    backup.metadata.namespace = database.namespace();
    Ok(backup)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database(replicas: i32, annotations: &[(&str, &str)]) -> DatabaseService {
        let mut database: DatabaseService = serde_json::from_value(json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"version": "17", "storageSize": "1Gi", "databaseName": "app", "username": "app_user", "replicas": replicas},
            "status": {"currentPrimary": "orders-0"}
        }))
        .unwrap();
        database.metadata.annotations =
            Some(annotations.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect());
        database
    }

    #[test]
    fn a_switchover_names_an_instance_by_pod_or_ordinal_and_not_the_primary() {
        let orders = database(3, &[]);
        let by_ordinal = switchover_patch(&orders, "2").unwrap();
        assert_eq!(by_ordinal["metadata"]["annotations"][SWITCHOVER_ANNOTATION], "orders-2");
        assert_eq!(
            switchover_patch(&orders, "orders-1").unwrap(),
            json!({"metadata": {"annotations": {SWITCHOVER_ANNOTATION: "orders-1"}}})
        );
        assert_eq!(switchover_patch(&orders, "orders-0"), Err(VerbError::AlreadyPrimary("orders-0".into())));
        let error = switchover_patch(&orders, "orders-3").unwrap_err().to_string();
        assert_eq!(
            error,
            "orders-3 is not an instance of DatabaseService orders (its instances are orders-0, orders-1, orders-2)"
        );
    }

    #[test]
    fn fencing_adds_and_unfencing_removes_one_instance_keeping_the_others() {
        let orders = database(3, &[(FENCED_ANNOTATION, "orders-2")]);
        let fenced = fence_patch(&orders, "orders-0", true).unwrap();
        assert_eq!(fenced["metadata"]["annotations"][FENCED_ANNOTATION], "orders-2,orders-0");
        let again = fence_patch(&orders, "orders-2", true).unwrap();
        assert_eq!(again["metadata"]["annotations"][FENCED_ANNOTATION], "orders-2", "fencing twice is once");
        let unfenced = fence_patch(&orders, "orders-2", false).unwrap();
        assert_eq!(unfenced["metadata"]["annotations"][FENCED_ANNOTATION], Value::Null, "the annotation goes");
        assert!(fence_patch(&orders, "other-0", true).is_err());
    }

    #[test]
    fn a_hibernated_database_refuses_the_verbs_that_need_instances() {
        let mut sleeping = database(2, &[]);
        sleeping.spec.hibernated = Some(true);
        let refused = Err(VerbError::Hibernated("orders".into()));
        assert_eq!(switchover_patch(&sleeping, "1"), refused);
        assert_eq!(fence_patch(&sleeping, "1", true), refused);
        sleeping.spec.backup = Some(serde_json::from_value(json!({"objectStore": {"bucket": "b", "endpoint": "https://s3.example", "credentialsSecret": {"name": "s3"}}})).unwrap());
        assert_eq!(backup_object(&sleeping, None, None, chrono::Utc::now()).map(drop), refused.clone().map(drop));
        assert_eq!(hibernation_patch(false), json!({"spec": {"hibernated": false}}));
        assert_eq!(request_patch(&sleeping, "k", "v"), refused);
        let awake = database(2, &[]);
        assert_eq!(request_patch(&awake, "k", "v"), Ok(json!({"metadata": {"annotations": {"k": "v"}}})));
    }

    #[test]
    fn a_backup_needs_an_object_store_and_is_named_after_the_database_and_time() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-07T12:30:05Z").unwrap().with_timezone(&chrono::Utc);
        let orders = database(2, &[]);
        assert_eq!(backup_object(&orders, None, None, now).unwrap_err(), VerbError::NoObjectStore("orders".into()));
        let mut stored = orders.clone();
        stored.spec.backup = Some(
            serde_json::from_value(json!({"objectStore": {"bucket": "b", "endpoint": "https://s3.example", "credentialsSecret": {"name": "s3"}}}))
                .unwrap(),
        );
        let backup = backup_object(&stored, None, Some(BackupTarget::Primary), now).unwrap();
        assert_eq!(backup.name_any(), "orders-20261207123005");
        assert_eq!(backup.namespace().as_deref(), Some("shop"));
        assert_eq!(
            (backup.spec.database_service.as_str(), backup.spec.target),
            ("orders", Some(BackupTarget::Primary))
        );
        assert_eq!(backup_object(&stored, Some("before-migration"), None, now).unwrap().name_any(), "before-migration");
    }
}
