//! Deciding what the workload runs this pass (pure): the spec's version or a rollback to the last
//! stable one, restarts of unhealthy pods with exponential backoff, degrading and restoring standbys.

use crate::api::database_service::{DatabaseService, DatabaseServiceStatus};
use crate::operator::conditions::{self, types};
use crate::operator::database::pod_health::{self, PodHealth};
use crate::operator::database::settings::ControllerSettings;
use crate::operator::journal::{parse_time, rfc3339, seconds_between, Journal, Transition};
use crate::operator::ledger::LedgerEntry;
use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;

/// What the workload should run after this pass's decisions.
#[derive(Clone, Debug, PartialEq)]
pub struct Rollout {
    /// Version running (the spec's, or the last stable one after a rollback).
    pub version: String,
    /// Image of that version.
    pub image: String,
    /// Instances to run (fewer than the spec's while degraded).
    pub replicas: i32,
    /// The workload runs the last stable version instead of the spec's.
    pub rolled_back: bool,
    /// A decision (rollback, restart, degrade, restore) changed the workload this pass.
    pub changed_workload: bool,
}

/// Restart backoff after `restarts` restarts: doubling from the first backoff, capped.
pub fn restart_backoff(settings: &ControllerSettings, restarts: i32) -> u64 {
    settings
        .restart_backoff
        .as_secs()
        .saturating_mul(1u64 << restarts.clamp(0, 16))
        .min(settings.restart_backoff_cap.as_secs())
}

/// What every healing decision of one pass reads.
struct Pass<'a> {
    database: &'a DatabaseService,
    pods: &'a [PodHealth],
    settings: &'a ControllerSettings,
    generation: i64,
    now: DateTime<Utc>,
}

/// Decides the image, the instance count and any rollback, restart, degrade or restore of this pass.
/// `past_the_way_back`: an in-place major upgrade's new server runs on data that has no way back
/// (see [`crate::operator::database::major_upgrade::past_the_way_back`]): the progress deadline
/// no longer rolls back, since the old image could not start on that data.
#[allow(clippy::too_many_arguments)]
pub fn decide_rollout(
    database: &DatabaseService,
    status: &mut DatabaseServiceStatus,
    pods: &[PodHealth],
    stateful_set: Option<&StatefulSet>,
    settings: &ControllerSettings,
    now: DateTime<Utc>,
    journal: &mut Journal,
    past_the_way_back: bool,
) -> Rollout {
    let old_status = status.clone();
    let spec = &database.spec;
    let pass = Pass { database, pods, settings, generation: database.metadata.generation.unwrap_or(0), now };
    if status.failed_generation.is_some_and(|failed| failed != pass.generation) {
        // The spec changed since the rollback: try again.
        status.failed_generation = None;
        status.failed_version = None;
        conditions::remove(&mut status.conditions, types::ROLLED_BACK);
    }
    let rolled_back = status.failed_generation == Some(pass.generation);
    let (version, image) = match (rolled_back, &status.last_stable_version, &status.last_stable_image) {
        (true, Some(version), Some(image)) => (version.clone(), image.clone()),
        _ => (spec.version.clone(), spec.image_or_default()),
    };
    let desired_replicas = spec.replicas_or_default();
    let replicas = status.degraded_replicas.unwrap_or(desired_replicas).min(desired_replicas);
    let rolled_out = pod_health::rolled_out(stateful_set, pods, &image, replicas);
    let mut rollout = Rollout { version, image, replicas, rolled_back, changed_workload: false };
    decide_rollback(&pass, status, rolled_out || past_the_way_back, &mut rollout, journal);
    // Restarts wait while a rollout is under way: the rollback handles an unhealthy new version.
    let rollout_in_progress = status.rollout_started_at.is_some() || stateful_set.is_none();
    if !rollout_in_progress && !rollout.changed_workload {
        rollout.changed_workload |= decide_restart(&pass, &old_status, status, journal);
    } else {
        recovered_after_restarts(&pass, &old_status, status, journal);
    }
    if desired_replicas > 1 {
        decide_degrade(&pass, status, &mut rollout, journal);
    }
    rollout
}

