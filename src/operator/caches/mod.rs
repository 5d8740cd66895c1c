//! The kinds of object the controller reads besides DatabaseServices, and the reflector caches it
//! keeps of them. One list ([`CHILD_KINDS`]) drives the Controller's watches (an exhaustive match in
//! the controller's wiring) and the RBAC test, so a new child kind cannot be wired, or permitted, only halfway.
//!
//! Every watch is scoped by the managed-by label (and by `--watch-namespace` when given), and each
//! cached object is slimmed on arrival: managedFields dropped, ConfigMap data replaced by a
//! fingerprint, pods reduced to what health needs, Secrets watched as metadata only (the operator
//! never keeps a password in memory after creating it), and all but Secrets packed ([`Compact`]).

mod compact;
pub mod diff;
mod packed;

pub use compact::Compact;

use crate::api::database_service::DatabaseService;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerState, ContainerStateWaiting, ContainerStatus, EnvVar, Node, NodeSpec,
    PersistentVolumeClaim, Pod, PodSpec, PodStatus, Secret, Service, Volume,
};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::{Api, Client, Resource};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// How a child kind relates to its DatabaseService.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    /// Carries a controller ownerReference: changes trigger the owner.
    Owned,
    /// Created by another controller (the StatefulSet's): found by the instance label.
    Labelled,
}

/// Every kind the controller watches besides DatabaseServices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildKind {
    /// The StatefulSet NAME.
    StatefulSet,
    /// Services NAME, NAME-replicas, NAME-headless.
    Service,
    /// ConfigMaps NAME-scripts and NAME-ledger.
    ConfigMap,
    /// Secret NAME-credentials (metadata only).
    Secret,
    /// Pods of the StatefulSet.
    Pod,
    /// PVCs data-NAME-N.
    PersistentVolumeClaim,
}

/// The list that feeds both the Controller's watches and the RBAC test.
pub const CHILD_KINDS: [ChildKind; 6] = [
    ChildKind::StatefulSet,
    ChildKind::Service,
    ChildKind::ConfigMap,
    ChildKind::Secret,
    ChildKind::Pod,
    ChildKind::PersistentVolumeClaim,
];

impl ChildKind {
    /// API group ("" for the core group).
    pub fn api_group(self) -> &'static str {
        match self {
            ChildKind::StatefulSet => "apps",
            _ => "",
        }
    }

    /// Resource name (plural) as RBAC spells it.
    pub fn resource(self) -> &'static str {
        match self {
            ChildKind::StatefulSet => "statefulsets",
            ChildKind::Service => "services",
            ChildKind::ConfigMap => "configmaps",
            ChildKind::Secret => "secrets",
            ChildKind::Pod => "pods",
            ChildKind::PersistentVolumeClaim => "persistentvolumeclaims",
        }
    }

    /// How objects of this kind are related to their DatabaseService.
    pub fn relation(self) -> Relation {
        match self {
            ChildKind::Pod | ChildKind::PersistentVolumeClaim => Relation::Labelled,
            _ => Relation::Owned,
        }
    }

    /// Verbs the controller uses on this kind: list and watch for the cache, the rest for writes
    /// (get only on the rare paths that must read past the cache: a create conflict, a ledger append).
    pub fn verbs(self) -> &'static [&'static str] {
        match self {
            // Server-side apply creates with PATCH, which needs create as well.
            ChildKind::Service => &["list", "watch", "create", "patch"],
            // delete: a StatefulSet whose immutable fields changed is re-created, its pods
            // orphaned (operator::database::stateful_set_replacement).
            ChildKind::StatefulSet => &["list", "watch", "create", "patch", "delete"],
            ChildKind::ConfigMap => &["get", "list", "watch", "create", "patch", "update", "delete"],
            ChildKind::Secret => &["get", "list", "watch", "create", "patch", "delete"],
            // get: a primary missing from the cache is read live before its Lease is released.
            ChildKind::Pod => &["get", "list", "watch", "patch", "delete"],
            ChildKind::PersistentVolumeClaim => &["list", "watch", "patch", "delete"],
        }
    }
}

/// The reflector caches every pass reads from.
#[derive(Clone)]
pub struct Stores {
    /// Owned StatefulSets, spec and status as text.
    pub stateful_sets: Store<Compact<StatefulSet>>,
    /// Owned Services, spec and status as text.
    pub services: Store<Compact<Service>>,
    /// Owned ConfigMaps, data replaced by a fingerprint, packed.
    pub config_maps: Store<Compact<ConfigMap>>,
    /// Owned Secrets, metadata only.
    pub secrets: Store<PartialObjectMeta<Secret>>,
    /// Pods by the managed-by label, slimmed, spec and status as text.
    pub pods: Store<Compact<Pod>>,
    /// PVCs by the managed-by label, spec and status as text.
    pub claims: Store<Compact<PersistentVolumeClaim>>,
    /// Nodes, name and `spec.unschedulable` only: a cordon starts a drain (see
    /// `failover::drain`). Empty when the operator may not list nodes.
    pub nodes: Store<Node>,
}

