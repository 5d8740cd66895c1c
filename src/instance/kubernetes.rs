//! The agent's [`ControlPlane`] in Kubernetes: the operator's wishes come from the DatabaseService
//! status (`currentPrimary`, `targetPrimary`) and its fencing annotation, read from a watch of that
//! one object (no periodic GET: a steady database costs the API nothing but lease renewals), the
//! report goes into the
//! pod annotation [`INSTANCE_REPORT_ANNOTATION`] (written only on change, by the agent), and the
//! primary Lease `<name>-primary` is replaced with compare-and-swap on its resourceVersion.
//!
//! Every call has a short timeout and none is retried: a failed renewal simply counts towards the
//! self-fencing deadline, which is the point.

use crate::admission::validation::carried_out_by_agents;
use crate::api::database_service::fenced_instances;
use crate::api::database_service::DatabaseService;
use crate::api::failover::{FailoverStatus, InstanceReport, TransitionKind, INSTANCE_REPORT_ANNOTATION};
use crate::api::names::primary_lease_name;
use crate::instance::{ControlPlane, ControlPlaneError, Desired, ServerConfiguration, SynchronousStandbys, Upstream};
use crate::lease::LeaseRecord;
use crate::lease::{lease_record, with_record};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use serde_json::json;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Field manager of the agent's writes.
pub const AGENT_FIELD_MANAGER: &str = "dbservice-instance";

/// What instance `me` should do, from the failover status: follow `currentPrimary` through its
/// stable DNS name `<pod>.<domain>` once no change is in progress (during one, it follows nobody).
pub fn desired_from(status: &FailoverStatus, fenced: &[String], me: &str, domain: &str, port: u16) -> Desired {
    let settled = status.current_primary.is_some() && status.current_primary == status.target_primary;
    let upstream = status
        .current_primary
        .as_ref()
        .filter(|current| settled && current.as_str() != me)
        .map(|current| Upstream { host: format!("{current}.{domain}"), port });
    Desired {
        target_primary: status.target_primary.clone(),
        upstream,
        fenced: fenced.iter().any(|name| name == me),
        switchover: status.transition.as_ref().is_some_and(|transition| transition.kind == TransitionKind::Switchover),
        switchover_timeout: crate::api::failover::FailoverSettings::default().switchover_timeout,
        synchronous: None,
        instances: Vec::new(),
        configuration: None,
        declarations: None,
        import: None,
        major_upgrade: None,
        reload_requested: None,
    }
}

/// The instances (pods) `database`'s spec asks for.
pub fn instance_names(database: &DatabaseService) -> Vec<String> {
    let name = database.metadata.name.clone().unwrap_or_default();
    (0..database.spec.replicas_or_default()).map(|ordinal| format!("{name}-{ordinal}")).collect()
}

/// How instance `me` of `database` keeps `synchronous_standby_names` (see
/// [`crate::api::synchronous::synchronous_standby_names`]), over every instance the spec asks
/// for, under the durability in force: the one the operator recorded in the status (announced),
/// or before it did, `required` from the spec (a user's explicit choice) and none otherwise.
pub fn synchronous_for(database: &DatabaseService, me: &str) -> SynchronousStandbys {
    use crate::api::synchronous::DataDurability;
    let status = database.status.as_ref();
    let in_force =
        crate::api::synchronous::in_force(database.spec.durability(), status.and_then(|status| status.durability));
    let instances = instance_names(database);
    let names = crate::api::synchronous::synchronous_standby_names(&instances, in_force.standbys, me);
    if in_force.mode != DataDurability::Preferred {
        return SynchronousStandbys::Fixed(names);
    }
    SynchronousStandbys::Preferred {
        members: instances.into_iter().filter(|name| name != me).collect(),
        count: in_force.standbys,
        recorded: status.and_then(|status| status.failover.primary_waits_for.clone()).unwrap_or_default(),
    }
}

