//! Decide (pure): from the spec, the status, the observed children, the settings and the time to
//! the new status, the journal (events and ledger entries) and the workload to build and apply.
//! No client, no clock: the table tests in `decide_tests.rs` run it without a cluster.

use crate::admission::validation::{validate, ValidationSettings};
use crate::api::database_service::{DatabaseService, DatabaseServiceStatus, Phase, StorageStatus};
use crate::api::names::{
    is_owned_by, owner_reference, ChildNames, MANAGED_BY, MANAGED_BY_LABEL, NO_ROLE, PRIMARY_ROLE, ROLE_LABEL,
    STANDBY_ROLE,
};
use crate::operator::caches::diff;
use crate::operator::conditions::{self, types};
use crate::operator::database::archiving::{decide_archiving, ArchivingHealth};
use crate::operator::database::build::{self, WorkloadInputs};
use crate::operator::database::certificates::{decide_certificates, observed_certificates, CertificateWork};
use crate::operator::database::failover::pass::{
    decide_failover, report_of, FailoverInput, FailoverOutcome, URGENT_REQUEUE,
};
use crate::operator::database::healing::{decide_rollout, Rollout};
use crate::operator::database::hibernation;
use crate::operator::database::major_upgrade::{decide_major_upgrade, MajorUpgradeDecision, MajorUpgradeInput};
use crate::operator::database::observe::{claim_class, claim_request, Observed};
use crate::operator::database::pod_health::{self, PodHealth};
use crate::operator::database::pod_replacement::{rolling_step, RollingStep};
use crate::operator::database::settings::ControllerSettings;
use crate::operator::database::storage_growth;
use crate::operator::database::summary::summarize;
use crate::operator::journal::{Journal, Transition};
use crate::operator::ledger::LedgerEntry;
use crate::quantity::parse_bytes;
use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use std::time::Duration;

/// Everything decide reads.
pub struct DecideInput<'a> {
    /// The DatabaseService as cached.
    pub database: &'a DatabaseService,
    /// Its children as cached.
    pub observed: &'a Observed,
    /// Tunables.
    pub settings: &'a ControllerSettings,
    /// The time of this pass.
    pub now: DateTime<Utc>,
    /// How long this process has seen the failover timer running in the stored status (see
    /// [`crate::operator::database::failover::clock`]); None: judge it by `now`.
    pub failover_timer_seen: Option<Duration>,
}

/// What decide wants done.
#[derive(Clone, Debug)]
pub struct Decision {
    /// The status to publish (written only if it differs from the stored one).
    pub status: DatabaseServiceStatus,
    /// Events and ledger entries to publish.
    pub journal: Journal,
    /// The workload to build and apply; None changes nothing (paused, invalid spec).
    pub workload: Option<Workload>,
    /// When to look again; None waits for a change.
    pub requeue: Option<Duration>,
    /// WAL archiving health for the metrics (Unknown when the pass decided nothing about it).
    pub archiving: ArchivingHealth,
}

/// The children to build and the changes to make to pods and claims.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Inputs of the StatefulSet.
    pub inputs: WorkloadInputs,
    /// No credentials Secret is cached: create one (never overwrite one).
    pub create_credentials: bool,
    /// No superuser Secret is cached: create one (never overwrite one).
    pub create_superuser: bool,
    /// Certificates to make, issue or publish.
    pub certificates: CertificateWork,
    /// No replication Secret is cached: create one (never overwrite one).
    pub create_replication: bool,
    /// Role labels to set.
    pub pod_labels: Vec<PodLabel>,
    /// Pods stuck broken on an old revision, deleted with uid and resourceVersion preconditions.
    pub pod_deletions: Vec<PodDeletion>,
    /// Owner references and sizes of claims.
    pub claim_changes: Vec<ClaimChange>,
    /// Release the primary Lease if this instance (whose pod is gone) still holds it.
    pub release_lease_of: Option<String>,
    /// Release the primary Lease if it is still at the version that lapsed.
    pub release_lapsed_lease: Option<crate::operator::database::failover::pass::LapsedLease>,
    /// Remove the switchover annotation from the DatabaseService.
    pub clear_switchover_request: bool,
    /// Create this `DatabaseServiceBackup` (the backup before a major upgrade), if absent.
    pub create_backup: Option<String>,
    /// The DatabaseService was provisioned in an earlier pass: a missing child was deleted.
    pub provisioned_before: bool,
    /// Nothing in the spec or the decisions changed: a differing child was edited by hand.
    pub drift_possible: bool,
}

/// A role label for one pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodLabel {
    /// Pod name.
    pub pod: String,
    /// primary or standby.
    pub role: &'static str,
}

/// Whether `pod` lacks the managed-by label (removed by hand: the caches no longer see it).
fn lost_managed_by(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.labels().get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY)
}

