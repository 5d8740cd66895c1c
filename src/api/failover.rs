//! The failover part of the API: `spec.failover` settings, `status.failover`, and the reports
//! instance agents publish on their pods (the contract between the agent and the operator).

use crate::lsn::Lsn;
use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Pod annotation holding an instance agent's [`InstanceReport`] as JSON (written only on change).
pub const INSTANCE_REPORT_ANNOTATION: &str = "dbservice.dev/instance";
/// DatabaseService annotation listing instances a person fenced: `name-0,name-2`.
pub const FENCED_ANNOTATION: &str = "dbservice.dev/fenced-instances";
/// Annotation a person sets on a DatabaseService to switch over: the name of the standby to promote.
pub const SWITCHOVER_ANNOTATION: &str = "dbservice.dev/switchover-to";
/// Annotation a person sets on a DatabaseService for a rolling restart (standbys first, then a
/// switchover, then the former primary): any new value (the plugin writes the time) asks again.
pub const RESTART_ANNOTATION: &str = "dbservice.dev/restart-requested-at";
/// Annotation a person sets on a DatabaseService to make every instance reload its configuration
/// files and certificates: any new value (the plugin writes the time) asks again.
pub const RELOAD_ANNOTATION: &str = "dbservice.dev/reload-requested-at";
/// `targetPrimary` while a failover looks for the best standby.
pub const PENDING: &str = "pending";

/// What a PostgreSQL instance is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    /// Accepts writes (not in recovery).
    Primary,
    /// In recovery: replays WAL from a primary.
    Standby,
}

/// What an instance agent publishes about its PostgreSQL, on change only (positions of a standby
/// that streams are not republished as they advance: only at state changes such as the end of a
/// WAL receiver, which is when failover needs them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceReport {
    /// Role of the data directory (the last known one while PostgreSQL is down).
    pub role: Role,
    /// Timeline the instance is on.
    pub timeline: u32,
    /// Standby: last WAL position received and flushed (`pg_last_wal_receive_lsn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_lsn: Option<Lsn>,
    /// Standby: last WAL position replayed (`pg_last_wal_replay_lsn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_lsn: Option<Lsn>,
    /// Standby: the WAL receiver is connected to a primary.
    pub wal_receiver: bool,
    /// PostgreSQL answers queries.
    pub postgres_ready: bool,
    /// A person fenced the instance (the agent keeps PostgreSQL stopped). Self-fencing is not
    /// reported here: a primary that fenced itself is unhealthy and is failed over.
    pub fenced: bool,
    /// The data volume is full: failing over would not help.
    pub disk_full: bool,
    /// Set by a primary that stopped cleanly: its shutdown checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_checkpoint_lsn: Option<Lsn>,
    /// Primary with WAL archiving on: whether `archive_command` succeeds (from pg_stat_archiver).
    /// Republished only when archiving turns healthy or failing, or fails on another segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archiving: Option<ArchivingReport>,
    /// Fingerprint ([`crate::api::postgresql::fingerprint`]) of the `spec.postgresql.parameters`
    /// the server was last configured and reloaded with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<String>,
    /// Settings changed in the configuration that the running server applies only after a
    /// restart (`pg_settings.pending_restart`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_restart: Vec<String>,
    /// A primary's last pass over `spec.roles` and `spec.databases` (see
    /// `instance::declared`); absent on standbys and before the first pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<crate::api::roles::DeclaredObjectsStatus>,
    /// A primary's import (`spec.bootstrap.import`, see `instance::import`); absent when there
    /// is none to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<crate::api::import::ImportStatus>,
    /// This instance's part in an in-place major upgrade (data of an older major than the
    /// binaries, or upgraded and not yet settled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_upgrade: Option<crate::api::major_upgrade::InstanceUpgradeReport>,
    /// The last time this agent put back settings the operator owns that someone had changed
    /// with `ALTER SYSTEM` (absent until it first did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_settings_reverted: Option<OwnedSettingsReverted>,
    /// A primary under `preferred` durability: the standbys whose confirmations it wants its
    /// commits to wait for (the ones streaming; empty when too few do or a commit stalled). It
    /// waits only for those the operator has recorded in `status.primaryWaitsFor`, and
    /// drops one from here only after it stopped waiting for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits_for: Option<Vec<String>>,
    /// The last time this former primary rejoined as a standby and gave up commits it had that the
    /// new primary lacks (absent until it first did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discarded_on_rejoin: Option<DiscardedOnRejoin>,
    /// The `dbservice.dev/reload-requested-at` value this instance has carried out (its reload, or
    /// the start that read the files afresh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reloaded: Option<String>,
    /// The data volume's size and use (for spec.storageGrowth); republished when either changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<crate::api::storage::VolumeReport>,
}

/// What a former primary gave up when it rejoined as a standby of a new primary (issue 38): its
/// WAL after the point where the new primary's timeline forked off, which pg_rewind discards.
/// Commits there were never on the new primary: under asynchronous replication a client may have
/// heard of them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiscardedOnRejoin {
    /// When it rejoined (RFC 3339).
    pub at: String,
    /// Where its WAL and the new primary's timeline diverged.
    pub diverged_at: String,
    /// The new primary's timeline it rejoined.
    pub timeline: u32,
    /// Commit records (and prepared transactions) after the divergence.
    pub commits: u64,
    /// Bytes of its WAL after the divergence.
    pub bytes: u64,
}

