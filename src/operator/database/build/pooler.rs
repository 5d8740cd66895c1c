//! Build (pure): the pooler's children (issue 25): ConfigMap NAME-pooler (PgBouncer's two
//! configurations), Secret NAME-pooler (the pooler role's and the admin's passwords, the agent's
//! control token; created once, never overwritten), Services NAME-pooler and
//! NAME-pooler-replicas, the pooler agent's account, a PodDisruptionBudget and Deployment
//! NAME-pooler. Every pod runs the pooler agent (the operator's image) and one PgBouncer per pool.

use crate::api::database_service::DatabaseService;
use crate::api::names::{labels, owner_reference, ChildNames, INSTANCE_LABEL};
use crate::api::pod::{OPERATOR_BINARY, POSTGRES_PORT};
use crate::api::pooler::{
    PoolerSpec, ADMIN_PASSWORD_KEY, AGENT_SECRET_DIRECTORY, AUTH_PASSWORD_KEY, AUTH_QUERY, CA_DIRECTORY,
    CONTROL_TOKEN_KEY, POOLER_ADMIN, POOLER_AGENT_PORT, POOLER_CONTROL_PORT, POOLER_ROLE, READ_ONLY_PORT,
    READ_WRITE_PORT, RUN_DIRECTORY, TLS_DIRECTORY,
};
use crate::operator::database::build::{metadata, restricted_security_context};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Affinity, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource, ExecAction, KeyToPath,
    Lifecycle, LifecycleHandler, ObjectFieldSelector, PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, SeccompProfile, Secret, SecretVolumeSource, Service, ServiceAccount, ServicePort,
    ServiceSpec, TCPSocketAction, Volume, VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::ByteString;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// Annotation of the pooler's pod template: a fingerprint of its configuration, so that a change
/// rolls the pods (one at a time, a new one ready before an old one goes).
pub const CONFIGURATION_ANNOTATION: &str = "dbservice.dev/pooler-configuration";
/// Label value of `app.kubernetes.io/component` on the pooler's pods.
pub const POOLER_COMPONENT: &str = "pooler";
/// UID every container of a pooler pod runs as (the operator image's user; PgBouncer needs none).
const POOLER_USER: i64 = 65532;
/// Where the ConfigMap and the Secrets are mounted in the PgBouncer containers (side by side: a
/// volume mounted inside another one's directory depends on the runtime making the mount point).
const CONFIGURATION_DIRECTORY: &str = "/etc/pgbouncer-config";
const SECRET_DIRECTORY: &str = "/etc/pgbouncer-secret";
/// How long a terminating pooler pod keeps serving after it left the Services' endpoints: new
/// clients go to the other pods meanwhile, those still connected finish.
const DRAIN_SECONDS: u32 = 10;

/// Labels of the pooler's pods (not the database's selector: the database's Services, budgets
/// and caches never see them).
pub fn pooler_pod_labels(name: &str) -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name".to_string(), "pgbouncer".to_string()),
        (INSTANCE_LABEL.to_string(), name.to_string()),
        ("app.kubernetes.io/component".to_string(), POOLER_COMPONENT.to_string()),
    ]
    .into()
}

/// Every child of the pooler.
#[derive(Clone, Debug)]
pub struct PoolerChildren {
    /// Secret NAME-pooler, only when it is to be created.
    pub secret: Option<Secret>,
    /// ConfigMap NAME-pooler.
    pub config_map: ConfigMap,
    /// Services NAME-pooler and (with the read-only pool) NAME-pooler-replicas.
    pub services: Vec<Service>,
    /// The pooler agent's ServiceAccount, Role (get its DatabaseService) and RoleBinding.
    pub account: (ServiceAccount, Role, RoleBinding),
    /// PodDisruptionBudget NAME-pooler.
    pub disruption_budget: PodDisruptionBudget,
    /// Deployment NAME-pooler.
    pub deployment: Deployment,
}

