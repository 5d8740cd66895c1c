//! The Job that takes one base backup (pure): the DatabaseService's own postgres image (its
//! `pg_basebackup` matches the server's major version) running our binary, brought in by the
//! `install-dbservice` init container, against the standby Service (or the primary's), then
//! enforcing the retention policy. Every credential comes from a Secret by reference.

use crate::api::database_service::DatabaseService;
use crate::api::database_service_backup::{BackupTarget, DatabaseServiceBackup};
use crate::api::names::{ChildNames, MANAGED_BY, MANAGED_BY_LABEL};
use crate::api::pod::AGENT_DIRECTORY;
use crate::api::pod::{AGENT_VOLUME, POSTGRES_PORT, REPLICATION_DIRECTORY};
use crate::operator::database::build::archiving::add_archiving;
use crate::operator::database::build::container::agent_init_container;
use crate::operator::database::build::volumes::{
    agent_mount, read_only_mount, secret_files, server_certificate_secret,
};
use crate::operator::database::build::{plain_env, restricted_security_context, secret_env};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::api::core::v1::{
    Container, KeyToPath, PodSecurityContext, PodSpec, PodTemplateSpec, SeccompProfile, SecretVolumeSource, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;

/// Label telling backup Jobs (and their pods) from everything else the operator manages.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// Its value.
pub const COMPONENT_BACKUP: &str = "backup";
/// Label naming the DatabaseService a backup Job copies. Not `app.kubernetes.io/instance`: the
/// DatabaseService controller counts pods with that label as PostgreSQL instances.
pub const DATABASE_LABEL: &str = "dbservice.dev/database";
/// Selector of every backup Job.
pub const BACKUP_JOB_SELECTOR: &str =
    "app.kubernetes.io/managed-by=dbservice-operator,app.kubernetes.io/component=backup";
/// Name of the container taking the backup.
pub const BACKUP_CONTAINER: &str = "backup";
/// Longest a backup may run before Kubernetes stops it (6 hours).
pub const BACKUP_DEADLINE_SECONDS: i64 = 6 * 3600;
/// Where the container writes its summary; Kubernetes copies it into the pod's status.
const TERMINATION_LOG: &str = "/dev/termination-log";

/// Why no Job can be built for a backup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildBackupJobError {
    /// The DatabaseService does not configure an object store.
    #[error("DatabaseService {0} has no spec.backup (object store)")]
    NoObjectStore(String),
    /// The operator does not know its own image, so the Job cannot get the binary.
    #[error("the operator runs without --instance-image: backup Jobs cannot get the dbservice-operator binary")]
    NoInstanceImage,
}

/// The Job's name: the backup's name cut to fit a label value, with the start of its uid so
/// that a re-created backup of the same name never adopts the old Job.
pub fn job_name(backup: &DatabaseServiceBackup) -> String {
    let name = backup.name_any();
    let uid = backup.uid().unwrap_or_default();
    let prefix: String = name.chars().take(45).collect();
    let suffix: String = uid.chars().filter(char::is_ascii_alphanumeric).take(8).collect();
    format!("{}-{suffix}", prefix.trim_end_matches(['-', '.']))
}

/// The host a backup copies: the standby Service, or the primary's when the target is the
/// primary or there is no standby to copy.
pub fn source_host(database: &DatabaseService, target: BackupTarget) -> String {
    let name = database.name_any();
    let namespace = database.namespace().unwrap_or_default();
    match target {
        BackupTarget::Standby if database.spec.replicas_or_default() > 1 => {
            format!("{}.{namespace}.svc", ChildNames::replicas_service(&name))
        }
        _ => format!("{name}.{namespace}.svc"),
    }
}

/// Labels of a backup Job.
pub fn job_labels(database_name: &str) -> BTreeMap<String, String> {
    [
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (COMPONENT_LABEL.to_string(), COMPONENT_BACKUP.to_string()),
        (DATABASE_LABEL.to_string(), database_name.to_string()),
    ]
    .into()
}

/// Volume of the replication role's password in a backup Job.
const REPLICATION_VOLUME: &str = "replication";

/// Volume and directory of the database CA in a backup Job.
const DATABASE_CA_VOLUME: &str = "database-ca";
const DATABASE_CA_DIRECTORY: &str = "/dbservice/database-ca";

