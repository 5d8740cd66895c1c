//! Self-managed webhook certificates in-cluster: the CA certificate and the serving certificate
//! live in a Secret in the operator's namespace, every replica writes them to its TLS files (the
//! reloader picks them up), and the caBundle of the operator's own webhook configurations is
//! patched with the CA (never the leaf). A timer re-checks that the live caBundle trusts the
//! served certificate, repairs it, and renews before expiry.
//!
//! No CA private key is kept anywhere: each issuance makes a fresh single-use CA, signs the
//! serving certificate and forgets the CA key. Whoever can read the serving Secret can therefore
//! impersonate only this webhook's serving key (which it already has), not mint new certificates
//! the apiserver trusts. A renewal appends the new CA to the caBundle (still-valid old CAs stay,
//! so connections to not-yet-reloaded replicas keep working) before any certificate signed by it
//! is served, so no admission fails during rotation. Secrets written by older versions, which
//! held `ca.key`, are rotated once to drop it.

use crate::admission::tls::seconds_to_expiry;
use crate::certificates::{
    bundle_trusts, generate_ca, generate_serving_certificate, write_atomically, SERVING_VALIDITY,
};
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
/// Validity of a single-use CA: the serving certificate's, plus a day of clock skew.
const MANAGED_CA_VALIDITY: time::Duration = time::Duration::days(SERVING_VALIDITY.whole_days() + 1);
/// Key of the CA private key in Secrets written by older versions; removed on sight.
const LEGACY_CA_KEY: &str = "ca.key";

