//! Decide (pure), failover part: from the agents' reports on the pods, the primary Lease and the
//! persisted failover status to the new status, which pod carries the primary label, and the
//! events and ledger entries of every failover and switchover. The rules are
//! [`crate::operator::database::failover::decide`]'s; this module maps the controller's observations onto it.
//!
//! Until the bootstrap primary `<name>-0` has once been healthy (pods that run nothing, as under
//! kwok, or a database still starting) it stays the primary, as before failover existed.

use crate::api::database_service::fenced_instances;
use crate::api::database_service::{DatabaseService, DatabaseServiceStatus};
use crate::api::failover::{
    FailoverStatus, InstanceObservation, InstanceReport, InstanceStatus, PodState, Role, TransitionKind,
    INSTANCE_REPORT_ANNOTATION, PENDING, SWITCHOVER_ANNOTATION,
};
use crate::lease::LeaseRecord;
use crate::operator::database::failover::{self, clock, Action};
use crate::operator::database::pod_health::PodHealth;
use crate::operator::journal::Journal;
use crate::operator::ledger::LedgerEntry;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use std::sync::Arc;
use std::time::Duration;

/// What the failover step wants besides the status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FailoverOutcome {
    /// The pod to label primary (Service NAME selects it): the old primary during a switchover, until
    /// the target's promotion is seen; None during a failover (no endpoint).
    pub primary: Option<String>,
    /// Release the primary Lease if this instance still holds it (its pod is gone).
    pub release_lease_of: Option<String>,
    /// Release the primary Lease if it is still at this version: it lapsed, and its holder is not
    /// the primary wanted any more.
    pub release_lapsed_lease: Option<LapsedLease>,
    /// Remove the switchover annotation (done, refused, or already the primary).
    pub clear_switchover_request: bool,
    /// A change is in progress or the primary is failing: look again soon.
    pub urgent: bool,
}

/// A primary Lease this operator saw held and unchanged for a whole Lease duration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LapsedLease {
    /// Its holder, which has fenced itself.
    pub holder: String,
    /// The version that lapsed: the release is a compare-and-swap on it.
    pub version: String,
}

/// The report an agent published on `pod`, if any (a malformed one counts as none).
pub fn report_of(pod: &Pod) -> Option<InstanceReport> {
    serde_json::from_str(pod.annotations().get(INSTANCE_REPORT_ANNOTATION)?).ok()
}

/// The standby a person asked to switch over to.
pub fn switchover_request(database: &DatabaseService) -> Option<String> {
    database.annotations().get(SWITCHOVER_ANNOTATION).map(|target| target.trim().to_string())
}

/// Instance names: one per StatefulSet ordinal the spec asks for.
fn instance_names(database: &DatabaseService) -> Vec<String> {
    let name = database.name_any();
    (0..database.spec.replicas_or_default()).map(|ordinal| format!("{name}-{ordinal}")).collect()
}

fn observations(database: &DatabaseService, pods: &[Arc<Pod>], health: &[PodHealth]) -> Vec<InstanceObservation> {
    let fenced = fenced_instances(database);
    instance_names(database)
        .into_iter()
        .map(|name| {
            let found = pods.iter().zip(health).find(|(pod, _)| pod.name_any() == name);
            let pod = match found {
                None => PodState::Gone,
                Some((_, health)) if health.ready && !health.terminating => PodState::Ready,
                Some(_) => PodState::NotReady,
            };
            let report = found.and_then(|(pod, _)| report_of(pod));
            InstanceObservation { fenced_by_hand: fenced.contains(&name), name, pod, report }
        })
        .collect()
}

/// Whether failover is engaged: the bootstrap primary was once seen healthy (its pod Ready, its
/// agent reporting a primary that answers), which sets the timeline. Before that, a primary that is
/// still starting is not a failed one.
fn engaged(status: &FailoverStatus) -> bool {
    status.timeline.is_some()
}

