//! Build (pure): the desired child objects from the DatabaseService and what decide chose (which
//! version runs, how many instances, the restart stamp). [`Desired`] holds every child; `apply`
//! destructures it without `..`, so a new child kind cannot be built and then forgotten.
//!
//! Split by part, as a pod is: [`stateful_set`] assembles [`container`]s, [`volumes`],
//! [`probes`], [`security`] and [`environment`]; [`archiving`] and [`recovery`] decorate the pod;
//! [`services`], [`credentials`], the certificates' [`tls`] objects and the agents'
//! [`access`](crate::operator::database::access) are the other children.

pub mod archiving;
pub mod container;
pub mod credentials;
pub mod disruption;
pub mod environment;
pub mod major_upgrade;
pub mod network_policy;
pub mod placement;
pub mod pooler;
pub mod probes;
pub mod recovery;
pub mod security;
pub mod services;
pub mod stateful_set;
pub mod tls;
pub mod volumes;

use crate::api::database_service::DatabaseService;
use crate::api::names::{labels, owner_reference, ChildNames};
pub use crate::operator::database::access::{instance_access, InstanceAccess};
pub use crate::operator::database::build::credentials::{
    credentials_secret, replication_secret, scripts_config_map, superuser_secret,
};
pub use crate::operator::database::build::environment::{plain_env, secret_env};
pub use crate::operator::database::build::security::restricted_security_context;
pub use crate::operator::database::build::services::services;
pub use crate::operator::database::build::stateful_set::stateful_set;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// What the reconciler decided before building.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadInputs {
    /// Image the StatefulSet runs (the spec's, or the last stable one during a rollback).
    pub image: String,
    /// Instances to run (fewer than the spec's while degraded).
    pub replicas: i32,
    /// Restart stamp for the pod template, when the controller restarted the pods.
    pub restarted_at: Option<String>,
    /// Size of the volumeClaimTemplate: the one the StatefulSet was created with (it is immutable).
    pub claim_template_size: String,
    /// The operator's own image, when known: an init container copies the binary from it into each
    /// pod, the instance agent supervises PostgreSQL (failover), and `spec.backup` archives WAL.
    /// When None, roles are fixed by ordinal (pod 0 is the primary) and nothing is archived.
    pub instance_image: Option<String>,
}

/// Metadata of a child: its name and namespace, our labels, owned by the DatabaseService.
pub fn metadata(database: &DatabaseService, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: database.namespace(),
        labels: Some(labels(&database.name_any())),
        owner_references: Some(vec![owner_reference(database)]),
        ..Default::default()
    }
}

/// DNS name of the primary through the headless Service.
pub fn primary_host(database: &DatabaseService) -> String {
    let name = database.name_any();
    format!("{name}-0.{}.{}.svc", ChildNames::headless_service(&name), database.namespace().unwrap_or_default())
}

/// A fresh password from the OS CSPRNG: 32 bytes (256 bits) encoded URL-safe without padding.
pub fn generate_password() -> String {
    use base64::Engine;
    use rand::TryRngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.try_fill_bytes(&mut bytes).expect("the OS random number generator is available");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Every child object one pass wants to exist.
#[derive(Clone, Debug)]
pub struct Desired {
    /// The credentials Secret, only when it is to be created (it is never overwritten).
    pub credentials: Option<Secret>,
    /// The superuser Secret, only when it is to be created (it is never overwritten).
    pub superuser: Option<Secret>,
    /// The replication Secret, only when it is to be created (it is never overwritten).
    pub replication: Option<Secret>,
    /// ConfigMap NAME-scripts.
    pub scripts: ConfigMap,
    /// Services NAME, NAME-replicas and NAME-headless.
    pub services: Vec<Service>,
    /// StatefulSet NAME.
    pub stateful_set: StatefulSet,
    /// The instance agents' account, Role, binding and Lease (only with the agent).
    pub instance_access: Option<InstanceAccess>,
    /// NetworkPolicy NAME (only with `--database-network-policies`).
    pub network_policy: Option<NetworkPolicy>,
    /// PodDisruptionBudgets NAME-primary and NAME-standbys.
    pub disruption_budgets: Vec<k8s_openapi::api::policy::v1::PodDisruptionBudget>,
}

/// The passwords of the Secrets this pass creates (the one impure input of building): each one
/// given is a Secret to create.
#[derive(Clone, Debug, Default)]
pub struct NewPasswords {
    /// The application role's (Secret NAME-credentials).
    pub application: Option<String>,
    /// The superuser's (Secret NAME-superuser).
    pub superuser: Option<String>,
    /// The replication role's (Secret NAME-replication).
    pub replication: Option<String>,
}

/// Builds every child of `database` for the decided workload, the Secrets `passwords` names,
/// and the NetworkPolicy when `clients` is given.
pub fn desired(
    database: &DatabaseService,
    inputs: &WorkloadInputs,
    passwords: NewPasswords,
    clients: Option<&BTreeMap<String, String>>,
) -> Desired {
    Desired {
        credentials: passwords.application.map(|password| credentials_secret(database, &password)),
        superuser: passwords.superuser.map(|password| superuser_secret(database, &password)),
        replication: passwords.replication.map(|password| replication_secret(database, &password)),
        scripts: scripts_config_map(database),
        services: services(database),
        stateful_set: stateful_set(database, inputs),
        instance_access: inputs.instance_image.as_ref().map(|_| instance_access(database)),
        network_policy: clients.map(|clients| network_policy::network_policy(database, clients)),
        disruption_budgets: disruption::disruption_budgets(database, inputs.replicas),
    }
}

/// The PostgreSQL image of a live StatefulSet's pod template.
pub fn postgres_image(stateful_set: &StatefulSet) -> Option<String> {
    let template = stateful_set.spec.template.spec.as_ref()?;
    template.containers.iter().find(|container| container.name == "postgres")?.image.clone()
}

/// Size of the volumeClaimTemplate of a live StatefulSet (immutable once created).
pub fn claim_template_size(stateful_set: &StatefulSet) -> Option<String> {
    stateful_set
        .spec
        .volume_claim_templates
        .as_ref()?
        .first()?
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .map(|quantity| quantity.0.clone())
}

/// A DatabaseService `orders` in namespace `shop` (uid `u-1`) with the required fields and
/// `extra` merged into its spec, for the builders' tests.
#[cfg(test)]
pub fn test_database(extra: serde_json::Value) -> DatabaseService {
    let mut spec =
        serde_json::json!({"version": "16", "storageSize": "1Gi", "databaseName": "app", "username": "app_user"});
    spec.as_object_mut().expect("a spec object").extend(extra.as_object().expect("an object").clone());
    serde_json::from_value(serde_json::json!({
        "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"}, "spec": spec
    }))
    .expect("a valid DatabaseService")
}
