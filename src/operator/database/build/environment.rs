//! Build (pure): environment variables of the containers the operator creates. Secrets are
//! referenced by key, never copied into a value, and only for keys that name (a username, a
//! database): a credential (password, token, key) reaches a process as a file of a Secret volume,
//! named by a `*_FILE` variable (issue 37; the test below checks every pod the operator makes).

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, SecretKeySelector};

/// An environment variable from a key of a Secret (never the value itself).
pub fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector { name: secret.into(), key: key.into(), optional: Some(false) }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An environment variable with a plain value. An empty value is left out, as the API server
/// stores it: a desired `value: ""` would never be found in the live object, and the StatefulSet
/// would be re-applied as drift on every pass.
pub fn plain_env(name: &str, value: impl Into<String>) -> EnvVar {
    let value: String = value.into();
    EnvVar { name: name.into(), value: Some(value).filter(|value| !value.is_empty()), ..Default::default() }
}

/// An environment variable from a field of the pod itself (`metadata.name`, `metadata.namespace`).
pub fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: field_path.into(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Every pod template the operator makes, checked for credentials in the environment (issue 37):
/// a credential reaches a process as a file only. A Secret reference may name only a key that
/// identifies (`username`, `database`): those stay variables, as the image's entrypoint and libpq
/// (PGUSER) read them so and `kubectl describe` showing them reveals nothing.
#[cfg(test)]
mod tests {
    use crate::api::database_service_backup::DatabaseServiceBackup;
    use crate::operator::database::build::pooler::{pooler_children, PoolerSecrets};
    use crate::operator::database::build::{stateful_set, test_database, WorkloadInputs};
    use k8s_openapi::api::core::v1::PodSpec;

    /// Keys of a Secret an environment variable may reference.
    const IDENTIFYING_KEYS: [&str; 2] = ["username", "database"];
    /// Words of a variable's name that say it holds a credential (unless its value is a path).
    const CREDENTIAL_WORDS: [&str; 7] = ["PASSWORD", "TOKEN", "SECRET", "KEY", "SAS", "CREDENTIAL", "URI"];
    /// The pooler's test credentials: none may show up in a value.
    const POOLER_VALUES: [&str; 3] = ["auth-pw-7f3a", "admin-pw-91c2", "control-token-5d0e"];

    fn everything() -> serde_json::Value {
        let store = serde_json::json!({
            "endpoint": "http://10.85.0.1:9000", "bucket": "backups", "path": "prod",
            "credentialsSecret": {"name": "s3-credentials", "accessKeyIdKey": "id"},
            "caSecret": {"name": "s3-ca", "key": "ca.crt"}
        });
        serde_json::json!({
            "replicas": 2,
            "pooler": {},
            "backup": {"objectStore": store.clone(), "retentionPolicy": "30d"},
            "bootstrap": {
                "import": {"source": {"host": "old.example.com", "username": "migrator",
                    "passwordSecret": {"name": "old-password"}}, "databases": ["app"]},
                "recovery": {"source": store}
            }
        })
    }

    fn problems(what: &str, pod: &PodSpec) -> Vec<String> {
        let mut found = Vec::new();
        for container in pod.init_containers.iter().flatten().chain(&pod.containers) {
            let at = format!("{what}/{}", container.name);
            if container.env_from.as_ref().is_some_and(|from| from.iter().any(|from| from.secret_ref.is_some())) {
                found.push(format!("{at}: envFrom a Secret"));
            }
            for variable in container.env.iter().flatten() {
                let reference = variable.value_from.as_ref().and_then(|from| from.secret_key_ref.as_ref());
                if let Some(reference) =
                    reference.filter(|reference| !IDENTIFYING_KEYS.contains(&reference.key.as_str()))
                {
                    found.push(format!(
                        "{at}: {} from key {} of secret {}",
                        variable.name, reference.key, reference.name
                    ));
                }
                let value = variable.value.as_deref().unwrap_or_default();
                let name = variable.name.to_ascii_uppercase();
                let named_so = CREDENTIAL_WORDS.iter().any(|word| name.contains(word));
                if named_so && !value.is_empty() && !value.starts_with('/') {
                    found.push(format!("{at}: {} = {value:?} looks like a credential", variable.name));
                }
                if POOLER_VALUES.iter().any(|secret| value.contains(secret)) {
                    found.push(format!("{at}: {} holds a pooler credential", variable.name));
                }
            }
        }
        found
    }

    #[test]
    fn no_pod_the_operator_makes_has_a_credential_in_its_environment() {
        let database = test_database(everything());
        let mut found = Vec::new();
        for instance_image in [Some("example.com/operator:1".to_string()), None] {
            let inputs = WorkloadInputs {
                image: "postgres:16".into(),
                replicas: 2,
                restarted_at: None,
                claim_template_size: "1Gi".into(),
                instance_image,
            };
            let pod = stateful_set(&database, &inputs).spec.template.spec.unwrap();
            found.extend(problems("database pod", &pod));
        }
        let [auth_password, admin_password, control_token] = POOLER_VALUES.map(String::from);
        let secrets = PoolerSecrets { auth_password, admin_password, control_token };
        let pooler = database.spec.pooler.clone().unwrap();
        let children = pooler_children(&database, &pooler, "pgbouncer:1", "example.com/operator:1", Some(&secrets));
        found.extend(problems("pooler pod", &children.deployment.spec.template.spec.unwrap()));
        let backup: DatabaseServiceBackup = serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseServiceBackup",
            "metadata": {"name": "nightly", "namespace": "shop", "uid": "b-1"},
            "spec": {"databaseService": "orders"}
        }))
        .unwrap();
        let job = crate::operator::backup::job::backup_job(&backup, &database, "example.com/operator:1").unwrap();
        found.extend(problems("backup job", &job.spec.unwrap().template.spec.unwrap()));
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn the_check_sees_a_password_variable() {
        let mut pod = PodSpec::default();
        pod.containers.push(k8s_openapi::api::core::v1::Container {
            name: "app".into(),
            env: Some(vec![
                super::secret_env("PGPASSWORD", "orders-credentials", "password"),
                super::plain_env("POOLER_TOKEN", "control-token-5d0e"),
                super::secret_env("PGUSER", "orders-credentials", "username"),
                super::plain_env("PGPASSFILE", "/run/pgpass"),
            ]),
            ..Default::default()
        });
        assert_eq!(problems("pod", &pod).len(), 3, "{:#?}", problems("pod", &pod));
    }
}
