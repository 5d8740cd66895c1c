//! Build (pure): the credentials Secret (the application's), the superuser Secret (the
//! `postgres` role's, kept apart so that an application mounting its credentials never sees
//! it), both created once and never overwritten, and the scripts ConfigMap the PostgreSQL
//! container runs.

use crate::api::database_service::DatabaseService;
use crate::api::names::ChildNames;
use crate::api::pod::{POSTGRES_PORT, REPLICATION_USER, SUPERUSER};
use crate::operator::database::build::metadata;
use k8s_openapi::api::core::v1::{ConfigMap, EnvVar, KeyToPath, Pod, Secret, Volume};
use k8s_openapi::ByteString;
use kube::ResourceExt;
use std::collections::BTreeMap;

const ENTRYPOINT_SCRIPT: &str = include_str!("scripts/entrypoint.sh");
const PRIMARY_INIT_SCRIPT: &str = include_str!("scripts/primary-init.sh");

/// An Opaque Secret of `database` named `name` holding `entries`.
fn opaque_secret(database: &DatabaseService, name: String, entries: Vec<(&str, String)>) -> Secret {
    let data: BTreeMap<String, ByteString> =
        entries.into_iter().map(|(key, value)| (key.to_string(), ByteString(value.into_bytes()))).collect();
    Secret { metadata: metadata(database, name), type_: Some("Opaque".into()), data: Some(data), ..Default::default() }
}

/// Keys of the credentials Secret that an operator before Secret NAME-replication wrote.
pub const REPLICATION_KEYS: [&str; 2] = ["replication-username", "replication-password"];

/// Whether `variable` takes a replication key from a Secret (pods made before issue 22).
pub fn env_references_replication_keys(variable: &EnvVar) -> bool {
    let reference = variable.value_from.as_ref().and_then(|from| from.secret_key_ref.as_ref());
    reference.is_some_and(|reference| REPLICATION_KEYS.contains(&reference.key.as_str()))
}

/// Whether `volume` mounts a replication key of a Secret as a file (pods of issue 22 made
/// before Secret NAME-replication): a listed key missing keeps the volume from being mounted.
pub fn volume_references_replication_keys(volume: &Volume) -> bool {
    let lists = |items: Option<&Vec<KeyToPath>>| {
        items.is_some_and(|items| items.iter().any(|item| REPLICATION_KEYS.contains(&item.key.as_str())))
    };
    let projected = volume.projected.as_ref().and_then(|projected| projected.sources.as_ref());
    volume.secret.as_ref().is_some_and(|secret| lists(secret.items.as_ref()))
        || projected.is_some_and(|sources| {
            sources.iter().any(|source| source.secret.as_ref().is_some_and(|secret| lists(secret.items.as_ref())))
        })
}

/// Whether `pod` references a replication key (the cached pods keep these references, see
/// `caches::Slim for Pod`): it would not start again without it (CreateContainerConfigError).
pub fn pod_references_replication_keys(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    containers.flat_map(|container| container.env.iter().flatten()).any(env_references_replication_keys)
        || spec.volumes.iter().flatten().any(volume_references_replication_keys)
}

/// The credentials Secret (what applications mount); `password` comes from the CSPRNG once. The
/// replication role's password is not in it (see [`replication_secret`]).
pub fn credentials_secret(database: &DatabaseService, password: &str) -> Secret {
    let name = database.name_any();
    let spec = &database.spec;
    let host = format!("{name}.{}.svc", database.namespace().unwrap_or_default());
    // TLS only, the server verified for the Service's name by the CA of ConfigMap NAME-ca
    // (mounted as ~/.postgresql/root.crt, or named by PGSSLROOTCERT or sslrootcert).
    let uri = format!(
        "postgresql://{}:{password}@{host}:{POSTGRES_PORT}/{}?sslmode=verify-full",
        spec.username, spec.database_name
    );
    let entries = vec![
        ("username", spec.username.clone()),
        ("password", password.to_string()),
        ("database", spec.database_name.clone()),
        ("host", host),
        ("port", POSTGRES_PORT.to_string()),
        ("uri", uri),
    ];
    opaque_secret(database, ChildNames::credentials(&name), entries)
}

/// The superuser Secret; `password` comes from the CSPRNG once. The superuser logs in over the
/// network only with `spec.enableSuperuserAccess`.
pub fn superuser_secret(database: &DatabaseService, password: &str) -> Secret {
    let name = database.name_any();
    let host = format!("{name}.{}.svc", database.namespace().unwrap_or_default());
    let uri = format!("postgresql://{SUPERUSER}:{password}@{host}:{POSTGRES_PORT}/postgres?sslmode=verify-full");
    let entries = vec![
        ("username", SUPERUSER.to_string()),
        ("password", password.to_string()),
        ("host", host),
        ("port", POSTGRES_PORT.to_string()),
        ("uri", uri),
    ];
    opaque_secret(database, ChildNames::superuser(&name), entries)
}

/// The replication Secret (`username`, `password`): the replication role streams, clones and
/// backs up the whole server, so applications never get its password. Created once, never
/// overwritten; for a database made before it, with the password its credentials Secret held.
pub fn replication_secret(database: &DatabaseService, password: &str) -> Secret {
    let entries = vec![("username", REPLICATION_USER.to_string()), ("password", password.to_string())];
    opaque_secret(database, ChildNames::replication(&database.name_any()), entries)
}

/// The ConfigMap holding the bootstrap and replication scripts.
pub fn scripts_config_map(database: &DatabaseService) -> ConfigMap {
    ConfigMap {
        metadata: metadata(database, ChildNames::scripts(&database.name_any())),
        data: Some(
            [("entrypoint.sh", ENTRYPOINT_SCRIPT), ("primary-init.sh", PRIMARY_INIT_SCRIPT)]
                .into_iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}