/// Rollback: a change away from the last stable image that stays unhealthy past the deadline
/// goes back to the last stable version.
fn decide_rollback(
    pass: &Pass,
    status: &mut DatabaseServiceStatus,
    rolled_out: bool,
    rollout: &mut Rollout,
    journal: &mut Journal,
) {
    let spec = &pass.database.spec;
    let upgrading =
        !rollout.rolled_back && status.last_stable_image.as_ref().is_some_and(|stable| *stable != rollout.image);
    if !upgrading {
        status.rollout_started_at = None;
        return;
    }
    if rolled_out {
        return;
    }
    let Some(started) = parse_time(&status.rollout_started_at) else {
        status.rollout_started_at = Some(rfc3339(pass.now));
        return;
    };
    let deadline = pass.settings.progress_deadline.as_secs();
    if seconds_between(started, pass.now) < deadline as i64 {
        return;
    }
    let stable_version = status.last_stable_version.clone().unwrap_or_default();
    let message = format!(
        "version {} did not become ready within {deadline}s; rolled back to {stable_version}. spec.version is left as written: change the spec to try again",
        spec.version,
    );
    roll_back(
        pass.database,
        status,
        rollout,
        journal,
        RollbackReason { condition_reason: "ProgressDeadlineExceeded", ledger: "progress deadline exceeded", message },
        pass.now,
    );
}

/// Why a change is rolled back: the condition's reason, the ledger's outcome and the message.
pub struct RollbackReason {
    /// `RolledBack` condition reason, such as `ProgressDeadlineExceeded`.
    pub condition_reason: &'static str,
    /// The ledger entry's outcome.
    pub ledger: &'static str,
    /// For people: the condition's message and the event's note.
    pub message: String,
}

/// Returns the workload to the last stable version and image for this generation of the spec
/// (until the spec changes), with the `RolledBack` condition, a Warning event and a ledger entry.
pub fn roll_back(
    database: &DatabaseService,
    status: &mut DatabaseServiceStatus,
    rollout: &mut Rollout,
    journal: &mut Journal,
    reason: RollbackReason,
    now: DateTime<Utc>,
) {
    let generation = database.metadata.generation.unwrap_or(0);
    let spec = &database.spec;
    let stable_version = status.last_stable_version.clone().unwrap_or_default();
    let entry =
        LedgerEntry::at(now, generation, "RolledBack", spec.version.clone(), stable_version.clone(), reason.ledger);
    let transition = Transition {
        condition: types::ROLLED_BACK,
        status: true,
        condition_reason: reason.condition_reason,
        event_reason: "RolledBack",
        warning: true,
        message: reason.message,
        entry: Some(entry),
    };
    journal.transition(&mut status.conditions, transition, generation, now);
    status.failed_generation = Some(generation);
    status.failed_version = Some(spec.version.clone());
    status.rollout_started_at = None;
    status.restart_count = 0;
    rollout.version = stable_version;
    rollout.image = status.last_stable_image.clone().unwrap_or(rollout.image.clone());
    rollout.rolled_back = true;
    rollout.changed_workload = true;
}

/// Restarts unhealthy pods with exponential backoff; true when it restarts them this pass.
fn decide_restart(
    pass: &Pass,
    old_status: &DatabaseServiceStatus,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
) -> bool {
    let threshold = pass.settings.unhealthy_threshold.as_secs() as i64;
    let unhealthy = pod_health::unhealthy_pods(pass.pods, pass.now, threshold);
    if unhealthy.is_empty() {
        recovered_after_restarts(pass, old_status, status, journal);
        return false;
    }
    let backoff = restart_backoff(pass.settings, old_status.restart_count);
    let due =
        parse_time(&old_status.last_restart_at).is_none_or(|last| seconds_between(last, pass.now) >= backoff as i64);
    if !due {
        return false;
    }
    let names: Vec<&str> = unhealthy.iter().map(|pod| pod.name.as_str()).collect();
    status.restart_count = old_status.restart_count + 1;
    status.last_restart_at = Some(rfc3339(pass.now));
    let next = restart_backoff(pass.settings, status.restart_count);
    let message = format!(
        "pods {} unhealthy (crash-looping or not ready); restart {} (next no sooner than {next}s)",
        names.join(", "),
        status.restart_count
    );
    let entry = LedgerEntry::at(
        pass.now,
        pass.generation,
        "Restarted",
        names.join(","),
        format!("attempt {}", status.restart_count),
        "pods restarted",
    );
    journal.record(true, "Restarted", message, Some(entry));
    true
}

