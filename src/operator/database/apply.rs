//! Apply: the one write path for children (server-side apply under one field manager, only when
//! the cached object does not already contain what we want), plus the pod and claim changes
//! decide asked for, each guarded by a precondition so a stale cache never causes a wrong write.

use crate::api::database_service::{DatabaseService, FIELD_MANAGER};
use crate::api::failover::SWITCHOVER_ANNOTATION;
use crate::api::names::primary_lease_name;
use crate::api::names::{describe, is_labelled_child_of, MANAGED_BY, MANAGED_BY_LABEL, ROLE_LABEL};
use crate::lease::LeaseRecord;
use crate::lease::{lease_duration, lease_record, with_record};
use crate::operator::caches::diff::{contains_object, LiveValue};
use crate::operator::caches::Slim;
use crate::operator::context::PassContext;
use crate::operator::database::build::{Desired, InstanceAccess};
use crate::operator::database::decide::{Applied, ApplyOutcome, Workload};
use crate::operator::database::failover::pass::LapsedLease;
use crate::operator::database::observe::Observed;
use crate::operator::database::stateful_set_replacement;
use crate::operator::server_side_apply;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;
use std::fmt::Debug;
use std::ops::ControlFlow;

/// Applies `desired` unless `live` already contains it; returns what happened and the new resourceVersion.
pub async fn apply_object<K>(
    api: &Api<K>,
    desired: &K,
    live: Option<&impl LiveValue>,
    context: &PassContext,
) -> Result<(ApplyOutcome, Option<String>), kube::Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug + Slim,
{
    if live.is_some_and(|live| contains_object(live, desired)) {
        return Ok((ApplyOutcome::Unchanged, None));
    }
    let written = server_side_apply::apply(api, desired).await?;
    context.shared.metrics.count_write(&K::kind(&()), "apply");
    Ok((if live.is_some() { ApplyOutcome::Updated } else { ApplyOutcome::Created }, written.resource_version()))
}

/// Apply failed part-way: what was written before the error, and the error.
#[derive(Debug)]
pub struct ApplyFailed {
    /// The children written before the failure (they stay written).
    pub applied: Applied,
    /// The first error.
    pub error: kube::Error,
}

/// Writes every child of `desired`, then the pod and claim changes of `workload`, and reports
/// what it did. A credentials Secret name taken by someone else's Secret stops it before any
/// other write ([`Applied::credentials_conflict`]).
pub async fn apply(
    database: &DatabaseService,
    desired: Desired,
    workload: &Workload,
    observed: &Observed,
    context: &PassContext,
) -> Result<Applied, ApplyFailed> {
    let mut applied = Applied::default();
    match apply_children(database, desired, workload, observed, context, &mut applied).await {
        Ok(()) => Ok(applied),
        Err(error) => Err(ApplyFailed { applied, error }),
    }
}

async fn apply_children(
    database: &DatabaseService,
    desired: Desired,
    workload: &Workload,
    observed: &Observed,
    context: &PassContext,
    applied: &mut Applied,
) -> Result<(), kube::Error> {
    let namespace = database.namespace().unwrap_or_default();
    let key = format!("{namespace}/{}", database.name_any());
    if create_secrets(database, &desired, context, &key, applied).await?.is_break() {
        return Ok(());
    }
    // Before the StatefulSet: its pods mount the server certificate.
    applied.certificate_issued =
        crate::operator::database::certificates::apply_certificates(database, &workload.certificates, context, &key)
            .await?;
    apply_before_stateful_set(&namespace, &desired, observed, context, &key, applied).await?;
    if apply_stateful_set(&namespace, &desired.stateful_set, observed, context, &key, applied).await?.is_break() {
        return Ok(());
    }
    apply_pods(&namespace, workload, context, &key).await?;
    apply_claims(&namespace, workload, context, &key).await?;
    if let Some(instance) = &workload.release_lease_of {
        release_primary_lease(database, instance, context).await?;
    }
    if let Some(lapsed) = &workload.release_lapsed_lease {
        release_lapsed_lease(database, lapsed, context).await?;
    }
    if let Some(name) = &workload.create_backup {
        create_pre_upgrade_backup(database, name, context, applied).await?;
    }
    Ok(())
}

