//! Table tests of the pure decide step: no cluster, no clock. Each case is a DatabaseService, its
//! status and the observed children at a fixed time, and what decide must conclude.

use crate::api::database_service::{DatabaseService, DatabaseServiceStatus, Phase};
use crate::operator::caches::Compact;
use crate::operator::database::build::{self, WorkloadInputs};
use crate::operator::database::decide::{decide, DecideInput, Decision, PodLabel};
use crate::operator::database::observe::Observed;
use crate::operator::database::settings::ControllerSettings;
use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::core::PartialObjectMeta;
use serde_json::json;
use std::sync::Arc;

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-06-01T12:00:00Z").unwrap().with_timezone(&Utc)
}

fn ago(seconds: i64) -> String {
    (now() - Duration::seconds(seconds)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn database(replicas: i32, status: Option<DatabaseServiceStatus>) -> DatabaseService {
    let mut database: DatabaseService = serde_json::from_value(json!({
        "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
        "metadata": {"name": "db", "namespace": "ns", "uid": "uid-1", "generation": 1, "creationTimestamp": ago(3600)},
        "spec": {"version": "16.4", "storageSize": "1Gi", "databaseName": "app", "username": "app_user", "replicas": replicas}
    }))
    .unwrap();
    database.status = status;
    database
}

/// A status of a database that ran `version` and was reconciled at generation 1.
fn running_status(version: &str) -> DatabaseServiceStatus {
    DatabaseServiceStatus {
        observed_generation: Some(1),
        current_version: Some(version.into()),
        last_stable_version: Some(version.into()),
        last_stable_image: Some(format!("postgres:{version}")),
        phase: Some(Phase::Running),
        ..Default::default()
    }
}

#[derive(Clone, Copy)]
enum PodState {
    Ready,
    CrashLooping,
    NotReadyFor(i64),
    UnschedulableFor(i64),
}

fn pod(ordinal: i32, image: &str, state: PodState) -> Arc<Pod> {
    let (ready, since, scheduled, waiting) = match state {
        PodState::Ready => ("True", 3600, "True", None),
        PodState::CrashLooping => ("False", 5, "True", Some("CrashLoopBackOff")),
        PodState::NotReadyFor(seconds) => ("False", seconds, "True", None),
        PodState::UnschedulableFor(seconds) => ("False", seconds, "False", None),
    };
    let mut scheduled_condition =
        json!({"type": "PodScheduled", "status": scheduled, "lastTransitionTime": ago(since)});
    if scheduled == "False" {
        scheduled_condition["reason"] = json!("Unschedulable");
    }
    let state = waiting.map_or(json!({"running": {}}), |reason| json!({"waiting": {"reason": reason}}));
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": format!("db-{ordinal}"), "namespace": "ns", "uid": format!("pod-{ordinal}"),
                         "resourceVersion": "10", "creationTimestamp": ago(3600),
                         "labels": {"dbservice.dev/role": if ordinal == 0 { "primary" } else { "standby" },
                                    "app.kubernetes.io/managed-by": "dbservice-operator",
                                    "controller-revision-hash": "r1"}},
            "spec": {"containers": [{"name": "postgres", "image": image}]},
            "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": ago(since)}, scheduled_condition],
                       "containerStatuses": [{"name": "postgres", "ready": ready == "True", "restartCount": 0,
                                              "image": image, "imageID": "", "state": state}]}
        }))
        .unwrap(),
    )
}

/// The StatefulSet the operator would have applied, fully rolled out on `ready` pods.
fn stateful_set(
    database: &DatabaseService,
    image: &str,
    replicas: i32,
    restarted_at: Option<String>,
) -> Arc<Compact<StatefulSet>> {
    let inputs = WorkloadInputs {
        image: image.into(),
        replicas,
        restarted_at,
        claim_template_size: "1Gi".into(),
        instance_image: None,
    };
    let mut stateful_set = build::stateful_set(database, &inputs);
    stateful_set.metadata.generation = Some(1);
    stateful_set.status = Some(
        serde_json::from_value(json!({"replicas": replicas, "readyReplicas": replicas, "observedGeneration": 1,
                                      "currentRevision": "r1", "updateRevision": "r1"}))
        .unwrap(),
    );
    Arc::new(Compact::from_object(&stateful_set))
}