/// After restarts, every pod ready again: the restart count starts over.
fn recovered_after_restarts(
    pass: &Pass,
    old_status: &DatabaseServiceStatus,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
) {
    let threshold = pass.settings.unhealthy_threshold.as_secs() as i64;
    let all_ready = !pass.pods.is_empty() && pass.pods.iter().all(|pod| pod.ready);
    if old_status.restart_count > 0
        && all_ready
        && pod_health::unhealthy_pods(pass.pods, pass.now, threshold).is_empty()
    {
        status.restart_count = 0;
        let entry =
            LedgerEntry::at(pass.now, pass.generation, "Recovered", "unhealthy", "ready", "all instances ready");
        journal.record(false, "Recovered", "all instances are ready again".into(), Some(entry));
    }
}

/// Degrade: standbys that cannot be scheduled are scaled away so the primary stays healthy; and
/// after a while, every instance is asked for again (restore).
fn decide_degrade(pass: &Pass, status: &mut DatabaseServiceStatus, rollout: &mut Rollout, journal: &mut Journal) {
    let threshold = pass.settings.unhealthy_threshold.as_secs() as i64;
    // After a failover the primary may have a higher ordinal than an unschedulable standby; a
    // StatefulSet scales down from the highest ordinal, so degrading then would remove the primary.
    let primary_ordinal = status
        .failover
        .current_primary
        .as_deref()
        .and_then(|primary| pass.pods.iter().find(|pod| pod.name == primary))
        .map_or(0, |pod| pod.ordinal);
    let replicas = rollout.replicas;
    if let Some(prefix) = pod_health::schedulable_prefix(pass.pods, replicas, pass.now, threshold) {
        if prefix >= 1 && prefix < replicas && primary_ordinal < prefix {
            degrade(pass, prefix, status, rollout, journal);
        }
        return;
    }
    let Some(degraded) = status.degraded_replicas else { return };
    let waited = parse_time(&status.degraded_at).map(|since| seconds_between(since, pass.now)).unwrap_or(i64::MAX);
    if waited < pass.settings.restore_probe.as_secs() as i64
        || !pass.pods.iter().filter(|pod| pod.ordinal < degraded).all(|pod| pod.ready)
    {
        return;
    }
    // Probe: ask for every instance again; if resources are still short, we degrade again.
    let desired_replicas = pass.database.spec.replicas_or_default();
    status.degraded_replicas = None;
    let entry = LedgerEntry::at(
        pass.now,
        pass.generation,
        "RestoreAttempt",
        degraded.to_string(),
        desired_replicas.to_string(),
        "probing for resources",
    );
    let transition = Transition {
        condition: types::DEGRADED,
        status: true,
        condition_reason: "Restoring",
        event_reason: "Restoring",
        warning: false,
        message: format!("trying {desired_replicas} instances again"),
        entry: Some(entry),
    };
    journal.transition(&mut status.conditions, transition, pass.generation, pass.now);
    rollout.replicas = desired_replicas;
    rollout.changed_workload = true;
}

/// Scales the standbys from ordinal `prefix` on away (they cannot be scheduled), with the
/// scheduler's reason in the `Degraded` condition.
fn degrade(pass: &Pass, prefix: i32, status: &mut DatabaseServiceStatus, rollout: &mut Rollout, journal: &mut Journal) {
    let replicas = rollout.replicas;
    let desired_replicas = pass.database.spec.replicas_or_default();
    let first = format!("{}-{prefix}", pass.database.name_any());
    // The scheduler's own words say which: resources, anti-affinity, selectors, taints.
    let reason = pass
        .pods
        .iter()
        .find(|pod| pod.name == first)
        .and_then(|pod| pod.unschedulable_reason.as_deref())
        .map(|reason| format!(" (the scheduler: {reason})"))
        .unwrap_or_default();
    let message =
        format!("standbys from {first} cannot be scheduled{reason}; running {prefix} of {desired_replicas} instances");
    let entry = LedgerEntry::at(
        pass.now,
        pass.generation,
        "Degraded",
        replicas.to_string(),
        prefix.to_string(),
        "standbys scaled away",
    );
    let transition = Transition {
        condition: types::DEGRADED,
        status: true,
        condition_reason: "InsufficientResources",
        event_reason: "Degraded",
        warning: true,
        message,
        entry: Some(entry),
    };
    journal.transition(&mut status.conditions, transition, pass.generation, pass.now);
    status.degraded_replicas = Some(prefix);
    status.degraded_at = Some(rfc3339(pass.now));
    rollout.replicas = prefix;
    rollout.changed_workload = true;
}
