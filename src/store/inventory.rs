//! `dbservice-operator backups NAME -n NS`: the base backups and the recoverable window of a
//! DatabaseService, read from the object store its `spec.backup` names with the credentials of
//! its Secret (the caller's RBAC decides whether that Secret may be read).

use crate::api::backup::ObjectStore;
use crate::api::database_service::DatabaseService;
use crate::store::catalog::{list_backups, list_wal, recoverable_window, CatalogError};
use crate::store::client::{Addressing, S3Client, StoreError, StoreSettings};
use crate::store::keys::{KeyError, KeyLayout};
use crate::store::manifest::BackupManifest;
use crate::store::signing::AccessKey;
use k8s_openapi::api::core::v1::Secret;
use std::time::Duration;

/// Why the backups of a DatabaseService could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum ListDatabaseBackupsError {
    /// The API server failed.
    #[error("read {what}: {error}")]
    Api {
        /// What was read.
        what: String,
        /// The error.
        error: kube::Error,
    },
    /// The DatabaseService does not exist.
    #[error("no DatabaseService {name:?} in namespace {namespace:?}")]
    NotFound {
        /// Name.
        name: String,
        /// Namespace.
        namespace: String,
    },
    /// It archives nowhere.
    #[error("DatabaseService {0:?} has no spec.backup")]
    NoBackup(String),
    /// The credentials Secret lacks a key.
    #[error("Secret {secret:?} has no key {key:?}")]
    MissingKey {
        /// Secret name.
        secret: String,
        /// Key.
        key: String,
    },
    /// The CA could not be written for the client.
    #[error("write CA file: {0}")]
    CaFile(std::io::Error),
    /// Bad layout.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// Bad store settings.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store could not be read.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

fn secret_value(secret: &Secret, name: &str, key: &str) -> Result<String, ListDatabaseBackupsError> {
    secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .map(|value| String::from_utf8_lossy(&value.0).trim().to_string())
        .ok_or_else(|| ListDatabaseBackupsError::MissingKey { secret: name.to_string(), key: key.to_string() })
}

/// A client for `store` with the credentials of its Secret in `namespace`, and the layout of the
/// archive of `server_name`.
pub async fn connect(
    client: &kube::Client,
    namespace: &str,
    server_name: &str,
    store: &ObjectStore,
) -> Result<(S3Client, KeyLayout), ListDatabaseBackupsError> {
    let secrets: kube::Api<Secret> = kube::Api::namespaced(client.clone(), namespace);
    let read = |name: String| {
        let secrets = secrets.clone();
        async move {
            secrets
                .get(&name)
                .await
                .map_err(|error| ListDatabaseBackupsError::Api { what: format!("Secret {name}"), error })
        }
    };
    let credentials = &store.credentials_secret;
    let secret = read(credentials.name.clone()).await?;
    let access_key = AccessKey {
        id: secret_value(
            &secret,
            &credentials.name,
            credentials.access_key_id_key.as_deref().unwrap_or("accessKeyId"),
        )?,
        secret: secret_value(
            &secret,
            &credentials.name,
            credentials.secret_access_key_key.as_deref().unwrap_or("secretAccessKey"),
        )?,
    };
    let ca_file = match &store.ca_secret {
        None => None,
        Some(ca) => {
            let pem = secret_value(&read(ca.name.clone()).await?, &ca.name, &ca.key)?;
            let path = std::env::temp_dir().join(format!("dbservice-backups-ca-{}.pem", std::process::id()));
            std::fs::write(&path, pem).map_err(ListDatabaseBackupsError::CaFile)?;
            Some(path)
        }
    };
    let s3 = S3Client::new(StoreSettings {
        endpoint: store.endpoint.clone(),
        bucket: store.bucket.clone(),
        region: store.region.clone().unwrap_or_else(|| "us-east-1".to_string()),
        access_key,
        ca_file: ca_file.clone(),
        timeout: Duration::from_secs(30),
        connect_timeout: None,
        addressing: Addressing::Path,
    });
    if let Some(path) = ca_file {
        // The client has loaded it; the file is not needed any more.
        let _ = std::fs::remove_file(path);
    }
    let layout = KeyLayout::new(store.path.as_deref().unwrap_or(""), server_name)?;
    Ok((s3?, layout))
}

