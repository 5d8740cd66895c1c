//! The reconcile pipeline for one DatabaseService:
//! validate → observe → decide (credentials, rollout, restart, degrade) → build (pure) → apply
//! (only what differs) → storage and pod labels → status (only when changed) → ledger and events.

use super::build::{self, ChildNames, WorkloadInputs, ROLE_LABEL};
use super::conditions::{self, types};
use super::health::{self, PodHealth};
use super::ledger::{self, LedgerEntry};
use super::{Context, ReconcileError};
use crate::api::{DatabaseService, DatabaseServiceStatus, Phase, StorageStatus, FIELD_MANAGER};
use crate::controller::apply::{apply as apply_object, ApplyOutcome};
use crate::quantity::parse_bytes;
use crate::validation::{validate, ValidationSettings};
use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use std::time::Duration;

/// Decisions and records of one pass, published at the end.
#[derive(Default)]
pub(super) struct Journal {
    pub entries: Vec<LedgerEntry>,
    pub events: Vec<Event>,
}

impl Journal {
    pub fn record(&mut self, warning: bool, reason: &str, note: String, entry: Option<LedgerEntry>) {
        self.events.push(Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        });
        self.entries.extend(entry);
    }
}

fn now() -> DateTime<Utc> {
    Utc::now()
}

