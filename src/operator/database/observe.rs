//! Observe: everything a pass knows about the children of one DatabaseService, read from the
//! reflector caches (no GET or LIST), plus the StorageClasses of claims that must grow (a GET, only
//! on that rare path).

use crate::api::database_service::DatabaseService;
use crate::api::names::ChildNames;
use crate::operator::caches::Compact;
use crate::operator::caches::{cached, Stores};
use crate::quantity::parse_bytes;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The observed children of one DatabaseService.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Pooler pods left while the database hibernates (0 otherwise: they are not cached).
    pub pooler_pods: usize,
    /// StatefulSet NAME.
    pub stateful_set: Option<Arc<Compact<StatefulSet>>>,
    /// Services by name.
    pub services: BTreeMap<String, Arc<Compact<Service>>>,
    /// ConfigMap NAME-scripts (data as a fingerprint).
    pub scripts: Option<Arc<Compact<ConfigMap>>>,
    /// ConfigMap NAME-ledger (data as a fingerprint).
    pub ledger: Option<Arc<Compact<ConfigMap>>>,
    /// Secret NAME-credentials, metadata only; only one carrying the managed-by label is seen.
    pub credentials: Option<Arc<PartialObjectMeta<Secret>>>,
    /// Secret NAME-superuser, metadata only, like the credentials.
    pub superuser: Option<Arc<PartialObjectMeta<Secret>>>,
    /// Secret NAME-replication, metadata only, like the credentials.
    pub replication: Option<Arc<PartialObjectMeta<Secret>>>,
    /// Secret NAME-ca (the CA), metadata only.
    pub certificate_authority: Option<Arc<PartialObjectMeta<Secret>>>,
    /// Secret NAME-tls (the server certificate), metadata only.
    pub server_certificate: Option<Arc<PartialObjectMeta<Secret>>>,
    /// ConfigMap NAME-ca (the CA published).
    pub published_authority: Option<Arc<Compact<ConfigMap>>>,
    /// Pods labelled as this instance's, by name.
    pub pods: Vec<Arc<Pod>>,
    /// PVCs labelled as this instance's, by name.
    pub claims: Vec<Arc<PersistentVolumeClaim>>,
    /// allowVolumeExpansion of the StorageClasses of claims smaller than the spec asks.
    pub expandable_classes: BTreeMap<String, bool>,
    /// The primary Lease, read only while a failover or switchover needs it.
    pub primary_lease: Option<crate::lease::LeaseRecord>,
    /// The version of the primary Lease read, when this process has seen it unchanged and held
    /// for a whole Lease duration (see `failover::lease_clock`): its holder has fenced itself.
    pub primary_lease_lapsed: Option<String>,
    /// The nodes of these pods that are cordoned (`spec.unschedulable`).
    pub cordoned_nodes: std::collections::BTreeSet<String>,
    /// The backup before a major upgrade, read only while the upgrade waits for it.
    pub pre_upgrade_backup: Option<crate::operator::database::major_upgrade::BackupObservation>,
}

/// Reads the children of `database` from the caches.
pub fn from_caches(database: &DatabaseService, stores: &Stores) -> Observed {
    let namespace = database.namespace().unwrap_or_default();
    let name = database.name_any();
    let services = [name.clone(), ChildNames::replicas_service(&name), ChildNames::headless_service(&name)]
        .into_iter()
        .filter_map(|service| cached(&stores.services, &namespace, &service).map(|live| (service, live)))
        .collect();
    let pods = expanded_children(&stores.pods, &namespace, &name);
    let claims = expanded_children(&stores.claims, &namespace, &name);
    let cordoned_nodes = pods
        .iter()
        .filter_map(|pod| pod.spec.as_ref()?.node_name.clone())
        .filter(|node| {
            let cached = stores.nodes.get(&kube::runtime::reflector::ObjectRef::new(node));
            cached.and_then(|node| node.spec.as_ref()?.unschedulable).unwrap_or(false)
        })
        .collect();
    Observed {
        pooler_pods: 0,
        stateful_set: cached(&stores.stateful_sets, &namespace, &name),
        services,
        scripts: cached(&stores.config_maps, &namespace, &ChildNames::scripts(&name)),
        ledger: cached(&stores.config_maps, &namespace, &ChildNames::ledger(&name)),
        credentials: cached(&stores.secrets, &namespace, &ChildNames::credentials(&name)),
        superuser: cached(&stores.secrets, &namespace, &ChildNames::superuser(&name)),
        replication: cached(&stores.secrets, &namespace, &ChildNames::replication(&name)),
        certificate_authority: cached(&stores.secrets, &namespace, &ChildNames::certificate_authority(&name)),
        server_certificate: cached(&stores.secrets, &namespace, &ChildNames::server_certificate(&name)),
        published_authority: cached(&stores.config_maps, &namespace, &ChildNames::certificate_authority(&name)),
        pods,
        claims,
        expandable_classes: BTreeMap::new(),
        primary_lease: None,
        primary_lease_lapsed: None,
        cordoned_nodes,
        pre_upgrade_backup: None,
    }
}

