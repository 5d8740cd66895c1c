//! `dbservice-operator status NAME` (also `kubectl dbservice status NAME` when the binary is
//! installed as `kubectl-dbservice`): one screen for people, in the spirit of `kubectl cnpg
//! status`. Instances (role, readiness, timeline, lag), the primary and any change in progress,
//! archiving, the last backups, the certificates, declared roles and databases, and the recent
//! ledger. Reading is one GET per object; rendering is pure and tested here.

use crate::api::database_service::{DatabaseService, DatabaseServiceStatus};
use crate::api::database_service_backup::{BackupPhase, DatabaseServiceBackup};
use crate::api::failover::InstanceStatus;
use crate::api::import::ImportStatus;
use crate::api::major_upgrade::MajorUpgradeStatus;
use crate::api::names::ChildNames;
use crate::api::roles::{DeclaredObjectsStatus, ObjectState};
use crate::operator::conditions::types::CONTINUOUS_ARCHIVING;
use crate::operator::database::build::tls::NOT_AFTER_ANNOTATION;
use crate::operator::ledger::{parse, LedgerEntry, LEDGER_KEY};
use std::fmt::Write;

/// Ledger entries shown (the newest).
pub const RECENT_ENTRIES: usize = 10;
/// Backups shown (the newest).
pub const RECENT_BACKUPS: usize = 3;

/// What the status view shows, read from the API.
#[derive(Clone, Debug)]
pub struct StatusView {
    /// The DatabaseService.
    pub database: DatabaseService,
    /// Its ledger, oldest first.
    pub ledger: Vec<LedgerEntry>,
    /// Its DatabaseServiceBackups.
    pub backups: Vec<DatabaseServiceBackup>,
    /// `notAfter` of the server certificate (Secret NAME-tls), when the operator issued it.
    pub server_certificate_not_after: Option<String>,
    /// `notAfter` of the database's CA (Secret NAME-ca).
    pub ca_not_after: Option<String>,
}

/// Reading what the view shows failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadStatusViewError {
    /// No such DatabaseService.
    #[error("no DatabaseService {name:?} in namespace {namespace:?}")]
    NotFound {
        /// Its name.
        name: String,
        /// Its namespace.
        namespace: String,
    },
    /// The API failed.
    #[error("read {what}: {source}")]
    Api {
        /// What was read.
        what: &'static str,
        /// Why it failed.
        source: kube::Error,
    },
}

/// Reads the view of `namespace/name` (the Secrets' metadata only: never a key or password).
pub async fn read(client: kube::Client, namespace: &str, name: &str) -> Result<StatusView, ReadStatusViewError> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::api::ListParams;
    let api = |what| move |source| ReadStatusViewError::Api { what, source };
    let databases: kube::Api<DatabaseService> = kube::Api::namespaced(client.clone(), namespace);
    let database = databases
        .get_opt(name)
        .await
        .map_err(api("the DatabaseService"))?
        .ok_or_else(|| ReadStatusViewError::NotFound { name: name.into(), namespace: namespace.into() })?;
    let config_maps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), namespace);
    let ledger = config_maps
        .get_opt(&ChildNames::ledger(name))
        .await
        .map_err(api("the ledger"))?
        .and_then(|config_map| config_map.data)
        .and_then(|data| data.get(LEDGER_KEY).map(|text| parse(text)))
        .unwrap_or_default();
    let backups: kube::Api<DatabaseServiceBackup> = kube::Api::namespaced(client.clone(), namespace);
    let backups = backups
        .list(&ListParams::default())
        .await
        .map_err(api("the backups"))?
        .items
        .into_iter()
        .filter(|backup| backup.spec.database_service == name)
        .collect();
    let secrets: kube::Api<Secret> = kube::Api::namespaced(client, namespace);
    let not_after = async |secret: String| -> Result<Option<String>, ReadStatusViewError> {
        let metadata = secrets.get_metadata_opt(&secret).await.map_err(api("a certificate Secret"))?;
        Ok(metadata.and_then(|metadata| metadata.metadata.annotations?.get(NOT_AFTER_ANNOTATION).cloned()))
    };
    Ok(StatusView {
        server_certificate_not_after: not_after(ChildNames::server_certificate(name)).await?,
        ca_not_after: not_after(ChildNames::certificate_authority(name)).await?,
        database,
        ledger,
        backups,
    })
}

fn or_dash(value: Option<impl ToString>) -> String {
    value.map(|value| value.to_string()).filter(|value| !value.is_empty()).unwrap_or_else(|| "-".into())
}

/// A size in bytes for people (B, KiB, MiB, GiB).
fn bytes(value: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut amount = value as f64;
    let mut unit = 0;
    while amount >= 1024.0 && unit < UNITS.len() - 1 {
        amount /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value} B")
    } else {
        format!("{amount:.1} {}", UNITS[unit])
    }
}

