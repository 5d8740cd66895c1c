//! The instance agent (`dbservice-operator instance ...`): runs in each PostgreSQL pod, supervises
//! the server, publishes an [`InstanceReport`] when it changes, and carries out what the operator
//! decided ([`crate::api::failover`]): promote when it is the target and holds the primary Lease, stop
//! cleanly and hand the Lease over on a switchover, follow the new primary (pg_rewind, or a fresh
//! clone), and fence itself when it cannot renew the Lease in time.
//!
//! It talks only to its own PostgreSQL (unix socket) and to the API through [`ControlPlane`]; it
//! serves nothing, so the operator never dials a pod. Design: docs/failover.md.

mod agent;
pub mod archiving;
pub mod args;
pub mod configuration;
pub mod custom_queries;
pub mod declared;
pub mod durability;
pub mod hba;
pub mod import;
pub mod import_roles;
pub mod kubernetes;
pub mod major_upgrade;
pub mod metrics;
pub mod openmetrics;
pub mod owned_settings;
pub mod postgres;
pub mod recovery;
pub mod roles;
pub mod run;
pub mod scram;
pub mod secrets;
pub mod session;
pub mod slots;
pub mod standby;
pub mod tls;
pub mod upgrade_keeper;
pub mod watchdog;

pub use agent::{Agent, AgentError, RELEASED_WAL_WAIT, UNRESPONSIVE_QUERIES};
pub use secrets::SecretReader;

use crate::instance::args::{InstanceArgs, InstanceCommand};

use crate::api::failover::InstanceReport;
use crate::lease::{LeaseRecord, LeaseTimings};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where and how the agent runs its PostgreSQL.
#[derive(Clone, Debug)]
pub struct InstanceConfig {
    /// Instance (pod) name: the lease holder identity and the replication application_name.
    pub name: String,
    /// Directory of postgres, pg_ctl, pg_rewind, pg_basebackup, pg_controldata.
    pub pg_bin: PathBuf,
    /// Data directory.
    pub pgdata: PathBuf,
    /// Port.
    pub port: u16,
    /// Unix socket directory (the agent's own connection).
    pub socket_dir: PathBuf,
    /// listen_addresses.
    pub listen_addresses: String,
    /// Superuser for the local connection (peer/trust over the socket).
    pub superuser: String,
    /// The superuser's and the application's roles, kept by the primary (None: left as they are,
    /// as tests that bring their own cluster want). Their application role is also the local
    /// connection's fallback while a database made before issue 22 has no `superuser` role yet.
    pub roles: Option<crate::instance::roles::RoleSettings>,
    /// The server certificate files: TLS on every network connection (None: off, as the
    /// loopback tests run their servers).
    pub tls: Option<crate::instance::tls::TlsFiles>,
    /// Role used to stream, clone and rewind from the primary.
    pub replication_user: String,
    /// Its password (environment only; never on a command line or in a log).
    pub replication_password: String,
    /// Extra server settings (name, value), written into postgresql.auto.conf before every start.
    pub settings: Vec<(String, String)>,
    /// A standby's `restore_command` (the archive's `wal-restore`), when the database archives.
    pub standby_restore_command: Option<String>,
    /// File PostgreSQL's output is appended to.
    pub log_file: PathBuf,
    /// When the agent runs as root (tests): uid and gid to run PostgreSQL and its tools as.
    pub os_user: Option<(u32, u32)>,
    /// Longest wait for one local query; a server that does not answer in time is not ready.
    pub health_timeout: Duration,
    /// How long health queries must fail in a row (and at least [`UNRESPONSIVE_QUERIES`] of them)
    /// before the server counts as not ready: an I/O stall, CPU throttling or a connection storm
    /// of a few seconds must not start a failover.
    pub unresponsive_after: Duration,
    /// The binary to run `instance watchdog` with (the fence watchdog as its own process, so that a
    /// frozen agent still fences); None: a thread of this process (tests that run agents in-process).
    pub watchdog_binary: Option<PathBuf>,
    /// Interval between two steps (local checks only; API writes happen on change and on renewal).
    pub tick: Duration,
    /// Primary Lease timings.
    pub lease: LeaseTimings,
    /// Time a fast shutdown gets before an immediate one (and that one before SIGKILL).
    pub stop_grace: Duration,
}

impl InstanceConfig {
    pub(crate) fn chown(&self, paths: &[&Path]) {
        if let Some((uid, gid)) = self.os_user {
            for path in paths {
                let _ = std::os::unix::fs::chown(path, Some(uid), Some(gid));
            }
        }
    }
}

/// Where the primary to follow listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    /// Host name (the pod's DNS name through the headless Service) or address.
    pub host: String,
    /// Port.
    pub port: u16,
}

/// How an instance keeps `synchronous_standby_names` (a standby keeps it too, so that it applies
/// from its promotion on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SynchronousStandbys {
    /// Always this value: '' (asynchronous) or `ANY k (...)` (`required` durability).
    Fixed(String),
    /// `preferred` durability: `ANY count (<streaming standbys>)` on a primary (see
    /// [`durability::PreferredKeeper`]), of those the operator has recorded only; a standby keeps
    /// the recorded ones.
    Preferred {
        /// The other instances.
        members: Vec<String>,
        /// How many must confirm each commit.
        count: u32,
        /// `status.primaryWaitsFor`.
        recorded: Vec<String>,
    },
}

