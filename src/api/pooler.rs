//! `spec.pooler` (issue 25): PgBouncer in front of the database, a field of the DatabaseService
//! rather than a resource of its own. The pooler lives and dies with its database, is validated by
//! the same function, and its pause around a switchover is decided by the same pass that decides
//! the switchover: a separate resource would need a second controller to agree with the first on
//! when the primary moves.
//!
//! Each pooler pod runs two PgBouncers, read-write ([`READ_WRITE_PORT`], to the primary) and
//! read-only ([`READ_ONLY_PORT`], to the standbys' Service), and the pooler agent (`dbservice-operator
//! pooler run`) beside them: it points the read-write PgBouncer at the current primary, pauses and
//! resumes it around a switchover when the operator asks, and exports the pools' metrics.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The default of the operator's `--pooler-image`.
pub const DEFAULT_POOLER_IMAGE: &str = "ghcr.io/cloudnative-pg/pgbouncer:1.24.1";
/// The role PgBouncer's `auth_query` runs as: it may log in and run one function, nothing else.
pub const POOLER_ROLE: &str = "dbservice_pooler";
/// PgBouncer's own administrator (its admin console only; not a PostgreSQL role).
pub const POOLER_ADMIN: &str = "dbservice_pooler_admin";
/// The schema of the authentication function, in every pooled database. The name is the
/// operator's: the API declares no schema, so no validation can reserve it; instead the agent
/// drops (CASCADE) a schema of this name that is not the superuser's (see [`AuthSchema`]).
pub const POOLER_SCHEMA: &str = "dbservice_pooler";
/// `auth_query`: a SECURITY DEFINER function that returns the verifier of a role that may log in
/// and is neither a superuser nor a replication role (the pooler never logs those in).
pub const AUTH_QUERY: &str = "SELECT usename, passwd FROM dbservice_pooler.user_password($1)";
/// Port of the read-write PgBouncer in the pod.
pub const READ_WRITE_PORT: i32 = 6432;
/// Port of the read-only PgBouncer in the pod.
pub const READ_ONLY_PORT: i32 = 6433;
/// Port of the pooler agent's plain HTTP server: /metrics and /healthz (nothing secret).
pub const POOLER_AGENT_PORT: i32 = 9127;
/// Port of the pooler agent's HTTPS server: the operator's POST /pause, with the token of Secret
/// NAME-pooler, over TLS with the database's server certificate (a sniffer on the pod network
/// must not learn the token).
pub const POOLER_CONTROL_PORT: i32 = 9128;
/// Where the pooler agent container mounts its keys of Secret NAME-pooler as files
/// ([`ADMIN_PASSWORD_KEY`], [`AUTH_PASSWORD_KEY`], [`CONTROL_TOKEN_KEY`]): no credential is in a
/// pooler pod's environment.
pub const AGENT_SECRET_DIRECTORY: &str = "/etc/pooler-agent-secret";
/// Where the pooler agent writes PgBouncer's configuration and PgBouncer puts its sockets.
pub const RUN_DIRECTORY: &str = "/run/pgbouncer";
/// Where a pooler pod mounts the database's server certificate (`tls.crt`, `tls.key`).
pub const TLS_DIRECTORY: &str = "/etc/pgbouncer-tls";
/// Where a pooler pod mounts the database's CA (`ca.crt`).
pub const CA_DIRECTORY: &str = "/etc/pgbouncer-ca";
/// Keys of Secret NAME-pooler.
pub const AUTH_PASSWORD_KEY: &str = "auth-password";
/// See [`AUTH_PASSWORD_KEY`].
pub const ADMIN_PASSWORD_KEY: &str = "admin-password";
/// See [`AUTH_PASSWORD_KEY`]: the bearer token of the agent's /pause.
pub const CONTROL_TOKEN_KEY: &str = "control-token";

/// Default pooler pods.
pub const DEFAULT_INSTANCES: i32 = 2;
/// Most pooler pods.
pub const MAX_INSTANCES: i32 = 16;
/// Default server connections per user and database pair (`default_pool_size`).
pub const DEFAULT_POOL_SIZE: u32 = 20;
/// Largest `defaultPoolSize`.
pub const MAX_POOL_SIZE: u32 = 1000;
/// Default client connections per PgBouncer (`max_client_conn`).
pub const DEFAULT_MAX_CLIENT_CONNECTIONS: u32 = 1000;
/// Largest `maxClientConnections` (each is a file descriptor of the pod).
pub const MAX_CLIENT_CONNECTIONS: u32 = 50_000;
/// Most `parameters`.
pub const MAX_PARAMETERS: usize = 32;
/// Longest pause of the read-write PgBouncer for a switchover, whatever happens: the operator's
/// switchover timeout is shorter, and clients that waited this long are better served by an error
/// than by more waiting.
pub const MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(60);