impl Stores {
    /// Waits until every cache has completed its first list: before that, a missing child only
    /// means "not listed yet" and acting on it would recreate what exists.
    pub async fn wait_until_ready(&self) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
        self.stateful_sets.wait_until_ready().await?;
        self.services.wait_until_ready().await?;
        self.config_maps.wait_until_ready().await?;
        self.secrets.wait_until_ready().await?;
        self.pods.wait_until_ready().await?;
        self.claims.wait_until_ready().await
    }
}

/// Stores collected while wiring the watches; complete once every kind is wired.
#[derive(Default)]
pub(super) struct PartialStores {
    pub stateful_sets: Option<Store<Compact<StatefulSet>>>,
    pub services: Option<Store<Compact<Service>>>,
    pub config_maps: Option<Store<Compact<ConfigMap>>>,
    pub secrets: Option<Store<PartialObjectMeta<Secret>>>,
    pub pods: Option<Store<Compact<Pod>>>,
    pub claims: Option<Store<Compact<PersistentVolumeClaim>>>,
    pub nodes: Option<Store<Node>>,
}

impl PartialStores {
    /// The stores, once every kind of [`CHILD_KINDS`] has been wired.
    pub fn complete(self) -> Stores {
        const MISSING: &str = "every kind of CHILD_KINDS is wired";
        Stores {
            stateful_sets: self.stateful_sets.expect(MISSING),
            services: self.services.expect(MISSING),
            config_maps: self.config_maps.expect(MISSING),
            secrets: self.secrets.expect(MISSING),
            pods: self.pods.expect(MISSING),
            claims: self.claims.expect(MISSING),
            nodes: self.nodes.expect("the node cache is wired"),
        }
    }
}

/// Looks up `name` in `namespace`.
pub fn cached<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.get(&ObjectRef::new(name).within(namespace))
}

pub use crate::api::names::FINGERPRINT_KEY;

impl Slim for Node {
    /// A drain needs the name and whether the node is cordoned.
    fn slim(&mut self) {
        let unschedulable = self.spec.as_ref().and_then(|spec| spec.unschedulable);
        *self = Node {
            metadata: kube::api::ObjectMeta {
                name: self.metadata.name.take(),
                resource_version: self.metadata.resource_version.take(),
                ..Default::default()
            },
            spec: Some(NodeSpec { unschedulable, ..Default::default() }),
            status: None,
        };
    }
}

/// Reduces an object to what the controller reads, to keep the caches small at 10 000 objects.
pub trait Slim {
    /// Drops what the controller never reads.
    fn slim(&mut self);
}

fn slim_metadata(metadata: &mut kube::api::ObjectMeta) {
    metadata.managed_fields = None;
    metadata.annotations = None;
}

impl Slim for crate::api::database_service::DatabaseService {
    /// Only the operator's own annotations are read; others (kubectl's last-applied copy of the
    /// whole object, tooling notes) would double what every cached DatabaseService costs.
    fn slim(&mut self) {
        self.metadata.managed_fields = None;
        if let Some(annotations) = self.metadata.annotations.as_mut() {
            annotations.retain(|key, _| key.starts_with(OWN_ANNOTATION_PREFIX));
        }
    }
}

/// Prefix of the annotations the operator reads on a DatabaseService.
pub const OWN_ANNOTATION_PREFIX: &str = "dbservice.dev/";

impl<K: Slim + serde::Serialize + serde::de::DeserializeOwned> Slim for Compact<K> {
    /// Reduced as the typed object is, then packed again.
    fn slim(&mut self) {
        self.reduce(K::slim);
    }
}

impl Slim for StatefulSet {
    fn slim(&mut self) {
        slim_metadata(&mut self.metadata);
    }
}

impl Slim for Service {
    fn slim(&mut self) {
        slim_metadata(&mut self.metadata);
    }
}

impl Slim for PersistentVolumeClaim {
    fn slim(&mut self) {
        slim_metadata(&mut self.metadata);
    }
}

/// Prefix of the certificate annotations renewal is decided by (kept on cached Secrets and ConfigMaps).
const CERTIFICATE_ANNOTATION_PREFIX: &str = "dbservice.dev/certificate-";