/// A pod to delete, only if it is still the one observed.
#[derive(Clone, Debug, PartialEq)]
pub struct PodDeletion {
    /// Pod name.
    pub pod: String,
    /// Its uid when observed.
    pub uid: Option<String>,
    /// Its resourceVersion when observed.
    pub resource_version: Option<String>,
}

/// One merge patch of a claim, conditional on its observed resourceVersion.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimChange {
    /// Claim name.
    pub claim: String,
    /// Its resourceVersion when observed.
    pub resource_version: Option<String>,
    /// The full new ownerReferences, when ours is to be added.
    pub owner_references: Option<Vec<OwnerReference>>,
    /// The new storage request, when it grows.
    pub storage: Option<String>,
}

/// Decides one pass.
pub fn decide(input: &DecideInput) -> Decision {
    let DecideInput { database, observed, now, .. } = *input;
    let generation = database.metadata.generation.unwrap_or(0);
    let old_status = database.status.clone().unwrap_or_default();
    let mut status = old_status.clone();
    let mut journal = Journal::default();
    if stopped_by_pause_or_invalid_spec(input, &old_status, &mut status, &mut journal) {
        return Decision { status, journal, workload: None, requeue: None, archiving: ArchivingHealth::Unknown };
    }
    record_generation(database, &old_status, &mut journal, now);
    let create_credentials = decide_credentials(database, observed, &mut status, &mut journal, now);
    let pods = pod_healths(observed);
    if database.spec.is_hibernated() {
        return hibernated(input, &old_status, status, journal, create_credentials, &pods);
    }
    let primary_is_back = hibernation::primary_back(&status, &observed.pods, &pods);
    let held_by_wake = hibernation::decide_wake(database, &mut status, primary_is_back, &mut journal, now);
    let reported_recovery = crate::api::recovery::reported(&observed.pods);
    crate::operator::database::recovery::decide_recovery(&mut status, reported_recovery, generation, now, &mut journal);
    // The one StatefulSet this pass needs, expanded from its compact cached form.
    let expanded = observed.stateful_set.as_deref().and_then(|live| live.expand());
    let live_stateful_set = expanded.as_ref();
    let plan = plan_rollout(input, &pods, live_stateful_set, &mut status, &mut journal);
    let failover = failover_step(input, &pods, &plan.rolling, held_by_wake, &mut status, &mut journal);
    tell_instance_changes(&old_status.instances, &status.instances, &mut journal, generation, now);
    crate::operator::database::requests::decide_requested_reload(
        database,
        &observed.pods,
        &mut status,
        &mut journal,
        now,
    );
    let claim_changes = decide_storage(database, observed, &mut status, &mut journal, now);
    let primary = failover.primary.as_deref();
    let primary_report = primary_archiving_report(observed, primary);
    let archiving = decide_archiving(
        database.spec.backup.as_ref(),
        primary,
        primary_report.as_ref(),
        &mut status,
        &mut journal,
        generation,
        now,
    );
    let rollout = &plan.rollout;
    let (pod_labels, mut pod_deletions) =
        decide_pods(observed, &pods, primary, rollout, plan.stateful_set_current, &mut journal);
    if let RollingStep::Replace(name) = &plan.rolling {
        replace_for_rolling(observed, name, &mut pod_deletions, &mut journal);
    }
    let rolled_out =
        pod_health::rolled_out(live_stateful_set, &pods, &rollout.image, rollout.replicas) && plan.stateful_set_current;
    summarize(database, &mut status, &pods, rollout, rolled_out, now, &mut journal);
    let converged = rolled_out && status.phase == Some(Phase::Running);
    let provisioned_before = old_status.observed_generation.is_some();
    let drift_possible =
        provisioned_before && old_status.observed_generation == Some(generation) && !rollout.changed_workload;
    let workload = Workload {
        inputs: plan.inputs,
        create_credentials,
        create_superuser: observed.superuser.is_none(),
        create_replication: observed.replication.is_none(),
        certificates: certificate_work(database, observed, now),
        pod_labels,
        pod_deletions,
        claim_changes,
        release_lease_of: failover.release_lease_of,
        release_lapsed_lease: failover.release_lapsed_lease,
        create_backup: plan.upgrade.create_backup,
        clear_switchover_request: failover.clear_switchover_request,
        provisioned_before,
        drift_possible,
    };
    let requeue = requeue_after(failover.urgent, converged, archiving.warn_in);
    Decision { status, journal, workload: Some(workload), requeue: Some(requeue), archiving: archiving.health }
}