/// Managing certificates failed.
#[derive(Debug, Error)]
pub enum ManageCertificatesError {
    /// Talking to the apiserver failed.
    #[error("kubernetes api: {0}")]
    Kube(#[from] kube::Error),
    /// Generating certificates failed.
    #[error("{0}")]
    Generate(#[from] crate::certificates::GenerateCertificatesError),
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
    /// Secret holding ca.crt, ca-bundle.crt, tls.crt, tls.key (no CA key).
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

    /// A fresh single-use CA and a serving certificate signed by it; the CA key is dropped here.
    /// The caBundle keeps the still-valid CAs of `previous_bundle` and adds the new one.
    fn new_secret_data(
        &self,
        previous_bundle: Option<&str>,
    ) -> Result<BTreeMap<String, ByteString>, ManageCertificatesError> {
        let (ca_certificate, ca_key) = generate_ca(MANAGED_CA_VALIDITY)?;
        let (certificate, key) =
            generate_serving_certificate(&ca_certificate, &ca_key, &self.dns_names(), &[], SERVING_VALIDITY)?;
        drop(ca_key);
        let mut bundle: String = previous_bundle
            .map(pem_certificates)
            .unwrap_or_default()
            .into_iter()
            .filter(|pem| seconds_to_expiry(pem.as_bytes()).unwrap_or(0.0) > 0.0)
            .collect();
        bundle.push_str(&ca_certificate);
        Ok([("ca.crt", ca_certificate), ("ca-bundle.crt", bundle), ("tls.crt", certificate), ("tls.key", key)]
            .into_iter()
            .map(|(name, value)| (name.to_string(), ByteString(value.into_bytes())))
            .collect())
    }

    async fn create_secret(&self, secrets: &Api<Secret>) -> Result<Secret, ManageCertificatesError> {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(self.secret_name.clone()),
                labels: Some([("app.kubernetes.io/managed-by".to_string(), "dbservice-operator".to_string())].into()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(self.new_secret_data(None)?),
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
        if !needs_renewal(&secret) {
            return Ok(secret);
        }
        let previous_bundle = text(&secret, "ca-bundle.crt").or_else(|| text(&secret, "ca.crt"));
        let data = self.new_secret_data(previous_bundle.as_deref())?;
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

/// Whether the Secret must get new certificates: a legacy CA key at rest, a missing part, or a
/// serving certificate within [`SERVING_RENEW_BEFORE_SECONDS`] of expiry.
fn needs_renewal(secret: &Secret) -> bool {
    let legacy_key = secret.data.as_ref().is_some_and(|data| data.contains_key(LEGACY_CA_KEY));
    let serving_left = text(secret, "tls.crt").and_then(|pem| seconds_to_expiry(pem.as_bytes())).unwrap_or(0.0);
    legacy_key
        || text(secret, "ca.crt").is_none()
        || text(secret, "tls.key").is_none()
        || serving_left < SERVING_RENEW_BEFORE_SECONDS
}

/// The PEM blocks of the certificates in a bundle, each with its BEGIN and END lines.
fn pem_certificates(bundle: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut certificates = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find(BEGIN) {
        let Some(length) = rest[start..].find(END) else {
            break;
        };
        let end = start + length + END.len();
        certificates.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    certificates
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

#[cfg(test)]
mod tests {
    use super::*;

    fn managed() -> ManagedCertificates {
        ManagedCertificates {
            namespace: "operators".into(),
            secret_name: "webhook-tls".into(),
            service_name: "webhook".into(),
            validating_webhook: "v".into(),
            mutating_webhook: "m".into(),
            certificate_path: "/nonexistent/tls.crt".into(),
            key_path: "/nonexistent/tls.key".into(),
        }
    }

    fn secret(data: BTreeMap<String, ByteString>) -> Secret {
        Secret { data: Some(data), ..Default::default() }
    }

    fn string(data: &BTreeMap<String, ByteString>, key: &str) -> String {
        String::from_utf8(data[key].0.clone()).unwrap()
    }

    #[test]
    fn no_ca_private_key_is_kept_and_the_bundle_trusts_the_serving_certificate() {
        let data = managed().new_secret_data(None).unwrap();
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(keys, ["ca-bundle.crt", "ca.crt", "tls.crt", "tls.key"]);
        for (name, value) in &data {
            let text = String::from_utf8(value.0.clone()).unwrap();
            let private_keys = text.matches("PRIVATE KEY-----").count() / 2;
            assert_eq!(private_keys, usize::from(name == "tls.key"), "{name} holds {private_keys} private keys");
        }
        assert!(bundle_trusts(string(&data, "ca-bundle.crt").as_bytes(), string(&data, "tls.crt").as_bytes()));
        assert!(!needs_renewal(&secret(data)), "a fresh Secret needs no renewal");
    }

    #[test]
    fn a_legacy_secret_with_a_ca_key_is_rotated_and_keeps_trusting_the_old_certificate() {
        let mut legacy = managed().new_secret_data(None).unwrap();
        legacy.insert(LEGACY_CA_KEY.into(), ByteString(b"-----BEGIN PRIVATE KEY-----".to_vec()));
        assert!(needs_renewal(&secret(legacy.clone())));
        let old_bundle = string(&legacy, "ca-bundle.crt");
        let renewed = managed().new_secret_data(Some(&old_bundle)).unwrap();
        assert!(!renewed.contains_key(LEGACY_CA_KEY));
        let bundle = string(&renewed, "ca-bundle.crt");
        assert_eq!(pem_certificates(&bundle).len(), 2, "old and new CA during the overlap");
        // Replicas still serving the old certificate stay trusted until they reload.
        assert!(bundle_trusts(bundle.as_bytes(), string(&legacy, "tls.crt").as_bytes()));
        assert!(bundle_trusts(bundle.as_bytes(), string(&renewed, "tls.crt").as_bytes()));
    }

    #[test]
    fn expired_cas_leave_the_bundle() {
        let (expired, _) = generate_ca(time::Duration::hours(-2)).unwrap();
        let data = managed().new_secret_data(Some(&expired)).unwrap();
        assert_eq!(pem_certificates(&string(&data, "ca-bundle.crt")).len(), 1);
    }

    #[test]
    fn a_serving_certificate_near_expiry_needs_renewal() {
        let (ca_certificate, ca_key) = generate_ca(MANAGED_CA_VALIDITY).unwrap();
        let (certificate, key) =
            generate_serving_certificate(&ca_certificate, &ca_key, &["webhook".into()], &[], time::Duration::days(30))
                .unwrap();
        let data = [("ca.crt", ca_certificate), ("tls.crt", certificate), ("tls.key", key)]
            .into_iter()
            .map(|(name, value)| (name.to_string(), ByteString(value.into_bytes())))
            .collect();
        assert!(needs_renewal(&secret(data)));
    }
}
