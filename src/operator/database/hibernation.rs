//! Hibernation (issue 42): `spec.hibernated` stops every instance and the pooler and keeps the
//! volumes, Secrets, Services and backups; clearing it wakes the database on the same volumes
//! with the same primary. Pure: the status, the journal and whether a wake holds failover.
//!
//! Why the same primary: the instances stop at once, and the primary may stop after a standby
//! with commits the standby never received. On waking, every instance starts at once too, and
//! a standby that is ready first must not be promoted in the primary's place, so failover waits
//! for the primary, up to [`WAKE_HOLD`] (after that its node may be gone, and the failover rules
//! apply as on any day).

use crate::api::database_service::{DatabaseService, DatabaseServiceStatus, Phase};
use crate::api::failover::Role;
use crate::operator::conditions::{self, types};
use crate::operator::database::failover::pass::report_of;
use crate::operator::database::pod_health::PodHealth;
use crate::operator::journal::{Journal, Transition};
use crate::operator::ledger::LedgerEntry;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use std::sync::Arc;
use std::time::Duration;

/// How long a wake holds failover at most.
pub const WAKE_HOLD: Duration = Duration::from_secs(300);

/// Seconds since the Hibernated condition last changed status (the start of the hibernation or
/// of the wake: a change of reason alone keeps the time).
fn seconds_since_change(status: &DatabaseServiceStatus, now: DateTime<Utc>) -> Option<i64> {
    let condition = status.conditions.iter().find(|condition| condition.type_ == types::HIBERNATED)?;
    let since = DateTime::from_timestamp(condition.last_transition_time.0.as_second(), 0)?;
    Some((now - since).num_seconds().max(0))
}

/// A hibernated database's status: Hibernating while its pods or its pooler's stop, Hibernated
/// once none is left; told once each (condition, Event, ledger entry).
pub fn decide_hibernating(
    database: &DatabaseService,
    pods: &[PodHealth],
    pooler_pods: usize,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    now: DateTime<Utc>,
) {
    let generation = database.metadata.generation.unwrap_or(0);
    let primary = status.failover.current_primary.clone().unwrap_or_default();
    let pods_left = pods.len() + pooler_pods;
    let was_hibernating = conditions::is_true(&status.conditions, types::HIBERNATED);
    let transition = if pods_left > 0 {
        Transition {
            condition: types::HIBERNATED,
            status: true,
            condition_reason: "Hibernating",
            event_reason: "Hibernating",
            warning: false,
            message: format!("hibernating: {pods_left} pods stopping; the data stays on the volumes"),
            entry: Some(LedgerEntry::at(now, generation, "Hibernating", primary.clone(), "", "instances stopping")),
        }
    } else {
        let took = seconds_since_change(status, now).filter(|_| was_hibernating).unwrap_or(0);
        Transition {
            condition: types::HIBERNATED,
            status: true,
            condition_reason: "Hibernated",
            event_reason: "Hibernated",
            warning: false,
            message: format!("hibernated: no instance runs; set spec.hibernated to false to wake {primary} again"),
            entry: Some(LedgerEntry::at(
                now,
                generation,
                "Hibernated",
                primary,
                "",
                format!("every instance stopped in {took} s"),
            )),
        }
    };
    journal.transition_on_change(&mut status.conditions, transition, generation, now);
    status.phase = Some(if pods_left > 0 { Phase::Hibernating } else { Phase::Hibernated });
    status.observed_generation = Some(generation);
    status.ready_replicas = pods.iter().filter(|pod| pod.ready && !pod.terminating).count() as i32;
    if pods.is_empty() {
        status.instances.clear();
    }
    let message = "hibernated by spec.hibernated".to_string();
    conditions::set(&mut status.conditions, types::READY, false, "Hibernated", message, Some(generation), now);
    conditions::remove(&mut status.conditions, types::PROGRESSING);
}

/// Whether the current primary is back: its pod Ready, its agent reporting a ready primary.
pub fn primary_back(status: &DatabaseServiceStatus, pods: &[Arc<Pod>], health: &[PodHealth]) -> bool {
    let Some(primary) = status.failover.current_primary.as_deref() else { return false };
    pods.iter().zip(health).any(|(pod, health)| {
        pod.name_any() == primary
            && health.ready
            && !health.terminating
            && report_of(pod).is_some_and(|report| report.role == Role::Primary && report.postgres_ready)
    })
}

/// A database that is not (or no longer) hibernated: starts or ends a wake, and says whether
/// the wake holds failover this pass.
pub fn decide_wake(
    database: &DatabaseService,
    status: &mut DatabaseServiceStatus,
    primary_is_back: bool,
    journal: &mut Journal,
    now: DateTime<Utc>,
) -> bool {
    let Some(condition) = status.conditions.iter().find(|condition| condition.type_ == types::HIBERNATED) else {
        return false;
    };
    let generation = database.metadata.generation.unwrap_or(0);
    let primary = status.failover.current_primary.clone().unwrap_or_default();
    if condition.status == "True" {
        let transition = Transition {
            condition: types::HIBERNATED,
            status: false,
            condition_reason: "Waking",
            event_reason: "Waking",
            warning: false,
            message: format!("waking: failover waits for the primary {primary} to start"),
            entry: Some(LedgerEntry::at(now, generation, "Waking", "", primary, "instances starting")),
        };
        journal.transition(&mut status.conditions, transition, generation, now);
        return !primary_is_back;
    }
    let waited = seconds_since_change(status, now).unwrap_or(0);
    if primary_is_back {
        conditions::remove(&mut status.conditions, types::HIBERNATED);
        let entry =
            LedgerEntry::at(now, generation, "Woken", "", primary.clone(), format!("primary back in {waited} s"));
        journal.record(false, "Woken", format!("woken: the primary {primary} is back after {waited} s"), Some(entry));
        return false;
    }
    if waited >= WAKE_HOLD.as_secs() as i64 {
        conditions::remove(&mut status.conditions, types::HIBERNATED);
        let note = format!(
            "the primary {primary} did not come back within {} s of the wake: the failover rules apply again",
            WAKE_HOLD.as_secs()
        );
        let entry = LedgerEntry::at(now, generation, "WakeHoldEnded", "", primary, note.clone());
        journal.record(true, "WakeHoldEnded", note, Some(entry));
        return false;
    }
    true
}
