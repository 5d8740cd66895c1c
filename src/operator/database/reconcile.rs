//! One pass for a DatabaseService that is not being deleted:
//! observe (caches) → decide (pure) → build (pure) → apply → publish.

use crate::api::database_service::DatabaseService;
use crate::operator::caches::cached;
use crate::operator::context::PassContext;
use crate::operator::database::apply::{apply, clear_switchover_request, ApplyFailed};
use crate::operator::database::archiving::ArchivingHealth;
use crate::operator::database::build::{desired, generate_password, NewPasswords};
use crate::operator::database::credentials_form::keep_credentials_form;
use crate::operator::database::decide::{
    credentials_conflict, decide, journal_applied, DecideInput, Decision, Workload,
};
use crate::operator::database::error::ReconcileError;
use crate::operator::database::failover::clock::running_timer;
use crate::operator::database::observe::{
    from_caches, pooler_pods_left, primary_lease, storage_classes, unlabelled_pods, Observed,
};
use crate::operator::database::recovery_source;
use crate::operator::database::storage_growth;
use crate::operator::journal::{now, Journal};
use crate::operator::publish::{publish, publish_applied};
use chrono::{DateTime, Utc};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use std::time::Duration;

/// How soon a pass that found the caches behind our own writes looks again.
const CACHE_LAG_RETRY: Duration = Duration::from_millis(200);

/// Whether every cache finished its first list (waiting a little for it at start-up).
pub async fn caches_ready(context: &PassContext) -> bool {
    tokio::time::timeout(CACHE_SYNC_WAIT, context.stores.wait_until_ready()).await.is_ok_and(|ready| ready.is_ok())
}

/// How long a pass waits for the first lists of the caches before it requeues.
const CACHE_SYNC_WAIT: Duration = Duration::from_secs(10);

/// Whether the caches show every write of the earlier passes for `database`.
fn caches_caught_up(database: &DatabaseService, context: &PassContext) -> bool {
    let namespace = database.namespace().unwrap_or_default();
    let key = format!("{namespace}/{}", database.name_any());
    let stores = &context.stores;
    context.expectations.satisfied(&key, |kind, name| match kind {
        "DatabaseService" => database.resource_version(),
        "StatefulSet" => cached(&stores.stateful_sets, &namespace, name)?.resource_version(),
        "Service" => cached(&stores.services, &namespace, name)?.resource_version(),
        "ConfigMap" => cached(&stores.config_maps, &namespace, name)?.resource_version(),
        "Secret" => cached(&stores.secrets, &namespace, name)?.meta().resource_version.clone(),
        "Pod" => cached(&stores.pods, &namespace, name)?.resource_version(),
        "PersistentVolumeClaim" => cached(&stores.claims, &namespace, name)?.resource_version(),
        _ => None,
    })
}

/// The replication password of a database made before its replication Secret: the one its
/// credentials Secret holds (its standbys and its server use it), else a new one (the primary's
/// agent sets it at its next start). Read once, only on that path.
async fn existing_replication_password(
    database: &DatabaseService,
    context: &PassContext,
) -> Result<Option<String>, ReconcileError> {
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(context.shared.client.clone(), &database.namespace().unwrap_or_default());
    let name = crate::api::names::ChildNames::credentials(&database.name_any());
    let credentials = secrets.get_opt(&name).await.map_err(ReconcileError::Observe)?;
    let held = credentials
        .and_then(|secret| secret.data?.remove("replication-password"))
        .and_then(|password| String::from_utf8(password.0).ok())
        .filter(|password| !password.is_empty());
    Ok(Some(held.unwrap_or_else(generate_password)))
}

/// Sets the WAL archiving metrics from what decide saw (Unknown keeps the last known values).
fn record_archiving(database: &DatabaseService, health: &ArchivingHealth, context: &PassContext) {
    let namespace = database.namespace().unwrap_or_default();
    let name = database.name_any();
    let metrics = &context.shared.metrics;
    match health {
        ArchivingHealth::NotConfigured => metrics.forget_wal_archiving(&namespace, &name),
        ArchivingHealth::Unknown => {}
        ArchivingHealth::Healthy => metrics.set_wal_archiving(&namespace, &name, None),
        ArchivingHealth::Failing { since } => metrics.set_wal_archiving(&namespace, &name, Some(*since)),
    }
}