/// A hibernated database's pass: the StatefulSet (and the pooler) at no instance, everything
/// else kept as it is; no failover, rollout or archiving decision while nothing runs.
fn hibernated(
    input: &DecideInput,
    old_status: &DatabaseServiceStatus,
    mut status: DatabaseServiceStatus,
    mut journal: Journal,
    create_credentials: bool,
    pods: &[PodHealth],
) -> Decision {
    let DecideInput { database, observed, settings, now, .. } = *input;
    hibernation::decide_hibernating(database, pods, observed.pooler_pods, &mut status, &mut journal, now);
    let live = observed.stateful_set.as_deref().and_then(|live| live.expand());
    let inputs = WorkloadInputs {
        // The image it ran: nothing rolls while nothing runs (admission keeps the version).
        image: live.as_ref().and_then(build::postgres_image).unwrap_or_else(|| database.spec.image_or_default()),
        replicas: 0,
        restarted_at: status.last_restart_at.clone(),
        claim_template_size: live
            .as_ref()
            .and_then(build::claim_template_size)
            .unwrap_or_else(|| database.spec.storage_size.clone()),
        instance_image: settings.instance_image.clone(),
    };
    let claim_changes = decide_claims(database, observed, &mut status, &mut journal, now);
    let provisioned_before = old_status.observed_generation.is_some();
    let workload = Workload {
        inputs,
        create_credentials,
        create_superuser: observed.superuser.is_none(),
        create_replication: observed.replication.is_none(),
        certificates: certificate_work(database, observed, now),
        pod_labels: Vec::new(),
        pod_deletions: Vec::new(),
        claim_changes,
        release_lease_of: None,
        release_lapsed_lease: None,
        clear_switchover_request: false,
        create_backup: None,
        provisioned_before,
        drift_possible: provisioned_before
            && old_status.observed_generation == database.metadata.generation
            && old_status.phase == Some(Phase::Hibernated),
    };
    // The pooler's pods are not watched: looked at again until none is left.
    let requeue =
        if pods.is_empty() && observed.pooler_pods == 0 { Duration::from_secs(300) } else { Duration::from_secs(5) };
    Decision { status, journal, workload: Some(workload), requeue: Some(requeue), archiving: ArchivingHealth::Unknown }
}

/// How the workload rolls this pass: the rollout (and any major upgrade) decided, the StatefulSet
/// inputs built from it, and the next pod to replace or switch over from.
struct RolloutPlan {
    rollout: Rollout,
    upgrade: MajorUpgradeDecision,
    inputs: WorkloadInputs,
    /// Applying will leave the StatefulSet as it is: only then is a rollout finished.
    stateful_set_current: bool,
    rolling: RollingStep,
}

/// Decides the rollout, the major upgrade's step and the next replacement of a pod.
fn plan_rollout(
    input: &DecideInput,
    pods: &[PodHealth],
    live_stateful_set: Option<&StatefulSet>,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
) -> RolloutPlan {
    let DecideInput { database, observed, settings, now, .. } = *input;
    let upgrade_instances: Vec<_> =
        observed.pods.iter().zip(pods).map(|(pod, health)| (health.clone(), report_of(pod))).collect();
    let past_the_way_back = crate::operator::database::major_upgrade::past_the_way_back(database, &upgrade_instances);
    let mut rollout =
        decide_rollout(database, status, pods, live_stateful_set, settings, now, journal, past_the_way_back);
    let upgrade = decide_major_upgrade(
        &MajorUpgradeInput {
            database,
            instances: &upgrade_instances,
            backup: observed.pre_upgrade_backup.as_ref(),
            rolled_out: pod_health::rolled_out(live_stateful_set, pods, &rollout.image, rollout.replicas),
            now,
        },
        status,
        &mut rollout,
        journal,
    );
    rollout.replicas = rollout.replicas.max(replicas_keeping_the_primary(&status.failover));
    if crate::operator::database::requests::decide_requested_restart(database, status, journal, now) {
        rollout.changed_workload = true;
    }
    let inputs = WorkloadInputs {
        image: rollout.image.clone(),
        replicas: rollout.replicas,
        restarted_at: status.last_restart_at.clone(),
        claim_template_size: live_stateful_set
            .and_then(build::claim_template_size)
            .unwrap_or_else(|| database.spec.storage_size.clone()),
        instance_image: settings.instance_image.clone(),
    };
    let stateful_set_current = observed
        .stateful_set
        .as_deref()
        .is_some_and(|live| diff::contains_object(live, &build::stateful_set(database, &inputs)));
    let rolling = rolling_step(
        &observed.pods,
        pods,
        live_stateful_set,
        &status.failover,
        stateful_set_current,
        upgrade.primary_first.as_deref(),
    );
    if matches!((&rolling, &upgrade.primary_first), (RollingStep::Replace(pod), Some(primary)) if pod == primary) {
        crate::operator::database::major_upgrade::primary_stopped(status, now);
    }
    RolloutPlan { rollout, upgrade, inputs, stateful_set_current, rolling }
}

