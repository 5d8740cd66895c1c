//! The `DatabaseService` custom resource (`dbservice.dev/v1`): the Rust types are the single
//! source of truth for the CRD (see [`crate::api::crd`]).

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every resource this operator owns.
pub const GROUP: &str = "dbservice.dev";
/// Finalizer that lets the controller apply the deletion policy before the object goes away.
pub const FINALIZER: &str = "dbservice.dev/cleanup";
/// Field manager used for every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "dbservice-operator";
/// Default number of PostgreSQL instances (one primary, no standby).
pub const DEFAULT_REPLICAS: i32 = 1;
/// Fewest instances a DatabaseService may ask for.
pub const MIN_REPLICAS: i32 = 1;
/// Most instances a DatabaseService may ask for (one primary plus four standbys).
pub const MAX_REPLICAS: i32 = 5;

/// Desired state of a PostgreSQL database service.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "dbservice.dev",
    version = "v1",
    kind = "DatabaseService",
    plural = "databaseservices",
    shortname = "dbs",
    shortname = "dbsvc",
    namespaced,
    status = "DatabaseServiceStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.currentVersion"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Primary","type":"string","jsonPath":".status.currentPrimary"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseServiceSpec {
    /// PostgreSQL version, e.g. "16" or "16.4"; the major must be supported (14 to 18).
    pub version: String,
    /// Size of each instance's data volume, a Kubernetes quantity such as "10Gi"; it may grow, never shrink.
    pub storage_size: String,
    /// Number of instances: one primary plus streaming standbys. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 5))]
    pub replicas: Option<i32>,
    /// Name of the application database; immutable.
    #[schemars(length(min = 1, max = 63))]
    pub database_name: String,
    /// Name of the application role (it owns the database and is not a superuser); immutable, not
    /// "postgres" or "replicator" and not starting with "pg_".
    #[schemars(length(min = 1, max = 63))]
    pub username: String,
    /// Container image; defaults to postgres:<version>. The tag must not be "latest".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub image: Option<String>,
    /// How an in-place major upgrade (a `version` of a newer major) moves the data: `copy`
    /// (default: twice the space, the old data kept until the new server accepted writes) or
    /// `link` (hard links: fast, no way back once the new server started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_method: Option<crate::api::major_upgrade::UpgradeMethod>,
    /// StorageClass of the data volumes; the cluster default when absent. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub storage_class_name: Option<String>,
    /// Grow the data volumes as they fill, up to a limit (the StorageClass must allow expansion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_growth: Option<crate::api::storage::StorageGrowthSpec>,
    /// CPU and memory for the PostgreSQL container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// What happens to the volumes and the credentials when the DatabaseService is deleted. Defaults to Retain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<DeletionPolicy>,
    /// Stop reconciling (for maintenance); the objects are left as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Hibernate: stop every instance and the pooler, keeping volumes, Secrets, Services and
    /// backups; `false` (or absent) wakes it with the same data and the same primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernated: Option<bool>,
    /// Continuous WAL archiving and base backups to an S3-compatible object store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<crate::api::backup::BackupSpec>,
    /// How a new database gets its first data: empty (default) or recovered from backups. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<crate::api::backup::BootstrapSpec>,
    /// Failover, switchover and fencing settings (all optional, with safe defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverSpec>,
    /// Allow logins over the network as the superuser `postgres` (its password is in the Secret
    /// NAME-superuser). Off by default: the superuser can then log in only inside the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_superuser_access: Option<bool>,
    /// TLS of every PostgreSQL connection (always on; by default with a certificate the operator
    /// issues from the database's own CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// PostgreSQL's own configuration: server parameters and extra pg_hba rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgresql: Option<crate::api::postgresql::PostgresqlSpec>,
    /// Roles kept beside the application's (`spec.username`) by the primary's agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub roles: Vec<crate::api::roles::RoleSpec>,
    /// Databases kept beside the application's (`spec.databaseName`) by the primary's agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub databases: Vec<crate::api::roles::DatabaseSpec>,
    /// PostgreSQL in Prometheus beyond the agents' own metrics: the user's queries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring: Option<crate::api::monitoring::MonitoringSpec>,
    /// Scheduling of the instances: affinity, tolerations, node selector, topology spread,
    /// priority class, and the PodDisruptionBudgets.
    #[serde(flatten)]
    pub placement: crate::api::placement::PlacementSpec,
    /// PgBouncer in front of the database: Services NAME-pooler (read-write) and
    /// NAME-pooler-replicas (read-only), paused around switchovers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooler: Option<crate::api::pooler::PoolerSpec>,
}

