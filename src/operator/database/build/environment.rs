//! Build (pure): environment variables of the containers the operator creates. Secrets are
//! referenced by key, never copied into a value.

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