/// The view as text (no colour: it goes to terminals, logs and bug reports alike).
pub fn render(view: &StatusView) -> String {
    let database = &view.database;
    let status = database.status.clone().unwrap_or_default();
    let name = database.metadata.name.clone().unwrap_or_default();
    let mut out = String::new();
    render_summary(&mut out, database, &status);
    render_instances(&mut out, &status.instances);
    render_archiving_and_backups(&mut out, view, &status);
    render_certificates(&mut out, view, &name);
    if let Some(declared) = &status.declared {
        render_declared(&mut out, declared);
    }
    if let Some(import) = &status.import {
        render_import(&mut out, import);
    }
    if let Some(upgrade) = &status.major_upgrade {
        render_major_upgrade(&mut out, upgrade);
    }
    render_conditions(&mut out, &status);
    render_recent_ledger(&mut out, &view.ledger);
    out
}

/// The size in force: spec.storageSize, or what spec.storageGrowth grew it to (and its limit).
fn storage_summary(database: &DatabaseService, status: &DatabaseServiceStatus) -> String {
    let spec = &database.spec.storage_size;
    let grown = status.storage.as_ref().and_then(|storage| storage.grown_to.as_deref());
    let limit = database.spec.storage_growth.as_ref().map(|growth| growth.limit.as_str());
    let at_limit = status.storage.as_ref().and_then(|storage| storage.at_limit) == Some(true);
    match (grown.filter(|grown| grown != spec), limit) {
        (Some(grown), Some(limit)) if at_limit => format!("{grown} (grown from {spec}; at its limit {limit})"),
        (Some(grown), Some(limit)) => format!("{grown} (grown from {spec}, limit {limit})"),
        (Some(grown), None) => format!("{grown} (grown from {spec})"),
        (None, Some(limit)) => format!("{spec} (grows up to {limit})"),
        (None, None) => spec.clone(),
    }
}

/// The heading: phase, readiness, versions, the primary and any change of primary in progress.
fn render_summary(out: &mut String, database: &DatabaseService, status: &DatabaseServiceStatus) {
    let name = database.metadata.name.clone().unwrap_or_default();
    let namespace = database.metadata.namespace.clone().unwrap_or_default();
    let _ = writeln!(out, "DatabaseService {namespace}/{name}");
    let _ = writeln!(
        out,
        "  phase: {}   ready: {}/{}   version: {} (spec {})   storage: {}",
        or_dash(status.phase),
        status.ready_replicas,
        database.spec.replicas_or_default(),
        or_dash(status.current_version.as_deref()),
        database.spec.version,
        storage_summary(database, status),
    );
    let failover = &status.failover;
    let _ = writeln!(
        out,
        "  primary: {}   timeline: {}",
        or_dash(failover.current_primary.as_deref()),
        or_dash(failover.timeline),
    );
    if failover.target_primary != failover.current_primary {
        let _ = writeln!(out, "  changing primary to: {}", or_dash(failover.target_primary.as_deref()));
    }
    if let Some(transition) = &failover.transition {
        let _ = writeln!(out, "  in progress: {:?} since {}", transition.kind, transition.started_at);
    }
}

/// One line per reported instance.
fn render_instances(out: &mut String, instances: &[InstanceStatus]) {
    let _ = writeln!(out, "\nInstances");
    if instances.is_empty() {
        let _ = writeln!(out, "  none reported yet");
        return;
    }
    let _ = writeln!(
        out,
        "  {:<24} {:<8} {:<6} {:<9} {:<8} {:<12} PENDING RESTART",
        "NAME", "ROLE", "READY", "STREAMING", "TIMELINE", "LAG"
    );
    for instance in instances {
        let _ = writeln!(
            out,
            "  {:<24} {:<8} {:<6} {:<9} {:<8} {:<12} {}",
            instance.name,
            instance.role,
            instance.ready,
            if instance.role == "standby" { instance.streaming.to_string() } else { "-".into() },
            or_dash(instance.timeline),
            or_dash(instance.lag_bytes.map(bytes)),
            if instance.pending_restart.is_empty() { "-".into() } else { instance.pending_restart.join(",") },
        );
    }
}

