//! Self-managed webhook certificates in-cluster: the CA and the serving certificate live in a
//! Secret in the operator's namespace, every replica writes them to its TLS files (the reloader
//! picks them up), and the caBundle of the operator's own webhook configurations is patched with
//! the CA (never the leaf). A timer re-checks that the live caBundle trusts the served
//! certificate, repairs it, and renews before expiry. A renewed CA is appended to the caBundle
//! before any certificate signed by it is served, so no admission fails during rotation.

use super::{
    bundle_trusts, generate_ca, generate_serving_certificate, write_atomically, CA_VALIDITY, SERVING_VALIDITY,
};
use crate::webhook::tls::seconds_to_expiry;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

/// Renew the serving certificate when less than this is left (a third of its life).
const SERVING_RENEW_BEFORE_SECONDS: f64 = 120.0 * 86400.0;
/// Renew the CA when less than this is left.
const CA_RENEW_BEFORE_SECONDS: f64 = 365.0 * 86400.0;

/// Managing certificates failed.
#[derive(Debug, Error)]
pub enum ManageCertificatesError {
    /// Talking to the apiserver failed.
    #[error("kubernetes api: {0}")]
    Kube(#[from] kube::Error),
    /// Generating certificates failed.
    #[error("{0}")]
    Generate(#[from] super::GenerateCertificatesError),
    /// Writing the TLS files failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// File being written.
        path: String,
        /// I/O error.
        source: std::io::Error,
    },
}

/// Where the certificates live and whom they serve.
#[derive(Clone, Debug)]
pub struct ManagedCertificates {
    /// Operator namespace.
    pub namespace: String,
    /// Secret holding ca.crt, ca.key, tls.crt, tls.key.
    pub secret_name: String,
    /// Service in front of the webhook port (its DNS names go into the certificate).
    pub service_name: String,
    /// ValidatingWebhookConfiguration to keep the caBundle of.
    pub validating_webhook: String,
    /// MutatingWebhookConfiguration to keep the caBundle of.
    pub mutating_webhook: String,
    /// Serving certificate file written for the TLS server.
    pub certificate_path: PathBuf,
    /// Serving key file written for the TLS server.
    pub key_path: PathBuf,
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    secret.data.as_ref()?.get(key).and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
}

impl ManagedCertificates {
    fn dns_names(&self) -> Vec<String> {
        let (service, namespace) = (&self.service_name, &self.namespace);
        vec![
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
            format!("{service}.{namespace}"),
            service.clone(),
        ]
    }

    /// One pass: ensure the Secret, write the files, keep the caBundle trusted.
    pub async fn reconcile(&self, client: &Client) -> Result<(), ManageCertificatesError> {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &self.namespace);
        let secret = match secrets.get_opt(&self.secret_name).await? {
            Some(secret) => self.renew_if_needed(&secrets, secret).await?,
            None => self.create_secret(&secrets).await?,
        };
        let (Some(ca_bundle), Some(certificate), Some(key)) = (
            text(&secret, "ca-bundle.crt").or_else(|| text(&secret, "ca.crt")),
            text(&secret, "tls.crt"),
            text(&secret, "tls.key"),
        ) else {
            return Ok(());
        };
        // caBundle first, files second: the apiserver trusts the CA before we serve a leaf it signed.
        self.ensure_ca_bundle(client, &ca_bundle, &certificate).await?;
        self.write_files(&certificate, &key)
    }