fn owned_secret() -> Arc<PartialObjectMeta<Secret>> {
    Arc::new(
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": "db-credentials", "namespace": "ns",
            "labels": {"app.kubernetes.io/instance": "db", "app.kubernetes.io/managed-by": "dbservice-operator"},
            "ownerReferences": [{"apiVersion": "dbservice.dev/v1", "kind": "DatabaseService", "name": "db", "uid": "uid-1"}]}}))
        .unwrap(),
    )
}

fn claim(ordinal: i32, created_seconds_ago: i64, owned: bool) -> Arc<PersistentVolumeClaim> {
    let owners = if owned {
        json!([{"apiVersion": "dbservice.dev/v1", "kind": "DatabaseService", "name": "db", "uid": "uid-1"}])
    } else {
        json!([])
    };
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": format!("data-db-{ordinal}"), "namespace": "ns", "resourceVersion": "7",
                         "creationTimestamp": ago(created_seconds_ago), "ownerReferences": owners,
                         "labels": {"app.kubernetes.io/instance": "db", "app.kubernetes.io/managed-by": "dbservice-operator"}},
            "spec": {"resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound"}
        }))
        .unwrap(),
    )
}

fn run(database: &DatabaseService, observed: &Observed) -> Decision {
    decide(&DecideInput {
        database,
        observed,
        settings: &ControllerSettings::default(),
        now: now(),
        failover_timer_seen: None,
    })
}

fn condition<'a>(decision: &'a Decision, kind: &str) -> Option<(&'a str, &'a str)> {
    decision
        .status
        .conditions
        .iter()
        .find(|condition| condition.type_ == kind)
        .map(|condition| (condition.status.as_str(), condition.reason.as_str()))
}

fn steady(database: &DatabaseService, pods: Vec<Arc<Pod>>) -> Observed {
    let replicas = database.spec.replicas_or_default();
    let restarted_at = database.status.as_ref().and_then(|status| status.last_restart_at.clone());
    Observed {
        stateful_set: Some(stateful_set(database, "postgres:16.4", replicas, restarted_at)),
        credentials: Some(owned_secret()),
        claims: (0..replicas).map(|ordinal| claim(ordinal, 3500, true)).collect(),
        pods,
        ..Default::default()
    }
}

#[test]
fn a_new_database_is_provisioned_with_fresh_credentials() {
    let database = database(1, None);
    let decision = run(&database, &Observed::default());
    let workload = decision.workload.as_ref().expect("a workload to build");
    assert!(workload.create_credentials);
    assert_eq!((workload.inputs.image.as_str(), workload.inputs.replicas), ("postgres:16.4", 1));
    assert_eq!(decision.status.phase, Some(Phase::Provisioning));
    assert_eq!(condition(&decision, "Progressing"), Some(("True", "Provisioning")));
    assert_eq!(condition(&decision, "CredentialsReady"), Some(("True", "SecretCreated")));
    assert_eq!(decision.journal.entries[0].action, "Created");
    assert_eq!(decision.journal.reasons(), ["CredentialsCreated"]);
    assert_eq!(decision.requeue, Some(std::time::Duration::from_secs(5)));
}

#[test]
fn ready_pods_on_the_applied_template_make_the_phase_running() {
    let preferred =
        crate::api::synchronous::Durability { mode: crate::api::synchronous::DataDurability::Preferred, standbys: 1 };
    let database = database(
        2,
        Some(DatabaseServiceStatus { observed_generation: Some(1), durability: Some(preferred), ..Default::default() }),
    );
    let observed =
        steady(&database, vec![pod(0, "postgres:16.4", PodState::Ready), pod(1, "postgres:16.4", PodState::Ready)]);
    let decision = run(&database, &observed);
    assert_eq!(decision.status.phase, Some(Phase::Running));
    assert_eq!(condition(&decision, "Ready"), Some(("True", "AllInstancesReady")));
    assert_eq!(condition(&decision, "StorageReady"), Some(("True", "Bound")));
    assert_eq!(decision.status.ready_replicas, 2);
    assert_eq!(decision.status.last_stable_version.as_deref(), Some("16.4"));
    assert_eq!(decision.journal.reasons(), ["Ready"]);
    let workload = decision.workload.unwrap();
    assert!(!workload.create_credentials && workload.pod_labels.is_empty() && workload.claim_changes.is_empty());
    assert_eq!(decision.requeue, Some(std::time::Duration::from_secs(300)));
}