/// spec.tls: where the server certificate comes from.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// A kubernetes.io/tls Secret of this namespace with `tls.crt`, `tls.key` and `ca.crt` (what
    /// cert-manager writes for a Certificate) to serve instead of the operator's certificate.
    /// Its names must cover the Services NAME, NAME-replicas and `*.NAME-headless`. Unset: the
    /// operator issues `NAME-tls` from its CA `NAME-ca` and renews it 30 days before expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_certificate_secret: Option<String>,
}

/// Failover and switchover settings (spec.failover), validated by the webhook. A switchover is
/// asked for with the annotation `dbservice.dev/switchover-to: <instance>` on the DatabaseService,
/// fencing by hand with `dbservice.dev/fenced-instances: <instance>[,<instance>...]`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverSpec {
    /// Seconds the primary must stay unhealthy before a failover starts (default 0, at most 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_seconds: Option<u32>,
    /// A standby further behind than this many bytes of WAL (behind the last position the primary
    /// published) is never promoted by a failover: the failover waits for a better standby or the
    /// old primary instead (default 1048576 = 1 MiB, as Patroni's `maximum_lag_on_failover`; at
    /// least 0, at most 1 TiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum_lag_bytes: Option<u64>,
    /// Seconds a switchover may take before it is abandoned (default 30, from 5 to 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switchover_timeout_seconds: Option<u32>,
    /// Standbys that must confirm each commit before it is acknowledged (default 0: asynchronous
    /// replication; at most replicas - 1). With k > 0 the primary sets
    /// `synchronous_standby_names = 'ANY k (<every other instance>)'`; while fewer than k standbys
    /// are connected, commits wait (durability over availability: an acknowledged commit is
    /// never on the primary alone), and a failover promotes only the most advanced of a quorum of
    /// standbys that reported their final positions, so that it loses no acknowledged commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synchronous_standbys: Option<u32>,
    /// How sure an acknowledged commit is to survive a failover: `required` (commits wait for
    /// `synchronousStandbys` standbys, 1 by default), `preferred` (the same while enough standbys
    /// stream, asynchronous with a Warning while they do not) or `none` (asynchronous). Default:
    /// `preferred` with two or more instances, unless `synchronousStandbys` is set (0: `none`, k:
    /// `required`) or `synchronous_commit` is off or local (`none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_durability: Option<crate::api::synchronous::DataDurability>,
}

/// Fate of the data volumes and the credentials Secret on deletion.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Keep PVCs and the credentials Secret (ownerReferences removed so nothing collects them).
    #[default]
    Retain,
    /// Delete PVCs and the credentials Secret with the DatabaseService.
    Delete,
}

impl std::fmt::Display for DeletionPolicy {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            DeletionPolicy::Retain => "Retain",
            DeletionPolicy::Delete => "Delete",
        })
    }
}