/// The Job taking `backup` of `database`.
pub fn backup_job(
    backup: &DatabaseServiceBackup,
    database: &DatabaseService,
    instance_image: &str,
) -> Result<Job, BuildBackupJobError> {
    let database_name = database.name_any();
    let Some(spec) = &database.spec.backup else { return Err(BuildBackupJobError::NoObjectStore(database_name)) };
    if instance_image.is_empty() {
        return Err(BuildBackupJobError::NoInstanceImage);
    }
    let environment = backup_environment(backup, database, spec.retention_policy.as_deref());
    let pod = backup_pod(database, backup_container(database, environment), instance_image);
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(job_name(backup)),
            namespace: database.namespace(),
            labels: Some(job_labels(&database_name)),
            owner_references: backup.controller_owner_ref(&()).map(|reference| vec![reference]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            // One attempt: a failed backup is reported, the next one is a new object.
            backoff_limit: Some(0),
            active_deadline_seconds: Some(BACKUP_DEADLINE_SECONDS),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(
                        [
                            (COMPONENT_LABEL.to_string(), COMPONENT_BACKUP.to_string()),
                            (DATABASE_LABEL.to_string(), database_name.clone()),
                        ]
                        .into(),
                    ),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The backup container's environment: where to back up from, as whom (Secret references),
/// where the summary goes, and the retention to enforce after.
fn backup_environment(
    backup: &DatabaseServiceBackup,
    database: &DatabaseService,
    retention: Option<&str>,
) -> Vec<EnvVar> {
    let database_name = database.name_any();
    let replication = ChildNames::replication(&database_name);
    let primary = format!("{database_name}.{}.svc", database.namespace().unwrap_or_default());
    let mut environment = vec![
        plain_env("PGHOST", source_host(database, backup.spec.target.unwrap_or_default())),
        plain_env("PGPORT", POSTGRES_PORT.to_string()),
        // A role's name is no credential (libpq reads PGUSER); its password is a file.
        secret_env("PGUSER", &replication, "username"),
        plain_env("DBSERVICE_BACKUP_PASSWORD_FILE", format!("{REPLICATION_DIRECTORY}/password")),
        // pg_switch_wal() on the primary completes the backup's last segment at once; the
        // replication role is granted it (the application's role is no superuser and needs no
        // part in backups).
        plain_env("DBSERVICE_BACKUP_SWITCH_WAL_HOST", primary),
        plain_env("DBSERVICE_BACKUP_SUMMARY_FILE", TERMINATION_LOG),
        // TLS, the server verified by the database's CA for the Service's name (pg_basebackup
        // and our own connections read both).
        plain_env("PGSSLMODE", "verify-full"),
        plain_env("PGSSLROOTCERT", format!("{DATABASE_CA_DIRECTORY}/ca.crt")),
    ];
    if let Some(retention) = retention {
        environment.push(plain_env("DBSERVICE_BACKUP_RETENTION", retention));
    }
    environment
}

/// The container that runs `dbservice-operator backup` from the database's own image.
fn backup_container(database: &DatabaseService, environment: Vec<EnvVar>) -> Container {
    Container {
        name: BACKUP_CONTAINER.into(),
        image: Some(database.spec.image_or_default()),
        command: Some(vec![format!("{AGENT_DIRECTORY}/dbservice-operator"), "backup".into()]),
        env: Some(environment),
        termination_message_path: Some(TERMINATION_LOG.into()),
        // On failure without a summary, the end of the log is the message.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(vec![
            VolumeMount { name: "tmp".into(), mount_path: "/tmp".into(), ..Default::default() },
            VolumeMount { read_only: Some(true), ..agent_mount() },
            read_only_mount(REPLICATION_VOLUME, REPLICATION_DIRECTORY),
            read_only_mount(DATABASE_CA_VOLUME, DATABASE_CA_DIRECTORY),
        ]),
        security_context: Some(restricted_security_context()),
        ..Default::default()
    }
}

/// The Job's pod: the same init container as the PostgreSQL pods (it copies our binary into an
/// emptyDir), no API token, and the same store settings as archiving.
fn backup_pod(database: &DatabaseService, container: Container, instance_image: &str) -> PodSpec {
    let mut pod = PodSpec {
        init_containers: Some(vec![agent_init_container(instance_image)]),
        containers: vec![container],
        restart_policy: Some("Never".into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(999),
            run_as_group: Some(999),
            // The store's credentials are files readable by the pod's group only.
            fs_group: Some(999),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
            ..Default::default()
        }),
        volumes: Some(vec![
            Volume { name: "tmp".into(), empty_dir: Some(Default::default()), ..Default::default() },
            Volume { name: AGENT_VOLUME.into(), empty_dir: Some(Default::default()), ..Default::default() },
            // The replication role's password as a file (the pod's group reads it).
            secret_files(REPLICATION_VOLUME, &ChildNames::replication(&database.name_any()), &["password"]),
            // Only the CA of the server certificate (public): the copy verifies the server by it.
            Volume {
                name: DATABASE_CA_VOLUME.into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(server_certificate_secret(database)),
                    items: Some(vec![KeyToPath { key: "ca.crt".into(), path: "ca.crt".into(), ..Default::default() }]),
                    default_mode: Some(0o444),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    // The same store settings, CA and credential references as archiving, minus the settings
    // only the PostgreSQL entrypoint reads.
    add_archiving(&mut pod, database);
    if let Some(environment) = pod.containers[0].env.as_mut() {
        environment.retain(|variable| !variable.name.starts_with("DBSERVICE_ARCHIVE_"));
    }
    pod
}

/// Whether `job` is the one this backup owns.
pub fn is_job_of(job: &Job, backup: &DatabaseServiceBackup) -> bool {
    let uid = backup.uid().unwrap_or_default();
    !uid.is_empty() && job.owner_references().iter().any(|reference| reference.uid == uid)
}