/// The passwords and token of a new Secret NAME-pooler.
#[derive(Clone, Debug)]
pub struct PoolerSecrets {
    /// The pooler role's password (PgBouncer's `auth_user`).
    pub auth_password: String,
    /// PgBouncer's admin console password.
    pub admin_password: String,
    /// Bearer token of the agent's /pause.
    pub control_token: String,
}

fn ini_line(key: &str, value: impl std::fmt::Display) -> String {
    format!("{key} = {value}\n")
}

/// One PgBouncer's configuration: `port`, the [databases] section `databases`.
fn pgbouncer_ini(pooler: &PoolerSpec, port: i32, socket_directory: &str, databases: &str) -> String {
    let mut ini = String::from("[databases]\n");
    ini.push_str(databases);
    ini.push_str("\n[pgbouncer]\n");
    for (key, value) in [
        ("listen_addr", "0.0.0.0".to_string()),
        ("listen_port", port.to_string()),
        ("unix_socket_dir", socket_directory.to_string()),
        ("auth_type", "scram-sha-256".into()),
        ("auth_file", format!("{SECRET_DIRECTORY}/userlist.txt")),
        ("auth_user", POOLER_ROLE.into()),
        ("auth_query", AUTH_QUERY.into()),
        ("admin_users", POOLER_ADMIN.into()),
        ("stats_users", POOLER_ADMIN.into()),
        ("pool_mode", pooler.pool_mode_or_default().as_str().into()),
        ("default_pool_size", pooler.pool_size_or_default().to_string()),
        ("max_client_conn", pooler.max_client_connections_or_default().to_string()),
        // Drivers send these at connect (JDBC: extra_float_digits); PgBouncer would refuse them.
        ("ignore_startup_parameters", "extra_float_digits,options".into()),
        ("client_tls_sslmode", "require".into()),
        ("client_tls_cert_file", format!("{TLS_DIRECTORY}/tls.crt")),
        ("client_tls_key_file", format!("{TLS_DIRECTORY}/tls.key")),
        ("server_tls_sslmode", "verify-full".into()),
        ("server_tls_ca_file", format!("{CA_DIRECTORY}/ca.crt")),
        // A server connection to a primary that went away is found on its next use, not reused.
        ("server_check_delay", "0".into()),
        // After a failed server login PgBouncer refuses every new client of that pool, and tries
        // again only after this many seconds (15 by default): a failover's refused connections
        // would cost the clients 15 s after the new primary is there.
        ("server_login_retry", "1".into()),
        ("logfile", String::new()),
        ("pidfile", String::new()),
    ] {
        if !pooler.parameters.contains_key(key) {
            ini.push_str(&ini_line(key, value));
        }
    }
    for (key, value) in &pooler.parameters {
        ini.push_str(&ini_line(key, value));
    }
    ini
}

/// ConfigMap NAME-pooler: `rw.ini` (its [databases] included from the file the agent writes:
/// it points at the current primary) and `ro.ini` (the standbys' Service).
pub fn pooler_config_map(database: &DatabaseService, pooler: &PoolerSpec) -> ConfigMap {
    let name = database.name_any();
    let namespace = database.namespace().unwrap_or_default();
    let replicas = format!("* = host={}.{namespace}.svc port={POSTGRES_PORT}\n", ChildNames::replicas_service(&name));
    let read_write = format!("%include {RUN_DIRECTORY}/rw-databases.ini\n");
    let mut data = BTreeMap::from([(
        "rw.ini".to_string(),
        pgbouncer_ini(pooler, READ_WRITE_PORT, &format!("{RUN_DIRECTORY}/rw"), &read_write),
    )]);
    if pooler.read_only_enabled() {
        data.insert("ro.ini".into(), pgbouncer_ini(pooler, READ_ONLY_PORT, &format!("{RUN_DIRECTORY}/ro"), &replicas));
    }
    ConfigMap { metadata: metadata(database, ChildNames::pooler(&name)), data: Some(data), ..Default::default() }
}