/// Settings the operator owns that an agent found changed in postgresql.auto.conf (an `ALTER
/// SYSTEM` by someone else) and put back (issue 37). Names only: a value may hold a secret.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OwnedSettingsReverted {
    /// When they were put back (RFC 3339).
    pub at: String,
    /// Their names.
    #[schemars(length(max = 64))]
    pub settings: Vec<String>,
    /// How many times the agent has put owned settings back since it started: each revert has
    /// its own number, so that two in the same second are still told apart.
    pub count: u64,
}

/// Whether a primary's WAL archiving works, as its agent last saw it in pg_stat_archiver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchivingReport {
    /// The last attempt failed (no success since the last failure).
    pub failing: bool,
    /// Failing: when the first failure of the current streak was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<DateTime<Utc>>,
    /// Failing: the WAL segment PostgreSQL could not archive (it keeps it in pg_wal and retries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_wal: Option<String>,
}

/// What the API shows of an instance's pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    /// No pod object: the kubelet has confirmed its containers stopped (or it was never created).
    Gone,
    /// The pod exists but is not Ready (or is terminating).
    NotReady,
    /// The pod is Ready.
    Ready,
}

/// One instance as observed by the operator.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceObservation {
    /// Instance (pod) name.
    pub name: String,
    /// Its pod.
    pub pod: PodState,
    /// Its agent's last report, if any.
    pub report: Option<InstanceReport>,
    /// Fenced by a person (DatabaseService annotation).
    pub fenced_by_hand: bool,
}

/// Kind of primary change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TransitionKind {
    /// The primary failed.
    Failover,
    /// A person asked for another primary.
    Switchover,
}

/// A primary change in progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Transition {
    /// Failover or switchover.
    pub kind: TransitionKind,
    /// The primary being replaced.
    pub from: String,
    /// When it started (timings in events and the ledger are measured from here).
    #[schemars(with = "String")]
    pub started_at: DateTime<Utc>,
}

/// Failover state persisted in the DatabaseService status: everything the failover decision (`operator::database::failover::decide`) needs to resume.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverStatus {
    /// The instance behind Service `<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_primary: Option<String>,
    /// The instance that should be primary: equal to `current_primary` at rest, another name while
    /// it is promoted, [`PENDING`] while a failover looks for a candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_primary: Option<String>,
    /// When the current primary was first seen unhealthy (the failover delay counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub primary_failing_since: Option<DateTime<Utc>>,
    /// The primary change in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition: Option<Transition>,
    /// Timeline of the current primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<u32>,
    /// `preferred` durability: the standbys the primary may make its commits wait for (a
    /// failover counts its quorum over them), as its agent last reported them; it waits only for
    /// recorded ones. Empty: it acknowledges commits alone. Absent before its first report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub primary_waits_for: Option<Vec<String>>,
}

/// One instance as shown in the DatabaseService status (from its agent's last report).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// Instance (pod) name.
    pub name: String,
    /// primary, standby, or unknown while its agent has not reported.
    pub role: String,
    /// PostgreSQL answers queries.
    pub ready: bool,
    /// Standby: WAL receiver connected to the primary.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub streaming: bool,
    /// Standby: bytes behind the primary's last known position, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<u64>,
    /// Timeline it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<u32>,
    /// Whether it runs with the current `spec.postgresql.parameters` (configured and reloaded),
    /// once its agent reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters_applied: Option<bool>,
    /// Settings it applies only after a restart (the rollout of a restart-only change restarts it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub pending_restart: Vec<String>,
    /// The last time its agent put back settings the operator owns after an `ALTER SYSTEM`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_settings_reverted: Option<OwnedSettingsReverted>,
    /// The last time it rejoined as a former primary with commits the new primary lacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discarded_on_rejoin: Option<DiscardedOnRejoin>,
}

/// Failover settings (spec.failover, validated by the webhook).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailoverSettings {
    /// How long the primary must stay unhealthy before a failover starts.
    pub failover_delay: Duration,
    /// A standby further behind than this many bytes is never promoted by a failover.
    pub maximum_lag_bytes: u64,
    /// How long standbys get to stop their WAL receivers and report final positions.
    pub standby_report_timeout: Duration,
    /// A failover with no eligible candidate for this long is abandoned (and retried later).
    pub candidate_timeout: Duration,
    /// A switchover that has not completed in this long is abandoned (or becomes a failover).
    pub switchover_timeout: Duration,
    /// Standbys the primary may have had confirm each commit (0: asynchronous): set by the
    /// failover pass from the durability in force ([`FailoverStatus::primary_waits_for`]), not
    /// from the spec alone. A failover then waits for the final positions of a quorum of
    /// [`FailoverSettings::synchronous_members`] ([`crate::api::synchronous::quorum`]) and
    /// promotes only the most advanced of those.
    pub synchronous_standbys: u32,
    /// The standbys the primary may have waited for; None: every instance but the primary.
    pub synchronous_members: Option<Vec<String>>,
}

impl Default for FailoverSettings {
    fn default() -> Self {
        FailoverSettings {
            failover_delay: Duration::ZERO,
            // Patroni's maximum_lag_on_failover: a standby whose WAL receiver stalled is not
            // promoted with everything since (issue 38 measured 2,584 commits lost so).
            maximum_lag_bytes: 1024 * 1024,
            standby_report_timeout: Duration::from_secs(10),
            candidate_timeout: Duration::from_secs(60),
            switchover_timeout: Duration::from_secs(30),
            synchronous_standbys: 0,
            synchronous_members: None,
        }
    }
}
