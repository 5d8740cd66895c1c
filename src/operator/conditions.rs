//! Status conditions: set one, keeping lastTransitionTime unless the status really changes, so
//! that recomputing the same status writes nothing.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Condition types the controller writes.
pub mod types {
    /// Every instance is ready.
    pub const READY: &str = "Ready";
    /// A rollout or provisioning is in progress.
    pub const PROGRESSING: &str = "Progressing";
    /// Standbys were scaled away for lack of resources.
    pub const DEGRADED: &str = "Degraded";
    /// The spec breaks a validation rule.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Data volumes are bound and sized as requested.
    pub const STORAGE_READY: &str = "StorageReady";
    /// A version change was rolled back.
    pub const ROLLED_BACK: &str = "RolledBack";
    /// The credentials Secret matches the database.
    pub const CREDENTIALS_READY: &str = "CredentialsReady";
    /// Reconciliation is paused by spec.paused.
    pub const PAUSED: &str = "Paused";
    /// The primary archives its WAL to the object store (with spec.backup).
    pub const CONTINUOUS_ARCHIVING: &str = "ContinuousArchiving";
    /// spec.hibernated stops the instances (True), or a wake waits for the primary (False, Waking).
    pub const HIBERNATED: &str = "Hibernated";
    /// spec.storageGrowth can grow the volumes (True: ready, grown, or grown to its limit), or
    /// cannot (False: at the limit and full, or a StorageClass that does not allow expansion).
    pub const STORAGE_GROWTH: &str = "StorageGrowth";
}

/// Sets a condition in `conditions`, preserving lastTransitionTime when the status is unchanged;
/// a transition is stamped `now`.
pub fn set(
    conditions: &mut Vec<Condition>,
    kind: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: DateTime<Utc>,
) {
    let transition = Time(Timestamp::from_second(now.timestamp()).unwrap_or(Timestamp::UNIX_EPOCH));
    let status_text = if status { "True" } else { "False" }.to_string();
    let message = message.into();
    if let Some(existing) = conditions.iter_mut().find(|condition| condition.type_ == kind) {
        if existing.status != status_text {
            existing.last_transition_time = transition;
        }
        existing.status = status_text;
        existing.reason = reason.into();
        existing.message = message;
        existing.observed_generation = generation;
        return;
    }
    conditions.push(Condition {
        type_: kind.into(),
        status: status_text,
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: transition,
    });
}

/// Removes a condition.
pub fn remove(conditions: &mut Vec<Condition>, kind: &str) {
    conditions.retain(|condition| condition.type_ != kind);
}

/// Whether a condition is present and True.
pub fn is_true(conditions: &[Condition], kind: &str) -> bool {
    conditions.iter().any(|condition| condition.type_ == kind && condition.status == "True")
}
