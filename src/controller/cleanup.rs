//! Finalizer cleanup: apply the deletion policy, write the last ledger entry, let go.
//! Idempotent and never stuck: children that are already gone are fine.

use super::build::{label_selector, ChildNames};
use super::ledger::{self, LedgerEntry};
use super::reconcile::Journal;
use super::status::publish_events;
use super::{Context, ReconcileError};
use crate::api::{DatabaseService, DeletionPolicy, Phase, FIELD_MANAGER};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

fn ignore_not_found<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

/// Removes the ownerReference to `uid` so the garbage collector keeps the object.
async fn release<K>(api: &Api<K>, object: &K, uid: &str, context: &Context) -> Result<bool, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let references = object.meta().owner_references.clone().unwrap_or_default();
    if !references.iter().any(|reference| reference.uid == uid) {
        return Ok(false);
    }
    let kept: Vec<_> = references.into_iter().filter(|reference| reference.uid != uid).collect();
    let name = object.meta().name.clone().unwrap_or_default();
    ignore_not_found(
        api.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"ownerReferences": kept}}))).await,
    )?;
    context.metrics.count_write(&K::kind(&()), "release");
    Ok(true)
}

/// The last ledger entry; failing to write it (e.g. the namespace is being deleted and takes
/// the ledger with it) must not keep the finalizer, or the deletion would never finish.
async fn record_final_entry(
    config_maps: &Api<ConfigMap>,
    database: &DatabaseService,
    entry: LedgerEntry,
    owned: bool,
    context: &Context,
) {
    if let Err(error) = ledger::record(config_maps, database, &[entry], owned, &context.metrics).await {
        tracing::warn!(database = %database.name_any(), %error, "could not write the final ledger entry");
    }
}

/// Applies the deletion policy of a DatabaseService that is being deleted.
pub(super) async fn cleanup(database: &DatabaseService, context: &Context) -> Result<Action, ReconcileError> {
    let client = &context.client;
    let namespace = database.namespace().unwrap_or_default();
    let name = database.name_any();
    let uid = database.uid().unwrap_or_default();
    let generation = database.metadata.generation.unwrap_or(0);
    let policy = database.spec.deletion_policy_or_default();
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let claims = claims_api.list(&ListParams::default().labels(&label_selector(&name))).await?.items;
    let secret_name = ChildNames::credentials(&name);
    let ledger_name = ChildNames::ledger(&name);

    if database.status.as_ref().and_then(|status| status.phase) != Some(Phase::Deleting) {
        let api: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace);
        let body = json!({"apiVersion": DatabaseService::api_version(&()), "kind": DatabaseService::kind(&()), "metadata": {"name": name}, "status": {"phase": "Deleting"}});
        // The object may already be gone by the time we get here; that is fine.
        let _ = api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await;
    }

    let claim_names: Vec<String> = claims.iter().map(ResourceExt::name_any).collect();
    let (reason, note) = match policy {
        DeletionPolicy::Retain => {
            // The last ledger entry goes in first, written without an owner so it survives.
            let entry = LedgerEntry::now(
                generation,
                "Deleted",
                "",
                "Retain",
                format!("kept PVCs [{}], Secret {secret_name} and this ledger", claim_names.join(", ")),
            );
            record_final_entry(&config_maps, database, entry, false, context).await;
            for claim in &claims {
                release(&claims_api, claim, &uid, context).await?;
            }
            if let Some(secret) = secrets.get_opt(&secret_name).await? {
                release(&secrets, &secret, &uid, context).await?;
            }
            if let Some(ledger) = config_maps.get_opt(&ledger_name).await? {
                release(&config_maps, &ledger, &uid, context).await?;
            }
            (
                "DataRetained",
                format!(
                    "deletionPolicy Retain: kept PVCs [{}], Secret {secret_name} and ConfigMap {ledger_name}; delete them by hand when no longer needed",
                    claim_names.join(", ")
                ),
            )
        }
        DeletionPolicy::Delete => {
            let entry = LedgerEntry::now(
                generation,
                "Deleted",
                "",
                "Delete",
                format!("deleting PVCs [{}] and Secret {secret_name}", claim_names.join(", ")),
            );
            record_final_entry(&config_maps, database, entry, true, context).await;
            for claim in &claim_names {
                ignore_not_found(claims_api.delete(claim, &DeleteParams::background()).await)?;
                context.metrics.count_write("PersistentVolumeClaim", "delete");
            }
            ignore_not_found(secrets.delete(&secret_name, &DeleteParams::background()).await)?;
            ignore_not_found(config_maps.delete(&ledger_name, &DeleteParams::background()).await)?;
            (
                "DataDeleted",
                format!(
                    "deletionPolicy Delete: deleted PVCs [{}], Secret {secret_name} and the ledger",
                    claim_names.join(", ")
                ),
            )
        }
    };
    let mut journal = Journal::default();
    journal.events.push(Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(note),
        action: "Cleanup".into(),
        secondary: None,
    });
    publish_events(database, context, &journal).await;
    tracing::info!(database = %name, %namespace, policy = %policy, "cleanup done; removing the finalizer");
    Ok(Action::await_change())
}
