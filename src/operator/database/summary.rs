//! The status summary (pure): phase, ready instances, versions and the Ready, Progressing,
//! Degraded and RolledBack conditions from what this pass observed and decided.

use crate::api::database_service::{DatabaseService, DatabaseServiceStatus, Phase};
use crate::operator::conditions::{self, types};
use crate::operator::database::healing::Rollout;
use crate::operator::database::pod_health::PodHealth;
use crate::operator::journal::Journal;
use crate::operator::ledger::LedgerEntry;
use chrono::{DateTime, Utc};

/// Pods crash-looping after this many restarts make the phase Failed.
pub const FAILED_AFTER_RESTARTS: i32 = 3;

/// Computes phase, readiness, versions and conditions.
pub fn summarize(
    database: &DatabaseService,
    status: &mut DatabaseServiceStatus,
    pods: &[PodHealth],
    rollout: &Rollout,
    rolled_out: bool,
    now: DateTime<Utc>,
    journal: &mut Journal,
) {
    let generation = database.metadata.generation.unwrap_or(0);
    let had_rolled_back_condition = status.conditions.iter().any(|condition| condition.type_ == types::ROLLED_BACK);
    status.observed_generation = Some(generation);
    status.ready_replicas =
        pods.iter().filter(|pod| pod.ready && pod.ordinal < rollout.replicas && !pod.terminating).count() as i32;
    if rolled_out {
        record_version(status, rollout, generation, now, journal);
    }
    let desired_replicas = database.spec.replicas_or_default();
    let full = rollout.replicas == desired_replicas;
    if full && rolled_out && conditions::is_true(&status.conditions, types::DEGRADED) {
        let entry = LedgerEntry::at(
            now,
            generation,
            "Recovered",
            "degraded",
            desired_replicas.to_string(),
            "standbys restored",
        );
        // The event says "again" (the condition only what is): two calls, not one transition.
        let message = format!("all {desired_replicas} instances are running");
        conditions::set(&mut status.conditions, types::DEGRADED, false, "Recovered", message, Some(generation), now);
        journal.record(false, "Recovered", format!("all {desired_replicas} instances are running again"), Some(entry));
        status.degraded_at = None;
    }
    let phase = phase_of(status, pods, rollout, rolled_out);
    status.phase = Some(phase);
    set_ready_and_progressing(status, rollout, rolled_out, phase, generation, now);
    if rollout.rolled_back && !had_rolled_back_condition {
        // Keep the explanation visible even if the condition was set in an earlier pass.
        conditions::set(
            &mut status.conditions,
            types::ROLLED_BACK,
            true,
            "ProgressDeadlineExceeded",
            format!("running {}; spec asks for {}", rollout.version, database.spec.version),
            Some(generation),
            now,
        );
    }
}

/// A rolled-out version becomes the current one (and the last stable one unless it is a
/// rollback); the first one is Ready, a later one an upgrade.
fn record_version(
    status: &mut DatabaseServiceStatus,
    rollout: &Rollout,
    generation: i64,
    now: DateTime<Utc>,
    journal: &mut Journal,
) {
    if status.current_version.as_deref() != Some(rollout.version.as_str()) {
        let from = status.current_version.clone().unwrap_or_default();
        if from.is_empty() {
            let entry = LedgerEntry::at(now, generation, "Ready", "", rollout.version.clone(), "all instances ready");
            journal.record(false, "Ready", format!("PostgreSQL {} is ready", rollout.version), Some(entry));
        } else if !rollout.rolled_back {
            let entry = LedgerEntry::at(now, generation, "Upgrade", from, rollout.version.clone(), "succeeded");
            journal.record(false, "Upgraded", format!("now running {}", rollout.version), Some(entry));
        }
    }
    status.current_version = Some(rollout.version.clone());
    if !rollout.rolled_back {
        status.last_stable_version = Some(rollout.version.clone());
        status.last_stable_image = Some(rollout.image.clone());
    }
}

/// The phase, from the most to the least urgent state.
fn phase_of(status: &DatabaseServiceStatus, pods: &[PodHealth], rollout: &Rollout, rolled_out: bool) -> Phase {
    let crash_looping = pods.iter().any(|pod| pod.crash_looping);
    if rollout.rolled_back && !rolled_out {
        Phase::RollingBack
    } else if status.degraded_replicas.is_some() && status.ready_replicas >= 1 {
        Phase::Degraded
    } else if crash_looping && status.restart_count >= FAILED_AFTER_RESTARTS && !rolled_out {
        Phase::Failed
    } else if status.last_stable_version.is_none() {
        Phase::Provisioning
    } else if !rolled_out {
        Phase::Updating
    } else {
        Phase::Running
    }
}

/// The Ready and Progressing conditions of the phase.
fn set_ready_and_progressing(
    status: &mut DatabaseServiceStatus,
    rollout: &Rollout,
    rolled_out: bool,
    phase: Phase,
    generation: i64,
    now: DateTime<Utc>,
) {
    let ready_message = format!("{} of {} instances ready", status.ready_replicas, rollout.replicas);
    let ready_reason = if rolled_out { "AllInstancesReady" } else { "InstancesNotReady" };
    conditions::set(
        &mut status.conditions,
        types::READY,
        rolled_out,
        ready_reason,
        ready_message,
        Some(generation),
        now,
    );
    let (progressing, reason) = match phase {
        Phase::Provisioning => (true, "Provisioning"),
        Phase::Updating => (true, "RollingOut"),
        Phase::RollingBack => (true, "RollingBack"),
        _ => (false, "Stable"),
    };
    let progress_message = if progressing {
        format!("rolling out {} ({})", rollout.version, rollout.image)
    } else {
        format!("running {}", rollout.version)
    };
    conditions::set(
        &mut status.conditions,
        types::PROGRESSING,
        progressing,
        reason,
        progress_message,
        Some(generation),
        now,
    );
}
