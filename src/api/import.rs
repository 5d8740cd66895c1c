//! Import into a new DatabaseService (`spec.bootstrap.import`, issue 24): named databases copied
//! from an existing PostgreSQL reachable from the cluster with `pg_dump` and `pg_restore`, by the
//! first primary's agent, once. The tools are the new major's, which read every older server
//! (pg_dump supports servers back to 9.2): an import is also a way across majors.

use crate::api::roles::PasswordSecret;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most databases one import copies.
pub const MAX_IMPORTED_DATABASES: usize = 16;

/// Where to import from and what.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportSpec {
    /// The server to copy from.
    pub source: ImportSource,
    /// Databases of the source to copy, each into the database of the same name here (created
    /// owned by `spec.username` when missing; `spec.databaseName` is the one the operator made).
    /// Objects are owned by `spec.username`, without the source's owners and grants, unless
    /// `roles` is set.
    #[schemars(length(min = 1, max = 16))]
    pub databases: Vec<String>,
    /// Also create the source's roles first (attributes, memberships, settings; never passwords,
    /// superuser, replication or bypassrls; not the operator's or PostgreSQL's roles), and keep
    /// the objects' owners and grants. Passwords come from `spec.roles[].passwordSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<bool>,
}

impl ImportSpec {
    /// Whether the source's roles come along.
    pub fn with_roles(&self) -> bool {
        self.roles.unwrap_or(false)
    }
}

/// A PostgreSQL server reachable from the cluster.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportSource {
    /// Host name or address (a Service's DNS name, say).
    #[schemars(length(min = 1, max = 253))]
    pub host: String,
    /// Port; 5432 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// Role to connect as; it must be able to read everything in the databases it copies.
    #[schemars(length(min = 1, max = 63))]
    pub username: String,
    /// Its password, from a Secret of this namespace (key "password" by default).
    pub password_secret: PasswordSecret,
    /// libpq `sslmode`: disable, allow, prefer (the default), require, verify-ca or verify-full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub ssl_mode: Option<String>,
}

/// The `sslmode` values libpq knows.
pub const SSL_MODES: [&str; 6] = ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"];

impl ImportSource {
    /// The port to connect to.
    pub fn port_or_default(&self) -> u16 {
        self.port.and_then(|port| u16::try_from(port).ok()).unwrap_or(5432)
    }

    /// The sslmode to connect with.
    pub fn ssl_mode_or_default(&self) -> &str {
        self.ssl_mode.as_deref().unwrap_or("prefer")
    }
}

/// Where an import stands.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ImportPhase {
    /// Copying.
    Running,
    /// Every database was copied (once: never again for this database).
    Completed,
    /// The last attempt failed; the agent tries again after a pause (see `message`).
    Failed,
}

/// One database's copy.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportedDatabase {
    /// The database's name.
    pub name: String,
    /// Milliseconds its dump and restore took.
    pub milliseconds: u64,
}

/// What the first primary's agent did with `spec.bootstrap.import`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportStatus {
    /// Where it stands.
    pub phase: ImportPhase,
    /// Attempts made so far.
    pub attempts: u32,
    /// The databases copied (in the last attempt).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub databases: Vec<ImportedDatabase>,
    /// Why the last attempt failed (the tool's own words; never a password).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// Roles created from the source's (with `roles`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles_created: Option<u32>,
    /// The server version of the source (`server_version`), once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub source_version: Option<String>,
}