fn rfc3339(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn parse_time(text: &Option<String>) -> Option<DateTime<Utc>> {
    text.as_deref().and_then(|text| DateTime::parse_from_rfc3339(text).ok()).map(|time| time.with_timezone(&Utc))
}

/// Reconciles a DatabaseService that is not being deleted.
pub(super) async fn apply(database: &DatabaseService, context: &Context) -> Result<Action, ReconcileError> {
    let client = &context.client;
    let namespace = database.namespace().unwrap_or_default();
    let name = database.name_any();
    let generation = database.metadata.generation.unwrap_or(0);
    let old_status = database.status.clone().unwrap_or_default();
    let mut status = old_status.clone();
    let mut journal = Journal::default();

    if database.spec.is_paused() {
        conditions::set(
            &mut status.conditions,
            types::PAUSED,
            true,
            "Paused",
            "spec.paused is true: the operator changes nothing",
            Some(generation),
        );
        if !conditions::is_true(&old_status.conditions, types::PAUSED) {
            journal.record(
                false,
                "Paused",
                "reconciliation paused by spec.paused".into(),
                Some(LedgerEntry::now(generation, "Paused", "", "", "reconciliation paused")),
            );
        }
        finish(database, context, &old_status, status, journal).await?;
        return Ok(Action::await_change());
    }
    if conditions::is_true(&old_status.conditions, types::PAUSED) {
        journal.record(
            false,
            "Resumed",
            "reconciliation resumed".into(),
            Some(LedgerEntry::now(generation, "Resumed", "", "", "reconciliation resumed")),
        );
    }
    conditions::remove(&mut status.conditions, types::PAUSED);

    // 1. Validate with the same function as the webhook: an invalid object changes nothing.
    let settings = ValidationSettings::new(&context.settings.min_storage_size).expect("checked at start-up");
    let outcome = validate(database, None, &settings);
    if !outcome.is_allowed() {
        let message = outcome.message();
        if !conditions::is_true(&old_status.conditions, types::INVALID_SPEC) {
            journal.record(
                true,
                "InvalidSpec",
                message.clone(),
                Some(LedgerEntry::now(generation, "InvalidSpec", "", "", message.clone())),
            );
        }
        conditions::set(
            &mut status.conditions,
            types::INVALID_SPEC,
            true,
            "ValidationFailed",
            message,
            Some(generation),
        );
        status.phase = Some(Phase::Failed);
        status.observed_generation = Some(generation);
        finish(database, context, &old_status, status, journal).await?;
        return Ok(Action::await_change());
    }
    conditions::remove(&mut status.conditions, types::INVALID_SPEC);

    // 2. Observe.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let selector = ListParams::default().labels(&build::label_selector(&name));
    let live_stateful_set = stateful_sets.get_opt(&name).await?;
    let pods = pods_api.list(&selector).await?.items;
    let claims = claims_api.list(&selector).await?.items;
    let pod_health: Vec<PodHealth> = pods.iter().map(health::pod_health).collect();
    let now = now();

    match old_status.observed_generation {
        None => journal.entries.push(LedgerEntry::now(
            generation,
            "Created",
            "",
            format!("{} x{}", database.spec.version, database.spec.replicas_or_default()),
            "provisioning started",
        )),
        Some(observed) if observed != generation => journal.entries.push(LedgerEntry::now(
            generation,
            "SpecChanged",
            format!("generation {observed}"),
            format!("generation {generation}"),
            "spec updated",
        )),
        Some(_) => {}
    }

    // 3. Credentials: created once, never overwritten.
    ensure_credentials(database, &secrets, &old_status, &mut status, &mut journal, context).await?;

    // 4. Decide what runs: the spec's version, or the last stable one after a rollback.
    let decisions =
        decide(database, &old_status, &mut status, &pod_health, live_stateful_set.as_ref(), now, context, &mut journal);

    // 5. Build (pure) and apply what differs.
    let claim_template_size = live_stateful_set
        .as_ref()
        .and_then(|stateful_set| {
            stateful_set
                .spec
                .volume_claim_templates
                .as_ref()?
                .first()?
                .spec
                .as_ref()?
                .resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("storage")
                .map(|quantity| quantity.0.clone())
        })
        .unwrap_or_else(|| database.spec.storage_size.clone());
    let inputs = WorkloadInputs {
        image: decisions.image.clone(),
        replicas: decisions.replicas,
        restarted_at: status.last_restart_at.clone(),
        claim_template_size,
    };
    let provisioned_before = old_status.observed_generation.is_some();
    let drift_possible =
        provisioned_before && old_status.observed_generation == Some(generation) && !decisions.changed_workload;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let services_api: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let scripts = build::scripts_config_map(database);
    let live_scripts = config_maps.get_opt(&ChildNames::scripts(&name)).await?;
    let outcome = apply_object(&config_maps, &scripts, live_scripts.as_ref(), &context.metrics).await?;
    note_apply(&mut journal, generation, &build::describe(&scripts), outcome, provisioned_before, drift_possible);
    for service in build::services(database) {
        let live = services_api.get_opt(&service.name_any()).await?;
        let outcome = apply_object(&services_api, &service, live.as_ref(), &context.metrics).await?;
        note_apply(&mut journal, generation, &build::describe(&service), outcome, provisioned_before, drift_possible);
    }
    let stateful_set = build::stateful_set(database, &inputs);
    let outcome = apply_object(&stateful_sets, &stateful_set, live_stateful_set.as_ref(), &context.metrics).await?;
    note_apply(&mut journal, generation, &build::describe(&stateful_set), outcome, provisioned_before, drift_possible);

    // 6. Storage: owner references, expansion, binding state.
    // 7. Pods: role labels, and pods stuck on an old revision replaced (a StatefulSet never
    //    replaces a broken pod by itself, which would block every rollback).
    let template_current = outcome == ApplyOutcome::Unchanged;
    let mut follow_up = reconcile_claims(database, &claims_api, &claims, &mut status, &mut journal, context).await;
    if follow_up.is_ok() {
        follow_up =
            reconcile_pods(&pods_api, &pods, &pod_health, &decisions.image, template_current, &mut journal, context)
                .await;
    }
    if let Err(error) = follow_up {
        // What was already done this pass still gets its events and ledger entries.
        publish(database, context, &journal).await;
        return Err(error);
    }

    // 8. Status.
    let rolled_out = health::rolled_out(live_stateful_set.as_ref(), &pod_health, &decisions.image, decisions.replicas)
        && outcome == ApplyOutcome::Unchanged;
    summarize(database, &old_status, &mut status, &pod_health, &decisions, rolled_out, &mut journal);
    let converged = rolled_out && status.phase == Some(Phase::Running);
    finish(database, context, &old_status, status, journal).await?;
    Ok(if converged { Action::requeue(Duration::from_secs(300)) } else { Action::requeue(Duration::from_secs(5)) })
}

fn note_apply(
    journal: &mut Journal,
    generation: i64,
    object: &str,
    outcome: ApplyOutcome,
    provisioned_before: bool,
    drift_possible: bool,
) {
    match outcome {
        ApplyOutcome::Unchanged => {}
        ApplyOutcome::Created if provisioned_before => journal.record(
            true,
            "Recreated",
            format!("{object} was missing and has been recreated"),
            Some(LedgerEntry::now(generation, "DriftCorrected", "missing", object, "recreated")),
        ),
        ApplyOutcome::Created => {}
        ApplyOutcome::Updated if drift_possible => journal.record(
            true,
            "DriftCorrected",
            format!("{object} was changed outside the operator and has been put back"),
            Some(LedgerEntry::now(generation, "DriftCorrected", "edited", object, "restored to the desired state")),
        ),
        ApplyOutcome::Updated => journal.record(false, "Updated", format!("{object} updated for the new spec"), None),
    }
}

async fn ensure_credentials(
    database: &DatabaseService,
    secrets: &Api<Secret>,
    old_status: &DatabaseServiceStatus,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    context: &Context,
) -> Result<(), ReconcileError> {
    let name = ChildNames::credentials(&database.name_any());
    let generation = database.metadata.generation.unwrap_or(0);
    if secrets.get_opt(&name).await?.is_some() {
        if !old_status.conditions.iter().any(|condition| condition.type_ == types::CREDENTIALS_READY) {
            credentials_ready(status, &name, generation);
        }
        return Ok(());
    }
    let secret = build::credentials_secret(database, &build::generate_password(), &build::generate_password());
    match secrets.create(&PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &secret).await
    {
        Ok(_) => context.metrics.count_write("Secret", "create"),
        Err(kube::Error::Api(status)) if status.code == 409 => return Ok(()),
        Err(error) => return Err(error.into()),
    }
    let had_credentials = old_status.conditions.iter().any(|condition| condition.type_ == types::CREDENTIALS_READY);
    if had_credentials {
        let message = format!(
            "Secret {name} was deleted and has been recreated with a new password, but the database still has the old one: set it with ALTER ROLE (or restore the old Secret)"
        );
        conditions::set(
            &mut status.conditions,
            types::CREDENTIALS_READY,
            false,
            "SecretRecreated",
            message.clone(),
            Some(generation),
        );
        journal.record(
            true,
            "CredentialsRecreated",
            message,
            Some(LedgerEntry::now(
                generation,
                "CredentialsRecreated",
                "missing",
                format!("Secret/{name}"),
                "new password generated; database still has the old one",
            )),
        );
    } else {
        credentials_ready(status, &name, generation);
        journal.record(false, "CredentialsCreated", format!("generated credentials in Secret {name}"), None);
    }
    Ok(())
}

fn credentials_ready(status: &mut DatabaseServiceStatus, secret: &str, generation: i64) {
    let message = format!("credentials are in Secret {secret}");
    conditions::set(&mut status.conditions, types::CREDENTIALS_READY, true, "SecretCreated", message, Some(generation));
}

/// What the workload should run after this pass's decisions.
pub(super) struct Decisions {
    pub version: String,
    pub image: String,
    pub replicas: i32,
    pub rolled_back: bool,
    /// A decision (rollback, restart, degrade, restore) changed the workload this pass.
    pub changed_workload: bool,
}

#[allow(clippy::too_many_arguments)]
fn decide(
    database: &DatabaseService,
    old_status: &DatabaseServiceStatus,
    status: &mut DatabaseServiceStatus,
    pods: &[PodHealth],
    stateful_set: Option<&StatefulSet>,
    now: DateTime<Utc>,
    context: &Context,
    journal: &mut Journal,
) -> Decisions {
    let settings = &context.settings;
    let spec = &database.spec;
    let generation = database.metadata.generation.unwrap_or(0);
    let desired_replicas = spec.replicas_or_default();
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
    let replicas = status.degraded_replicas.unwrap_or(desired_replicas).min(desired_replicas);
    let rolled_out = health::rolled_out(stateful_set, pods, &image, replicas);

    // Rollback: a change away from the last stable image that stays unhealthy past the deadline.
    let upgrading = !rolled_back && status.last_stable_image.as_ref().is_some_and(|stable| *stable != image);
    if upgrading && !rolled_out {
        let started = parse_time(&status.rollout_started_at);
        match started {
            None => status.rollout_started_at = Some(rfc3339(now)),
            Some(started) if (now - started).num_seconds() >= settings.progress_deadline.as_secs() as i64 => {
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
                );
                journal.record(
                    true,
                    "RolledBack",
                    message,
                    Some(LedgerEntry::now(
                        generation,
                        "RolledBack",
                        spec.version.clone(),
                        stable_version.clone(),
                        "progress deadline exceeded",
                    )),
                );
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
    let unhealthy = health::unhealthy_pods(pods, now, settings.unhealthy_threshold.as_secs() as i64);
    let rollout_in_progress = status.rollout_started_at.is_some() || stateful_set.is_none();
    if !unhealthy.is_empty() && !rollout_in_progress && !changed_workload {
        let backoff = settings
            .restart_backoff
            .as_secs()
            .saturating_mul(1u64 << old_status.restart_count.clamp(0, 16))
            .min(settings.restart_backoff_cap.as_secs());
        let due =
            parse_time(&old_status.last_restart_at).is_none_or(|last| (now - last).num_seconds() >= backoff as i64);
        if due {
            let names: Vec<&str> = unhealthy.iter().map(|pod| pod.name.as_str()).collect();
            status.restart_count = old_status.restart_count + 1;
            status.last_restart_at = Some(rfc3339(now));
            let next = settings
                .restart_backoff
                .as_secs()
                .saturating_mul(1u64 << status.restart_count.clamp(0, 16))
                .min(settings.restart_backoff_cap.as_secs());
            let message = format!(
                "pods {} unhealthy (crash-looping or not ready); restart {} (next no sooner than {next}s)",
                names.join(", "),
                status.restart_count
            );
            journal.record(
                true,
                "Restarted",
                message,
                Some(LedgerEntry::now(
                    generation,
                    "Restarted",
                    names.join(","),
                    format!("attempt {}", status.restart_count),
                    "pods restarted",
                )),
            );
            changed_workload = true;
        }
    } else if unhealthy.is_empty()
        && old_status.restart_count > 0
        && pods.iter().all(|pod| pod.ready)
        && !pods.is_empty()
    {
        status.restart_count = 0;
        journal.record(
            false,
            "Recovered",
            "all instances are ready again".into(),
            Some(LedgerEntry::now(generation, "Recovered", "unhealthy", "ready", "all instances ready")),
        );
    }

    // Degrade: standbys that cannot be scheduled are scaled away so the primary stays healthy.
    let mut replicas = replicas;
    if desired_replicas > 1 {
        if let Some(prefix) =
            health::schedulable_prefix(pods, replicas, now, settings.unhealthy_threshold.as_secs() as i64)
        {
            if prefix >= 1 && prefix < replicas {
                let message = format!("standbys from {}-{prefix} cannot be scheduled for lack of resources; running {prefix} of {desired_replicas} instances", database.name_any());
                conditions::set(
                    &mut status.conditions,
                    types::DEGRADED,
                    true,
                    "InsufficientResources",
                    message.clone(),
                    Some(generation),
                );
                journal.record(
                    true,
                    "Degraded",
                    message,
                    Some(LedgerEntry::now(
                        generation,
                        "Degraded",
                        replicas.to_string(),
                        prefix.to_string(),
                        "standbys scaled away",
                    )),
                );
                status.degraded_replicas = Some(prefix);
                status.degraded_at = Some(rfc3339(now));
                replicas = prefix;
                changed_workload = true;
            }
        } else if let Some(degraded) = status.degraded_replicas {
            let waited = parse_time(&status.degraded_at).map(|since| (now - since).num_seconds()).unwrap_or(i64::MAX);
            if waited >= settings.restore_probe.as_secs() as i64
                && pods.iter().filter(|pod| pod.ordinal < degraded).all(|pod| pod.ready)
            {
                // Probe: ask for every instance again; if resources are still short, we degrade again.
                status.degraded_replicas = None;
                conditions::set(
                    &mut status.conditions,
                    types::DEGRADED,
                    true,
                    "Restoring",
                    format!("trying {desired_replicas} instances again"),
                    Some(generation),
                );
                journal.record(
                    false,
                    "Restoring",
                    format!("trying {desired_replicas} instances again"),
                    Some(LedgerEntry::now(
                        generation,
                        "RestoreAttempt",
                        degraded.to_string(),
                        desired_replicas.to_string(),
                        "probing for resources",
                    )),
                );
                replicas = desired_replicas;
                changed_workload = true;
            }
        }
    }
    Decisions { version, image, replicas, rolled_back, changed_workload }
}

async fn reconcile_claims(
    database: &DatabaseService,
    claims_api: &Api<PersistentVolumeClaim>,
    claims: &[PersistentVolumeClaim],
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    context: &Context,
) -> Result<(), ReconcileError> {
    let generation = database.metadata.generation.unwrap_or(0);
    let owner = build::owner_reference(database);
    let wanted_bytes = parse_bytes(&database.spec.storage_size).unwrap_or(0);
    let mut expansion_refused = Vec::new();
    for claim in claims {
        let claim_name = claim.name_any();
        let owned = claim.owner_references().iter().any(|reference| reference.uid == owner.uid);
        if !owned && claim.metadata.deletion_timestamp.is_none() {
            let mut references = claim.owner_references().to_vec();
            references.push(k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                controller: Some(false),
                ..owner.clone()
            });
            claims_api
                .patch(
                    &claim_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"ownerReferences": references}})),
                )
                .await?;
            context.metrics.count_write("PersistentVolumeClaim", "patch");
        }
        let requested = claim
            .spec
            .as_ref()
            .and_then(|spec| {
                spec.resources.as_ref()?.requests.as_ref()?.get("storage").map(|quantity| quantity.0.clone())
            })
            .unwrap_or_default();
        if parse_bytes(&requested).unwrap_or(0) >= wanted_bytes {
            continue;
        }
        let class_name = claim.spec.as_ref().and_then(|spec| spec.storage_class_name.clone()).unwrap_or_default();
        let classes: Api<StorageClass> = Api::all(context.client.clone());
        let expandable =
            classes.get_opt(&class_name).await?.and_then(|class| class.allow_volume_expansion).unwrap_or(false);
        if !expandable {
            expansion_refused
                .push(format!("{claim_name} (StorageClass {class_name:?} does not allow volume expansion)"));
            continue;
        }
        claims_api
            .patch(
                &claim_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": database.spec.storage_size}}}})),
            )
            .await?;
        context.metrics.count_write("PersistentVolumeClaim", "patch");
        journal.record(
            false,
            "StorageExpanded",
            format!("PVC {claim_name} expanded from {requested} to {}", database.spec.storage_size),
            Some(LedgerEntry::now(
                generation,
                "StorageExpanded",
                requested.clone(),
                database.spec.storage_size.clone(),
                claim_name.clone(),
            )),
        );
    }
    let expected = database.spec.replicas_or_default().min(status.degraded_replicas.unwrap_or(i32::MAX));
    let bound = health::claims_bound(claims);
    status.storage = Some(StorageStatus {
        requested: database.spec.storage_size.clone(),
        bound_claims: bound,
        expected_claims: expected,
    });
    if !expansion_refused.is_empty() {
        let message = format!("cannot grow {}", expansion_refused.join(", "));
        if !status
            .conditions
            .iter()
            .any(|condition| condition.type_ == types::STORAGE_READY && condition.reason == "ExpansionNotSupported")
        {
            journal.record(true, "ExpansionNotSupported", message.clone(), None);
        }
        conditions::set(
            &mut status.conditions,
            types::STORAGE_READY,
            false,
            "ExpansionNotSupported",
            message,
            Some(generation),
        );
    } else if bound >= expected {
        conditions::set(
            &mut status.conditions,
            types::STORAGE_READY,
            true,
            "Bound",
            format!("{bound} of {expected} volumes bound"),
            Some(generation),
        );
    } else {
        conditions::set(
            &mut status.conditions,
            types::STORAGE_READY,
            false,
            "Pending",
            format!("{bound} of {expected} volumes bound (claims of a WaitForFirstConsumer class bind once their pod is scheduled)"),
            Some(generation),
        );
    }
    Ok(())
}

