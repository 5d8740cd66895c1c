//! Backups and recovery as a user runs them, on the real node with moto_server on the host: a
//! DatabaseService archives, an on-demand DatabaseServiceBackup and a scheduled one complete
//! through the operator's Jobs, the controller refuses a target beyond the archive after reading the
//! store (before any pod or volume), and a NEW DatabaseService recovering to a time between two batches of rows serves
//! exactly the rows written before it, on its primary and on the standby cloned from it, while
//! archiving into its own path.

use crate::backups::{archiving, object_store, BRIDGE_ADDRESS};
use crate::environment::{
    admin_client, install_chart, psql_in_instance, real_database, real_namespace, real_node_or_skip, wait_running,
};
use crate::object_store::{moto_server, skip_or_fail, Store, PREFIX};
use crate::support::{create_store_secret, eventually};
use dbservice_operator::api::backup::{BootstrapSpec, RecoverySpec, RecoveryTargetSpec};
use dbservice_operator::api::database_service::{DatabaseService, Phase};
use dbservice_operator::api::database_service_backup::{
    BackupPhase, DatabaseServiceBackup, DatabaseServiceBackupSpec, DatabaseServiceBackupStatus,
};
use dbservice_operator::api::recovery::{RecoveryPhase, RECOVERED_CONDITION};
use dbservice_operator::operator::backup::scheduler::SCHEDULED_AT_ANNOTATION;
use dbservice_operator::operator::database::recovery_source::TARGET_OUTSIDE_ARCHIVE;
use dbservice_operator::operator::ledger::{parse, LEDGER_KEY};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use std::time::Duration;

const SOURCE: &str = "orders";
const RESTORED: &str = "restored";
/// A recovery to a time beyond the archive.
const TOO_LATE: &str = "too-late";

/// The status of a backup once it completed (a failure ends the wait with its message).
pub(crate) async fn completed(backups: &Api<DatabaseServiceBackup>, name: &str) -> DatabaseServiceBackupStatus {
    eventually(&format!("backup {name} Completed"), Duration::from_secs(300), || async {
        let status = backups.get_opt(name).await.ok()??.status?;
        assert_ne!(status.phase, Some(BackupPhase::Failed), "backup {name} failed: {:?}", status.message);
        (status.phase == Some(BackupPhase::Completed)).then_some(status)
    })
    .await
}

fn assert_complete(node: &crate::environment::RealNode, what: &str, status: &DatabaseServiceBackupStatus) {
    assert!(status.backup_id.is_some() && status.begin_lsn.is_some() && status.end_lsn.is_some(), "{what}: {status:?}");
    assert!(status.size_bytes.unwrap_or(0) > 0 && status.end_time.is_some(), "{what}: {status:?}");
    assert_eq!(status.postgres_major_version, Some(i64::from(node.default_major())), "{what}: {status:?}");
}

fn recovering_to(node: &crate::environment::RealNode, endpoint: &str, time: &str, replicas: i32) -> DatabaseService {
    let mut database = real_database(node, RESTORED, replicas, "Delete");
    database.spec.backup = Some(archiving(endpoint, RESTORED));
    database.spec.bootstrap = Some(BootstrapSpec {
        import: None,
        initdb: None,
        recovery: Some(RecoverySpec {
            source: object_store(endpoint, SOURCE),
            backup_id: None,
            target: Some(RecoveryTargetSpec { time: Some(time.into()), ..Default::default() }),
            allow_non_empty_archive: None,
        }),
    });
    database
}

fn batches(namespace: &str, pod: &str) -> String {
    psql_in_instance(
        namespace,
        pod,
        "select string_agg(batch || ':' || n, ',' order by batch) from \
         (select batch, count(*) n from rows group by batch) counts",
    )
    .trim()
    .to_string()
}

