//! Build (pure): the volumes of the database pods, where the PostgreSQL container mounts them,
//! and the data volume's claim template.

use crate::api::database_service::DatabaseService;
use crate::api::names::{labels, ChildNames, DATA_VOLUME};
use crate::api::pod::{
    AGENT_DIRECTORY, AGENT_VOLUME, CREDENTIALS_DIRECTORY, REPLICATION_DIRECTORY, SUPERUSER_DIRECTORY, TLS_DIRECTORY,
};
use crate::operator::database::build::WorkloadInputs;
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, EmptyDirVolumeSource, KeyToPath, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    SecretVolumeSource, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// Where the agent's binary is mounted (written by the init container, read by PostgreSQL's).
pub fn agent_mount() -> VolumeMount {
    VolumeMount { name: AGENT_VOLUME.into(), mount_path: AGENT_DIRECTORY.into(), ..Default::default() }
}

/// The PostgreSQL container's mounts: data, scripts, socket and temporary directories, and the
/// agent's binary (read-only) when there is an agent.
pub fn postgres_mounts(with_agent: bool) -> Vec<VolumeMount> {
    let mut mounts = vec![
        VolumeMount { name: DATA_VOLUME.into(), mount_path: "/var/lib/postgresql/data".into(), ..Default::default() },
        VolumeMount {
            name: "scripts".into(),
            mount_path: "/scripts".into(),
            read_only: Some(true),
            ..Default::default()
        },
        VolumeMount { name: "run".into(), mount_path: "/var/run/postgresql".into(), ..Default::default() },
        VolumeMount { name: "tmp".into(), mount_path: "/tmp".into(), ..Default::default() },
        read_only_mount(CREDENTIALS_VOLUME, CREDENTIALS_DIRECTORY),
        read_only_mount(SUPERUSER_VOLUME, SUPERUSER_DIRECTORY),
        read_only_mount(REPLICATION_VOLUME, REPLICATION_DIRECTORY),
        read_only_mount(TLS_VOLUME, TLS_DIRECTORY),
    ];
    if with_agent {
        mounts.push(VolumeMount { read_only: Some(true), ..agent_mount() });
    }
    mounts
}

/// Volume of the credentials Secret's passwords.
const CREDENTIALS_VOLUME: &str = "credentials";
/// Volume of the replication Secret's password.
const REPLICATION_VOLUME: &str = "replication";
/// Volume of the superuser Secret's password.
const SUPERUSER_VOLUME: &str = "superuser";

/// Volume of the server certificate Secret. PostgreSQL accepts a key file owned by root and
/// readable by its group only (the kubelet's files, 0440 and group fsGroup).
const TLS_VOLUME: &str = "tls";

/// The server certificate Secret the pods serve: the user's (spec.tls) or the operator's.
pub fn server_certificate_secret(database: &DatabaseService) -> String {
    database
        .spec
        .user_server_certificate()
        .map_or_else(|| ChildNames::server_certificate(&database.name_any()), String::from)
}

/// A read-only mount of `volume` at `path`.
pub fn read_only_mount(volume: &str, path: &str) -> VolumeMount {
    VolumeMount { name: volume.into(), mount_path: path.into(), read_only: Some(true), ..Default::default() }
}

/// Only the `keys` of Secret `secret`, as files readable by their owner (root) and the pod's
/// group (the postgres user's, through fsGroup), nobody else.
pub fn secret_files(volume: &str, secret: &str, keys: &[&str]) -> Volume {
    Volume {
        name: volume.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items: Some(
                keys.iter()
                    .map(|key| KeyToPath { key: key.to_string(), path: key.to_string(), ..Default::default() })
                    .collect(),
            ),
            default_mode: Some(0o440),
            optional: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume { name: name.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() }
}

/// The pod's volumes besides the data claim: the scripts ConfigMap, the socket and temporary
/// directories, the passwords and the server certificate as files, and the agent's binary
/// directory when there is an agent.
pub fn pod_volumes(database: &DatabaseService, with_agent: bool) -> Vec<Volume> {
    let name = &database.name_any();
    let scripts = Volume {
        name: "scripts".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: ChildNames::scripts(name),
            default_mode: Some(0o555),
            ..Default::default()
        }),
        ..Default::default()
    };
    vec![
        scripts,
        empty_dir("run"),
        empty_dir("tmp"),
        secret_files(CREDENTIALS_VOLUME, &ChildNames::credentials(name), &["password"]),
        secret_files(REPLICATION_VOLUME, &ChildNames::replication(name), &["password"]),
        secret_files(SUPERUSER_VOLUME, &ChildNames::superuser(name), &["password"]),
        secret_files(TLS_VOLUME, &server_certificate_secret(database), &["tls.crt", "tls.key", "ca.crt"]),
    ]
    .into_iter()
    .chain(with_agent.then(|| empty_dir(AGENT_VOLUME)))
    .collect()
}

/// The data volume's claim template, of the size the StatefulSet was created with.
pub fn claim_template(database: &DatabaseService, inputs: &WorkloadInputs) -> PersistentVolumeClaim {
    let mut claim_request = BTreeMap::new();
    claim_request.insert("storage".to_string(), Quantity(inputs.claim_template_size.clone()));
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(DATA_VOLUME.into()),
            labels: Some(labels(&database.name_any())),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: database.spec.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements { requests: Some(claim_request), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