/// The timeline of `primary` if it is healthy: pod Ready, its agent reports a primary that answers.
fn healthy_primary_timeline(instances: &[InstanceObservation], primary: Option<&String>) -> Option<u32> {
    let instance = instances.iter().find(|instance| Some(&instance.name) == primary)?;
    let report = instance.report.as_ref()?;
    (instance.pod == PodState::Ready && report.role == Role::Primary && report.postgres_ready && report.timeline > 0)
        .then_some(report.timeline)
}

/// Whether this pass needs the primary Lease (a GET): only while something is changing or
/// wrong, never in a steady pass.
pub fn needs_lease(database: &DatabaseService, pods: &[Arc<Pod>], health: &[PodHealth]) -> bool {
    let status = database.status.as_ref().map(|status| status.failover.clone()).unwrap_or_default();
    if status.current_primary.is_none() {
        // No primary recorded but pods running: the status was lost, and the Lease says who the
        // primary is (a new database has no pods yet at its first pass, so this costs it nothing).
        return !pods.is_empty();
    }
    if !engaged(&status) {
        return false;
    }
    let instances = observations(database, pods, health);
    let current = status.current_primary.as_deref();
    let primary_healthy = instances.iter().any(|instance| {
        Some(instance.name.as_str()) == current
            && instance.pod == PodState::Ready
            && instance.report.as_ref().is_some_and(|report| report.role == Role::Primary && report.postgres_ready)
    });
    status.target_primary.as_deref() != current || switchover_request(database).is_some() || !primary_healthy
}

fn instance_statuses(
    database: &DatabaseService,
    instances: &[InstanceObservation],
    lease: Option<&LeaseRecord>,
) -> Vec<InstanceStatus> {
    let wanted_parameters = crate::api::postgresql::fingerprint(&database.spec.parameters());
    instances
        .iter()
        .map(|instance| {
            let report = instance.report.as_ref();
            let role = match report.map(|report| report.role) {
                Some(Role::Primary) => "primary",
                Some(Role::Standby) => "standby",
                None => "unknown",
            };
            let reference = lease.and_then(|lease| lease.primary_lsn);
            let lag_bytes = match (report, reference) {
                (Some(report), Some(reference)) if report.role == Role::Standby => {
                    report.received_lsn.map(|received| reference.bytes_ahead_of(received))
                }
                _ => None,
            };
            InstanceStatus {
                name: instance.name.clone(),
                role: role.into(),
                ready: report.is_some_and(|report| report.postgres_ready),
                streaming: report.is_some_and(|report| report.wal_receiver),
                lag_bytes,
                timeline: report.map(|report| report.timeline).filter(|timeline| *timeline > 0),
                parameters_applied: report
                    .and_then(|report| report.parameters.as_ref())
                    .map(|applied| *applied == wanted_parameters),
                pending_restart: report
                    .map(|report| report.pending_restart.iter().take(64).cloned().collect())
                    .unwrap_or_default(),
                owned_settings_reverted: report.and_then(|report| report.owned_settings_reverted.clone()),
                discarded_on_rejoin: report.and_then(|report| report.discarded_on_rejoin.clone()),
            }
        })
        .collect()
}

fn kind_name(kind: TransitionKind) -> &'static str {
    match kind {
        TransitionKind::Failover => "Failover",
        TransitionKind::Switchover => "Switchover",
    }
}

/// What the failover step observes besides the DatabaseService.
#[derive(Clone, Debug)]
pub struct FailoverInput<'a> {
    /// The database's pods (cached).
    pub pods: &'a [Arc<Pod>],
    /// Their health, in the same order.
    pub health: &'a [PodHealth],
    /// The primary Lease, when this pass read it.
    pub lease: Option<&'a LeaseRecord>,
    /// The version of that Lease, when this process saw it lapse (see `failover::lease_clock`).
    pub lease_lapsed: Option<&'a str>,
    /// A switchover the rolling update asks for (only the primary is left on an old revision).
    pub rolling_switchover: Option<String>,
    /// A switchover away from the primary's cordoned node (see [`crate::operator::database::failover::drain`]).
    pub drain_switchover: Option<String>,
    /// How long this process has seen the running failover timer (None: judge it by `now`).
    pub timer_seen: Option<Duration>,
    /// An in-place major upgrade holds failover and switchover.
    pub held_by_major_upgrade: bool,
    /// A wake from hibernation holds failover until the primary is back.
    pub held_by_wake: bool,
}