#[test]
fn a_converged_database_decides_nothing_new() {
    let first = run(
        &database(1, Some(running_status("16.4"))),
        &steady(&database(1, None), vec![pod(0, "postgres:16.4", PodState::Ready)]),
    );
    let again = database(1, Some(first.status.clone()));
    let second = run(&again, &steady(&again, vec![pod(0, "postgres:16.4", PodState::Ready)]));
    assert_eq!(second.status, first.status, "the same observation gives the same status: no write");
    assert!(second.journal.is_empty(), "{:?}", second.journal);
}

#[test]
fn restarts_back_off_and_give_up_to_failed_after_the_restart_limit() {
    // (restarts so far, seconds since the last restart, restart now?, phase)
    let cases = [
        (0, None, true, Phase::Updating),
        (1, Some(30), false, Phase::Updating), // backoff after one restart: 60 s
        (1, Some(60), true, Phase::Updating),
        (2, Some(100), false, Phase::Updating), // backoff after two: 120 s
        (3, Some(10), false, Phase::Failed),    // three failed restarts: Failed
    ];
    for (restarts, since, restart, phase) in cases {
        let status = DatabaseServiceStatus {
            restart_count: restarts,
            last_restart_at: since.map(ago),
            ..running_status("16.4")
        };
        let database = database(1, Some(status));
        let decision = run(&database, &steady(&database, vec![pod(0, "postgres:16.4", PodState::CrashLooping)]));
        let case = format!("{restarts} restarts, last {since:?} s ago");
        assert_eq!(decision.journal.reasons().contains(&"Restarted"), restart, "{case}");
        let expected_count = if restart { restarts + 1 } else { restarts };
        assert_eq!(decision.status.restart_count, expected_count, "{case}");
        if restart {
            let stamp = decision.workload.as_ref().unwrap().inputs.restarted_at.clone();
            assert_eq!(stamp, Some(ago(0)), "{case}: the restart goes through the template annotation");
        }
        assert_eq!(decision.status.phase, Some(phase), "{case}");
        assert_eq!(condition(&decision, "Ready"), Some(("False", "InstancesNotReady")), "{case}");
    }
}

#[test]
fn recovery_resets_the_restart_count() {
    let status = DatabaseServiceStatus { restart_count: 2, last_restart_at: Some(ago(500)), ..running_status("16.4") };
    let database = database(1, Some(status));
    let decision = run(&database, &steady(&database, vec![pod(0, "postgres:16.4", PodState::Ready)]));
    assert_eq!(decision.status.restart_count, 0);
    assert_eq!(decision.journal.reasons(), ["Recovered"]);
    assert_eq!(decision.status.phase, Some(Phase::Running));
}

#[test]
fn an_upgrade_unhealthy_past_the_deadline_rolls_back_to_the_last_stable_version() {
    // (seconds since the rollout started, rolled back?)
    for (started, rolled_back) in [(100, false), (300, true)] {
        let status = DatabaseServiceStatus { rollout_started_at: Some(ago(started)), ..running_status("16.3") };
        let database = database(1, Some(status));
        let mut observed = steady(&database, vec![pod(0, "postgres:16.4", PodState::NotReadyFor(started))]);
        observed.stateful_set = Some(stateful_set(&database, "postgres:16.4", 1, None));
        let decision = run(&database, &observed);
        let image = decision.workload.as_ref().unwrap().inputs.image.clone();
        if rolled_back {
            assert_eq!(image, "postgres:16.3");
            assert_eq!(condition(&decision, "RolledBack"), Some(("True", "ProgressDeadlineExceeded")));
            assert_eq!(decision.status.failed_version.as_deref(), Some("16.4"));
            assert_eq!(decision.status.phase, Some(Phase::RollingBack));
            assert!(decision.journal.entries.iter().any(|entry| entry.action == "RolledBack"));
        } else {
            assert_eq!(image, "postgres:16.4");
            assert_eq!(decision.status.phase, Some(Phase::Updating));
            assert_eq!(condition(&decision, "Progressing"), Some(("True", "RollingOut")));
        }
    }
}