/// Decides failover and switchover, with the switchover a rolling update or a drained node asks for.
fn failover_step(
    input: &DecideInput,
    pods: &[PodHealth],
    rolling: &RollingStep,
    held_by_wake: bool,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
) -> FailoverOutcome {
    let DecideInput { database, observed, now, failover_timer_seen, .. } = *input;
    let rolling_switchover = match rolling {
        RollingStep::SwitchoverTo(target) => Some(target.clone()),
        _ => None,
    };
    let drain_switchover = crate::operator::database::failover::drain::drain_switchover(
        &status.failover,
        &observed.pods,
        pods,
        &observed.cordoned_nodes,
    );
    let failover_input = FailoverInput {
        pods: &observed.pods,
        health: pods,
        lease: observed.primary_lease.as_ref(),
        lease_lapsed: observed.primary_lease_lapsed.as_deref(),
        rolling_switchover,
        drain_switchover,
        timer_seen: failover_timer_seen,
        held_by_major_upgrade: status.major_upgrade.as_ref().is_some_and(|upgrade| upgrade.holds_failover()),
        held_by_wake,
    };
    decide_failover(database, &failover_input, status, journal, now)
}

/// Tells, once per instance report, the owned settings an instance reverted and the commits it
/// discarded on rejoining.
fn tell_instance_changes(
    before: &[crate::api::failover::InstanceStatus],
    after: &[crate::api::failover::InstanceStatus],
    journal: &mut Journal,
    generation: i64,
    now: DateTime<Utc>,
) {
    crate::operator::database::owned_settings::tell_reverts(before, after, journal, generation, now);
    crate::operator::database::discarded::tell_discarded(before, after, journal, generation, now);
}

/// Certificates to make, issue or publish, from the cached Secrets and ConfigMap.
fn certificate_work(database: &DatabaseService, observed: &Observed, now: DateTime<Utc>) -> CertificateWork {
    decide_certificates(
        database,
        observed_certificates(
            observed.certificate_authority.as_ref(),
            observed.server_certificate.as_ref(),
            observed.published_authority.as_ref(),
        ),
        now,
    )
}

/// Pause and an invalid spec stop a pass before anything is decided: true when one of them
/// does (the status says which), after telling the change once.
fn stopped_by_pause_or_invalid_spec(
    input: &DecideInput,
    old_status: &DatabaseServiceStatus,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
) -> bool {
    let DecideInput { database, settings, now, .. } = *input;
    let generation = database.metadata.generation.unwrap_or(0);
    if database.spec.is_paused() {
        let transition = Transition {
            condition: types::PAUSED,
            status: true,
            condition_reason: "Paused",
            event_reason: "Paused",
            warning: false,
            message: "reconciliation paused by spec.paused: the operator changes nothing".into(),
            entry: Some(LedgerEntry::at(now, generation, "Paused", "", "", "reconciliation paused")),
        };
        journal.transition_on_change(&mut status.conditions, transition, generation, now);
        return true;
    }
    if conditions::is_true(&old_status.conditions, types::PAUSED) {
        let entry = LedgerEntry::at(now, generation, "Resumed", "", "", "reconciliation resumed");
        journal.record(false, "Resumed", "reconciliation resumed".into(), Some(entry));
    }
    conditions::remove(&mut status.conditions, types::PAUSED);

    // The webhook's own validation: an object stored while the webhook was absent changes nothing.
    let validation = ValidationSettings {
        min_storage_bytes: parse_bytes(&settings.min_storage_size).unwrap_or(0),
        min_storage_size: settings.min_storage_size.clone(),
        today: now.date_naive(),
        allowed_image_prefixes: Vec::new(),
        running_images: running_images(database, input.observed),
        // An import begun before the setting changed goes on.
        allow_import_with_source_roles: settings.allow_import_with_source_roles
            || database.status.as_ref().is_some_and(|status| status.import.is_some()),
    }
    .with_allowed_image_prefixes(settings.allowed_image_prefixes.clone());
    let outcome = validate(database, None, &validation);
    if !outcome.is_allowed() {
        let message = outcome.message();
        let transition = Transition {
            condition: types::INVALID_SPEC,
            status: true,
            condition_reason: "ValidationFailed",
            event_reason: "InvalidSpec",
            warning: true,
            entry: Some(LedgerEntry::at(now, generation, "InvalidSpec", "", "", message.clone())),
            message,
        };
        journal.transition_on_change(&mut status.conditions, transition, generation, now);
        status.phase = Some(Phase::Failed);
        status.observed_generation = Some(generation);
        return true;
    }
    conditions::remove(&mut status.conditions, types::INVALID_SPEC);
    false
}

