//! Finalizer cleanup: apply the deletion policy, write the last ledger entry, let go.
//! Idempotent and never stuck: children that are already gone are fine. Only what this
//! DatabaseService owns is deleted or released: a Secret, ledger or PVC of the same name that the
//! operator did not create for it (a user's own, or data retained from an earlier DatabaseService
//! of the same name) is never touched.

use crate::api::database_service::{DatabaseService, DatabaseServiceStatus, DeletionPolicy, Phase};
use crate::api::names::{is_owned_by, ChildNames};
use crate::operator::context::PassContext;
use crate::operator::database::error::ReconcileError;
use crate::operator::database::observe::from_caches;
use crate::operator::database::reconcile::caches_ready;
use crate::operator::journal::Journal;
use crate::operator::ledger::LedgerEntry;
use crate::operator::publish::{publish_events, record_ledger, write_status};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
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
async fn release<K>(api: &Api<K>, object: &ObjectIdentity, uid: &str, context: &PassContext) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let kept: Vec<_> = object.owner_references.iter().filter(|reference| reference.uid != uid).cloned().collect();
    let patch = json!({"metadata": {"ownerReferences": kept, "resourceVersion": object.resource_version}});
    ignore_not_found(api.patch(&object.name, &PatchParams::default(), &Patch::Merge(patch)).await)?;
    context.shared.metrics.count_write(&K::kind(&()), "release");
    Ok(())
}

/// Deletes the object only if it is still the one observed (uid precondition).
async fn delete_owned<K>(api: &Api<K>, object: &ObjectIdentity, context: &PassContext) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions { uid: object.uid.clone(), resource_version: None }),
        ..DeleteParams::background()
    };
    match api.delete(&object.name, &params).await {
        Ok(_) => context.shared.metrics.count_write(&K::kind(&()), "delete"),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
        Err(error) => return Err(error),
    }
    Ok(())
}

/// What cleanup needs of a cached object.
struct ObjectIdentity {
    name: String,
    uid: Option<String>,
    resource_version: Option<String>,
    owner_references: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
}

impl ObjectIdentity {
    fn of<K: Resource>(object: &K) -> Self {
        let meta = object.meta();
        Self {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            owner_references: meta.owner_references.clone().unwrap_or_default(),
        }
    }
}

/// Applies the deletion policy of a DatabaseService that is being deleted.
pub async fn cleanup(database: &DatabaseService, context: &PassContext) -> Result<Action, ReconcileError> {
    let namespace = database.namespace().unwrap_or_default();
    let name = database.name_any();
    let uid = database.uid().unwrap_or_default();
    let policy = database.spec.deletion_policy_or_default();
    context.shared.metrics.forget_wal_archiving(&namespace, &name);
    if !caches_ready(context).await {
        // An error, not a requeue: Ok would let the finalizer go before the policy is applied.
        return Err(ReconcileError::CachesNotReady);
    }
    let observed = from_caches(database, &context.stores);
    let claims: Vec<ObjectIdentity> = observed
        .claims
        .iter()
        .filter(|claim| is_owned_by(claim.as_ref(), &uid))
        .map(|claim| ObjectIdentity::of(claim.as_ref()))
        .collect();
    let secrets = [&observed.credentials, &observed.superuser, &observed.replication]
        .into_iter()
        .flatten()
        .filter(|secret| is_owned_by(secret.as_ref(), &uid))
        .map(|secret| ObjectIdentity::of(secret.as_ref()))
        .collect();
    let ledger = observed
        .ledger
        .as_ref()
        .and_then(|ledger| ledger.expand())
        .filter(|ledger| is_owned_by(ledger, &uid))
        .map(|ledger| ObjectIdentity::of(&ledger));
    if !context.may_write() {
        return Err(ReconcileError::StepDown);
    }

    if database.status.as_ref().and_then(|status| status.phase) != Some(Phase::Deleting) {
        let status =
            DatabaseServiceStatus { phase: Some(Phase::Deleting), ..database.status.clone().unwrap_or_default() };
        match write_status(database, &status, context).await {
            // Gone already (the finalizer was removed by someone else): nothing left to tell.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            result => result.map_err(ReconcileError::Publish)?,
        }
    }

    let owned = Owned { claims, secrets, ledger, ledger_cached: observed.ledger.is_some() };
    let (reason, note) = match policy {
        DeletionPolicy::Retain => retain(database, &owned, context).await?,
        DeletionPolicy::Delete => delete(database, &owned, context).await?,
    };
    let mut journal = Journal::default();
    journal.record(false, reason, note, None);
    journal.events[0].action = "Cleanup".into();
    publish_events(database, &journal, context).await;
    context.expectations.forget(&format!("{namespace}/{name}"));
    tracing::info!(database = %name, %namespace, policy = %policy, "cleanup done; removing the finalizer");
    Ok(Action::await_change())
}