#[test]
fn a_primary_above_an_unschedulable_standby_is_never_scaled_away() {
    // After a failover db-2 is the primary and db-1 cannot be scheduled: scaling to 1 would remove
    // db-2 (a StatefulSet scales down from the highest ordinal).
    let mut status = running_status("16.4");
    status.failover.current_primary = Some("db-2".into());
    status.failover.target_primary = Some("db-2".into());
    let database = database(3, Some(status));
    let pods = vec![
        pod(0, "postgres:16.4", PodState::Ready),
        pod(1, "postgres:16.4", PodState::UnschedulableFor(120)),
        pod(2, "postgres:16.4", PodState::Ready),
    ];
    let decision = run(&database, &steady(&database, pods));
    assert_eq!(decision.workload.as_ref().unwrap().inputs.replicas, 3);
    assert_eq!(decision.status.degraded_replicas, None);
    assert!(!decision.journal.reasons().contains(&"Degraded"), "{:?}", decision.journal.reasons());
}

#[test]
fn unschedulable_standbys_degrade_and_are_restored_after_the_probe_interval() {
    let database_running = database(3, Some(running_status("16.4")));
    let pods = vec![
        pod(0, "postgres:16.4", PodState::Ready),
        pod(1, "postgres:16.4", PodState::Ready),
        pod(2, "postgres:16.4", PodState::UnschedulableFor(120)),
    ];
    let degraded = run(&database_running, &steady(&database_running, pods));
    assert_eq!(degraded.workload.as_ref().unwrap().inputs.replicas, 2);
    assert_eq!(degraded.status.degraded_replicas, Some(2));
    assert_eq!(condition(&degraded, "Degraded"), Some(("True", "InsufficientResources")));
    assert_eq!(degraded.status.phase, Some(Phase::Degraded));

    // (seconds degraded, restore now?)
    for (seconds, restore) in [(100, false), (300, true)] {
        let status = DatabaseServiceStatus {
            degraded_replicas: Some(2),
            degraded_at: Some(ago(seconds)),
            ..degraded.status.clone()
        };
        let database = database(3, Some(status));
        let mut observed =
            steady(&database, vec![pod(0, "postgres:16.4", PodState::Ready), pod(1, "postgres:16.4", PodState::Ready)]);
        observed.stateful_set = Some(stateful_set(&database, "postgres:16.4", 2, None));
        let decision = run(&database, &observed);
        let replicas = decision.workload.as_ref().unwrap().inputs.replicas;
        assert_eq!(replicas, if restore { 3 } else { 2 }, "degraded for {seconds} s");
        assert_eq!(decision.journal.reasons().contains(&"Restoring"), restore, "degraded for {seconds} s");
    }
}

#[test]
fn a_paused_database_builds_nothing_until_resumed() {
    let mut paused = database(1, Some(running_status("16.4")));
    paused.spec.paused = Some(true);
    let decision = run(&paused, &Observed::default());
    assert!(decision.workload.is_none());
    assert_eq!(decision.requeue, None);
    assert_eq!(condition(&decision, "Paused"), Some(("True", "Paused")));
    assert_eq!(decision.journal.reasons(), ["Paused"]);

    let resumed = database(1, Some(decision.status.clone()));
    let decision = run(&resumed, &steady(&resumed, vec![pod(0, "postgres:16.4", PodState::Ready)]));
    assert!(decision.workload.is_some());
    assert_eq!(condition(&decision, "Paused"), None);
    assert!(decision.journal.reasons().contains(&"Resumed"));
}

#[test]
fn an_invalid_spec_changes_nothing_and_says_why() {
    let mut invalid = database(1, None);
    invalid.spec.version = "9.6".into();
    invalid.spec.username = "postgres".into();
    let decision = run(&invalid, &Observed::default());
    assert!(decision.workload.is_none());
    assert_eq!(decision.status.phase, Some(Phase::Failed));
    assert_eq!(condition(&decision, "InvalidSpec"), Some(("True", "ValidationFailed")));
    let message =
        &decision.status.conditions.iter().find(|condition| condition.type_ == "InvalidSpec").unwrap().message;
    assert!(message.contains("version") && message.contains("username"), "{message}");
    assert_eq!(decision.journal.reasons(), ["InvalidSpec"]);
    // Reported once: the next pass with the same status records nothing new.
    let again = database(1, Some(decision.status.clone()));
    let mut again = again;
    again.spec = invalid.spec.clone();
    assert!(run(&again, &Observed::default()).journal.is_empty());
}

