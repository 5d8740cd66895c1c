//! The controller's failover step (pure): how pods, their agents' reports and the persisted
//! status turn into the primary label, the status and the journal. The decision rules themselves
//! are tabled in src/operator/database/failover/tests.rs; this checks the mapping from what the controller observes.

use chrono::{TimeZone, Utc};
use dbservice_operator::api::database_service::{DatabaseService, DatabaseServiceStatus};
use dbservice_operator::api::failover::{
    FailoverStatus, InstanceReport, Role, Transition, TransitionKind, INSTANCE_REPORT_ANNOTATION, PENDING,
};
use dbservice_operator::lease::LeaseRecord;
use dbservice_operator::lsn::Lsn;
use dbservice_operator::operator::database::failover::pass::{
    decide_failover, needs_lease, FailoverInput, FailoverOutcome, LapsedLease,
};
use dbservice_operator::operator::database::pod_health::pod_health;
use dbservice_operator::operator::journal::Journal;
use k8s_openapi::api::core::v1::Pod;
use std::sync::Arc;

fn database(status: FailoverStatus) -> DatabaseService {
    let mut database: DatabaseService = serde_json::from_value(serde_json::json!({
        "apiVersion": "dbservice.dev/v1",
        "kind": "DatabaseService",
        "metadata": {"name": "db", "namespace": "ns", "uid": "uid", "generation": 1},
        "spec": {"version": "15.18", "storageSize": "1Gi", "databaseName": "app", "username": "app_user", "replicas": 2},
    }))
    .unwrap();
    database.status = Some(DatabaseServiceStatus { failover: status, ..Default::default() });
    database
}

fn report(role: Role, ready: bool, streaming: bool, timeline: u32) -> InstanceReport {
    InstanceReport {
        role,
        timeline,
        received_lsn: (role == Role::Standby).then_some(Lsn(0x3000000)),
        replay_lsn: (role == Role::Standby).then_some(Lsn(0x3000000)),
        wal_receiver: streaming,
        postgres_ready: ready,
        fenced: false,
        disk_full: false,
        archiving: None,
        shutdown_checkpoint_lsn: None,
        parameters: None,
        pending_restart: Vec::new(),
        declared: None,
        import: None,
        major_upgrade: None,
        owned_settings_reverted: None,
        waits_for: None,
        discarded_on_rejoin: None,
        reloaded: None,
        volume: None,
    }
}

fn pod(name: &str, ready: bool, report: Option<InstanceReport>) -> Arc<Pod> {
    let annotations = report
        .map(|report| serde_json::json!({INSTANCE_REPORT_ANNOTATION: serde_json::to_string(&report).unwrap()}))
        .unwrap_or_else(|| serde_json::json!({}));
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations,
                         "creationTimestamp": "2026-12-01T00:00:00Z"},
            "spec": {"containers": [{"name": "postgres", "image": "postgres:15.18"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                       "containerStatuses": [{"name": "postgres", "ready": ready, "restartCount": 0, "image": "postgres:15.18", "imageID": ""}]},
        }))
        .unwrap(),
    )
}

fn settled(primary: &str, timeline: Option<u32>) -> FailoverStatus {
    FailoverStatus {
        current_primary: Some(primary.into()),
        target_primary: Some(primary.into()),
        timeline,
        ..Default::default()
    }
}

/// db-0's change to `target` (or pending), started at 00:04:58 (two seconds before [`run`]'s now).
fn changing(kind: TransitionKind, target: impl Into<String>) -> FailoverStatus {
    let mut status = settled("db-0", Some(1));
    status.target_primary = Some(target.into());
    status.transition = Some(Transition {
        kind,
        from: "db-0".into(),
        started_at: Utc.with_ymd_and_hms(2026, 12, 1, 0, 4, 58).unwrap(),
    });
    status
}

fn run(
    status: FailoverStatus,
    pods: Vec<Arc<Pod>>,
    lease: Option<LeaseRecord>,
) -> (FailoverOutcome, DatabaseServiceStatus, Journal) {
    run_lapsed(status, pods, lease, None)
}