/// Creates the credentials, superuser and replication Secrets to be made; Break when a name is
/// taken by a Secret that is not ours (nothing else is written then).
async fn create_secrets(
    database: &DatabaseService,
    desired: &Desired,
    context: &PassContext,
    key: &str,
    applied: &mut Applied,
) -> Result<ControlFlow<()>, kube::Error> {
    let secrets = [(&desired.credentials, false), (&desired.superuser, true), (&desired.replication, false)];
    for (secret, is_superuser) in secrets {
        let Some(secret) = secret else { continue };
        match create_credentials(database, secret, context, key).await? {
            None => {
                applied.credentials_conflict = Some(secret.name_any());
                return Ok(ControlFlow::Break(()));
            }
            Some(true) if is_superuser => applied.superuser_created = Some(secret.name_any()),
            Some(_) => {}
        }
    }
    Ok(ControlFlow::Continue(()))
}

/// The scripts, the Services and (when the StatefulSet changes) the agents' access and the
/// disruption budgets. They do not depend on each other: written at once, a first pass waits for
/// one round trip instead of one per object. The StatefulSet comes after them, since its pods
/// mount the scripts and run as the agents' account.
async fn apply_before_stateful_set(
    namespace: &str,
    desired: &Desired,
    observed: &Observed,
    context: &PassContext,
    key: &str,
    applied: &mut Applied,
) -> Result<(), kube::Error> {
    let Desired { scripts, services, stateful_set, instance_access, network_policy, disruption_budgets, .. } = desired;
    let client = &context.shared.client;
    let config_maps = Api::namespaced(client.clone(), namespace);
    let services_api = Api::namespaced(client.clone(), namespace);
    // Written with the StatefulSet (they change together: created with it, or for a new operator
    // version); never in a steady pass.
    let stateful_set_changes =
        !observed.stateful_set.as_deref().is_some_and(|live| contains_object(live, stateful_set));
    let access_needed = instance_access.as_ref().filter(|_| stateful_set_changes);
    let budgets_needed = if stateful_set_changes { disruption_budgets.as_slice() } else { &[] };
    let budgets = Api::namespaced(client.clone(), namespace);
    let (scripts_applied, services_applied, access_applied, budgets_applied) = tokio::join!(
        apply_object(&config_maps, scripts, observed.scripts.as_deref(), context),
        futures::future::join_all(services.iter().map(|service| {
            let live = observed.services.get(&service.name_any()).map(AsRef::as_ref);
            apply_object(&services_api, service, live, context)
        })),
        async {
            match access_needed {
                Some(access) => apply_access(namespace, access, network_policy.as_ref(), context).await,
                None => Ok(()),
            }
        },
        futures::future::try_join_all(budgets_needed.iter().map(|budget| server_side_apply(&budgets, budget, context))),
    );
    // What was written is reported before any failure is returned (see reconcile's publish_applied).
    let mut first_error = None;
    let written = std::iter::once((("ConfigMap", scripts.name_any()), scripts_applied))
        .chain(services.iter().map(|service| ("Service", service.name_any())).zip(services_applied));
    for ((kind, name), result) in written {
        match result {
            Ok((outcome, version)) => {
                context.expectations.expect(key, kind, &name, version);
                applied.children.push((format!("{kind}/{name}"), outcome));
            }
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    match first_error.or(access_applied.err()).or(budgets_applied.err()) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// Applies the StatefulSet, or deletes it when a field it cannot change must change; Break then
/// (the pods and claims wait for the new one).
async fn apply_stateful_set(
    namespace: &str,
    stateful_set: &StatefulSet,
    observed: &Observed,
    context: &PassContext,
    key: &str,
    applied: &mut Applied,
) -> Result<ControlFlow<()>, kube::Error> {
    let stateful_sets = Api::namespaced(context.shared.client.clone(), namespace);
    if let Some(live) = observed.stateful_set.as_deref() {
        if stateful_set_replacement::replace_if_needed(&stateful_sets, live, stateful_set).await? {
            // Re-created by a later pass (the deletion's watch event starts it); the pods and
            // claims wait for it, since their changes are judged against the StatefulSet.
            applied.children.push((describe(stateful_set), ApplyOutcome::Updated));
            return Ok(ControlFlow::Break(()));
        }
    }
    let (outcome, version) =
        apply_object(&stateful_sets, stateful_set, observed.stateful_set.as_deref(), context).await?;
    context.expectations.expect(key, "StatefulSet", &stateful_set.name_any(), version);
    applied.children.push((describe(stateful_set), outcome));
    Ok(ControlFlow::Continue(()))
}

/// Creates the `DatabaseServiceBackup` taken before a major upgrade, unless it exists.
async fn create_pre_upgrade_backup(
    database: &DatabaseService,
    name: &str,
    context: &PassContext,
    applied: &mut Applied,
) -> Result<(), kube::Error> {
    let backup = crate::operator::database::major_upgrade::pre_upgrade_backup(database, name);
    let backups: Api<crate::api::database_service_backup::DatabaseServiceBackup> =
        Api::namespaced(context.shared.client.clone(), &database.namespace().unwrap_or_default());
    match backups.create(&kube::api::PostParams::default(), &backup).await {
        Ok(_) => applied.children.push((describe(&backup), ApplyOutcome::Created)),
        // A pass that did not see it yet: it is there.
        Err(kube::Error::Api(response)) if response.code == 409 => {}
        Err(error) => return Err(error),
    }
    Ok(())
}

/// Removes the switchover annotation from the DatabaseService. Called only after the pass's
/// status is written: the patch changes the resourceVersion that the status write is conditional
/// on, and a status write refused for it would leave the completed switchover undecided in the
/// stored status, so that the next pass completes it again and records it in the ledger twice.
pub async fn clear_switchover_request(database: &DatabaseService, context: &PassContext) -> Result<(), kube::Error> {
    let namespace = database.namespace().unwrap_or_default();
    let databases: Api<DatabaseService> = Api::namespaced(context.shared.client.clone(), &namespace);
    let patch = Patch::Merge(json!({"metadata": {"annotations": {SWITCHOVER_ANNOTATION: null}}}));
    databases.patch(&database.name_any(), &PatchParams::default(), &patch).await?;
    context.shared.metrics.count_write("DatabaseService", "patch");
    Ok(())
}

/// Server-side apply of an object the controller does not cache (written only with the StatefulSet).
async fn server_side_apply<K>(api: &Api<K>, object: &K, context: &PassContext) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
{
    server_side_apply::apply(api, object).await?;
    context.shared.metrics.count_write(&K::kind(&()), "apply");
    Ok(())
}

/// The instance agents' ServiceAccount, Role, RoleBinding and primary Lease (metadata only: the
/// Lease's holder is never touched by the operator's apply).
async fn apply_access(
    namespace: &str,
    access: &InstanceAccess,
    network_policy: Option<&NetworkPolicy>,
    context: &PassContext,
) -> Result<(), kube::Error> {
    let client = &context.shared.client;
    // Who may reach the pods changes with them too (never corrected in a steady pass).
    if let Some(policy) = network_policy {
        server_side_apply(&Api::namespaced(client.clone(), namespace), policy, context).await?;
    }
    let (accounts, roles, leases) = (
        Api::namespaced(client.clone(), namespace),
        Api::namespaced(client.clone(), namespace),
        Api::namespaced(client.clone(), namespace),
    );
    tokio::try_join!(
        server_side_apply(&accounts, &access.service_account, context),
        server_side_apply(&roles, &access.role, context),
        server_side_apply(&leases, &access.lease, context),
    )?;
    // After the Role: binding a Role the operator may not bind is allowed only once the apiserver
    // can see that the operator holds every right in it.
    server_side_apply(&Api::namespaced(client.clone(), namespace), &access.role_binding, context).await
}

/// Releases the primary Lease held by `instance`, whose pod is gone (the kubelet confirmed that its
/// processes ended), so that a standby may be promoted without waiting for the Lease to expire.
/// Gone is proven by a live read, never taken from the cache alone: a pod the cache does not show
/// (its managed-by label removed by hand, or an ordinal beyond spec.replicas) may still commit,
/// and its Lease then expires only by the followers' own clocks. Compare-and-swap on the
/// resourceVersion: a Lease that changed since it was read is left alone.
async fn release_primary_lease(
    database: &DatabaseService,
    instance: &str,
    context: &PassContext,
) -> Result<(), kube::Error> {
    let namespace = database.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(context.shared.client.clone(), &namespace);
    if let Some(pod) = pods.get_metadata_opt(instance).await? {
        tracing::warn!(
            %instance,
            uid = pod.metadata.uid.as_deref().unwrap_or_default(),
            "the primary's pod still exists although the cache does not show it; its Lease is not released (it expires by the followers' clocks)"
        );
        return Ok(());
    }
    release_lease_held_by(database, instance, None, context).await
}

/// Releases the primary Lease that lapsed at `lapsed.version` (its holder has fenced itself, see
/// `failover::lease_clock`): a compare-and-swap on that version, so a holder that renewed since
/// keeps it.
async fn release_lapsed_lease(
    database: &DatabaseService,
    lapsed: &LapsedLease,
    context: &PassContext,
) -> Result<(), kube::Error> {
    release_lease_held_by(database, &lapsed.holder, Some(&lapsed.version), context).await
}

/// Frees the primary Lease if `holder` still holds it (and, with `version`, if it is still at that
/// version), keeping its positions. Compare-and-swap on the resourceVersion read: a Lease that
/// changed since is left alone.
async fn release_lease_held_by(
    database: &DatabaseService,
    holder: &str,
    version: Option<&str>,
    context: &PassContext,
) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(context.shared.client.clone(), &database.namespace().unwrap_or_default());
    let name = primary_lease_name(&database.name_any());
    let Some(lease) = leases.get_opt(&name).await? else { return Ok(()) };
    let record = lease_record(&lease);
    let same_version = version.is_none_or(|version| lease.metadata.resource_version.as_deref() == Some(version));
    if record.holder.as_deref() != Some(holder) || !same_version {
        return Ok(());
    }
    let duration = lease_duration(&lease);
    let released = with_record(lease, &LeaseRecord { holder: None, ..record }, duration);
    match leases
        .replace(&name, &PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &released)
        .await
    {
        Ok(_) => {
            context.shared.metrics.count_write("Lease", "update");
            let why = if version.is_some() { "it lapsed" } else { "its pod is gone" };
            tracing::info!(lease = %name, %holder, why, "released the primary lease");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error),
    }
}

/// Creates the credentials (or superuser) Secret: Some(true) when it did, Some(false) when ours
/// was there already (not cached yet), None when its name is taken by a Secret that is not ours.
async fn create_credentials(
    database: &DatabaseService,
    secret: &Secret,
    context: &PassContext,
    key: &str,
) -> Result<Option<bool>, kube::Error> {
    let secrets: Api<Secret> =
        Api::namespaced(context.shared.client.clone(), &database.namespace().unwrap_or_default());
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    match secrets.create(&params, secret).await {
        Ok(created) => {
            context.shared.metrics.count_write("Secret", "create");
            context.expectations.expect(key, "Secret", &secret.name_any(), created.resource_version());
            Ok(Some(true))
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            // Not in our cache but present: ours and not cached yet, or someone else's. Only
            // metadata is read, never the foreign Secret's data.
            let existing = secrets.get_metadata_opt(&secret.name_any()).await?;
            let ours = existing.is_none_or(|existing| is_labelled_child_of(&existing, &database.name_any()));
            Ok(ours.then_some(false))
        }
        Err(error) => Err(error),
    }
}

async fn apply_pods(namespace: &str, workload: &Workload, context: &PassContext, key: &str) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(context.shared.client.clone(), namespace);
    for label in &workload.pod_labels {
        // The managed-by label too: a pod that lost it is invisible to the caches.
        let patch =
            Patch::Merge(json!({"metadata": {"labels": {ROLE_LABEL: label.role, MANAGED_BY_LABEL: MANAGED_BY}}}));
        match pods.patch(&label.pod, &PatchParams::default(), &patch).await {
            Ok(pod) => {
                context.shared.metrics.count_write("Pod", "label");
                context.expectations.expect(key, "Pod", &label.pod, pod.resource_version());
            }
            // The pod went away since it was cached (scale-down, restart): nothing to label.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error),
        }
    }
    for deletion in &workload.pod_deletions {
        // Only the pod we saw: a replacement with the same name is never deleted by a stale cache.
        let preconditions =
            Preconditions { uid: deletion.uid.clone(), resource_version: deletion.resource_version.clone() };
        let params = DeleteParams { preconditions: Some(preconditions), ..Default::default() };
        match pods.delete(&deletion.pod, &params).await {
            Ok(_) => context.shared.metrics.count_write("Pod", "delete"),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

async fn apply_claims(
    namespace: &str,
    workload: &Workload,
    context: &PassContext,
    key: &str,
) -> Result<(), kube::Error> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(context.shared.client.clone(), namespace);
    for change in &workload.claim_changes {
        // resourceVersion makes the merge patch conditional: ownerReferences computed from a
        // stale cache never overwrite newer ones (409, retried with a fresh cache).
        let mut body = json!({"metadata": {"resourceVersion": change.resource_version}});
        if let Some(references) = &change.owner_references {
            body["metadata"]["ownerReferences"] = json!(references);
        }
        if let Some(storage) = &change.storage {
            body["spec"] = json!({"resources": {"requests": {"storage": storage}}});
        }
        let claim = claims.patch(&change.claim, &PatchParams::default(), &Patch::Merge(&body)).await?;
        context.shared.metrics.count_write("PersistentVolumeClaim", "patch");
        context.expectations.expect(key, "PersistentVolumeClaim", &change.claim, claim.resource_version());
    }
    Ok(())
}