/// Drops the metadata nothing reads, keeping the certificate annotations.
fn slim_metadata_keeping_certificates(metadata: &mut kube::api::ObjectMeta) {
    let mut annotations = metadata.annotations.take().unwrap_or_default();
    slim_metadata(metadata);
    annotations.retain(|key, _| key.starts_with(CERTIFICATE_ANNOTATION_PREFIX));
    metadata.annotations = (!annotations.is_empty()).then_some(annotations);
}

impl Slim for PartialObjectMeta<Secret> {
    /// Nothing reads a cached Secret's labels (ownership is its ownerReferences; it is never
    /// compared for drift, only created when missing or renewed by its annotations).
    fn slim(&mut self) {
        slim_metadata_keeping_certificates(&mut self.metadata);
        self.metadata.labels = None;
    }
}

impl Slim for ConfigMap {
    /// The scripts (12 KiB) and the ledger (up to 128 KiB) would dominate the cache: only a
    /// fingerprint of the data and the labels is kept, which is all drift detection needs.
    fn slim(&mut self) {
        slim_metadata_keeping_certificates(&mut self.metadata);
        let labels = self.metadata.labels.take();
        if let Some(data) = self.data.take() {
            self.data = Some(BTreeMap::from([(FINGERPRINT_KEY.to_string(), fingerprint(&data, labels.as_ref()))]));
        }
        self.binary_data = None;
    }
}

impl Slim for Pod {
    /// Health needs the postgres container's image, the conditions and the waiting reasons;
    /// failover needs the agent's report annotation, and a recovering database its recovery one;
    /// the credentials Secret's rewrite, the references to its replication keys.
    fn slim(&mut self) {
        // The instance agent's annotations are the only ones the controller reads.
        const READ: [&str; 2] =
            [crate::api::failover::INSTANCE_REPORT_ANNOTATION, crate::api::recovery::RECOVERY_ANNOTATION];
        let kept: BTreeMap<String, String> = self
            .metadata
            .annotations
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|(key, _)| READ.contains(&key.as_str()))
            .collect();
        slim_metadata(&mut self.metadata);
        self.metadata.annotations = (!kept.is_empty()).then_some(kept);
        self.spec = self.spec.take().map(slim_pod_spec);
        self.status = self.status.take().map(slim_pod_status);
    }
}

/// The containers' names and images, the references to the credentials Secret's replication keys
/// (pods an older operator made: the keys stay while one is left, see `credentials_form`), and
/// the node.
fn slim_pod_spec(spec: PodSpec) -> PodSpec {
    use crate::operator::database::build::credentials::{
        env_references_replication_keys, volume_references_replication_keys,
    };
    let referencing = |env: Option<Vec<EnvVar>>| {
        let kept: Vec<EnvVar> = env.into_iter().flatten().filter(env_references_replication_keys).collect();
        (!kept.is_empty()).then_some(kept)
    };
    let containers = spec
        .containers
        .into_iter()
        .map(|container| Container {
            name: container.name,
            image: container.image,
            env: referencing(container.env),
            ..Default::default()
        })
        .collect();
    let init_containers: Vec<Container> = spec
        .init_containers
        .into_iter()
        .flatten()
        .filter_map(|container| {
            let env = referencing(container.env)?;
            Some(Container { name: container.name, env: Some(env), ..Default::default() })
        })
        .collect();
    let volumes: Vec<Volume> = spec.volumes.into_iter().flatten().filter(volume_references_replication_keys).collect();
    // The node: a primary on a cordoned one is switched over before the drain evicts it.
    PodSpec {
        containers,
        init_containers: (!init_containers.is_empty()).then_some(init_containers),
        volumes: (!volumes.is_empty()).then_some(volumes),
        node_name: spec.node_name,
        ..Default::default()
    }
}

