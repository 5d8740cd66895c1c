//! One local PostgreSQL server: the agent starts it as a child in its own process group,
//! observes it over the unix socket with one held connection, promotes, re-points and stops it.
//!
//! Why tokio-postgres rather than `psql` subprocesses: the health check runs every tick, and a held
//! connection costs one round trip where psql costs a fork/exec plus a backend fork each time;
//! errors arrive typed (SQLSTATE) instead of as text to parse; timeouts are plain
//! `tokio::time::timeout`; no value goes through a shell or an argument list. Over the unix
//! socket it needs no TLS, so it adds no crypto stack to the static binary.

use crate::instance::archiving::ArchiverSample;
use crate::instance::owned_settings::{safe_name, FileSetting, PutBack};
use crate::instance::session::{self, Sql};
use crate::instance::InstanceConfig;
use crate::lsn::Lsn;
use chrono::{DateTime, Utc};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio_postgres::{Client, NoTls};

/// Starting, stopping or talking to the local PostgreSQL failed.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
    /// The server could not be spawned.
    #[error("start postgres: {0}")]
    Start(std::io::Error),
    /// A query failed.
    #[error("query local postgres: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// No connection (the server is down or not ready).
    #[error("connect to local postgres: {0}")]
    Connect(String),
    /// A query or connection took too long.
    #[error("local postgres did not answer within {0:?}")]
    Timeout(Duration),
    /// A value PostgreSQL returned could not be read.
    #[error("read local postgres answer: {0}")]
    Answer(String),
}

/// What one health query saw.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// In recovery (a standby).
    pub in_recovery: bool,
    /// Primary: `pg_current_wal_lsn()`.
    pub current_lsn: Option<Lsn>,
    /// Standby: `pg_last_wal_receive_lsn()`.
    pub received_lsn: Option<Lsn>,
    /// Standby: `pg_last_wal_replay_lsn()`.
    pub replay_lsn: Option<Lsn>,
    /// Timeline (a primary's from its current WAL file; a standby's from its receiver or last restartpoint).
    pub timeline: u32,
    /// A WAL receiver is streaming.
    pub streaming: bool,
    /// Primary with `archive_mode` on: pg_stat_archiver.
    pub archiver: Option<ArchiverSample>,
}

/// The local server's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalState {
    /// No postmaster process.
    Down,
    /// The process runs but does not answer (starting, recovering, hung).
    NotReady(String),
    /// It answered.
    Ready(Sample),
}

const SAMPLE_QUERY: &str = "SELECT pg_catalog.pg_is_in_recovery(),
  CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL ELSE pg_catalog.pg_current_wal_lsn()::text END,
  pg_catalog.pg_last_wal_receive_lsn()::text,
  pg_catalog.pg_last_wal_replay_lsn()::text,
  CASE WHEN pg_catalog.pg_is_in_recovery()
       THEN coalesce((SELECT received_tli FROM pg_catalog.pg_stat_wal_receiver WHERE status = 'streaming'),
                     greatest((SELECT timeline_id FROM pg_catalog.pg_control_checkpoint()),
                              (SELECT min_recovery_end_timeline FROM pg_catalog.pg_control_recovery()),
                              (SELECT pg_catalog.max(('x' || pg_catalog.substr(name, 1, 8))::bit(32)::int) FROM pg_catalog.pg_ls_waldir()
                                WHERE name ~ '^[0-9A-F]{24}$')))
       ELSE ('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::int END,
  EXISTS (SELECT 1 FROM pg_catalog.pg_stat_wal_receiver WHERE status = 'streaming'),
  pg_catalog.current_setting('archive_mode') <> 'off',
  failed_count,
  last_failed_wal,
  (extract(epoch FROM last_failed_time) * 1000000)::bigint,
  last_archived_wal,
  (extract(epoch FROM last_archived_time) * 1000000)::bigint
FROM pg_catalog.pg_stat_archiver";

/// pg_stat_archiver from the sample row: on a primary with `archive_mode` on only (a standby does
/// not archive with `archive_mode = on`, and its view is stale).
fn archiver(row: &tokio_postgres::Row) -> Result<Option<ArchiverSample>, PostgresError> {
    let in_recovery: bool = row.try_get(0)?;
    let archive_mode_on: bool = row.try_get(6)?;
    if in_recovery || !archive_mode_on {
        return Ok(None);
    }
    let time = |column: usize| -> Result<Option<DateTime<Utc>>, PostgresError> {
        let micros: Option<i64> = row.try_get(column)?;
        micros
            .map(|micros| {
                DateTime::from_timestamp_micros(micros)
                    .ok_or_else(|| PostgresError::Answer(format!("pg_stat_archiver time out of range: {micros}")))
            })
            .transpose()
    };
    Ok(Some(ArchiverSample {
        failed_count: row.try_get(7)?,
        last_failed_wal: row.try_get(8)?,
        last_failed_time: time(9)?,
        last_archived_wal: row.try_get(10)?,
        last_archived_time: time(11)?,
    }))
}

/// A supervised PostgreSQL server.
pub struct Postgres {
    config: InstanceConfig,
    child: Option<Child>,
    client: Option<Client>,
}

fn lsn(text: Option<String>) -> Result<Option<Lsn>, PostgresError> {
    text.map(|text| text.parse().map_err(|error: crate::lsn::ParseLsnError| PostgresError::Answer(error.to_string())))
        .transpose()
}

/// A postmaster and each of its children, by pid (every PostgreSQL child calls setsid(), so the
/// postmaster's process group holds the postmaster alone).
pub fn server_processes(postmaster: u32) -> Vec<u32> {
    let children = std::fs::read_dir("/proc").into_iter().flatten().flatten().filter_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        // pid (comm) state ppid ...: comm may contain spaces, so split after the last ')'.
        let parent: u32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
        (parent == postmaster).then_some(pid)
    });
    std::iter::once(postmaster).chain(children).collect()
}