/// Secret NAME-pooler from `secrets`: the passwords, the token and PgBouncer's `userlist.txt`
/// (the pooler role and the admin only: every other user is looked up by `auth_query`).
pub fn pooler_secret(database: &DatabaseService, secrets: &PoolerSecrets) -> Secret {
    let userlist =
        format!("\"{POOLER_ROLE}\" \"{}\"\n\"{POOLER_ADMIN}\" \"{}\"\n", secrets.auth_password, secrets.admin_password);
    let data = [
        (AUTH_PASSWORD_KEY, secrets.auth_password.as_str()),
        (ADMIN_PASSWORD_KEY, secrets.admin_password.as_str()),
        (CONTROL_TOKEN_KEY, secrets.control_token.as_str()),
        ("userlist.txt", userlist.as_str()),
    ];
    Secret {
        metadata: metadata(database, ChildNames::pooler(&database.name_any())),
        type_: Some("Opaque".into()),
        data: Some(data.iter().map(|(key, value)| (key.to_string(), ByteString(value.as_bytes().to_vec()))).collect()),
        ..Default::default()
    }
}

fn pooler_service(database: &DatabaseService, name: String, port: &str) -> Service {
    Service {
        metadata: metadata(database, name),
        spec: Some(ServiceSpec {
            selector: Some(pooler_pod_labels(&database.name_any())),
            ports: Some(vec![ServicePort {
                name: Some("postgres".into()),
                port: POSTGRES_PORT,
                target_port: Some(IntOrString::String(port.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Services NAME-pooler (read-write) and, with the read-only pool, NAME-pooler-replicas.
pub fn pooler_services(database: &DatabaseService, pooler: &PoolerSpec) -> Vec<Service> {
    let name = database.name_any();
    let mut services = vec![pooler_service(database, ChildNames::pooler(&name), "rw")];
    if pooler.read_only_enabled() {
        services.push(pooler_service(database, ChildNames::pooler_replicas_service(&name), "ro"));
    }
    services
}

/// The pooler agent's ServiceAccount, and a Role that may read its own DatabaseService only.
pub fn pooler_account(database: &DatabaseService) -> (ServiceAccount, Role, RoleBinding) {
    let name = ChildNames::pooler(&database.name_any());
    let account = ServiceAccount {
        metadata: metadata(database, name.clone()),
        automount_service_account_token: Some(false),
        ..Default::default()
    };
    let role = Role {
        metadata: metadata(database, name.clone()),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["dbservice.dev".into()]),
            resources: Some(vec!["databaseservices".into()]),
            resource_names: Some(vec![database.name_any()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: metadata(database, name.clone()),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: database.namespace(),
            ..Default::default()
        }]),
    };
    (account, role, binding)
}

/// PodDisruptionBudget NAME-pooler: one pooler pod at a time (none with a single pod would block
/// every drain, so a single pod may go).
pub fn pooler_disruption_budget(database: &DatabaseService, pooler: &PoolerSpec) -> PodDisruptionBudget {
    let name = database.name_any();
    PodDisruptionBudget {
        metadata: metadata(database, ChildNames::pooler(&name)),
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector { match_labels: Some(pooler_pod_labels(&name)), ..Default::default() }),
            min_available: Some(IntOrString::Int((pooler.instances_or_default() - 1).max(0))),
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount { name: name.into(), mount_path: path.into(), read_only: Some(true), ..Default::default() }
}

fn plain(variable: &str, value: &str) -> EnvVar {
    EnvVar { name: variable.into(), value: Some(value.into()), ..Default::default() }
}

fn pgbouncer_container(pooler: &PoolerSpec, image: &str, pool: &str, port: i32) -> Container {
    // Started once the agent wrote what the configuration includes (the primary to point at).
    let start = format!(
        "mkdir -p {RUN_DIRECTORY}/{pool} && until [ -s {RUN_DIRECTORY}/rw-databases.ini ]; do sleep 0.2; done; \
         exec pgbouncer {CONFIGURATION_DIRECTORY}/{pool}.ini"
    );
    let probe = |period: i32, failures: i32| Probe {
        tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(port), ..Default::default() }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    Container {
        name: format!("pgbouncer-{pool}"),
        image: Some(image.into()),
        command: Some(vec!["/bin/sh".into(), "-c".into(), start]),
        ports: Some(vec![ContainerPort {
            name: Some(pool.into()),
            container_port: port,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(probe(2, 2)),
        liveness_probe: Some(probe(10, 3)),
        // Out of the Services' endpoints first, then a safe shutdown (SIGINT: wait for the
        // servers to be released) once the connected clients had time to finish.
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec!["/bin/sh".into(), "-c".into(), format!("sleep {DRAIN_SECONDS}; kill -INT 1")]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        resources: pooler.resources.clone(),
        security_context: Some(restricted_security_context()),
        volume_mounts: Some(vec![
            VolumeMount { name: "run".into(), mount_path: RUN_DIRECTORY.into(), ..Default::default() },
            mount("configuration", CONFIGURATION_DIRECTORY),
            mount("secret", SECRET_DIRECTORY),
            mount("tls", TLS_DIRECTORY),
            mount("ca", CA_DIRECTORY),
        ]),
        ..Default::default()
    }
}

/// The agent's keys of Secret NAME-pooler, as files of [`AGENT_SECRET_DIRECTORY`] (never in the
/// environment: `kubectl get pod` would not show them, but every process of the container could
/// read them from `/proc/1/environ`), and the variables naming the files.
const AGENT_SECRET_FILES: [(&str, &str); 3] = [
    ("POOLER_ADMIN_PASSWORD_FILE", ADMIN_PASSWORD_KEY),
    ("POOLER_AUTH_PASSWORD_FILE", AUTH_PASSWORD_KEY),
    ("POOLER_CONTROL_TOKEN_FILE", CONTROL_TOKEN_KEY),
];

fn agent_container(database: &DatabaseService, agent_image: &str) -> Container {
    let files =
        AGENT_SECRET_FILES.iter().map(|(variable, key)| plain(variable, &format!("{AGENT_SECRET_DIRECTORY}/{key}")));
    let port = |name: &str, number: i32| ContainerPort {
        name: Some(name.into()),
        container_port: number,
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    let field = |path: &str| EnvVarSource {
        field_ref: Some(ObjectFieldSelector { field_path: path.into(), ..Default::default() }),
        ..Default::default()
    };
    Container {
        name: "pooler-agent".into(),
        image: Some(agent_image.into()),
        command: Some(vec![OPERATOR_BINARY.into(), "pooler".into(), "run".into()]),
        env: Some(
            vec![
                plain("DATABASE_NAME", &database.name_any()),
                EnvVar {
                    name: "POD_NAMESPACE".into(),
                    value_from: Some(field("metadata.namespace")),
                    ..Default::default()
                },
                EnvVar { name: "POD_NAME".into(), value_from: Some(field("metadata.name")), ..Default::default() },
            ]
            .into_iter()
            .chain(files)
            .collect(),
        ),
        // Plain metrics and probes; /pause over TLS on its own port.
        ports: Some(vec![port("metrics", POOLER_AGENT_PORT), port("control", POOLER_CONTROL_PORT)]),
        readiness_probe: Some(Probe {
            http_get: Some(k8s_openapi::api::core::v1::HTTPGetAction {
                path: Some("/healthz".into()),
                port: IntOrString::Int(POOLER_AGENT_PORT),
                ..Default::default()
            }),
            period_seconds: Some(5),
            ..Default::default()
        }),
        security_context: Some(restricted_security_context()),
        // The certificate files too: a renewed one is loaded by a RELOAD.
        volume_mounts: Some(vec![
            VolumeMount { name: "run".into(), mount_path: RUN_DIRECTORY.into(), ..Default::default() },
            mount("tls", TLS_DIRECTORY),
            mount("ca", CA_DIRECTORY),
            mount("agent-secret", AGENT_SECRET_DIRECTORY),
        ]),
        ..Default::default()
    }
}

/// Only the agent's keys of Secret NAME-pooler, readable by the pod's group (the kubelet makes the
/// files root's and the fsGroup's; the containers run as that group's user).
fn agent_secret_volume(secret: String) -> Volume {
    let items = AGENT_SECRET_FILES
        .iter()
        .map(|(_, key)| KeyToPath { key: key.to_string(), path: key.to_string(), ..Default::default() })
        .collect();
    Volume {
        name: "agent-secret".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret),
            items: Some(items),
            default_mode: Some(0o440),
            optional: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn volumes(database: &DatabaseService, server_certificate: &str) -> Vec<Volume> {
    let name = database.name_any();
    vec![
        Volume { name: "run".into(), empty_dir: Some(Default::default()), ..Default::default() },
        Volume {
            name: "configuration".into(),
            config_map: Some(ConfigMapVolumeSource { name: ChildNames::pooler(&name), ..Default::default() }),
            ..Default::default()
        },
        Volume {
            name: "secret".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(ChildNames::pooler(&name)),
                items: Some(vec![KeyToPath {
                    key: "userlist.txt".into(),
                    path: "userlist.txt".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        },
        agent_secret_volume(ChildNames::pooler(&name)),
        Volume {
            name: "tls".into(),
            secret: Some(SecretVolumeSource { secret_name: Some(server_certificate.into()), ..Default::default() }),
            ..Default::default()
        },
        Volume {
            name: "ca".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: ChildNames::certificate_authority(&name),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]
}

/// Deployment NAME-pooler: `instances` pods spread across nodes, rolled one new pod before one
/// old one. `agent_image` is the operator's, `server_certificate` the Secret the database serves.
pub fn pooler_deployment(
    database: &DatabaseService,
    pooler: &PoolerSpec,
    pooler_image: &str,
    agent_image: &str,
    server_certificate: &str,
    configuration: &ConfigMap,
) -> Deployment {
    let name = database.name_any();
    let pod_labels = pooler_pod_labels(&name);
    let image = pooler.image.as_deref().unwrap_or(pooler_image);
    let mut containers = vec![agent_container(database, agent_image)];
    containers.push(pgbouncer_container(pooler, image, "rw", READ_WRITE_PORT));
    if pooler.read_only_enabled() {
        containers.push(pgbouncer_container(pooler, image, "ro", READ_ONLY_PORT));
    }
    let fingerprint = format!(
        "{:016x}",
        crate::api::postgresql::fnv1a(serde_json::to_string(&configuration.data).unwrap_or_default().as_bytes())
    );
    let pod_spec = pooler_pod_spec(database, containers, server_certificate, &pod_labels);
    Deployment {
        metadata: ObjectMeta {
            name: Some(ChildNames::pooler(&name)),
            namespace: database.namespace(),
            labels: Some(labels(&name)),
            owner_references: Some(vec![owner_reference(database)]),
            ..Default::default()
        },
        spec: DeploymentSpec {
            // Hibernated: no pooler pod either (the Services, Secret and ConfigMap stay).
            replicas: Some(if database.spec.is_hibernated() { 0 } else { pooler.instances_or_default() }),
            selector: LabelSelector { match_labels: Some(pod_labels.clone()), ..Default::default() },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some([(CONFIGURATION_ANNOTATION.to_string(), fingerprint)].into()),
                    ..Default::default()
                }),
                spec: Some(pod_spec),
            },
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The pooler pods: `containers` as an unprivileged user, spread across nodes, placed as the
/// database's pods are.
fn pooler_pod_spec(
    database: &DatabaseService,
    containers: Vec<Container>,
    server_certificate: &str,
    pod_labels: &BTreeMap<String, String>,
) -> PodSpec {
    let placement = &database.spec.placement;
    let spread = WeightedPodAffinityTerm {
        weight: 100,
        pod_affinity_term: PodAffinityTerm {
            label_selector: Some(LabelSelector { match_labels: Some(pod_labels.clone()), ..Default::default() }),
            topology_key: "kubernetes.io/hostname".into(),
            ..Default::default()
        },
    };
    PodSpec {
        service_account_name: Some(ChildNames::pooler(&database.name_any())),
        automount_service_account_token: Some(true),
        containers,
        volumes: Some(volumes(database, server_certificate)),
        termination_grace_period_seconds: Some(i64::from(DRAIN_SECONDS) + 20),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(POOLER_USER),
            run_as_group: Some(POOLER_USER),
            fs_group: Some(POOLER_USER),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
            ..Default::default()
        }),
        affinity: Some(Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                preferred_during_scheduling_ignored_during_execution: Some(vec![spread]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        tolerations: placement.tolerations.clone(),
        node_selector: placement.node_selector.clone(),
        priority_class_name: placement.priority_class_name.clone(),
        ..Default::default()
    }
}

/// Every child of the pooler of `database` (which has `spec.pooler`); `secrets` only when Secret
/// NAME-pooler is to be created.
pub fn pooler_children(
    database: &DatabaseService,
    pooler: &PoolerSpec,
    pooler_image: &str,
    agent_image: &str,
    secrets: Option<&PoolerSecrets>,
) -> PoolerChildren {
    let config_map = pooler_config_map(database, pooler);
    let certificate = database
        .spec
        .user_server_certificate()
        .map_or_else(|| ChildNames::server_certificate(&database.name_any()), str::to_string);
    PoolerChildren {
        secret: secrets.map(|secrets| pooler_secret(database, secrets)),
        services: pooler_services(database, pooler),
        account: pooler_account(database),
        disruption_budget: pooler_disruption_budget(database, pooler),
        deployment: pooler_deployment(database, pooler, pooler_image, agent_image, &certificate, &config_map),
        config_map,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database(pooler: serde_json::Value) -> DatabaseService {
        crate::operator::database::build::test_database(serde_json::json!({"pooler": pooler}))
    }

    fn children(pooler: serde_json::Value) -> PoolerChildren {
        let database = database(pooler);
        let spec = database.spec.pooler.clone().unwrap();
        let secrets =
            PoolerSecrets { auth_password: "a".into(), admin_password: "b".into(), control_token: "c".into() };
        pooler_children(&database, &spec, "example.com/pgbouncer:1.24", "example.com/operator:1", Some(&secrets))
    }

    #[test]
    fn the_read_write_pool_follows_the_agent_and_the_read_only_pool_the_standbys() {
        let built = children(serde_json::json!({"parameters": {"server_lifetime": "600", "server_check_delay": "5"}}));
        let data = built.config_map.data.unwrap();
        let read_write = &data["rw.ini"];
        assert!(read_write.starts_with("[databases]\n%include /run/pgbouncer/rw-databases.ini\n"), "{read_write}");
        assert!(read_write.contains("listen_port = 6432\n"));
        assert!(read_write.contains("auth_user = dbservice_pooler\n"));
        assert!(read_write.contains("auth_query = SELECT usename, passwd FROM dbservice_pooler.user_password($1)\n"));
        assert!(read_write.contains("client_tls_sslmode = require\n"));
        assert!(read_write.contains("server_tls_sslmode = verify-full\n"));
        assert!(read_write.contains("pool_mode = transaction\n"));
        assert!(read_write.contains("server_lifetime = 600\n"));
        assert_eq!(read_write.matches("server_check_delay").count(), 1, "the user's value replaces ours");
        assert!(read_write.contains("server_check_delay = 5\n"));
        // A failed server login must not shut the pool's clients out for PgBouncer's 15 s.
        assert!(read_write.contains("server_login_retry = 1\n"), "{read_write}");
        let read_only = &data["ro.ini"];
        assert!(read_only.contains("* = host=orders-replicas.shop.svc port=5432\n"), "{read_only}");
        assert!(read_only.contains("listen_port = 6433\n"));
        let names: Vec<String> = built.services.iter().map(|service| service.name_any()).collect();
        assert_eq!(names, ["orders-pooler", "orders-pooler-replicas"]);
    }

    #[test]
    fn the_deployment_runs_the_agent_and_both_pools_without_the_database_labels() {
        let built = children(serde_json::json!({"instances": 3}));
        let spec = built.deployment.spec;
        assert_eq!(spec.replicas, Some(3));
        let template = spec.template.spec.unwrap();
        let names: Vec<&str> = template.containers.iter().map(|container| container.name.as_str()).collect();
        assert_eq!(names, ["pooler-agent", "pgbouncer-rw", "pgbouncer-ro"]);
        let labels = spec.template.metadata.unwrap().labels.unwrap();
        assert_eq!(labels.get("app.kubernetes.io/name").map(String::as_str), Some("pgbouncer"));
        assert!(!labels.contains_key(crate::api::names::MANAGED_BY_LABEL), "the database's pod cache skips them");
        assert_eq!(template.containers[1].image.as_deref(), Some("example.com/pgbouncer:1.24"));
        let budget = built.disruption_budget.spec.unwrap();
        assert_eq!(budget.min_available, Some(IntOrString::Int(2)));
        let secret = built.secret.unwrap().data.unwrap();
        assert_eq!(
            String::from_utf8(secret["userlist.txt"].0.clone()).unwrap(),
            "\"dbservice_pooler\" \"a\"\n\"dbservice_pooler_admin\" \"b\"\n"
        );
    }

    #[test]
    fn the_agent_reads_its_passwords_and_token_from_files_and_serves_pause_on_its_own_port() {
        let template = children(serde_json::json!({})).deployment.spec.template.spec.unwrap();
        let agent = &template.containers[0];
        let environment: BTreeMap<&str, Option<&str>> =
            agent.env.iter().flatten().map(|variable| (variable.name.as_str(), variable.value.as_deref())).collect();
        assert_eq!(environment["POOLER_CONTROL_TOKEN_FILE"], Some("/etc/pooler-agent-secret/control-token"));
        assert_eq!(environment["POOLER_ADMIN_PASSWORD_FILE"], Some("/etc/pooler-agent-secret/admin-password"));
        assert!(agent
            .env
            .iter()
            .flatten()
            .all(|variable| variable.value_from.as_ref().is_none_or(|from| from.secret_key_ref.is_none())));
        let mounted = agent.volume_mounts.iter().flatten().find(|mount| mount.name == "agent-secret").unwrap();
        assert_eq!((mounted.mount_path.as_str(), mounted.read_only), (AGENT_SECRET_DIRECTORY, Some(true)));
        let volume = template.volumes.iter().flatten().find(|volume| volume.name == "agent-secret").unwrap();
        let source = volume.secret.as_ref().unwrap();
        assert_eq!(source.default_mode, Some(0o440));
        let keys: Vec<&str> = source.items.iter().flatten().map(|item| item.key.as_str()).collect();
        assert_eq!(keys, ["admin-password", "auth-password", "control-token"], "not userlist.txt");
        // PgBouncer gets none of them.
        assert!(template.containers[1..]
            .iter()
            .all(|container| { container.volume_mounts.iter().flatten().all(|mount| mount.name != "agent-secret") }));
        let ports: Vec<i32> = agent.ports.iter().flatten().map(|port| port.container_port).collect();
        assert_eq!(ports, [POOLER_AGENT_PORT, POOLER_CONTROL_PORT]);
    }

    #[test]
    fn without_the_read_only_pool_there_is_one_service_and_a_new_configuration_rolls_the_pods() {
        let built = children(serde_json::json!({"readOnly": false}));
        assert_eq!(built.services.len(), 1);
        assert!(!built.config_map.data.unwrap().contains_key("ro.ini"));
        let fingerprint = |built: PoolerChildren| {
            built.deployment.spec.template.metadata.unwrap().annotations.unwrap()[CONFIGURATION_ANNOTATION].clone()
        };
        let first = fingerprint(children(serde_json::json!({})));
        let second = fingerprint(children(serde_json::json!({"poolMode": "session"})));
        assert_ne!(first, second);
    }
}