    fn new_secret_data(
        &self,
        ca_certificate: &str,
        ca_key: &str,
        ca_bundle: &str,
    ) -> Result<BTreeMap<String, ByteString>, ManageCertificatesError> {
        let (certificate, key) =
            generate_serving_certificate(ca_certificate, ca_key, &self.dns_names(), &[], SERVING_VALIDITY)?;
        Ok([
            ("ca.crt", ca_certificate.to_string()),
            ("ca.key", ca_key.to_string()),
            ("ca-bundle.crt", ca_bundle.to_string()),
            ("tls.crt", certificate),
            ("tls.key", key),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_string(), ByteString(value.into_bytes())))
        .collect())
    }

    async fn create_secret(&self, secrets: &Api<Secret>) -> Result<Secret, ManageCertificatesError> {
        let (ca_certificate, ca_key) = generate_ca(CA_VALIDITY)?;
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(self.secret_name.clone()),
                labels: Some([("app.kubernetes.io/managed-by".to_string(), "dbservice-operator".to_string())].into()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(self.new_secret_data(&ca_certificate, &ca_key, &ca_certificate)?),
            ..Default::default()
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(created) => {
                tracing::info!(secret = %self.secret_name, "created the webhook certificate Secret");
                Ok(created)
            }
            // Another replica won the race: use its certificates.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(secrets.get(&self.secret_name).await?),
            Err(error) => Err(error.into()),
        }
    }

    async fn renew_if_needed(&self, secrets: &Api<Secret>, secret: Secret) -> Result<Secret, ManageCertificatesError> {
        let (Some(ca_certificate), Some(ca_key)) = (text(&secret, "ca.crt"), text(&secret, "ca.key")) else {
            return self.replace(secrets, secret, None).await;
        };
        let ca_left = seconds_to_expiry(ca_certificate.as_bytes()).unwrap_or(0.0);
        let serving_left = text(&secret, "tls.crt").and_then(|pem| seconds_to_expiry(pem.as_bytes())).unwrap_or(0.0);
        if ca_left < CA_RENEW_BEFORE_SECONDS {
            return self.replace(secrets, secret, Some(ca_certificate)).await;
        }
        if serving_left < SERVING_RENEW_BEFORE_SECONDS {
            let bundle = text(&secret, "ca-bundle.crt").unwrap_or_else(|| ca_certificate.clone());
            let data = self.new_secret_data(&ca_certificate, &ca_key, &bundle)?;
            return self.update(secrets, secret, data).await;
        }
        Ok(secret)
    }

    /// A new CA; the old one stays in the bundle until it expires (overlap).
    async fn replace(
        &self,
        secrets: &Api<Secret>,
        secret: Secret,
        old_ca: Option<String>,
    ) -> Result<Secret, ManageCertificatesError> {
        let (ca_certificate, ca_key) = generate_ca(CA_VALIDITY)?;
        let bundle = match old_ca {
            Some(old) if seconds_to_expiry(old.as_bytes()).unwrap_or(0.0) > 0.0 => format!("{old}{ca_certificate}"),
            _ => ca_certificate.clone(),
        };
        let data = self.new_secret_data(&ca_certificate, &ca_key, &bundle)?;
        self.update(secrets, secret, data).await
    }

    async fn update(
        &self,
        secrets: &Api<Secret>,
        mut secret: Secret,
        data: BTreeMap<String, ByteString>,
    ) -> Result<Secret, ManageCertificatesError> {
        secret.data = Some(data);
        // resourceVersion is kept: if another replica renewed first, we get a 409 and use its result.
        match secrets.replace(&self.secret_name, &PostParams::default(), &secret).await {
            Ok(updated) => {
                tracing::info!(secret = %self.secret_name, "renewed the webhook certificates");
                Ok(updated)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(secrets.get(&self.secret_name).await?),
            Err(error) => Err(error.into()),
        }
    }

    async fn ensure_ca_bundle(
        &self,
        client: &Client,
        ca_bundle: &str,
        certificate: &str,
    ) -> Result<(), ManageCertificatesError> {
        let encoded = ByteString(ca_bundle.as_bytes().to_vec());
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        let bundles = |configuration: ValidatingWebhookConfiguration| {
            configuration
                .webhooks
                .unwrap_or_default()
                .into_iter()
                .map(|webhook| webhook.client_config.ca_bundle)
                .collect()
        };
        repair_ca_bundle(&validating, &self.validating_webhook, bundles, &encoded, certificate).await?;
        let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        let bundles = |configuration: MutatingWebhookConfiguration| {
            configuration
                .webhooks
                .unwrap_or_default()
                .into_iter()
                .map(|webhook| webhook.client_config.ca_bundle)
                .collect()
        };
        repair_ca_bundle(&mutating, &self.mutating_webhook, bundles, &encoded, certificate).await?;
        Ok(())
    }

    fn write_files(&self, certificate: &str, key: &str) -> Result<(), ManageCertificatesError> {
        for (path, content, private) in [(&self.key_path, key, true), (&self.certificate_path, certificate, false)] {
            if std::fs::read(path).ok().as_deref() == Some(content.as_bytes()) {
                continue;
            }
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            write_atomically(path, content.as_bytes(), private)
                .map_err(|source| ManageCertificatesError::Write { path: path.display().to_string(), source })?;
        }
        Ok(())
    }

    /// Runs [`Self::reconcile`] now and then every `interval`, logging failures.
    pub async fn run(self, client: Client, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        loop {
            ticker.tick().await;
            if let Err(error) = self.reconcile(&client).await {
                tracing::warn!(%error, "managing webhook certificates failed; retrying");
            }
        }
    }
}

/// Patches the caBundles of one webhook configuration when they do not trust `certificate`.
async fn repair_ca_bundle<K>(
    api: &Api<K>,
    name: &str,
    bundles: impl FnOnce(K) -> Vec<Option<ByteString>>,
    wanted: &ByteString,
    certificate: &str,
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Some(configuration) = api.get_opt(name).await? else {
        return Ok(());
    };
    if let Some(patch) = ca_bundle_patch(&bundles(configuration), wanted, certificate) {
        api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch)).await?;
        tracing::info!(configuration = %name, "repaired the caBundle of a webhook configuration");
    }
    Ok(())
}

/// A JSONPatch that sets every webhook's caBundle to `wanted`, or None when each already trusts `certificate`.
fn ca_bundle_patch(
    bundles: &[Option<ByteString>],
    wanted: &ByteString,
    certificate: &str,
) -> Option<json_patch::Patch> {
    let stale: Vec<usize> = bundles
        .iter()
        .enumerate()
        .filter(|(_, bundle)| match bundle {
            Some(bundle) => !(bundle_trusts(&bundle.0, certificate.as_bytes()) && bundle.0 == wanted.0),
            None => true,
        })
        .map(|(index, _)| index)
        .collect();
    if stale.is_empty() {
        return None;
    }
    let wanted = String::from_utf8_lossy(&wanted.0).to_string();
    let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, wanted);
    let operations: Vec<serde_json::Value> = stale
        .iter()
        .map(|index| json!({"op": "add", "path": format!("/webhooks/{index}/clientConfig/caBundle"), "value": encoded}))
        .collect();
    serde_json::from_value(serde_json::Value::Array(operations)).ok()
}