#[test]
fn only_claims_made_for_this_database_are_owned() {
    let database = database(2, Some(running_status("16.4")));
    let mut observed =
        steady(&database, vec![pod(0, "postgres:16.4", PodState::Ready), pod(1, "postgres:16.4", PodState::Ready)]);
    // data-db-0 was retained from an earlier DatabaseService (older than this one); data-db-1 is new.
    observed.claims = vec![claim(0, 7200, false), claim(1, 60, false)];
    let decision = run(&database, &observed);
    let changes = &decision.workload.as_ref().unwrap().claim_changes;
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].claim, "data-db-1");
    assert_eq!(changes[0].resource_version.as_deref(), Some("7"), "the patch is conditional");
    assert_eq!(changes[0].owner_references.as_ref().unwrap()[0].uid, "uid-1");
}

#[test]
fn a_retained_secret_is_used_but_not_owned_and_a_missing_one_is_recreated_with_a_warning() {
    let database_new = database(1, None);
    let mut retained = (*owned_secret()).clone();
    retained.metadata.owner_references = None;
    let observed = Observed { credentials: Some(Arc::new(retained)), ..Default::default() };
    let decision = run(&database_new, &observed);
    assert!(!decision.workload.as_ref().unwrap().create_credentials);
    assert_eq!(condition(&decision, "CredentialsReady"), Some(("True", "SecretRetained")));

    let lost = database(
        1,
        Some(DatabaseServiceStatus { conditions: decision.status.conditions.clone(), ..running_status("16.4") }),
    );
    let mut observed = steady(&lost, vec![pod(0, "postgres:16.4", PodState::Ready)]);
    observed.credentials = None;
    let decision = run(&lost, &observed);
    assert!(decision.workload.as_ref().unwrap().create_credentials);
    assert_eq!(condition(&decision, "CredentialsReady"), Some(("False", "SecretRecreated")));
    assert!(decision.journal.reasons().contains(&"CredentialsRecreated"));
}

/// A one-instance database with spec.backup.
fn archiving_database(status: Option<DatabaseServiceStatus>) -> DatabaseService {
    let mut database = database(1, status);
    database.spec.backup = Some(
        serde_json::from_value(json!({"objectStore": {"endpoint": "http://store:9000", "bucket": "backups",
                                                      "credentialsSecret": {"name": "s3"}}}))
        .unwrap(),
    );
    database
}

/// Pod db-0 whose agent reports a primary with archiving failing since `failing_for` seconds
/// ago (healthy when None).
fn primary_reporting_archiving(failing_for: Option<i64>) -> Arc<Pod> {
    let mut pod = (*pod(0, "postgres:16.4", PodState::Ready)).clone();
    let archiving = match failing_for {
        Some(seconds) => {
            json!({"failing": true, "failingSince": ago(seconds), "failedWal": "000000010000000000000009"})
        }
        None => json!({"failing": false}),
    };
    let report = json!({"role": "primary", "timeline": 1, "walReceiver": false, "postgresReady": true,
                        "fenced": false, "diskFull": false, "archiving": archiving});
    pod.metadata.annotations =
        Some([(crate::api::failover::INSTANCE_REPORT_ANNOTATION.to_string(), report.to_string())].into());
    Arc::new(pod)
}