/// PgBouncer parameters `spec.pooler.parameters` may set (PgBouncer 1.18 and later), with the
/// kind of value each takes. What is not listed is the operator's (listening, authentication,
/// TLS, files) or `spec.pooler`'s own field.
pub const ALLOWED_PARAMETERS: &[(&str, ParameterKind)] = &[
    ("application_name_add_host", ParameterKind::Boolean),
    ("autodb_idle_timeout", ParameterKind::Seconds),
    ("client_idle_timeout", ParameterKind::Seconds),
    ("client_login_timeout", ParameterKind::Seconds),
    ("disable_pqexec", ParameterKind::Boolean),
    ("idle_transaction_timeout", ParameterKind::Seconds),
    ("log_connections", ParameterKind::Boolean),
    ("log_disconnections", ParameterKind::Boolean),
    ("log_pooler_errors", ParameterKind::Boolean),
    ("log_stats", ParameterKind::Boolean),
    ("max_db_connections", ParameterKind::Count),
    ("max_user_connections", ParameterKind::Count),
    ("min_pool_size", ParameterKind::Count),
    ("pkt_buf", ParameterKind::Count),
    ("query_timeout", ParameterKind::Seconds),
    ("query_wait_timeout", ParameterKind::Seconds),
    ("reserve_pool_size", ParameterKind::Count),
    ("reserve_pool_timeout", ParameterKind::Seconds),
    ("server_check_delay", ParameterKind::Seconds),
    ("server_check_query", ParameterKind::Text),
    ("server_connect_timeout", ParameterKind::Seconds),
    ("server_fast_close", ParameterKind::Boolean),
    ("server_idle_timeout", ParameterKind::Seconds),
    ("server_lifetime", ParameterKind::Seconds),
    ("server_login_retry", ParameterKind::Seconds),
    ("server_reset_query", ParameterKind::Text),
    ("server_reset_query_always", ParameterKind::Boolean),
    ("server_round_robin", ParameterKind::Boolean),
    ("stats_period", ParameterKind::Seconds),
    ("tcp_keepalive", ParameterKind::Boolean),
    ("tcp_keepidle", ParameterKind::Seconds),
    ("verbose", ParameterKind::Count),
];

/// The value a PgBouncer parameter takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParameterKind {
    /// 0 or 1.
    Boolean,
    /// A whole number of seconds, or a decimal one (`0.5`).
    Seconds,
    /// A whole number.
    Count,
    /// One line of text (a query).
    Text,
}

/// When a server connection goes back to the pool.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    /// When the client disconnects (every feature of a session works).
    Session,
    /// After each transaction (the default: the most clients per server connection; session
    /// state such as SET or advisory locks does not last beyond a transaction).
    #[default]
    Transaction,
    /// After each statement (multi-statement transactions are refused).
    Statement,
}

impl PoolMode {
    /// PgBouncer's name of it.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

/// `spec.pooler`: PgBouncer for the database (see the module documentation).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolerSpec {
    /// Pooler pods (default 2), spread across nodes, at most one unavailable at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16))]
    pub instances: Option<i32>,
    /// `transaction` (default), `session` or `statement`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_mode: Option<PoolMode>,
    /// Server connections per user and database pair, per pod (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub default_pool_size: Option<u32>,
    /// Client connections each PgBouncer accepts (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 50000))]
    pub max_client_connections: Option<u32>,
    /// A read-only pool to the standbys, Service NAME-pooler-ro (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Other PgBouncer parameters (see the manual's pooling page for the ones allowed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
    /// PgBouncer's image (default: the operator's `--pooler-image`). It must have `pgbouncer`
    /// on its PATH and `/bin/sh`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Resources of each PgBouncer container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
}

impl PoolerSpec {
    /// `instances` or its default.
    pub fn instances_or_default(&self) -> i32 {
        self.instances.unwrap_or(DEFAULT_INSTANCES)
    }

    /// `poolMode` or its default.
    pub fn pool_mode_or_default(&self) -> PoolMode {
        self.pool_mode.unwrap_or_default()
    }

    /// `defaultPoolSize` or its default.
    pub fn pool_size_or_default(&self) -> u32 {
        self.default_pool_size.unwrap_or(DEFAULT_POOL_SIZE)
    }

    /// `maxClientConnections` or its default.
    pub fn max_client_connections_or_default(&self) -> u32 {
        self.max_client_connections.unwrap_or(DEFAULT_MAX_CLIENT_CONNECTIONS)
    }