/// The images the database's pods run, and the pooler's once it has one (its pods are not
/// watched): a later image policy does not stop them.
fn running_images(database: &DatabaseService, observed: &Observed) -> Vec<String> {
    let containers = observed.pods.iter().flat_map(|pod| pod.spec.iter().flat_map(|spec| &spec.containers));
    let mut images: Vec<String> = containers.filter_map(|container| container.image.clone()).collect();
    let pooler_runs = database.status.as_ref().is_some_and(|status| status.pooler.is_some());
    images.extend(database.spec.pooler.as_ref().and_then(|pooler| pooler.image.clone()).filter(|_| pooler_runs));
    images
}

/// Ledger entry of a new object or a new generation of its spec.
fn record_generation(
    database: &DatabaseService,
    old_status: &DatabaseServiceStatus,
    journal: &mut Journal,
    now: DateTime<Utc>,
) {
    let generation = database.metadata.generation.unwrap_or(0);
    match old_status.observed_generation {
        None => {
            let target = format!("{} x{}", database.spec.version, database.spec.replicas_or_default());
            journal.entries.push(LedgerEntry::at(now, generation, "Created", "", target, "provisioning started"));
        }
        Some(observed) if observed != generation => journal.entries.push(LedgerEntry::at(
            now,
            generation,
            "SpecChanged",
            format!("generation {observed}"),
            format!("generation {generation}"),
            "spec updated",
        )),
        Some(_) => {}
    }
}

/// Health of each pod; a pod that restores a backup is not ready on purpose, never unhealthy.
fn pod_healths(observed: &Observed) -> Vec<PodHealth> {
    observed
        .pods
        .iter()
        .map(|pod| {
            let mut health = pod_health::pod_health(pod);
            if crate::api::recovery::recovering(pod) {
                // Not ready on purpose while it restores; a restart would only start over.
                health.unhealthy_since = None;
            }
            health
        })
        .collect()
}

/// Only the primary archives: its report alone says whether archiving works.
fn primary_archiving_report(
    observed: &Observed,
    primary: Option<&str>,
) -> Option<crate::api::failover::ArchivingReport> {
    observed
        .pods
        .iter()
        .find(|pod| Some(pod.name_any().as_str()) == primary)
        .and_then(|pod| report_of(pod))
        .and_then(|report| report.archiving)
}

/// When to look again. Child and pod events wake the controller; the periodic look is a safety
/// net for time-based decisions (backoff, deadlines, restore probes) while something is wrong.
fn requeue_after(urgent: bool, converged: bool, archiving_warn_in: Option<Duration>) -> Duration {
    let requeue = if urgent {
        URGENT_REQUEUE
    } else if converged {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(5)
    };
    archiving_warn_in.map_or(requeue, |warn_in| requeue.min(warn_in))
}

/// Deletes `name` so that the StatefulSet recreates it from the update revision (updateStrategy
/// OnDelete: the operator orders the replacements, see [`crate::operator::database::pod_replacement`]).
fn replace_for_rolling(observed: &Observed, name: &str, deletions: &mut Vec<PodDeletion>, journal: &mut Journal) {
    let Some(pod) = observed.pods.iter().find(|pod| pod.name_any() == name) else { return };
    if deletions.iter().any(|deletion| deletion.pod == name) {
        return;
    }
    deletions.push(PodDeletion { pod: name.to_string(), uid: pod.uid(), resource_version: pod.resource_version() });
    let note = format!("pod {name} runs an old revision: replaced (standbys first, the primary after a switchover)");
    journal.record(false, "RollingUpdate", note, None);
}

/// Credentials are created once and never overwritten; returns whether to create them now.
fn decide_credentials(
    database: &DatabaseService,
    observed: &Observed,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    now: DateTime<Utc>,
) -> bool {
    let name = ChildNames::credentials(&database.name_any());
    let generation = database.metadata.generation.unwrap_or(0);
    let had_credentials = status.conditions.iter().any(|condition| condition.type_ == types::CREDENTIALS_READY);
    let conflicted = status.conditions.iter().any(|condition| {
        condition.type_ == types::CREDENTIALS_READY && condition.reason == CREDENTIALS_CONFLICT_REASON
    });
    if let Some(secret) = &observed.credentials {
        if !had_credentials || conflicted {
            let (reason, message) = if is_owned_by(secret.as_ref(), &database.uid().unwrap_or_default()) {
                ("SecretCreated", format!("credentials are in Secret {name}"))
            } else {
                // Created by this operator for an earlier DatabaseService of the same name and
                // retained: used (the retained volumes hold that password), never owned or deleted.
                ("SecretRetained", format!("credentials are in Secret {name}, retained from an earlier DatabaseService of this name (not deleted with this one)"))
            };
            conditions::set(
                &mut status.conditions,
                types::CREDENTIALS_READY,
                true,
                reason,
                message,
                Some(generation),
                now,
            );
        }
        return false;
    }
    if conflicted {
        // Still conflicting until a Secret we may use appears; try the create again (it reports).
        return true;
    }
    if had_credentials {
        let message = format!(
            "Secret {name} was deleted and has been recreated with a new password, but the database still has the old one: set it with ALTER ROLE (or restore the old Secret)"
        );
        let entry = LedgerEntry::at(
            now,
            generation,
            "CredentialsRecreated",
            "missing",
            format!("Secret/{name}"),
            "new password generated; database still has the old one",
        );
        let transition = Transition {
            condition: types::CREDENTIALS_READY,
            status: false,
            condition_reason: "SecretRecreated",
            event_reason: "CredentialsRecreated",
            warning: true,
            message,
            entry: Some(entry),
        };
        journal.transition(&mut status.conditions, transition, generation, now);
    } else {
        let message = format!("credentials are in Secret {name}");
        conditions::set(
            &mut status.conditions,
            types::CREDENTIALS_READY,
            true,
            "SecretCreated",
            message,
            Some(generation),
            now,
        );
        journal.record(false, "CredentialsCreated", format!("generated credentials in Secret {name}"), None);
    }
    true
}