/// [`run`] with the version of the Lease that this operator saw lapse.
fn run_lapsed(
    status: FailoverStatus,
    pods: Vec<Arc<Pod>>,
    lease: Option<LeaseRecord>,
    lease_lapsed: Option<&str>,
) -> (FailoverOutcome, DatabaseServiceStatus, Journal) {
    let database = database(status);
    let health: Vec<_> = pods.iter().map(|pod| pod_health(pod)).collect();
    let mut status = database.status.clone().unwrap();
    let mut journal = Journal::default();
    let now = Utc.with_ymd_and_hms(2026, 12, 1, 0, 5, 0).unwrap();
    let input = FailoverInput {
        pods: &pods,
        health: &health,
        lease: lease.as_ref(),
        lease_lapsed,
        rolling_switchover: None,
        drain_switchover: None,
        timer_seen: None,
        held_by_major_upgrade: false,
        held_by_wake: false,
    };
    let outcome = decide_failover(&database, &input, &mut status, &mut journal, now);
    (outcome, status, journal)
}

#[test]
fn a_new_database_bootstraps_on_its_first_instance_and_a_starting_primary_is_not_failed_over() {
    // Nothing reported yet (kwok pods, or agents still starting): db-0 is the primary.
    let (outcome, status, journal) = run(FailoverStatus::default(), vec![pod("db-0", false, None)], None);
    assert_eq!(outcome.primary.as_deref(), Some("db-0"));
    assert_eq!(status.failover.current_primary.as_deref(), Some("db-0"));
    assert_eq!(status.failover.target_primary.as_deref(), Some("db-0"));
    assert!(journal.is_empty() && !outcome.urgent);

    // Its agent reports a primary that does not answer yet, its pod is not Ready: still no failover.
    let starting = pod("db-0", false, Some(report(Role::Primary, false, false, 0)));
    let (outcome, status, _) = run(settled("db-0", None), vec![starting], None);
    assert_eq!(outcome.primary.as_deref(), Some("db-0"));
    assert_eq!(status.failover.target_primary.as_deref(), Some("db-0"));
    assert_eq!(status.failover.timeline, None, "not engaged before the primary was healthy");

    // Healthy once: failover engages (the timeline is recorded).
    let healthy = pod("db-0", true, Some(report(Role::Primary, true, false, 1)));
    let (_, status, _) = run(settled("db-0", None), vec![healthy], None);
    assert_eq!(status.failover.timeline, Some(1));
    assert_eq!(status.instances[0].role, "primary");
}

/// Issue 21, hole 6: a DatabaseService re-created (or restored) without its status, while db-1
/// holds the primary Lease after an earlier failover: db-1 stays the primary, ordinal 0 is not
/// made primary again.
#[test]
fn a_lost_status_takes_the_primary_from_the_lease_not_from_ordinal_zero() {
    let primary = pod("db-1", true, Some(report(Role::Primary, true, false, 2)));
    let standby = pod("db-0", true, Some(report(Role::Standby, true, true, 2)));
    let lease = LeaseRecord { holder: Some("db-1".into()), timeline: Some(2), ..Default::default() };
    let (outcome, status, _) = run(FailoverStatus::default(), vec![standby.clone(), primary.clone()], Some(lease));
    assert_eq!(outcome.primary.as_deref(), Some("db-1"));
    assert_eq!(status.failover.current_primary.as_deref(), Some("db-1"));
    assert_eq!(status.failover.target_primary.as_deref(), Some("db-1"));
    assert_eq!(outcome.release_lease_of, None);

    // The Lease is read for it: a status without a primary while pods run needs the Lease...
    let database = database(FailoverStatus::default());
    let pods = vec![standby, primary];
    let health: Vec<_> = pods.iter().map(|pod| pod_health(pod)).collect();
    assert!(needs_lease(&database, &pods, &health));
    // ...and a new database, whose first pass sees no pods, does not read it.
    assert!(!needs_lease(&database, &[], &[]));
}