/// Sends `signal` to a postmaster and to each of its children ([`server_processes`]).
pub fn signal_server(postmaster: u32, signal: i32) {
    for pid in server_processes(postmaster) {
        let Ok(pid) = i32::try_from(pid) else { continue };
        // SAFETY: kill(2) only sends a signal; no memory is shared.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

impl Postgres {
    /// A handle for the server of `config` (not started).
    pub fn new(config: InstanceConfig) -> Self {
        Postgres { config, child: None, client: None }
    }

    /// Process id of the postmaster this agent started, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|child| child.id())
    }

    /// Whether the postmaster this agent started still runs (reaps it when it has exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(|child| child.try_wait()) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                self.client = None;
                false
            }
            None => false,
        }
    }

    /// Starts `postgres` on the data directory with the settings failover needs.
    pub fn start(&mut self) -> Result<(), PostgresError> {
        let config = &self.config;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&config.log_file)
            .map_err(PostgresError::Start)?;
        let mut command = Command::new(config.pg_bin.join("postgres"));
        command.arg("-D").arg(&config.pgdata).arg("-p").arg(config.port.to_string());
        // Server settings live in postgresql.auto.conf (standby::write_required_settings); only
        // where this server listens is given here.
        command.arg("-c").arg(format!("listen_addresses={}", config.listen_addresses));
        command.arg("-c").arg(format!("unix_socket_directories={}", config.socket_dir.display()));
        // On the command line, above postgresql.auto.conf: no ALTER SYSTEM turns TLS off.
        for (name, value) in config.tls.iter().flat_map(crate::instance::tls::server_settings) {
            command.arg("-c").arg(format!("{name}={value}"));
        }
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(PostgresError::Start)?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(false);
        if let Some((uid, gid)) = config.os_user {
            command.uid(uid).gid(gid);
        }
        self.child = Some(command.spawn().map_err(PostgresError::Start)?);
        self.client = None;
        Ok(())
    }

    async fn client(&mut self) -> Result<&Client, PostgresError> {
        if self.client.as_ref().is_some_and(|client| !client.is_closed()) {
            return Ok(self.client.as_ref().expect("checked"));
        }
        let (client, connection) = match self.connect_as(&self.config.superuser).await {
            // A database made before issue 22: its superuser is the application's role until
            // the primary's agent migrates it (see `roles`).
            Err(PostgresError::Connect(reason)) if reason.contains("does not exist") && self.config.roles.is_some() => {
                let fallback =
                    self.config.roles.as_ref().map(|roles| roles.application_user.clone()).unwrap_or_default();
                self.connect_as(&fallback).await.map_err(|_| PostgresError::Connect(reason))?
            }
            connected => connected?,
        };
        tokio::spawn(async move {
            // Ends when the server or the client goes away; the next call reconnects.
            let _ = connection.await;
        });
        Ok(self.client.insert(client))
    }

    async fn connect_as(
        &self,
        user: &str,
    ) -> Result<
        (Client, tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>),
        PostgresError,
    > {
        let pg_config = session::config(
            &self.config.socket_dir,
            self.config.port,
            user,
            "postgres",
            Sql::Privileged,
            self.config.health_timeout,
        );
        let connect = pg_config.connect(NoTls);
        tokio::time::timeout(self.config.health_timeout, connect)
            .await
            .map_err(|_| PostgresError::Timeout(self.config.health_timeout))?
            .map_err(|error| {
                // The server's message (Display of a server error says only "db error").
                let reason =
                    error.as_db_error().map(|db| db.message().to_string()).unwrap_or_else(|| error.to_string());
                PostgresError::Connect(reason)
            })
    }

    async fn bounded<T>(
        &mut self,
        work: impl AsyncFnOnce(&Client) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, PostgresError> {
        let timeout = self.config.health_timeout;
        let result = tokio::time::timeout(timeout, async {
            let client = self.client().await?;
            work(client).await.map_err(PostgresError::from)
        })
        .await;
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                self.client = None;
                Err(error)
            }
            Err(_) => {
                self.client = None;
                Err(PostgresError::Timeout(timeout))
            }
        }
    }

    /// One health query, bounded by the health timeout.
    pub async fn observe(&mut self) -> LocalState {
        if !self.is_running() {
            return LocalState::Down;
        }
        match self.sample().await {
            Ok(sample) => LocalState::Ready(sample),
            Err(error) => LocalState::NotReady(error.to_string()),
        }
    }

    /// Queries role, timeline and WAL positions of the server on the socket (whoever started it).
    pub async fn sample(&mut self) -> Result<Sample, PostgresError> {
        let row = self.bounded(async |client| client.query_one(SAMPLE_QUERY, &[]).await).await?;
        (|| {
            Ok::<_, PostgresError>(Sample {
                in_recovery: row.try_get(0)?,
                current_lsn: lsn(row.try_get(1)?)?,
                received_lsn: lsn(row.try_get(2)?)?,
                replay_lsn: lsn(row.try_get(3)?)?,
                timeline: u32::try_from(row.try_get::<_, i32>(4)?).unwrap_or(0),
                streaming: row.try_get(5)?,
                archiver: archiver(&row)?,
            })
        })()
    }

    /// Promotes a standby and waits (up to 60 s inside PostgreSQL) until it accepts writes.
    pub async fn promote(&mut self) -> Result<(), PostgresError> {
        let timeout = self.config.health_timeout + Duration::from_secs(60);
        let client = self.client().await?;
        // pg_promote waits up to 60 s (bounded here) and the checkpoint as long as the dirty
        // buffers take (it waits on no lock the application could hold): both past the session's
        // statement_timeout, which is put back after.
        let outcome = match client.batch_execute("SET statement_timeout = 0").await {
            Ok(()) => promote_and_checkpoint(client, timeout).await,
            Err(error) => Err(error.into()),
        };
        // After a failure the session may still run pg_promote (cut off by our timeout only):
        // no RESET queued behind it, the session goes.
        let reset = match outcome {
            Ok(()) => Some(client.batch_execute("RESET statement_timeout").await),
            Err(_) => None,
        };
        if let Some(Err(error)) = &reset {
            tracing::warn!(instance = %self.config.name, %error, "promoted, but the session's statement_timeout was not put back: reconnecting");
        }
        let (outcome, keep_session) = settle_promotion(outcome, reset);
        if !keep_session {
            self.client = None;
        }
        outcome
    }

    /// Re-points the WAL receiver (`''` stops it) without a restart: primary_conninfo is
    /// reloadable since PostgreSQL 13.
    pub async fn set_upstream(&mut self, conninfo: &str) -> Result<(), PostgresError> {
        let conninfo = conninfo.to_string();
        self.bounded(async move |client| {
            alter_system(client, "primary_conninfo", &conninfo).await?;
            // The previous upstream's slot is not on this one (see `slots`).
            alter_system(client, "primary_slot_name", "").await?;
            client.batch_execute("SELECT pg_catalog.pg_reload_conf()").await
        })
        .await
    }

    /// Re-points the WAL receiver of a server that takes no connections yet (a standby still
    /// replaying towards a consistent state, which may need WAL only the new primary has): the
    /// setting goes into postgresql.auto.conf directly and the postmaster is told to reload.
    pub fn set_upstream_offline(&mut self, conninfo: &str) -> Result<(), crate::instance::standby::StandbyError> {
        let settings = [("primary_conninfo", conninfo.to_string()), ("primary_slot_name", String::new())];
        crate::instance::standby::set_auto_conf(&self.config, &settings)?;
        if let Some(pid) = self.pid() {
            signal_postmaster(pid, libc::SIGHUP);
        }
        Ok(())
    }

    /// Streams through replication slot `slot` from now on (the WAL receiver restarts with it).
    pub async fn set_slot(&mut self, slot: &str) -> Result<(), PostgresError> {
        let slot = slot.to_string();
        self.bounded(async move |client| {
            alter_system(client, "primary_slot_name", &slot).await?;
            client.batch_execute("SELECT pg_catalog.pg_reload_conf()").await
        })
        .await
    }

    /// The physical replication slots of this server.
    pub async fn replication_slots(&mut self) -> Result<Vec<crate::instance::slots::ReplicationSlot>, PostgresError> {
        let rows = self
            .bounded(async |client| {
                client.query("SELECT slot_name::text, active FROM pg_catalog.pg_replication_slots WHERE slot_type = 'physical'", &[]).await
            })
            .await?;
        rows.iter()
            .map(|row| Ok(crate::instance::slots::ReplicationSlot { name: row.try_get(0)?, active: row.try_get(1)? }))
            .collect()
    }

    /// Drops replication slot `slot` (fails while a WAL sender uses it).
    pub async fn drop_slot(&mut self, slot: &str) -> Result<(), PostgresError> {
        let slot = slot.to_string();
        self.bounded(async move |client| {
            client.execute("SELECT pg_catalog.pg_drop_replication_slot($1)", &[&slot]).await.map(drop)
        })
        .await
    }

    /// Makes the server re-read its configuration files (pg_reload_conf returns before the
    /// postmaster has applied them; a commit right after may still use the old value).
    pub async fn reload(&mut self) -> Result<(), PostgresError> {
        self.bounded(async |client| client.batch_execute("SELECT pg_catalog.pg_reload_conf()").await).await
    }

    /// Settings changed in the configuration files that take effect only after a restart.
    pub async fn pending_restart(&mut self) -> Result<Vec<String>, PostgresError> {
        let query = "SELECT name FROM pg_catalog.pg_settings WHERE pending_restart ORDER BY name";
        let rows = self.bounded(async |client| client.query(query, &[]).await).await?;
        rows.iter().map(|row| row.try_get(0).map_err(PostgresError::from)).collect()
    }

    /// Runs `statements` (one batch, no parameters), bounded by the health timeout.
    pub async fn execute(&mut self, statements: &str) -> Result<(), PostgresError> {
        self.bounded(async |client| client.batch_execute(statements).await).await
    }

    /// The entries of the configuration files as they are now, applied or not, in file order
    /// (`pg_file_settings`; the agent's session is a superuser's, which may read it).
    pub async fn file_settings(&mut self) -> Result<Vec<FileSetting>, PostgresError> {
        let query = "SELECT name, sourcefile, setting FROM pg_catalog.pg_file_settings \
                     WHERE name IS NOT NULL AND sourcefile IS NOT NULL ORDER BY sourcefile, seqno";
        let rows = self.bounded(async |client| client.query(query, &[]).await).await?;
        rows.iter()
            .map(|row| Ok(FileSetting { name: row.try_get(0)?, sourcefile: row.try_get(1)?, setting: row.try_get(2)? }))
            .collect()
    }

    /// Puts owned settings back in postgresql.auto.conf (`ALTER SYSTEM`, one statement per round
    /// trip: it cannot run in a transaction block), then reloads. Names that are not
    /// [`safe_name`]s are skipped.
    pub async fn put_back(&mut self, put_backs: &[PutBack]) -> Result<(), PostgresError> {
        self.bounded(async |client| {
            for put_back in put_backs.iter().filter(|put_back| safe_name(put_back.name())) {
                match put_back {
                    PutBack::Reset(name) => client.batch_execute(&format!("ALTER SYSTEM RESET {name}")).await?,
                    PutBack::Set(name, value) => {
                        let statement: String = client
                            .query_one(
                                "SELECT pg_catalog.format('ALTER SYSTEM SET %I = %L', $1::text, $2::text)",
                                &[name, value],
                            )
                            .await?
                            .try_get(0)?;
                        client.batch_execute(&statement).await?
                    }
                }
            }
            client.batch_execute("SELECT pg_catalog.pg_reload_conf()").await
        })
        .await
    }

    /// Where the next WAL record goes (`pg_current_wal_insert_lsn()`), bounded by the health timeout.
    pub async fn insert_lsn(&mut self) -> Result<Lsn, PostgresError> {
        let text: Option<String> = self
            .bounded(async |client| {
                client.query_one("SELECT pg_catalog.pg_current_wal_insert_lsn()::text", &[]).await?.try_get(0)
            })
            .await?;
        lsn(text)?.ok_or_else(|| PostgresError::Answer("no WAL insert position".into()))
    }

    /// How many standbys stream from this server now (`pg_stat_replication`), bounded by the
    /// health timeout.
    pub async fn streaming_standbys(&mut self) -> Result<i64, PostgresError> {
        let query = "SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_replication WHERE state = 'streaming'";
        self.bounded(async |client| client.query_one(query, &[]).await?.try_get(0)).await
    }

    /// How far standby `name` is behind this primary, if it streams: bytes of WAL it has not
    /// flushed, and how long ago this server flushed the WAL it last confirmed (`flush_lag`, None
    /// once it has confirmed everything). Bounded by the health timeout.
    pub async fn standby_lag(&mut self, name: &str) -> Result<Option<StandbyLag>, PostgresError> {
        let query = "SELECT (pg_catalog.pg_current_wal_lsn() - flush_lsn)::bigint, \
                            pg_catalog.date_part('epoch', flush_lag)::float8, \
                            pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() - reply_time)::float8 \
                     FROM pg_catalog.pg_stat_replication WHERE application_name = $1 AND state = 'streaming'";
        let rows = self.bounded(async |client| client.query(query, &[&name]).await).await?;
        let Some(row) = rows.first() else { return Ok(None) };
        let bytes: Option<i64> = row.try_get(0)?;
        let seconds = |column: usize| -> Result<Option<Duration>, PostgresError> {
            let seconds: Option<f64> = row.try_get(column)?;
            Ok(seconds.map(|seconds| Duration::from_secs_f64(seconds.clamp(0.0, 1e9))))
        };
        Ok(Some(StandbyLag {
            bytes: bytes.map_or(u64::MAX, |bytes| u64::try_from(bytes).unwrap_or(0)),
            flush_lag: seconds(1)?,
            last_reply: seconds(2)?,
        }))
    }

    /// What a primary sees of its standbys `members` (see [`crate::instance::durability`]),
    /// bounded by the health timeout.
    pub async fn standbys_seen(
        &mut self,
        members: &[String],
    ) -> Result<crate::instance::durability::StandbysSeen, PostgresError> {
        use crate::instance::durability::{StandbysSeen, STALE_REPLY, STALLED_COMMIT, STANDBYS_SEEN_QUERY};
        let (stale, stalled) = (STALE_REPLY.as_secs_f64(), STALLED_COMMIT.as_secs_f64());
        let row = self
            .bounded(async |client| client.query_one(STANDBYS_SEEN_QUERY, &[&members, &stale, &stalled]).await)
            .await?;
        let streaming: Vec<String> = row.try_get(0)?;
        Ok(StandbysSeen { streaming: streaming.into_iter().collect(), commit_stalled: row.try_get(1)? })
    }

    /// CHECKPOINT (so that the shutdown checkpoint is short), bounded by the health timeout;
    /// failures are ignored, the stop that follows matters.
    pub async fn checkpoint(&mut self) {
        let _ = self.bounded(async |client| client.batch_execute("CHECKPOINT").await).await;
    }

    /// Stops the server: fast shutdown, immediate after `grace`, SIGKILL to every process of the
    /// server after another `grace`. True when the fast shutdown completed (a clean stop).
    pub async fn stop(&mut self, grace: Duration) -> bool {
        self.client = None;
        let Some(pid) = self.pid() else {
            self.child = None;
            return false;
        };
        for (signal, clean) in [(libc::SIGINT, true), (libc::SIGQUIT, false)] {
            signal_postmaster(pid, signal);
            if self.wait_exit(grace).await {
                return clean;
            }
        }
        self.kill().await;
        false
    }

    /// Begins a fast shutdown and waits up to `grace` until the server can commit nothing more:
    /// it exited, or pg_control says "shut down" (every session is gone and the shutdown checkpoint
    /// is written; what may still run are the WAL senders sending the last WAL and the archiver's
    /// last attempts, which last minutes when the object store does not answer). False when it still
    /// runs unchanged after `grace`; [`Self::finish_stop`] ends the stop either way.
    pub async fn stop_writes(&mut self, grace: Duration) -> bool {
        self.client = None;
        let Some(pid) = self.pid() else {
            self.child = None;
            return false;
        };
        signal_postmaster(pid, libc::SIGINT);
        let began = std::time::Instant::now();
        loop {
            if self.wait_exit(SHUTDOWN_POLL).await || shut_down_in_control_file(&self.config.pgdata) {
                return true;
            }
            if began.elapsed() >= grace {
                return false;
            }
        }
    }

    /// Ends a stop begun by [`Self::stop_writes`]: waits up to `grace` for the server to exit, then
    /// sends the immediate shutdown, then SIGKILL after another `grace`.
    pub async fn finish_stop(&mut self, grace: Duration) {
        if self.wait_exit(grace).await {
            return;
        }
        if let Some(pid) = self.pid() {
            signal_postmaster(pid, libc::SIGQUIT);
            if self.wait_exit(grace).await {
                return;
            }
        }
        self.kill().await;
    }

    /// SIGKILL to the postmaster and every child (works on a stopped, hung server too).
    pub async fn kill(&mut self) {
        self.client = None;
        if let Some(pid) = self.pid() {
            signal_server(pid, libc::SIGKILL);
            self.wait_exit(Duration::from_secs(10)).await;
        }
        self.child = None;
    }

    async fn wait_exit(&mut self, limit: Duration) -> bool {
        let Some(child) = self.child.as_mut() else { return true };
        match tokio::time::timeout(limit, child.wait()).await {
            Ok(_) => {
                self.child = None;
                true
            }
            Err(_) => false,
        }
    }
}