#[test]
fn the_primary_report_drives_the_archiving_condition_warning_and_requeue() {
    use crate::operator::database::archiving::{ArchivingHealth, FAILING_EVENT};
    // Failing for 100 s of the default 300: condition False, no event yet, a look when 300 s are up.
    let early = archiving_database(Some(running_status("16.4")));
    let decision = run(&early, &steady(&early, vec![primary_reporting_archiving(Some(100))]));
    assert_eq!(condition(&decision, "ContinuousArchiving"), Some(("False", "ArchiveFailing")));
    assert!(!decision.journal.reasons().contains(&FAILING_EVENT));
    assert_eq!(decision.requeue, Some(std::time::Duration::from_secs(200)));
    assert_eq!(decision.archiving, ArchivingHealth::Failing { since: now() - Duration::seconds(100) });
    // Failing for 400 s: the Warning event and ledger entry, once.
    let late = archiving_database(Some(decision.status.clone()));
    let warned = run(&late, &steady(&late, vec![primary_reporting_archiving(Some(400))]));
    assert_eq!(condition(&warned, "ContinuousArchiving"), Some(("False", "ArchiveFailingTooLong")));
    assert!(warned.journal.reasons().contains(&FAILING_EVENT), "{:?}", warned.journal.reasons());
    assert!(warned.journal.entries.iter().any(|entry| entry.action == FAILING_EVENT));
    let again = archiving_database(Some(warned.status.clone()));
    let steady_pass = run(&again, &steady(&again, vec![primary_reporting_archiving(Some(400))]));
    assert_eq!(steady_pass.status, warned.status, "no status write when nothing changed");
    assert!(steady_pass.journal.is_empty(), "{:?}", steady_pass.journal.reasons());
    // A standby's report does not count; without spec.backup there is no condition.
    let mut standby = (*primary_reporting_archiving(Some(400))).clone();
    standby.metadata.name = Some("db-1".into());
    let two = archiving_database(Some(running_status("16.4")));
    let mut observed = steady(&two, vec![pod(0, "postgres:16.4", PodState::Ready), Arc::new(standby)]);
    observed.pods.sort_by_key(|pod| pod.metadata.name.clone());
    assert_eq!(condition(&run(&two, &observed), "ContinuousArchiving"), None);
    let plain = database(1, Some(warned.status.clone()));
    let without = run(&plain, &steady(&plain, vec![primary_reporting_archiving(Some(400))]));
    assert_eq!(condition(&without, "ContinuousArchiving"), None);
    assert_eq!(without.archiving, ArchivingHealth::NotConfigured);
}

#[test]
fn pods_of_an_old_revision_are_replaced_one_at_a_time_highest_ordinal_first() {
    let database = database(2, Some(running_status("16.4")));
    let outdated = |ordinal| {
        let mut pod = (*pod(ordinal, "postgres:16.4", PodState::Ready)).clone();
        pod.metadata.labels.as_mut().unwrap().insert("controller-revision-hash".into(), "r0".into());
        Arc::new(pod)
    };
    let observed = steady(&database, vec![outdated(0), outdated(1)]);
    let decision = run(&database, &observed);
    let deletions = &decision.workload.as_ref().unwrap().pod_deletions;
    assert_eq!(deletions.iter().map(|deletion| deletion.pod.as_str()).collect::<Vec<_>>(), ["db-1"]);
    assert!(decision.journal.reasons().contains(&"RollingUpdate"), "{:?}", decision.journal);
    // The replaced pod not back yet: nothing more this pass.
    let observed = steady(&database, vec![outdated(0)]);
    assert!(run(&database, &observed).workload.unwrap().pod_deletions.is_empty());
}

#[test]
fn a_former_primary_that_still_reports_primary_joins_neither_service() {
    let database = database(2, Some(running_status("16.4")));
    let mut former = (*primary_reporting_archiving(None)).clone();
    former.metadata.name = Some("db-1".into());
    former.metadata.uid = Some("pod-1".into());
    let observed = steady(&database, vec![pod(0, "postgres:16.4", PodState::Ready), Arc::new(former)]);
    let decision = run(&database, &observed);
    let labels = &decision.workload.as_ref().unwrap().pod_labels;
    assert!(
        labels.iter().any(|label| label.pod == "db-1" && label.role == crate::api::names::NO_ROLE),
        "a server that still accepts writes must leave the read-only Service: {labels:?}"
    );
    assert!(labels.iter().all(|label| label.pod != "db-0"), "db-0 stays primary: {labels:?}");
}

#[test]
fn a_pod_whose_managed_by_label_was_removed_gets_it_back_and_keeps_its_role() {
    let database = database(2, Some(running_status("16.4")));
    let mut unlabelled = (*pod(0, "postgres:16.4", PodState::Ready)).clone();
    unlabelled.metadata.labels.as_mut().unwrap().remove(crate::api::names::MANAGED_BY_LABEL);
    let observed = steady(&database, vec![Arc::new(unlabelled), pod(1, "postgres:16.4", PodState::Ready)]);
    let decision = run(&database, &observed);
    let labels = &decision.workload.as_ref().unwrap().pod_labels;
    assert_eq!(labels, &[PodLabel { pod: "db-0".into(), role: crate::api::names::PRIMARY_ROLE }]);
    assert!(decision.journal.reasons().contains(&"PodLabelRestored"), "{:?}", decision.journal);
}

