//! The controller half of the binary: turns each DatabaseService into a running PostgreSQL and
//! keeps it that way. Only the leader runs it (see [`crate::leader`]).

pub mod apply;
pub mod build;
pub mod cleanup;
pub mod conditions;
mod decide;
pub mod health;
pub mod ledger;
mod pods;
mod reconcile;
mod status;
mod storage;

use crate::api::{DatabaseService, FINALIZER};
use crate::controller::build::INSTANCE_LABEL;
use crate::metrics::{Metrics, ReconcileLabels};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::{Api, Client, ResourceExt};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::watch;

/// Reconciling a DatabaseService failed.
#[derive(Debug, Error)]
pub enum ReconcileError {
    /// A Kubernetes API call failed.
    #[error("kubernetes api: {0}")]
    Kube(#[from] kube::Error),
    /// Adding or removing the finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
}

/// Tunables of the controller.
#[derive(Clone, Debug)]
pub struct ControllerSettings {
    /// Minimum storage size (validation).
    pub min_storage_size: String,
    /// How long a version change may stay unhealthy before it is rolled back.
    pub progress_deadline: Duration,
    /// How long a pod may be not ready (or a standby unschedulable) before the operator acts.
    pub unhealthy_threshold: Duration,
    /// First restart backoff; doubles with each restart.
    pub restart_backoff: Duration,
    /// Longest restart backoff.
    pub restart_backoff_cap: Duration,
    /// How long to stay degraded before probing for resources again.
    pub restore_probe: Duration,
    /// DatabaseServices reconciled at once.
    pub concurrency: u16,
    /// Only this namespace, or all when None.
    pub watch_namespace: Option<String>,
    /// Only DatabaseServices matching this label selector, or all when None.
    pub selector: Option<String>,
}

/// Shared state of every reconciliation.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Event recorder.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Tunables.
    pub settings: ControllerSettings,
}

async fn reconcile(database: Arc<DatabaseService>, context: Arc<Context>) -> Result<Action, ReconcileError> {
    let namespace = database.namespace().unwrap_or_default();
    let api: Api<DatabaseService> = Api::namespaced(context.client.clone(), &namespace);
    let result = finalizer(&api, FINALIZER, database, |event| async {
        match event {
            FinalizerEvent::Apply(database) => reconcile::apply(&database, &context).await,
            FinalizerEvent::Cleanup(database) => cleanup::cleanup(&database, &context).await,
        }
    })
    .await
    .map_err(|error| match error {
        kube::runtime::finalizer::Error::ApplyFailed(error) | kube::runtime::finalizer::Error::CleanupFailed(error) => {
            error
        }
        other => ReconcileError::Finalizer(other.to_string()),
    });
    let outcome = if result.is_ok() { "success" } else { "error" };
    context.metrics.reconciliations.get_or_create(&ReconcileLabels { result: outcome.into() }).inc();
    result
}

fn error_policy(database: Arc<DatabaseService>, error: &ReconcileError, _context: Arc<Context>) -> Action {
    // 409 conflicts are routine (someone wrote in between): retry soon. Other errors back off.
    let conflict = matches!(error, ReconcileError::Kube(kube::Error::Api(status)) if status.code == 409);
    if !conflict {
        tracing::warn!(database = %database.name_any(), namespace = ?database.namespace(), %error, "reconcile failed");
    }
    Action::requeue(if conflict { Duration::from_millis(200) } else { Duration::from_secs(5) })
}

fn instance_of<K: ResourceExt>(object: K) -> Option<ObjectRef<DatabaseService>> {
    let instance = object.labels().get(INSTANCE_LABEL)?.clone();
    Some(ObjectRef::new(&instance).within(&object.namespace()?))
}

/// Runs the controller while `leader` is true; stops within moments of losing leadership and
/// starts again when it comes back. Returns when `shutdown` turns true.
pub async fn run_while_leader(
    client: Client,
    context: Arc<Context>,
    mut leader: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = leader.wait_for(|leading| *leading) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        tracing::info!("starting the controller");
        let mut stop_leader = leader.clone();
        let mut stop_shutdown = shutdown.clone();
        let stop = async move {
            tokio::select! {
                _ = stop_leader.wait_for(|leading| !*leading) => {}
                _ = stop_shutdown.wait_for(|stop| *stop) => {}
            }
        };
        controller(client.clone(), context.clone())
            .graceful_shutdown_on(stop)
            .run(reconcile, error_policy, context.clone())
            .for_each(|_| async {})
            .await;
        tracing::info!("controller stopped");
        if *shutdown.borrow() {
            return;
        }
    }
}

fn controller(client: Client, context: Arc<Context>) -> Controller<DatabaseService> {
    let managed = watcher::Config::default().labels("app.kubernetes.io/managed-by=dbservice-operator");
    let settings = &context.settings;
    let databases = match &settings.watch_namespace {
        Some(namespace) => Api::<DatabaseService>::namespaced(client.clone(), namespace),
        None => Api::<DatabaseService>::all(client.clone()),
    };
    let mut selected = watcher::Config::default();
    if let Some(selector) = &settings.selector {
        selected = selected.labels(selector);
    }
    Controller::new(databases, selected)
        .owns(Api::<StatefulSet>::all(client.clone()), managed.clone())
        .owns(Api::<Service>::all(client.clone()), managed.clone())
        .owns(Api::<ConfigMap>::all(client.clone()), managed.clone())
        .owns(Api::<Secret>::all(client.clone()), managed.clone())
        .watches(Api::<Pod>::all(client.clone()), managed.clone(), instance_of)
        .watches(Api::<PersistentVolumeClaim>::all(client), managed, instance_of)
        .with_config(
            ControllerConfig::default().concurrency(context.settings.concurrency).debounce(Duration::from_millis(500)),
        )
}

/// The event recorder for this process.
pub fn recorder(client: Client, identity: &str) -> Recorder {
    Recorder::new(client, Reporter { controller: "dbservice-operator".into(), instance: Some(identity.into()) })
}