#[test]
fn a_gone_primary_starts_a_failover_without_a_primary_label_and_releases_its_lease() {
    let standby = pod("db-1", true, Some(report(Role::Standby, true, true, 1)));
    let lease = LeaseRecord { holder: Some("db-0".into()), primary_lsn: Some(Lsn(0x3000100)), ..Default::default() };
    let (outcome, status, journal) = run(settled("db-0", Some(1)), vec![standby.clone()], Some(lease));
    assert_eq!(outcome.primary, None, "no pod behind Service db during a failover");
    assert_eq!(outcome.release_lease_of.as_deref(), Some("db-0"));
    assert!(outcome.urgent);
    assert_eq!(status.failover.target_primary.as_deref(), Some(PENDING));
    assert!(journal.reasons().contains(&"FailoverStarted"));
    assert_eq!(status.instances.iter().find(|instance| instance.name == "db-1").unwrap().lag_bytes, Some(0x100));
}

/// Issue 38: a primary whose agent froze (or lost the API) looks healthy to its pod and its last
/// report; its Lease, unchanged for a whole duration on the operator's clock, says it fenced
/// itself. The failover starts at once and the Lease is released at that version, so the standbys
/// need not wait for their own clocks.
#[test]
fn a_lapsed_lease_starts_a_failover_and_is_released_at_its_version() {
    let primary = pod("db-0", true, Some(report(Role::Primary, true, false, 1)));
    let standby = pod("db-1", true, Some(report(Role::Standby, true, true, 1)));
    let lease = LeaseRecord { holder: Some("db-0".into()), primary_lsn: Some(Lsn(0x3000000)), ..Default::default() };
    let pods = vec![primary, standby];
    let (outcome, status, journal) =
        run_lapsed(settled("db-0", Some(1)), pods.clone(), Some(lease.clone()), Some("41"));
    assert_eq!(status.failover.target_primary.as_deref(), Some(PENDING));
    assert_eq!(outcome.primary, None);
    assert_eq!(outcome.release_lease_of, None, "its pod is there: not the gone-pod release");
    assert_eq!(outcome.release_lapsed_lease, Some(LapsedLease { holder: "db-0".into(), version: "41".into() }));
    assert!(journal.reasons().contains(&"FailoverStarted") && journal.reasons().contains(&"PrimaryLeaseLapsed"));

    // A failover under way (started for another reason) gets the lapsed Lease released too.
    let (outcome, _, _) = run_lapsed(status.failover.clone(), pods.clone(), Some(lease.clone()), Some("41"));
    assert_eq!(outcome.release_lapsed_lease.map(|lapsed| lapsed.holder).as_deref(), Some("db-0"));

    // Not lapsed: a healthy primary keeps its Lease and its place.
    let (outcome, status, _) = run_lapsed(settled("db-0", Some(1)), pods.clone(), Some(lease.clone()), None);
    assert_eq!((outcome.primary.as_deref(), outcome.release_lapsed_lease), (Some("db-0"), None));
    assert_eq!(status.failover.target_primary.as_deref(), Some("db-0"));

    // The instance being promoted holds the Lease: never released, lapsed or not.
    let promoting = changing(TransitionKind::Failover, "db-1");
    let taken = LeaseRecord { holder: Some("db-1".into()), ..lease };
    let (outcome, _, _) = run_lapsed(promoting, pods, Some(taken), Some("42"));
    assert_eq!(outcome.release_lapsed_lease, None);
}