#[test]
fn the_stateful_set_never_scales_away_the_primary_even_when_the_spec_asks() {
    let mut status = running_status("16.4");
    status.failover.current_primary = Some("db-2".into());
    status.failover.target_primary = Some("db-2".into());
    let database = database(1, Some(status));
    let observed = steady(&database, vec![pod(0, "postgres:16.4", PodState::Ready)]);
    let decision = run(&database, &observed);
    let replicas = decision.workload.as_ref().unwrap().inputs.replicas;
    assert_eq!(replicas, 3, "db-2 is the primary: ordinals 0..=2 stay");
}

#[test]
fn a_switchover_timer_started_by_a_leader_with_a_clock_ahead_does_not_fire_at_once() {
    let mut status = running_status("16.4");
    status.failover.current_primary = Some("db-0".into());
    status.failover.target_primary = Some("db-1".into());
    status.failover.timeline = Some(1);
    // Stored by a leader whose clock ran 40 s ahead: by this clock the 30 s timeout has passed.
    status.failover.transition = Some(crate::api::failover::Transition {
        kind: crate::api::failover::TransitionKind::Switchover,
        from: "db-0".into(),
        started_at: now() - Duration::seconds(40),
    });
    let database = database(2, Some(status));
    let mut standby = (*pod(1, "postgres:16.4", PodState::Ready)).clone();
    let report = json!({"role": "standby", "timeline": 1, "walReceiver": true, "postgresReady": true,
                        "fenced": false, "diskFull": false, "receivedLsn": "0/3000000"});
    standby.metadata.annotations =
        Some([(crate::api::failover::INSTANCE_REPORT_ANNOTATION.to_string(), report.to_string())].into());
    let observed = steady(&database, vec![primary_reporting_archiving(None), Arc::new(standby)]);
    let decide_with = |seen| {
        decide(&DecideInput {
            database: &database,
            observed: &observed,
            settings: &ControllerSettings::default(),
            now: now(),
            failover_timer_seen: seen,
        })
    };
    // Judged by this process's clock, which first saw the timer just now: still waiting.
    let waiting = decide_with(Some(std::time::Duration::ZERO));
    assert_eq!(waiting.status.failover.target_primary.as_deref(), Some("db-1"), "{:?}", waiting.status.failover);
    assert!(waiting.status.failover.transition.is_some());
    // Judged by comparing the wall clocks, it would have been abandoned at once.
    let by_wall_clock = decide_with(None);
    assert_eq!(by_wall_clock.status.failover.target_primary.as_deref(), Some("db-0"));
    // Once this process has seen it for the whole timeout, it fires.
    let timed_out = decide_with(Some(std::time::Duration::from_secs(30)));
    assert_eq!(timed_out.status.failover.target_primary.as_deref(), Some("db-0"));
}

/// Pod db-0 whose agent reports a primary that put back owned settings (revert `count`).
fn primary_reporting_revert(count: u64) -> Arc<Pod> {
    let mut pod = (*pod(0, "postgres:16.4", PodState::Ready)).clone();
    let report = json!({"role": "primary", "timeline": 1, "walReceiver": false, "postgresReady": true,
                        "fenced": false, "diskFull": false,
                        "ownedSettingsReverted": {"at": ago(10), "settings": ["wal_level"], "count": count}});
    pod.metadata.annotations =
        Some([(crate::api::failover::INSTANCE_REPORT_ANNOTATION.to_string(), report.to_string())].into());
    Arc::new(pod)
}

#[test]
fn an_owned_setting_put_back_is_told_once_per_revert() {
    use crate::operator::database::owned_settings::REVERTED_EVENT;
    let first = database(1, Some(running_status("16.4")));
    let told = run(&first, &steady(&first, vec![primary_reporting_revert(1)]));
    assert_eq!(told.journal.reasons().iter().filter(|reason| **reason == REVERTED_EVENT).count(), 1);
    assert!(told
        .journal
        .entries
        .iter()
        .any(|entry| entry.action == REVERTED_EVENT && entry.outcome.contains("wal_level")));
    // The status remembers it: the next pass seeing the same report tells nothing.
    let again = database(1, Some(told.status.clone()));
    let quiet = run(&again, &steady(&again, vec![primary_reporting_revert(1)]));
    assert!(!quiet.journal.reasons().contains(&REVERTED_EVENT), "{:?}", quiet.journal.reasons());
    // Another revert: told again.
    let next = run(&again, &steady(&again, vec![primary_reporting_revert(2)]));
    assert!(next.journal.reasons().contains(&REVERTED_EVENT));
}