/// Observed state, written by the controller only when it changes.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseServiceStatus {
    /// Failover state: currentPrimary, targetPrimary, timeline, the transition in progress.
    #[serde(flatten)]
    pub failover: crate::api::failover::FailoverStatus,
    /// The durability in force (spec.failover.dataDurability with its defaults), recorded once
    /// announced: the agents follow this, so a new default reaches a database only after its
    /// Event and ledger entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<crate::api::synchronous::Durability>,
    /// The instances with their roles and lag (from their agents' reports).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub instances: Vec<crate::api::failover::InstanceStatus>,
    /// Summary: Provisioning, Running, Updating, Degraded, RollingBack, Failed or Deleting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Ready, Progressing, Degraded, InvalidSpec, StorageReady, RolledBack, CredentialsReady.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Instances passing their readiness probe.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Version the workload runs now (may differ from spec after a rollback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// Last version that ran with every instance ready; the rollback target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stable_version: Option<String>,
    /// Image of the last stable version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stable_image: Option<String>,
    /// Requested size and binding state of the data volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageStatus>,
    /// A version that failed to become healthy; not retried until the spec changes again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_version: Option<String>,
    /// The generation whose version change was rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_generation: Option<i64>,
    /// When the current rollout started (RFC 3339); set once per rollout, not on every pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_started_at: Option<String>,
    /// Restarts made for the current unhealthy episode (drives the exponential backoff).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restart_count: i32,
    /// When the last restart was made (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart_at: Option<String>,
    /// The `dbservice.dev/restart-requested-at` value last carried out (a rolling restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_requested: Option<String>,
    /// The `dbservice.dev/reload-requested-at` value every instance has carried out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reloaded: Option<String>,
    /// When standbys were last scaled away (RFC 3339); the restore probe waits from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded_at: Option<String>,
    /// Instances actually scheduled when standbys were scaled away for lack of resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded_replicas: Option<i32>,
    /// Recovery from another database's backups (spec.bootstrap.recovery), as its first
    /// instance reports it: phase, backup, target, timings, the last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<crate::api::recovery::RecoveryStatus>,
    /// What the primary's agent last did with `spec.roles` and `spec.databases`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<crate::api::roles::DeclaredObjectsStatus>,
    /// The import of `spec.bootstrap.import`, as the primary's agent reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<crate::api::import::ImportStatus>,
    /// The last in-place major upgrade: its phase, steps and downtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_upgrade: Option<crate::api::major_upgrade::MajorUpgradeStatus>,
    /// The archive's server name after an in-place major upgrade (the new system's WAL and
    /// backups go to a new place); none: `spec.backup.objectStore.serverName` or the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub archive_server_name: Option<String>,
    /// The pooler's pods (with `spec.pooler`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooler: Option<crate::api::pooler::PoolerStatus>,
}

fn is_zero(value: &i32) -> bool {
    *value == 0
}

/// Data volume summary.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageStatus {
    /// Requested size per instance.
    pub requested: String,
    /// PVCs bound out of those expected.
    pub bound_claims: i32,
    /// PVCs expected (one per instance).
    pub expected_claims: i32,
    /// The size the operator grew every volume to (spec.storageGrowth), above spec.storageSize.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grown_to: Option<String>,
    /// The size the volumes were asked for before that growth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grown_from: Option<String>,
    /// The largest volume size (bytes) the agents reported when the volumes last grew: once the
    /// claims' capacity has grown past `capacityBytesBeforeGrowth`, a report of no more than this
    /// is from before the growth and does not count towards the next one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_bytes_before_growth: Option<u64>,
    /// The smallest claim capacity (bytes) when the volumes last grew. A driver that rounds sizes up
    /// may leave it unchanged by a small growth; the reports are then current as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes_before_growth: Option<u64>,
    /// A volume is past spec.storageGrowth.whenUsedPercent and already at its limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_limit: Option<bool>,
}

/// Lifecycle summary shown in `kubectl get dbs`.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Objects are being created and the first instance is not ready yet.
    Provisioning,
    /// Every instance is ready on the desired version.
    Running,
    /// A spec change is rolling out.
    Updating,
    /// The primary is ready but some standbys are missing.
    Degraded,
    /// A version change failed and the workload is going back to the last stable version.
    RollingBack,
    /// The spec is invalid or the database cannot become ready.
    Failed,
    /// The DatabaseService is being deleted.
    Deleting,
    /// `spec.hibernated` is set and instances are still stopping.
    Hibernating,
    /// `spec.hibernated` is set and no instance runs: the data waits on its volumes.
    Hibernated,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, formatter)
    }
}

impl DatabaseServiceSpec {
    /// `spec.postgresql.parameters` (empty when unset).
    pub fn parameters(&self) -> std::collections::BTreeMap<String, String> {
        self.postgresql.as_ref().map(|postgresql| postgresql.parameters.clone()).unwrap_or_default()
    }

    /// `spec.postgresql.pgHba` (empty when unset).
    pub fn hba_rules(&self) -> &[String] {
        self.postgresql.as_ref().map_or(&[], |postgresql| postgresql.pg_hba.as_slice())
    }

    /// `spec.roles` and `spec.databases` with the application's role.
    pub fn declarations(&self) -> crate::api::roles::Declarations {
        crate::api::roles::Declarations {
            roles: self.roles.clone(),
            databases: self.databases.clone(),
            application_user: self.username.clone(),
            pooled_databases: Vec::new(),
        }
    }

    /// `spec.bootstrap.initdb`, when set.
    pub fn initdb(&self) -> Option<&crate::api::postgresql::InitdbSpec> {
        self.bootstrap.as_ref().and_then(|bootstrap| bootstrap.initdb.as_ref())
    }