/// Decides the failover step of one pass: updates `status` (failover fields and instances) and
/// `journal`, and says which pod is primary.
pub fn decide_failover(
    database: &DatabaseService,
    input: &FailoverInput,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    now: DateTime<Utc>,
) -> FailoverOutcome {
    let lease = input.lease;
    let generation = database.metadata.generation.unwrap_or(0);
    let mut current = status.failover.clone();
    if current.current_primary.is_none() {
        adopt_primary(database, lease, &mut current);
    }
    let instances = observations(database, input.pods, input.health);
    let request = switchover_request(database);
    if !engaged(&current) {
        return bootstrap(database, &instances, lease, current, status, journal, now);
    }
    let switchover_to = announce_switchover(input, request.as_ref(), journal);
    let observed = failover::Observed {
        instances: instances.clone(),
        lease: lease.cloned(),
        lease_lapsed: input.lease_lapsed.is_some(),
        switchover_to,
        held_by_major_upgrade: input.held_by_major_upgrade,
        held_by_wake: input.held_by_wake,
    };
    let decision = decide_on_timer_clock(database, status, &current, &observed, input.timer_seen, now);
    let next = decision.status;
    let mut outcome = FailoverOutcome::default();
    let behind = match &decision.action {
        Action::PromotionRequested { kind: TransitionKind::Failover, target } => {
            failover::decide::behind_reference(&current, &observed, target)
        }
        _ => 0,
    };
    tell(
        decision.action,
        &Telling { current: &current, next: &next, request: request.as_ref(), generation, now, behind },
        journal,
        &mut outcome,
    );
    if request.is_some() && request == next.current_primary && next.target_primary == next.current_primary {
        outcome.clear_switchover_request = true;
    }
    outcome.release_lapsed_lease = lapsed_lease_to_release(input, &next, journal);
    let settled = next.target_primary.is_some() && next.target_primary == next.current_primary;
    // A switchover's old primary takes writes until its agent stops it: it keeps Service NAME
    // while it reports a server that answers (unlabelled at the request, it refused writes during
    // the agent's reaction and the target's catch-up). Unlabelled as soon as it reports the stop,
    // not when the target's promotion is seen: kube-proxy applies a second change of the Service's
    // endpoints at most once a second after the first (minSyncPeriod), and the swap of both labels
    // in one pass cost that second. A failover's primary is failing: no endpoint.
    let switching_over =
        next.transition.as_ref().is_some_and(|transition| transition.kind == TransitionKind::Switchover);
    let still_serving = primary_report(&instances, next.current_primary.as_ref())
        .is_some_and(|report| report.role == Role::Primary && report.postgres_ready);
    outcome.primary = next.current_primary.clone().filter(|_| settled || (switching_over && still_serving));
    outcome.urgent = !settled || next.primary_failing_since.is_some() || next.transition.is_some();
    record_instances(database, &instances, lease, next.current_primary.as_ref(), status);
    status.failover = next;
    let primary = primary_report(&instances, status.failover.current_primary.as_ref().filter(|_| settled));
    crate::operator::database::durability::keep_durability(database, primary, status, journal, now);
    outcome
}

/// The primary is whoever holds the primary Lease; the status only caches it. A status lost (the
/// object re-created or restored without it) must not make ordinal 0 the primary while another
/// instance holds the Lease. With no holder, this is the bootstrap: the first instance
/// initializes the database (its agent runs initdb).
fn adopt_primary(database: &DatabaseService, lease: Option<&LeaseRecord>, current: &mut FailoverStatus) {
    let primary = lease.and_then(|lease| lease.holder.clone()).unwrap_or_else(|| format!("{}-0", database.name_any()));
    current.current_primary = Some(primary.clone());
    current.target_primary = Some(primary);
}