/// A two-instance database with db-0 its primary, failover engaged.
fn engaged_status() -> DatabaseServiceStatus {
    let mut status = running_status("16.4");
    status.failover.current_primary = Some("db-0".into());
    status.failover.target_primary = Some("db-0".into());
    status.failover.timeline = Some(1);
    status
}

#[test]
fn hibernation_stops_every_instance_keeps_the_rest_and_says_so_once_each() {
    let mut sleeping = database(2, Some(engaged_status()));
    sleeping.spec.hibernated = Some(true);
    sleeping.metadata.generation = Some(2);
    let pods = vec![pod(0, "postgres:16.4", PodState::Ready), pod(1, "postgres:16.4", PodState::Ready)];
    let decision = run(&sleeping, &steady(&sleeping, pods.clone()));
    let workload = decision.workload.as_ref().expect("the workload is applied, at no instance");
    assert_eq!((workload.inputs.replicas, workload.inputs.image.as_str()), (0, "postgres:16.4"));
    assert!(workload.pod_deletions.is_empty() && workload.pod_labels.is_empty());
    assert_eq!(decision.status.phase, Some(Phase::Hibernating));
    assert_eq!(condition(&decision, "Hibernated"), Some(("True", "Hibernating")));
    assert_eq!(condition(&decision, "Ready"), Some(("False", "Hibernated")));
    assert!(decision.journal.reasons().contains(&"Hibernating"));
    assert_eq!(decision.status.failover.current_primary.as_deref(), Some("db-0"), "the primary is kept");

    let still_stopping = database(2, Some(decision.status.clone()));
    let mut still_stopping = DatabaseService { spec: sleeping.spec.clone(), ..still_stopping };
    still_stopping.metadata.generation = Some(2);
    let again = run(&still_stopping, &steady(&still_stopping, pods));
    assert!(!again.journal.reasons().contains(&"Hibernating"), "told once: {:?}", again.journal.reasons());

    let mut asleep = DatabaseService { status: Some(again.status.clone()), ..still_stopping.clone() };
    asleep.metadata.generation = Some(2);
    // The pooler's pods drain for a while after its Deployment went to 0: not asleep yet.
    let draining = run(&asleep, &Observed { pooler_pods: 2, ..steady(&asleep, Vec::new()) });
    assert_eq!(draining.status.phase, Some(Phase::Hibernating));
    assert_eq!(draining.requeue, Some(std::time::Duration::from_secs(5)), "pooler pods are not watched");
    let decision = run(&asleep, &steady(&asleep, Vec::new()));
    assert_eq!(decision.status.phase, Some(Phase::Hibernated));
    assert_eq!(condition(&decision, "Hibernated"), Some(("True", "Hibernated")));
    assert!(decision.journal.entries.iter().any(|entry| entry.action == "Hibernated"));
    assert_eq!(decision.requeue, Some(std::time::Duration::from_secs(300)));
}

#[test]
fn a_wake_holds_failover_until_the_stopped_primary_is_back() {
    let mut hibernated = engaged_status();
    crate::operator::conditions::set(
        &mut hibernated.conditions,
        "Hibernated",
        true,
        "Hibernated",
        "hibernated",
        Some(2),
        now() - Duration::seconds(600),
    );
    let mut waking = database(2, Some(hibernated));
    waking.metadata.generation = Some(3);
    // The standby is ready first; the primary's pod is still starting.
    let pods = vec![pod(0, "postgres:16.4", PodState::NotReadyFor(5)), pod(1, "postgres:16.4", PodState::Ready)];
    let decision = run(&waking, &steady(&waking, pods.clone()));
    assert_eq!(condition(&decision, "Hibernated"), Some(("False", "Waking")));
    assert!(decision.journal.reasons().contains(&"Waking"));
    assert_eq!(decision.workload.as_ref().unwrap().inputs.replicas, 2);
    assert_eq!(decision.status.failover.target_primary.as_deref(), Some("db-0"), "no failover while waking");

    // Without the hold the same pass fails over at once (the default delay is 0).
    let mut awake = engaged_status();
    awake.observed_generation = Some(3);
    let unheld = DatabaseService { status: Some(awake), ..waking.clone() };
    let decision = run(&unheld, &steady(&unheld, pods));
    assert_ne!(decision.status.failover.target_primary.as_deref(), Some("db-0"), "the hold is what keeps the primary");
}
