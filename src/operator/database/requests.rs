//! Restart and reload on request (`kubectl dbservice restart | reload`, or the annotations they
//! write): a new value of `dbservice.dev/restart-requested-at` restarts every instance the way a
//! rolling update does (standbys first, one at a time, then a switchover, then the former
//! primary); a new value of `dbservice.dev/reload-requested-at` is carried out by each agent, and
//! told once all have. Pure.

use crate::api::database_service::{DatabaseService, DatabaseServiceStatus};
use crate::api::failover::{RELOAD_ANNOTATION, RESTART_ANNOTATION};
use crate::operator::database::failover::pass::report_of;
use crate::operator::journal::Journal;
use crate::operator::ledger::LedgerEntry;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use std::sync::Arc;

/// A new restart request: a new restart stamp in the pod template (which the rolling update
/// carries out) and a ledger entry; true when the workload changes for it.
pub fn decide_requested_restart(
    database: &DatabaseService,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    now: DateTime<Utc>,
) -> bool {
    let Some(requested) = database.annotations().get(RESTART_ANNOTATION) else { return false };
    if status.restart_requested.as_ref() == Some(requested) {
        return false;
    }
    status.restart_requested = Some(requested.clone());
    status.last_restart_at = Some(crate::operator::journal::rfc3339(now));
    let generation = database.metadata.generation.unwrap_or(0);
    let how = "standbys first, then a switchover, then the former primary";
    let entry = LedgerEntry::at(now, generation, "RestartRequested", "", requested.clone(), how);
    journal.record(false, "RestartRequested", format!("rolling restart requested ({requested}): {how}"), Some(entry));
    true
}

/// A reload request every present instance has carried out: recorded once.
pub fn decide_requested_reload(
    database: &DatabaseService,
    pods: &[Arc<Pod>],
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    now: DateTime<Utc>,
) {
    let Some(requested) = database.annotations().get(RELOAD_ANNOTATION) else { return };
    if status.reloaded.as_ref() == Some(requested) || pods.is_empty() {
        return;
    }
    let all = pods.iter().all(|pod| report_of(pod).is_some_and(|report| report.reloaded.as_ref() == Some(requested)));
    if !all {
        return;
    }
    status.reloaded = Some(requested.clone());
    let generation = database.metadata.generation.unwrap_or(0);
    let note = format!("{} instances reloaded their configuration ({requested})", pods.len());
    let entry = LedgerEntry::at(now, generation, "Reloaded", "", requested.clone(), note.clone());
    journal.record(false, "Reloaded", note, Some(entry));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::failover::{InstanceReport, INSTANCE_REPORT_ANNOTATION};

    fn database(annotations: &[(&str, &str)]) -> DatabaseService {
        let mut database: DatabaseService = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
            "metadata": {"name": "db", "namespace": "ns", "generation": 3},
            "spec": {"version": "16.4", "storageSize": "1Gi", "databaseName": "app", "username": "app_user"}
        }))
        .unwrap();
        database.metadata.annotations =
            Some(annotations.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect());
        database
    }

    fn pod(name: &str, reloaded: Option<&str>) -> Arc<Pod> {
        let mut report: InstanceReport = serde_json::from_value(serde_json::json!({
            "role": "standby", "timeline": 1, "walReceiver": true, "postgresReady": true, "fenced": false, "diskFull": false
        }))
        .unwrap();
        report.reloaded = reloaded.map(String::from);
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.annotations =
            Some([(INSTANCE_REPORT_ANNOTATION.to_string(), serde_json::to_string(&report).unwrap())].into());
        Arc::new(pod)
    }

    #[test]
    fn a_restart_request_stamps_the_template_once_per_value() {
        let now = Utc::now();
        let requested = database(&[(RESTART_ANNOTATION, "2026-12-07T16:00:00Z")]);
        let mut status = DatabaseServiceStatus::default();
        let mut journal = Journal::default();
        assert!(decide_requested_restart(&requested, &mut status, &mut journal, now));
        assert!(status.last_restart_at.is_some());
        assert_eq!(journal.reasons(), ["RestartRequested"]);
        let mut again = Journal::default();
        assert!(!decide_requested_restart(&requested, &mut status, &mut again, now), "carried out already");
        assert!(again.reasons().is_empty());
        assert!(!decide_requested_restart(&database(&[]), &mut status, &mut again, now), "no request");
    }

    #[test]
    fn a_reload_is_told_once_every_instance_carried_it_out() {
        let now = Utc::now();
        let requested = database(&[(RELOAD_ANNOTATION, "r1")]);
        let mut status = DatabaseServiceStatus::default();
        let mut journal = Journal::default();
        let half = [pod("db-0", Some("r1")), pod("db-1", None)];
        decide_requested_reload(&requested, &half, &mut status, &mut journal, now);
        assert_eq!((status.reloaded.as_deref(), journal.reasons().len()), (None, 0), "one has not");
        let both = [pod("db-0", Some("r1")), pod("db-1", Some("r1"))];
        decide_requested_reload(&requested, &both, &mut status, &mut journal, now);
        assert_eq!((status.reloaded.as_deref(), journal.reasons()), (Some("r1"), vec!["Reloaded"]));
        decide_requested_reload(&requested, &both, &mut status, &mut journal, now);
        assert_eq!(journal.reasons().len(), 1, "told once");
    }
}