/// A table of the backups, one line each.
pub fn render(backups: &[BackupManifest]) -> String {
    let mut lines = vec![format!(
        "{:<18} {:<20} {:<20} {:>3} {:>3} {:<12} {:<12} {:>10} {:>10} {}",
        "ID", "STARTED", "ENDED", "TLI", "PG", "BEGIN LSN", "END LSN", "SIZE", "STORED", "FROM"
    )];
    let mib = |bytes: u64| format!("{:.1}MiB", bytes as f64 / 1_048_576.0);
    for backup in backups {
        lines.push(format!(
            "{:<18} {:<20} {:<20} {:>3} {:>3} {:<12} {:<12} {:>10} {:>10} {}",
            backup.id,
            backup.start_time.format("%Y-%m-%dT%H:%M:%SZ"),
            backup.end_time.format("%Y-%m-%dT%H:%M:%SZ"),
            backup.timeline,
            backup.postgres_major_version,
            backup.begin_lsn.to_string(),
            backup.end_lsn.to_string(),
            mib(backup.size_bytes),
            mib(backup.stored_bytes),
            if backup.from_standby { "standby" } else { "primary" },
        ));
    }
    lines.join("\n")
}

/// Prints the backups and the recoverable window of `name` in `namespace`.
pub async fn print_backups(
    client: kube::Client,
    namespace: &str,
    name: &str,
    as_data: Option<&dyn Fn(&serde_json::Value) -> String>,
) -> Result<(), ListDatabaseBackupsError> {
    let databases: kube::Api<DatabaseService> = kube::Api::namespaced(client.clone(), namespace);
    let database = databases
        .get_opt(name)
        .await
        .map_err(|error| ListDatabaseBackupsError::Api { what: format!("DatabaseService {name}"), error })?
        .ok_or_else(|| ListDatabaseBackupsError::NotFound {
            name: name.to_string(),
            namespace: namespace.to_string(),
        })?;
    let store = database.spec.backup.as_ref().ok_or_else(|| ListDatabaseBackupsError::NoBackup(name.to_string()))?;
    let server_name = database.archive_server_name().unwrap_or_else(|| name.to_string());
    let (s3, layout) = connect(&client, namespace, &server_name, &store.object_store).await?;
    let backups = list_backups(&s3, &layout).await?;
    let wal = list_wal(&s3, &layout).await?;
    let window = recoverable_window(&backups, &wal);
    if let Some(render) = as_data {
        let document = serde_json::json!({
            "name": name, "namespace": namespace,
            "store": {"endpoint": store.object_store.endpoint, "bucket": store.object_store.bucket, "root": layout.root()},
            "firstRecoverabilityPoint": window.first_recoverability_point,
            "lastArchivedWalTime": window.last_archived_wal_time,
            "walFiles": wal.len(),
            "backups": backups,
        });
        print!("{}", render(&document));
        return Ok(());
    }
    let time = |time: Option<chrono::DateTime<chrono::Utc>>| {
        time.map(|time| time.format("%Y-%m-%dT%H:%M:%SZ").to_string()).unwrap_or_else(|| "-".to_string())
    };
    println!(
        "DatabaseService {namespace}/{name}: {}/{}/{}",
        store.object_store.endpoint,
        store.object_store.bucket,
        layout.root()
    );
    println!(
        "recoverable window: {} .. {} ({} backups, {} WAL files)",
        time(window.first_recoverability_point),
        time(window.last_archived_wal_time),
        backups.len(),
        wal.len()
    );
    println!("{}", render(&backups));
    Ok(())
}