/// Watches the one DatabaseService `name` (a metadata.name field selector, which RBAC
/// resourceNames allow) and keeps its latest version in the returned channel.
pub fn watch_database(api: Api<DatabaseService>, name: &str) -> watch::Receiver<Option<Arc<DatabaseService>>> {
    let (sender, receiver) = watch::channel(None);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut accepted = None;
        let mut events = watcher(api, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(database) | watcher::Event::InitApply(database)) => {
                    // The agent carries out only a spec the one validation function accepts (an
                    // object stored past the webhook keeps the last accepted spec in force).
                    let (database, refusal) = carried_out_by_agents(database, &mut accepted);
                    if let Some(reason) = refusal {
                        tracing::warn!(%reason, "not carrying out what validation refuses in the spec");
                    }
                    sender.send_replace(Some(Arc::new(database)));
                }
                Ok(watcher::Event::Delete(_)) => {
                    sender.send_replace(None);
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "watching the DatabaseService"),
            }
            if sender.is_closed() {
                return;
            }
        }
    });
    receiver
}

/// [`ControlPlane`] over the Kubernetes API.
pub struct KubeControlPlane {
    database_watch: watch::Receiver<Option<Arc<DatabaseService>>>,
    pods: Api<Pod>,
    leases: Api<Lease>,
    database: String,
    pod: String,
    domain: String,
    port: u16,
    lease_duration: Duration,
    call_timeout: Duration,
    /// The Lease as last read: a write right after a read (the agent's pattern) needs no second GET.
    last_lease: std::sync::Mutex<Option<Lease>>,
}

impl KubeControlPlane {
    /// The control plane of instance `pod` of database `database` in `namespace`. `watch_client`
    /// serves the long-running watch (its read timeout must exceed the watch's own, 290 s);
    /// `client` every other call, each bounded by `call_timeout`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        watch_client: Client,
        namespace: &str,
        database: &str,
        pod: &str,
        port: u16,
        lease_duration: Duration,
        call_timeout: Duration,
    ) -> Self {
        KubeControlPlane {
            database_watch: watch_database(Api::namespaced(watch_client, namespace), database),
            pods: Api::namespaced(client.clone(), namespace),
            leases: Api::namespaced(client, namespace),
            database: database.into(),
            pod: pod.into(),
            domain: format!("{}.{namespace}.svc", crate::api::names::ChildNames::headless_service(database)),
            port,
            lease_duration,
            call_timeout,
            last_lease: std::sync::Mutex::new(None),
        }
    }

    /// The DatabaseService as watched (None until first seen), for the metrics' custom queries.
    pub fn database_watch(&self) -> watch::Receiver<Option<Arc<DatabaseService>>> {
        self.database_watch.clone()
    }

    async fn bounded<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ControlPlaneError> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(result) => result.map_err(|error| ControlPlaneError(format!("{what}: {error}"))),
            Err(_) => Err(ControlPlaneError(format!("{what}: timed out after {:?}", self.call_timeout))),
        }
    }

    /// Publishes the progress of a recovery into the pod annotation
    /// [`crate::api::recovery::RECOVERY_ANNOTATION`], for the operator's status and ledger.
    pub async fn publish_recovery(
        &self,
        status: &crate::api::recovery::RecoveryStatus,
    ) -> Result<(), ControlPlaneError> {
        let text = serde_json::to_string(status).expect("a recovery status serializes");
        let patch =
            Patch::Merge(json!({"metadata": {"annotations": {crate::api::recovery::RECOVERY_ANNOTATION: text}}}));
        let params = PatchParams { field_manager: Some(AGENT_FIELD_MANAGER.into()), ..Default::default() };
        self.bounded("publish the recovery status", self.pods.patch(&self.pod, &params, &patch)).await?;
        Ok(())
    }

    async fn lease(&self) -> Result<Lease, ControlPlaneError> {
        let lease =
            self.bounded("read the primary lease", self.leases.get(&primary_lease_name(&self.database))).await?;
        *self.last_lease.lock().expect("lease cache lock") = Some(lease.clone());
        Ok(lease)
    }
}

