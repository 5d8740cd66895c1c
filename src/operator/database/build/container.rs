//! Build (pure): the containers of a database pod — PostgreSQL (with the agent as its main
//! process when the operator knows its image) and the init container that brings the agent in.

use crate::api::database_service::DatabaseService;
use crate::api::names::ChildNames;
use crate::api::pod::{
    AGENT_DIRECTORY, AGENT_INIT_CONTAINER, CREDENTIALS_DIRECTORY, METRICS_PORT, OPERATOR_BINARY, PGDATA, POSTGRES_PORT,
    REPLICATION_DIRECTORY, REPLICATION_USER, SUPERUSER, SUPERUSER_DIRECTORY, TLS_DIRECTORY,
};
use crate::operator::database::build::environment::{field_env, plain_env, secret_env};
use crate::operator::database::build::probes::{liveness_probe, readiness_probe};
use crate::operator::database::build::security::restricted_security_context;
use crate::operator::database::build::volumes::{agent_mount, postgres_mounts};
use crate::operator::database::build::{primary_host, WorkloadInputs};
use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar};
use kube::ResourceExt;

/// The PostgreSQL container's environment: the credentials by Secret reference, the data
/// directory, and either the agent's settings or (without an agent) the fixed primary's host.
/// The server's superuser is `postgres` (POSTGRES_USER, as the official image calls it); the
/// application's role (APPLICATION_USER) is an ordinary role owning POSTGRES_DB.
fn postgres_environment(database: &DatabaseService, with_agent: bool) -> Vec<EnvVar> {
    let name = database.name_any();
    let secret = ChildNames::credentials(&name);
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        plain_env("POSTGRES_USER", SUPERUSER),
        // Passwords as files, never in the environment (which every child process, PostgreSQL's
        // among them, would inherit); *_FILE as the official image names them.
        plain_env("POSTGRES_PASSWORD_FILE", format!("{SUPERUSER_DIRECTORY}/password")),
        // Names, not credentials, may stay variables (the image's entrypoint reads POSTGRES_DB
        // so); by reference, so that the Secret stays the one place they are written.
        secret_env("POSTGRES_DB", &secret, "database"),
        secret_env("APPLICATION_USER", &secret, "username"),
        plain_env("APPLICATION_PASSWORD_FILE", format!("{CREDENTIALS_DIRECTORY}/password")),
        plain_env("SUPERUSER_NETWORK_ACCESS", if database.spec.superuser_access_enabled() { "on" } else { "off" }),
        plain_env("REPLICATION_USER", REPLICATION_USER),
        plain_env("REPLICATION_PASSWORD_FILE", format!("{REPLICATION_DIRECTORY}/password")),
        plain_env("PGDATA", PGDATA),
        // TLS on every network connection: the server's certificate and, for every libpq
        // client in the pod (clone, rewind, the WAL receiver), the CA to verify the peer by.
        plain_env("TLS_DIRECTORY", TLS_DIRECTORY),
        plain_env("PGSSLMODE", "verify-full"),
        plain_env("PGSSLROOTCERT", format!("{TLS_DIRECTORY}/ca.crt")),
    ];
    // Read by the image's entrypoint (and ours, standalone) when it runs initdb.
    if let Some(arguments) = database.spec.initdb().and_then(|initdb| initdb.arguments()) {
        env.push(plain_env("POSTGRES_INITDB_ARGS", arguments));
    }
    if with_agent {
        env.push(field_env("POD_NAMESPACE", "metadata.namespace"));
        env.push(plain_env("DBSERVICE_DATABASE", &name));
        env.push(plain_env("DBSERVICE_AGENT", format!("{AGENT_DIRECTORY}/dbservice-operator")));
    } else {
        env.push(plain_env("PRIMARY_HOST", primary_host(database)));
    }
    env
}

/// The PostgreSQL container.
pub fn postgres_container(database: &DatabaseService, inputs: &WorkloadInputs) -> Container {
    let with_agent = inputs.instance_image.is_some();
    Container {
        name: "postgres".into(),
        image: Some(inputs.image.clone()),
        command: Some(vec!["/bin/bash".into(), "/scripts/entrypoint.sh".into()]),
        ports: Some(
            [("postgres", POSTGRES_PORT)]
                .into_iter()
                // The agent serves PostgreSQL's metrics.
                .chain(with_agent.then_some(("metrics", METRICS_PORT)))
                .map(|(name, port)| ContainerPort {
                    name: Some(name.into()),
                    container_port: port,
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect(),
        ),
        env: Some(postgres_environment(database, with_agent)),
        readiness_probe: Some(readiness_probe()),
        liveness_probe: liveness_probe(with_agent),
        resources: database.spec.resources.clone(),
        security_context: Some(restricted_security_context()),
        volume_mounts: Some(postgres_mounts(with_agent)),
        ..Default::default()
    }
}

/// The init container that copies the operator's binary (the agent) from `image` into the pod.
pub fn agent_init_container(image: &str) -> Container {
    Container {
        name: AGENT_INIT_CONTAINER.into(),
        image: Some(image.to_string()),
        command: Some(vec![OPERATOR_BINARY.into(), "install-binary".into(), AGENT_DIRECTORY.into()]),
        security_context: Some(restricted_security_context()),
        volume_mounts: Some(vec![agent_mount()]),
        ..Default::default()
    }
}
