//! The failover decision: one pure step from the persisted status and the observed instances.

use crate::api::failover::{
    FailoverSettings, FailoverStatus, InstanceObservation, PodState, Role, Transition, TransitionKind, PENDING,
};
use crate::lease::LeaseRecord;
use crate::lsn::Lsn;
use chrono::{DateTime, Utc};
use std::cmp::Reverse;
use std::time::Duration;

/// Everything the operator observed for one database this pass.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Every instance (one per pod that exists or should exist).
    pub instances: Vec<InstanceObservation>,
    /// The primary Lease, if it could be read.
    pub lease: Option<LeaseRecord>,
    /// This operator has seen the Lease read held and unchanged for a whole Lease duration: its
    /// holder has fenced itself (see `failover::lease_clock`), whatever its pod and report say.
    pub lease_lapsed: bool,
    /// The standby a person asked to switch over to, if any.
    pub switchover_to: Option<String>,
    /// An in-place major upgrade holds failover and switchover: the primary is down on purpose,
    /// or the standbys are of another major than the primary.
    pub held_by_major_upgrade: bool,
    /// A wake from hibernation holds failover while the instances start: the primary stopped with
    /// every commit, and a standby that starts first must not take its place.
    pub held_by_wake: bool,
}

/// Why an instance cannot be promoted (or a switchover is refused).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// No such instance.
    UnknownInstance,
    /// It is the primary already.
    AlreadyPrimary,
    /// Its pod is gone.
    PodGone,
    /// Its pod is not Ready.
    PodNotReady,
    /// Its agent has not reported.
    NoReport,
    /// It is not a standby.
    NotStandby,
    /// PostgreSQL does not answer.
    PostgresNotReady,
    /// It is fenced.
    Fenced,
    /// Its disk is full.
    DiskFull,
    /// Switchover only: it does not stream from the primary.
    NotStreaming,
    /// It is too far behind.
    LagTooHigh {
        /// Bytes behind the most advanced known position.
        lag_bytes: u64,
        /// The configured limit.
        limit_bytes: u64,
    },
    /// It is on an older timeline than the current primary: it missed a promotion, and its
    /// position, however far, is on a history the database left.
    OldTimeline {
        /// Its timeline.
        timeline: u32,
        /// The current primary's.
        current: u32,
    },
    /// It was not promoted within the switchover timeout.
    TimedOut,
    /// The database has no other instance to promote.
    NoStandby,
    /// An in-place major upgrade is under way (see `operator::database::major_upgrade`).
    MajorUpgrade,
    /// The database wakes from hibernation (see `operator::database::hibernation`).
    Waking,
}