/// Issue 38: a failover that promotes a standby behind the last position the old primary
/// published (asynchronous, or degraded) says so, with the WAL it gives up, in the ledger.
#[test]
fn a_promotion_behind_the_old_primary_records_what_it_gives_up() {
    let status = changing(TransitionKind::Failover, PENDING);
    let stopped = pod("db-1", true, Some(report(Role::Standby, true, false, 1)));
    let released =
        LeaseRecord { holder: None, primary_lsn: Some(Lsn(0x3000100)), timeline: Some(1), ..Default::default() };
    let (_, status, journal) = run(status.clone(), vec![stopped.clone()], Some(released));
    assert_eq!(status.failover.target_primary.as_deref(), Some("db-1"));
    let entry = journal.entries.iter().find(|entry| entry.action == "FailoverPromoting").expect("a ledger entry");
    assert!(entry.outcome.contains("256 bytes of WAL behind the last position known of db-0"), "{}", entry.outcome);

    // A standby that has everything gives nothing up, and says nothing of it.
    let caught_up =
        LeaseRecord { holder: None, primary_lsn: Some(Lsn(0x3000000)), timeline: Some(1), ..Default::default() };
    let mut pending = status;
    pending.failover.target_primary = Some(PENDING.into());
    let (_, _, journal) = run(pending.failover, vec![stopped], Some(caught_up));
    let entry = journal.entries.iter().find(|entry| entry.action == "FailoverPromoting").expect("a ledger entry");
    assert_eq!(entry.outcome, "requested");
}

#[test]
fn a_promoted_target_becomes_the_labelled_primary_with_a_timed_ledger_entry() {
    let status = changing(TransitionKind::Switchover, "db-1");
    let pods = vec![
        pod("db-0", true, Some(report(Role::Primary, false, false, 1))),
        pod("db-1", true, Some(report(Role::Primary, true, false, 2))),
    ];
    let (outcome, status, journal) = run(status, pods, None);
    assert_eq!(outcome.primary.as_deref(), Some("db-1"));
    assert_eq!(status.failover.current_primary.as_deref(), Some("db-1"));
    assert_eq!(status.failover.timeline, Some(2));
    assert!(journal.reasons().contains(&"SwitchoverCompleted"));
    let entry = &journal.entries[0];
    assert_eq!((entry.action.as_str(), entry.from.as_str(), entry.to.as_str()), ("Switchover", "db-0", "db-1"));
    assert!(entry.outcome.contains("completed in 2.0s"), "{}", entry.outcome);
}

/// Issue 38: a switchover's old primary takes writes until its agent stops it, so it keeps the
/// primary label (Service NAME) while it reports a server that answers; a failover's does not.
#[test]
fn a_switchover_keeps_the_old_primary_labelled_until_the_target_is_promoted_and_a_failover_does_not() {
    let old = pod("db-0", true, Some(report(Role::Primary, true, false, 1)));
    let target = pod("db-1", true, Some(report(Role::Standby, true, true, 1)));
    let lease = LeaseRecord { holder: Some("db-0".into()), ..Default::default() };
    let (outcome, status, _) =
        run(changing(TransitionKind::Switchover, "db-1"), vec![old.clone(), target.clone()], Some(lease.clone()));
    assert_eq!(status.failover.target_primary.as_deref(), Some("db-1"), "the switchover goes on");
    assert_eq!(outcome.primary.as_deref(), Some("db-0"));

    // Its agent reports the stop: off Service db at once, before the target's promotion is seen
    // (kube-proxy would apply the swap of both labels a second late).
    let stopped = pod("db-0", true, Some(report(Role::Primary, false, false, 1)));
    let (outcome, status, _) =
        run(changing(TransitionKind::Switchover, "db-1"), vec![stopped.clone(), target.clone()], None);
    assert_eq!(status.failover.target_primary.as_deref(), Some("db-1"), "the switchover goes on");
    assert_eq!(outcome.primary, None);

    let (outcome, status, _) = run(changing(TransitionKind::Failover, "db-1"), vec![stopped, target], None);
    assert_eq!(status.failover.target_primary.as_deref(), Some("db-1"));
    assert_eq!(outcome.primary, None, "no pod behind Service db during a failover");
}

#[test]
fn a_malformed_report_counts_as_none() {
    let mut broken = (*pod("db-0", true, None)).clone();
    broken.metadata.annotations = Some([(INSTANCE_REPORT_ANNOTATION.to_string(), "{not json".to_string())].into());
    assert_eq!(dbservice_operator::operator::database::failover::pass::report_of(&broken), None);
}