#[tokio::test]
async fn scheduled_and_on_demand_backups_complete_and_a_new_database_recovers_to_a_time() {
    let test = "scheduled_and_on_demand_backups_complete_and_a_new_database_recovers_to_a_time";
    let Some(node) = real_node_or_skip(test) else { return };
    let Some(moto) = moto_server() else { return skip_or_fail("no moto_server on the host") };
    install_chart(node);
    // The controller's answers are timed here (a refusal within 60 s): the tests that restart the
    // operator wait (see faults::FaultSlot).
    let _operator_pods_stay = crate::environment::operator_pods_lock().read().await;
    let client = admin_client().await;
    let namespace = real_namespace(&client, "recovery").await;
    let ns = namespace.name.as_str();
    let work = tempfile::Builder::new().prefix("dbservice-real-recovery-").tempdir_in("/tmp").unwrap();
    let store = Store::start_on(&moto, &work.path().join("moto.log"), BRIDGE_ADDRESS).await;
    create_store_secret(&client, ns).await;

    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut source = real_database(node, SOURCE, 1, "Delete");
    source.spec.backup = Some(archiving(&store.endpoint, SOURCE));
    databases.create(&PostParams::default(), &source).await.unwrap();
    wait_running(&client, ns, SOURCE, 1, Duration::from_secs(240)).await;
    let sql = |statement: &str| psql_in_instance(ns, "orders-0", statement).trim().to_string();
    sql("create table rows (batch int not null, written_at timestamptz not null default clock_timestamp()); \
         insert into rows (batch) select 0 from generate_series(1, 10)");

    // On demand: a DatabaseServiceBackup, run by the operator as a Job on the real node.
    let backups: Api<DatabaseServiceBackup> = Api::namespaced(client.clone(), ns);
    let spec = DatabaseServiceBackupSpec { database_service: SOURCE.into(), target: None };
    backups.create(&PostParams::default(), &DatabaseServiceBackup::new("on-demand", spec)).await.unwrap();
    let on_demand = completed(&backups, "on-demand").await;
    assert_complete(node, "on-demand", &on_demand);
    eprintln!("on-demand backup: {on_demand:?}");

    // On a schedule: every minute until one scheduled backup completed, then no schedule.
    let schedule =
        |value: serde_json::Value| Patch::Merge(serde_json::json!({"spec": {"backup": {"schedule": value}}}));
    databases.patch(SOURCE, &PatchParams::default(), &schedule("* * * * *".into())).await.unwrap();
    let scheduled = eventually("a scheduled backup Completed", Duration::from_secs(300), || async {
        let list = backups.list(&ListParams::default()).await.ok()?;
        let scheduled =
            list.items.into_iter().find(|backup| backup.annotations().contains_key(SCHEDULED_AT_ANNOTATION))?;
        let status = scheduled.status?;
        assert_ne!(status.phase, Some(BackupPhase::Failed), "scheduled backup failed: {:?}", status.message);
        (status.phase == Some(BackupPhase::Completed)).then_some(status)
    })
    .await;
    databases.patch(SOURCE, &PatchParams::default(), &schedule(serde_json::Value::Null)).await.unwrap();
    assert_complete(node, "scheduled", &scheduled);

    // Rows on both sides of the target time, then the WAL holding them archived.
    sql("insert into rows (batch) select 1 from generate_series(1, 11)");
    let target_time = sql("select to_json(clock_timestamp())#>>'{}'");
    sql("insert into rows (batch) select 2 from generate_series(1, 12)");
    let segment = sql("select pg_walfile_name(pg_switch_wal())");
    let key = format!("{PREFIX}/{SOURCE}/wal/{}/{segment}.zst", &segment[..8]);
    eventually(&format!("{segment} archived"), Duration::from_secs(120), || async {
        store.client.head_object(&key).await.ok().flatten().map(|_| ())
    })
    .await;

    // The controller reads the store before it makes anything: a time after the last archived WAL
    // stops the database (Recovered=False, phase Failed, a Warning event) with no pod and no volume.
    // Admission reads no store (issue 37): the object is admitted.
    let late = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let mut too_late = recovering_to(node, &store.endpoint, &late, 1);
    too_late.metadata.name = Some(TOO_LATE.into());
    too_late.spec.backup = Some(archiving(&store.endpoint, TOO_LATE));
    let checked = std::time::Instant::now();
    databases.create(&PostParams::default(), &too_late).await.expect("admission reads no store");
    let message = eventually("the target outside the archive is refused", Duration::from_secs(60), || async {
        let status = databases.get(TOO_LATE).await.ok()?.status?;
        let condition = status.conditions.iter().find(|condition| condition.type_ == RECOVERED_CONDITION)?;
        (condition.reason == TARGET_OUTSIDE_ARCHIVE && condition.status == "False").then(|| {
            assert_eq!(status.phase, Some(Phase::Failed), "{status:?}");
            condition.message.clone()
        })
    })
    .await;
    eprintln!(
        "a target outside the archive refused by the controller {:.1} s after create",
        checked.elapsed().as_secs_f64()
    );
    assert!(message.contains("outside the recoverable window"), "{message}");
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    eventually("the TargetOutsideArchive Warning event", Duration::from_secs(30), || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|event| {
            event.reason.as_deref() == Some(TARGET_OUTSIDE_ARCHIVE) && event.type_.as_deref() == Some("Warning")
        })
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let mine = |name: &str| name.starts_with(&format!("{TOO_LATE}-"));
    let pod_names: Vec<String> =
        pods.list(&ListParams::default()).await.unwrap().items.iter().map(|pod| pod.name_any()).collect();
    let claim_names: Vec<String> =
        claims.list(&ListParams::default()).await.unwrap().items.iter().map(|claim| claim.name_any()).collect();
    assert!(!pod_names.iter().any(|name| mine(name)), "no pod for a refused recovery: {pod_names:?}");
    assert!(!claim_names.iter().any(|name| mine(name)), "no volume for a refused recovery: {claim_names:?}");
    databases.delete(TOO_LATE, &Default::default()).await.unwrap();

    // The recovery: a new database, two instances, the target between batches 1 and 2.
    let started = std::time::Instant::now();
    databases.create(&PostParams::default(), &recovering_to(node, &store.endpoint, &target_time, 2)).await.unwrap();
    wait_running(&client, ns, RESTORED, 2, Duration::from_secs(420)).await;
    let running_after = started.elapsed();
    assert_eq!(batches(ns, "restored-0"), "0:10,1:11", "primary recovered to {target_time}");
    eventually("the standby serves the recovered rows", Duration::from_secs(60), || async {
        (batches(ns, "restored-1") == "0:10,1:11").then_some(())
    })
    .await;
    let status = databases.get(RESTORED).await.unwrap().status.unwrap();
    let recovery = status.recovery.clone().expect("status.recovery");
    assert_eq!(recovery.phase, RecoveryPhase::Completed, "{recovery:?}");
    assert_eq!(recovery.target, format!("time {target_time}"));
    let condition = status.conditions.iter().find(|condition| condition.type_ == RECOVERED_CONDITION).unwrap();
    assert_eq!(condition.status, "True", "{condition:?}");
    eprintln!(
        "recovery to {target_time}: Running with 2 ready {:.1} s after create; backup {:?} of {} bytes restored in {:.2} s \
         ({:.1} MiB/s), replay and promotion {:.2} s",
        running_after.as_secs_f64(),
        recovery.backup_id,
        recovery.restored_bytes.unwrap_or(0),
        recovery.restore_seconds.unwrap_or(0.0),
        recovery.restore_mib_per_second().unwrap_or(0.0),
        recovery.replay_seconds.unwrap_or(0.0)
    );
    let ledger: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let entries = parse(&ledger.get("restored-ledger").await.unwrap().data.unwrap()[LEDGER_KEY]);
    let actions: Vec<&str> = entries.iter().map(|entry| entry.action.as_str()).collect();
    assert!(actions.contains(&"RecoveryStarted") && actions.contains(&"RecoveryCompleted"), "{actions:?}");

    // The recovered database archives its new timeline (2, or later when a failover or the
    // rollout's switchover followed the recovery: seen in CI under load) into its own path, never
    // into the source's. Asked of whoever is primary now.
    let primary = databases.get(RESTORED).await.unwrap().status.unwrap().failover.current_primary.expect("a primary");
    let segment = psql_in_instance(ns, &primary, "select pg_walfile_name(pg_switch_wal())").trim().to_string();
    let timeline = u32::from_str_radix(segment.get(..8).unwrap_or_default(), 16).unwrap_or(0);
    assert!(timeline >= 2, "a recovery promotes onto a new timeline: {segment}");
    let own = format!("{PREFIX}/{RESTORED}/wal/{}/{segment}.zst", &segment[..8]);
    eventually(&format!("{own} archived"), Duration::from_secs(120), || async {
        store.client.head_object(&own).await.ok().flatten().map(|_| ())
    })
    .await;
    let in_source = store.client.list_objects(&format!("{PREFIX}/{SOURCE}/wal/{}", &segment[..8])).await.unwrap();
    assert!(in_source.is_empty(), "the recovered database wrote into the source: {in_source:?}");
}