/// What the operator does after writing the returned status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing to do.
    Steady,
    /// The primary is unhealthy; a failover starts after the delay.
    PrimaryFailing {
        /// The primary.
        primary: String,
        /// Time left before the failover starts.
        failover_in: Duration,
    },
    /// The primary is healthy again before the delay elapsed.
    PrimaryRecovered {
        /// The primary.
        primary: String,
    },
    /// The primary is unhealthy but failing over would not help or was ruled out by a person.
    FailoverBlocked {
        /// The primary.
        primary: String,
        /// Fenced or DiskFull.
        reason: Rejection,
    },
    /// A failover started: `targetPrimary` is pending. Remove the primary label from the old pod
    /// (Service `<name>` gets no endpoint, never two) and, when its pod is gone, release its lease
    /// (the kubelet confirmed that its processes ended).
    FailoverStarted {
        /// The failed primary.
        old_primary: String,
        /// The old primary's pod is gone: its lease may be released by the operator.
        release_lease: bool,
    },
    /// Waiting for standbys to stop their WAL receivers and report final positions.
    WaitingForStandbys {
        /// Standbys still streaming.
        streaming: Vec<String>,
    },
    /// Synchronous replication: fewer standbys than the quorum have reported final positions, so
    /// the most advanced one known might miss acknowledged commits (see [`crate::api::synchronous::quorum`]).
    WaitingForSynchronousQuorum {
        /// Standbys with a final position.
        reported: Vec<String>,
        /// How many are needed.
        needed: usize,
    },
    /// No standby may be promoted yet.
    NoCandidate {
        /// Each standby and why it was refused.
        rejected: Vec<(String, Rejection)>,
    },
    /// `targetPrimary` names the instance to promote; its agent takes the lease and promotes.
    PromotionRequested {
        /// Failover or switchover.
        kind: TransitionKind,
        /// The instance to promote.
        target: String,
    },
    /// Waiting for the target to report itself primary.
    WaitingForPromotion {
        /// The instance being promoted.
        target: String,
    },
    /// The target refused or vanished before promoting: the failover looks for another candidate.
    CandidateLost {
        /// The lost target.
        target: String,
        /// Why.
        reason: Rejection,
    },
    /// The new primary is up: label its pod primary, emit the event, record the timing.
    PrimaryChanged {
        /// Failover or switchover.
        kind: TransitionKind,
        /// The old primary.
        from: String,
        /// The new primary.
        to: String,
        /// Its timeline.
        timeline: u32,
        /// From the start of the transition to now.
        took: Duration,
    },
    /// The transition was given up; the old primary stays current.
    TransitionAbandoned {
        /// Failover or switchover.
        kind: TransitionKind,
        /// Why.
        reason: String,
    },
    /// The switchover request was refused (the request should be cleared and an event emitted).
    SwitchoverRejected {
        /// The requested standby.
        target: String,
        /// Why.
        reason: Rejection,
    },
    /// An instance other than the current primary runs as primary: strip its primary label and
    /// warn (its agent demotes it, as it does not hold the lease).
    ForeignPrimary {
        /// The instance.
        instance: String,
    },
}

/// New status to persist, and what to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Status to write (only when it differs from the old one).
    pub status: FailoverStatus,
    /// Side effect.
    pub action: Action,
}

fn elapsed(since: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (now - since).to_std().unwrap_or(Duration::ZERO)
}

fn find<'a>(observed: &'a Observed, name: &str) -> Option<&'a InstanceObservation> {
    observed.instances.iter().find(|instance| instance.name == name)
}

/// The most advanced position known: the primary's at its last lease renewal, or any report's.
fn reference_lsn(observed: &Observed, current_timeline: u32) -> Lsn {
    // A position on an older timeline is on a history the database left: no reference.
    let reported = observed
        .instances
        .iter()
        .filter_map(|instance| instance.report.as_ref())
        .filter(|report| report.timeline >= current_timeline)
        .filter_map(|report| report.received_lsn);
    observed.lease.as_ref().and_then(|lease| lease.primary_lsn).into_iter().chain(reported).max().unwrap_or_default()
}

/// How far the standby `target` is behind the most advanced position known (the old primary's at
/// its last Lease renewal, or another standby's): WAL, and the commits in it, that promoting it
/// gives up (none under `required`, or `preferred` while in force, beyond what no client heard
/// acknowledged). Zero when it is not behind or its position is unknown.
pub fn behind_reference(status: &FailoverStatus, observed: &Observed, target: &str) -> u64 {
    let reference = reference_lsn(observed, current_timeline(status, observed));
    let received = find(observed, target).and_then(|instance| instance.report.as_ref()?.received_lsn);
    received.map_or(0, |received| reference.0.saturating_sub(received.0))
}

/// The timeline of the database: the primary's, from the status or from its last Lease renewal
/// (the status may be a stale cache of it, or lost).
fn current_timeline(status: &FailoverStatus, observed: &Observed) -> u32 {
    let renewed = observed.lease.as_ref().and_then(|lease| lease.timeline);
    status.timeline.max(renewed).unwrap_or(0)
}

