//! Publish: the single owner of what a pass tells — the ledger, the status (only when it changed)
//! and the events. Everything is written once, at the end of the pass.

use crate::api::database_service::{DatabaseService, DatabaseServiceStatus, FIELD_MANAGER};
use crate::api::names::{is_labelled_child_of, labels, owner_reference, ChildNames};
use crate::operator::context::PassContext;
use crate::operator::journal::Journal;
use crate::operator::ledger::{append, LedgerEntry, LEDGER_KEY};
use crate::operator::server_side_apply::{apply_status, status_body};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};

/// Tries of the read-append-replace of the ledger before the pass fails with the conflict.
const LEDGER_ATTEMPTS: usize = 3;

/// Publishes the ledger entries, the status (when it differs from the stored one) and the events.
pub async fn publish(
    database: &DatabaseService,
    status: &DatabaseServiceStatus,
    journal: &Journal,
    ledger_cached: bool,
    context: &PassContext,
) -> Result<(), kube::Error> {
    record_ledger(database, &journal.entries, ledger_cached, true, context).await?;
    write_status(database, status, context).await?;
    publish_events(database, journal, context).await;
    Ok(())
}

/// Publishes the ledger entries and events of writes that were made by a pass that then failed;
/// failures are logged, the pass already fails with its own error.
pub async fn publish_applied(
    database: &DatabaseService,
    applied: &Journal,
    ledger_cached: bool,
    context: &PassContext,
) {
    if applied.is_empty() {
        return;
    }
    if let Err(error) = record_ledger(database, &applied.entries, ledger_cached, true, context).await {
        tracing::warn!(%error, database = %database.name_any(), "could not record what a failed pass applied");
    }
    publish_events(database, applied, context).await;
}

/// Writes the status with server-side apply, only when it changed; conditional on the
/// resourceVersion it was decided from, so a status computed from a stale cache is never written.
pub async fn write_status(
    database: &DatabaseService,
    status: &DatabaseServiceStatus,
    context: &PassContext,
) -> Result<(), kube::Error> {
    if database.status.as_ref() == Some(status) {
        return Ok(());
    }
    let namespace = database.namespace().unwrap_or_default();
    let name = database.name_any();
    let api: Api<DatabaseService> = Api::namespaced(context.shared.client.clone(), &namespace);
    let body = status_body::<DatabaseService>(&name, database.resource_version().as_deref(), status);
    let written = apply_status(&api, &name, &body).await?;
    context.shared.metrics.count_write("DatabaseService", "status");
    context.expectations.expect(&format!("{namespace}/{name}"), "DatabaseService", &name, written.resource_version());
    Ok(())
}

/// Appends `entries` to the ledger ConfigMap: created (owned) when absent from the cache, else
/// read, appended and replaced conditionally on its resourceVersion. A ledger of that name that
/// the operator did not create is left alone (logged). `owned` false drops our ownerReference
/// (deletionPolicy Retain keeps the ledger).
pub async fn record_ledger(
    database: &DatabaseService,
    entries: &[LedgerEntry],
    cached: bool,
    owned: bool,
    context: &PassContext,
) -> Result<(), kube::Error> {
    if entries.is_empty() {
        return Ok(());
    }
    let name = database.name_any();
    for entry in entries {
        tracing::info!(database = %name, action = %entry.action, from = %entry.from, to = %entry.to, outcome = %entry.outcome, "ledger");
    }
    let namespace = database.namespace().unwrap_or_default();
    let key = format!("{namespace}/{name}");
    let ledger_name = ChildNames::ledger(&name);
    let api: Api<ConfigMap> = Api::namespaced(context.shared.client.clone(), &namespace);
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    if !cached {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(ledger_name.clone()),
                labels: Some(labels(&name)),
                owner_references: owned.then(|| vec![owner_reference(database)]),
                ..Default::default()
            },
            data: Some([(LEDGER_KEY.to_string(), append("", entries))].into()),
            ..Default::default()
        };
        match api.create(&params, &config_map).await {
            Ok(created) => {
                context.shared.metrics.count_write("ConfigMap", "ledger");
                context.expectations.expect(&key, "ConfigMap", &ledger_name, created.resource_version());
                return Ok(());
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error),
        }
    }
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(mut ledger) = api.get_opt(&ledger_name).await? else { return Ok(()) };
        if !is_labelled_child_of(&ledger, &name) {
            tracing::warn!(database = %name, ledger = %ledger_name, "a ConfigMap of the ledger's name was not created by the operator; not writing to it");
            return Ok(());
        }
        let text = ledger.data.as_ref().and_then(|data| data.get(LEDGER_KEY)).cloned().unwrap_or_default();
        ledger.data.get_or_insert_with(Default::default).insert(LEDGER_KEY.into(), append(&text, entries));
        if !owned {
            let uid = database.uid().unwrap_or_default();
            if let Some(references) = ledger.metadata.owner_references.as_mut() {
                references.retain(|reference| reference.uid != uid);
            }
        }
        ledger.metadata.managed_fields = None;
        // replace carries the resourceVersion read above: a concurrent append makes it fail (409).
        match api.replace(&ledger_name, &params, &ledger).await {
            Ok(written) => {
                context.shared.metrics.count_write("ConfigMap", "ledger");
                context.expectations.expect(&key, "ConfigMap", &ledger_name, written.resource_version());
                return Ok(());
            }
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < LEDGER_ATTEMPTS => continue,
            Err(error) => return Err(error),
        }
    }
}

/// Publishes the pass's events; a failure to publish never fails the reconciliation.
pub async fn publish_events(database: &DatabaseService, journal: &Journal, context: &PassContext) {
    let reference = database.object_ref(&());
    for event in &journal.events {
        let event = Event {
            type_: if event.warning { EventType::Warning } else { EventType::Normal },
            reason: event.reason.clone(),
            note: Some(event.note.clone()),
            action: event.action.clone(),
            secondary: None,
        };
        if let Err(error) = context.shared.recorder.publish(&event, &reference).await {
            tracing::warn!(%error, reason = %event.reason, "could not publish an event");
        }
    }
}