impl ControlPlane for KubeControlPlane {
    async fn desired(&self) -> Result<Desired, ControlPlaneError> {
        let database = self.database_watch.borrow().clone();
        let database =
            database.ok_or_else(|| ControlPlaneError(format!("DatabaseService {} not seen yet", self.database)))?;
        let status = database.status.as_ref().map(|status| status.failover.clone()).unwrap_or_default();
        let mut desired = desired_from(&status, &fenced_instances(&database), &self.pod, &self.domain, self.port);
        desired.synchronous = Some(synchronous_for(&database, &self.pod));
        desired.switchover_timeout = database.spec.failover_settings().switchover_timeout;
        desired.instances = instance_names(&database);
        desired.configuration = Some(ServerConfiguration {
            parameters: database.spec.parameters(),
            hba_rules: database.spec.hba_rules().to_vec(),
        });
        desired.declarations = Some(crate::api::declarations::declarations(&database));
        // Once the status says Completed the import is history: a later primary never runs it.
        let imported = database
            .status
            .as_ref()
            .and_then(|status| status.import.as_ref())
            .is_some_and(|import| import.phase == crate::api::import::ImportPhase::Completed);
        desired.reload_requested =
            kube::ResourceExt::annotations(database.as_ref()).get(crate::api::failover::RELOAD_ANNOTATION).cloned();
        desired.import =
            database.spec.bootstrap.as_ref().and_then(|bootstrap| bootstrap.import.clone()).filter(|_| !imported);
        desired.major_upgrade = database
            .status
            .as_ref()
            .and_then(|status| status.major_upgrade.as_ref())
            .and_then(crate::instance::upgrade_keeper::instruction);
        Ok(desired)
    }

    async fn changed(&self) {
        // A change between the last `desired` and this call waits for the next one or the tick.
        let mut watch = self.database_watch.clone();
        watch.borrow_and_update();
        let _ = watch.changed().await;
    }

    async fn publish(&self, report: &InstanceReport) -> Result<(), ControlPlaneError> {
        let text = serde_json::to_string(report).expect("reports serialize");
        let patch = Patch::Merge(json!({"metadata": {"annotations": {INSTANCE_REPORT_ANNOTATION: text}}}));
        let params = PatchParams { field_manager: Some(AGENT_FIELD_MANAGER.into()), ..Default::default() };
        self.bounded("publish the report", self.pods.patch(&self.pod, &params, &patch)).await?;
        Ok(())
    }

    async fn read_lease(&self) -> Result<(LeaseRecord, String), ControlPlaneError> {
        let lease = self.lease().await?;
        Ok((lease_record(&lease), lease.metadata.resource_version.clone().unwrap_or_default()))
    }