/// Why `instance` may not be promoted, if it may not.
fn rejection(
    instance: &InstanceObservation,
    reference: Lsn,
    current_timeline: u32,
    settings: &FailoverSettings,
    require_streaming: bool,
) -> Option<Rejection> {
    let Some(report) = &instance.report else { return Some(Rejection::NoReport) };
    let rejection = match instance.pod {
        PodState::Gone => Rejection::PodGone,
        _ if instance.fenced_by_hand || report.fenced => Rejection::Fenced,
        _ if report.disk_full => Rejection::DiskFull,
        _ if report.role != Role::Standby => Rejection::NotStandby,
        PodState::NotReady => Rejection::PodNotReady,
        _ if !report.postgres_ready => Rejection::PostgresNotReady,
        _ if report.timeline < current_timeline => {
            Rejection::OldTimeline { timeline: report.timeline, current: current_timeline }
        }
        _ if require_streaming && !report.wal_receiver => Rejection::NotStreaming,
        // A streaming standby's reported position is the one it had when it started streaming
        // (positions are not republished while they advance), so its lag is unknown here; it
        // needs none: a switchover target promotes only once it has received the old primary's
        // shutdown checkpoint.
        _ if require_streaming => return None,
        _ => {
            let lag_bytes = reference.bytes_ahead_of(report.received_lsn.unwrap_or_default());
            if lag_bytes <= settings.maximum_lag_bytes {
                return None;
            }
            Rejection::LagTooHigh { lag_bytes, limit_bytes: settings.maximum_lag_bytes }
        }
    };
    Some(rejection)
}

/// Decides the next failover step. Idempotent: the same status and observations give the same
/// decision, so a restarted operator simply carries on.
pub fn decide(
    status: &FailoverStatus,
    observed: &Observed,
    settings: &FailoverSettings,
    now: DateTime<Utc>,
) -> Decision {
    let Some(current) = status.current_primary.clone() else {
        // Bootstrap (no primary chosen yet) is the controller's business, not a failover.
        return Decision { status: status.clone(), action: Action::Steady };
    };
    match status.target_primary.as_deref() {
        Some(PENDING) => choose_candidate(status, observed, settings, now),
        Some(target) if target != current => await_promotion(status, observed, settings, now, target.to_string()),
        _ => steady(status, observed, settings, now, current),
    }
}

fn steady(
    status: &FailoverStatus,
    observed: &Observed,
    settings: &FailoverSettings,
    now: DateTime<Utc>,
    current: String,
) -> Decision {
    let mut next = status.clone();
    next.target_primary = Some(current.clone());
    next.transition = None;
    let primary = find(observed, &current);
    let report = primary.and_then(|primary| primary.report.as_ref());
    let lapsed = observed.lease_lapsed
        && observed.lease.as_ref().is_some_and(|lease| lease.holder.as_deref() == Some(current.as_str()));
    let healthy = primary.is_some_and(|primary| primary.pod == PodState::Ready)
        && report.is_some_and(|report| report.postgres_ready && report.role == Role::Primary)
        && !lapsed;
    if let Some(action) = held_primary(status, observed, primary, healthy, &current) {
        next.primary_failing_since = None;
        return Decision { status: next, action };
    }
    if !healthy {
        return failing_primary(status, settings, now, primary, current, next);
    }
    if status.primary_failing_since.is_some() {
        next.primary_failing_since = None;
        return Decision { status: next, action: Action::PrimaryRecovered { primary: current } };
    }
    if let Some(foreign) = observed.instances.iter().find(|instance| {
        instance.name != current
            && instance.report.as_ref().is_some_and(|report| report.role == Role::Primary && report.postgres_ready)
    }) {
        return Decision { status: next, action: Action::ForeignPrimary { instance: foreign.name.clone() } };
    }
    if let Some(target) = observed.switchover_to.clone().filter(|target| *target != current) {
        return request_switchover(status, observed, settings, now, current, target, next);
    }
    Decision { status: next, action: Action::Steady }
}

