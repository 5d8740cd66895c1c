//! Pure: the statements that take what the primary has to what `spec.roles` and
//! `spec.databases` declare, object by object (so that one that fails is reported and the others
//! still go ahead). Nothing here reads or writes a server.

use crate::api::roles::{DatabaseSpec, RoleSpec};
use crate::instance::roles::{identifier, literal};
use crate::instance::scram;
use std::collections::{BTreeMap, BTreeSet};

/// A role as `pg_authid` and `pg_auth_members` show it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedRole {
    /// rolcanlogin.
    pub login: bool,
    /// rolcreatedb.
    pub create_database: bool,
    /// rolconnlimit.
    pub connection_limit: i32,
    /// Any of rolsuper, rolcreaterole, rolreplication, rolbypassrls: none is declarable, so each
    /// is a drift to put back.
    pub elevated: bool,
    /// rolpassword (a SCRAM verifier, an MD5 hash, or None).
    pub password_verifier: Option<String>,
    /// The roles it is a member of.
    pub member_of: BTreeSet<String>,
}

/// One statement, and whether it carries a password (then it is run unlogged and never shown).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    /// The SQL.
    pub sql: String,
    /// It holds a password.
    pub secret: bool,
}

impl Statement {
    fn plain(sql: String) -> Self {
        Statement { sql, secret: false }
    }
}

fn attributes(role: &RoleSpec) -> String {
    let login = if role.login.unwrap_or(true) { "LOGIN" } else { "NOLOGIN" };
    let create_database = if role.create_database.unwrap_or(false) { "CREATEDB" } else { "NOCREATEDB" };
    format!(
        "{login} {create_database} NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS CONNECTION LIMIT {}",
        role.connection_limit.unwrap_or(-1)
    )
}

/// Creates the role or puts its attributes and password back (memberships come later, once
/// every declared role exists). `password` is the Secret's value when one is declared and read.
pub fn role_statements(role: &RoleSpec, observed: Option<&ObservedRole>, password: Option<&str>) -> Vec<Statement> {
    let name = identifier(&role.name);
    let Some(observed) = observed else {
        let mut create = format!("CREATE ROLE {name} {}", attributes(role));
        if let Some(password) = password {
            create.push_str(&format!(" PASSWORD {}", literal(password)));
        }
        return vec![Statement { sql: create, secret: password.is_some() }];
    };
    let mut statements = Vec::new();
    let wanted =
        (role.login.unwrap_or(true), role.create_database.unwrap_or(false), role.connection_limit.unwrap_or(-1));
    if observed.elevated || wanted != (observed.login, observed.create_database, observed.connection_limit) {
        statements.push(Statement::plain(format!("ALTER ROLE {name} {}", attributes(role))));
    }
    if let Some(password) = password {
        if !observed.password_verifier.as_deref().is_some_and(|verifier| scram::verifies(verifier, password)) {
            statements
                .push(Statement { sql: format!("ALTER ROLE {name} PASSWORD {}", literal(password)), secret: true });
        }
    }
    statements
}

/// Grants the memberships `role` declares and revokes the others.
pub fn membership_statements(role: &RoleSpec, member_of: &BTreeSet<String>) -> Vec<Statement> {
    let name = identifier(&role.name);
    let wanted: BTreeSet<&str> = role.in_roles.iter().map(String::as_str).collect();
    let have: BTreeSet<&str> = member_of.iter().map(String::as_str).collect();
    let grants = wanted.difference(&have).map(|group| format!("GRANT {} TO {name}", identifier(group)));
    let revokes = have.difference(&wanted).map(|group| format!("REVOKE {} FROM {name}", identifier(group)));
    grants.chain(revokes).map(Statement::plain).collect()
}

