//! `psql` and `logs`: the verbs that hand over to kubectl (exec into the instance, follow the
//! pods' logs), so that authentication, RBAC and the terminal are kubectl's. The arguments are
//! built here, pure.

use crate::api::database_service::DatabaseService;
use crate::plugin::actions::{instance_of, VerbError};
use kube::ResourceExt;

/// Which instance `psql` opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PsqlInstance {
    /// The current primary.
    Primary,
    /// Any ready standby (the first one the status lists).
    Standby,
    /// A named instance (pod name or ordinal).
    Named(String),
}

/// Why no instance can be opened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PsqlError {
    /// The instance named is not the database's.
    #[error(transparent)]
    Instance(#[from] VerbError),
    /// No primary or standby is known from the status.
    #[error("DatabaseService {database} has no {role} to connect to now (see kubectl dbservice status {database})")]
    NoneReady { database: String, role: &'static str },
}

/// The pod `psql` opens.
pub fn psql_pod(database: &DatabaseService, which: &PsqlInstance) -> Result<String, PsqlError> {
    let name = database.name_any();
    let status = database.status.clone().unwrap_or_default();
    match which {
        PsqlInstance::Named(instance) => Ok(instance_of(database, instance)?),
        PsqlInstance::Primary => {
            status.failover.current_primary.ok_or(PsqlError::NoneReady { database: name, role: "primary" })
        }
        PsqlInstance::Standby => {
            let primary = status.failover.current_primary.clone();
            status
                .instances
                .iter()
                .find(|instance| Some(&instance.name) != primary.as_ref() && instance.ready)
                .map(|instance| instance.name.clone())
                .ok_or(PsqlError::NoneReady { database: name, role: "ready standby" })
        }
    }
}

/// kubectl's arguments for `psql` into `pod` over its local socket, as the application's user or
/// the superuser (`postgres`), into the application's database; `extra` goes to psql.
pub fn psql_arguments(
    database: &DatabaseService,
    pod: &str,
    superuser: bool,
    interactive: bool,
    extra: &[String],
) -> Vec<String> {
    let namespace = database.namespace().unwrap_or_default();
    let user = if superuser { "postgres".to_string() } else { database.spec.username.clone() };
    let mut arguments: Vec<String> = vec!["-n".into(), namespace, "exec".into()];
    if interactive {
        arguments.push("-it".into());
    }
    arguments.extend([pod.to_string(), "-c".into(), "postgres".into(), "--".into(), "psql".into()]);
    arguments.extend(["-h".into(), "/var/run/postgresql".into(), "-U".into(), user, "-d".into()]);
    arguments.push(database.spec.database_name.clone());
    arguments.extend(extra.iter().cloned());
    arguments
}

/// kubectl's arguments for `logs`: every instance's PostgreSQL container (the agent's and the
/// server's output), each line prefixed with its pod, followed with `follow`.
pub fn logs_arguments(database: &DatabaseService, follow: bool, tail: Option<i64>) -> Vec<String> {
    let name = database.name_any();
    let instances = database.spec.replicas_or_default().max(1);
    let mut arguments = vec![
        "-n".to_string(),
        database.namespace().unwrap_or_default(),
        "logs".into(),
        "-l".into(),
        format!("app.kubernetes.io/instance={name},app.kubernetes.io/name=postgresql"),
        "-c".into(),
        "postgres".into(),
        "--prefix".into(),
        format!("--max-log-requests={}", instances + 1),
        format!("--tail={}", tail.unwrap_or(-1)),
    ];
    if follow {
        arguments.push("-f".into());
    }
    arguments
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn orders() -> DatabaseService {
        serde_json::from_value(json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"version": "17", "storageSize": "1Gi", "databaseName": "app", "username": "app_user", "replicas": 3},
            "status": {"currentPrimary": "orders-1", "instances": [
                {"name": "orders-0", "role": "standby", "ready": false}, {"name": "orders-1", "role": "primary", "ready": true}, {"name": "orders-2", "role": "standby", "ready": true}
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn psql_opens_the_primary_a_ready_standby_or_the_instance_named() {
        let database = orders();
        assert_eq!(psql_pod(&database, &PsqlInstance::Primary).unwrap(), "orders-1");
        assert_eq!(psql_pod(&database, &PsqlInstance::Standby).unwrap(), "orders-2", "orders-0 is not ready");
        assert_eq!(psql_pod(&database, &PsqlInstance::Named("0".into())).unwrap(), "orders-0");
        let mut empty = database.clone();
        empty.status = None;
        assert_eq!(
            psql_pod(&empty, &PsqlInstance::Primary).unwrap_err().to_string(),
            "DatabaseService orders has no primary to connect to now (see kubectl dbservice status orders)"
        );
    }

    #[test]
    fn psql_runs_over_the_local_socket_as_the_application_or_the_superuser() {
        let database = orders();
        let extra = vec!["-c".to_string(), "select 1".to_string()];
        let arguments = psql_arguments(&database, "orders-1", false, false, &extra).join(" ");
        assert_eq!(
            arguments,
            "-n shop exec orders-1 -c postgres -- psql -h /var/run/postgresql -U app_user -d app -c select 1"
        );
        let superuser = psql_arguments(&database, "orders-1", true, true, &[]).join(" ");
        assert_eq!(
            superuser,
            "-n shop exec -it orders-1 -c postgres -- psql -h /var/run/postgresql -U postgres -d app"
        );
    }

    #[test]
    fn logs_take_every_instance_prefixed() {
        let arguments = logs_arguments(&orders(), true, Some(100)).join(" ");
        assert_eq!(
            arguments,
            "-n shop logs -l app.kubernetes.io/instance=orders,app.kubernetes.io/name=postgresql -c postgres --prefix --max-log-requests=4 --tail=100 -f"
        );
    }
}