/// Bootstrap (or pods without agents): the first instance is the primary; failover engages once
/// it has been healthy.
fn bootstrap(
    database: &DatabaseService,
    instances: &[InstanceObservation],
    lease: Option<&LeaseRecord>,
    mut current: FailoverStatus,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    now: DateTime<Utc>,
) -> FailoverOutcome {
    current.timeline = healthy_primary_timeline(instances, current.current_primary.as_ref());
    let reported = instances.iter().any(|instance| instance.report.is_some());
    status.instances = if reported { instance_statuses(database, instances, lease) } else { Vec::new() };
    status.failover = current.clone();
    let primary = primary_report(instances, status.failover.current_primary.as_ref());
    crate::operator::database::durability::keep_durability(database, primary, status, journal, now);
    FailoverOutcome {
        primary: current.current_primary,
        clear_switchover_request: false,
        release_lease_of: None,
        release_lapsed_lease: None,
        urgent: false,
    }
}

/// Tells a switchover the operator starts by itself (a rolling update's, a drain's) and returns
/// the switchover to ask for: a person's request first, then the rolling update's, then the drain's.
fn announce_switchover(input: &FailoverInput, request: Option<&String>, journal: &mut Journal) -> Option<String> {
    if request.is_none() {
        if let Some(target) = &input.rolling_switchover {
            journal.record(
                false,
                "RollingSwitchover",
                format!("only the primary runs an old revision: switching over to the updated standby {target} first"),
                None,
            );
        }
    }
    if let (None, None, Some(target)) = (request, &input.rolling_switchover, &input.drain_switchover) {
        journal.record(
            false,
            "DrainSwitchover",
            format!("the primary's node is cordoned: switching over to {target} before the drain evicts it"),
            None,
        );
    }
    request.cloned().or_else(|| input.rolling_switchover.clone()).or_else(|| input.drain_switchover.clone())
}

/// The failover rules' decision, with the synchronous standbys in force and the timers judged
/// on this process's clock.
fn decide_on_timer_clock(
    database: &DatabaseService,
    status: &DatabaseServiceStatus,
    current: &FailoverStatus,
    observed: &failover::Observed,
    timer_seen: Option<Duration>,
    now: DateTime<Utc>,
) -> failover::Decision {
    let mut settings = database.spec.failover_settings();
    (settings.synchronous_standbys, settings.synchronous_members) =
        crate::operator::database::durability::synchronous_in_force(database, status);
    // Timers are judged on this process's clock, not by comparing wall clocks (see clock.rs).
    let judged_at = match (clock::running_timer(current), timer_seen) {
        (Some(since), Some(seen)) => clock::judged_at(since, seen),
        _ => now,
    };
    let mut decision = failover::decide(current, observed, &settings, judged_at);
    if let (Action::PrimaryChanged { took, .. }, Some(transition)) = (&mut decision.action, &current.transition) {
        // How long it took is for people: the wall clock, not the timer clock (a leader that took
        // over in the middle would count from its own start).
        *took = (now - transition.started_at).to_std().unwrap_or(*took);
    }
    decision
}

/// The instances' statuses, and what the primary's agent last reported of the declared roles and
/// databases and of the import.
fn record_instances(
    database: &DatabaseService,
    instances: &[InstanceObservation],
    lease: Option<&LeaseRecord>,
    primary: Option<&String>,
    status: &mut DatabaseServiceStatus,
) {
    status.instances = instance_statuses(database, instances, lease);
    let reported_by_primary = primary_report(instances, primary);
    // The primary's agent keeps spec.roles and spec.databases; its last pass is the status.
    if let Some(declared) = reported_by_primary.and_then(|report| report.declared.clone()) {
        status.declared = Some(declared);
    }
    // The primary's agent imports spec.bootstrap.import once; its last word stays in the status.
    if let Some(import) = reported_by_primary.and_then(|report| report.import.clone()) {
        status.import = Some(import);
    }
}