    /// Whether the read-only pool runs.
    pub fn read_only_enabled(&self) -> bool {
        self.read_only.unwrap_or(true)
    }
}

/// `status.pooler`: what runs of `spec.pooler`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolerStatus {
    /// Pooler pods asked for.
    pub instances: i32,
    /// Pooler pods ready.
    pub ready_instances: i32,
}

/// The kind of value `parameter` takes, None when `spec.pooler.parameters` may not set it.
pub fn parameter_kind(parameter: &str) -> Option<ParameterKind> {
    ALLOWED_PARAMETERS.iter().find(|(name, _)| *name == parameter).map(|(_, kind)| *kind)
}

/// What the primary's agent finds of schema [`POOLER_SCHEMA`] in a pooled database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthSchema {
    /// No such schema.
    Absent,
    /// Owned, with every function in it, by the agent's superuser; `current`: the function is
    /// there as made (see [`auth_function_check`]).
    Ours {
        /// Whether `user_password` is as made.
        current: bool,
    },
    /// The schema or a function in it is owned by another role: the application, which owns its
    /// databases, made it first (an impostor whose `user_password` would hand PgBouncer
    /// verifiers of its choosing), or a superuser of before issue 22.
    Foreign,
}

/// The query that tells the [`AuthSchema`] in a database, run as the superuser that keeps it:
/// no row when the schema is absent, else whether the schema and its functions are the session
/// user's, and whether `user_password` is as made (SECURITY DEFINER, search_path pinned,
/// executable by [`POOLER_ROLE`] and not by PUBLIC).
pub fn auth_function_check() -> String {
    format!(
        "SELECT n.nspowner = me.oid AND NOT EXISTS (SELECT FROM pg_catalog.pg_proc f \
           WHERE f.pronamespace = n.oid AND f.proowner <> me.oid), \
         EXISTS (SELECT FROM pg_catalog.pg_proc p WHERE p.pronamespace = n.oid AND p.proname = 'user_password' \
           AND p.proowner = me.oid AND p.prosecdef AND p.proretset \
           AND p.proconfig = ARRAY['search_path=pg_catalog, pg_temp'] \
           AND pg_catalog.has_function_privilege('{POOLER_ROLE}', p.oid, 'EXECUTE') \
           AND NOT pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')) \
         FROM pg_catalog.pg_namespace n, pg_catalog.pg_roles me \
         WHERE n.nspname = '{POOLER_SCHEMA}' AND me.rolname = current_user"
    )
}

impl AuthSchema {
    /// From the row of [`auth_function_check`] (None: no row).
    pub fn from_check(row: Option<(bool, bool)>) -> Self {
        match row {
            None => Self::Absent,
            Some((true, current)) => Self::Ours { current },
            Some((false, _)) => Self::Foreign,
        }
    }
}

