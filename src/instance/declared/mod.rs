//! Declared roles and databases (issue 23, `spec.roles`, `spec.databases`), kept by the agent of
//! the primary: in the background (a pass visits every database), when the declarations change
//! and every [`KEEP_INTERVAL`] (so that drift is put back), each object on its own so that one
//! that fails is reported and the others still go ahead. Removing an entry from the spec leaves
//! the object as it is; only `ensure: absent` removes one, and a removed role's objects go to the
//! application's role first (a removed database is dropped with its data: that is what absent
//! means for it). Passwords come from Secrets, read through the [`SecretReader`] on every pass
//! (a rotated Secret takes effect within one interval) and set only when the stored verifier
//! does not match (see [`crate::instance::scram`]).

pub mod plan;

use crate::api::roles::{Declarations, DeclaredObjectsStatus, ObjectState, ObjectStatus, RoleSpec};
use crate::instance::roles::{connect, detail, run, unlogged, KeepRolesError, STATEMENT_TIMEOUT};
use crate::instance::{InstanceConfig, SecretReader};
use plan::{ObservedRole, Statement};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// How often a primary puts declared objects back when nothing changed.
pub const KEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Longest message kept per object (server messages can be long).
const MAX_MESSAGE_LENGTH: usize = 512;

async fn query(
    client: &Client,
    step: &'static str,
    sql: &str,
    parameters: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, String> {
    match tokio::time::timeout(STATEMENT_TIMEOUT, client.query(sql, parameters)).await {
        Ok(Ok(rows)) => Ok(rows),
        Ok(Err(error)) => Err(format!("{step}: {}", detail(&error))),
        Err(_) => Err(format!("{step}: no answer within {STATEMENT_TIMEOUT:?}")),
    }
}

async fn execute(client: &Client, statements: &[Statement]) -> Result<(), String> {
    for statement in statements {
        let sql = if statement.secret { unlogged(std::slice::from_ref(&statement.sql)) } else { statement.sql.clone() };
        let step = if statement.secret { "setting a password" } else { "running a statement" };
        run(client, step, &sql).await.map_err(|error| match error {
            // Never the statement of a secret one: only the server's message.
            KeepRolesError::Statement { detail, .. } if statement.secret => detail,
            KeepRolesError::Statement { detail, .. } => format!("{}: {detail}", statement.sql),
            other => other.to_string(),
        })?;
    }
    Ok(())
}

async fn observed_roles(client: &Client, names: &[String]) -> Result<BTreeMap<String, ObservedRole>, String> {
    let sql = "SELECT r.rolname::text, r.rolcanlogin, r.rolcreatedb, r.rolconnlimit, \
        (r.rolsuper OR r.rolcreaterole OR r.rolreplication OR r.rolbypassrls), r.rolpassword, \
        ARRAY(SELECT DISTINCT g.rolname::text FROM pg_catalog.pg_auth_members m \
              JOIN pg_catalog.pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid) \
        FROM pg_catalog.pg_authid r WHERE r.rolname = ANY($1)";
    let rows = query(client, "reading the roles", sql, &[&names]).await?;
    Ok(rows
        .iter()
        .map(|row| {
            let role = ObservedRole {
                login: row.get(1),
                create_database: row.get(2),
                connection_limit: row.get(3),
                elevated: row.get(4),
                password_verifier: row.get(5),
                member_of: row.get::<_, Vec<String>>(6).into_iter().collect(),
            };
            (row.get(0), role)
        })
        .collect())
}

async fn password_of(role: &RoleSpec, secrets: &SecretReader) -> Result<Option<String>, String> {
    let Some(secret) = &role.password_secret else { return Ok(None) };
    let key = secret.key_or_default();
    match secrets.read(&secret.name, key).await {
        Ok(Some(password)) if !password.is_empty() => Ok(Some(password)),
        Ok(_) => {
            Err(format!("Secret {:?} has no key {key:?} (or it is empty): the password is left as it is", secret.name))
        }
        Err(error) => Err(format!("reading Secret {:?}: {error}: the password is left as it is", secret.name)),
    }
}

/// The outcome of one object, recorded once (its first failure wins).
#[derive(Default)]
struct Outcomes(BTreeMap<String, Result<(), String>>);

impl Outcomes {
    fn record(&mut self, name: &str, outcome: Result<(), String>) {
        let entry = self.0.entry(name.to_string()).or_insert(Ok(()));
        if entry.is_ok() {
            *entry = outcome;
        }
    }

    fn status(&self, name: &str, present: bool) -> ObjectStatus {
        match self.0.get(name) {
            Some(Err(message)) => {
                let mut message = message.clone();
                if message.len() > MAX_MESSAGE_LENGTH {
                    let mut cut = MAX_MESSAGE_LENGTH;
                    while !message.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    message.truncate(cut);
                }
                ObjectStatus { name: name.into(), state: ObjectState::Failed, message: Some(message) }
            }
            _ => ObjectStatus {
                name: name.into(),
                state: if present { ObjectState::Present } else { ObjectState::Absent },
                message: None,
            },
        }
    }
}

/// One pass over `declarations` on the local primary (see the module documentation).
pub async fn keep_declared(
    config: &InstanceConfig,
    declarations: &Declarations,
    secrets: &SecretReader,
) -> DeclaredObjectsStatus {
    let mut roles = Outcomes::default();
    let mut databases = Outcomes::default();
    if let Err(error) = keep_all(config, declarations, secrets, &mut roles, &mut databases).await {
        // Nothing could be read: every object is reported with why.
        for role in &declarations.roles {
            roles.record(&role.name, Err(error.clone()));
        }
        for database in &declarations.databases {
            databases.record(&database.name, Err(error.clone()));
        }
    }
    DeclaredObjectsStatus {
        roles: declarations.roles.iter().map(|role| roles.status(&role.name, role.present())).collect(),
        databases: declarations
            .databases
            .iter()
            .map(|database| databases.status(&database.name, database.present()))
            .collect(),
        declarations: Some(declarations.fingerprint()),
    }
}

async fn keep_all(
    config: &InstanceConfig,
    declarations: &Declarations,
    secrets: &SecretReader,
    roles: &mut Outcomes,
    databases: &mut Outcomes,
) -> Result<(), String> {
    let client = connect(config, &config.superuser, "postgres").await.map_err(|error| error.to_string())?;
    let names: Vec<String> = declarations.roles.iter().map(|role| role.name.clone()).collect();
    let observed = observed_roles(&client, &names).await?;
    let present: Vec<&RoleSpec> = declarations.roles.iter().filter(|role| role.present()).collect();
    for role in &present {
        let password = match password_of(role, secrets).await {
            Ok(password) => password,
            Err(message) => {
                roles.record(&role.name, Err(message));
                None
            }
        };
        let statements = plan::role_statements(role, observed.get(&role.name), password.as_deref());
        roles.record(&role.name, execute(&client, &statements).await);
    }
    // Memberships once every declared role exists (one may name another declared later).
    let no_memberships = BTreeSet::new();
    for role in &present {
        let member_of = observed.get(&role.name).map_or(&no_memberships, |observed| &observed.member_of);
        roles.record(&role.name, execute(&client, &plan::membership_statements(role, member_of)).await);
    }
    keep_databases(config, &client, declarations, databases).await?;
    for database in &declarations.pooled_databases {
        let outcome = keep_auth_function(config, database)
            .await
            .map_err(|error| format!("the pooler's auth_query function in database {database:?}: {error}"));
        roles.record(crate::api::pooler::POOLER_ROLE, outcome);
    }
    for role in declarations.roles.iter().filter(|role| !role.present() && observed.contains_key(&role.name)) {
        roles.record(&role.name, remove_role(config, &client, &role.name, &declarations.application_user).await);
    }
    Ok(())
}

async fn keep_databases(
    config: &InstanceConfig,
    client: &Client,
    declarations: &Declarations,
    databases: &mut Outcomes,
) -> Result<(), String> {
    let names: Vec<String> = declarations.databases.iter().map(|database| database.name.clone()).collect();
    let sql = "SELECT datname::text, pg_catalog.pg_get_userbyid(datdba)::text FROM pg_catalog.pg_database WHERE datname = ANY($1)";
    let owners: BTreeMap<String, String> = query(client, "reading the databases", sql, &[&names])
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    for database in &declarations.databases {
        let outcome = if database.present() {
            let owner = owners.get(&database.name).map(String::as_str);
            let statements = plan::database_statements(database, owner, &declarations.application_user);
            match execute(client, &statements).await {
                Ok(()) => keep_extensions(config, database).await,
                Err(error) => Err(error),
            }
        } else if owners.contains_key(&database.name) {
            execute(client, &[plan::database_removal(&database.name)]).await
        } else {
            Ok(())
        };
        databases.record(&database.name, outcome);
    }
    Ok(())
}

async fn keep_extensions(config: &InstanceConfig, database: &crate::api::roles::DatabaseSpec) -> Result<(), String> {
    if database.extensions.is_empty() {
        return Ok(());
    }
    let inside = connect(config, &config.superuser, &database.name).await.map_err(|error| error.to_string())?;
    let names =
        |rows: Vec<tokio_postgres::Row>| rows.iter().map(|row| row.get::<_, String>(0)).collect::<BTreeSet<_>>();
    let installed = names(
        query(&inside, "reading the extensions", "SELECT extname::text FROM pg_catalog.pg_extension", &[]).await?,
    );
    // With each, the schema its control file fixes (None: relocatable, made in `public`).
    let sql = "SELECT e.name::text, v.schema::text FROM pg_catalog.pg_available_extensions e \
        LEFT JOIN pg_catalog.pg_available_extension_versions v ON v.name = e.name AND v.version = e.default_version";
    let available: BTreeMap<String, Option<String>> = query(&inside, "reading the available extensions", sql, &[])
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let statements = plan::extension_statements(database, &installed, &available)?;
    execute(&inside, &statements).await
}

/// Makes the pooler's `auth_query` function in `database` unless it is there as made and owned,
/// with its schema, by the superuser (see [`crate::api::pooler::AuthSchema`]): no catalog write
/// in a steady pass.
async fn keep_auth_function(config: &InstanceConfig, database: &str) -> Result<(), String> {
    use crate::api::pooler::{auth_function_check, auth_function_statements, AuthSchema};
    let inside = connect(config, &config.superuser, database).await.map_err(|error| error.to_string())?;
    let rows = query(&inside, "reading the pooler's function", &auth_function_check(), &[]).await?;
    let found = AuthSchema::from_check(rows.first().map(|row| (row.get(0), row.get(1))));
    if found == AuthSchema::Foreign {
        tracing::warn!(database, "schema dbservice_pooler is not the superuser's: dropped and made again");
    }
    let statements: Vec<plan::Statement> =
        auth_function_statements(found).into_iter().map(|sql| plan::Statement { sql, secret: false }).collect();
    execute(&inside, &statements).await
}

/// Hands `role`'s objects to `heir` and revokes its privileges in every database, then drops it.
async fn remove_role(config: &InstanceConfig, client: &Client, role: &str, heir: &str) -> Result<(), String> {
    let sql = "SELECT datname::text FROM pg_catalog.pg_database WHERE datallowconn ORDER BY 1";
    let every: Vec<String> =
        query(client, "listing the databases", sql, &[]).await?.iter().map(|row| row.get(0)).collect();
    let (each_database, last) = plan::role_removal(role, heir);
    for database in every {
        let inside = connect(config, &config.superuser, &database).await.map_err(|error| error.to_string())?;
        execute(&inside, &each_database).await.map_err(|error| format!("in database {database:?}: {error}"))?;
    }
    execute(client, &[last]).await
}

/// Runs [`keep_declared`] on a ready primary: when the declarations change, and every
/// [`KEEP_INTERVAL`] after the last pass; keeps the last outcome for the report.
#[derive(Debug, Default)]
pub struct DeclaredKeeper {
    /// The declarations and their fingerprint, computed once per change (not on every step).
    wanted: Option<(Declarations, String)>,
    running: Option<(String, tokio::task::JoinHandle<DeclaredObjectsStatus>)>,
    finished_at: Option<Instant>,
    status: Option<DeclaredObjectsStatus>,
}

impl DeclaredKeeper {
    /// The declarations as the API has them now (None: unknown, the last ones stay).
    pub fn want(&mut self, declarations: Option<&Declarations>) {
        if let Some(declarations) = declarations {
            if self.wanted.as_ref().map(|(wanted, _)| wanted) != Some(declarations) {
                self.wanted = Some((declarations.clone(), declarations.fingerprint()));
            }
        }
    }

    /// Called on every step of a ready primary whose own roles are kept: starts a pass when one
    /// is due, or collects the finished one.
    pub fn keep(&mut self, config: &InstanceConfig, secrets: &SecretReader) {
        let Some((_, fingerprint)) = &self.wanted else { return };
        let fingerprint = fingerprint.clone();
        if let Some((running_for, task)) = &self.running {
            if !task.is_finished() {
                return;
            }
            let running_for = running_for.clone();
            let (_, task) = self.running.take().expect("checked");
            use futures::FutureExt;
            match task.now_or_never() {
                Some(Ok(status)) => {
                    let failed = status
                        .roles
                        .iter()
                        .chain(&status.databases)
                        .filter(|object| object.state == ObjectState::Failed)
                        .count();
                    if failed > 0 {
                        tracing::warn!(instance = %config.name, failed, "some declared roles or databases are not as declared (see the status)");
                    }
                    self.status = Some(status);
                }
                Some(Err(error)) => {
                    tracing::warn!(instance = %config.name, %error, "keeping the declared roles and databases stopped")
                }
                None => {}
            }
            self.finished_at = Some(Instant::now());
            if running_for == fingerprint {
                return;
            }
        }
        let Some((wanted, _)) = &self.wanted else { return };
        if wanted.is_empty() && self.status.is_none() {
            return;
        }
        let changed =
            self.status.as_ref().and_then(|status| status.declarations.as_deref()) != Some(fingerprint.as_str());
        let due = self.finished_at.is_none_or(|at| at.elapsed() >= KEEP_INTERVAL);
        if changed || due {
            let (config, secrets, wanted) = (config.clone(), secrets.clone(), wanted.clone());
            let task = tokio::spawn(async move { keep_declared(&config, &wanted, &secrets).await });
            self.running = Some((fingerprint, task));
        }
    }

    /// The outcome of the last pass (None before the first, or with nothing ever declared).
    pub fn status(&self) -> Option<&DeclaredObjectsStatus> {
        self.status.as_ref()
    }
}
