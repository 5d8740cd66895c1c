//! Build (pure): the desired child objects from the DatabaseService and what decide chose (which
//! version runs, how many instances, the restart stamp). [`Desired`] holds every child; `apply`
//! destructures it without `..`, so a new child kind cannot be built and then forgotten.

pub mod archiving;
pub mod recovery;

use crate::api::database_service::DatabaseService;
pub use crate::api::names::{
    describe, label_selector, labels, owner_reference, role_of_pod, selector_labels, ChildNames, DATA_VOLUME,
    INSTANCE_LABEL, ROLE_LABEL,
};
use crate::api::pod::{
    AGENT_DIRECTORY, AGENT_INIT_CONTAINER, AGENT_VOLUME, OPERATOR_BINARY, PGDATA, POSTGRES_PORT, REPLICATION_USER,
    RESTART_ANNOTATION,
};
pub use crate::operator::database::access::{instance_access, InstanceAccess};
use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, ExecAction, ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile, Secret, SecretKeySelector, SecurityContext,
    Service, ServicePort, ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::ByteString;
use kube::ResourceExt;
use std::collections::BTreeMap;

const ENTRYPOINT_SCRIPT: &str = include_str!("scripts/entrypoint.sh");
const PRIMARY_INIT_SCRIPT: &str = include_str!("scripts/primary-init.sh");

/// What the reconciler decided before building.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadInputs {
    /// Image the StatefulSet runs (the spec's, or the last stable one during a rollback).
    pub image: String,
    /// Instances to run (fewer than the spec's while degraded).
    pub replicas: i32,
    /// Restart stamp for the pod template, when the controller restarted the pods.
    pub restarted_at: Option<String>,
    /// Size of the volumeClaimTemplate: the one the StatefulSet was created with (it is immutable).
    pub claim_template_size: String,
    /// The operator's own image, when known: an init container copies the binary from it into each
    /// pod, the instance agent supervises PostgreSQL (failover), and `spec.backup` archives WAL.
    /// When None, roles are fixed by ordinal (pod 0 is the primary) and nothing is archived.
    pub instance_image: Option<String>,
}

fn metadata(database: &DatabaseService, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: database.namespace(),
        labels: Some(labels(&database.name_any())),
        owner_references: Some(vec![owner_reference(database)]),
        ..Default::default()
    }
}

/// DNS name of the primary through the headless Service.
pub fn primary_host(database: &DatabaseService) -> String {
    let name = database.name_any();
    format!("{name}-0.{}.{}.svc", ChildNames::headless_service(&name), database.namespace().unwrap_or_default())
}

/// The credentials Secret; `password` and `replication_password` come from the CSPRNG once.
pub fn credentials_secret(database: &DatabaseService, password: &str, replication_password: &str) -> Secret {
    let name = database.name_any();
    let spec = &database.spec;
    let host = format!("{name}.{}.svc", database.namespace().unwrap_or_default());
    let uri = format!("postgresql://{}:{password}@{host}:{POSTGRES_PORT}/{}", spec.username, spec.database_name);
    let data: BTreeMap<String, ByteString> = [
        ("username", spec.username.clone()),
        ("password", password.to_string()),
        ("database", spec.database_name.clone()),
        ("host", host),
        ("port", POSTGRES_PORT.to_string()),
        ("uri", uri),
        ("replication-username", REPLICATION_USER.to_string()),
        ("replication-password", replication_password.to_string()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), ByteString(value.into_bytes())))
    .collect();
    Secret {
        metadata: metadata(database, ChildNames::credentials(&name)),
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// The ConfigMap holding the bootstrap and replication scripts.
pub fn scripts_config_map(database: &DatabaseService) -> ConfigMap {
    ConfigMap {
        metadata: metadata(database, ChildNames::scripts(&database.name_any())),
        data: Some(
            [("entrypoint.sh", ENTRYPOINT_SCRIPT), ("primary-init.sh", PRIMARY_INIT_SCRIPT)]
                .into_iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

/// An environment variable from a key of a Secret (never the value itself).
pub(crate) fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector { name: secret.into(), key: key.into(), optional: Some(false) }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The container security context of every container the operator creates (database pods and
/// backup Jobs): no privilege escalation, read-only root, non-root, no capabilities.
pub(crate) fn restricted_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
        ..Default::default()
    }
}

/// An environment variable with a plain value. An empty value is left out, as the API server
/// stores it: a desired `value: ""` would never be found in the live object, and the StatefulSet
/// would be re-applied as drift on every pass.
pub(crate) fn plain_env(name: &str, value: impl Into<String>) -> EnvVar {
    let value: String = value.into();
    EnvVar { name: name.into(), value: Some(value).filter(|value| !value.is_empty()), ..Default::default() }
}

fn pg_isready_probe(initial_delay: i32, period: i32, failure_threshold: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("exec pg_isready -h 127.0.0.1 -p {POSTGRES_PORT} -U \"$POSTGRES_USER\" -d \"$POSTGRES_DB\""),
            ]),
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        timeout_seconds: Some(5),
        failure_threshold: Some(failure_threshold),
        ..Default::default()
    }
}

