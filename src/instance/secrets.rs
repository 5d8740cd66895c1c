//! The Secrets the agent of a primary reads: the password Secrets `spec.roles` names. The
//! agents' Role lets them `get` exactly those (see `operator::database::access`), so a pass reads
//! the current value (a rotated Secret takes effect within one pass) without a volume, which would
//! roll every instance when a role is added.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Reading a Secret failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadSecretError {
    /// The API refused or failed.
    #[error("read secret {name:?}: {detail}")]
    Api {
        /// The Secret.
        name: String,
        /// Why.
        detail: String,
    },
    /// No answer in time.
    #[error("read secret {name:?}: no answer within {timeout:?}")]
    Timeout {
        /// The Secret.
        name: String,
        /// The bound.
        timeout: Duration,
    },
}

/// Where Secrets come from: the API (pods), or a fixed table (tests that run agents on loopback).
#[derive(Clone)]
pub enum SecretReader {
    /// The database's namespace, every read bounded by `timeout`.
    Api {
        /// Secrets of the namespace.
        secrets: Box<Api<Secret>>,
        /// Longest wait for one read.
        timeout: Duration,
    },
    /// (Secret name, key) to value, shared by the clones (a test rotates a value with [`SecretReader::set`]).
    Fixed(Arc<RwLock<BTreeMap<(String, String), String>>>),
}

impl Default for SecretReader {
    fn default() -> Self {
        SecretReader::Fixed(Arc::default())
    }
}

// Never prints a value.
impl std::fmt::Debug for SecretReader {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretReader::Api { timeout, .. } => write!(formatter, "SecretReader::Api({timeout:?})"),
            SecretReader::Fixed(_) => write!(formatter, "SecretReader::Fixed"),
        }
    }
}

impl SecretReader {
    /// A fixed table, from (name, key, value) triples.
    pub fn fixed<'a>(values: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> Self {
        SecretReader::Fixed(Arc::new(RwLock::new(
            values.into_iter().map(|(name, key, value)| ((name.into(), key.into()), value.into())).collect(),
        )))
    }

    /// Sets `key` of Secret `name` in a fixed table (every clone sees it); nothing for the API.
    pub fn set(&self, name: &str, key: &str, value: &str) {
        if let SecretReader::Fixed(values) = self {
            values
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .insert((name.into(), key.into()), value.into());
        }
    }

    /// The value of `key` in Secret `name`: None when the Secret or the key does not exist, or
    /// the value is not UTF-8.
    pub async fn read(&self, name: &str, key: &str) -> Result<Option<String>, ReadSecretError> {
        match self {
            SecretReader::Fixed(values) => Ok(values
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .get(&(name.to_string(), key.to_string()))
                .cloned()),
            SecretReader::Api { secrets, timeout } => {
                let secret = match tokio::time::timeout(*timeout, secrets.get_opt(name)).await {
                    Err(_) => return Err(ReadSecretError::Timeout { name: name.into(), timeout: *timeout }),
                    Ok(Err(error)) => {
                        return Err(ReadSecretError::Api { name: name.into(), detail: error.to_string() })
                    }
                    Ok(Ok(secret)) => secret,
                };
                Ok(secret
                    .and_then(|secret| secret.data)
                    .and_then(|mut data| data.remove(key))
                    .and_then(|value| String::from_utf8(value.0).ok()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fixed_table_answers_by_name_and_key_and_never_prints_values() {
        let reader = SecretReader::fixed([("app-roles", "password", "hunter2")]);
        assert_eq!(reader.read("app-roles", "password").await.unwrap().as_deref(), Some("hunter2"));
        assert_eq!(reader.read("app-roles", "other").await.unwrap(), None);
        assert_eq!(reader.read("missing", "password").await.unwrap(), None);
        reader.clone().set("app-roles", "password", "rotated");
        assert_eq!(reader.read("app-roles", "password").await.unwrap().as_deref(), Some("rotated"));
        assert!(!format!("{reader:?}").contains("hunter2"));
    }
}
