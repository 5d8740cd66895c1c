//! Wiring of the backup controller: a kube-runtime Controller on DatabaseServiceBackups that
//! owns their Jobs and is woken by their DatabaseServices, plus the scheduler; both run only
//! while this process leads and write only through the leader-gated client.

use crate::api::database_service::DatabaseService;
use crate::api::database_service_backup::DatabaseServiceBackup;
use crate::operator::backup::context::BackupContext;
use crate::operator::backup::job::BACKUP_JOB_SELECTOR;
use crate::operator::backup::reconcile::{reconcile_backup, ReconcileBackupError};
use crate::operator::backup::scheduler::run_scheduler;
use crate::operator::caches::Stores;
use crate::operator::caches::{scoped, DatabaseSubscription};
use crate::operator::context::Context;
use crate::operator::context::PassContext;
use crate::operator::expectations::Expectations;
use crate::operator::leader::TermEnd;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::{self, reflector, ObjectRef};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{Controller, WatchStreamExt};
use kube::{Client, ResourceExt};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Objects per page of a watch's (re)list.
const LIST_PAGE_SIZE: u32 = 50;
/// Backups reconciled at once.
const CONCURRENCY: u16 = 4;

/// Caches that nothing fills: the ledger helpers need a [`PassContext`], not its caches.
fn empty_stores() -> Stores {
    Stores {
        stateful_sets: reflector::store().0,
        services: reflector::store().0,
        config_maps: reflector::store().0,
        secrets: reflector::store().0,
        pods: reflector::store().0,
        claims: reflector::store().0,
        nodes: reflector::store().0,
    }
}

fn controller(
    client: &Client,
    context: &Arc<Context>,
    leading: watch::Receiver<bool>,
    databases: DatabaseSubscription,
) -> (Controller<DatabaseServiceBackup>, Arc<BackupContext>) {
    let settings = &context.settings;
    let namespace = settings.watch_namespace.as_deref();
    let page = watcher::Config::default().page_size(LIST_PAGE_SIZE);
    let (backups, backup_events) = {
        let (reader, writer) = reflector::store();
        let events = watcher(scoped::<DatabaseServiceBackup>(client, namespace), page.clone()).default_backoff();
        (reader, reflector(writer, events.modify(|backup| backup.managed_fields_mut().clear())).applied_objects())
    };
    let (jobs, job_events) = {
        let (reader, writer) = reflector::store();
        let events = watcher(scoped::<Job>(client, namespace), page.labels(BACKUP_JOB_SELECTOR)).default_backoff();
        (reader, reflector(writer, events.modify(|job| job.managed_fields_mut().clear())).touched_objects())
    };
    let backup_context = Arc::new(BackupContext {
        pass: PassContext {
            shared: context.clone(),
            stores: empty_stores(),
            expectations: Expectations::default(),
            leading,
            lease_clock: Default::default(),
        },
        backups: backups.clone(),
        databases: databases.store,
        jobs,
    });
    // A DatabaseService that appears or changes wakes its unfinished backups.
    let waiting = backups.clone();
    let controller = Controller::for_stream(backup_events, backups)
        .owns_stream(job_events)
        .watches_shared_stream(databases.events, move |database: Arc<DatabaseService>| {
            let namespace = database.namespace();
            let name = database.name_any();
            waiting
                .state_filter(|backup| {
                    let finished =
                        backup.status.as_ref().and_then(|status| status.phase).is_some_and(|phase| phase.is_terminal());
                    !finished && backup.namespace() == namespace && backup.spec.database_service == name
                })
                .into_iter()
                .map(|backup| ObjectRef::from_obj(backup.as_ref()))
                .collect::<Vec<_>>()
        })
        .with_config(ControllerConfig::default().concurrency(CONCURRENCY).debounce(Duration::from_millis(500)));
    (controller, backup_context)
}

async fn reconcile(
    backup: Arc<DatabaseServiceBackup>,
    context: Arc<BackupContext>,
) -> Result<Action, ReconcileBackupError> {
    let mut leading = context.pass.leading.clone();
    tokio::select! {
        result = reconcile_backup(&backup, &context) => result,
        // Dropping the pass cancels any request in flight: a former leader writes nothing more.
        _ = leading.wait_for(|leading| !*leading) => Err(ReconcileBackupError::StepDown),
    }
}

fn error_policy(
    backup: Arc<DatabaseServiceBackup>,
    error: &ReconcileBackupError,
    _context: Arc<BackupContext>,
) -> Action {
    if let ReconcileBackupError::Api { source: kube::Error::Api(status), .. } = error {
        if status.code == 409 {
            return Action::requeue(Duration::from_millis(500));
        }
    }
    tracing::warn!(backup = %backup.name_any(), namespace = ?backup.namespace(), %error, "backup reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

/// One leadership term of the backup controller and the scheduler, reading the DatabaseService
/// controller's cache of the term ([`DatabaseSubscription`]); ends with the term.
pub fn term(
    client: &Client,
    context: &Arc<Context>,
    leading: watch::Receiver<bool>,
    databases: DatabaseSubscription,
    end: TermEnd,
) -> impl Future<Output = ()> {
    let (controller, backup_context) = controller(client, context, leading, databases);
    let controller_run = controller
        .graceful_shutdown_on(end.clone().reached())
        .run(reconcile, error_policy, backup_context.clone())
        .for_each(|_| async {});
    let scheduler = run_scheduler(backup_context, end.reached());
    futures::future::join(controller_run, scheduler).map(|_| ())
}