/// The StatefulSet running PostgreSQL.
pub fn stateful_set(database: &DatabaseService, inputs: &WorkloadInputs) -> StatefulSet {
    let name = database.name_any();
    let spec = &database.spec;
    let secret = ChildNames::credentials(&name);
    let mut pod_annotations = BTreeMap::new();
    if let Some(restarted_at) = &inputs.restarted_at {
        pod_annotations.insert(RESTART_ANNOTATION.to_string(), restarted_at.clone());
    }
    let mut env = vec![
        EnvVar {
            name: "POD_NAME".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector { field_path: "metadata.name".into(), ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        },
        secret_env("POSTGRES_USER", &secret, "username"),
        secret_env("POSTGRES_PASSWORD", &secret, "password"),
        secret_env("POSTGRES_DB", &secret, "database"),
        secret_env("REPLICATION_USER", &secret, "replication-username"),
        secret_env("REPLICATION_PASSWORD", &secret, "replication-password"),
        plain_env("PGDATA", PGDATA),
    ];
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
    ];
    let agent_mount =
        VolumeMount { name: AGENT_VOLUME.into(), mount_path: AGENT_DIRECTORY.into(), ..Default::default() };
    match &inputs.instance_image {
        Some(_) => {
            env.push(EnvVar {
                name: "POD_NAMESPACE".into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.namespace".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
            env.push(plain_env("DBSERVICE_DATABASE", &name));
            env.push(plain_env("DBSERVICE_AGENT", format!("{AGENT_DIRECTORY}/dbservice-operator")));
            mounts.push(VolumeMount { read_only: Some(true), ..agent_mount.clone() });
        }
        None => env.push(plain_env("PRIMARY_HOST", primary_host(database))),
    }
    let restricted = restricted_security_context();
    let init_containers = inputs.instance_image.as_ref().map(|image| {
        vec![Container {
            name: AGENT_INIT_CONTAINER.into(),
            image: Some(image.clone()),
            command: Some(vec![OPERATOR_BINARY.into(), "install-binary".into(), AGENT_DIRECTORY.into()]),
            security_context: Some(restricted.clone()),
            volume_mounts: Some(vec![agent_mount]),
            ..Default::default()
        }]
    });
    let container = Container {
        name: "postgres".into(),
        image: Some(inputs.image.clone()),
        command: Some(vec!["/bin/bash".into(), "/scripts/entrypoint.sh".into()]),
        ports: Some(vec![ContainerPort {
            name: Some("postgres".into()),
            container_port: POSTGRES_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        env: Some(env),
        readiness_probe: Some(pg_isready_probe(5, 10, 3)),
        // With the agent, PostgreSQL is down on purpose at times (fenced, waiting to rejoin, being
        // rewound): the agent supervises it, and a kubelet restart would only fight the agent.
        liveness_probe: inputs.instance_image.is_none().then(|| pg_isready_probe(30, 10, 6)),
        resources: spec.resources.clone(),
        security_context: Some(restricted),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    let mut claim_request = BTreeMap::new();
    claim_request.insert("storage".to_string(), Quantity(inputs.claim_template_size.clone()));
    let claim_template = PersistentVolumeClaim {
        metadata: ObjectMeta { name: Some(DATA_VOLUME.into()), labels: Some(labels(&name)), ..Default::default() },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: spec.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements { requests: Some(claim_request), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let empty_dir = |volume_name: &str| Volume {
        name: volume_name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    let mut stateful_set = StatefulSet {
        metadata: metadata(database, name.clone()),
        spec: StatefulSetSpec {
            replicas: Some(inputs.replicas),
            service_name: Some(ChildNames::headless_service(&name)),
            selector: LabelSelector { match_labels: Some(selector_labels(&name)), ..Default::default() },
            // OrderedReady: the primary (pod 0) is created and ready before any standby, so a standby
            // can never take the resources the primary needs; standbys bootstrap from it anyway.
            pod_management_policy: Some("OrderedReady".into()),
            // The operator replaces pods itself, standbys first and the primary only after a
            // switchover (controller::rolling); a RollingUpdate would replace the primary's pod
            // whenever its ordinal comes up.
            update_strategy: Some(StatefulSetUpdateStrategy { type_: Some("OnDelete".into()), rolling_update: None }),
            // Never delete data volumes on scale-down or deletion: the finalizer decides.
            persistent_volume_claim_retention_policy: Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
                when_deleted: Some("Retain".into()),
                when_scaled: Some("Retain".into()),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(&name)),
                    annotations: (!pod_annotations.is_empty()).then_some(pod_annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    init_containers,
                    // Only the agent talks to the API, with its own least-privilege account.
                    service_account_name: inputs.instance_image.as_ref().map(|_| ChildNames::instance_account(&name)),
                    automount_service_account_token: Some(inputs.instance_image.is_some()),
                    enable_service_links: Some(false),
                    termination_grace_period_seconds: Some(30),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(999),
                        run_as_group: Some(999),
                        fs_group: Some(999),
                        // Only walk the volume when its root has the wrong group: a large data directory is
                        // not re-chowned on every start, and pgdata's mode is left alone.
                        fs_group_change_policy: Some("OnRootMismatch".into()),
                        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
                        ..Default::default()
                    }),
                    volumes: Some(
                        vec![
                            Volume {
                                name: "scripts".into(),
                                config_map: Some(ConfigMapVolumeSource {
                                    name: ChildNames::scripts(&name),
                                    default_mode: Some(0o555),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            },
                            empty_dir("run"),
                            empty_dir("tmp"),
                        ]
                        .into_iter()
                        .chain(inputs.instance_image.as_ref().map(|_| empty_dir(AGENT_VOLUME)))
                        .collect(),
                    ),
                    ..Default::default()
                }),
            },
            volume_claim_templates: Some(vec![claim_template]),
            ..Default::default()
        },
        ..Default::default()
    };
    // Archiving and recovery need our binary in the pod, so they follow spec.backup and
    // spec.bootstrap.recovery only when the operator knows its image.
    if let (Some(_), Some(pod)) = (&inputs.instance_image, stateful_set.spec.template.spec.as_mut()) {
        crate::operator::database::build::archiving::add_archiving(pod, database);
        crate::operator::database::build::recovery::add_recovery(pod, database);
    }
    stateful_set
}

fn service(database: &DatabaseService, name: String, selector: BTreeMap<String, String>, headless: bool) -> Service {
    Service {
        metadata: metadata(database, name),
        spec: Some(ServiceSpec {
            selector: Some(selector),
            cluster_ip: headless.then(|| "None".to_string()),
            // Pods must resolve each other before they are ready (a standby bootstraps from the primary).
            publish_not_ready_addresses: headless.then_some(true),
            ports: Some(vec![ServicePort {
                name: Some("postgres".into()),
                port: POSTGRES_PORT,
                target_port: Some(IntOrString::String("postgres".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Service NAME (the primary), NAME-replicas (the standbys) and NAME-headless (pod DNS).
pub fn services(database: &DatabaseService) -> Vec<Service> {
    let name = database.name_any();
    // The operator labels exactly one pod primary (none during a failover): never two behind NAME.
    let mut primary = selector_labels(&name);
    primary.insert(ROLE_LABEL.into(), "primary".into());
    let mut standbys = selector_labels(&name);
    standbys.insert(ROLE_LABEL.into(), "standby".into());
    vec![
        service(database, name.clone(), primary, false),
        service(database, ChildNames::replicas_service(&name), standbys, false),
        service(database, ChildNames::headless_service(&name), selector_labels(&name), true),
    ]
}

/// A fresh password from the OS CSPRNG: 32 bytes (256 bits) encoded URL-safe without padding.
pub fn generate_password() -> String {
    use base64::Engine;
    use rand::TryRngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.try_fill_bytes(&mut bytes).expect("the OS random number generator is available");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Every child object one pass wants to exist.
#[derive(Clone, Debug)]
pub struct Desired {
    /// The credentials Secret, only when it is to be created (it is never overwritten).
    pub credentials: Option<Secret>,
    /// ConfigMap NAME-scripts.
    pub scripts: ConfigMap,
    /// Services NAME, NAME-replicas and NAME-headless.
    pub services: Vec<Service>,
    /// StatefulSet NAME.
    pub stateful_set: StatefulSet,
    /// The instance agents' account, Role, binding and Lease (only with the agent).
    pub instance_access: Option<InstanceAccess>,
}

/// Fresh passwords for a new credentials Secret (the one impure input of building).
pub struct NewPasswords {
    /// The application role's password.
    pub password: String,
    /// The replication role's password.
    pub replication_password: String,
}

/// Builds every child of `database` for the decided workload.
pub fn desired(database: &DatabaseService, inputs: &WorkloadInputs, passwords: Option<NewPasswords>) -> Desired {
    Desired {
        credentials: passwords
            .map(|passwords| credentials_secret(database, &passwords.password, &passwords.replication_password)),
        scripts: scripts_config_map(database),
        services: services(database),
        stateful_set: stateful_set(database, inputs),
        instance_access: inputs.instance_image.as_ref().map(|_| instance_access(database)),
    }
}

/// Size of the volumeClaimTemplate of a live StatefulSet (immutable once created).
pub fn claim_template_size(stateful_set: &StatefulSet) -> Option<String> {
    stateful_set
        .spec
        .volume_claim_templates
        .as_ref()?
        .first()?
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .map(|quantity| quantity.0.clone())
}