/// The target of a switchover this pass starts (its transition is not in the stored status yet).
fn switchover_starting(
    database: &DatabaseService,
    status: &crate::api::database_service::DatabaseServiceStatus,
) -> Option<String> {
    use crate::api::failover::TransitionKind;
    let transition =
        status.failover.transition.as_ref().filter(|transition| transition.kind == TransitionKind::Switchover)?;
    let stored = database.status.as_ref().and_then(|status| status.failover.transition.as_ref());
    if stored.is_some_and(|stored| stored.started_at == transition.started_at) {
        return None;
    }
    status.failover.target_primary.clone()
}

/// A recovering database's target is checked against its stores before its first pod or volume
/// is made ([`recovery_source`]); outside the archive, nothing is made and the check is repeated.
async fn check_recovery_source(
    database: &DatabaseService,
    observed: &crate::operator::database::observe::Observed,
    decision: &mut crate::operator::database::decide::Decision,
    context: &PassContext,
) {
    if decision.workload.is_none() || !recovery_source::needs_check(database, observed) {
        return;
    }
    let reader = recovery_source::KubeStoreReader::new(context.shared.client.clone());
    let verdict = recovery_source::check(&reader, database).await;
    let generation = database.metadata.generation.unwrap_or(0);
    if recovery_source::apply_verdict(verdict, &mut decision.status, generation, now(), &mut decision.journal) {
        decision.workload = None;
        let recheck = recovery_source::RECHECK;
        decision.requeue = Some(decision.requeue.map_or(recheck, |requeue| requeue.min(recheck)));
    }
}

/// Reconciles a DatabaseService that is not being deleted.
pub async fn reconcile_live(database: &DatabaseService, context: &PassContext) -> Result<Action, ReconcileError> {
    if !caches_ready(context).await {
        return Ok(Action::requeue(CACHE_LAG_RETRY));
    }
    if !caches_caught_up(database, context) {
        return Ok(Action::requeue(CACHE_LAG_RETRY));
    }
    let now = now();
    let observed = observe(database, context).await?;
    let uid = database.metadata.uid.clone().unwrap_or_default();
    let timers = &context.shared.failover_timers;
    let running = database.status.as_ref().and_then(|status| running_timer(&status.failover));
    let failover_timer_seen = running.map(|since| timers.seen_for(&uid, since));
    let mut decision = decide(&DecideInput {
        database,
        observed: &observed,
        settings: &context.shared.settings,
        now,
        failover_timer_seen,
    });
    if let Some(started) = running_timer(&decision.status.failover).filter(|started| Some(*started) != running) {
        timers.started(&uid, started);
    }
    record_archiving(database, &decision.archiving, context);
    check_recovery_source(database, &observed, &mut decision, context).await;
    if !context.may_write() {
        return Err(ReconcileError::StepDown);
    }
    if let Some(workload) = decision.workload.clone() {
        apply_workload(database, &workload, &observed, &mut decision, context, now).await?;
    }
    if !context.may_write() {
        return Err(ReconcileError::StepDown);
    }
    // A Secret an older operator wrote (a uri without verify-full, the replication keys) is
    // brought to today's form; a failure is retried by the next pass and holds nothing else.
    let rewritten = keep_credentials_form(database, &observed, context, &mut decision.journal, now).await;
    if let Err(error) = rewritten {
        tracing::warn!(%error, "the database's Secrets keep their old form for now");
    }
    // Before the switchover is published: the old primary stops only once the pools are paused.
    if let Some(target) = switchover_starting(database, &decision.status) {
        if database.spec.pooler.is_some() {
            pause_pooler_for_switchover(database, &target, &mut decision.journal, context).await;
        }
    }
    decision.status.pooler =
        crate::operator::database::pooler::keep_pooler(database, context).await.map_err(ReconcileError::Apply)?;
    publish(database, &decision.status, &decision.journal, observed.ledger.is_some(), context)
        .await
        .map_err(ReconcileError::Publish)?;
    if decision.workload.as_ref().is_some_and(|workload| workload.clear_switchover_request) {
        clear_switchover_request(database, context).await.map_err(ReconcileError::Publish)?;
    }
    Ok(requeue_with_pooler(&decision).map_or_else(Action::await_change, Action::requeue))
}

