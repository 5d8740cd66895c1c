//! Admission of `spec.roles` and `spec.databases` (issue 23): names PostgreSQL takes as they are,
//! no role that belongs to PostgreSQL or to the operator, memberships that do not hand out the
//! server's files or programs, owners that exist, and nothing removed that the application uses.

use crate::admission::field_error::{FieldError, FieldErrorKind};
use crate::admission::key_reference::validate_key_reference;
use crate::api::database_service::DatabaseServiceSpec;
use crate::api::pod::{REPLICATION_USER, SUPERUSER};
use crate::api::roles::{DatabaseSpec, RoleSpec, MAX_DATABASES, MAX_EXTENSIONS, MAX_MEMBERSHIPS, MAX_ROLES};
use std::collections::BTreeSet;
use std::sync::LazyLock;

/// A name the agent uses without quoting surprises: lowercase, as PostgreSQL folds unquoted ones.
static NAME: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^[a-z_][a-z0-9_]{0,62}$").expect("name pattern compiles"));
/// An extension's name (`uuid-ossp` has a `-`).
static EXTENSION_NAME: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^[a-z0-9_][a-z0-9_-]{0,62}$").expect("extension pattern compiles"));
const NAME_RULE: &str =
    "must be a lowercase letter or '_' first, then lowercase letters, digits or '_', at most 63 bytes";

/// Role names SQL reserves or the operator uses.
const RESERVED_ROLES: [&str; 7] =
    [SUPERUSER, REPLICATION_USER, "public", "none", "current_user", "session_user", "current_role"];
/// Prefix of the operator's own roles (the migration role of issue 22).
const OPERATOR_ROLE_PREFIX: &str = "dbservice_";
/// Databases that belong to PostgreSQL.
const RESERVED_DATABASES: [&str; 3] = ["postgres", "template0", "template1"];

/// Predefined roles a declared role may be a member of, with the first major that has them.
const PREDEFINED_ROLES: [(&str, u32); 12] = [
    ("pg_read_all_data", 14),
    ("pg_write_all_data", 14),
    ("pg_read_all_settings", 10),
    ("pg_read_all_stats", 10),
    ("pg_stat_scan_tables", 10),
    ("pg_monitor", 10),
    ("pg_signal_backend", 9),
    ("pg_checkpoint", 15),
    ("pg_use_reserved_connections", 16),
    ("pg_create_subscription", 16),
    ("pg_maintain", 17),
    ("pg_signal_autovacuum_worker", 18),
];
/// Predefined roles that reach the pod's files or run programs in it: as good as the superuser.
const SERVER_ACCESS_ROLES: [&str; 3] = ["pg_read_server_files", "pg_write_server_files", "pg_execute_server_program"];

fn check_name(path: &str, name: &str, errors: &mut Vec<FieldError>) -> bool {
    if NAME.is_match(name) {
        return true;
    }
    errors.push(FieldError::invalid(path, name, NAME_RULE));
    false
}

fn forbidden(path: String, detail: String) -> FieldError {
    FieldError { path, kind: FieldErrorKind::Forbidden, detail }
}

