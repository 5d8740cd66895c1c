//! WAL archiving from a real PostgreSQL pod to an S3-compatible server on the host (moto_server on
//! the node's bridge address, the only address pods reach), a base backup taken in the pod with
//! the binary the init container installed, and a point-in-time recovery from what the pod stored.

use crate::environment::{
    admin_client, install_chart, psql_in_instance, real_database, real_namespace, real_node_or_skip, wait_running,
};
use crate::object_store::{moto_server, pg_bin, run_as, skip_or_fail, Sandbox, Store, BUCKET, PREFIX, SERVER_NAME};
use crate::support::{eventually, kubectl};
use dbservice_operator::api::backup::{BackupSpec, CredentialsSecret, ObjectStore};
use dbservice_operator::api::database_service::DatabaseService;
use kube::api::PostParams;
use kube::Api;
use std::time::Duration;

/// The host side of the node's pod bridge.
pub const BRIDGE_ADDRESS: &str = "10.85.0.1";

/// The place of server `server_name` in the test bucket of the store at `endpoint`.
pub fn object_store(endpoint: &str, server_name: &str) -> ObjectStore {
    ObjectStore {
        endpoint: endpoint.into(),
        bucket: BUCKET.into(),
        path: Some(PREFIX.into()),
        server_name: Some(server_name.into()),
        credentials_secret: CredentialsSecret { name: "s3".into(), ..Default::default() },
        ..Default::default()
    }
}

/// Archiving of server `server_name` with a 10 s archive_timeout.
pub fn archiving(endpoint: &str, server_name: &str) -> BackupSpec {
    BackupSpec {
        object_store: object_store(endpoint, server_name),
        archive_timeout_seconds: Some(10),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_pod_archives_wal_and_its_backup_recovers_to_a_time_on_the_host() {
    let Some(node) = real_node_or_skip("a_pod_archives_wal_and_its_backup_recovers_to_a_time_on_the_host") else {
        return;
    };
    let (Some(moto), Some(bin)) = (moto_server(), pg_bin()) else {
        return skip_or_fail("no moto_server or PostgreSQL binaries on the host");
    };
    install_chart(node);
    let client = admin_client().await;
    let namespace = real_namespace(&client, "backups").await;
    let work = tempfile::Builder::new().prefix("dbservice-real-backup-").tempdir_in("/tmp").unwrap();
    let owner = run_as();
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(work.path(), Some(uid), Some(gid)).unwrap();
    }
    let store = Store::start_on(&moto, &work.path().join("moto.log"), BRIDGE_ADDRESS).await;

    crate::support::create_store_secret(&client, &namespace.name).await;
    let mut database = real_database(node, "pg", 1, "Delete");
    // 15: the recovery runs on the host, with Debian's PostgreSQL 15.
    database.spec.version = node.version_of(15);
    database.spec.backup = Some(archiving(&store.endpoint, SERVER_NAME));
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    databases.create(&PostParams::default(), &database).await.unwrap();
    wait_running(&client, &namespace.name, "pg", 1, Duration::from_secs(240)).await;
    let sql = |statement: &str| psql_in_instance(&namespace.name, "pg-0", statement).trim().to_string();
    assert_eq!(sql("show archive_mode"), "on");

    sql("create table rows (batch int not null, written_at timestamptz not null default clock_timestamp()); \
         insert into rows (batch) select 0 from generate_series(1, 10)");
    // A base backup in the pod, by the binary the install-dbservice init container put there.
    let manifest = kubectl(&[
        "-n",
        &namespace.name,
        "exec",
        "pg-0",
        "-c",
        "postgres",
        "--",
        "/dbservice/bin/dbservice-operator",
        "backup",
        "--host=/var/run/postgresql",
        "--user=postgres",
        "--pg-bin-dir=/usr/lib/postgresql/15/bin",
        "--wal-wait-seconds=120",
    ]);
    let manifest: serde_json::Value = serde_json::from_str(manifest.trim()).expect("backup prints its manifest");
    assert_eq!(manifest["timeline"], 1);
    assert_eq!(manifest["postgresMajorVersion"], 15);

    sql("insert into rows (batch) select 1 from generate_series(1, 11)");
    let target_time = sql("select to_json(clock_timestamp())#>>'{}'");
    sql("insert into rows (batch) select 2 from generate_series(1, 12)");
    let segment = sql("select pg_walfile_name(pg_switch_wal())");
    let key = format!("{PREFIX}/{SERVER_NAME}/wal/{}/{segment}.zst", &segment[..8]);
    eventually(&format!("{segment} archived from the pod"), Duration::from_secs(120), || async {
        store.client.head_object(&key).await.ok().flatten().map(|_| ())
    })
    .await;
    assert_eq!(sql("select failed_count from pg_stat_archiver"), "0");

    // Recovery on the host, from what the pod stored, to the time between batches 1 and 2.
    let sandbox = Sandbox { bin, base: work.path().to_path_buf(), owner, endpoint: store.endpoint.clone() };
    let pgdata = sandbox.directory("recovered");
    sandbox.run(&["restore", "--pgdata", pgdata.to_str().unwrap(), &format!("--target-time={target_time}")]);
    let socket_directory = format!("unix_socket_directories={}", work.path().display());
    let restored =
        sandbox.start(&pgdata, &["archive_mode=off", "listen_addresses=127.0.0.1", socket_directory.as_str()]);
    // Over the socket: the pod's pg_hba.conf trusts local connections only.
    let query_rows = async || -> Option<Vec<(i32, i64)>> {
        let (connection_client, connection) = tokio_postgres::connect(
            &format!("host={} port={} user=postgres dbname=app", work.path().display(), restored.port),
            tokio_postgres::NoTls,
        )
        .await
        .ok()?;
        tokio::spawn(connection);
        if connection_client.query_one("select pg_is_in_recovery()", &[]).await.ok()?.get::<_, bool>(0) {
            return None;
        }
        let rows = connection_client
            .query("select batch, count(*) from rows group by batch order by batch", &[])
            .await
            .ok()?;
        Some(rows.iter().map(|row| (row.get::<_, i32>(0), row.get::<_, i64>(1))).collect())
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let rows = loop {
        if let Some(rows) = query_rows().await {
            break rows;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the recovered server did not promote within 120 s; log:\n{}",
            restored.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(rows, vec![(0, 10), (1, 11)], "recovery to {target_time}; server log:\n{}", restored.log_tail());
}
