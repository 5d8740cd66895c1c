//! What continuous archiving adds to a PostgreSQL pod (pure). The convention shared with the
//! instance agent (issue 11): an emptyDir `dbservice-bin`, an init container `install-dbservice`
//! from the operator's image copying the binary to `/dbservice/bin/dbservice-operator`, mounted in
//! the postgres container at `/dbservice/bin`. The store settings reach `wal-archive` through the
//! container's environment; the credentials come from the Secret by reference, never as values.

use crate::api::DatabaseService;
use crate::backup::spec::DEFAULT_ARCHIVE_TIMEOUT_SECONDS;
use crate::backup::validation::server_name;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, PodSpec, SecretKeySelector,
    SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use kube::ResourceExt;

/// Volume holding the operator binary in the pod.
pub const BINARY_VOLUME: &str = "dbservice-bin";
/// Where that volume is mounted.
pub const BINARY_DIRECTORY: &str = "/dbservice/bin";
/// The init container that fills it.
pub const INSTALL_CONTAINER: &str = "install-dbservice";
/// The binary in the operator image.
pub const OPERATOR_BINARY: &str = "/usr/local/bin/dbservice-operator";
/// Volume and directory of the store's CA certificates, when `caSecret` is set.
const CA_VOLUME: &str = "dbservice-s3-ca";
const CA_DIRECTORY: &str = "/dbservice/s3-ca";

fn plain(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() }
}

fn from_secret(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector { name: secret.into(), key: key.into(), optional: Some(false) }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The postgres container's environment for archiving: store settings, credentials by
/// reference, and `DBSERVICE_ARCHIVE_COMMAND` / `DBSERVICE_ARCHIVE_TIMEOUT_SECONDS`, which the
/// entrypoint turns into `archive_mode`, `archive_command` and `archive_timeout`.
pub fn archive_environment(database: &DatabaseService) -> Vec<EnvVar> {
    let Some(backup) = &database.spec.backup else { return Vec::new() };
    let store = &backup.object_store;
    let credentials = &store.credentials_secret;
    let name = database.name_any();
    let mut environment = vec![
        plain("DBSERVICE_S3_ENDPOINT", &store.endpoint),
        plain("DBSERVICE_S3_BUCKET", &store.bucket),
        plain("DBSERVICE_S3_PATH", store.path.clone().unwrap_or_default()),
        plain("DBSERVICE_BACKUP_SERVER_NAME", server_name(store, &name)),
        plain("DBSERVICE_S3_REGION", store.region.clone().unwrap_or_else(|| "us-east-1".into())),
        from_secret(
            "AWS_ACCESS_KEY_ID",
            &credentials.name,
            credentials.access_key_id_key.as_deref().unwrap_or("accessKeyId"),
        ),
        from_secret(
            "AWS_SECRET_ACCESS_KEY",
            &credentials.name,
            credentials.secret_access_key_key.as_deref().unwrap_or("secretAccessKey"),
        ),
        plain("DBSERVICE_ARCHIVE_COMMAND", format!("{BINARY_DIRECTORY}/dbservice-operator wal-archive %p %f")),
        plain(
            "DBSERVICE_ARCHIVE_TIMEOUT_SECONDS",
            backup.archive_timeout_seconds.unwrap_or(DEFAULT_ARCHIVE_TIMEOUT_SECONDS).to_string(),
        ),
    ];
    if let Some(ca) = &store.ca_secret {
        environment.push(plain("DBSERVICE_S3_CA_FILE", format!("{CA_DIRECTORY}/{}", ca.key)));
    }
    environment
}

/// Adds archiving to a pod whose first container runs PostgreSQL: the init container, the
/// volumes, the mounts and the environment. Nothing changes without `spec.backup`.
pub fn add_archiving(pod: &mut PodSpec, database: &DatabaseService, instance_image: &str) {
    let Some(backup) = &database.spec.backup else { return };
    let binary_mount =
        VolumeMount { name: BINARY_VOLUME.into(), mount_path: BINARY_DIRECTORY.into(), ..Default::default() };
    let postgres_security = pod.containers.first().and_then(|container| container.security_context.clone());
    pod.init_containers.get_or_insert_with(Vec::new).push(Container {
        name: INSTALL_CONTAINER.into(),
        image: Some(instance_image.into()),
        command: Some(vec![OPERATOR_BINARY.into(), "install-binary".into(), BINARY_DIRECTORY.into()]),
        volume_mounts: Some(vec![binary_mount.clone()]),
        security_context: postgres_security.or_else(|| {
            Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
                ..Default::default()
            })
        }),
        ..Default::default()
    });
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    volumes.push(Volume {
        name: BINARY_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    });
    if let Some(ca) = &backup.object_store.ca_secret {
        volumes.push(Volume {
            name: CA_VOLUME.into(),
            secret: Some(SecretVolumeSource { secret_name: Some(ca.name.clone()), ..Default::default() }),
            ..Default::default()
        });
    }
    if let Some(postgres) = pod.containers.first_mut() {
        let mounts = postgres.volume_mounts.get_or_insert_with(Vec::new);
        mounts.push(VolumeMount { read_only: Some(true), ..binary_mount });
        if backup.object_store.ca_secret.is_some() {
            mounts.push(VolumeMount {
                name: CA_VOLUME.into(),
                mount_path: CA_DIRECTORY.into(),
                read_only: Some(true),
                ..Default::default()
            });
        }
        postgres.env.get_or_insert_with(Vec::new).extend(archive_environment(database));
    }
}

/// `dbservice-operator install-binary DIRECTORY`: copies this binary there (the operator image
/// has no shell to copy with).
pub fn install_binary(directory: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::os::unix::fs::PermissionsExt;
    let source = std::env::current_exe().context("locate this binary")?;
    let target = directory.join("dbservice-operator");
    let partial = directory.join(".dbservice-operator.partial");
    std::fs::copy(&source, &partial).with_context(|| format!("copy {} to {}", source.display(), partial.display()))?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("chmod {}", partial.display()))?;
    std::fs::rename(&partial, &target).with_context(|| format!("rename to {}", target.display()))?;
    Ok(())
}