/// Reason of CredentialsReady=False when a Secret of the credentials' name is not the operator's.
pub const CREDENTIALS_CONFLICT_REASON: &str = "SecretConflict";

/// The credentials or superuser Secret's name (`name`) is taken by a Secret the operator did not
/// create: nothing is built (the pods would read someone else's Secret) and the conflict is
/// reported.
pub fn credentials_conflict(decision: &mut Decision, database: &DatabaseService, name: &str, now: DateTime<Utc>) {
    let generation = database.metadata.generation.unwrap_or(0);
    let message = format!(
        "Secret {name} exists but was not created by dbservice-operator for this DatabaseService; it is left untouched. Delete or rename it, or rename the DatabaseService"
    );
    let entry = LedgerEntry::at(now, generation, "Conflict", "", format!("Secret/{name}"), "not the operator's");
    let transition = Transition {
        condition: types::CREDENTIALS_READY,
        status: false,
        condition_reason: CREDENTIALS_CONFLICT_REASON,
        event_reason: "CredentialsConflict",
        warning: true,
        message,
        entry: Some(entry),
    };
    let mut status = database.status.clone().unwrap_or_default();
    decision.journal = Journal::default();
    decision.journal.transition_on_change(&mut status.conditions, transition, generation, now);
    status.phase = Some(Phase::Failed);
    status.observed_generation = Some(generation);
    decision.status = status;
    decision.workload = None;
    // The foreign Secret carries none of our labels, so no watch event says when it goes.
    decision.requeue = Some(Duration::from_secs(30));
}

/// Growth of the volumes (spec.storageGrowth), then the claims' changes it and the spec ask for.
fn decide_storage(
    database: &DatabaseService,
    observed: &Observed,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    now: DateTime<Utc>,
) -> Vec<ClaimChange> {
    let not_expandable = storage_growth::not_expandable(&observed.claims, &observed.expandable_classes);
    // A class that cannot grow is told (StorageGrowth False); nothing is recorded as grown.
    let growth = match not_expandable {
        Some(_) => storage_growth::Growth::Idle,
        None => storage_growth::plan(database, &observed.pods, &observed.claims),
    };
    storage_growth::record(&growth, database, not_expandable, status, journal, now);
    decide_claims(database, observed, status, journal, now)
}

/// Owner references on the claims made for this DatabaseService, expansion when storageSize
/// grew (if the class allows), and the StorageReady condition.
fn decide_claims(
    database: &DatabaseService,
    observed: &Observed,
    status: &mut DatabaseServiceStatus,
    journal: &mut Journal,
    now: DateTime<Utc>,
) -> Vec<ClaimChange> {
    let mut changes = Vec::new();
    let mut expansion_refused = Vec::new();
    let wanted = storage_growth::wanted_size(&database.spec.storage_size, Some(status));
    for claim in &observed.claims {
        let change = claim_change(database, observed, claim, &wanted, &mut expansion_refused, journal, now);
        if change.owner_references.is_some() || change.storage.is_some() {
            changes.push(change);
        }
    }
    let expected = database.spec.replicas_or_default().min(status.degraded_replicas.unwrap_or(i32::MAX));
    let bound = pod_health::claims_bound(observed.claims.iter().map(|claim| claim.as_ref()));
    let grown = status.storage.take().unwrap_or_default();
    status.storage =
        Some(StorageStatus { requested: wanted.clone(), bound_claims: bound, expected_claims: expected, ..grown });
    set_storage_ready(database, status, &expansion_refused, bound, expected, journal, now);
    changes
}