/// Every error of `spec.roles` and `spec.databases`; `major` is the spec's major version when
/// supported (memberships in predefined roles it lacks are refused).
pub fn validate_declarations(spec: &DatabaseServiceSpec, major: Option<u32>, errors: &mut Vec<FieldError>) {
    if spec.roles.len() > MAX_ROLES {
        errors.push(FieldError::invalid(
            "spec.roles",
            spec.roles.len(),
            format!("must have at most {MAX_ROLES} roles"),
        ));
    }
    if spec.databases.len() > MAX_DATABASES {
        let detail = format!("must have at most {MAX_DATABASES} databases");
        errors.push(FieldError::invalid("spec.databases", spec.databases.len(), detail));
    }
    let declared: BTreeSet<&str> = spec.roles.iter().map(|role| role.name.as_str()).collect();
    let present: BTreeSet<&str> =
        spec.roles.iter().filter(|role| role.present()).map(|role| role.name.as_str()).collect();
    let mut seen = BTreeSet::new();
    for (index, role) in spec.roles.iter().enumerate() {
        let path = format!("spec.roles[{index}]");
        if !seen.insert(role.name.as_str()) {
            errors.push(forbidden(format!("{path}.name"), format!("role {:?} is declared twice", role.name)));
        }
        validate_role(&path, role, spec, &declared, major, errors);
    }
    let mut seen = BTreeSet::new();
    for (index, database) in spec.databases.iter().enumerate() {
        let path = format!("spec.databases[{index}]");
        if !seen.insert(database.name.as_str()) {
            errors.push(forbidden(format!("{path}.name"), format!("database {:?} is declared twice", database.name)));
        }
        validate_database(&path, database, spec, &present, errors);
    }
    for (index, role) in spec.roles.iter().enumerate().filter(|(_, role)| !role.present()) {
        let owned = spec
            .databases
            .iter()
            .find(|database| database.present() && database.owner.as_deref() == Some(role.name.as_str()));
        if let Some(database) = owned {
            errors.push(forbidden(
                format!("spec.roles[{index}].ensure"),
                format!(
                    "role {:?} owns the declared database {:?}: give that database another owner first",
                    role.name, database.name
                ),
            ));
        }
    }
}

fn validate_role(
    path: &str,
    role: &RoleSpec,
    spec: &DatabaseServiceSpec,
    declared: &BTreeSet<&str>,
    major: Option<u32>,
    errors: &mut Vec<FieldError>,
) {
    let name_path = format!("{path}.name");
    if check_name(&name_path, &role.name, errors) {
        if RESERVED_ROLES.contains(&role.name.as_str()) || role.name.starts_with("pg_") {
            errors.push(forbidden(name_path, format!("{:?} is reserved: \"{SUPERUSER}\", \"public\" and names starting with \"pg_\" belong to PostgreSQL, \"{REPLICATION_USER}\" to replication", role.name)));
        } else if role.name.starts_with(OPERATOR_ROLE_PREFIX) {
            errors.push(forbidden(
                name_path,
                format!("names starting with {OPERATOR_ROLE_PREFIX:?} belong to the operator"),
            ));
        } else if role.name == spec.username {
            errors.push(forbidden(
                name_path,
                format!("{:?} is the application's role: spec.username keeps it", role.name),
            ));
        }
    }
    if let Some(limit) = role.connection_limit.filter(|limit| *limit < -1) {
        errors.push(FieldError::invalid(&format!("{path}.connectionLimit"), limit, "must be -1 (no limit) or more"));
    }
    if role.in_roles.len() > MAX_MEMBERSHIPS {
        let detail = format!("must list at most {MAX_MEMBERSHIPS} roles");
        errors.push(FieldError::invalid(&format!("{path}.inRoles"), role.in_roles.len(), detail));
    }
    for (index, member_of) in role.in_roles.iter().enumerate() {
        let member_path = format!("{path}.inRoles[{index}]");
        validate_membership(&member_path, role, member_of, spec, declared, major, errors);
    }
    if let Some(secret) = &role.password_secret {
        let secret_path = format!("{path}.passwordSecret");
        validate_key_reference(&secret_path, "Secret", &secret.name, secret.key.as_deref(), errors);
        if !role.present() {
            errors.push(forbidden(format!("{path}.passwordSecret"), "a role that is absent has no password".into()));
        }
    }
}