/// How far a streaming standby is behind its primary (see [`Postgres::standby_lag`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StandbyLag {
    /// WAL it has not flushed.
    pub bytes: u64,
    /// How long ago the primary flushed what it last confirmed; None when it confirmed everything.
    /// As old as its last reply.
    pub flush_lag: Option<Duration>,
    /// How long ago it last replied (None: never).
    pub last_reply: Option<Duration>,
}

impl StandbyLag {
    /// Close enough for a switchover to stop its primary: what is left reaches it within about
    /// [`SWITCHOVER_CATCH_UP`] (measured by its own flush lag, so a slow link counts) and is at
    /// most [`SWITCHOVER_CATCH_UP_BYTES`]; with WAL outstanding, its flush lag must be fresh (a
    /// standby that stopped replying keeps the flush lag of its last reply).
    pub fn caught_up(&self) -> bool {
        let fresh = self.bytes == 0 || self.last_reply.is_some_and(|age| age < SWITCHOVER_CATCH_UP);
        fresh && self.bytes <= SWITCHOVER_CATCH_UP_BYTES && self.behind_by() < SWITCHOVER_CATCH_UP
    }

    /// How long the WAL outstanding takes to reach it, as far as it tells: its flush lag, or how
    /// long it has been silent with WAL outstanding, whichever is longer. PostgreSQL clears the
    /// flush lag (NULL) once the standby has everything *sent*, also when its WAL sender cannot send
    /// faster (a slow link, seen on the real node: NULL with 300 kB outstanding at 30 kB/s): then
    /// only a few pages outstanding ([`SWITCHOVER_UNTIMED_BYTES`]) count as no lag at all.
    pub fn behind_by(&self) -> Duration {
        let silent = if self.bytes == 0 { Duration::ZERO } else { self.last_reply.unwrap_or(Duration::MAX) };
        let flush_lag = match self.flush_lag {
            Some(lag) => lag,
            None if self.bytes <= SWITCHOVER_UNTIMED_BYTES => Duration::ZERO,
            None => Duration::MAX,
        };
        flush_lag.max(silent)
    }
}