/// Continuous archiving, the recovery window and the newest backups.
fn render_archiving_and_backups(out: &mut String, view: &StatusView, status: &DatabaseServiceStatus) {
    let _ = writeln!(out, "\nArchiving and backups");
    match status.conditions.iter().find(|condition| condition.type_ == CONTINUOUS_ARCHIVING) {
        Some(condition) => {
            let _ = writeln!(out, "  archiving: {} ({}) {}", condition.status, condition.reason, condition.message);
        }
        None if view.database.spec.backup.is_some() => {
            let _ = writeln!(out, "  archiving: not reported yet");
        }
        None => {
            let _ = writeln!(out, "  archiving: off (no spec.backup)");
        }
    }
    let mut backups: Vec<&DatabaseServiceBackup> = view.backups.iter().collect();
    backups.sort_by_key(|backup| backup.metadata.creation_timestamp.clone());
    let completed: Vec<&&DatabaseServiceBackup> = backups
        .iter()
        .filter(|backup| backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Completed))
        .collect();
    if let Some(oldest) = completed.first().and_then(|backup| backup.status.as_ref()?.end_time.clone()) {
        let _ =
            writeln!(out, "  recoverable from: {oldest} (the oldest completed backup's end) to the last archived WAL");
    }
    if backups.is_empty() {
        let _ = writeln!(out, "  backups: none");
    }
    for backup in backups.iter().rev().take(RECENT_BACKUPS) {
        let backup_status = backup.status.clone().unwrap_or_default();
        let _ = writeln!(
            out,
            "  backup {:<28} {:<9} id {:<24} ended {}",
            backup.metadata.name.as_deref().unwrap_or_default(),
            or_dash(backup_status.phase.map(|phase| format!("{phase:?}"))),
            or_dash(backup_status.backup_id),
            or_dash(backup_status.end_time),
        );
    }
}

/// The server certificate (the user's or the operator's) and the CA's expiry.
fn render_certificates(out: &mut String, view: &StatusView, name: &str) {
    let _ = writeln!(out, "\nCertificates");
    match (&view.database.spec.tls, &view.server_certificate_not_after) {
        (Some(tls), _) if tls.server_certificate_secret.is_some() => {
            let _ = writeln!(
                out,
                "  server: the user's Secret {}",
                tls.server_certificate_secret.as_deref().unwrap_or_default()
            );
        }
        (_, not_after) => {
            let _ = writeln!(
                out,
                "  server ({}): expires {}",
                ChildNames::server_certificate(name),
                or_dash(not_after.as_deref())
            );
        }
    }
    let _ = writeln!(
        out,
        "  CA ({}): expires {}",
        ChildNames::certificate_authority(name),
        or_dash(view.ca_not_after.as_deref())
    );
}

/// Declared roles and databases with their state.
fn render_declared(out: &mut String, declared: &DeclaredObjectsStatus) {
    let _ = writeln!(out, "\nRoles and databases");
    for (kind, objects) in [("role", &declared.roles), ("database", &declared.databases)] {
        for object in objects {
            let state = match object.state {
                ObjectState::Present => "present",
                ObjectState::Absent => "absent",
                ObjectState::Failed => "FAILED",
            };
            let _ = writeln!(
                out,
                "  {kind:<8} {:<24} {state} {}",
                object.name,
                object.message.as_deref().unwrap_or_default()
            );
        }
    }
}

/// The import's phase, per-database durations and last error.
fn render_import(out: &mut String, import: &ImportStatus) {
    let _ = writeln!(
        out,
        "\nImport: {:?} after {} attempt(s) from PostgreSQL {}",
        import.phase,
        import.attempts,
        or_dash(import.source_version.as_deref())
    );
    for database in &import.databases {
        let _ = writeln!(out, "  database {:<24} {:.1} s", database.name, database.milliseconds as f64 / 1000.0);
    }
    if let Some(message) = &import.message {
        let _ = writeln!(out, "  last error: {message}");
    }
}

/// The major upgrade's versions, phase, downtime and step durations.
fn render_major_upgrade(out: &mut String, upgrade: &MajorUpgradeStatus) {
    let downtime = upgrade.downtime_milliseconds.map(|milliseconds| format!("{:.1} s", milliseconds as f64 / 1000.0));
    let _ = writeln!(
        out,
        "\nMajor upgrade: {} to {} {:?} (primary {}, down {}, statistics {})",
        upgrade.from_version,
        upgrade.to_version,
        upgrade.phase,
        upgrade.primary,
        or_dash(downtime.as_deref()),
        or_dash(upgrade.analyze.as_deref())
    );
    for step in &upgrade.steps {
        let _ = writeln!(out, "  {:<32} {:.1} s", step.name, step.milliseconds as f64 / 1000.0);
    }
    if let Some(message) = &upgrade.message {
        let _ = writeln!(out, "  {message}");
    }
}

/// The conditions other than archiving (shown with the backups).
fn render_conditions(out: &mut String, status: &DatabaseServiceStatus) {
    let conditions: Vec<_> =
        status.conditions.iter().filter(|condition| condition.type_ != CONTINUOUS_ARCHIVING).collect();
    if conditions.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nConditions");
    for condition in conditions {
        let _ = writeln!(
            out,
            "  {:<17} {:<5} {:<26} {}",
            condition.type_, condition.status, condition.reason, condition.message
        );
    }
}