/// The cached children of kind `K` labelled as belonging to database `name`, typed again (the
/// caches keep them as text), sorted by name.
fn expanded_children<K>(store: &Store<Compact<K>>, namespace: &str, name: &str) -> Vec<Arc<K>>
where
    K: k8s_openapi::Resource + Serialize + DeserializeOwned + Clone,
{
    // Every cached child carries the managed-by label (the watches select by it).
    let mut children = store
        .state_filter(|child| child.metadata.namespace.as_deref() == Some(namespace) && child.database() == Some(name));
    children.sort_by(|left, right| left.metadata.name.cmp(&right.metadata.name));
    children.iter().filter_map(|child| child.expand().map(Arc::new)).collect()
}

/// Adds the instance pods the caches miss because their managed-by label was removed (the watch
/// selects by it; the StatefulSet's selector does not include it, so the pod keeps running): a
/// GET by name for each expected instance not cached, only while one is missing. Without this a
/// primary whose label a person removed would look gone, and be failed over while it runs. The
/// pass then puts the label back (`decide_pods`).
pub async fn unlabelled_pods(
    database: &DatabaseService,
    observed: &mut Observed,
    client: &Client,
) -> Result<(), kube::Error> {
    // Only once failover is engaged (a primary was seen healthy): before, a missing pod is one
    // still being created, and a GET per pass of every new database would cost the apiserver.
    let engaged = database.status.as_ref().is_some_and(|status| status.failover.timeline.is_some());
    if observed.stateful_set.is_none() || !engaged {
        return Ok(());
    }
    let name = database.name_any();
    // The StatefulSet never shrinks past the primary, whatever the spec says.
    let primary = database.status.as_ref().and_then(|status| status.failover.current_primary.as_deref());
    let primary_ordinal = primary.and_then(|primary| primary.rsplit('-').next()?.parse::<i32>().ok());
    let expected = database.spec.replicas_or_default().max(primary_ordinal.map_or(0, |ordinal| ordinal + 1));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &database.namespace().unwrap_or_default());
    let mut found = Vec::new();
    for ordinal in 0..expected {
        let pod_name = format!("{name}-{ordinal}");
        if observed.pods.iter().any(|pod| pod.name_any() == pod_name) {
            continue;
        }
        let Some(pod) = pods.get_opt(&pod_name).await? else { continue };
        let owned = pod.owner_references().iter().any(|owner| owner.kind == "StatefulSet" && owner.name == name);
        let labelled = pod.labels().get(crate::api::names::INSTANCE_LABEL) == Some(&name);
        if owned && labelled {
            found.push(Arc::new(pod));
        }
    }
    if !found.is_empty() {
        observed.pods.extend(found);
        observed.pods.sort_by(|left, right| left.metadata.name.cmp(&right.metadata.name));
    }
    Ok(())
}

/// Fills [`Observed::primary_lease`] when the failover step needs it or `clock` says it lapsed (a
/// GET, never in a steady pass), and [`Observed::primary_lease_lapsed`] when the version read is
/// the one that lapsed.
/// A hibernating database with a pooler: its pooler pods still there (they drain for a while
/// after the Deployment went to 0), which the caches do not hold. One LIST, only then.
pub async fn pooler_pods_left(
    database: &DatabaseService,
    observed: &mut Observed,
    client: &Client,
) -> Result<(), kube::Error> {
    if !database.spec.is_hibernated() || database.spec.pooler.is_none() {
        return Ok(());
    }
    let namespace = database.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let selector = crate::operator::database::build::pooler::pooler_pod_labels(&database.name_any())
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",");
    let listed = pods.list_metadata(&kube::api::ListParams::default().labels(&selector).limit(100)).await?;
    observed.pooler_pods = listed.items.len();
    Ok(())
}