/// See [`StandbyLag::caught_up`].
pub const SWITCHOVER_CATCH_UP: Duration = Duration::from_secs(1);
/// See [`StandbyLag::caught_up`].
pub const SWITCHOVER_CATCH_UP_BYTES: u64 = 16 * 1024 * 1024;
/// See [`StandbyLag::behind_by`].
pub const SWITCHOVER_UNTIMED_BYTES: u64 = 64 * 1024;

/// How often [`Postgres::stop_writes`] looks at pg_control.
const SHUTDOWN_POLL: Duration = Duration::from_millis(50);

/// Whether `PGDATA/global/pg_control` says the cluster is shut down (in recovery or not). Its
/// `state` is the fourth field, at byte 16 after the system identifier (8 bytes) and two version
/// numbers (4 each), in every major since 9.0; `DB_SHUTDOWNED` is 1, `DB_SHUTDOWNED_IN_RECOVERY` 2.
/// The server writes the file in one 512-byte sector, so a read never sees half of it.
pub fn shut_down_in_control_file(pgdata: &Path) -> bool {
    let Ok(bytes) = std::fs::read(pgdata.join("global").join("pg_control")) else { return false };
    control_file_state(&bytes).is_some_and(|state| state == 1 || state == 2)
}

/// The `state` field of pg_control's bytes (native byte order, as the server wrote it).
fn control_file_state(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(16..20)?.try_into().ok()?))
}

