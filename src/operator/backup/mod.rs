//! Base backups as objects (issue 12): a `DatabaseServiceBackup`
//! ([`crate::api::database_service_backup`]) is carried out by a
//! Kubernetes Job ([`job`]) whose termination message fills its status ([`status`]); one Job
//! per database at a time, history limits ([`history`]), events and ledger entries
//! ([`reconcile`]); `spec.backup.schedule` creates backup objects at the cron times
//! ([`scheduler`], due logic in [`scheduling`]). Started with the DatabaseService controller,
//! only while this process leads ([`term`], run beside the DatabaseService controller by
//! [`crate::operator::wiring`]).

pub mod context;
pub mod history;
pub mod job;
pub mod reconcile;
pub mod scheduler;
pub mod scheduling;
pub mod status;
mod wiring;

pub use context::BackupContext;
pub use wiring::term;

/// What the backup controller and the scheduler do to each resource (API group, resource,
/// verbs); the chart's RBAC grants exactly this (tests/rbac.rs).
pub const PERMISSIONS: &[(&str, &str, &[&str])] = &[
    ("dbservice.dev", "databaseservicebackups", &["get", "list", "watch", "create", "delete"]),
    ("dbservice.dev", "databaseservicebackups/status", &["patch"]),
    // ownerReferences with blockOwnerDeletion on the Jobs.
    ("dbservice.dev", "databaseservicebackups/finalizers", &["update"]),
    ("dbservice.dev", "databaseservices", &["get", "list", "watch"]),
    ("batch", "jobs", &["get", "list", "watch", "create", "delete"]),
    // The termination message of a finished backup Job's pod.
    ("", "pods", &["list"]),
    // The ledger.
    ("", "configmaps", &["get", "create", "update"]),
    ("", "events", &["create"]),
];
