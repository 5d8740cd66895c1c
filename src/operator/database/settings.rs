//! Tunables of the controller, from the command line.

use std::time::Duration;

/// Tunables of the controller.
#[derive(Clone, Debug)]
pub struct ControllerSettings {
    /// Minimum storage size (validation).
    pub min_storage_size: String,
    /// Image prefixes spec.image and spec.pooler.image must start with (validation; empty: any).
    pub allowed_image_prefixes: Vec<String>,
    /// Whether `spec.bootstrap.import.roles: true` is allowed (validation).
    pub allow_import_with_source_roles: bool,
    /// How long a version change may stay unhealthy before it is rolled back.
    pub progress_deadline: Duration,
    /// How long a pod may be not ready (or a standby unschedulable) before the operator acts.
    pub unhealthy_threshold: Duration,
    /// First restart backoff; doubles with each restart.
    pub restart_backoff: Duration,
    /// Longest restart backoff.
    pub restart_backoff_cap: Duration,
    /// How long to stay degraded before probing for resources again.
    pub restore_probe: Duration,
    /// DatabaseServices reconciled at once.
    pub concurrency: u16,
    /// Only this namespace, or all when None.
    pub watch_namespace: Option<String>,
    /// Only DatabaseServices matching this label selector, or all when None.
    pub selector: Option<String>,
    /// Image with the instance agent (the operator's own): None runs PostgreSQL without it
    /// (roles fixed by ordinal, no failover).
    pub instance_image: Option<String>,
    /// A NetworkPolicy for each database's pods, letting in the pods this selects (empty: every
    /// pod of the namespace) and the database's own; None: no NetworkPolicy.
    pub database_network_policy: Option<std::collections::BTreeMap<String, String>>,
    /// PgBouncer's image when `spec.pooler.image` is unset.
    pub pooler_image: String,
}

impl Default for ControllerSettings {
    /// The command line's defaults.
    fn default() -> Self {
        Self {
            min_storage_size: "1Gi".into(),
            allowed_image_prefixes: Vec::new(),
            allow_import_with_source_roles: false,
            progress_deadline: Duration::from_secs(300),
            unhealthy_threshold: Duration::from_secs(60),
            restart_backoff: Duration::from_secs(30),
            restart_backoff_cap: Duration::from_secs(1800),
            restore_probe: Duration::from_secs(300),
            concurrency: 16,
            watch_namespace: None,
            selector: None,
            instance_image: None,
            database_network_policy: None,
            pooler_image: crate::api::pooler::DEFAULT_POOLER_IMAGE.into(),
        }
    }
}