fn signal_postmaster(pid: u32, signal: i32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    // SAFETY: kill(2) only sends a signal.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// The data directory holds a cluster.
pub fn initialized(pgdata: &Path) -> bool {
    pgdata.join("PG_VERSION").is_file()
}

/// The data directory is configured to start as a standby.
pub fn is_standby_data(pgdata: &Path) -> bool {
    pgdata.join("standby.signal").exists()
}

/// Below this much free space on the data volume the instance reports its disk full: less than
/// two WAL segments, so PostgreSQL is about to fail (or already fails) to write WAL.
pub const DISK_FULL_BYTES: u64 = 32 * 1024 * 1024;

/// `ALTER SYSTEM SET name = 'value'`, the value quoted by the server (`format('%L')`); the
/// statement cannot run in a transaction block, so it has one round trip of its own.
async fn alter_system(client: &Client, name: &str, value: &str) -> Result<(), tokio_postgres::Error> {
    let statement: String = client
        .query_one(&format!("SELECT pg_catalog.format('ALTER SYSTEM SET {name} = %L', $1::text)"), &[&value])
        .await?
        .try_get(0)?;
    client.batch_execute(&statement).await
}

async fn promote_and_checkpoint(client: &Client, timeout: Duration) -> Result<(), PostgresError> {
    let promoted = tokio::time::timeout(timeout, client.query_one("SELECT pg_catalog.pg_promote(true, 60)", &[]))
        .await
        .map_err(|_| PostgresError::Timeout(timeout))??;
    if !promoted.try_get::<_, bool>(0)? {
        return Err(PostgresError::Answer("pg_promote returned false".into()));
    }
    // pg_rewind reads the new timeline from the source's pg_control, which only the first
    // checkpoint after promotion updates: without it, it would take the old primary for being on
    // the same timeline and skip a needed rewind.
    client.batch_execute("CHECKPOINT").await?;
    Ok(())
}

/// What a promotion reports, from its own outcome and that of the RESET of its session's
/// statement_timeout after it (None: not tried), and whether the session may be kept. A done
/// promotion is reported done whatever the RESET: failing it would leave the role unset while
/// the server already accepts writes. A session whose RESET did not run or failed may still
/// have no statement_timeout: it is dropped, and the next call reconnects with the pinned options.
fn settle_promotion<E>(
    promoted: Result<(), PostgresError>,
    reset: Option<Result<(), E>>,
) -> (Result<(), PostgresError>, bool) {
    let keep_session = promoted.is_ok() && matches!(reset, Some(Ok(())));
    (promoted, keep_session)
}

/// Bytes available to unprivileged users on the file system holding `path` (statvfs), if known.
pub fn free_bytes(path: &Path) -> Option<u64> {
    statvfs(path).map(|stats| stats.f_bavail.saturating_mul(stats.f_frsize))
}

/// Size of the file system holding `path`, if it can be read.
pub fn volume_bytes(path: &Path) -> Option<u64> {
    statvfs(path).map(|stats| stats.f_blocks.saturating_mul(stats.f_frsize))
}

fn statvfs(path: &Path) -> Option<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes into the struct it is given; the path is a valid C string.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return None;
    }
    Some(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_bytes_of_an_existing_directory_and_none_for_a_missing_one() {
        let directory = tempfile::tempdir().unwrap();
        assert!(free_bytes(directory.path()).is_some_and(|free| free > 0));
        assert!(volume_bytes(directory.path()) >= free_bytes(directory.path()));
        assert_eq!(free_bytes(&directory.path().join("missing")), None);
    }

    #[test]
    fn a_failed_reset_never_fails_a_done_promotion_but_drops_its_session() {
        let reset_failed: Option<Result<(), &str>> = Some(Err("connection closed"));
        let (outcome, keep_session) = settle_promotion(Ok(()), reset_failed);
        assert!(outcome.is_ok(), "promoted: {outcome:?}");
        assert!(!keep_session, "its statement_timeout may still be 0");
        let (outcome, keep_session) = settle_promotion(Ok(()), Some(Ok::<(), &str>(())));
        assert!(outcome.is_ok() && keep_session);
        let failed = Err(PostgresError::Answer("pg_promote returned false".into()));
        let (outcome, keep_session) = settle_promotion(failed, None::<Result<(), &str>>);
        assert!(outcome.is_err() && !keep_session);
    }

    #[test]
    fn a_switchover_target_is_caught_up_when_its_fresh_flush_lag_is_short() {
        let second = Duration::from_secs(1);
        let lag = |bytes, flush_lag: Option<f64>, last_reply: Option<f64>| StandbyLag {
            bytes,
            flush_lag: flush_lag.map(Duration::from_secs_f64),
            last_reply: last_reply.map(Duration::from_secs_f64),
        };
        assert!(lag(0, None, Some(9.0)).caught_up(), "idle and confirmed: replies are rare");
        assert!(lag(8_000, Some(0.02), Some(0.05)).caught_up(), "streaming under writes");
        assert!(lag(8_000, None, Some(0.05)).caught_up(), "everything sent confirmed, a few pages outstanding");
        assert!(
            !lag(302_832, None, Some(0.36)).caught_up(),
            "everything sent confirmed, but 300 kB not sent yet (a slow link): no time known, not caught up"
        );
        assert_eq!(lag(302_832, None, Some(0.36)).behind_by(), Duration::MAX);
        assert!(!lag(8_000, None, Some(3.0)).caught_up(), "silent with WAL outstanding: its flush lag is stale");
        assert!(!lag(8_000, Some(25.0), Some(0.1)).caught_up(), "a slow link: 25 s of WAL on the way");
        assert!(!lag(64 << 20, Some(0.5), Some(0.1)).caught_up(), "too many bytes");
        assert_eq!(lag(8_000, Some(0.5), Some(3.0)).behind_by(), 3 * second);
        assert_eq!(lag(0, Some(0.5), None).behind_by(), Duration::from_millis(500));
    }

    #[test]
    fn the_control_file_state_is_the_fourth_field() {
        let mut bytes = vec![0u8; 296];
        bytes[..8].copy_from_slice(&7_000_000_000_000_000_001_u64.to_ne_bytes());
        bytes[8..12].copy_from_slice(&1300_u32.to_ne_bytes());
        bytes[12..16].copy_from_slice(&202_209_061_u32.to_ne_bytes());
        for (state, shut_down) in [(1_u32, true), (2, true), (3, false), (5, false), (6, false)] {
            bytes[16..20].copy_from_slice(&state.to_ne_bytes());
            assert_eq!(control_file_state(&bytes), Some(state));
            let directory = tempfile::tempdir().unwrap();
            std::fs::create_dir(directory.path().join("global")).unwrap();
            std::fs::write(directory.path().join("global/pg_control"), &bytes).unwrap();
            assert_eq!(shut_down_in_control_file(directory.path()), shut_down, "state {state}");
        }
        assert_eq!(control_file_state(&bytes[..19]), None, "a short file has no state");
        assert!(!shut_down_in_control_file(Path::new("/nonexistent")));
    }
}