/// The lapsed Lease to release: its holder has fenced itself and is not the primary wanted now (a
/// failover started, or one under way waits for the Lease), so the standbys need not wait for
/// their own clocks, which start only when they first read it.
fn lapsed_lease_to_release(input: &FailoverInput, next: &FailoverStatus, journal: &mut Journal) -> Option<LapsedLease> {
    let holder = input.lease?.holder.clone()?;
    let version = input.lease_lapsed?;
    if next.target_primary.as_deref() == Some(holder.as_str()) {
        return None;
    }
    let note = format!(
        "the primary lease held by {holder} was not renewed for a whole lease duration: {holder} has fenced itself; releasing the lease for the failover"
    );
    journal.record(true, "PrimaryLeaseLapsed", note, None);
    Some(LapsedLease { holder, version: version.to_string() })
}

/// The report of instance `primary`, if it has one.
fn primary_report<'a>(instances: &'a [InstanceObservation], primary: Option<&String>) -> Option<&'a InstanceReport> {
    instances.iter().find(|instance| Some(&instance.name) == primary).and_then(|instance| instance.report.as_ref())
}

/// What [`tell`] reads besides the action.
struct Telling<'a> {
    /// The failover status before this pass's decision.
    current: &'a FailoverStatus,
    /// The failover status after it.
    next: &'a FailoverStatus,
    /// The switchover a person asked for, if any.
    request: Option<&'a String>,
    generation: i64,
    now: DateTime<Utc>,
    /// Bytes of WAL a failover's promotion gives up (see `failover::decide::behind_reference`).
    behind: u64,
}

/// Tells what the failover decision did (events, ledger entries) and what it asks of apply
/// (release a gone primary's Lease, clear the switchover request).
fn tell(action: Action, told: &Telling, journal: &mut Journal, outcome: &mut FailoverOutcome) {
    match action {
        Action::Steady
        | Action::WaitingForStandbys { .. }
        | Action::WaitingForPromotion { .. }
        | Action::WaitingForSynchronousQuorum { .. } => {}
        Action::PrimaryFailing { primary, failover_in } => {
            if told.current.primary_failing_since.is_none() {
                let note = format!(
                    "primary {primary} is unhealthy; failover in {}s unless it recovers",
                    failover_in.as_secs()
                );
                journal.record(true, "PrimaryUnhealthy", note, None);
            }
        }
        Action::PrimaryRecovered { primary } => {
            journal.record(false, "PrimaryRecovered", format!("primary {primary} is healthy again"), None);
        }
        Action::FailoverBlocked { primary, reason } => {
            if told.current.primary_failing_since.is_some() || told.current.transition.is_some() {
                journal.record(
                    true,
                    "FailoverBlocked",
                    format!("primary {primary} is down but not failed over: {reason:?}"),
                    None,
                );
            }
        }
        Action::FailoverStarted { old_primary, release_lease } => {
            let note = format!("primary {old_primary} failed: choosing the most advanced standby");
            let entry =
                LedgerEntry::at(told.now, told.generation, "FailoverStarted", old_primary.clone(), PENDING, "started");
            journal.record(true, "FailoverStarted", note, Some(entry));
            if release_lease {
                outcome.release_lease_of = Some(old_primary);
            }
        }
        Action::NoCandidate { rejected } => {
            if told.current.target_primary.as_deref() != Some(PENDING) || told.current.transition.is_none() {
                journal.record(
                    true,
                    "NoFailoverCandidate",
                    format!("no standby can be promoted yet: {rejected:?}"),
                    None,
                );
            }
        }
        transition => tell_transition(transition, told, journal, outcome),
    }
}

