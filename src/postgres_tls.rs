//! TLS for tokio-postgres clients over the network (the backup Job's connections; tests): rustls,
//! the peer verified against a given CA for the host name connected to, as libpq's
//! `sslmode=verify-full` does. Unix-socket connections need none.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

/// Building the TLS client failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsClientError {
    /// The CA file could not be read.
    #[error("cannot read the CA file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: io::Error,
    },
    /// The CA file holds no certificate rustls accepts.
    #[error("the CA file {0} holds no usable certificate")]
    NoCertificate(String),
}

/// A tokio-postgres TLS connector that trusts only the CAs of one PEM file.
#[derive(Clone)]
pub struct VerifyFull {
    config: Arc<rustls::ClientConfig>,
}

impl VerifyFull {
    /// Trusts the certificates in the PEM file `authority`.
    pub fn from_file(authority: &Path) -> Result<Self, TlsClientError> {
        let pem = std::fs::read(authority)
            .map_err(|source| TlsClientError::Read { path: authority.display().to_string(), source })?;
        Self::from_pem(&pem).ok_or_else(|| TlsClientError::NoCertificate(authority.display().to_string()))
    }

    /// Trusts the certificates in `pem`; None when there is none.
    pub fn from_pem(pem: &[u8]) -> Option<Self> {
        Some(Self { config: Arc::new(verifying_client_config(pem)?) })
    }
}

/// A rustls client configuration that trusts only the CAs in `pem` (no system roots, no client
/// certificate); None when `pem` holds no certificate.
pub fn verifying_client_config(pem: &[u8]) -> Option<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(CertificateDer::pem_slice_iter(pem).filter_map(Result::ok));
    if added == 0 {
        return None;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Some(config)
}

impl<S> MakeTlsConnect<S> for VerifyFull
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = VerifiedStream<S>;
    type TlsConnect = VerifyHost;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<VerifyHost, Self::Error> {
        let name = ServerName::try_from(domain.to_string())?;
        Ok(VerifyHost { connector: tokio_rustls::TlsConnector::from(self.config.clone()), name })
    }
}

/// One connection's handshake, for one host name.
pub struct VerifyHost {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for VerifyHost
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = VerifiedStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<VerifiedStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move { Ok(VerifiedStream(self.connector.connect(self.name, stream).await?)) })
    }
}

/// A TLS stream whose peer was verified.
pub struct VerifiedStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for VerifiedStream<S> {
    fn poll_read(self: Pin<&mut Self>, context: &mut Context<'_>, buffer: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(context, buffer)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for VerifiedStream<S> {
    fn poll_write(self: Pin<&mut Self>, context: &mut Context<'_>, buffer: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(context, buffer)
    }
    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(context)
    }
    fn poll_shutdown(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(context)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for VerifiedStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM without channel binding (scram-sha-256, not -PLUS): the server does not require it.
        ChannelBinding::none()
    }
}

/// Connects with `config`: verify-full TLS when `authority` names a CA file and the host is on
/// the network, else plain (a unix socket; a local server without TLS, as in the loopback tests).
/// The connection is driven by a task.
pub async fn connect(
    config: &tokio_postgres::Config,
    authority: Option<&Path>,
) -> Result<tokio_postgres::Client, ConnectError> {
    let over_network = config.get_hosts().iter().any(|host| matches!(host, tokio_postgres::config::Host::Tcp(_)));
    match authority.filter(|_| over_network) {
        Some(authority) => {
            let mut config = config.clone();
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
            let (client, connection) = config.connect(VerifyFull::from_file(authority)?).await?;
            tokio::spawn(connection);
            Ok(client)
        }
        None => {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            Ok(client)
        }
    }
}

/// Connecting failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The CA could not be loaded.
    #[error("{0}")]
    Tls(#[from] TlsClientError),
    /// The server refused, or could not be reached.
    #[error("{0}")]
    Postgres(#[from] tokio_postgres::Error),
}

/// The search_path of every privileged session (issue 37, CVE-2018-1058): `pg_temp` last, so
/// that temporary objects cannot shadow either. See `instance::session`.
pub const SEARCH_PATH: &str = "pg_catalog,pg_temp";

/// The search_path alone: `PGOPTIONS` of a tool the agent runs that does not pin its own (psql
/// does not; pg_dump, pg_dumpall, pg_restore, pg_upgrade, pg_rewind and vacuumdb do), and the
/// backup job's session. No timeouts: those runs are bounded by their caller, and a restore or a
/// backup's wait for WAL may take long.
pub fn tool_options() -> String {
    format!("-c search_path={SEARCH_PATH}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_certificates_is_refused_with_its_name() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("ca.crt");
        std::fs::write(&path, "not pem").unwrap();
        let error = VerifyFull::from_file(&path).err().unwrap().to_string();
        assert!(error.contains("holds no usable certificate") && error.contains("ca.crt"), "{error}");
        let missing = VerifyFull::from_file(&directory.path().join("absent")).err().unwrap().to_string();
        assert!(missing.starts_with("cannot read the CA file"), "{missing}");
    }

    #[test]
    fn a_ca_certificate_is_accepted() {
        let (certificate, _) = crate::certificates::generate_ca_named("test", time::Duration::days(1)).unwrap();
        assert!(VerifyFull::from_pem(certificate.as_bytes()).is_some());
    }
}
