//! `spec.roles` and `spec.databases` (issue 23): roles and databases declared beside the
//! application's own, kept by the instance agent on the primary (created, altered back when they
//! drift, removed only when `ensure: absent` says so) and reported in the status.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most entries of `spec.roles`.
pub const MAX_ROLES: usize = 32;
/// Most entries of `spec.databases`.
pub const MAX_DATABASES: usize = 16;
/// Most extensions of one database.
pub const MAX_EXTENSIONS: usize = 32;
/// Most memberships of one role.
pub const MAX_MEMBERSHIPS: usize = 16;
/// Key of a password Secret when `passwordSecret.key` is not set.
pub const DEFAULT_PASSWORD_KEY: &str = "password";

/// Whether a declared object should exist.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Ensure {
    /// Created when missing, put back as declared when it drifted.
    #[default]
    Present,
    /// Removed when it exists: a role's objects go to the application's role first (no data is
    /// dropped with a role); a database is dropped with everything in it.
    Absent,
}

/// A Secret key holding a password, in the DatabaseService's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PasswordSecret {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Its key; "password" when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub key: Option<String>,
}

impl PasswordSecret {
    /// The key, with the default.
    pub fn key_or_default(&self) -> &str {
        self.key.as_deref().unwrap_or(DEFAULT_PASSWORD_KEY)
    }
}

/// One entry of `spec.roles`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleSpec {
    /// The role's name: lowercase letters, digits and `_`, not starting with `pg_`.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Present (default) or absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ensure: Option<Ensure>,
    /// May log in; true when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login: Option<bool>,
    /// May create databases; false when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_database: Option<bool>,
    /// Most concurrent connections; -1 (no limit) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -1))]
    pub connection_limit: Option<i32>,
    /// Roles it is a member of (declared roles, the application's role, or predefined roles
    /// such as `pg_read_all_data`); memberships not listed are revoked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub in_roles: Vec<String>,
    /// Its password; when absent the role's password is not managed (left as it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<PasswordSecret>,
}

impl RoleSpec {
    /// Whether the role should exist.
    pub fn present(&self) -> bool {
        self.ensure.unwrap_or_default() == Ensure::Present
    }
}

/// An extension of a declared database.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionSpec {
    /// The extension's name, one of the image's `pg_available_extensions`.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Present (default) or absent (dropped without CASCADE: refused by the server while objects
    /// depend on it, and reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ensure: Option<Ensure>,
}

impl ExtensionSpec {
    /// Whether the extension should exist.
    pub fn present(&self) -> bool {
        self.ensure.unwrap_or_default() == Ensure::Present
    }
}

/// One entry of `spec.databases`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseSpec {
    /// The database's name: lowercase letters, digits and `_`.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Present (default) or absent: `absent` drops the database and all its data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ensure: Option<Ensure>,
    /// Its owner: a declared role or the application's role (`spec.username`, the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub owner: Option<String>,
    /// Extensions made in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub extensions: Vec<ExtensionSpec>,
}

impl DatabaseSpec {
    /// Whether the database should exist.
    pub fn present(&self) -> bool {
        self.ensure.unwrap_or_default() == Ensure::Present
    }
}

/// What the primary's agent found for one declared object.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ObjectState {
    /// Exists as declared.
    Present,
    /// Does not exist, as declared.
    Absent,
    /// Could not be made as declared (see the message).
    Failed,
}

/// The state of one declared role or database.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStatus {
    /// The role's or database's name.
    pub name: String,
    /// Its state.
    pub state: ObjectState,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What the primary's agent last did with `spec.roles` and `spec.databases`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeclaredObjectsStatus {
    /// One entry per declared role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub roles: Vec<ObjectStatus>,
    /// One entry per declared database.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub databases: Vec<ObjectStatus>,
    /// Fingerprint of the declarations this is the outcome of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declarations: Option<String>,
}

/// The declarations the agent keeps: `spec.roles`, `spec.databases` and the application's role
/// (the default owner, and who takes the objects of a removed role).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Declarations {
    /// `spec.roles`.
    pub roles: Vec<RoleSpec>,
    /// `spec.databases`.
    pub databases: Vec<DatabaseSpec>,
    /// `spec.username`.
    pub application_user: String,
    /// With `spec.pooler`: the databases whose clients the pooler authenticates, each of which
    /// gets the `auth_query` function (see `crate::api::pooler`).
    pub pooled_databases: Vec<String>,
}

impl Declarations {
    /// Nothing declared.
    pub fn is_empty(&self) -> bool {
        self.roles.is_empty() && self.databases.is_empty()
    }

    /// A short fingerprint (FNV-1a of the declarations' JSON), to tell one set from the next.
    pub fn fingerprint(&self) -> String {
        let text =
            serde_json::to_string(&(&self.roles, &self.databases, &self.application_user, &self.pooled_databases))
                .expect("declarations serialize");
        format!("{:016x}", crate::api::postgresql::fnv1a(text.as_bytes()))
    }

    /// The distinct password Secrets the roles name (what the agents may read).
    pub fn password_secrets(roles: &[RoleSpec]) -> Vec<String> {
        let mut names: Vec<String> =
            roles.iter().filter_map(|role| role.password_secret.as_ref().map(|secret| secret.name.clone())).collect();
        names.sort();
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_make_a_present_login_role_and_a_present_database() {
        let role: RoleSpec = serde_json::from_value(serde_json::json!({"name": "reporting"})).unwrap();
        assert!(role.present());
        assert_eq!(role.login, None);
        let database: DatabaseSpec =
            serde_json::from_value(serde_json::json!({"name": "analytics", "ensure": "absent"})).unwrap();
        assert!(!database.present());
        assert_eq!(PasswordSecret { name: "s".into(), key: None }.key_or_default(), "password");
    }

    #[test]
    fn password_secrets_are_listed_once_and_the_fingerprint_follows_the_declarations() {
        let secret = |name: &str| Some(PasswordSecret { name: name.into(), key: None });
        let roles = vec![
            RoleSpec { name: "a".into(), password_secret: secret("s"), ..Default::default() },
            RoleSpec { name: "b".into(), password_secret: secret("s"), ..Default::default() },
            RoleSpec { name: "c".into(), ..Default::default() },
        ];
        assert_eq!(Declarations::password_secrets(&roles), vec!["s".to_string()]);
        let first = Declarations {
            roles: roles.clone(),
            databases: vec![],
            application_user: "app".into(),
            ..Default::default()
        };
        let mut second = first.clone();
        assert_eq!(first.fingerprint(), second.fingerprint());
        second.roles[2].login = Some(false);
        assert_ne!(first.fingerprint(), second.fingerprint());
    }
}