/// The newest ledger entries, oldest first.
fn render_recent_ledger(out: &mut String, ledger: &[LedgerEntry]) {
    let _ = writeln!(out, "\nRecent ledger");
    let start = ledger.len().saturating_sub(RECENT_ENTRIES);
    if ledger.is_empty() {
        let _ = writeln!(out, "  empty");
    }
    for entry in &ledger[start..] {
        let _ = writeln!(out, "  {} {:<16} {}", entry.time, entry.action, entry.outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::database_service::StorageStatus;
    use crate::api::failover::{FailoverStatus, InstanceStatus};
    use crate::api::roles::{DeclaredObjectsStatus, ObjectStatus};

    fn database() -> DatabaseService {
        let mut database: DatabaseService = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"version": "15", "storageSize": "10Gi", "databaseName": "app", "username": "app_user", "replicas": 2},
        }))
        .unwrap();
        database.status = Some(crate::api::database_service::DatabaseServiceStatus {
            ready_replicas: 2,
            current_version: Some("15".into()),
            failover: FailoverStatus {
                current_primary: Some("orders-1".into()),
                target_primary: Some("orders-1".into()),
                timeline: Some(3),
                ..Default::default()
            },
            instances: vec![
                InstanceStatus {
                    name: "orders-0".into(),
                    role: "standby".into(),
                    ready: true,
                    streaming: true,
                    lag_bytes: Some(3 * 1024 * 1024),
                    timeline: Some(3),
                    ..Default::default()
                },
                InstanceStatus {
                    name: "orders-1".into(),
                    role: "primary".into(),
                    ready: true,
                    timeline: Some(3),
                    ..Default::default()
                },
            ],
            declared: Some(DeclaredObjectsStatus {
                roles: vec![ObjectStatus {
                    name: "reporting".into(),
                    state: ObjectState::Failed,
                    message: Some("Secret \"x\" has no key".into()),
                }],
                databases: vec![],
                declarations: None,
            }),
            ..Default::default()
        });
        database
    }

    #[test]
    fn the_view_shows_instances_primary_lag_certificates_roles_and_the_recent_ledger() {
        let ledger = (0..15).map(|index| LedgerEntry::now(1, &format!("Action{index}"), "", "", "done")).collect();
        let view = StatusView {
            database: database(),
            ledger,
            backups: Vec::new(),
            server_certificate_not_after: Some("2027-03-01T00:00:00Z".into()),
            ca_not_after: None,
        };
        let text = render(&view);
        assert!(text.contains("DatabaseService shop/orders"), "{text}");
        assert!(text.contains("primary: orders-1   timeline: 3"), "{text}");
        assert!(text.contains("ready: 2/2"), "{text}");
        assert!(
            text.lines().any(|line| line.contains("orders-0") && line.contains("standby") && line.contains("3.0 MiB")),
            "{text}"
        );
        assert!(text.contains("archiving: off (no spec.backup)"), "{text}");
        assert!(text.contains("server (orders-tls): expires 2027-03-01T00:00:00Z"), "{text}");
        assert!(text.contains("role     reporting") && text.contains("FAILED"), "{text}");
        assert!(text.contains("Action14") && text.contains("Action5") && !text.contains("Action4 "), "{text}");
    }

    #[test]
    fn the_storage_says_what_growth_made_of_it() {
        let mut database = database();
        assert!(render_view(&database).contains("storage: 10Gi\n"));
        database.spec.storage_growth = serde_json::from_value(serde_json::json!({"limit": "40Gi"})).unwrap();
        assert!(render_view(&database).contains("storage: 10Gi (grows up to 40Gi)"));
        let status = database.status.as_mut().unwrap();
        status.storage = Some(StorageStatus { grown_to: Some("15Gi".into()), ..StorageStatus::default() });
        assert!(render_view(&database).contains("storage: 15Gi (grown from 10Gi, limit 40Gi)"));
        database.status.as_mut().unwrap().storage.as_mut().unwrap().at_limit = Some(true);
        assert!(render_view(&database).contains("storage: 15Gi (grown from 10Gi; at its limit 40Gi)"));
    }

    fn render_view(database: &DatabaseService) -> String {
        let view = StatusView {
            database: database.clone(),
            ledger: Vec::new(),
            backups: Vec::new(),
            server_certificate_not_after: None,
            ca_not_after: None,
        };
        render(&view)
    }

    #[test]
    fn an_empty_status_still_renders() {
        let mut database = database();
        database.status = None;
        let view = StatusView {
            database,
            ledger: Vec::new(),
            backups: Vec::new(),
            server_certificate_not_after: None,
            ca_not_after: None,
        };
        let text = render(&view);
        assert!(text.contains("phase: -") && text.contains("none reported yet") && text.contains("empty"), "{text}");
    }
}
