//! Certificates for the admission server, made with rcgen: a CA and a serving certificate
//! signed by it. `admission::certificates` keeps them in a Secret and the caBundle in sync in-cluster.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::net::IpAddr;
use std::path::Path;
use thiserror::Error;
use time::{Duration, OffsetDateTime};

/// Validity of a generated CA.
pub const CA_VALIDITY: Duration = Duration::days(3650);
/// Validity of a generated serving certificate.
pub const SERVING_VALIDITY: Duration = Duration::days(365);

/// Generating or writing certificates failed.
#[derive(Debug, Error)]
pub enum GenerateCertificatesError {
    /// rcgen refused the parameters.
    #[error("cannot generate certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// The output could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// File being written.
        path: String,
        /// I/O error.
        source: std::io::Error,
    },
}

/// A CA and a serving certificate signed by it, all PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateBundle {
    /// CA certificate (what goes into a webhook's caBundle).
    pub ca_certificate: String,
    /// CA private key (needed to renew the serving certificate with the same CA).
    pub ca_key: String,
    /// Serving certificate.
    pub certificate: String,
    /// Serving private key.
    pub key: String,
}

/// A new CA valid for `validity` (the webhook's).
pub fn generate_ca(validity: Duration) -> Result<(String, String), GenerateCertificatesError> {
    generate_ca_named("dbservice-operator webhook CA", validity)
}

/// A new CA named `common_name`, valid for `validity`: (certificate, key), PEM.
pub fn generate_ca_named(common_name: &str, validity: Duration) -> Result<(String, String), GenerateCertificatesError> {
    let key = KeyPair::generate()?;
    let params = ca_params(common_name, validity)?;
    let certificate = params.self_signed(&key)?;
    Ok((certificate.pem(), key.serialize_pem()))
}

/// The notAfter of the first certificate in `pem`, RFC 3339.
pub fn not_after(pem: &str) -> Option<String> {
    let der = CertificateDer::pem_slice_iter(pem.as_bytes()).next()?.ok()?;
    let (_, certificate) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let timestamp = certificate.validity().not_after.timestamp();
    Some(chrono::DateTime::from_timestamp(timestamp, 0)?.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

fn ca_params(common_name: &str, validity: Duration) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_before = OffsetDateTime::now_utc() - Duration::hours(1);
    params.not_after = OffsetDateTime::now_utc() + validity;
    Ok(params)
}

/// A serving certificate for the given names, signed by the CA.
pub fn generate_serving_certificate(
    ca_certificate: &str,
    ca_key: &str,
    dns_names: &[String],
    ip_addresses: &[IpAddr],
    validity: Duration,
) -> Result<(String, String), GenerateCertificatesError> {
    let ca_key_pair = KeyPair::from_pem(ca_key)?;
    let issuer = Issuer::from_ca_cert_pem(ca_certificate, ca_key_pair)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(dns_names.to_vec())?;
    params.subject_alt_names.extend(ip_addresses.iter().map(|ip| SanType::IpAddress(*ip)));
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, dns_names.first().cloned().unwrap_or_else(|| "dbservice-operator".into()));
    params.distinguished_name = name;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = OffsetDateTime::now_utc() - Duration::hours(1);
    params.not_after = OffsetDateTime::now_utc() + validity;
    let certificate = params.signed_by(&key, &issuer)?;
    Ok((certificate.pem(), key.serialize_pem()))
}

/// A fresh CA and a serving certificate for the given names.
pub fn generate_bundle(
    dns_names: &[String],
    ip_addresses: &[IpAddr],
) -> Result<CertificateBundle, GenerateCertificatesError> {
    let (ca_certificate, ca_key) = generate_ca(CA_VALIDITY)?;
    let (certificate, key) =
        generate_serving_certificate(&ca_certificate, &ca_key, dns_names, ip_addresses, SERVING_VALIDITY)?;
    Ok(CertificateBundle { ca_certificate, ca_key, certificate, key })
}

/// Writes ca.crt, tls.crt and tls.key (the key readable by the owner only) into `directory`.
pub fn write_bundle(bundle: &CertificateBundle, directory: &Path) -> Result<(), GenerateCertificatesError> {
    let write_error =
        |path: &Path, source| GenerateCertificatesError::Write { path: path.display().to_string(), source };
    std::fs::create_dir_all(directory).map_err(|source| write_error(directory, source))?;
    for (name, content, private) in [
        ("ca.crt", &bundle.ca_certificate, false),
        ("tls.crt", &bundle.certificate, false),
        ("tls.key", &bundle.key, true),
    ] {
        let path = directory.join(name);
        write_atomically(&path, content.as_bytes(), private).map_err(|source| write_error(&path, source))?;
    }
    Ok(())
}

/// Writes through a temporary file and a rename, so a reader never sees half a file.
pub fn write_atomically(path: &Path, content: &[u8], private: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    // One temporary name per file (tls.key.tmp, not tls.tmp), so a key never lands in a
    // leftover file of the certificate; the mode is set explicitly because `mode` only
    // applies when the file is created.
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = std::path::PathBuf::from(temporary);
    let mode = if private { 0o600 } else { 0o644 };
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&temporary)?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.write_all(content)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

/// Whether `certificate` was signed by one of the CAs in the PEM `bundle`.
pub fn bundle_trusts(bundle: &[u8], certificate: &[u8]) -> bool {
    let Some(Ok(leaf_der)) = CertificateDer::pem_slice_iter(certificate).next() else {
        return false;
    };
    let Ok((_, leaf)) = x509_parser::parse_x509_certificate(leaf_der.as_ref()) else {
        return false;
    };
    CertificateDer::pem_slice_iter(bundle).filter_map(Result::ok).any(|ca_der| {
        x509_parser::parse_x509_certificate(ca_der.as_ref())
            .map(|(_, ca)| leaf.verify_signature(Some(ca.public_key())).is_ok() && ca.validity().is_valid())
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_certificate_is_trusted_by_its_ca_only() {
        let bundle = generate_bundle(&["webhook.example".into()], &["127.0.0.1".parse().unwrap()]).unwrap();
        assert!(bundle_trusts(bundle.ca_certificate.as_bytes(), bundle.certificate.as_bytes()));
        let other = generate_bundle(&["other".into()], &[]).unwrap();
        assert!(!bundle_trusts(other.ca_certificate.as_bytes(), bundle.certificate.as_bytes()));
        let both = format!("{}{}", other.ca_certificate, bundle.ca_certificate);
        assert!(bundle_trusts(both.as_bytes(), bundle.certificate.as_bytes()));
    }

    #[test]
    fn not_after_reads_the_certificates_expiry() {
        let (certificate, _) = generate_ca_named("test CA", Duration::days(10)).unwrap();
        let expires = chrono::DateTime::parse_from_rfc3339(&not_after(&certificate).unwrap()).unwrap();
        let days = (expires.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_days();
        assert!((9..=10).contains(&days), "{days}");
        assert_eq!(not_after("not a certificate"), None);
    }
}