/// What this DatabaseService owns and its deletion policy decides about.
struct Owned {
    claims: Vec<ObjectIdentity>,
    /// The credentials and superuser Secrets, those it owns.
    secrets: Vec<ObjectIdentity>,
    ledger: Option<ObjectIdentity>,
    ledger_cached: bool,
}

impl Owned {
    fn claim_names(&self) -> String {
        self.claims.iter().map(|claim| claim.name.as_str()).collect::<Vec<_>>().join(", ")
    }

    fn kept_secret(&self) -> String {
        match self.secrets.as_slice() {
            [] => "no Secret of its own".into(),
            [secret] => format!("Secret {}", secret.name),
            secrets => {
                format!(
                    "Secrets {}",
                    secrets.iter().map(|secret| secret.name.as_str()).collect::<Vec<_>>().join(" and ")
                )
            }
        }
    }
}

/// The Apis of what a deletion policy acts on, in the database's namespace.
fn owned_apis(
    database: &DatabaseService,
    context: &PassContext,
) -> (Api<PersistentVolumeClaim>, Api<Secret>, Api<ConfigMap>) {
    let namespace = database.namespace().unwrap_or_default();
    let client = &context.shared.client;
    (
        Api::namespaced(client.clone(), &namespace),
        Api::namespaced(client.clone(), &namespace),
        Api::namespaced(client.clone(), &namespace),
    )
}

/// deletionPolicy Retain: the last ledger entry, then every owned object released (kept by the
/// garbage collector). Returns the event's reason and note.
async fn retain(
    database: &DatabaseService,
    owned: &Owned,
    context: &PassContext,
) -> Result<(&'static str, String), ReconcileError> {
    let name = database.name_any();
    let uid = database.uid().unwrap_or_default();
    let generation = database.metadata.generation.unwrap_or(0);
    let (claims_api, secrets, config_maps) = owned_apis(database, context);
    let (claim_names, kept, ledger_name) = (owned.claim_names(), owned.kept_secret(), ChildNames::ledger(&name));
    let (claims, ledger_cached) = (&owned.claims, owned.ledger_cached);
    // The last ledger entry goes in first, written without an owner so it survives; a
    // failure (namespace being deleted) must not keep the finalizer.
    let entry = LedgerEntry::now(
        generation,
        "Deleted",
        "",
        "Retain",
        format!("kept PVCs [{}], {kept} and this ledger", claim_names),
    );
    // Writing it also drops our ownerReference from the ledger.
    let ledger_released = match record_ledger(database, &[entry], ledger_cached, false, context).await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(database = %name, %error, "could not write the final ledger entry");
            false
        }
    };
    for claim in claims {
        release(&claims_api, claim, &uid, context).await.map_err(ReconcileError::Cleanup)?;
    }
    for secret in &owned.secrets {
        release(&secrets, secret, &uid, context).await.map_err(ReconcileError::Cleanup)?;
    }
    if let Some(ledger) = owned.ledger.as_ref().filter(|_| !ledger_released) {
        release(&config_maps, ledger, &uid, context).await.map_err(ReconcileError::Cleanup)?;
    }
    Ok((
        "DataRetained",
        format!(
            "deletionPolicy Retain: kept PVCs [{}], {kept} and ConfigMap {ledger_name}; delete them by hand when no longer needed",
            claim_names
        ),
    ))
}

/// deletionPolicy Delete: the last ledger entry, then every owned object deleted (only the very
/// objects observed: uid preconditions). Returns the event's reason and note.
async fn delete(
    database: &DatabaseService,
    owned: &Owned,
    context: &PassContext,
) -> Result<(&'static str, String), ReconcileError> {
    let name = database.name_any();
    let generation = database.metadata.generation.unwrap_or(0);
    let (claims_api, secrets, config_maps) = owned_apis(database, context);
    let (claim_names, kept) = (owned.claim_names(), owned.kept_secret());
    let (claims, ledger_cached) = (&owned.claims, owned.ledger_cached);
    let entry =
        LedgerEntry::now(generation, "Deleted", "", "Delete", format!("deleting PVCs [{}] and {kept}", claim_names));
    if let Err(error) = record_ledger(database, &[entry], ledger_cached, true, context).await {
        tracing::warn!(database = %name, %error, "could not write the final ledger entry");
    }
    for claim in claims {
        delete_owned(&claims_api, claim, context).await.map_err(ReconcileError::Cleanup)?;
    }
    for secret in &owned.secrets {
        delete_owned(&secrets, secret, context).await.map_err(ReconcileError::Cleanup)?;
    }
    if let Some(ledger) = &owned.ledger {
        delete_owned(&config_maps, ledger, context).await.map_err(ReconcileError::Cleanup)?;
    }
    Ok((
        "DataDeleted",
        format!(
            "deletionPolicy Delete: deleted PVCs [{}], {kept} and the ledger; objects of the same names that this DatabaseService did not create were left alone",
            claim_names
        ),
    ))
}
