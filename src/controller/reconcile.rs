//! The reconcile pipeline for one DatabaseService:
//! validate → observe → decide (credentials, rollout, restart, degrade) → build (pure) → apply
//! (only what differs) → storage and pod labels → status (only when changed) → ledger and events.

use super::build::{self, ChildNames, WorkloadInputs};
use super::conditions::{self, types};
use super::decide::decide;
use super::health::{self, PodHealth};
use super::ledger::LedgerEntry;
use super::pods::reconcile_pods;
use super::status::{finish, publish, summarize};
use super::storage::reconcile_claims;
use super::{Context, ReconcileError};
use crate::api::{DatabaseService, DatabaseServiceStatus, Phase, FIELD_MANAGER};
use crate::controller::apply::{apply as apply_object, ApplyOutcome};
use crate::validation::{validate, ValidationSettings};
use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, ResourceExt};
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

pub(super) fn now() -> DateTime<Utc> {
    Utc::now()
}

pub(super) fn rfc3339(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub(super) fn parse_time(text: &Option<String>) -> Option<DateTime<Utc>> {
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