fn validate_membership(
    path: &str,
    role: &RoleSpec,
    member_of: &str,
    spec: &DatabaseServiceSpec,
    declared: &BTreeSet<&str>,
    major: Option<u32>,
    errors: &mut Vec<FieldError>,
) {
    if member_of == role.name {
        errors.push(forbidden(path.into(), "a role cannot be a member of itself".into()));
    } else if SERVER_ACCESS_ROLES.contains(&member_of) {
        errors.push(forbidden(
            path.into(),
            format!("{member_of:?} reaches the pod's files or programs (as good as the superuser): grant it by hand if you must"),
        ));
    } else if [SUPERUSER, REPLICATION_USER].contains(&member_of) {
        errors.push(forbidden(
            path.into(),
            format!("{member_of:?} is the operator's; membership would share its rights"),
        ));
    } else if let Some((_, since)) = PREDEFINED_ROLES.iter().find(|(name, _)| *name == member_of) {
        if let Some(major) = major.filter(|major| major < since) {
            let detail = format!("PostgreSQL {major} has no predefined role {member_of:?} (it came with {since})");
            errors.push(FieldError { path: path.into(), kind: FieldErrorKind::Unsupported(member_of.into()), detail });
        }
    } else if member_of.starts_with("pg_") {
        let known: Vec<&str> = PREDEFINED_ROLES.iter().map(|(name, _)| *name).collect();
        let detail = format!("not a predefined role that can be granted; one of: {}", known.join(", "));
        errors.push(FieldError { path: path.into(), kind: FieldErrorKind::Unsupported(member_of.into()), detail });
    } else if member_of != spec.username && !declared.contains(member_of) {
        errors.push(FieldError::invalid(
            path,
            member_of,
            "must be a role of spec.roles, the application's role (spec.username) or a predefined role",
        ));
    }
}