/// The action for a primary that is never failed over as things stand (fenced, its disk full,
/// an upgrade under way, no standby), None when failover may go ahead.
fn held_primary(
    status: &FailoverStatus,
    observed: &Observed,
    primary: Option<&InstanceObservation>,
    healthy: bool,
    current: &str,
) -> Option<Action> {
    let report = primary.and_then(|primary| primary.report.as_ref());
    let blocked = |reason| Some(Action::FailoverBlocked { primary: current.to_string(), reason });
    if primary.is_some_and(|primary| primary.fenced_by_hand) || report.is_some_and(|report| report.fenced) {
        return blocked(Rejection::Fenced);
    }
    if report.is_some_and(|report| report.disk_full) {
        return blocked(Rejection::DiskFull);
    }
    if observed.held_by_major_upgrade && status.transition.is_none() {
        // The upgrade stops the primary on purpose, and a standby of the old major promoted
        // beside an upgraded primary would fork the database: nothing moves until it is done.
        return if healthy { Some(Action::Steady) } else { blocked(Rejection::MajorUpgrade) };
    }
    if observed.held_by_wake && status.transition.is_none() {
        return if healthy { Some(Action::Steady) } else { blocked(Rejection::Waking) };
    }
    if !healthy && observed.instances.iter().all(|instance| instance.name == current) {
        // A single instance is never "failed over": that would stop its own server (the target
        // is no longer itself) and leave the database down until the failover was abandoned.
        // Its pod is restarted by the controller's self-healing instead.
        return blocked(Rejection::NoStandby);
    }
    None
}

/// An unhealthy primary: waits for one given its place back by an abandoned change, counts down
/// the failover delay, then starts a failover.
fn failing_primary(
    status: &FailoverStatus,
    settings: &FailoverSettings,
    now: DateTime<Utc>,
    primary: Option<&InstanceObservation>,
    current: String,
    mut next: FailoverStatus,
) -> Decision {
    let returning = status.transition.as_ref().filter(|transition| {
        let timeout = match transition.kind {
            TransitionKind::Switchover => settings.switchover_timeout,
            TransitionKind::Failover => settings.candidate_timeout,
        };
        transition.from == current && elapsed(transition.started_at, now) < timeout
    });
    if let Some(returning) = returning {
        // An abandoned change gave the old primary its place back: it restarts (its pod may be
        // coming back), and no failover starts meanwhile.
        next.transition = Some(returning.clone());
        return Decision { status: next, action: Action::WaitingForPromotion { target: current } };
    }
    let since = status.primary_failing_since.unwrap_or(now);
    next.primary_failing_since = Some(since);
    let waited = elapsed(since, now);
    if waited < settings.failover_delay {
        let failover_in = settings.failover_delay - waited;
        return Decision { status: next, action: Action::PrimaryFailing { primary: current, failover_in } };
    }
    next.target_primary = Some(PENDING.into());
    next.transition = Some(Transition { kind: TransitionKind::Failover, from: current.clone(), started_at: now });
    let release_lease = primary.is_none_or(|primary| primary.pod == PodState::Gone);
    Decision { status: next, action: Action::FailoverStarted { old_primary: current, release_lease } }
}

/// A switchover to `target` asked for: refused when the target may not be promoted, else started.
fn request_switchover(
    status: &FailoverStatus,
    observed: &Observed,
    settings: &FailoverSettings,
    now: DateTime<Utc>,
    current: String,
    target: String,
    mut next: FailoverStatus,
) -> Decision {
    let reason = match find(observed, &target) {
        None => Some(Rejection::UnknownInstance),
        Some(instance) => {
            let timeline = current_timeline(status, observed);
            rejection(instance, reference_lsn(observed, timeline), timeline, settings, true)
        }
    };
    if let Some(reason) = reason {
        return Decision { status: next, action: Action::SwitchoverRejected { target, reason } };
    }
    next.target_primary = Some(target.clone());
    next.transition = Some(Transition { kind: TransitionKind::Switchover, from: current, started_at: now });
    Decision { status: next, action: Action::PromotionRequested { kind: TransitionKind::Switchover, target } }
}

