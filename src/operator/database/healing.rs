//! Deciding what the workload runs this pass (pure): the spec's version or a rollback to the last
//! stable one, restarts of unhealthy pods with exponential backoff, degrading and restoring standbys.

use crate::api::database_service::{DatabaseService, DatabaseServiceStatus};
use crate::operator::conditions::{self, types};
use crate::operator::database::pod_health::{self, PodHealth};
use crate::operator::database::settings::ControllerSettings;
use crate::operator::journal::{parse_time, rfc3339, seconds_between, Journal};
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

/// Decides the image, the instance count and any rollback, restart, degrade or restore of this pass.
pub fn decide_rollout(
    database: &DatabaseService,
    status: &mut DatabaseServiceStatus,
    pods: &[PodHealth],
    stateful_set: Option<&StatefulSet>,
    settings: &ControllerSettings,
    now: DateTime<Utc>,
    journal: &mut Journal,
) -> Rollout {
    let old_status = status.clone();
    let spec = &database.spec;
    let generation = database.metadata.generation.unwrap_or(0);
    let desired_replicas = spec.replicas_or_default();
    let threshold = settings.unhealthy_threshold.as_secs() as i64;
    let mut changed_workload = false;
    if status.failed_generation.is_some_and(|failed| failed != generation) {
        // The spec changed since the rollback: try again.
        status.failed_generation = None;
        status.failed_version = None;
        conditions::remove(&mut status.conditions, types::ROLLED_BACK);
    }
    let mut rolled_back = status.failed_generation == Some(generation);
    let (mut version, mut image) = match (rolled_back, &status.last_stable_version, &status.last_stable_image) {
        (true, Some(version), Some(image)) => (version.clone(), image.clone()),
        _ => (spec.version.clone(), spec.image_or_default()),
    };
    let mut replicas = status.degraded_replicas.unwrap_or(desired_replicas).min(desired_replicas);
    let rolled_out = pod_health::rolled_out(stateful_set, pods, &image, replicas);

    // Rollback: a change away from the last stable image that stays unhealthy past the deadline.
    let upgrading = !rolled_back && status.last_stable_image.as_ref().is_some_and(|stable| *stable != image);
    if upgrading && !rolled_out {
        match parse_time(&status.rollout_started_at) {
            None => status.rollout_started_at = Some(rfc3339(now)),
            Some(started) if seconds_between(started, now) >= settings.progress_deadline.as_secs() as i64 => {
                let stable_version = status.last_stable_version.clone().unwrap_or_default();
                let message = format!(
                    "version {} did not become ready within {}s; rolled back to {stable_version}. spec.version is left as written: change the spec to try again",
                    spec.version,
                    settings.progress_deadline.as_secs()
                );
                conditions::set(
                    &mut status.conditions,
                    types::ROLLED_BACK,
                    true,
                    "ProgressDeadlineExceeded",
                    message.clone(),
                    Some(generation),
                    now,
                );
                let entry = LedgerEntry::at(
                    now,
                    generation,
                    "RolledBack",
                    spec.version.clone(),
                    stable_version.clone(),
                    "progress deadline exceeded",
                );
                journal.record(true, "RolledBack", message, Some(entry));
                status.failed_generation = Some(generation);
                status.failed_version = Some(spec.version.clone());
                status.rollout_started_at = None;
                status.restart_count = 0;
                version = stable_version;
                image = status.last_stable_image.clone().unwrap_or(image);
                rolled_back = true;
                changed_workload = true;
            }
            Some(_) => {}
        }
    } else if !upgrading {
        status.rollout_started_at = None;
    }

    // Restart unhealthy pods with exponential backoff (not during a rollout: rollback handles that).
    let unhealthy = pod_health::unhealthy_pods(pods, now, threshold);
    let rollout_in_progress = status.rollout_started_at.is_some() || stateful_set.is_none();
    if !unhealthy.is_empty() && !rollout_in_progress && !changed_workload {
        let backoff = restart_backoff(settings, old_status.restart_count);
        let due =
            parse_time(&old_status.last_restart_at).is_none_or(|last| seconds_between(last, now) >= backoff as i64);
        if due {
            let names: Vec<&str> = unhealthy.iter().map(|pod| pod.name.as_str()).collect();
            status.restart_count = old_status.restart_count + 1;
            status.last_restart_at = Some(rfc3339(now));
            let next = restart_backoff(settings, status.restart_count);
            let message = format!(
                "pods {} unhealthy (crash-looping or not ready); restart {} (next no sooner than {next}s)",
                names.join(", "),
                status.restart_count
            );
            let entry = LedgerEntry::at(
                now,
                generation,
                "Restarted",
                names.join(","),
                format!("attempt {}", status.restart_count),
                "pods restarted",
            );
            journal.record(true, "Restarted", message, Some(entry));
            changed_workload = true;
        }
    } else if unhealthy.is_empty()
        && old_status.restart_count > 0
        && pods.iter().all(|pod| pod.ready)
        && !pods.is_empty()
    {
        status.restart_count = 0;
        let entry = LedgerEntry::at(now, generation, "Recovered", "unhealthy", "ready", "all instances ready");
        journal.record(false, "Recovered", "all instances are ready again".into(), Some(entry));
    }

    // Degrade: standbys that cannot be scheduled are scaled away so the primary stays healthy.
    // After a failover the primary may have a higher ordinal than an unschedulable standby; a
    // StatefulSet scales down from the highest ordinal, so degrading then would remove the primary.
    let primary_ordinal = status
        .failover
        .current_primary
        .as_deref()
        .and_then(|primary| pods.iter().find(|pod| pod.name == primary))
        .map_or(0, |pod| pod.ordinal);
    if desired_replicas > 1 {
        if let Some(prefix) = pod_health::schedulable_prefix(pods, replicas, now, threshold) {
            if prefix >= 1 && prefix < replicas && primary_ordinal < prefix {
                let message = format!("standbys from {}-{prefix} cannot be scheduled for lack of resources; running {prefix} of {desired_replicas} instances", database.name_any());
                conditions::set(
                    &mut status.conditions,
                    types::DEGRADED,
                    true,
                    "InsufficientResources",
                    message.clone(),
                    Some(generation),
                    now,
                );
                let entry = LedgerEntry::at(
                    now,
                    generation,
                    "Degraded",
                    replicas.to_string(),
                    prefix.to_string(),
                    "standbys scaled away",
                );
                journal.record(true, "Degraded", message, Some(entry));
                status.degraded_replicas = Some(prefix);
                status.degraded_at = Some(rfc3339(now));
                replicas = prefix;
                changed_workload = true;
            }
        } else if let Some(degraded) = status.degraded_replicas {
            let waited = parse_time(&status.degraded_at).map(|since| seconds_between(since, now)).unwrap_or(i64::MAX);
            if waited >= settings.restore_probe.as_secs() as i64
                && pods.iter().filter(|pod| pod.ordinal < degraded).all(|pod| pod.ready)
            {
                // Probe: ask for every instance again; if resources are still short, we degrade again.
                status.degraded_replicas = None;
                let message = format!("trying {desired_replicas} instances again");
                conditions::set(
                    &mut status.conditions,
                    types::DEGRADED,
                    true,
                    "Restoring",
                    message.clone(),
                    Some(generation),
                    now,
                );
                let entry = LedgerEntry::at(
                    now,
                    generation,
                    "RestoreAttempt",
                    degraded.to_string(),
                    desired_replicas.to_string(),
                    "probing for resources",
                );
                journal.record(false, "Restoring", message, Some(entry));
                replicas = desired_replicas;
                changed_workload = true;
            }
        }
    }
    Rollout { version, image, replicas, rolled_back, changed_workload }
}