/// SQL the primary's agent runs in a pooled database (as the superuser) to make the schema and
/// the SECURITY DEFINER function of [`AUTH_QUERY`], executable by [`POOLER_ROLE`] alone; nothing
/// when they are there as made. One transaction: a schema dropped is made again before the
/// application, which owns the database, can make its own in between. The name is the
/// operator's: a schema someone else made under it is dropped with what it holds (CASCADE).
pub fn auth_function_statements(found: AuthSchema) -> Vec<String> {
    if found == (AuthSchema::Ours { current: true }) {
        return Vec::new();
    }
    let mut statements = vec!["BEGIN".to_string()];
    match found {
        // Made anew, not replaced: a set-returning function cannot replace the single-record one
        // of before (which answered an unknown or refused login with a row of NULLs, and
        // PgBouncer with "bouncer config error" instead of an authentication failure).
        AuthSchema::Ours { .. } => {
            statements.push(format!("DROP FUNCTION IF EXISTS {POOLER_SCHEMA}.user_password(text)"))
        }
        // Never `IF NOT EXISTS`: a schema the application made first would be kept.
        AuthSchema::Absent => statements.push(format!("CREATE SCHEMA {POOLER_SCHEMA}")),
        AuthSchema::Foreign => {
            statements.push(format!("DROP SCHEMA {POOLER_SCHEMA} CASCADE"));
            statements.push(format!("CREATE SCHEMA {POOLER_SCHEMA}"));
        }
    }
    statements.extend([
        format!("REVOKE ALL ON SCHEMA {POOLER_SCHEMA} FROM PUBLIC"),
        format!(
            "CREATE FUNCTION {POOLER_SCHEMA}.user_password(role_name text) \
             RETURNS TABLE (usename name, passwd text) LANGUAGE sql STABLE SECURITY DEFINER \
             SET search_path = pg_catalog, pg_temp AS $function$ \
             SELECT rolname, rolpassword::text FROM pg_catalog.pg_authid \
             WHERE rolname = role_name AND rolcanlogin AND NOT rolsuper AND NOT rolreplication \
             AND rolname <> '{POOLER_ROLE}' AND (rolvaliduntil IS NULL OR rolvaliduntil > pg_catalog.now()) $function$"
        ),
        format!("REVOKE ALL ON FUNCTION {POOLER_SCHEMA}.user_password(text) FROM PUBLIC"),
        format!("GRANT USAGE ON SCHEMA {POOLER_SCHEMA} TO {POOLER_ROLE}"),
        format!("GRANT EXECUTE ON FUNCTION {POOLER_SCHEMA}.user_password(text) TO {POOLER_ROLE}"),
        "COMMIT".to_string(),
    ]);
    statements
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_two_pods_in_transaction_mode_with_a_read_only_pool() {
        let pooler = PoolerSpec::default();
        assert_eq!(pooler.instances_or_default(), 2);
        assert_eq!(pooler.pool_mode_or_default().as_str(), "transaction");
        assert_eq!((pooler.pool_size_or_default(), pooler.max_client_connections_or_default()), (20, 1000));
        assert!(pooler.read_only_enabled());
        let parsed: PoolerSpec = serde_json::from_value(serde_json::json!({"poolMode": "session"})).unwrap();
        assert_eq!(parsed.pool_mode, Some(PoolMode::Session));
    }

    #[test]
    fn only_listed_parameters_have_a_kind() {
        assert_eq!(parameter_kind("server_lifetime"), Some(ParameterKind::Seconds));
        assert_eq!(parameter_kind("auth_type"), None);
        assert_eq!(parameter_kind("listen_port"), None);
        let mut names: Vec<&str> = ALLOWED_PARAMETERS.iter().map(|(name, _)| *name).collect();
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count, "listed once each");
    }

    #[test]
    fn the_auth_function_never_returns_a_superuser_or_replication_role() {
        let sql = auth_function_statements(AuthSchema::Absent).join(";\n");
        assert!(sql.contains("SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS"));
        assert!(sql.contains("pg_catalog.now()") && sql.contains("FROM pg_catalog.pg_authid"));
        assert!(sql.contains("NOT rolsuper AND NOT rolreplication"));
        assert!(sql.contains("FROM PUBLIC"));
        assert!(sql.contains(&format!("TO {POOLER_ROLE}")));
    }

    #[test]
    fn a_schema_or_function_owned_by_another_role_is_dropped_and_made_again() {
        let check = auth_function_check();
        assert!(check.contains("n.nspowner = me.oid") && check.contains("f.proowner <> me.oid"), "{check}");
        assert!(check.contains("p.proowner = me.oid") && check.contains("me.rolname = current_user"), "{check}");
        assert_eq!(AuthSchema::from_check(Some((false, true))), AuthSchema::Foreign, "as made, but not ours");
        assert_eq!(AuthSchema::from_check(Some((true, true))), AuthSchema::Ours { current: true });
        assert_eq!(AuthSchema::from_check(None), AuthSchema::Absent);
        assert!(auth_function_statements(AuthSchema::Ours { current: true }).is_empty());

        let impostor = auth_function_statements(AuthSchema::Foreign);
        assert_eq!(impostor[..3], ["BEGIN", "DROP SCHEMA dbservice_pooler CASCADE", "CREATE SCHEMA dbservice_pooler"]);
        assert_eq!(impostor.last().map(String::as_str), Some("COMMIT"));
        let absent = auth_function_statements(AuthSchema::Absent);
        assert!(absent.iter().all(|sql| !sql.contains("IF NOT EXISTS") && !sql.starts_with("DROP")), "{absent:?}");
        assert!(absent.contains(&"CREATE SCHEMA dbservice_pooler".to_string()));
        let repaired = auth_function_statements(AuthSchema::Ours { current: false });
        assert!(repaired
            .iter()
            .all(|sql| !sql.contains("SCHEMA dbservice_pooler CASCADE") && sql != "CREATE SCHEMA dbservice_pooler"));
        assert!(repaired
            .iter()
            .any(|sql| sql.starts_with("DROP FUNCTION IF EXISTS dbservice_pooler.user_password(text)")));
        assert!(repaired.iter().any(|sql| sql.starts_with("CREATE FUNCTION")));
        // No row, not a row of NULLs, for a login it refuses; and the check asks for that form.
        assert!(repaired.iter().any(|sql| sql.contains("RETURNS TABLE (usename name, passwd text)")));
        assert!(check.contains("p.proretset"), "{check}");
    }
}
