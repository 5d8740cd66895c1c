//! The status summary (phase and conditions), and writing status, ledger and events at the end of a pass.

use super::decide::Decisions;
use super::reconcile::Journal;
use crate::api::{DatabaseService, DatabaseServiceStatus, Phase, FIELD_MANAGER};
use crate::controller::conditions::{self, types};
use crate::controller::health::PodHealth;
use crate::controller::ledger::{self, LedgerEntry};
use crate::controller::{Context, ReconcileError};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

/// Computes phase, readiness, versions and conditions from what this pass observed and decided.
pub(super) fn summarize(
    database: &DatabaseService,
    old_status: &DatabaseServiceStatus,
    status: &mut DatabaseServiceStatus,
    pods: &[PodHealth],
    decisions: &Decisions,
    rolled_out: bool,
    journal: &mut Journal,
) {
    let generation = database.metadata.generation.unwrap_or(0);
    status.observed_generation = Some(generation);
    status.ready_replicas =
        pods.iter().filter(|pod| pod.ready && pod.ordinal < decisions.replicas && !pod.terminating).count() as i32;
    if rolled_out {
        if status.current_version.as_deref() != Some(decisions.version.as_str()) {
            let from = status.current_version.clone().unwrap_or_default();
            if from.is_empty() {
                journal.record(
                    false,
                    "Ready",
                    format!("PostgreSQL {} is ready", decisions.version),
                    Some(LedgerEntry::now(generation, "Ready", "", decisions.version.clone(), "all instances ready")),
                );
            } else if !decisions.rolled_back {
                journal.record(
                    false,
                    "Upgraded",
                    format!("now running {}", decisions.version),
                    Some(LedgerEntry::now(generation, "Upgrade", from, decisions.version.clone(), "succeeded")),
                );
            }
        }
        status.current_version = Some(decisions.version.clone());
        if !decisions.rolled_back {
            status.last_stable_version = Some(decisions.version.clone());
            status.last_stable_image = Some(decisions.image.clone());
        }
    }
    let desired_replicas = database.spec.replicas_or_default();
    let full = decisions.replicas == desired_replicas;
    if full && rolled_out && conditions::is_true(&status.conditions, types::DEGRADED) {
        conditions::set(
            &mut status.conditions,
            types::DEGRADED,
            false,
            "Recovered",
            format!("all {desired_replicas} instances are running"),
            Some(generation),
        );
        status.degraded_at = None;
        journal.record(
            false,
            "Recovered",
            format!("all {desired_replicas} instances are running again"),
            Some(LedgerEntry::now(
                generation,
                "Recovered",
                "degraded",
                desired_replicas.to_string(),
                "standbys restored",
            )),
        );
    }
    let crash_looping = pods.iter().any(|pod| pod.crash_looping);
    let phase = if decisions.rolled_back && !rolled_out {
        Phase::RollingBack
    } else if status.degraded_replicas.is_some() && status.ready_replicas >= 1 {
        Phase::Degraded
    } else if crash_looping && status.restart_count >= 3 && !rolled_out {
        Phase::Failed
    } else if status.last_stable_version.is_none() {
        Phase::Provisioning
    } else if !rolled_out {
        Phase::Updating
    } else {
        Phase::Running
    };
    status.phase = Some(phase);
    let ready_message = format!("{} of {} instances ready", status.ready_replicas, decisions.replicas);
    conditions::set(
        &mut status.conditions,
        types::READY,
        rolled_out,
        if rolled_out { "AllInstancesReady" } else { "InstancesNotReady" },
        ready_message,
        Some(generation),
    );
    let (progressing, reason) = match phase {
        Phase::Provisioning => (true, "Provisioning"),
        Phase::Updating => (true, "RollingOut"),
        Phase::RollingBack => (true, "RollingBack"),
        _ => (false, "Stable"),
    };
    let progress_message = if progressing {
        format!("rolling out {} ({})", decisions.version, decisions.image)
    } else {
        format!("running {}", decisions.version)
    };
    conditions::set(
        &mut status.conditions,
        types::PROGRESSING,
        progressing,
        reason,
        progress_message,
        Some(generation),
    );
    if decisions.rolled_back && !old_status.conditions.iter().any(|condition| condition.type_ == types::ROLLED_BACK) {
        // Keep the explanation visible even if the condition was set in an earlier pass.
        conditions::set(
            &mut status.conditions,
            types::ROLLED_BACK,
            true,
            "ProgressDeadlineExceeded",
            format!("running {}; spec asks for {}", decisions.version, database.spec.version),
            Some(generation),
        );
    }
}

/// Writes status (only when it changed), the ledger and the events.
pub(super) async fn finish(
    database: &DatabaseService,
    context: &Context,
    old_status: &DatabaseServiceStatus,
    status: DatabaseServiceStatus,
    journal: Journal,
) -> Result<(), ReconcileError> {
    let namespace = database.namespace().unwrap_or_default();
    let name = database.name_any();
    if *old_status != status || database.status.is_none() {
        let api: Api<DatabaseService> = Api::namespaced(context.client.clone(), &namespace);
        let body = json!({
            "apiVersion": DatabaseService::api_version(&()),
            "kind": DatabaseService::kind(&()),
            "metadata": {"name": name},
            "status": status,
        });
        api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await?;
        context.metrics.count_write("DatabaseService", "status");
    }
    let config_maps: Api<ConfigMap> = Api::namespaced(context.client.clone(), &namespace);
    ledger::record(&config_maps, database, &journal.entries, true, &context.metrics).await?;
    publish_events(database, context, &journal).await;
    Ok(())
}

/// Best effort for a pass that failed half-way: ledger entries and events of what was done.
pub(super) async fn publish(database: &DatabaseService, context: &Context, journal: &Journal) {
    let config_maps: Api<ConfigMap> =
        Api::namespaced(context.client.clone(), &database.namespace().unwrap_or_default());
    if let Err(error) = ledger::record(&config_maps, database, &journal.entries, true, &context.metrics).await {
        tracing::warn!(%error, "could not write the ledger");
    }
    publish_events(database, context, journal).await;
}

/// Publishes the pass's events; a failure to publish never fails the reconciliation.
pub(super) async fn publish_events(database: &DatabaseService, context: &Context, journal: &Journal) {
    let reference = database.object_ref(&());
    for event in &journal.events {
        if let Err(error) = context.recorder.publish(event, &reference).await {
            tracing::warn!(%error, reason = %event.reason, "could not publish an event");
        }
    }
}