/// What removing role `role` runs in each database (its objects go to `heir`, its privileges
/// are revoked), then once: `DROP ROLE`.
pub fn role_removal(role: &str, heir: &str) -> (Vec<Statement>, Statement) {
    let (role, heir) = (identifier(role), identifier(heir));
    let each_database = vec![
        Statement::plain(format!("REASSIGN OWNED BY {role} TO {heir}")),
        Statement::plain(format!("DROP OWNED BY {role}")),
    ];
    (each_database, Statement::plain(format!("DROP ROLE {role}")))
}

/// Creates the database or gives it back to its owner; None when it is as declared. Each
/// statement runs on its own (CREATE DATABASE refuses a transaction block).
pub fn database_statements(database: &DatabaseSpec, owner: Option<&str>, application_user: &str) -> Vec<Statement> {
    let name = identifier(&database.name);
    let wanted = database.owner.as_deref().unwrap_or(application_user);
    match owner {
        None => vec![Statement::plain(format!("CREATE DATABASE {name} OWNER {}", identifier(wanted)))],
        Some(owner) if owner != wanted => {
            vec![Statement::plain(format!("ALTER DATABASE {name} OWNER TO {}", identifier(wanted)))]
        }
        Some(_) => Vec::new(),
    }
}

/// Drops the database (`ensure: absent`), its sessions ended first.
pub fn database_removal(database: &str) -> Statement {
    Statement::plain(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", identifier(database)))
}

/// The extension statements of one database, or the message of why it cannot be as declared
/// (an extension the image does not have). `available` maps each to the schema its control file
/// fixes, if any; the others go to `public`, named: the agent's search_path is `pg_catalog` first,
/// so without a schema they would be made there.
pub fn extension_statements(
    database: &DatabaseSpec,
    installed: &BTreeSet<String>,
    available: &BTreeMap<String, Option<String>>,
) -> Result<Vec<Statement>, String> {
    let missing: Vec<&str> = database
        .extensions
        .iter()
        .filter(|extension| extension.present() && !available.contains_key(&extension.name))
        .map(|extension| extension.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(format!("not available in the image (pg_available_extensions): {}", missing.join(", ")));
    }
    Ok(database
        .extensions
        .iter()
        .filter_map(|extension| match (extension.present(), installed.contains(&extension.name)) {
            (true, false) => {
                let schema = available.get(&extension.name).cloned().flatten().unwrap_or_else(|| "public".into());
                Some(format!(
                    "CREATE EXTENSION IF NOT EXISTS {} SCHEMA {}",
                    identifier(&extension.name),
                    identifier(&schema)
                ))
            }
            (false, true) => Some(format!("DROP EXTENSION IF EXISTS {}", identifier(&extension.name))),
            _ => None,
        })
        .map(Statement::plain)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::roles::{Ensure, ExtensionSpec};

    fn role(name: &str) -> RoleSpec {
        RoleSpec { name: name.into(), ..Default::default() }
    }

    fn sql(statements: &[Statement]) -> Vec<&str> {
        statements.iter().map(|statement| statement.sql.as_str()).collect()
    }

    #[test]
    fn a_missing_role_is_created_with_its_password_as_a_secret_statement() {
        let statements = role_statements(&role("reporting"), None, Some("it's"));
        assert_eq!(statements.len(), 1);
        assert!(statements[0].secret);
        assert_eq!(
            statements[0].sql,
            "CREATE ROLE \"reporting\" LOGIN NOCREATEDB NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS CONNECTION LIMIT -1 PASSWORD 'it''s'"
        );
    }

    #[test]
    fn a_role_as_declared_needs_nothing_and_drift_is_put_back() {
        let verifier = "SCRAM-SHA-256$4096:Qidqi0vlJUytONbJY2IphA==$pRoAU6MDqrMWjGpb4iBt7VqrcmrU2XfVV44KhR6YLho=:TwxRnEB1hVmTl0sOQ5mZCXzDr8vH6ftO2vUJMwCdBiw=";
        let observed = ObservedRole {
            login: true,
            connection_limit: -1,
            password_verifier: Some(verifier.into()),
            ..Default::default()
        };
        assert!(role_statements(&role("r"), Some(&observed), Some("secret")).is_empty());
        let changed = role_statements(&role("r"), Some(&observed), Some("rotated"));
        assert_eq!(changed.len(), 1);
        assert!(changed[0].secret && changed[0].sql.starts_with("ALTER ROLE \"r\" PASSWORD"));
        let elevated = ObservedRole { elevated: true, ..observed.clone() };
        assert_eq!(sql(&role_statements(&role("r"), Some(&elevated), None)).len(), 1);
        let limited = RoleSpec { connection_limit: Some(3), login: Some(false), ..role("r") };
        assert_eq!(
            sql(&role_statements(&limited, Some(&observed), None)),
            ["ALTER ROLE \"r\" NOLOGIN NOCREATEDB NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS CONNECTION LIMIT 3"]
        );
    }

    #[test]
    fn memberships_are_granted_and_revoked_to_match() {
        let declared = RoleSpec { in_roles: vec!["pg_monitor".into(), "readers".into()], ..role("r") };
        let have: BTreeSet<String> = ["readers".to_string(), "writers".to_string()].into();
        assert_eq!(
            sql(&membership_statements(&declared, &have)),
            ["GRANT \"pg_monitor\" TO \"r\"", "REVOKE \"writers\" FROM \"r\""]
        );
    }

    #[test]
    fn a_removed_role_hands_its_objects_to_the_heir_first() {
        let (each, last) = role_removal("old", "app");
        assert_eq!(sql(&each), ["REASSIGN OWNED BY \"old\" TO \"app\"", "DROP OWNED BY \"old\""]);
        assert_eq!(last.sql, "DROP ROLE \"old\"");
    }

    #[test]
    fn databases_are_created_owned_and_extensions_kept() {
        let database = DatabaseSpec {
            name: "analytics".into(),
            extensions: vec![
                ExtensionSpec { name: "pg_trgm".into(), ensure: None },
                ExtensionSpec { name: "hstore".into(), ensure: Some(Ensure::Absent) },
            ],
            ..Default::default()
        };
        assert_eq!(sql(&database_statements(&database, None, "app")), ["CREATE DATABASE \"analytics\" OWNER \"app\""]);
        assert_eq!(
            sql(&database_statements(&database, Some("other"), "app")),
            ["ALTER DATABASE \"analytics\" OWNER TO \"app\""]
        );
        assert!(database_statements(&database, Some("app"), "app").is_empty());
        let available: BTreeMap<String, Option<String>> =
            [("pg_trgm".to_string(), None), ("hstore".to_string(), Some("pg_catalog".to_string()))].into();
        let installed: BTreeSet<String> = ["hstore".to_string()].into();
        assert_eq!(
            sql(&extension_statements(&database, &installed, &available).unwrap()),
            ["CREATE EXTENSION IF NOT EXISTS \"pg_trgm\" SCHEMA \"public\"", "DROP EXTENSION IF EXISTS \"hstore\""]
        );
        let fixed = extension_statements(&database, &BTreeSet::new(), &available).unwrap();
        assert_eq!(fixed[0].sql, "CREATE EXTENSION IF NOT EXISTS \"pg_trgm\" SCHEMA \"public\"");
        let hstore = DatabaseSpec {
            extensions: vec![ExtensionSpec { name: "hstore".into(), ensure: None }],
            ..database.clone()
        };
        assert_eq!(
            sql(&extension_statements(&hstore, &BTreeSet::new(), &available).unwrap()),
            ["CREATE EXTENSION IF NOT EXISTS \"hstore\" SCHEMA \"pg_catalog\""]
        );
        let missing = extension_statements(&database, &installed, &BTreeMap::new()).unwrap_err();
        assert!(missing.contains("pg_trgm"), "{missing}");
        assert_eq!(database_removal("x").sql, "DROP DATABASE IF EXISTS \"x\" WITH (FORCE)");
    }
}
