//! WAL archiving health through the real API server: the ContinuousArchiving condition, the
//! Warning and Normal events, the ledger entries and the metric. No PostgreSQL runs under kwok, so
//! the test writes the primary's report with the agent's own Kubernetes code
//! (`KubeControlPlane::publish`, the pod annotation), as the agent in the pod does; the loopback
//! test tests/wal_archive_loopback.rs shows the agent producing such reports from real PostgreSQL.

use crate::controller::{condition, wait_for_event, wait_for_ledger, wait_for_phase};
use crate::support::operator::{metric_sum, shared};
use crate::support::{client_for, cluster_or_skip, database_from_yaml, eventually, TestNamespace};
use chrono::Utc;
use dbservice_operator::api::database_service::{DatabaseService, Phase};
use dbservice_operator::api::failover::{ArchivingReport, InstanceReport, Role};
use dbservice_operator::instance::kubernetes::KubeControlPlane;
use dbservice_operator::instance::ControlPlane;
use dbservice_operator::operator::database::archiving::{
    ARCHIVING_REASON, FAILING_EVENT, FAILING_TOO_LONG_REASON, RECOVERED_EVENT,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::Api;
use std::time::Duration;

const SEGMENT: &str = "00000001000000000000002A";

fn primary_report(archiving: ArchivingReport) -> InstanceReport {
    InstanceReport {
        role: Role::Primary,
        timeline: 1,
        received_lsn: None,
        replay_lsn: None,
        wal_receiver: false,
        postgres_ready: true,
        fenced: false,
        disk_full: false,
        shutdown_checkpoint_lsn: None,
        parameters: None,
        pending_restart: Vec::new(),
        declared: None,
        import: None,
        major_upgrade: None,
        owned_settings_reverted: None,
        waits_for: None,
        discarded_on_rejoin: None,
        reloaded: None,
        volume: None,
        archiving: Some(archiving),
    }
}

#[tokio::test]
async fn the_primary_report_drives_the_archiving_condition_events_ledger_and_metric() {
    let test = "the_primary_report_drives_the_archiving_condition_events_ledger_and_metric";
    let Some(kubeconfig) = cluster_or_skip(test) else { return };
    let environment = shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "archiving").await;
    let ns = namespace.name.as_str();
    let mut secret = Secret::default();
    secret.metadata.name = Some("s3".into());
    secret.string_data =
        Some([("accessKeyId".into(), "key".into()), ("secretAccessKey".into(), "secret".into())].into());
    Api::<Secret>::namespaced(client.clone(), ns).create(&PostParams::default(), &secret).await.unwrap();
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let database = database_from_yaml(
        "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: orders\nspec:\n  version: \"16.4\"\n  \
         storageSize: 1Gi\n  databaseName: app\n  username: app_user\n  backup:\n    archiveFailureWarningSeconds: 30\n    \
         objectStore: {endpoint: \"http://store.invalid:9000\", bucket: backups, credentialsSecret: {name: s3}}\n",
    );
    databases.create(&PostParams::default(), &database).await.unwrap();
    let running = wait_for_phase(&databases, "orders", Phase::Running, Duration::from_secs(120)).await;
    assert!(condition(&running, "ContinuousArchiving").is_none(), "no condition before the primary reports");

    let agent = KubeControlPlane::new(
        client.clone(),
        client.clone(),
        ns,
        "orders",
        "orders-0",
        5432,
        Duration::from_secs(15),
        Duration::from_secs(10),
    );
    let metric = || {
        let metrics = environment.operator.metrics().unwrap_or_default();
        let filter = format!("namespace=\"{ns}\"");
        metrics
            .lines()
            .any(|line| line.starts_with("dbservice_wal_archiving_failing{") && line.contains(&filter))
            .then(|| metric_sum(&metrics, "dbservice_wal_archiving_failing", &[&filter]))
    };

    // Failing for 60 s, past the 30 s threshold: condition, Warning event, ledger entry, metric.
    let since = Utc::now() - chrono::Duration::seconds(60);
    let failing = ArchivingReport { failing: true, failing_since: Some(since), failed_wal: Some(SEGMENT.into()) };
    agent.publish(&primary_report(failing)).await.unwrap();
    let warned = eventually("ContinuousArchiving False past the threshold", Duration::from_secs(60), || async {
        let database = databases.get("orders").await.ok()?;
        let found = condition(&database, "ContinuousArchiving")?.clone();
        (found.status == "False" && found.reason == FAILING_TOO_LONG_REASON).then_some(found)
    })
    .await;
    assert!(warned.message.contains(SEGMENT), "{}", warned.message);
    wait_for_event(&client, ns, "orders", FAILING_EVENT).await;
    let entries = wait_for_ledger(&client, ns, "orders", FAILING_EVENT).await;
    assert_eq!(entries.iter().filter(|entry| entry.action == FAILING_EVENT).count(), 1, "{entries:?}");
    eventually("dbservice_wal_archiving_failing 1", Duration::from_secs(30), || async {
        (metric() == Some(1.0)).then_some(())
    })
    .await;

    // Archiving works again: condition True, Normal event, ledger entry, metric 0.
    let healthy = ArchivingReport { failing: false, failing_since: None, failed_wal: None };
    agent.publish(&primary_report(healthy)).await.unwrap();
    eventually("ContinuousArchiving True", Duration::from_secs(60), || async {
        let database = databases.get("orders").await.ok()?;
        let found = condition(&database, "ContinuousArchiving")?.clone();
        (found.status == "True" && found.reason == ARCHIVING_REASON).then_some(())
    })
    .await;
    wait_for_event(&client, ns, "orders", RECOVERED_EVENT).await;
    wait_for_ledger(&client, ns, "orders", RECOVERED_EVENT).await;
    eventually("dbservice_wal_archiving_failing 0", Duration::from_secs(30), || async {
        (metric() == Some(0.0)).then_some(())
    })
    .await;
}
