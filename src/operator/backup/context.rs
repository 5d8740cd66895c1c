//! What every backup pass and the scheduler share (a leaf: imports no sibling but the API).

use crate::api::database_service::DatabaseService;
use crate::api::database_service_backup::DatabaseServiceBackup;
use crate::operator::context::PassContext;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::reflector::Store;

/// What every backup pass shares.
pub struct BackupContext {
    /// The DatabaseService controller's shared state with a term's leadership signal (the ledger
    /// helpers take it; its caches are empty, nothing here reads them).
    pub pass: PassContext,
    /// Backup objects.
    pub backups: Store<DatabaseServiceBackup>,
    /// The DatabaseServices this operator manages (same namespace and label selector).
    pub databases: Store<DatabaseService>,
    /// Backup Jobs.
    pub jobs: Store<Job>,
}