    async fn write_lease(&self, version: &str, record: &LeaseRecord) -> Result<Option<String>, ControlPlaneError> {
        let cached = self.last_lease.lock().expect("lease cache lock").take();
        let mut lease = match cached.filter(|lease| lease.metadata.resource_version.as_deref() == Some(version)) {
            Some(lease) => lease,
            None => self.lease().await?,
        };
        if lease.metadata.resource_version.as_deref() != Some(version) {
            return Ok(None);
        }
        lease.metadata.managed_fields = None;
        let lease = with_record(lease, record, self.lease_duration);
        let params = PostParams { field_manager: Some(AGENT_FIELD_MANAGER.into()), ..Default::default() };
        let name = primary_lease_name(&self.database);
        match tokio::time::timeout(self.call_timeout, self.leases.replace(&name, &params, &lease)).await {
            Ok(Ok(written)) => Ok(Some(written.metadata.resource_version.unwrap_or_default())),
            Ok(Err(kube::Error::Api(status))) if status.code == 409 => Ok(None),
            Ok(Err(error)) => Err(ControlPlaneError(format!("write the primary lease: {error}"))),
            Err(_) => {
                Err(ControlPlaneError(format!("write the primary lease: timed out after {:?}", self.call_timeout)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three_instances(failover: serde_json::Value, status: serde_json::Value) -> DatabaseService {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
            "metadata": {"name": "db", "namespace": "shop"},
            "spec": {"version": "16", "storageSize": "1Gi", "databaseName": "app", "username": "app_user",
                     "replicas": 3, "failover": failover},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn agents_follow_the_recorded_durability_and_the_spec_only_for_required() {
        let members = vec!["db-1".to_string(), "db-2".to_string()];
        // The new default is not carried out before the operator recorded (announced) it.
        let unannounced = three_instances(serde_json::json!({}), serde_json::json!({}));
        assert_eq!(synchronous_for(&unannounced, "db-0"), SynchronousStandbys::Fixed(String::new()));
        let required = three_instances(serde_json::json!({"synchronousStandbys": 1}), serde_json::json!({}));
        assert_eq!(synchronous_for(&required, "db-0"), SynchronousStandbys::Fixed(r#"ANY 1 ("db-1","db-2")"#.into()));
        let recorded = serde_json::json!({
            "durability": {"mode": "preferred", "standbys": 1},
            "primaryWaitsFor": ["db-2"],
        });
        let preferred = three_instances(serde_json::json!({}), recorded);
        assert_eq!(
            synchronous_for(&preferred, "db-0"),
            SynchronousStandbys::Preferred { members, count: 1, recorded: vec!["db-2".into()] }
        );
    }

    fn status(current: Option<&str>, target: Option<&str>) -> FailoverStatus {
        FailoverStatus {
            current_primary: current.map(String::from),
            target_primary: target.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn standbys_follow_the_current_primary_only_when_settled() {
        let domain = "db-headless.ns.svc";
        let settled = desired_from(&status(Some("db-1"), Some("db-1")), &[], "db-0", domain, 5432);
        assert_eq!(settled.upstream, Some(Upstream { host: "db-1.db-headless.ns.svc".into(), port: 5432 }));
        assert_eq!(settled.target_primary.as_deref(), Some("db-1"));
        assert!(!settled.fenced);
        let primary = desired_from(&status(Some("db-1"), Some("db-1")), &[], "db-1", domain, 5432);
        assert_eq!(primary.upstream, None);
        let pending = desired_from(&status(Some("db-1"), Some("pending")), &[], "db-0", domain, 5432);
        assert_eq!(pending.upstream, None);
        assert_eq!(pending.target_primary.as_deref(), Some("pending"));
        let fresh = desired_from(&FailoverStatus::default(), &["db-0".into()], "db-0", domain, 5432);
        assert_eq!(
            fresh,
            Desired {
                target_primary: None,
                upstream: None,
                fenced: true,
                switchover: false,
                switchover_timeout: std::time::Duration::from_secs(30),
                synchronous: None,
                instances: Vec::new(),
                configuration: None,
                declarations: None,
                import: None,
                major_upgrade: None,
                reload_requested: None,
            }
        );
    }

    #[test]
    fn the_lease_record_round_trips_through_a_lease() {
        let record = LeaseRecord {
            holder: Some("db-0".into()),
            primary_lsn: Some(crate::lsn::Lsn(0x3000060)),
            timeline: Some(2),
            released_at_lsn: None,
            duration: Some(Duration::from_secs(15)),
        };
        let lease = with_record(Lease::default(), &record, Duration::from_secs(15));
        assert_eq!(lease_record(&lease), record);
        let spec = lease.spec.as_ref().unwrap();
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert!(spec.acquire_time.is_some());
        let released = with_record(lease, &LeaseRecord { holder: None, ..record.clone() }, Duration::from_secs(15));
        assert_eq!(lease_record(&released).holder, None);
        assert_eq!(lease_record(&released).timeline, Some(2));
        assert_eq!(lease_record(&Lease::default()), LeaseRecord::default());
    }
}
