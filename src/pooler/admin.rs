//! PgBouncer's admin console, over its unix socket in the pod: the commands the agent runs
//! (PAUSE, RESUME, RELOAD, RECONNECT) and the SHOW views its metrics come from. One short
//! connection per command, each bounded in time.

use crate::api::pooler::{POOLER_ADMIN, POOLER_ROLE, RUN_DIRECTORY};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_postgres::{NoTls, SimpleQueryMessage};

/// Longest a command other than PAUSE may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// A command that failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminCommandError {
    /// No connection to the admin console.
    #[error("connecting to pgbouncer's admin console ({pool}): {detail}")]
    Connect { pool: &'static str, detail: String },
    /// The command failed.
    #[error("{command} on pgbouncer ({pool}): {detail}")]
    Command { pool: &'static str, command: String, detail: String },
    /// No answer in time.
    #[error("{command} on pgbouncer ({pool}): no answer within {timeout:?}")]
    Timeout { pool: &'static str, command: String, timeout: Duration },
}

/// One of the pod's PgBouncers: `rw` or `ro`, and its port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool {
    /// `rw` or `ro`.
    pub name: &'static str,
    /// Its port (the socket is `.s.PGSQL.<port>` in its directory).
    pub port: u16,
}

/// Logs in through `pool` as the pooler role to `database` and runs a query on the server
/// behind it, within `timeout`.
pub async fn login(pool: Pool, password: &str, database: &str, timeout: Duration) -> Result<(), AdminCommandError> {
    let work = async {
        let (client, connection) =
            socket_config(pool, POOLER_ROLE, password, database, timeout)
                .connect(NoTls)
                .await
                .map_err(|error| AdminCommandError::Connect { pool: pool.name, detail: describe(&error) })?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client.simple_query("SELECT 1").await.map(|_| ()).map_err(|error| AdminCommandError::Command {
            pool: pool.name,
            command: "SELECT 1".into(),
            detail: describe(&error),
        })
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| AdminCommandError::Timeout {
        pool: pool.name,
        command: "a login".into(),
        timeout,
    })?
}

/// A connection to `pool` over its unix socket in the pod (no TLS there: PgBouncer requires it
/// of network clients only).
///
/// No `options` (see [`crate::instance::session`]): these sessions reach PgBouncer, not
/// PostgreSQL. The admin console runs no SQL, PgBouncer refuses startup parameters it does not
/// know, and the login check runs `SELECT 1` as the pooler's unprivileged role.
fn socket_config(pool: Pool, user: &str, password: &str, database: &str, timeout: Duration) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host_path(format!("{RUN_DIRECTORY}/{}", pool.name))
        .port(pool.port)
        .user(user)
        .password(password)
        .dbname(database)
        .connect_timeout(timeout);
    config
}

fn describe(error: &tokio_postgres::Error) -> String {
    error.as_db_error().map_or_else(|| error.to_string(), |db| db.message().to_string())
}

/// Runs `command` on `pool`'s admin console within `timeout`; the rows, each column by name.
pub async fn run(
    pool: Pool,
    password: &str,
    command: &str,
    timeout: Duration,
) -> Result<Vec<BTreeMap<String, String>>, AdminCommandError> {
    let work = async {
        let (client, connection) = socket_config(pool, POOLER_ADMIN, password, "pgbouncer", COMMAND_TIMEOUT)
            .connect(NoTls)
            .await
            .map_err(|error| AdminCommandError::Connect { pool: pool.name, detail: error.to_string() })?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let messages = client.simple_query(command).await.map_err(|error| AdminCommandError::Command {
            pool: pool.name,
            command: command.into(),
            detail: error.as_db_error().map_or_else(|| error.to_string(), |db| db.message().to_string()),
        })?;
        Ok(messages
            .iter()
            .filter_map(|message| match message {
                SimpleQueryMessage::Row(row) => Some(
                    row.columns()
                        .iter()
                        .enumerate()
                        .map(|(index, column)| (column.name().to_string(), row.get(index).unwrap_or("").to_string()))
                        .collect(),
                ),
                _ => None,
            })
            .collect())
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| AdminCommandError::Timeout {
        pool: pool.name,
        command: command.into(),
        timeout,
    })?
}