fn choose_candidate(
    status: &FailoverStatus,
    observed: &Observed,
    settings: &FailoverSettings,
    now: DateTime<Utc>,
) -> Decision {
    let mut next = status.clone();
    let transition = status.transition.clone().unwrap_or_else(|| Transition {
        kind: TransitionKind::Failover,
        from: status.current_primary.clone().unwrap_or_default(),
        started_at: now,
    });
    next.transition = Some(transition.clone());
    let waited = elapsed(transition.started_at, now);
    let timeline = current_timeline(status, observed);
    let reference = reference_lsn(observed, timeline);
    let standbys = observed.instances.iter().filter(|instance| instance.name != transition.from);
    let (mut eligible, mut rejected) = (Vec::new(), Vec::new());
    for instance in standbys {
        match rejection(instance, reference, timeline, settings, false) {
            None => eligible.push(instance),
            Some(reason) => rejected.push((instance.name.clone(), reason)),
        }
    }
    let report = |instance: &InstanceObservation| instance.report.clone().expect("eligible instances have reports");
    let streaming: Vec<String> = eligible
        .iter()
        .filter(|instance| report(instance).wal_receiver)
        .map(|instance| instance.name.clone())
        .collect();
    if !streaming.is_empty() && waited < settings.standby_report_timeout {
        return Decision { status: next, action: Action::WaitingForStandbys { streaming } };
    }
    if settings.synchronous_standbys > 0 {
        // Only final positions count: a streaming standby's report is from when it started.
        eligible.retain(|instance| !report(instance).wal_receiver);
        // The standbys the primary may have waited for: a quorum of them holds every commit.
        let member = |name: &String| {
            name != &transition.from
                && settings.synchronous_members.as_ref().is_none_or(|members| members.contains(name))
        };
        let members = observed.instances.iter().filter(|instance| member(&instance.name)).count();
        let needed = crate::api::synchronous::quorum(members, settings.synchronous_standbys);
        let reported: Vec<String> =
            eligible.iter().map(|instance| instance.name.clone()).filter(|name| member(name)).collect();
        if reported.len() < needed {
            if waited < settings.candidate_timeout {
                return Decision { status: next, action: Action::WaitingForSynchronousQuorum { reported, needed } };
            }
            let reason = format!(
                "only {reported:?} of the {needed} synchronous standbys needed reported within {:?}: {rejected:?}",
                settings.candidate_timeout
            );
            return abandon(next, transition, reason, now);
        }
    }
    let best = eligible.iter().max_by_key(|instance| {
        let report = report(instance);
        (report.received_lsn, report.replay_lsn, Reverse(instance.name.clone()))
    });
    if let Some(best) = best {
        next.target_primary = Some(best.name.clone());
        let action = Action::PromotionRequested { kind: TransitionKind::Failover, target: best.name.clone() };
        return Decision { status: next, action };
    }
    if waited >= settings.candidate_timeout {
        let reason = format!("no standby could be promoted within {:?}: {rejected:?}", settings.candidate_timeout);
        return abandon(next, transition, reason, now);
    }
    Decision { status: next, action: Action::NoCandidate { rejected } }
}

/// Gives the old primary back its place, with a returning transition: its agent may restart it
/// (its pod may be coming back), and a new failover waits until the candidate timeout has passed
/// again (see `steady`); without it, a failover with no candidate would start again at once and
/// keep the old primary from ever starting (seen with two primaries lost within seconds).
fn abandon(mut next: FailoverStatus, transition: Transition, reason: String, now: DateTime<Utc>) -> Decision {
    next.target_primary = Some(transition.from.clone());
    next.transition = Some(Transition { kind: TransitionKind::Failover, from: transition.from, started_at: now });
    next.primary_failing_since = Some(now);
    Decision { status: next, action: Action::TransitionAbandoned { kind: TransitionKind::Failover, reason } }
}