async fn reconcile_pods(
    pods_api: &Api<Pod>,
    pods: &[Pod],
    health: &[PodHealth],
    image: &str,
    template_current: bool,
    journal: &mut Journal,
    context: &Context,
) -> Result<(), ReconcileError> {
    for (pod, pod_health) in pods.iter().zip(health) {
        if pod_health.terminating {
            continue;
        }
        let role = health::expected_role(&pod_health.name);
        if pod.labels().get(ROLE_LABEL).map(String::as_str) != Some(role) {
            let label = Patch::Merge(json!({"metadata": {"labels": {ROLE_LABEL: role}}}));
            match pods_api.patch(&pod_health.name, &PatchParams::default(), &label).await {
                Ok(_) => context.metrics.count_write("Pod", "label"),
                // The pod went away since we listed it (scale-down, restart): nothing to label.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error.into()),
            }
        }
        if template_current && pod_health.image != image && !pod_health.ready && !pod_health.unschedulable {
            match pods_api.delete(&pod_health.name, &DeleteParams::default()).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(error) => return Err(error.into()),
            }
            context.metrics.count_write("Pod", "delete");
            journal.record(
                false,
                "ReplacedStuckPod",
                format!(
                    "pod {} was not ready on an old revision ({}); deleted so it comes back with {image}",
                    pod_health.name, pod_health.image
                ),
                None,
            );
        }
    }
    Ok(())
}

fn summarize(
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
async fn publish(database: &DatabaseService, context: &Context, journal: &Journal) {
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