/// Tells the steps of a failover or switchover under way, and the primaries found outside one.
fn tell_transition(action: Action, told: &Telling, journal: &mut Journal, outcome: &mut FailoverOutcome) {
    match action {
        Action::PromotionRequested { kind, target } => tell_promotion_requested(kind, target, told, journal),
        Action::CandidateLost { target, reason } => {
            journal.record(
                true,
                "PromotionFailed",
                format!("{target} could not be promoted ({reason:?}): choosing again"),
                None,
            );
        }
        Action::PrimaryChanged { kind, from, to, timeline, took } => {
            tell_primary_changed(kind, from, to, timeline, took, told, journal);
            outcome.clear_switchover_request = told.request.is_some();
        }
        Action::TransitionAbandoned { kind, reason } => {
            let entry = LedgerEntry::at(
                told.now,
                told.generation,
                &format!("{}Abandoned", kind_name(kind)),
                "",
                "",
                reason.clone(),
            );
            journal.record(true, &format!("{}Abandoned", kind_name(kind)), reason, Some(entry));
            outcome.clear_switchover_request = told.request.is_some() && kind == TransitionKind::Switchover;
        }
        Action::SwitchoverRejected { target, reason } => {
            journal.record(true, "SwitchoverRejected", format!("switchover to {target} refused: {reason:?}"), None);
            // Only a person's request is an annotation to remove (a rolling or drain switchover is not).
            outcome.clear_switchover_request = told.request.is_some();
        }
        Action::ForeignPrimary { instance } => {
            journal.record(
                true,
                "ForeignPrimary",
                format!("{instance} runs as primary without the primary lease; it is not behind the Service"),
                None,
            );
        }
        // Told by [`tell`].
        Action::Steady
        | Action::WaitingForStandbys { .. }
        | Action::WaitingForPromotion { .. }
        | Action::WaitingForSynchronousQuorum { .. }
        | Action::PrimaryFailing { .. }
        | Action::PrimaryRecovered { .. }
        | Action::FailoverBlocked { .. }
        | Action::FailoverStarted { .. }
        | Action::NoCandidate { .. } => {}
    }
}

/// Tells a promotion requested, with the WAL a failover's choice gives up (when it gives up any).
fn tell_promotion_requested(kind: TransitionKind, target: String, told: &Telling, journal: &mut Journal) {
    let from = told.next.transition.as_ref().map(|transition| transition.from.clone()).unwrap_or_default();
    let mut note = format!("{} from {from} to {target}: promoting {target}", kind_name(kind).to_lowercase());
    let mut outcome_text = "requested".to_string();
    if told.behind > 0 {
        // What the choice costs, in the ledger: the commits in that WAL are given up.
        let gap = format!(
            "{target} is {} bytes of WAL behind the last position known of {from}: the commits in it are given up",
            told.behind
        );
        note = format!("{note}; {gap}");
        outcome_text = format!("requested; {gap}");
    }
    let entry = LedgerEntry::at(
        told.now,
        told.generation,
        &format!("{}Promoting", kind_name(kind)),
        from,
        target,
        &outcome_text,
    );
    journal.record(told.behind > 0, &format!("{}Promoting", kind_name(kind)), note, Some(entry));
}

/// Tells a completed failover (a Warning) or switchover, with how long it took.
fn tell_primary_changed(
    kind: TransitionKind,
    from: String,
    to: String,
    timeline: u32,
    took: Duration,
    told: &Telling,
    journal: &mut Journal,
) {
    let seconds = format!("{:.1}s", took.as_secs_f64());
    let note =
        format!("{} from {from} to {to} completed in {seconds} (timeline {timeline})", kind_name(kind).to_lowercase());
    let entry = LedgerEntry::at(
        told.now,
        told.generation,
        kind_name(kind),
        from,
        to.clone(),
        format!("completed in {seconds}, timeline {timeline}"),
    );
    journal.record(kind == TransitionKind::Failover, &format!("{}Completed", kind_name(kind)), note, Some(entry));
}

/// How soon to look again while a change is in progress (reports also wake the controller).
pub const URGENT_REQUEUE: Duration = Duration::from_secs(1);