fn await_promotion(
    status: &FailoverStatus,
    observed: &Observed,
    settings: &FailoverSettings,
    now: DateTime<Utc>,
    target: String,
) -> Decision {
    let mut next = status.clone();
    let current = status.current_primary.clone().unwrap_or_default();
    let transition = status.transition.clone().unwrap_or_else(|| Transition {
        kind: TransitionKind::Switchover,
        from: current.clone(),
        started_at: now,
    });
    next.transition = Some(transition.clone());
    let instance = find(observed, &target);
    let report = instance.and_then(|instance| instance.report.as_ref());
    if let Some(report) = report.filter(|report| report.role == Role::Primary && report.postgres_ready) {
        if report.timeline > status.timeline.unwrap_or(0) {
            next.current_primary = Some(target.clone());
            next.target_primary = Some(target.clone());
            next.primary_failing_since = None;
            next.transition = None;
            next.timeline = Some(report.timeline);
            let action = Action::PrimaryChanged {
                kind: transition.kind,
                from: transition.from,
                to: target,
                timeline: report.timeline,
                took: elapsed(transition.started_at, now),
            };
            return Decision { status: next, action };
        }
    }
    let lost = target_lost(instance);
    let timed_out = transition.kind == TransitionKind::Switchover
        && elapsed(transition.started_at, now) >= settings.switchover_timeout;
    if let Some(reason) = lost.clone().filter(|_| transition.kind == TransitionKind::Failover) {
        next.target_primary = Some(PENDING.into());
        return Decision { status: next, action: Action::CandidateLost { target, reason } };
    }
    if lost.is_some() || timed_out {
        return give_up_promotion(next, observed, settings, now, target, transition, lost);
    }
    Decision { status: next, action: Action::WaitingForPromotion { target } }
}

/// Why the target of a promotion cannot be promoted any more, if it cannot. A target that
/// promoted already is past every check: only its report is awaited.
fn target_lost(instance: Option<&InstanceObservation>) -> Option<Rejection> {
    let report = instance.and_then(|instance| instance.report.as_ref());
    let promoted = report.is_some_and(|report| report.role == Role::Primary);
    match instance {
        None => Some(Rejection::UnknownInstance),
        Some(instance) if !promoted => match instance.pod {
            PodState::Gone => Some(Rejection::PodGone),
            _ if instance.fenced_by_hand || report.is_some_and(|report| report.fenced) => Some(Rejection::Fenced),
            _ if report.is_some_and(|report| report.disk_full) => Some(Rejection::DiskFull),
            _ => None,
        },
        Some(_) => None,
    }
}

/// A switchover whose target was lost or timed out (a failover's lost candidate is chosen again
/// before this): the old primary stays or returns when it can, else a failover starts.
fn give_up_promotion(
    mut next: FailoverStatus,
    observed: &Observed,
    settings: &FailoverSettings,
    now: DateTime<Utc>,
    target: String,
    transition: Transition,
    lost: Option<Rejection>,
) -> Decision {
    let current = next.current_primary.clone().unwrap_or_default();
    let old_primary_running = find(observed, &current).is_some_and(|old| {
        old.pod == PodState::Ready
            && old.report.as_ref().is_some_and(|report| report.role == Role::Primary && report.postgres_ready)
    });
    // A switchover promises every acknowledged commit, which only the old primary is sure to
    // hold: while its pod exists and the target has not taken the Lease, giving up means giving
    // the old primary its place back (its agent restarts it as primary), never a failover.
    let old_primary_can_return = find(observed, &current).is_some_and(|old| old.pod != PodState::Gone)
        && observed.lease.as_ref().is_none_or(|lease| lease.holder.as_deref() != Some(target.as_str()));
    if old_primary_running || (transition.kind == TransitionKind::Switchover && old_primary_can_return) {
        // The old primary never stopped, or stopped for nothing: it stays (or is again) primary.
        // A stopped one is given its place back with a returning transition, so that the
        // failover its absence would start waits while its agent restarts it (see `steady`).
        next.transition = (!old_primary_running).then(|| Transition {
            kind: TransitionKind::Switchover,
            from: current.clone(),
            started_at: now,
        });
        next.target_primary = Some(current);
        let reason = match lost {
            Some(reason) => format!("target {target} cannot be promoted: {reason:?}"),
            None => format!("target {target} was not promoted within {:?}", settings.switchover_timeout),
        };
        return Decision {
            status: next,
            action: Action::TransitionAbandoned { kind: TransitionKind::Switchover, reason },
        };
    }
    // The old primary has stopped: the quickest way back to a primary is a failover.
    next.target_primary = Some(PENDING.into());
    next.transition = Some(Transition { kind: TransitionKind::Failover, ..transition });
    let reason = lost.unwrap_or(Rejection::TimedOut);
    Decision { status: next, action: Action::CandidateLost { target, reason } }
}