/// The change one claim needs: our owner reference when it was made for this DatabaseService,
/// the new size when storageSize grew and its class allows expansion (else a refusal is noted
/// in `expansion_refused`).
fn claim_change(
    database: &DatabaseService,
    observed: &Observed,
    claim: &std::sync::Arc<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    wanted: &str,
    expansion_refused: &mut Vec<String>,
    journal: &mut Journal,
    now: DateTime<Utc>,
) -> ClaimChange {
    let generation = database.metadata.generation.unwrap_or(0);
    let owner = owner_reference(database);
    let wanted_bytes = parse_bytes(wanted).unwrap_or(0);
    let created = database.metadata.creation_timestamp.as_ref().map(|time| time.0);
    let claim_name = claim.name_any();
    let mut change = ClaimChange {
        claim: claim_name.clone(),
        resource_version: claim.resource_version(),
        owner_references: None,
        storage: None,
    };
    // Only claims made for this DatabaseService are owned; a claim kept (Retain) from an
    // earlier one of the same name is used by the StatefulSet but stays unowned, so that a
    // later deletionPolicy Delete never deletes data this DatabaseService did not create.
    let made_for_us = match (claim.metadata.creation_timestamp.as_ref(), created) {
        (Some(claim_created), Some(created)) => claim_created.0 >= created,
        _ => false,
    };
    if made_for_us && !is_owned_by(claim.as_ref(), &owner.uid) && claim.metadata.deletion_timestamp.is_none() {
        let mut references = claim.owner_references().to_vec();
        references.push(OwnerReference { controller: Some(false), ..owner.clone() });
        change.owner_references = Some(references);
    }
    let requested = claim_request(claim);
    // Only a bound claim's request may change (the API refuses it on a pending one, and the
    // refusal would stop the whole pass): a claim still pending is grown once bound.
    if parse_bytes(&requested).unwrap_or(0) < wanted_bytes && storage_growth::bound(claim) {
        let class = claim_class(claim);
        if observed.expandable_classes.get(&class).copied().unwrap_or(false) {
            change.storage = Some(wanted.to_string());
            let entry = LedgerEntry::at(now, generation, "StorageExpanded", requested.clone(), wanted, &claim_name);
            journal.record(
                false,
                "StorageExpanded",
                format!("PVC {claim_name} expanded from {requested} to {wanted}"),
                Some(entry),
            );
        } else {
            expansion_refused.push(format!("{claim_name} (StorageClass {class:?} does not allow volume expansion)"));
        }
    }
    change
}

/// StorageReady: false while an expansion is refused (told once) or claims are unbound.
fn set_storage_ready(
    database: &DatabaseService,
    status: &mut DatabaseServiceStatus,
    expansion_refused: &[String],
    bound: i32,
    expected: i32,
    journal: &mut Journal,
    now: DateTime<Utc>,
) {
    let generation = database.metadata.generation.unwrap_or(0);
    let storage = types::STORAGE_READY;
    if !expansion_refused.is_empty() {
        let message = format!("cannot grow {}", expansion_refused.join(", "));
        let reported = status
            .conditions
            .iter()
            .any(|condition| condition.type_ == storage && condition.reason == "ExpansionNotSupported");
        if !reported {
            journal.record(true, "ExpansionNotSupported", message.clone(), None);
        }
        conditions::set(
            &mut status.conditions,
            storage,
            false,
            "ExpansionNotSupported",
            message,
            Some(generation),
            now,
        );
    } else if bound >= expected {
        let message = format!("{bound} of {expected} volumes bound");
        conditions::set(&mut status.conditions, storage, true, "Bound", message, Some(generation), now);
    } else {
        let message = format!("{bound} of {expected} volumes bound (claims of a WaitForFirstConsumer class bind once their pod is scheduled)");
        conditions::set(&mut status.conditions, storage, false, "Pending", message, Some(generation), now);
    }
}

/// The fewest StatefulSet replicas that keep the primary (and an instance being promoted): a
/// StatefulSet removes its highest ordinals first, and removing the primary's pod would take the
/// database down mid-commit. Admission refuses such a scale-down; this holds when the status it
/// judged by was stale.
fn replicas_keeping_the_primary(failover: &crate::api::failover::FailoverStatus) -> i32 {
    [failover.current_primary.as_deref(), failover.target_primary.as_deref()]
        .into_iter()
        .flatten()
        .filter_map(crate::api::names::instance_ordinal)
        .map(|ordinal| ordinal + 1)
        .max()
        .unwrap_or(0)
}

/// The role label of one pod: `primary` for the current primary; `none` for a pod whose server
/// still reports itself primary (a former primary during a change, not yet stopped or rejoined):
/// the read-only Service must never send clients to a server that still accepts writes; `standby`
/// otherwise.
fn pod_role(pod: &k8s_openapi::api::core::v1::Pod, name: &str, primary: Option<&str>) -> &'static str {
    if Some(name) == primary {
        PRIMARY_ROLE
    } else if report_of(pod).is_some_and(|report| report.role == crate::api::failover::Role::Primary) {
        NO_ROLE
    } else {
        STANDBY_ROLE
    }
}

