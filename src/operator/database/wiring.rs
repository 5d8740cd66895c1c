//! Wiring: the Controller with its watches (all from [`CHILD_KINDS`], scoped by the managed-by
//! label and `--watch-namespace`), the finalizer around each pass, the error policy, and running
//! only while this process leads.

use crate::api::database_service::{DatabaseService, FINALIZER};
use crate::api::names::MANAGED_SELECTOR;
use crate::metrics::ReconcileLabels;
use crate::operator::caches::Compact;
use crate::operator::caches::{scoped, ChildKind, DatabaseSubscription, PartialStores, Slim, Stores, CHILD_KINDS};
use crate::operator::context::{Context, PassContext};
use crate::operator::database::cleanup::cleanup;
use crate::operator::database::error::ReconcileError;
use crate::operator::database::failover::lease_clock::LeaseClock;
use crate::operator::database::lease_watch::lapse_triggers;
use crate::operator::database::reconcile::reconcile_live;
use crate::operator::expectations::Expectations;
use crate::operator::leader::TermEnd;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim, Pod, Secret, Service};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::runtime::reflector::{self, reflector, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{Controller, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Objects per page of a watch's (re)list.
const LIST_PAGE_SIZE: u32 = 50;
/// DatabaseService events the shared cache holds for a subscriber that lags behind (the backup
/// controller); the watch waits for it beyond that.
const SHARED_EVENT_BUFFER: usize = 1024;

/// Watch configuration of the children: managed-by label; lists may be served from the
/// apiserver's cache (any resourceVersion) to spare etcd on start-up.
fn managed() -> watcher::Config {
    watcher::Config::default().labels(MANAGED_SELECTOR).page_size(LIST_PAGE_SIZE)
}

/// A cached, slimmed watch of `K`: the store every pass reads, and the stream that triggers passes.
fn cache<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
) -> (Store<K>, impl Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Slim + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector(writer, events.default_backoff().modify(Slim::slim)).touched_objects();
    (reader, stream)
}

/// The DatabaseService a compact child belongs to: its controlling owner, as `owns` maps it (the
/// ownerReferences themselves are packed), else its instance label.
fn database_of<K>(object: Compact<K>) -> Option<ObjectRef<DatabaseService>> {
    Some(ObjectRef::new(object.database()?).within(object.metadata.namespace.as_deref()?))
}

/// The Controller, the caches it fills, and a subscription to its DatabaseService cache for the
/// backup controller (one cache of every DatabaseService in the process, not one per controller).
fn controller(
    client: &Client,
    context: &Context,
    lease_clock: &Arc<LeaseClock>,
) -> (Controller<DatabaseService>, Stores, DatabaseSubscription) {
    let settings = &context.settings;
    let namespace = settings.watch_namespace.as_deref();
    let mut selected = watcher::Config::default().page_size(LIST_PAGE_SIZE);
    if let Some(selector) = &settings.selector {
        selected = selected.labels(selector);
    }
    let (databases, database_events, subscription) = {
        let (reader, writer) = reflector::store_shared(SHARED_EVENT_BUFFER);
        let subscription = DatabaseSubscription {
            store: reader.clone(),
            events: writer.subscribe().expect("a shared store can be subscribed"),
        };
        let events = watcher(scoped::<DatabaseService>(client, namespace), selected).default_backoff();
        (reader, reflector(writer, events.modify(Slim::slim)).applied_objects(), subscription)
    };
    let mut controller = Controller::for_stream(database_events, databases);
    let mut stores = PartialStores::default();
    controller = watch_children(controller, client, namespace, &mut stores);
    controller = watch_nodes(controller, client, &mut stores);
    // A primary Lease that lapsed (its holder fenced itself) wakes its database at once.
    controller = controller.reconcile_on(lapse_triggers(client, namespace, lease_clock.clone()));
    // No debounce: kube-runtime's debounce is trailing and restarts with every event, and during a
    // failover the pods change every few hundred milliseconds (agents' reports, readiness, a pod
    // re-created), so a 500 ms debounce held the pass that starts or completes the failover back
    // for seconds (seen on the real node: 2 s after a primary pod's deletion). Passes read caches
    // and write only what changed; triggers for an object already queued or running coalesce.
    let config = ControllerConfig::default().concurrency(settings.concurrency);
    (controller.with_config(config), stores.complete(), subscription)
}

/// Watches (and caches) every child kind: a change of a child wakes its DatabaseService.
fn watch_children(
    mut controller: Controller<DatabaseService>,
    client: &Client,
    namespace: Option<&str>,
    stores: &mut PartialStores,
) -> Controller<DatabaseService> {
    for kind in CHILD_KINDS {
        controller = match kind {
            ChildKind::StatefulSet => {
                let (store, stream) = cache(watcher(scoped::<Compact<StatefulSet>>(client, namespace), managed()));
                stores.stateful_sets = Some(store);
                controller.watches_stream(stream, database_of)
            }
            ChildKind::Service => {
                let (store, stream) = cache(watcher(scoped::<Compact<Service>>(client, namespace), managed()));
                stores.services = Some(store);
                controller.watches_stream(stream, database_of)
            }
            ChildKind::ConfigMap => {
                let (store, stream) = cache(watcher(scoped::<Compact<ConfigMap>>(client, namespace), managed()));
                stores.config_maps = Some(store);
                controller.watches_stream(stream, database_of)
            }
            ChildKind::Secret => {
                // Metadata only: passwords never sit in the operator's memory.
                let (store, stream) = cache(watcher(scoped::<PartialObjectMeta<Secret>>(client, namespace), managed()));
                stores.secrets = Some(store);
                controller.owns_stream(stream)
            }
            ChildKind::Pod => {
                let (store, stream) = cache(watcher(scoped::<Compact<Pod>>(client, namespace), managed()));
                stores.pods = Some(store);
                controller.watches_stream(stream, database_of)
            }
            ChildKind::PersistentVolumeClaim => {
                let (store, stream) =
                    cache(watcher(scoped::<Compact<PersistentVolumeClaim>>(client, namespace), managed()));
                stores.claims = Some(store);
                controller.watches_stream(stream, database_of)
            }
        };
    }
    controller
}

/// Watches (and caches) the nodes: a cordoned one wakes the databases whose pods run on it (see
/// `failover::drain`).
fn watch_nodes(
    controller: Controller<DatabaseService>,
    client: &Client,
    stores: &mut PartialStores,
) -> Controller<DatabaseService> {
    let (nodes, node_events) = cache(watcher(Api::<Node>::all(client.clone()), watcher::Config::default()));
    stores.nodes = Some(nodes);
    let pods = stores.pods.clone().expect("the pod cache is wired");
    controller.watches_stream(node_events, move |node: Node| {
        let cordoned = node.spec.as_ref().and_then(|spec| spec.unschedulable).unwrap_or(false);
        let name = node.metadata.name.unwrap_or_default();
        let on_node =
            |pod: &Compact<Pod>| pod.expand().and_then(|pod| pod.spec?.node_name).as_deref() == Some(name.as_str());
        let databases: Vec<_> = if cordoned {
            pods.state_filter(on_node).into_iter().filter_map(|pod| database_of((*pod).clone())).collect()
        } else {
            Vec::new()
        };
        databases
    })
}

/// One pass: the finalizer around the live or cleanup pipeline, cancelled if leadership is lost.
async fn reconcile(database: Arc<DatabaseService>, context: Arc<PassContext>) -> Result<Action, ReconcileError> {
    let namespace = database.namespace().unwrap_or_default();
    let api: Api<DatabaseService> = Api::namespaced(context.shared.client.clone(), &namespace);
    let mut leading = context.leading.clone();
    let pass = finalizer(&api, FINALIZER, database, |event| async {
        match event {
            FinalizerEvent::Apply(database) => reconcile_live(&database, &context).await,
            FinalizerEvent::Cleanup(database) => cleanup(&database, &context).await,
        }
    });
    let result = tokio::select! {
        result = pass => result.map_err(|error| match error {
            kube::runtime::finalizer::Error::ApplyFailed(error)
            | kube::runtime::finalizer::Error::CleanupFailed(error) => error,
            other => ReconcileError::Finalizer(other.to_string()),
        }),
        // Dropping the pass cancels any request in flight: a former leader writes nothing more.
        _ = leading.wait_for(|leading| !*leading) => Err(ReconcileError::StepDown),
    };
    let (outcome, step) = match &result {
        Ok(_) => ("success", "none"),
        Err(error) => ("error", error.step().as_str()),
    };
    context
        .shared
        .metrics
        .reconciliations
        .get_or_create(&ReconcileLabels { result: outcome.into(), step: step.into() })
        .inc();
    result
}

fn error_policy(database: Arc<DatabaseService>, error: &ReconcileError, _context: Arc<PassContext>) -> Action {
    // 409 conflicts are routine (someone wrote in between, or a cache was behind): retry soon.
    if error.is_transient() {
        return Action::requeue(Duration::from_millis(200));
    }
    tracing::warn!(database = %database.name_any(), namespace = ?database.namespace(), step = error.step().as_str(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// One leadership term of the DatabaseService controller: its passes (until `end` is reached;
/// those in flight are cancelled when leadership is lost, before they write again), and the
/// subscription to its DatabaseService cache that the backup controller shares.
pub fn term(
    client: &Client,
    context: &Arc<Context>,
    leading: watch::Receiver<bool>,
    end: &TermEnd,
) -> (impl Future<Output = ()>, DatabaseSubscription) {
    let lease_clock = Arc::new(LeaseClock::default());
    let (controller, stores, databases) = controller(client, context, &lease_clock);
    let pass_context = Arc::new(PassContext {
        shared: context.clone(),
        stores,
        expectations: Expectations::default(),
        leading,
        lease_clock,
    });
    let passes = controller.graceful_shutdown_on(end.clone().reached()).run(reconcile, error_policy, pass_context);
    (passes.for_each(|_| async {}), databases)
}
