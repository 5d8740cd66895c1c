//! The superuser and the application's role on the primary (issue 22): the superuser is
//! `postgres`, with the password of the Secret NAME-superuser; the application's role
//! (`spec.username`) is an ordinary role that owns its database.
//!
//! Databases made before that were bootstrapped with the application's role as their only
//! superuser (OID 10, the bootstrap role, which owns the system catalogue). Taking SUPERUSER away
//! from that role would not be enough (it would still own `pg_read_file` and every other
//! catalogue function, and PostgreSQL 16 refuses it anyway), so they are migrated by renaming:
//! the bootstrap role becomes `postgres`, a new ordinary role takes the application's name and
//! password, and what the application created (objects with OIDs from 16384 on) is handed to
//! it. A temporary superuser [`MIGRATION_ROLE`] does the rename (a session cannot rename its own
//! role) and marks a migration in progress until it is dropped, so that an interrupted one is
//! finished by the next run. Every step is idempotent.
//!
//! Runs in the background (a migration visits every database): the agent's step loop, which
//! renews the Lease, never waits for it.

use crate::instance::session::{self, Sql};
use crate::instance::InstanceConfig;
use std::time::Duration;
use tokio_postgres::{Client, NoTls};

/// Temporary superuser of a migration; exists only while one is in progress.
pub const MIGRATION_ROLE: &str = "dbservice_migration";

/// First OID of objects made after initdb (`FirstNormalObjectId`).
const FIRST_USER_OID: u32 = 16_384;

/// Longest wait for a connection or one statement.
pub(crate) const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The roles the agent keeps on the primary.
#[derive(Clone, Debug)]
pub struct RoleSettings {
    /// The application's role (`spec.username`).
    pub application_user: String,
    /// Its password (from the credentials Secret; set only when the role is created).
    pub application_password: String,
    /// The application's database, owned by its role.
    pub database: String,
    /// The superuser's (`InstanceConfig::superuser`) password, set on every primary start.
    pub superuser_password: String,
    /// Whether the superuser may log in over the network (`spec.enableSuperuserAccess`).
    pub superuser_network_access: bool,
}

/// Keeping the roles failed.
#[derive(Debug, thiserror::Error)]
pub enum KeepRolesError {
    /// No connection as `user`.
    #[error("connect to the local server as {user:?}: {detail}")]
    Connect {
        /// The role.
        user: String,
        /// Why.
        detail: String,
    },
    /// A statement failed.
    #[error("{step}: {detail}")]
    Statement {
        /// What it was for.
        step: &'static str,
        /// The server's message (statements with passwords are never part of it).
        detail: String,
    },
    /// The application's role is the bootstrap superuser, and another role is called like the
    /// superuser: the rename cannot be done.
    #[error("role {application:?} is the bootstrap superuser and a role {superuser:?} exists besides it: rename that role, then restart the primary")]
    NameTaken {
        /// The application's role.
        application: String,
        /// The superuser's name.
        superuser: String,
    },
    /// Took longer than [`STATEMENT_TIMEOUT`].
    #[error("{0} did not finish within {STATEMENT_TIMEOUT:?}")]
    Timeout(&'static str),
}

/// What keeping the roles did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolesKept {
    /// The database had been made with the application's role as its superuser, and was
    /// migrated now.
    pub migrated: bool,
    /// The application's role had been made a superuser (by someone with superuser access) and
    /// was made an ordinary role again.
    pub superuser_taken_away: bool,
}

/// An SQL identifier.
pub(crate) fn identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// An SQL string literal (standard_conforming_strings is on since PostgreSQL 9.1).
pub(crate) fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// Statements that must not be logged, even when they fail (they carry a password).
pub(crate) fn unlogged(statements: &[String]) -> String {
    let mut all = vec![
        "SET log_statement = 'none'".to_string(),
        "SET log_min_error_statement = 'panic'".to_string(),
        "SET password_encryption = 'scram-sha-256'".to_string(),
    ];
    all.extend_from_slice(statements);
    all.join(";\n")
}