fn validate_database(
    path: &str,
    database: &DatabaseSpec,
    spec: &DatabaseServiceSpec,
    present_roles: &BTreeSet<&str>,
    errors: &mut Vec<FieldError>,
) {
    let name_path = format!("{path}.name");
    if check_name(&name_path, &database.name, errors) {
        if RESERVED_DATABASES.contains(&database.name.as_str()) {
            errors.push(forbidden(name_path, format!("{:?} belongs to PostgreSQL", database.name)));
        } else if database.name == spec.database_name {
            errors.push(forbidden(
                name_path,
                format!("{:?} is the application's database: spec.databaseName keeps it", database.name),
            ));
        }
    }
    if let Some(owner) = &database.owner {
        let owner_path = format!("{path}.owner");
        if *owner != spec.username && !present_roles.contains(owner.as_str()) {
            errors.push(FieldError::invalid(
                &owner_path,
                owner,
                "must be a present role of spec.roles or the application's role (spec.username)",
            ));
        }
    }
    if database.extensions.len() > MAX_EXTENSIONS {
        let detail = format!("must list at most {MAX_EXTENSIONS} extensions");
        errors.push(FieldError::invalid(&format!("{path}.extensions"), database.extensions.len(), detail));
    }
    let mut seen = BTreeSet::new();
    for (index, extension) in database.extensions.iter().enumerate() {
        let extension_path = format!("{path}.extensions[{index}].name");
        if !EXTENSION_NAME.is_match(&extension.name) {
            let rule = "must be an extension name: lowercase letters, digits, '_' or '-', at most 63 bytes";
            errors.push(FieldError::invalid(&extension_path, &extension.name, rule));
        } else if !seen.insert(extension.name.as_str()) {
            errors.push(forbidden(extension_path, format!("extension {:?} is listed twice", extension.name)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::roles::{Ensure, ExtensionSpec, PasswordSecret};

    fn spec(roles: Vec<RoleSpec>, databases: Vec<DatabaseSpec>) -> DatabaseServiceSpec {
        DatabaseServiceSpec {
            username: "app".into(),
            database_name: "app".into(),
            roles,
            databases,
            ..Default::default()
        }
    }

    fn role(name: &str) -> RoleSpec {
        RoleSpec { name: name.into(), ..Default::default() }
    }

    fn errors(spec: &DatabaseServiceSpec, major: Option<u32>) -> Vec<String> {
        let mut errors = Vec::new();
        validate_declarations(spec, major, &mut errors);
        errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_full_declaration_passes() {
        let reporting = RoleSpec {
            in_roles: vec!["pg_read_all_data".into(), "app".into(), "writers".into()],
            password_secret: Some(PasswordSecret { name: "reporting-password".into(), key: None }),
            connection_limit: Some(5),
            ..role("reporting")
        };
        let writers = RoleSpec { login: Some(false), ..role("writers") };
        let database = DatabaseSpec {
            name: "analytics".into(),
            owner: Some("reporting".into()),
            extensions: vec![ExtensionSpec { name: "pg_stat_statements".into(), ensure: None }],
            ..Default::default()
        };
        assert_eq!(errors(&spec(vec![reporting, writers], vec![database]), Some(16)), Vec::<String>::new());
    }

    #[test]
    fn reserved_and_malformed_names_are_refused() {
        for name in ["postgres", "replicator", "pg_admin", "public", "dbservice_migration", "app", "Upper", "a-b"] {
            let found = errors(&spec(vec![role(name)], vec![]), Some(16));
            assert_eq!(found.len(), 1, "{name}: {found:?}");
            assert!(found[0].starts_with("spec.roles[0].name"), "{found:?}");
        }
        for name in ["postgres", "template1", "app", "1db"] {
            let database = DatabaseSpec { name: name.into(), ..Default::default() };
            let found = errors(&spec(vec![], vec![database]), Some(16));
            assert_eq!(found.len(), 1, "{name}: {found:?}");
        }
    }

    #[test]
    fn memberships_are_checked_against_roles_and_majors() {
        let member = |of: &str| RoleSpec { in_roles: vec![of.into()], ..role("reporting") };
        let refused = errors(&spec(vec![member("pg_execute_server_program")], vec![]), Some(16));
        assert!(refused[0].contains("as good as the superuser"), "{refused:?}");
        let old = errors(&spec(vec![member("pg_maintain")], vec![]), Some(16));
        assert!(old[0].contains("came with 17"), "{old:?}");
        assert!(errors(&spec(vec![member("pg_maintain")], vec![]), Some(17)).is_empty());
        let unknown = errors(&spec(vec![member("nobody")], vec![]), Some(16));
        assert!(unknown[0].contains("spec.roles[0].inRoles[0]"), "{unknown:?}");
        assert_eq!(errors(&spec(vec![member("reporting")], vec![]), Some(16)).len(), 1);
        assert_eq!(errors(&spec(vec![member("postgres")], vec![]), Some(16)).len(), 1);
    }

    #[test]
    fn owners_must_be_present_and_an_owner_cannot_be_removed() {
        let database = DatabaseSpec { name: "analytics".into(), owner: Some("reporting".into()), ..Default::default() };
        let missing = errors(&spec(vec![], vec![database.clone()]), Some(16));
        assert!(missing[0].starts_with("spec.databases[0].owner"), "{missing:?}");
        let gone = RoleSpec { ensure: Some(Ensure::Absent), ..role("reporting") };
        let found = errors(&spec(vec![gone], vec![database]), Some(16));
        assert!(found.iter().any(|error| error.starts_with("spec.roles[0].ensure")), "{found:?}");
    }

    #[test]
    fn duplicates_and_bad_secret_references_are_refused() {
        let found = errors(&spec(vec![role("a"), role("a")], vec![]), Some(16));
        assert!(found[0].contains("declared twice"), "{found:?}");
        let secret = RoleSpec {
            password_secret: Some(PasswordSecret { name: "Bad_Name".into(), key: Some("a/b".into()) }),
            ..role("a")
        };
        assert_eq!(errors(&spec(vec![secret], vec![]), Some(16)).len(), 2);
        let limit = RoleSpec { connection_limit: Some(-2), ..role("a") };
        assert_eq!(errors(&spec(vec![limit], vec![]), Some(16)).len(), 1);
    }
}
