//! Names, labels and owner references of the children of a DatabaseService: the vocabulary every
//! other controller module shares (and so the one module that imports none of them).

use crate::api::database_service::DatabaseService;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;

/// Label carrying the instance name on every child.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Label saying who manages an object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on everything the operator creates.
pub const MANAGED_BY: &str = "dbservice-operator";
/// Label selector of every child of every DatabaseService: the scope of every watch.
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=dbservice-operator";
/// Label the operator puts on pods: [`PRIMARY_ROLE`], [`STANDBY_ROLE`] or [`NO_ROLE`].
pub const ROLE_LABEL: &str = "dbservice.dev/role";
/// [`ROLE_LABEL`] of the current primary (selected by Service `<name>`).
pub const PRIMARY_ROLE: &str = "primary";
/// [`ROLE_LABEL`] of a standby (selected by the read-only Service).
pub const STANDBY_ROLE: &str = "standby";
/// [`ROLE_LABEL`] of a pod in neither Service: a former primary not yet stopped or rejoined.
pub const NO_ROLE: &str = "none";
/// Name of the data volume claim template (PVCs are named data-NAME-N).
pub const DATA_VOLUME: &str = "data";

/// Names of every child object of one DatabaseService.
pub struct ChildNames;

impl ChildNames {
    /// Credentials Secret.
    pub fn credentials(name: &str) -> String {
        format!("{name}-credentials")
    }
    /// Superuser Secret (the `postgres` role's password; never mounted by applications).
    pub fn superuser(name: &str) -> String {
        format!("{name}-superuser")
    }
    /// The database's own certificate authority: Secret (ca.crt, ca.key) kept by the operator,
    /// and ConfigMap (ca.crt) published for the applications to mount.
    pub fn certificate_authority(name: &str) -> String {
        format!("{name}-ca")
    }
    /// Server certificate Secret (kubernetes.io/tls: tls.crt, tls.key, ca.crt) the operator issues.
    pub fn server_certificate(name: &str) -> String {
        format!("{name}-tls")
    }
    /// Replication Secret (the replication role's password; never the application's business).
    pub fn replication(name: &str) -> String {
        format!("{name}-replication")
    }
    /// Scripts ConfigMap.
    pub fn scripts(name: &str) -> String {
        format!("{name}-scripts")
    }
    /// Ledger ConfigMap.
    pub fn ledger(name: &str) -> String {
        format!("{name}-ledger")
    }
    /// Standby Service.
    pub fn replicas_service(name: &str) -> String {
        format!("{name}-replicas")
    }
    /// Headless Service giving pods stable DNS names.
    pub fn headless_service(name: &str) -> String {
        format!("{name}-headless")
    }
    /// PodDisruptionBudget of the primary's pod.
    pub fn primary_disruption_budget(name: &str) -> String {
        format!("{name}-primary")
    }
    /// PodDisruptionBudget of the standbys' pods.
    pub fn standby_disruption_budget(name: &str) -> String {
        format!("{name}-standbys")
    }
    /// ServiceAccount, Role and RoleBinding of the instance agents.
    pub fn instance_account(name: &str) -> String {
        format!("{name}-instance")
    }
    /// The pooler's Deployment, read-write Service, ConfigMap, Secret, ServiceAccount and
    /// PodDisruptionBudget.
    pub fn pooler(name: &str) -> String {
        format!("{name}-pooler")
    }
    /// The pooler's read-only Service.
    pub fn pooler_replicas_service(name: &str) -> String {
        format!("{name}-pooler-replicas")
    }
    /// Data PVC of instance `ordinal`.
    pub fn claim(name: &str, ordinal: i32) -> String {
        format!("{DATA_VOLUME}-{name}-{ordinal}")
    }
}

/// Labels shared by every child; also the pod selector.
pub fn selector_labels(name: &str) -> BTreeMap<String, String> {
    [("app.kubernetes.io/name".to_string(), "postgresql".to_string()), (INSTANCE_LABEL.to_string(), name.to_string())]
        .into()
}

/// Selector labels plus the managed-by label.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(name);
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    labels
}

/// Label selector string matching every child of `name`.
pub fn label_selector(name: &str) -> String {
    format!("{INSTANCE_LABEL}={name},{MANAGED_SELECTOR}")
}

/// Key under which a cached ConfigMap keeps the fingerprint of its data.
pub const FINGERPRINT_KEY: &str = "dbservice.dev/fingerprint";

/// Whether `object` carries the labels the operator puts on the children of `name`.
pub fn is_labelled_child_of<K: ResourceExt>(object: &K, name: &str) -> bool {
    let labels = object.labels();
    labels.get(INSTANCE_LABEL).map(String::as_str) == Some(name)
        && labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
}

/// Owner reference making the DatabaseService the controller of a child.
pub fn owner_reference(database: &DatabaseService) -> OwnerReference {
    database.controller_owner_ref(&()).expect("a stored DatabaseService has a name and uid")
}

/// Whether `object` names the DatabaseService with `uid` among its owners.
pub fn is_owned_by<K: ResourceExt>(object: &K, uid: &str) -> bool {
    !uid.is_empty() && object.owner_references().iter().any(|reference| reference.uid == uid)
}

/// The StatefulSet ordinal of instance (pod) `name`: `db-2` is 2.
pub fn instance_ordinal(name: &str) -> Option<i32> {
    name.rsplit_once('-')?.1.parse().ok().filter(|ordinal: &i32| *ordinal >= 0)
}

/// The resource kind and name of an object, for events and the ledger.
pub fn describe<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!("{}/{}", K::kind(&()), object.meta().name.clone().unwrap_or_default())
}

/// Name of the primary Lease of database `name`.
pub fn primary_lease_name(name: &str) -> String {
    format!("{name}-primary")
}