/// The phase, the conditions (a message only for the scheduler's refusal) and each container's
/// readiness, restarts and waiting reason.
fn slim_pod_status(status: PodStatus) -> PodStatus {
    let container_statuses = status.container_statuses.map(|statuses| {
        statuses
            .into_iter()
            .map(|container| ContainerStatus {
                name: container.name,
                ready: container.ready,
                restart_count: container.restart_count,
                state: container.state.map(|state| ContainerState {
                    waiting: state
                        .waiting
                        .map(|waiting| ContainerStateWaiting { reason: waiting.reason, message: None }),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect()
    });
    let conditions = status.conditions.map(|conditions| {
        conditions
            .into_iter()
            .map(|mut condition| {
                // Only the scheduler's reason for not placing the pod is read (a Degraded
                // condition quotes it).
                if !(condition.type_ == "PodScheduled" && condition.status == "False") {
                    condition.message = None;
                }
                condition
            })
            .collect()
    });
    PodStatus { conditions, container_statuses, phase: status.phase, ..Default::default() }
}

/// A stable fingerprint of ConfigMap data and labels (the same in the cache and in the desired object).
pub fn fingerprint(data: &BTreeMap<String, String>, labels: Option<&BTreeMap<String, String>>) -> String {
    // SipHash with fixed keys: stable within one build, which is all a comparison in one process needs.
    #[allow(deprecated)]
    let mut hasher = std::hash::SipHasher::new();
    data.hash(&mut hasher);
    labels.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// An Api for `K` in the watched namespace, or in all namespaces.
pub fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// The DatabaseService cache of a term and its stream of changes, shared with the backup controller.
pub struct DatabaseSubscription {
    /// Every DatabaseService this operator manages.
    pub store: Store<DatabaseService>,
    /// Each DatabaseService as the cache applies it.
    pub events: reflector::ReflectHandle<DatabaseService>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_map_data_is_reduced_to_a_fingerprint_that_tells_changes_apart() {
        let data = |text: &str| BTreeMap::from([("entrypoint.sh".to_string(), text.to_string())]);
        let mut first = ConfigMap { data: Some(data("a".repeat(12_000).as_str())), ..Default::default() };
        let mut same = first.clone();
        let mut other = ConfigMap { data: Some(data("b")), ..Default::default() };
        for config_map in [&mut first, &mut same, &mut other] {
            config_map.slim();
        }
        assert_eq!(first.data, same.data);
        assert_ne!(first.data, other.data);
        assert!(serde_json::to_string(&first).unwrap().len() < 200);
    }

    #[test]
    fn a_changed_config_map_label_changes_the_fingerprint_and_the_label_map_is_dropped() {
        let config_map = |instance: &str| ConfigMap {
            metadata: kube::api::ObjectMeta {
                labels: Some(BTreeMap::from([("app.kubernetes.io/instance".to_string(), instance.to_string())])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([("a".to_string(), "b".to_string())])),
            ..Default::default()
        };
        let (mut ours, mut same, mut relabelled) = (config_map("db"), config_map("db"), config_map("other"));
        for config_map in [&mut ours, &mut same, &mut relabelled] {
            config_map.slim();
        }
        assert_eq!(ours.metadata.labels, None);
        assert_eq!(ours.data, same.data);
        assert_ne!(ours.data, relabelled.data);
    }

    #[test]
    fn databases_keep_only_the_operators_annotations() {
        let mut database: crate::api::database_service::DatabaseService = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
            "metadata": {"name": "db", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{\"a\": 1}",
                "dbservice.dev/switchover-to": "db-1"}},
            "spec": {"version": "16.4", "storageSize": "1Gi", "databaseName": "app", "username": "app_user"}
        }))
        .unwrap();
        database.slim();
        let annotations = database.metadata.annotations.unwrap();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["dbservice.dev/switchover-to"]);
    }

    #[test]
    fn pods_keep_what_health_reads() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-0", "labels": {"a": "b"}, "managedFields": [{"manager": "x"}]},
            "spec": {"containers": [{"name": "postgres", "image": "postgres:16.4", "env": [{"name": "X", "value": "y"}]}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "message": "long text"},
                       {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes are available"}],
                       "containerStatuses": [{"name": "postgres", "ready": false, "restartCount": 3, "image": "i", "imageID": "",
                                              "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}}]}
        }))
        .unwrap();
        let before = crate::operator::database::pod_health::pod_health(&pod);
        let mut slimmed = pod.clone();
        slimmed.slim();
        assert_eq!(crate::operator::database::pod_health::pod_health(&slimmed), before);
        assert!(slimmed.metadata.managed_fields.is_none());
        assert!(slimmed.spec.unwrap().containers[0].env.is_none());
    }

    #[test]
    fn pods_keep_the_agents_report_and_recovery_annotations_only() {
        let mut pod = Pod::default();
        pod.metadata.annotations = Some(
            [
                (crate::api::failover::INSTANCE_REPORT_ANNOTATION, "{}"),
                (crate::api::recovery::RECOVERY_ANNOTATION, "{\"phase\":\"Restoring\"}"),
                ("kubectl.kubernetes.io/restartedAt", "now"),
            ]
            .into_iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect(),
        );
        pod.slim();
        let annotations = pod.metadata.annotations.unwrap();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["dbservice.dev/instance", "dbservice.dev/recovery"]);
    }
}