/// The statement handing what the bootstrap role made in one database (OIDs from 16384 on, not
/// members of an extension) to `owner`: schemas, tables (with their indexes, sequences and
/// types), views, sequences of their own, routines, types, domains, large objects.
pub fn transfer_ownership_statement(owner: &str) -> String {
    let owner = literal(owner);
    format!(
        r#"DO $transfer$
DECLARE item record;
BEGIN
  FOR item IN SELECT pg_catalog.format('ALTER SCHEMA %I OWNER TO %I', n.nspname, {owner}) AS statement
      FROM pg_catalog.pg_namespace n
      WHERE n.nspowner = 10 AND n.oid >= {FIRST_USER_OID}
        AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_namespace'::regclass AND d.objid = n.oid AND d.deptype = 'e')
    UNION ALL SELECT pg_catalog.format('ALTER %s %s OWNER TO %I',
          CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,
          c.oid::regclass, {owner})
      FROM pg_catalog.pg_class c
      WHERE c.relowner = 10 AND c.oid >= {FIRST_USER_OID} AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
        AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = c.oid
          AND (d.deptype = 'e' OR (c.relkind = 'S' AND d.deptype IN ('a', 'i'))))
    UNION ALL SELECT pg_catalog.format('ALTER ROUTINE %s OWNER TO %I', p.oid::regprocedure, {owner})
      FROM pg_catalog.pg_proc p
      WHERE p.proowner = 10 AND p.oid >= {FIRST_USER_OID}
        AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
    UNION ALL SELECT pg_catalog.format('ALTER %s %s OWNER TO %I', CASE t.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END, t.oid::regtype, {owner})
      FROM pg_catalog.pg_type t
      WHERE t.typowner = 10 AND t.oid >= {FIRST_USER_OID} AND t.typrelid = 0 AND t.typtype IN ('b', 'd', 'e', 'r')
        AND NOT EXISTS (SELECT FROM pg_catalog.pg_type element WHERE element.typarray = t.oid)
        AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_type'::regclass AND d.objid = t.oid AND d.deptype = 'e')
    UNION ALL SELECT pg_catalog.format('ALTER LARGE OBJECT %s OWNER TO %I', l.oid, {owner})
      FROM pg_catalog.pg_largeobject_metadata l WHERE l.lomowner = 10
  LOOP
    EXECUTE item.statement;
  END LOOP;
END
$transfer$"#
    )
}

/// A privileged session (search_path pinned, see [`crate::instance::session`]) on the local server.
pub(crate) async fn connect(config: &InstanceConfig, user: &str, database: &str) -> Result<Client, KeepRolesError> {
    connect_for(config, user, database, Sql::Privileged).await
}