/// The children as cached, with what the caches do not hold: the storage classes, unlabelled
/// pods, the primary Lease and the pre-upgrade backup.
async fn observe(database: &DatabaseService, context: &PassContext) -> Result<Observed, ReconcileError> {
    let client = &context.shared.client;
    let mut observed = from_caches(database, &context.stores);
    let wanted_size = match storage_growth::plan(database, &observed.pods, &observed.claims) {
        storage_growth::Growth::Grow(step) => step.to,
        _ => storage_growth::wanted_size(&database.spec.storage_size, database.status.as_ref()),
    };
    let every_claim = database.spec.storage_growth.is_some();
    storage_classes(&wanted_size, every_claim, &mut observed, client).await.map_err(ReconcileError::Observe)?;
    unlabelled_pods(database, &mut observed, client).await.map_err(ReconcileError::Observe)?;
    primary_lease(database, &mut observed, client, &context.lease_clock).await.map_err(ReconcileError::Observe)?;
    pooler_pods_left(database, &mut observed, client).await.map_err(ReconcileError::Observe)?;
    crate::operator::database::observe::pre_upgrade_backup(database, &mut observed, client)
        .await
        .map_err(ReconcileError::Observe)?;
    Ok(observed)
}

/// Builds the children of `workload` (with new passwords where a Secret is to be made) and
/// applies them; what applying did joins the decision's journal.
async fn apply_workload(
    database: &DatabaseService,
    workload: &Workload,
    observed: &Observed,
    decision: &mut Decision,
    context: &PassContext,
    now: DateTime<Utc>,
) -> Result<(), ReconcileError> {
    let replication = match workload.create_replication {
        true if !workload.create_credentials => existing_replication_password(database, context).await?,
        true => Some(generate_password()),
        false => None,
    };
    let passwords = NewPasswords {
        application: workload.create_credentials.then(generate_password),
        superuser: workload.create_superuser.then(generate_password),
        replication,
    };
    let children =
        desired(database, &workload.inputs, passwords, context.shared.settings.database_network_policy.as_ref());
    // The children written stay written even when apply fails part-way, and the next pass finds
    // nothing left to correct: what they record (a drift put back, a child recreated) is told
    // now or never. The decisions themselves are decided again by the next pass.
    let (applied, failure) = match apply(database, children, workload, observed, context).await {
        Ok(applied) => (applied, None),
        Err(ApplyFailed { applied, error }) => (applied, Some(error)),
    };
    if let Some(secret) = &applied.credentials_conflict {
        credentials_conflict(decision, database, secret, now);
    }
    let told = journal_applied(workload, &applied, database.metadata.generation.unwrap_or(0), now);
    if let Some(error) = failure {
        publish_applied(database, &told, observed.ledger.is_some(), context).await;
        return Err(ReconcileError::Apply(error));
    }
    decision.journal.extend(told);
    Ok(())
}

/// Pauses the pooler's pools before a switchover starts, and tells how many pods it paused.
async fn pause_pooler_for_switchover(
    database: &DatabaseService,
    target: &str,
    journal: &mut Journal,
    context: &PassContext,
) {
    let outcome = crate::operator::database::pooler::pause_for_switchover(database, target, context).await;
    let (warning, reason, note) = match outcome.failures.is_empty() {
        true => {
            (false, "PoolerPaused", format!("{} pooler pods paused for the switchover to {target}", outcome.paused))
        }
        false => (
            true,
            "PoolerPauseFailed",
            format!(
                "{} pooler pods paused for the switchover to {target}; not paused: {}",
                outcome.paused,
                outcome.failures.join("; ")
            ),
        ),
    };
    journal.record(warning, reason, note, None);
}

/// The decision's requeue, sooner while a pooler runs: its Deployment is not watched, so its pods
/// becoming ready, or the Deployment edited by hand, is seen by looking again.
fn requeue_with_pooler(decision: &Decision) -> Option<Duration> {
    match &decision.status.pooler {
        Some(pooler) => {
            let again = if pooler.ready_instances < pooler.instances { POOLER_STARTING } else { POOLER_RECHECK };
            Some(decision.requeue.map_or(again, |requeue| requeue.min(again)))
        }
        None => decision.requeue,
    }
}

/// How soon a pass looks at a pooler whose pods are not all ready yet.
const POOLER_STARTING: Duration = Duration::from_secs(5);
/// How soon a pass looks at a ready pooler again (its Deployment is not watched).
const POOLER_RECHECK: Duration = Duration::from_secs(60);
