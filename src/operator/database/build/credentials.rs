//! Build (pure): the credentials Secret (the application's), the superuser Secret (the
//! `postgres` role's, kept apart so that an application mounting its credentials never sees
//! it), both created once and never overwritten, and the scripts ConfigMap the PostgreSQL
//! container runs.

use crate::api::database_service::DatabaseService;
use crate::api::names::ChildNames;
use crate::api::pod::{POSTGRES_PORT, REPLICATION_USER, SUPERUSER};
use crate::operator::database::build::metadata;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
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