/// What the operator wants from this instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// `targetPrimary`: an instance name, [`crate::api::failover::PENDING`], or None when not decided.
    pub target_primary: Option<String>,
    /// The primary to follow, once `currentPrimary` equals `targetPrimary` (never during a change).
    pub upstream: Option<Upstream>,
    /// A person fenced this instance: keep PostgreSQL stopped.
    pub fenced: bool,
    /// The change in progress is a planned switchover: its target promotes only once the old
    /// primary has released the Lease with a position the target has received (never on expiry,
    /// never with a gap), so that it loses no acknowledged commit.
    pub switchover: bool,
    /// `spec.failover.switchoverTimeoutSeconds`: the operator gives a switchover up after it (an
    /// old primary waits for its target to catch up within it, see `Agent::target_caught_up`).
    pub switchover_timeout: std::time::Duration,
    /// The `synchronous_standby_names` this instance keeps should it be primary; None when
    /// unknown (the API is unreachable): the current value stays.
    pub synchronous: Option<SynchronousStandbys>,
    /// Every instance the database should have (empty when unknown): a primary keeps their
    /// replication slots and drops the others.
    pub instances: Vec<String>,
    /// `spec.postgresql` as the server should run it; None when unknown (the configuration stays).
    pub configuration: Option<ServerConfiguration>,
    /// `spec.roles` and `spec.databases`, kept by a primary; None when unknown (the last ones stay).
    pub declarations: Option<crate::api::roles::Declarations>,
    /// `spec.bootstrap.import`, done once by a primary; None when there is none (or unknown).
    pub import: Option<crate::api::import::ImportSpec>,
    /// An in-place major upgrade in progress (from `status.majorUpgrade`); None otherwise.
    pub major_upgrade: Option<crate::instance::upgrade_keeper::UpgradeInstruction>,
    /// The `dbservice.dev/reload-requested-at` annotation's value, if any.
    pub reload_requested: Option<String>,
}

/// The server configuration the user asked for (`spec.postgresql`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerConfiguration {
    /// `spec.postgresql.parameters`.
    pub parameters: std::collections::BTreeMap<String, String>,
    /// `spec.postgresql.pgHba`.
    pub hba_rules: Vec<String>,
}

/// The API could not be reached or refused.
#[derive(Debug, thiserror::Error)]
#[error("control plane: {0}")]
pub struct ControlPlaneError(pub String);

/// The agent's view of the API server: its pod (desired state in, report out) and the
/// database's primary Lease (compare-and-swap on a version, like a resourceVersion).
pub trait ControlPlane: Send + Sync {
    /// The operator's wishes for this instance.
    fn desired(&self) -> impl Future<Output = Result<Desired, ControlPlaneError>> + Send;
    /// Publishes this instance's report; the agent calls it only when the report changed.
    fn publish(&self, report: &InstanceReport) -> impl Future<Output = Result<(), ControlPlaneError>> + Send;
    /// The primary Lease and its version.
    fn read_lease(&self) -> impl Future<Output = Result<(LeaseRecord, String), ControlPlaneError>> + Send;
    /// Replaces the Lease if its version is still `version`: the new version, or None on a conflict.
    fn write_lease(
        &self,
        version: &str,
        record: &LeaseRecord,
    ) -> impl Future<Output = Result<Option<String>, ControlPlaneError>> + Send;
    /// Completes when the operator's wishes may have changed since this call (the agent then steps
    /// at once instead of at its next tick); never, for a control plane that cannot tell.
    fn changed(&self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// Runs an `instance` subcommand.
pub async fn command(args: InstanceArgs) -> anyhow::Result<()> {
    match args.command {
        InstanceCommand::Run(run) => run::run(run).await,
        InstanceCommand::Watchdog(watchdog) => watchdog::run_process(&watchdog.fence_file),
        InstanceCommand::Status(status) => {
            let config = InstanceConfig {
                name: String::new(),
                pg_bin: PathBuf::new(),
                pgdata: PathBuf::new(),
                port: status.port,
                socket_dir: status.socket_dir,
                listen_addresses: String::new(),
                superuser: status.user,
                roles: None,
                tls: None,
                replication_user: String::new(),
                replication_password: String::new(),
                settings: Vec::new(),
                standby_restore_command: None,
                log_file: PathBuf::new(),
                os_user: None,
                health_timeout: Duration::from_secs(status.timeout_seconds),
                tick: Duration::from_secs(1),
                lease: LeaseTimings::default(),
                stop_grace: Duration::from_secs(1),
                unresponsive_after: Duration::from_secs(1),
                watchdog_binary: None,
            };
            let sample = postgres::Postgres::new(config).sample().await?;
            println!("{}", serde_json::to_string(&sample)?);
            Ok(())
        }
    }
}