/// Role labels (standbys first, so that two pods are never labelled primary at once), and pods
/// stuck not ready on an old image once the template is current (a StatefulSet never replaces a
/// broken pod by itself, which would block every rollback).
fn decide_pods(
    observed: &Observed,
    pods: &[PodHealth],
    primary: Option<&str>,
    rollout: &Rollout,
    template_current: bool,
    journal: &mut Journal,
) -> (Vec<PodLabel>, Vec<PodDeletion>) {
    let mut labels = Vec::new();
    let mut deletions = Vec::new();
    for (pod, health) in observed.pods.iter().zip(pods) {
        if health.terminating {
            continue;
        }
        let role = pod_role(pod, &health.name, primary);
        if lost_managed_by(pod) {
            journal.record(
                false,
                "PodLabelRestored",
                format!("pod {} had lost its label {MANAGED_BY_LABEL}; put back", health.name),
                None,
            );
        }
        if pod.labels().get(ROLE_LABEL).map(String::as_str) != Some(role) || lost_managed_by(pod) {
            labels.push(PodLabel { pod: health.name.clone(), role });
        }
        if template_current && health.image != rollout.image && !health.ready && !health.unschedulable {
            deletions.push(PodDeletion {
                pod: health.name.clone(),
                uid: pod.uid(),
                resource_version: pod.resource_version(),
            });
            journal.record(
                false,
                "ReplacedStuckPod",
                format!(
                    "pod {} was not ready on an old revision ({}); deleted so it comes back with {}",
                    health.name, health.image, rollout.image
                ),
                None,
            );
        }
    }
    labels.sort_by_key(|label| label.role == PRIMARY_ROLE);
    (labels, deletions)
}

/// What applying one child did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The object did not exist and was created.
    Created,
    /// The object existed but differed and was corrected.
    Updated,
    /// The object already matched: nothing was written.
    Unchanged,
}

/// What applying the children did, as apply reports it: the conflict that stopped it, or each
/// child written (or found unchanged), in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The credentials or superuser Secret's name is taken by a Secret that is not ours (its
    /// name): nothing was written.
    pub credentials_conflict: Option<String>,
    /// The superuser Secret was created (for a database that had none: a new one, or one made
    /// before the application role stopped being the superuser).
    pub superuser_created: Option<String>,
    /// A server certificate was issued: what and why.
    pub certificate_issued: Option<String>,
    /// Each child applied: its description (`StatefulSet/demo`) and what happened.
    pub children: Vec<(String, ApplyOutcome)>,
}

/// The events and ledger entries of what applying did (recreated or drift-corrected children).
pub fn journal_applied(workload: &Workload, applied: &Applied, generation: i64, now: DateTime<Utc>) -> Journal {
    let mut journal = Journal::default();
    for (object, outcome) in &applied.children {
        let object = object.clone();
        match outcome {
            ApplyOutcome::Unchanged => {}
            ApplyOutcome::Created if workload.provisioned_before => journal.record(
                true,
                "Recreated",
                format!("{object} was missing and has been recreated"),
                Some(LedgerEntry::at(now, generation, "DriftCorrected", "missing", object, "recreated")),
            ),
            ApplyOutcome::Created => {}
            ApplyOutcome::Updated if workload.drift_possible => journal.record(
                true,
                "DriftCorrected",
                format!("{object} was changed outside the operator and has been put back"),
                Some(LedgerEntry::at(
                    now,
                    generation,
                    "DriftCorrected",
                    "edited",
                    object,
                    "restored to the desired state",
                )),
            ),
            ApplyOutcome::Updated => {
                journal.record(false, "Updated", format!("{object} updated for the new spec"), None)
            }
        }
    }
    if let Some(issued) = &applied.certificate_issued {
        // The first one, made with the database, is no news; a renewal or a replacement is.
        let entry = workload
            .provisioned_before
            .then(|| LedgerEntry::at(now, generation, "CertificateIssued", "", issued.clone(), "issued"));
        journal.record(false, "CertificateIssued", issued.clone(), entry);
    }
    if let Some(secret) = applied.superuser_created.as_ref().filter(|_| workload.provisioned_before) {
        // A database made when its application role was the superuser: that role is turned
        // into an ordinary one by the primary's agent once this password reaches it.
        journal.record(
            false,
            "SuperuserSecretCreated",
            format!("the superuser postgres has its own password in Secret {secret}; the application role is no longer a superuser once the instances restarted"),
            Some(LedgerEntry::at(now, generation, "SuperuserSeparated", "", format!("Secret/{secret}"), "created")),
        );
    }
    journal
}
