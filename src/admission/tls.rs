//! TLS for the admission server: certificate and key read from files and reloaded when they
//! change on disk. New handshakes get the new certificate; established connections keep theirs,
//! so in-flight requests never fail during a rotation.

use crate::metrics::Metrics;
use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use thiserror::Error;

/// Loading a certificate and key pair failed.
#[derive(Debug, Error)]
pub enum LoadCertificateError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{0} contains no PEM certificate")]
    NoCertificate(PathBuf),
    /// The key file holds no PEM private key.
    #[error("{0} contains no PEM private key")]
    NoKey(PathBuf),
    /// rustls refused the key.
    #[error("unsupported private key in {path}: {source}")]
    Key {
        /// The file.
        path: PathBuf,
        /// The rustls error.
        source: rustls::Error,
    },
}

/// PEM bytes of a certificate chain and its key.
#[derive(Clone, PartialEq, Eq)]
struct PemPair {
    certificate: Vec<u8>,
    key: Vec<u8>,
}

fn read_pair(certificate_path: &Path, key_path: &Path) -> Result<PemPair, LoadCertificateError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| LoadCertificateError::Read { path: path.to_path_buf(), source })
    };
    Ok(PemPair { certificate: read(certificate_path)?, key: read(key_path)? })
}

fn certified_key(
    pair: &PemPair,
    certificate_path: &Path,
    key_path: &Path,
) -> Result<CertifiedKey, LoadCertificateError> {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&pair.certificate).filter_map(Result::ok).collect();
    if chain.is_empty() {
        return Err(LoadCertificateError::NoCertificate(certificate_path.to_path_buf()));
    }
    let key: PrivateKeyDer<'static> =
        PrivateKeyDer::from_pem_slice(&pair.key).map_err(|_| LoadCertificateError::NoKey(key_path.to_path_buf()))?;
    let signing_key = any_supported_type(&key)
        .map_err(|source| LoadCertificateError::Key { path: key_path.to_path_buf(), source })?;
    Ok(CertifiedKey::new(chain, signing_key))
}

/// Seconds until the first certificate of a PEM chain expires (negative when expired).
pub fn seconds_to_expiry(certificate_pem: &[u8]) -> Option<f64> {
    let der = CertificateDer::pem_slice_iter(certificate_pem).next()?.ok()?;
    let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let not_after = parsed.validity().not_after.timestamp();
    Some((not_after - chrono::Utc::now().timestamp()) as f64)
}

/// A certificate resolver whose certificate can be swapped while the server runs.
#[derive(Debug)]
pub struct ReloadingCertificate {
    certificate_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    loaded_pem: RwLock<Vec<u8>>,
}

impl ReloadingCertificate {
    /// Loads the pair once; fails when the files are missing or invalid.
    pub fn load(certificate_path: &Path, key_path: &Path) -> Result<Arc<Self>, LoadCertificateError> {
        let pair = read_pair(certificate_path, key_path)?;
        let key = certified_key(&pair, certificate_path, key_path)?;
        // A key that does not match the certificate would fail every handshake: refuse to start.
        key.keys_match().map_err(|source| LoadCertificateError::Key { path: key_path.to_path_buf(), source })?;
        Ok(Arc::new(Self {
            certificate_path: certificate_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            current: RwLock::new(Arc::new(key)),
            loaded_pem: RwLock::new([pair.certificate, pair.key].concat()),
        }))
    }

    /// Re-reads the files; swaps the certificate when they changed and are valid.
    /// Returns true when a new certificate was installed.
    pub fn reload(&self) -> Result<bool, LoadCertificateError> {
        let pair = read_pair(&self.certificate_path, &self.key_path)?;
        let combined = [pair.certificate.clone(), pair.key.clone()].concat();
        if *self.loaded_pem.read().expect("lock not poisoned") == combined {
            return Ok(false);
        }
        // A writer may have replaced the certificate but not yet the key: the pair is then
        // rejected (the key does not match) and retried on the next tick.
        let key = certified_key(&pair, &self.certificate_path, &self.key_path)?;
        key.keys_match().map_err(|source| LoadCertificateError::Key { path: self.key_path.clone(), source })?;
        *self.current.write().expect("lock not poisoned") = Arc::new(key);
        *self.loaded_pem.write().expect("lock not poisoned") = combined;
        Ok(true)
    }

    /// PEM of the certificate currently served.
    pub fn certificate_pem(&self) -> Vec<u8> {
        std::fs::read(&self.certificate_path).unwrap_or_default()
    }

    /// Polls the files every `interval` and reloads on change, updating the expiry metric.
    pub async fn watch(self: Arc<Self>, interval: Duration, metrics: Arc<Metrics>) {
        let mut ticker = tokio::time::interval(interval);
        loop {
            ticker.tick().await;
            match self.reload() {
                Ok(true) => tracing::info!(path = %self.certificate_path.display(), "reloaded the webhook certificate"),
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "keeping the current webhook certificate"),
            }
            if let Some(seconds) = seconds_to_expiry(&self.certificate_pem()) {
                metrics.certificate_expiry_seconds.set(seconds);
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("lock not poisoned").clone())
    }
}

/// A rustls server configuration: TLS 1.2 and 1.3 only, HTTP/1.1.
pub fn server_config(resolver: Arc<ReloadingCertificate>) -> rustls::ServerConfig {
    let mut config =
        rustls::ServerConfig::builder_with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .with_no_client_auth()
            .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// Installs ring as the process-wide crypto provider (needed once before any TLS use).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
