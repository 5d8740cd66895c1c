//! Errors of a reconcile pass, each naming the step that failed (the metric and the warning log
//! carry it too).

use thiserror::Error;

/// The steps of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Reading what exists (caches; a StorageClass GET when storage grows).
    Observe,
    /// Writing children, pods and claims.
    Apply,
    /// Writing status, ledger and events.
    Publish,
    /// Applying the deletion policy.
    Cleanup,
    /// Adding or removing the finalizer.
    Finalizer,
    /// Leadership was lost during the pass: nothing more is written.
    StepDown,
}

impl Step {
    /// Lowercase name, as in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Observe => "observe",
            Step::Apply => "apply",
            Step::Publish => "publish",
            Step::Cleanup => "cleanup",
            Step::Finalizer => "finalizer",
            Step::StepDown => "step_down",
        }
    }
}

/// Reconciling a DatabaseService failed.
#[derive(Debug, Error)]
pub enum ReconcileError {
    /// Observing failed.
    #[error("observe: {0}")]
    Observe(#[source] kube::Error),
    /// Applying children, pod or claim changes failed.
    #[error("apply: {0}")]
    Apply(#[source] kube::Error),
    /// Writing status or the ledger failed.
    #[error("publish: {0}")]
    Publish(#[source] kube::Error),
    /// Applying the deletion policy failed.
    #[error("cleanup: {0}")]
    Cleanup(#[source] kube::Error),
    /// Adding or removing the finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// Leadership was lost: the pass was cancelled before writing again.
    #[error("leadership lost: pass cancelled")]
    StepDown,
    /// The caches have not finished their first list: acting now could recreate what exists.
    #[error("observe: caches not synced yet")]
    CachesNotReady,
}

impl ReconcileError {
    /// The step that failed.
    pub fn step(&self) -> Step {
        match self {
            ReconcileError::Observe(_) => Step::Observe,
            ReconcileError::Apply(_) => Step::Apply,
            ReconcileError::Publish(_) => Step::Publish,
            ReconcileError::Cleanup(_) => Step::Cleanup,
            ReconcileError::Finalizer(_) => Step::Finalizer,
            ReconcileError::StepDown => Step::StepDown,
            ReconcileError::CachesNotReady => Step::Observe,
        }
    }

    /// A 409 (someone, or a stale cache, wrote in between) or caches still syncing: retried soon,
    /// without a warning.
    pub fn is_transient(&self) -> bool {
        let source = match self {
            ReconcileError::CachesNotReady => return true,
            ReconcileError::Observe(error)
            | ReconcileError::Apply(error)
            | ReconcileError::Publish(error)
            | ReconcileError::Cleanup(error) => error,
            _ => return false,
        };
        matches!(source, kube::Error::Api(status) if status.code == 409)
    }
}
