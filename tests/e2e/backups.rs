//! `dbservice-operator backups NAME -n NS` reads the DatabaseService and its credentials Secret
//! from the real API server and the backups from a real S3-compatible server (moto_server).

use crate::object_store::{moto_server, skip_or_fail, Store, BINARY};
use crate::support::{client_for, cluster_or_skip, database_from_yaml, operator::shared, TestNamespace};
use bytes::Bytes;
use dbservice_operator::api::database_service::DatabaseService;
use kube::api::PostParams;
use kube::Api;
use std::process::Command;

#[tokio::test]
async fn backups_lists_the_backups_and_window_of_a_database_service() {
    let Some(kubeconfig) = cluster_or_skip("backups_lists_the_backups_and_window_of_a_database_service") else {
        return;
    };
    let Some(moto) = moto_server() else {
        return skip_or_fail("no moto_server (python3 -m pip install 'moto[server]')");
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "backups-cli").await;
    let logs = tempfile::tempdir().unwrap();
    let store = Store::start(&moto, &logs.path().join("moto.log")).await;

    let manifest = serde_json::json!({
        "id": "20261201T000000Z", "serverName": "orders", "beginLsn": "0/2000028", "endLsn": "0/2000138",
        "beginWal": "000000010000000000000002", "endWal": "000000010000000000000002",
        "startTime": "2026-12-01T00:00:00Z", "endTime": "2026-12-01T00:05:00Z", "timeline": 1,
        "postgresMajorVersion": 16, "systemIdentifier": "7400000000000000001", "fromStandby": true,
        "sizeBytes": 31457280u64, "storedBytes": 4194304u64, "compression": "zstd", "chunks": []
    });
    let put = |key: &'static str, body: Vec<u8>| store.client.put_object(key, Bytes::from(body), &[]);
    put("prod/orders/base/20261201T000000Z/backup.json", serde_json::to_vec(&manifest).unwrap()).await.unwrap();
    put("prod/orders/wal/00000001/000000010000000000000002.zst", b"segment".to_vec()).await.unwrap();

    crate::support::create_store_secret(&client, &namespace.name).await;
    let databases: Api<DatabaseService> = Api::namespaced(client.clone(), &namespace.name);
    let database = database_from_yaml(&format!(
        "apiVersion: dbservice.dev/v1\nkind: DatabaseService\nmetadata:\n  name: orders\nspec:\n  version: \"16\"\n  \
         storageSize: 1Gi\n  databaseName: app\n  username: app_user\n  backup:\n    objectStore: {{endpoint: \"{}\", \
         bucket: {}, path: prod, credentialsSecret: {{name: s3}}}}\n",
        store.endpoint,
        crate::object_store::BUCKET
    ));
    databases.create(&PostParams::default(), &database).await.unwrap();

    let run = |name: &str| {
        Command::new(BINARY)
            .args(["backups", name, "-n", &namespace.name])
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .unwrap()
    };
    let output = run("orders");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "backups failed: {}{stdout}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("recoverable window: 2026-12-01T00:05:00Z .. "), "{stdout}");
    assert!(stdout.contains("(1 backups, 1 WAL files)"), "{stdout}");
    let row = stdout.lines().find(|line| line.starts_with("20261201T000000Z")).unwrap_or_else(|| panic!("{stdout}"));
    for field in
        ["2026-12-01T00:00:00Z", "2026-12-01T00:05:00Z", "0/2000028", "0/2000138", "30.0MiB", "4.0MiB", "standby"]
    {
        assert!(row.contains(field), "{field} missing from {row}");
    }
    // The same as data, for scripts.
    let data = Command::new(BINARY)
        .args(["backups", "orders", "-n", &namespace.name, "-o", "json"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    let document: serde_json::Value = serde_json::from_slice(&data.stdout).expect("backups -o json is JSON");
    assert_eq!(document["firstRecoverabilityPoint"], "2026-12-01T00:05:00Z", "{document}");
    assert_eq!((document["backups"].as_array().map(Vec::len), document["walFiles"].as_u64()), (Some(1), Some(1)));
    let missing = run("nothing-here");
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no DatabaseService \"nothing-here\""));
}
