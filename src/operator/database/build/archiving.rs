//! What continuous archiving adds to a PostgreSQL pod (pure). The binary is already there: with
//! the operator's image known, the StatefulSet's pods get it from the `install-dbservice` init
//! container in the `dbservice-bin` emptyDir at `/dbservice/bin` (for the instance agent, see
//! `operator::database::build`). The store settings reach `wal-archive` through the container's
//! environment; the credentials as files of the Secret (mode 0440), never as values or
//! environment variables (which PostgreSQL and every program it starts would inherit).

use crate::api::backup::DEFAULT_ARCHIVE_TIMEOUT_SECONDS;
use crate::api::database_service::DatabaseService;
use crate::api::pod::AGENT_DIRECTORY;
use crate::operator::database::build::plain_env;
use k8s_openapi::api::core::v1::{EnvVar, KeyToPath, PodSpec, SecretVolumeSource, Volume, VolumeMount};
use kube::ResourceExt;

/// Volume and directory of the store's CA certificates, when `caSecret` is set.
const CA_VOLUME: &str = "dbservice-s3-ca";
const CA_DIRECTORY: &str = "/dbservice/s3-ca";
/// Volume and directory of the store's credentials (files `accessKeyId`, `secretAccessKey`).
const CREDENTIALS_VOLUME: &str = "dbservice-s3-credentials";
const CREDENTIALS_DIRECTORY: &str = "/dbservice/s3-credentials";

/// The postgres container's environment for archiving: store settings, credentials by
/// reference, and `DBSERVICE_ARCHIVE_COMMAND` / `DBSERVICE_ARCHIVE_TIMEOUT_SECONDS`, which the
/// entrypoint turns into `archive_mode`, `archive_command` and `archive_timeout`.
pub fn archive_environment(database: &DatabaseService) -> Vec<EnvVar> {
    let Some(backup) = &database.spec.backup else { return Vec::new() };
    let store = &backup.object_store;
    let name = database.name_any();
    let mut environment = vec![
        plain_env("DBSERVICE_S3_ENDPOINT", &store.endpoint),
        plain_env("DBSERVICE_S3_BUCKET", &store.bucket),
        plain_env("DBSERVICE_S3_PATH", store.path.clone().unwrap_or_default()),
        plain_env("DBSERVICE_BACKUP_SERVER_NAME", database.archive_server_name().unwrap_or(name)),
        plain_env("DBSERVICE_S3_REGION", store.region.clone().unwrap_or_else(|| "us-east-1".into())),
        plain_env("DBSERVICE_S3_ACCESS_KEY_ID_FILE", format!("{CREDENTIALS_DIRECTORY}/accessKeyId")),
        plain_env("DBSERVICE_S3_SECRET_ACCESS_KEY_FILE", format!("{CREDENTIALS_DIRECTORY}/secretAccessKey")),
        plain_env("DBSERVICE_ARCHIVE_COMMAND", format!("{AGENT_DIRECTORY}/dbservice-operator wal-archive %p %f")),
        // Short requests: a standby falls back to streaming, and a promotion that reads the
        // archive's timeline history must not wait a minute for an unreachable store. A store that
        // did not answer is remembered for a few seconds: a promotion asks for up to five files
        // and, with the store unreachable, waited 3 s for each (15 s of a switchover).
        plain_env(
            crate::api::pod::STANDBY_RESTORE_COMMAND_VARIABLE,
            format!(
                "{AGENT_DIRECTORY}/dbservice-operator wal-restore --standby --timeout-seconds=3 \
                 --connect-timeout-seconds=1 --unanswered-mark={STORE_UNANSWERED_MARK} %f %p"
            ),
        ),
        plain_env(
            "DBSERVICE_ARCHIVE_TIMEOUT_SECONDS",
            backup.archive_timeout_seconds.unwrap_or(DEFAULT_ARCHIVE_TIMEOUT_SECONDS).to_string(),
        ),
    ];
    if let Some(ca) = &store.ca_secret {
        environment.push(plain_env("DBSERVICE_S3_CA_FILE", format!("{CA_DIRECTORY}/{}", ca.key)));
    }
    environment
}

/// Where a standby's `wal-restore` remembers that the store did not answer (the socket directory,
/// an emptyDir the server's user writes; not the data directory, which clones copy).
pub const STORE_UNANSWERED_MARK: &str = "/var/run/postgresql/dbservice-store-unanswered";

/// Adds archiving to a pod whose first container runs PostgreSQL and has the binary at
/// [`AGENT_DIRECTORY`]: the store's CA volume and mount, and the environment. Nothing changes
/// without `spec.backup`.
pub fn add_archiving(pod: &mut PodSpec, database: &DatabaseService) {
    let Some(backup) = &database.spec.backup else { return };
    let credentials = &backup.object_store.credentials_secret;
    let items = [
        (credentials.access_key_id_key.as_deref().unwrap_or("accessKeyId"), "accessKeyId"),
        (credentials.secret_access_key_key.as_deref().unwrap_or("secretAccessKey"), "secretAccessKey"),
    ];
    pod.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: CREDENTIALS_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(credentials.name.clone()),
            items: Some(
                items
                    .iter()
                    .map(|(key, path)| KeyToPath { key: key.to_string(), path: path.to_string(), ..Default::default() })
                    .collect(),
            ),
            // Owner (root) and the pod's group (fsGroup: the postgres user) only.
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    });
    if let Some(ca) = &backup.object_store.ca_secret {
        pod.volumes.get_or_insert_with(Vec::new).push(Volume {
            name: CA_VOLUME.into(),
            secret: Some(SecretVolumeSource { secret_name: Some(ca.name.clone()), ..Default::default() }),
            ..Default::default()
        });
    }
    if let Some(postgres) = pod.containers.first_mut() {
        postgres.volume_mounts.get_or_insert_with(Vec::new).push(VolumeMount {
            name: CREDENTIALS_VOLUME.into(),
            mount_path: CREDENTIALS_DIRECTORY.into(),
            read_only: Some(true),
            ..Default::default()
        });
        if backup.object_store.ca_secret.is_some() {
            postgres.volume_mounts.get_or_insert_with(Vec::new).push(VolumeMount {
                name: CA_VOLUME.into(),
                mount_path: CA_DIRECTORY.into(),
                read_only: Some(true),
                ..Default::default()
            });
        }
        postgres.env.get_or_insert_with(Vec::new).extend(archive_environment(database));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_path_is_no_empty_value_the_api_server_would_drop() {
        let database: DatabaseService = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService", "metadata": {"name": "orders"},
            "spec": {"version": "16.4", "storageSize": "1Gi", "databaseName": "app", "username": "app_user",
                     "backup": {"objectStore": {"endpoint": "http://store:9000", "bucket": "backups",
                                                "credentialsSecret": {"name": "s3"}}}}
        }))
        .unwrap();
        let environment = archive_environment(&database);
        // The API server stores `value: ""` as no value: desired "" would be drift on every pass.
        assert!(environment.iter().all(|variable| variable.value.as_deref() != Some("")), "{environment:?}");
        let path = environment.iter().find(|variable| variable.name == "DBSERVICE_S3_PATH").unwrap();
        assert_eq!((path.value.as_ref(), path.value_from.as_ref()), (None, None));
    }
}