    /// The failover settings, with the defaults for what is not set.
    pub fn failover_settings(&self) -> crate::api::failover::FailoverSettings {
        let defaults = crate::api::failover::FailoverSettings::default();
        let Some(spec) = &self.failover else { return defaults };
        let seconds = |value: Option<u32>, default: std::time::Duration| {
            value.map_or(default, |value| std::time::Duration::from_secs(value.into()))
        };
        crate::api::failover::FailoverSettings {
            failover_delay: seconds(spec.delay_seconds, defaults.failover_delay),
            maximum_lag_bytes: spec.maximum_lag_bytes.unwrap_or(defaults.maximum_lag_bytes),
            switchover_timeout: seconds(spec.switchover_timeout_seconds, defaults.switchover_timeout),
            ..defaults
        }
    }

    /// The durability this spec asks for, defaults applied (see
    /// [`crate::api::synchronous::durability`]).
    pub fn durability(&self) -> crate::api::synchronous::Durability {
        let failover = self.failover.as_ref();
        crate::api::synchronous::durability(
            failover.and_then(|failover| failover.data_durability),
            failover.and_then(|failover| failover.synchronous_standbys),
            self.replicas_or_default(),
            self.synchronous_commit(),
        )
    }

    /// `synchronous_commit` as `spec.postgresql.parameters` sets it (the name in any case).
    pub fn synchronous_commit(&self) -> Option<&str> {
        let mut parameters = self.postgresql.as_ref()?.parameters.iter();
        parameters.find(|(name, _)| name.eq_ignore_ascii_case("synchronous_commit")).map(|(_, value)| value.as_str())
    }

    /// Replicas with the default applied.
    pub fn replicas_or_default(&self) -> i32 {
        self.replicas.unwrap_or(DEFAULT_REPLICAS)
    }

    /// Image with the default applied.
    pub fn image_or_default(&self) -> String {
        self.image.clone().unwrap_or_else(|| default_image(&self.version))
    }

    /// Deletion policy with the default applied.
    pub fn deletion_policy_or_default(&self) -> DeletionPolicy {
        self.deletion_policy.unwrap_or_default()
    }

    /// Whether the superuser may log in over the network.
    pub fn superuser_access_enabled(&self) -> bool {
        self.enable_superuser_access.unwrap_or(false)
    }

    /// The user's server certificate Secret, when one is named (else the operator issues one).
    pub fn user_server_certificate(&self) -> Option<&str> {
        self.tls.as_ref().and_then(|tls| tls.server_certificate_secret.as_deref())
    }

    /// Whether reconciliation is paused.
    pub fn is_paused(&self) -> bool {
        self.paused.unwrap_or(false)
    }

    /// Whether the database is to hibernate (no instance, no pooler runs).
    pub fn is_hibernated(&self) -> bool {
        self.hibernated.unwrap_or(false)
    }
}

/// The official image for a PostgreSQL version.
pub fn default_image(version: &str) -> String {
    format!("postgres:{version}")
}

/// Instances fenced by hand, from the DatabaseService annotation.
pub fn fenced_instances(database: &DatabaseService) -> Vec<String> {
    database
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(crate::api::failover::FENCED_ANNOTATION))
        .map(|list| list.split(',').map(str::trim).filter(|name| !name.is_empty()).map(String::from).collect())
        .unwrap_or_default()
}

impl DatabaseService {
    /// The server name this database archives under: after an in-place major upgrade past
    /// `pg_upgrade` a new one (a new system identifier starts a new archive), otherwise the
    /// last upgrade's, or `spec.backup.objectStore.serverName`, or the name. None without
    /// `spec.backup`.
    pub fn archive_server_name(&self) -> Option<String> {
        let backup = self.spec.backup.as_ref()?;
        let name = self.metadata.name.clone().unwrap_or_default();
        let base = backup.object_store.server_name_or(&name).to_string();
        let status = self.status.as_ref();
        let upgrading = status.and_then(|status| status.major_upgrade.as_ref()).filter(|upgrade| {
            upgrade.primary_released() || upgrade.phase == crate::api::major_upgrade::MajorUpgradePhase::Completed
        });
        if let Some(major) = upgrading.and_then(|upgrade| crate::api::version::major_version(&upgrade.to_version)) {
            return Some(crate::api::major_upgrade::upgraded_server_name(&base, major));
        }
        Some(status.and_then(|status| status.archive_server_name.clone()).unwrap_or(base))
    }
}
