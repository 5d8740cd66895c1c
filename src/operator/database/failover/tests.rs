//! Decision tables for [`crate::operator::database::failover::decide`].

use crate::api::failover::*;
use crate::lease::LeaseRecord;
use crate::lsn::Lsn;
use crate::operator::database::failover::{decide, Action, Observed, Rejection};
use chrono::TimeZone;
use chrono::{DateTime, Utc};
use std::time::Duration;

const MIB: u64 = 1024 * 1024;

fn at(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + seconds, 0).unwrap()
}

fn primary_report() -> InstanceReport {
    InstanceReport {
        role: Role::Primary,
        timeline: 1,
        received_lsn: None,
        replay_lsn: None,
        wal_receiver: false,
        postgres_ready: true,
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

fn standby_report(received: u64, streaming: bool) -> InstanceReport {
    InstanceReport {
        role: Role::Standby,
        received_lsn: Some(Lsn(received)),
        replay_lsn: Some(Lsn(received)),
        wal_receiver: streaming,
        ..primary_report()
    }
}

fn instance(name: &str, pod: PodState, report: Option<InstanceReport>) -> InstanceObservation {
    InstanceObservation { name: name.into(), pod, report, fenced_by_hand: false }
}

fn healthy_primary() -> InstanceObservation {
    instance("db-0", PodState::Ready, Some(primary_report()))
}

fn standby(name: &str, received: u64, streaming: bool) -> InstanceObservation {
    instance(name, PodState::Ready, Some(standby_report(received, streaming)))
}

fn observed(instances: Vec<InstanceObservation>) -> Observed {
    Observed {
        instances,
        lease: Some(LeaseRecord {
            holder: Some("db-0".into()),
            primary_lsn: Some(Lsn(100 * MIB)),
            ..Default::default()
        }),
        lease_lapsed: false,
        switchover_to: None,
        held_by_major_upgrade: false,
        held_by_wake: false,
    }
}

fn steady_status() -> FailoverStatus {
    FailoverStatus {
        current_primary: Some("db-0".into()),
        target_primary: Some("db-0".into()),
        timeline: Some(1),
        ..Default::default()
    }
}

fn failing_status(since: i64) -> FailoverStatus {
    FailoverStatus { primary_failing_since: Some(at(since)), ..steady_status() }
}

fn pending_status(started: i64) -> FailoverStatus {
    FailoverStatus {
        target_primary: Some(PENDING.into()),
        transition: Some(Transition { kind: TransitionKind::Failover, from: "db-0".into(), started_at: at(started) }),
        ..failing_status(started)
    }
}

fn promoting_status(kind: TransitionKind, target: &str, started: i64) -> FailoverStatus {
    FailoverStatus {
        target_primary: Some(target.into()),
        transition: Some(Transition { kind, from: "db-0".into(), started_at: at(started) }),
        ..steady_status()
    }
}

/// Settings of the tables: a lag limit of 16 MiB, the default before issue 38 (positions here are
/// tens of MiB apart).
fn settings(delay: u64) -> FailoverSettings {
    FailoverSettings { failover_delay: Duration::from_secs(delay), maximum_lag_bytes: 16 * MIB, ..Default::default() }
}

/// Runs a table: (name, status, observed, settings, now, expected action).
fn check(table: Vec<(&str, FailoverStatus, Observed, FailoverSettings, i64, Action)>) {
    for (name, status, observed, settings, now, expected) in table {
        let decision = decide(&status, &observed, &settings, at(now));
        assert_eq!(decision.action, expected, "case {name}");
        // Idempotent and restart-safe: the status as written and read back gives the same step.
        let stored: FailoverStatus =
            serde_json::from_str(&serde_json::to_string(&status).unwrap()).expect("status round-trips");
        assert_eq!(decide(&stored, &observed, &settings, at(now)), decision, "case {name} after a restart");
    }
}

#[test]
fn primary_failure_detection_and_delay() {
    let gone_primary = || observed(vec![instance("db-0", PodState::Gone, None), standby("db-1", 100 * MIB, false)]);
    let not_ready = || {
        observed(vec![instance("db-0", PodState::NotReady, Some(primary_report())), standby("db-1", 100 * MIB, true)])
    };
    let postgres_down = || {
        let report = InstanceReport { postgres_ready: false, ..primary_report() };
        observed(vec![instance("db-0", PodState::Ready, Some(report)), standby("db-1", 100 * MIB, true)])
    };
    let healthy = || observed(vec![healthy_primary(), standby("db-1", 100 * MIB, true)]);
    let failing = |primary: &str, seconds: u64| Action::PrimaryFailing {
        primary: primary.into(),
        failover_in: Duration::from_secs(seconds),
    };
    check(vec![
        ("healthy primary", steady_status(), healthy(), settings(0), 0, Action::Steady),
        (
            "pod gone, no delay: failover and release its lease",
            steady_status(),
            gone_primary(),
            settings(0),
            0,
            Action::FailoverStarted { old_primary: "db-0".into(), release_lease: true },
        ),
        ("not ready, delay starts", steady_status(), not_ready(), settings(30), 0, failing("db-0", 30)),
        (
            "delay counts from the persisted time (cnpg#6091)",
            failing_status(0),
            not_ready(),
            settings(30),
            20,
            failing("db-0", 10),
        ),
        (
            "delay elapsed, pod still there: lease kept",
            failing_status(0),
            postgres_down(),
            settings(30),
            30,
            Action::FailoverStarted { old_primary: "db-0".into(), release_lease: false },
        ),
        (
            "recovered within the delay",
            failing_status(0),
            healthy(),
            settings(30),
            10,
            Action::PrimaryRecovered { primary: "db-0".into() },
        ),
    ]);
    let started = decide(&failing_status(0), &not_ready(), &settings(30), at(31)).status;
    assert_eq!(started.target_primary.as_deref(), Some(PENDING));
    assert_eq!(started.transition.unwrap().started_at, at(31));
    let recovered = decide(&failing_status(0), &healthy(), &settings(30), at(10)).status;
    assert_eq!(recovered.primary_failing_since, None);
}

#[test]
fn fenced_and_disk_full_primaries_never_fail_over() {
    let fenced_by_hand = || {
        let mut primary =
            instance("db-0", PodState::NotReady, Some(InstanceReport { postgres_ready: false, ..primary_report() }));
        primary.fenced_by_hand = true;
        observed(vec![primary, standby("db-1", 100 * MIB, false)])
    };
    let self_fenced = || {
        let report = InstanceReport { fenced: true, postgres_ready: false, ..primary_report() };
        observed(vec![instance("db-0", PodState::NotReady, Some(report)), standby("db-1", 100 * MIB, false)])
    };
    let disk_full = || {
        let report = InstanceReport { disk_full: true, postgres_ready: false, ..primary_report() };
        observed(vec![instance("db-0", PodState::NotReady, Some(report)), standby("db-1", 100 * MIB, true)])
    };
    let blocked = |reason| Action::FailoverBlocked { primary: "db-0".into(), reason };
    check(vec![
        ("fenced by hand", failing_status(0), fenced_by_hand(), settings(0), 100, blocked(Rejection::Fenced)),
        ("self-fenced", steady_status(), self_fenced(), settings(0), 0, blocked(Rejection::Fenced)),
        ("disk full", steady_status(), disk_full(), settings(0), 0, blocked(Rejection::DiskFull)),
    ]);
    assert_eq!(decide(&failing_status(0), &disk_full(), &settings(0), at(5)).status.primary_failing_since, None);
}

#[test]
fn a_single_instance_is_never_failed_over() {
    let alone = |pod, report| observed(vec![instance("db-0", pod, report)]);
    let not_ready = InstanceReport { postgres_ready: false, ..primary_report() };
    let blocked = Action::FailoverBlocked { primary: "db-0".into(), reason: Rejection::NoStandby };
    check(vec![
        ("not ready", steady_status(), alone(PodState::NotReady, Some(not_ready)), settings(0), 0, blocked.clone()),
        ("gone", failing_status(0), alone(PodState::Gone, None), settings(0), 100, blocked.clone()),
        ("healthy", steady_status(), alone(PodState::Ready, Some(primary_report())), settings(0), 0, Action::Steady),
    ]);
    let gone = decide(&failing_status(0), &alone(PodState::Gone, None), &settings(0), at(100));
    assert_eq!(gone.status.target_primary.as_deref(), Some("db-0"), "the target stays the only instance");
}

#[test]
fn candidate_choice() {
    let old = || instance("db-0", PodState::Gone, None);
    let requested = |target: &str| Action::PromotionRequested { kind: TransitionKind::Failover, target: target.into() };
    let mut fenced = standby("db-2", 100 * MIB, false);
    fenced.fenced_by_hand = true;
    let disk_full =
        instance("db-2", PodState::Ready, Some(InstanceReport { disk_full: true, ..standby_report(100 * MIB, false) }));
    let down = instance(
        "db-2",
        PodState::Ready,
        Some(InstanceReport { postgres_ready: false, ..standby_report(100 * MIB, false) }),
    );
    let replay_ahead = instance(
        "db-2",
        PodState::Ready,
        Some(InstanceReport { replay_lsn: Some(Lsn(90 * MIB + 1)), ..standby_report(90 * MIB, false) }),
    );
    check(vec![
        (
            "highest received position wins",
            pending_status(0),
            observed(vec![old(), standby("db-1", 99 * MIB, false), standby("db-2", 100 * MIB, false)]),
            settings(0),
            1,
            requested("db-2"),
        ),
        (
            "equal received: higher replay wins",
            pending_status(0),
            observed(vec![old(), standby("db-1", 90 * MIB, false), replay_ahead]),
            settings(0),
            1,
            requested("db-2"),
        ),
        (
            "a tie goes to the first name",
            pending_status(0),
            observed(vec![old(), standby("db-2", 100 * MIB, false), standby("db-1", 100 * MIB, false)]),
            settings(0),
            1,
            requested("db-1"),
        ),
        (
            "fenced standby skipped",
            pending_status(0),
            observed(vec![old(), standby("db-1", 99 * MIB, false), fenced]),
            settings(0),
            1,
            requested("db-1"),
        ),
        (
            "disk-full standby skipped",
            pending_status(0),
            observed(vec![old(), standby("db-1", 99 * MIB, false), disk_full]),
            settings(0),
            1,
            requested("db-1"),
        ),
        (
            "standby with PostgreSQL down skipped",
            pending_status(0),
            observed(vec![old(), standby("db-1", 99 * MIB, false), down]),
            settings(0),
            1,
            requested("db-1"),
        ),
        (
            "lag over the limit behind the lease position: nobody",
            pending_status(0),
            observed(vec![old(), standby("db-1", 80 * MIB, false)]),
            settings(0),
            1,
            Action::NoCandidate {
                rejected: vec![("db-1".into(), Rejection::LagTooHigh { lag_bytes: 20 * MIB, limit_bytes: 16 * MIB })],
            },
        ),
        (
            "waits for standbys to stop streaming",
            pending_status(0),
            observed(vec![old(), standby("db-1", 99 * MIB, true), standby("db-2", 100 * MIB, false)]),
            settings(0),
            2,
            Action::WaitingForStandbys { streaming: vec!["db-1".into()] },
        ),
        (
            "a standby that never reports stopping is not waited for forever",
            pending_status(0),
            observed(vec![old(), standby("db-1", 99 * MIB, true), standby("db-2", 98 * MIB, false)]),
            settings(0),
            10,
            requested("db-1"),
        ),
    ]);
}

#[test]
fn pending_and_abandoned_failovers() {
    let lagging = || observed(vec![instance("db-0", PodState::NotReady, None), standby("db-1", 10 * MIB, false)]);
    let decision = decide(&pending_status(0), &lagging(), &settings(0), at(59));
    assert!(matches!(decision.action, Action::NoCandidate { .. }), "{decision:?}");
    assert_eq!(decision.status.target_primary.as_deref(), Some(PENDING), "pending is kept, never silently reverted");

    let abandoned = decide(&pending_status(0), &lagging(), &settings(0), at(60));
    assert!(
        matches!(&abandoned.action, Action::TransitionAbandoned { kind: TransitionKind::Failover, reason } if reason.contains("LagTooHigh")),
        "{abandoned:?}"
    );
    assert_eq!(abandoned.status.target_primary.as_deref(), Some("db-0"));
    assert_eq!(abandoned.status.current_primary.as_deref(), Some("db-0"));
    assert_eq!(abandoned.status.primary_failing_since, Some(at(60)), "the retry waits another delay");
    let returning = abandoned.status.transition.clone().expect("the old primary returns");
    assert_eq!((returning.kind, returning.from.as_str()), (TransitionKind::Failover, "db-0"));
    // The old primary gets a candidate timeout to come back (its agent restarts it as the target);
    // no new failover meanwhile, whatever the delay (it used to start again at once with delay 0,
    // so that the old primary, no longer the target, never restarted).
    let waiting = decide(&abandoned.status, &lagging(), &settings(0), at(70));
    assert_eq!(waiting.action, Action::WaitingForPromotion { target: "db-0".into() });
    assert_eq!(waiting.status, abandoned.status, "nothing to write while it returns");
    // Then the failover is tried again, after the delay counted from the abandon.
    let retry = decide(&abandoned.status, &lagging(), &settings(30), at(121));
    assert!(matches!(retry.action, Action::FailoverStarted { .. }), "{retry:?}");
    let early = decide(&abandoned.status, &lagging(), &settings(90), at(121));
    assert_eq!(early.action, Action::PrimaryFailing { primary: "db-0".into(), failover_in: Duration::from_secs(29) });

    // A chosen candidate that disappears before promoting sends the failover back to pending.
    let target_gone = observed(vec![instance("db-0", PodState::Gone, None), instance("db-1", PodState::Gone, None)]);
    let lost = decide(&promoting_status(TransitionKind::Failover, "db-1", 0), &target_gone, &settings(0), at(3));
    assert_eq!(lost.action, Action::CandidateLost { target: "db-1".into(), reason: Rejection::PodGone });
    assert_eq!(lost.status.target_primary.as_deref(), Some(PENDING));
}

#[test]
fn promotion_completes_and_survives_an_operator_restart() {
    let promoted = || {
        observed(vec![
            instance("db-0", PodState::Gone, None),
            instance("db-1", PodState::Ready, Some(InstanceReport { timeline: 2, ..primary_report() })),
        ])
    };
    let still_standby = || observed(vec![instance("db-0", PodState::Gone, None), standby("db-1", 100 * MIB, false)]);
    check(vec![
        (
            "target reports primary on a new timeline",
            promoting_status(TransitionKind::Failover, "db-1", 0),
            promoted(),
            settings(0),
            4,
            Action::PrimaryChanged {
                kind: TransitionKind::Failover,
                from: "db-0".into(),
                to: "db-1".into(),
                timeline: 2,
                took: Duration::from_secs(4),
            },
        ),
        (
            "waiting for the agent to promote",
            promoting_status(TransitionKind::Failover, "db-1", 0),
            still_standby(),
            settings(0),
            4,
            Action::WaitingForPromotion { target: "db-1".into() },
        ),
    ]);
    let changed =
        decide(&promoting_status(TransitionKind::Failover, "db-1", 0), &promoted(), &settings(0), at(4)).status;
    assert_eq!(changed.current_primary.as_deref(), Some("db-1"));
    assert_eq!(changed.target_primary.as_deref(), Some("db-1"));
    assert_eq!((changed.timeline, changed.transition.clone()), (Some(2), None));
    // The restarted operator that reads the new status sees a settled database.
    assert_eq!(decide(&changed, &promoted(), &settings(0), at(5)).action, Action::Steady);

    // A whole failover driven step by step, each step from the status as stored.
    let mut status = steady_status();
    let mut world = observed(vec![instance("db-0", PodState::Gone, None), standby("db-1", 100 * MIB, true)]);
    let mut actions = Vec::new();
    for second in 0..4 {
        let stored: FailoverStatus = serde_json::from_str(&serde_json::to_string(&status).unwrap()).unwrap();
        let decision = decide(&stored, &world, &settings(0), at(second));
        actions.push(decision.action.clone());
        status = decision.status;
        // The agents react: the standby stops streaming on pending, promotes when targeted.
        if status.target_primary.as_deref() == Some(PENDING) {
            world.instances[1].report = Some(standby_report(100 * MIB, false));
        } else if status.target_primary.as_deref() == Some("db-1") {
            world.instances[1].report = Some(InstanceReport { timeline: 2, ..primary_report() });
        }
    }
    assert_eq!(
        actions,
        vec![
            Action::FailoverStarted { old_primary: "db-0".into(), release_lease: true },
            Action::PromotionRequested { kind: TransitionKind::Failover, target: "db-1".into() },
            Action::PrimaryChanged {
                kind: TransitionKind::Failover,
                from: "db-0".into(),
                to: "db-1".into(),
                timeline: 2,
                took: Duration::from_secs(2),
            },
            Action::Steady,
        ]
    );
}

#[test]
fn planned_switchover() {
    let request = |target: &str, instances: Vec<InstanceObservation>| Observed {
        switchover_to: Some(target.into()),
        ..observed(instances)
    };
    let rejected = |target: &str, reason| Action::SwitchoverRejected { target: target.into(), reason };
    let mut fenced = standby("db-2", 100 * MIB, true);
    fenced.fenced_by_hand = true;
    check(vec![
        (
            "to a streaming standby",
            steady_status(),
            request("db-1", vec![healthy_primary(), standby("db-1", 100 * MIB, true)]),
            settings(0),
            0,
            Action::PromotionRequested { kind: TransitionKind::Switchover, target: "db-1".into() },
        ),
        (
            "to the primary itself: nothing to do",
            steady_status(),
            request("db-0", vec![healthy_primary(), standby("db-1", 100 * MIB, true)]),
            settings(0),
            0,
            Action::Steady,
        ),
        (
            "to an unknown instance",
            steady_status(),
            request("db-9", vec![healthy_primary()]),
            settings(0),
            0,
            rejected("db-9", Rejection::UnknownInstance),
        ),
        (
            "to a standby that does not stream",
            steady_status(),
            request("db-1", vec![healthy_primary(), standby("db-1", 100 * MIB, false)]),
            settings(0),
            0,
            rejected("db-1", Rejection::NotStreaming),
        ),
        (
            "to a fenced standby",
            steady_status(),
            request("db-2", vec![healthy_primary(), fenced]),
            settings(0),
            0,
            rejected("db-2", Rejection::Fenced),
        ),
        (
            "to a streaming standby whose last report is old: it catches up before promoting",
            steady_status(),
            request("db-1", vec![healthy_primary(), standby("db-1", 50 * MIB, true)]),
            settings(0),
            0,
            Action::PromotionRequested { kind: TransitionKind::Switchover, target: "db-1".into() },
        ),
        (
            "while the primary is failing, the failover comes first",
            failing_status(0),
            request("db-1", vec![instance("db-0", PodState::Gone, None), standby("db-1", 100 * MIB, true)]),
            settings(0),
            0,
            Action::FailoverStarted { old_primary: "db-0".into(), release_lease: true },
        ),
    ]);
    let started = decide(
        &steady_status(),
        &request("db-1", vec![healthy_primary(), standby("db-1", 100 * MIB, true)]),
        &settings(0),
        at(0),
    )
    .status;
    assert_eq!(started.target_primary.as_deref(), Some("db-1"));
    assert_eq!(started.current_primary.as_deref(), Some("db-0"), "current moves only once the target promoted");
}

#[test]
fn switchover_timeouts() {
    let status = promoting_status(TransitionKind::Switchover, "db-1", 0);
    // The old primary never stopped: it stays primary.
    let old_running = observed(vec![healthy_primary(), standby("db-1", 100 * MIB, true)]);
    let abandoned = decide(&status, &old_running, &settings(0), at(30));
    assert!(
        matches!(&abandoned.action, Action::TransitionAbandoned { kind: TransitionKind::Switchover, .. }),
        "{abandoned:?}"
    );
    assert_eq!(abandoned.status.target_primary.as_deref(), Some("db-0"));
    assert_eq!(
        decide(&status, &old_running, &settings(0), at(29)).action,
        Action::WaitingForPromotion { target: "db-1".into() }
    );

    // The old primary stopped for the switchover, but the target never got its last WAL: only the
    // old primary surely holds every acknowledged commit, so it gets its place back (no failover).
    let stopped =
        InstanceReport { postgres_ready: false, shutdown_checkpoint_lsn: Some(Lsn(100 * MIB)), ..primary_report() };
    let old_stopped =
        observed(vec![instance("db-0", PodState::NotReady, Some(stopped.clone())), standby("db-1", 99 * MIB, false)]);
    let given_back = decide(&status, &old_stopped, &settings(0), at(30));
    assert!(
        matches!(&given_back.action, Action::TransitionAbandoned { kind: TransitionKind::Switchover, .. }),
        "{given_back:?}"
    );
    assert_eq!(given_back.status.target_primary.as_deref(), Some("db-0"));
    let returning = given_back.status.transition.clone().expect("a returning transition");
    assert_eq!((returning.kind, returning.from.as_str()), (TransitionKind::Switchover, "db-0"));
    // While its agent restarts it, its absence starts no failover ...
    let waiting = decide(&given_back.status, &old_stopped, &settings(0), at(40));
    assert_eq!(waiting.action, Action::WaitingForPromotion { target: "db-0".into() });
    assert_eq!(waiting.status, given_back.status, "nothing to write while waiting");
    // ... until it is back (the transition ends) ...
    let back = decide(&given_back.status, &old_running, &settings(0), at(41));
    assert_eq!((back.action, back.status.transition), (Action::Steady, None));
    // ... or until the switchover timeout has passed again: then it has failed, and fails over.
    let failed = decide(&given_back.status, &old_stopped, &settings(0), at(60));
    assert!(matches!(failed.action, Action::FailoverStarted { .. }), "{failed:?}");

    // The old primary's pod is gone: a failover picks the best standby instead.
    let old_gone = observed(vec![instance("db-0", PodState::Gone, Some(stopped)), standby("db-1", 100 * MIB, true)]);
    let converted = decide(&status, &old_gone, &settings(0), at(30));
    assert_eq!(converted.action, Action::CandidateLost { target: "db-1".into(), reason: Rejection::TimedOut });
    assert_eq!(converted.status.target_primary.as_deref(), Some(PENDING));
    assert_eq!(converted.status.transition.unwrap().kind, TransitionKind::Failover);
}

#[test]
fn a_second_primary_is_flagged() {
    let instances = vec![healthy_primary(), instance("db-1", PodState::Ready, Some(primary_report()))];
    check(vec![(
        "old primary back as primary",
        steady_status(),
        observed(instances),
        settings(0),
        0,
        Action::ForeignPrimary { instance: "db-1".into() },
    )]);
}

#[test]
fn status_round_trips_with_camel_case_fields() {
    let json = serde_json::to_value(pending_status(0)).unwrap();
    assert_eq!(json["targetPrimary"], "pending");
    assert_eq!(json["currentPrimary"], "db-0");
    assert_eq!(json["transition"]["kind"], "failover");
    let report = serde_json::to_value(standby_report(MIB, true)).unwrap();
    assert_eq!(report["receivedLsn"], "0/100000");
    assert_eq!(report["walReceiver"], true);
}

fn synchronous(count: u32) -> FailoverSettings {
    FailoverSettings { synchronous_standbys: count, ..Default::default() }
}

#[test]
fn synchronous_failover_waits_for_a_quorum_of_final_positions() {
    let old = || instance("db-0", PodState::Gone, None);
    let requested = |target: &str| Action::PromotionRequested { kind: TransitionKind::Failover, target: target.into() };
    let waiting = |reported: &[&str], needed| Action::WaitingForSynchronousQuorum {
        reported: reported.iter().map(|name| name.to_string()).collect(),
        needed,
    };
    let mut fenced = standby("db-2", 100 * MIB, false);
    fenced.fenced_by_hand = true;
    check(vec![
        (
            "ANY 1 of 2: both reported, the most advanced is promoted",
            pending_status(0),
            observed(vec![old(), standby("db-1", 99 * MIB, false), standby("db-2", 100 * MIB, false)]),
            synchronous(1),
            1,
            requested("db-2"),
        ),
        (
            "ANY 1 of 2: the other standby's pod is gone, it may hold the last commits: wait",
            pending_status(0),
            observed(vec![old(), standby("db-1", 100 * MIB, false), instance("db-2", PodState::Gone, None)]),
            synchronous(1),
            1,
            waiting(&["db-1"], 2),
        ),
        (
            "preferred, ANY 1 of the one streaming standby: its report is the quorum, the gone one never waited for",
            pending_status(0),
            observed(vec![old(), standby("db-1", 100 * MIB, false), instance("db-2", PodState::Gone, None)]),
            FailoverSettings { synchronous_members: Some(vec!["db-1".into()]), ..synchronous(1) },
            1,
            requested("db-1"),
        ),
        (
            "preferred, ANY 1 of the one streaming standby: another standby's report is no quorum",
            pending_status(0),
            observed(vec![old(), instance("db-1", PodState::Gone, None), standby("db-2", 100 * MIB, false)]),
            FailoverSettings { synchronous_members: Some(vec!["db-1".into()]), ..synchronous(1) },
            1,
            waiting(&[], 1),
        ),
        (
            "asynchronous: the same standby is promoted at once",
            pending_status(0),
            observed(vec![old(), standby("db-1", 100 * MIB, false), instance("db-2", PodState::Gone, None)]),
            settings(0),
            1,
            requested("db-1"),
        ),
        (
            "ANY 1 of 2: a fenced standby is not a final position",
            pending_status(0),
            observed(vec![old(), standby("db-1", 100 * MIB, false), fenced.clone()]),
            synchronous(1),
            1,
            waiting(&["db-1"], 2),
        ),
        (
            "ANY 2 of 2: every commit is on both, one report is enough",
            pending_status(0),
            observed(vec![old(), standby("db-1", 100 * MIB, false), instance("db-2", PodState::Gone, None)]),
            synchronous(2),
            1,
            requested("db-1"),
        ),
        (
            "a standby still streaming after the report timeout has no final position",
            pending_status(0),
            observed(vec![old(), standby("db-1", 100 * MIB, true), standby("db-2", 99 * MIB, false)]),
            synchronous(1),
            10,
            waiting(&["db-2"], 2),
        ),
        (
            "two instances, ANY 1 of 1: the standby's report is the quorum",
            pending_status(0),
            observed(vec![old(), standby("db-1", 100 * MIB, false)]),
            synchronous(1),
            1,
            requested("db-1"),
        ),
    ]);
    // No quorum within the candidate timeout: the failover is abandoned, never forced.
    let no_quorum = observed(vec![old(), standby("db-1", 100 * MIB, false), instance("db-2", PodState::Gone, None)]);
    let abandoned = decide(&pending_status(0), &no_quorum, &synchronous(1), at(60));
    assert!(
        matches!(&abandoned.action, Action::TransitionAbandoned { kind: TransitionKind::Failover, reason } if reason.contains("synchronous")),
        "{abandoned:?}"
    );
    assert_eq!(abandoned.status.target_primary.as_deref(), Some("db-0"));
}

#[test]
fn fenced_instances_during_a_change() {
    let mut fenced_target = standby("db-1", 100 * MIB, false);
    fenced_target.fenced_by_hand = true;
    let mut fenced_old = instance("db-0", PodState::NotReady, None);
    fenced_old.fenced_by_hand = true;
    check(vec![
        (
            "the chosen target fenced by hand before it promoted: choose again",
            promoting_status(TransitionKind::Failover, "db-1", 0),
            observed(vec![instance("db-0", PodState::Gone, None), fenced_target.clone()]),
            settings(0),
            2,
            Action::CandidateLost { target: "db-1".into(), reason: Rejection::Fenced },
        ),
        (
            "a switchover target fenced while the old primary still runs: abandoned, the primary stays",
            promoting_status(TransitionKind::Switchover, "db-1", 0),
            observed(vec![healthy_primary(), fenced_target]),
            settings(0),
            2,
            Action::TransitionAbandoned {
                kind: TransitionKind::Switchover,
                reason: "target db-1 cannot be promoted: Fenced".into(),
            },
        ),
        (
            "the old primary fenced by hand once the failover started: the failover goes on",
            pending_status(0),
            observed(vec![fenced_old, standby("db-1", 100 * MIB, false)]),
            settings(0),
            1,
            Action::PromotionRequested { kind: TransitionKind::Failover, target: "db-1".into() },
        ),
    ]);
}

#[test]
fn disk_full_primary_is_not_failed_over_but_a_dead_one_is() {
    let full = InstanceReport { disk_full: true, ..primary_report() };
    // Writable enough to answer queries, yet full: a standby has the same data and would fill up
    // the same way; the person must make room (event), failing over would not help.
    let still_answering =
        observed(vec![instance("db-0", PodState::Ready, Some(full.clone())), standby("db-1", 100 * MIB, true)]);
    let crashed = observed(vec![
        instance("db-0", PodState::NotReady, Some(InstanceReport { postgres_ready: false, ..full })),
        standby("db-1", 100 * MIB, true),
    ]);
    let pod_gone = observed(vec![instance("db-0", PodState::Gone, None), standby("db-1", 100 * MIB, true)]);
    let blocked = Action::FailoverBlocked { primary: "db-0".into(), reason: Rejection::DiskFull };
    check(vec![
        ("disk full, still answering", steady_status(), still_answering, settings(0), 0, blocked.clone()),
        ("disk full, crashed (PANIC on a WAL write)", failing_status(0), crashed, settings(0), 5, blocked),
        (
            "the pod of a disk-full primary is gone: its report went with it, failover",
            steady_status(),
            pod_gone,
            settings(0),
            0,
            Action::FailoverStarted { old_primary: "db-0".into(), release_lease: true },
        ),
    ]);
}

#[test]
fn an_operator_restarting_at_any_step_of_a_failover_resumes_it() {
    // Each step's stored status, read back by a new operator (the check() helper also decides
    // from the round-tripped status), gives the same step: nothing is lost or done twice.
    let pending_world = observed(vec![instance("db-0", PodState::Gone, None), standby("db-1", 100 * MIB, false)]);
    let promoted_world = observed(vec![
        instance("db-0", PodState::Gone, None),
        instance("db-1", PodState::Ready, Some(InstanceReport { timeline: 2, ..primary_report() })),
    ]);
    check(vec![
        (
            "restart while pending: the choice is made from the reports",
            pending_status(0),
            pending_world.clone(),
            settings(0),
            30,
            Action::PromotionRequested { kind: TransitionKind::Failover, target: "db-1".into() },
        ),
        (
            "restart after the agent promoted but before the status said so",
            promoting_status(TransitionKind::Failover, "db-1", 0),
            promoted_world.clone(),
            settings(0),
            30,
            Action::PrimaryChanged {
                kind: TransitionKind::Failover,
                from: "db-0".into(),
                to: "db-1".into(),
                timeline: 2,
                took: Duration::from_secs(30),
            },
        ),
    ]);
    // A restart long after the failover started does not abandon a failover whose target is
    // promoting: the candidate timeout applies to finding a candidate, not to the promotion.
    let late = decide(&promoting_status(TransitionKind::Failover, "db-1", 0), &pending_world, &settings(0), at(600));
    assert_eq!(late.action, Action::WaitingForPromotion { target: "db-1".into() });
    // A target that vanished while no operator ran is replaced by a new choice, not waited for.
    let vanished = observed(vec![instance("db-0", PodState::Gone, None), instance("db-1", PodState::Gone, None)]);
    let lost = decide(&promoting_status(TransitionKind::Failover, "db-1", 0), &vanished, &settings(0), at(600));
    assert_eq!(lost.action, Action::CandidateLost { target: "db-1".into(), reason: Rejection::PodGone });
}

#[test]
fn a_standby_on_an_older_timeline_is_never_promoted_however_far_it_got() {
    let old = || instance("db-0", PodState::Gone, None);
    let mut status = pending_status(0);
    status.timeline = Some(2);
    let missed_a_promotion = instance("db-2", PodState::Ready, Some(standby_report(120 * MIB, false)));
    let current = InstanceReport { timeline: 2, ..standby_report(100 * MIB, false) };
    check(vec![
        (
            "the standby on the current timeline wins over a further one on timeline 1",
            status.clone(),
            observed(vec![old(), instance("db-1", PodState::Ready, Some(current)), missed_a_promotion.clone()]),
            settings(0),
            1,
            Action::PromotionRequested { kind: TransitionKind::Failover, target: "db-1".into() },
        ),
        (
            "alone, it is refused",
            status,
            observed(vec![old(), missed_a_promotion]),
            settings(0),
            1,
            Action::NoCandidate { rejected: vec![("db-2".into(), Rejection::OldTimeline { timeline: 1, current: 2 })] },
        ),
    ]);
}

#[test]
fn a_major_upgrade_holds_failover_and_switchover() {
    let held = |instances| Observed { held_by_major_upgrade: true, ..observed(instances) };
    let blocked = Action::FailoverBlocked { primary: "db-0".into(), reason: Rejection::MajorUpgrade };
    let gone = || vec![instance("db-0", PodState::Gone, None), standby("db-1", 100 * MIB, true)];
    let requested = Observed {
        switchover_to: Some("db-1".into()),
        ..held(vec![healthy_primary(), standby("db-1", 100 * MIB, true)])
    };
    check(vec![
        ("the primary's pod replaced for pg_upgrade", steady_status(), held(gone()), settings(0), 10, blocked.clone()),
        ("a failing timer from before is dropped", failing_status(0), held(gone()), settings(0), 10, blocked),
        ("a switchover request waits", steady_status(), requested, settings(0), 10, Action::Steady),
    ]);
    let decision = decide(&failing_status(0), &held(gone()), &settings(0), at(10));
    assert_eq!(decision.status.primary_failing_since, None);
    assert_eq!(decision.status.target_primary.as_deref(), Some("db-0"));
}

#[test]
fn a_wake_holds_failover_until_the_primary_is_back() {
    // The Lease its primary left when it stopped has lapsed while the database slept.
    let waking = |instances| Observed { held_by_wake: true, lease_lapsed: true, ..observed(instances) };
    let blocked = Action::FailoverBlocked { primary: "db-0".into(), reason: Rejection::Waking };
    let starting = || vec![instance("db-0", PodState::NotReady, None), standby("db-1", 100 * MIB, true)];
    let back = || vec![healthy_primary(), standby("db-1", 100 * MIB, true)];
    check(vec![
        ("the standby started first: no failover", steady_status(), waking(starting()), settings(0), 10, blocked),
        // Its agent renewed the Lease: the lapse of the version it left behind is over.
        (
            "the primary back",
            steady_status(),
            Observed { lease_lapsed: false, ..waking(back()) },
            settings(0),
            10,
            Action::Steady,
        ),
    ]);
    // The same pass without the hold fails over at once (delay 0): the hold is what keeps it.
    let unheld = Observed { held_by_wake: false, ..waking(starting()) };
    assert!(matches!(decide(&steady_status(), &unheld, &settings(0), at(10)).action, Action::FailoverStarted { .. }));
}

#[test]
fn a_lapsed_lease_fails_over_a_primary_that_still_looks_healthy() {
    // The agent frozen or cut off from the API: its pod is Ready and its last report says ready,
    // but the operator saw its Lease unchanged for a whole duration, so its server is fenced.
    let lapsed = |instances| Observed { lease_lapsed: true, ..observed(instances) };
    let started = Action::FailoverStarted { old_primary: "db-0".into(), release_lease: false };
    let healthy = || vec![healthy_primary(), standby("db-1", 100 * MIB, true)];
    let mut other_holder = lapsed(healthy());
    other_holder.lease.as_mut().unwrap().holder = Some("db-1".into());
    check(vec![
        ("lapsed, no delay: failover", steady_status(), lapsed(healthy()), settings(0), 0, started),
        (
            "lapsed, with a delay: failing first",
            steady_status(),
            lapsed(healthy()),
            settings(5),
            0,
            Action::PrimaryFailing { primary: "db-0".into(), failover_in: Duration::from_secs(5) },
        ),
        ("renewed again: healthy", steady_status(), observed(healthy()), settings(0), 0, Action::Steady),
        // Someone else's lapse says nothing about this primary.
        ("lapsed lease of another holder", steady_status(), other_holder, settings(0), 0, Action::Steady),
        (
            "a single instance is still never failed over",
            steady_status(),
            lapsed(vec![healthy_primary()]),
            settings(0),
            0,
            Action::FailoverBlocked { primary: "db-0".into(), reason: Rejection::NoStandby },
        ),
    ]);
}

#[test]
fn by_default_a_standby_more_than_a_mebibyte_behind_is_not_promoted() {
    // Issue 38: a standby whose WAL receiver stalled is 2 MiB behind the last position the primary
    // published in its Lease (100 MiB): the failover waits for a better one instead.
    let defaults = FailoverSettings::default();
    assert_eq!(defaults.maximum_lag_bytes, MIB);
    let old = || instance("db-0", PodState::Gone, None);
    let lagging = observed(vec![old(), standby("db-1", 98 * MIB, false)]);
    let rejected = vec![("db-1".to_string(), Rejection::LagTooHigh { lag_bytes: 2 * MIB, limit_bytes: MIB })];
    check(vec![
        ("2 MiB behind", pending_status(0), lagging, defaults.clone(), 11, Action::NoCandidate { rejected }),
        (
            "half a MiB behind",
            pending_status(0),
            observed(vec![old(), standby("db-1", 100 * MIB - MIB / 2, false)]),
            defaults,
            11,
            Action::PromotionRequested { kind: TransitionKind::Failover, target: "db-1".into() },
        ),
    ]);
}