pub async fn primary_lease(
    database: &DatabaseService,
    observed: &mut Observed,
    client: &Client,
    clock: &crate::operator::database::failover::lease_clock::LeaseClock,
) -> Result<(), kube::Error> {
    let namespace = database.namespace().unwrap_or_default();
    let name = crate::api::names::primary_lease_name(&database.name_any());
    let key = (namespace.clone(), name.clone());
    let health: Vec<_> =
        observed.pods.iter().map(|pod| crate::operator::database::pod_health::pod_health(pod)).collect();
    let lapsed = clock.lapsed(&key, std::time::Instant::now());
    if lapsed.is_none() && !crate::operator::database::failover::pass::needs_lease(database, &observed.pods, &health) {
        return Ok(());
    }
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), &namespace);
    let Some(lease) = leases.get_opt(&name).await? else { return Ok(()) };
    observed.primary_lease = Some(crate::lease::lease_record(&lease));
    observed.primary_lease_lapsed = lapsed.filter(|version| lease.metadata.resource_version.as_ref() == Some(version));
    Ok(())
}

/// Requested storage of a claim.
pub fn claim_request(claim: &PersistentVolumeClaim) -> String {
    claim
        .spec
        .as_ref()
        .and_then(|spec| spec.resources.as_ref()?.requests.as_ref()?.get("storage").map(|quantity| quantity.0.clone()))
        .unwrap_or_default()
}

/// StorageClass name of a claim ("" for the default class).
pub fn claim_class(claim: &PersistentVolumeClaim) -> String {
    claim.spec.as_ref().and_then(|spec| spec.storage_class_name.clone()).unwrap_or_default()
}

/// Fills [`Observed::expandable_classes`] for the claims that are smaller than `wanted` (the
/// spec's size or what growth asks for), or for every claim with `every_claim` (spec.storageGrowth,
/// so that a class that cannot grow is told before a volume fills): a GET per class, only then.
pub async fn storage_classes(
    wanted: &str,
    every_claim: bool,
    observed: &mut Observed,
    client: &Client,
) -> Result<(), kube::Error> {
    let wanted = parse_bytes(wanted).unwrap_or(0);
    let classes: Api<StorageClass> = Api::all(client.clone());
    for claim in &observed.claims {
        if !every_claim && parse_bytes(&claim_request(claim)).unwrap_or(0) >= wanted {
            continue;
        }
        let class = claim_class(claim);
        if observed.expandable_classes.contains_key(&class) {
            continue;
        }
        if class.is_empty() {
            // No class (no default class when it was made, or a static volume): nothing to ask,
            // and it cannot be expanded.
            observed.expandable_classes.insert(class, false);
            continue;
        }
        let expandable = classes.get_opt(&class).await?.and_then(|class| class.allow_volume_expansion).unwrap_or(false);
        observed.expandable_classes.insert(class, expandable);
    }
    Ok(())
}

/// Fills [`Observed::pre_upgrade_backup`] while a major upgrade waits for its backup (a GET, only
/// in that phase).
pub async fn pre_upgrade_backup(
    database: &DatabaseService,
    observed: &mut Observed,
    client: &Client,
) -> Result<(), kube::Error> {
    use crate::api::database_service_backup::DatabaseServiceBackup;
    use crate::api::major_upgrade::MajorUpgradePhase;
    let Some(upgrade) = database.status.as_ref().and_then(|status| status.major_upgrade.as_ref()) else {
        return Ok(());
    };
    if upgrade.phase != MajorUpgradePhase::BackingUp {
        return Ok(());
    }
    let Some(major) = crate::api::version::major_version(&upgrade.to_version) else { return Ok(()) };
    let name = crate::api::major_upgrade::backup_name(&database.name_any(), major);
    let backups: Api<DatabaseServiceBackup> =
        Api::namespaced(client.clone(), &database.namespace().unwrap_or_default());
    observed.pre_upgrade_backup = backups.get_opt(&name).await?.map(|backup| {
        let status = backup.status.unwrap_or_default();
        crate::operator::database::major_upgrade::BackupObservation { phase: status.phase, message: status.message }
    });
    Ok(())
}