/// A session on the local server for `sql`, bounded by [`STATEMENT_TIMEOUT`].
pub(crate) async fn connect_for(
    config: &InstanceConfig,
    user: &str,
    database: &str,
    sql: Sql,
) -> Result<Client, KeepRolesError> {
    let pg_config = session::config(&config.socket_dir, config.port, user, database, sql, STATEMENT_TIMEOUT);
    let connected = tokio::time::timeout(STATEMENT_TIMEOUT, pg_config.connect(NoTls))
        .await
        .map_err(|_| KeepRolesError::Timeout("connecting"))?
        .map_err(|error| KeepRolesError::Connect { user: user.into(), detail: detail(&error) })?;
    let (client, connection) = connected;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The server's message of an error (its Display says only "db error").
pub(crate) fn detail(error: &tokio_postgres::Error) -> String {
    error.as_db_error().map(|db| db.message().to_string()).unwrap_or_else(|| error.to_string())
}

/// Whether a failed connection failed because the role does not exist.
fn role_missing(error: &KeepRolesError) -> bool {
    matches!(error, KeepRolesError::Connect { detail, .. } if detail.contains("does not exist") && detail.contains("role"))
}

pub(crate) async fn run(client: &Client, step: &'static str, statements: &str) -> Result<(), KeepRolesError> {
    tokio::time::timeout(STATEMENT_TIMEOUT, client.batch_execute(statements))
        .await
        .map_err(|_| KeepRolesError::Timeout(step))?
        .map_err(|error| KeepRolesError::Statement { step, detail: detail(&error) })
}

async fn exists(client: &Client, role: &str) -> Result<bool, KeepRolesError> {
    let row = tokio::time::timeout(
        STATEMENT_TIMEOUT,
        client.query_one("SELECT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = $1)", &[&role]),
    )
    .await
    .map_err(|_| KeepRolesError::Timeout("looking up a role"))?
    .map_err(|error| KeepRolesError::Statement { step: "looking up a role", detail: detail(&error) })?;
    Ok(row.get(0))
}

/// Makes the bootstrap role (the application's, in a database made before issue 22) the
/// superuser `postgres`, through the temporary [`MIGRATION_ROLE`].
async fn rename_bootstrap_role(config: &InstanceConfig, settings: &RoleSettings) -> Result<(), KeepRolesError> {
    let bootstrap = connect(config, &settings.application_user, "postgres").await?;
    let create = format!(
        "DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = {}) THEN CREATE ROLE {} SUPERUSER LOGIN; END IF; END$$",
        literal(MIGRATION_ROLE),
        identifier(MIGRATION_ROLE)
    );
    run(&bootstrap, "creating the migration role", &create).await?;
    drop(bootstrap);
    let migration = connect(config, MIGRATION_ROLE, "postgres").await?;
    let rename = format!(
        "DO $$BEGIN IF (SELECT rolname FROM pg_catalog.pg_roles WHERE oid = 10) = {} THEN ALTER ROLE {} RENAME TO {}; END IF; END$$",
        literal(&settings.application_user),
        identifier(&settings.application_user),
        identifier(&config.superuser)
    );
    run(&migration, "renaming the bootstrap role", &rename).await?;
    // Sessions opened as the application before the rename are superuser sessions now.
    let terminate = "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity \
        WHERE usesysid = 10 AND pid <> pg_catalog.pg_backend_pid() AND backend_type = 'client backend' \
        AND application_name <> 'dbservice-instance'";
    run(&migration, "ending the application's superuser sessions", terminate).await
}

/// Keeps the superuser and the application's role as described in the module documentation.
pub async fn keep_roles(config: &InstanceConfig, settings: &RoleSettings) -> Result<RolesKept, KeepRolesError> {
    let mut kept = RolesKept::default();
    let superuser = match connect(config, &config.superuser, "postgres").await {
        Ok(client) => client,
        Err(error) if role_missing(&error) => {
            rename_bootstrap_role(config, settings).await?;
            kept.migrated = true;
            connect(config, &config.superuser, "postgres").await?
        }
        Err(error) => return Err(error),
    };
    let migrating = exists(&superuser, MIGRATION_ROLE).await?;
    kept.migrated |= migrating;
    let password = unlogged(&[format!(
        "ALTER ROLE {} WITH SUPERUSER LOGIN PASSWORD {}",
        identifier(&config.superuser),
        literal(&settings.superuser_password)
    )]);
    run(&superuser, "setting the superuser's password", &password).await?;
    kept.superuser_taken_away = keep_application_role(config, settings, &superuser).await?;
    keep_replication_role(config, &superuser).await?;
    hand_over_databases(config, settings, &superuser, migrating).await?;
    if migrating {
        let drop = format!("DROP ROLE IF EXISTS {}", identifier(MIGRATION_ROLE));
        run(&superuser, "dropping the migration role", &drop).await?;
    }
    Ok(kept)
}

/// Makes the application's role exist as an ordinary role; true when it was a superuser and no
/// longer is.
async fn keep_application_role(
    config: &InstanceConfig,
    settings: &RoleSettings,
    superuser: &Client,
) -> Result<bool, KeepRolesError> {
    let application = identifier(&settings.application_user);
    let row = tokio::time::timeout(
        STATEMENT_TIMEOUT,
        superuser.query_opt(
            "SELECT rolsuper, oid = 10 FROM pg_catalog.pg_roles WHERE rolname = $1",
            &[&settings.application_user],
        ),
    )
    .await
    .map_err(|_| KeepRolesError::Timeout("reading the application role"))?
    .map_err(|error| KeepRolesError::Statement { step: "reading the application role", detail: detail(&error) })?;
    match row.map(|row| (row.get::<_, bool>(0), row.get::<_, bool>(1))) {
        None => {
            // Migrated (the bootstrap role took the superuser's name), or recovered from a
            // source that had no role of this name.
            let create = unlogged(&[format!(
                "CREATE ROLE {application} LOGIN PASSWORD {}",
                literal(&settings.application_password)
            )]);
            run(superuser, "creating the application role", &create).await?;
            Ok(false)
        }
        Some((_, true)) => Err(KeepRolesError::NameTaken {
            application: settings.application_user.clone(),
            superuser: config.superuser.clone(),
        }),
        Some((true, false)) => {
            run(
                superuser,
                "making the application role an ordinary role",
                &format!("ALTER ROLE {application} NOSUPERUSER"),
            )
            .await?;
            Ok(true)
        }
        Some((false, false)) => Ok(false),
    }
}

/// The replication role may switch WAL files and has the replication Secret's password.
async fn keep_replication_role(config: &InstanceConfig, superuser: &Client) -> Result<(), KeepRolesError> {
    // A backup completes its last WAL segment with pg_switch_wal() as the replication role (the
    // application's role, which did it before, is no superuser any more).
    let grant =
        format!("GRANT EXECUTE ON FUNCTION pg_catalog.pg_switch_wal() TO {}", identifier(&config.replication_user));
    run(superuser, "letting the replication role switch WAL files", &grant).await?;
    // The replication role's password is the replication Secret's (one made again after it was
    // deleted takes effect here; the standbys read the same file).
    if !config.replication_password.is_empty() {
        let password = unlogged(&[format!(
            "ALTER ROLE {} PASSWORD {}",
            identifier(&config.replication_user),
            literal(&config.replication_password)
        )]);
        run(superuser, "setting the replication role's password", &password).await?;
    }
    Ok(())
}

/// Hands the databases (and the objects in them) to the application's role: during a migration
/// every database the bootstrap role made (the application's among them), afterwards only the
/// application's, if it changed hands.
async fn hand_over_databases(
    config: &InstanceConfig,
    settings: &RoleSettings,
    superuser: &Client,
    migrating: bool,
) -> Result<(), KeepRolesError> {
    let application = identifier(&settings.application_user);
    let query = if migrating {
        "SELECT datname FROM pg_catalog.pg_database WHERE datallowconn AND (datname = $1 OR (datdba = 10 AND oid >= 16384) OR datname IN ('postgres', 'template1'))"
    } else {
        "SELECT datname FROM pg_catalog.pg_database WHERE datname = $1 AND datdba <> (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = $2)"
    };
    let parameters: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
        if migrating { vec![&settings.database] } else { vec![&settings.database, &settings.application_user] };
    let databases: Vec<String> = tokio::time::timeout(STATEMENT_TIMEOUT, superuser.query(query, &parameters))
        .await
        .map_err(|_| KeepRolesError::Timeout("listing the databases"))?
        .map_err(|error| KeepRolesError::Statement { step: "listing the databases", detail: detail(&error) })?
        .iter()
        .map(|row| row.get(0))
        .collect();
    for database in &databases {
        if database != "postgres" && database != "template1" {
            let statement = format!("ALTER DATABASE {} OWNER TO {application}", identifier(database));
            run(superuser, "handing a database to the application role", &statement).await?;
        }
        let inside = connect(config, &config.superuser, database).await?;
        run(
            &inside,
            "handing the application's objects to its role",
            &transfer_ownership_statement(&settings.application_user),
        )
        .await?;
    }
    Ok(())
}

/// Pause before a failed [`keep_roles`] is tried again.
const RETRY_PAUSE: Duration = Duration::from_secs(30);

/// Runs [`keep_roles`] once per server start of a primary, in the background, and tries a
/// failed run again after [`RETRY_PAUSE`].
#[derive(Debug, Default)]
pub struct RolesKeeper {
    running: Option<tokio::task::JoinHandle<Result<RolesKept, KeepRolesError>>>,
    done: bool,
    retry_at: Option<std::time::Instant>,
}

impl RolesKeeper {
    /// A new server start: the roles are kept again once it is a ready primary.
    pub fn restart(&mut self) {
        if let Some(running) = self.running.take() {
            running.abort();
        }
        self.done = false;
        self.retry_at = None;
    }

    /// Whether the roles were kept since the server's start.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Called on every step of a ready primary: starts the run, or looks at its outcome.
    pub fn keep(&mut self, config: &InstanceConfig) {
        let Some(settings) = config.roles.clone() else { return };
        if self.done {
            return;
        }
        if let Some(running) = &self.running {
            if !running.is_finished() {
                return;
            }
            match finished_outcome(self.running.take().expect("checked")) {
                Ok(kept) => {
                    self.done = true;
                    if kept.migrated {
                        tracing::warn!(instance = %config.name, application = %settings.application_user, "migrated: the application role is no longer the superuser; the superuser is now {}", config.superuser);
                    }
                    if kept.superuser_taken_away {
                        tracing::warn!(instance = %config.name, application = %settings.application_user, "the application role had been made a superuser: made an ordinary role again");
                    }
                }
                Err(error) => {
                    tracing::warn!(instance = %config.name, %error, "could not keep the roles: trying again in {RETRY_PAUSE:?}");
                    self.retry_at = Some(std::time::Instant::now() + RETRY_PAUSE);
                }
            }
            return;
        }
        if self.retry_at.is_some_and(|at| std::time::Instant::now() < at) {
            return;
        }
        let config = config.clone();
        self.running = Some(tokio::spawn(async move { keep_roles(&config, &settings).await }));
    }
}

/// The outcome of a finished task (a panic counts as a failed run).
fn finished_outcome(
    task: tokio::task::JoinHandle<Result<RolesKept, KeepRolesError>>,
) -> Result<RolesKept, KeepRolesError> {
    use futures::FutureExt;
    match task.now_or_never() {
        Some(Ok(outcome)) => outcome,
        Some(Err(error)) => Err(KeepRolesError::Statement { step: "keeping the roles", detail: error.to_string() }),
        None => Err(KeepRolesError::Timeout("keeping the roles")),
    }
}

/// First line of the operator's own block in pg_hba.conf.
pub(crate) const HBA_BEGIN: &str = "# BEGIN dbservice-operator superuser";
/// Last line of it.
pub(crate) const HBA_END: &str = "# END dbservice-operator superuser";

/// `hba` (pg_hba.conf) with the operator's superuser block first: network logins as `superuser`
/// rejected unless `network_access` (socket logins stay, for the agent and `kubectl exec`).
pub fn with_superuser_rule(hba: &str, superuser: &str, network_access: bool) -> String {
    let kept = crate::instance::hba::without_block(hba, HBA_BEGIN, HBA_END);
    let mut text = String::new();
    if !network_access {
        text.push_str(&format!(
            "{HBA_BEGIN}\nhost\tall\t{superuser}\tall\treject\nhost\treplication\t{superuser}\tall\treject\n{HBA_END}\n"
        ));
    }
    text + &crate::instance::hba::joined(&kept)
}

/// Writes the superuser block into the data directory's pg_hba.conf (before every start: a
/// clone or a rewind copies the source's file, and `spec.enableSuperuserAccess` may change).
pub fn write_superuser_rule(config: &InstanceConfig, network_access: bool) -> std::io::Result<()> {
    crate::instance::hba::rewrite(config, |hba| with_superuser_rule(hba, &config.superuser, network_access))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HBA: &str = "local all all trust\nhost all all all scram-sha-256\n";

    #[test]
    fn superuser_network_logins_are_rejected_before_any_other_rule() {
        let hba = with_superuser_rule(HBA, "postgres", false);
        let lines: Vec<&str> = hba.lines().collect();
        assert_eq!(lines[1], "host\tall\tpostgres\tall\treject");
        assert_eq!(lines[2], "host\treplication\tpostgres\tall\treject");
        assert!(hba.ends_with(HBA), "{hba}");
    }

    #[test]
    fn the_rule_is_written_once_and_removed_when_access_is_enabled() {
        let once = with_superuser_rule(HBA, "postgres", false);
        assert_eq!(with_superuser_rule(&once, "postgres", false), once);
        assert_eq!(with_superuser_rule(&once, "postgres", true), HBA);
    }

    #[test]
    fn ownership_goes_only_to_objects_made_after_initdb() {
        let statement = transfer_ownership_statement("app");
        assert!(statement.contains("oid >= 16384"));
        assert!(statement.contains("'app'"));
        // Owned sequences follow their table; a direct ALTER SEQUENCE would fail.
        assert!(statement.contains("c.relkind = 'S' AND d.deptype IN ('a', 'i')"));
    }

    #[test]
    fn names_and_passwords_are_quoted() {
        assert_eq!(identifier("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(literal("it's"), "'it''s'");
        assert!(unlogged(&["ALTER ROLE x PASSWORD 'p'".into()]).starts_with("SET log_statement = 'none'"));
    }
}
