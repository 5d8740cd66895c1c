//! TLS of the instance's PostgreSQL: the server settings (given on the command line, so that no
//! `ALTER SYSTEM` can turn them off), the pg_hba.conf block that rejects every connection not
//! over TLS, the client settings of this instance's own libpq connections (clone, rewind, WAL
//! receiver: `verify-full` against the database's CA), and the reload when the kubelet swaps in
//! a renewed certificate.

use crate::instance::hba::{joined, without_block};
use crate::instance::InstanceConfig;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// The server certificate files, as the pod mounts the certificate Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// Directory holding tls.crt, tls.key and ca.crt.
    pub directory: PathBuf,
}

impl TlsFiles {
    /// The server's certificate.
    pub fn certificate(&self) -> PathBuf {
        self.directory.join("tls.crt")
    }
    /// The server's private key.
    pub fn key(&self) -> PathBuf {
        self.directory.join("tls.key")
    }
    /// The CA every peer is verified by.
    pub fn authority(&self) -> PathBuf {
        self.directory.join("ca.crt")
    }
}

/// Server settings for `postgres -c`: TLS on, 1.2 at least.
pub fn server_settings(files: &TlsFiles) -> Vec<(String, String)> {
    vec![
        ("ssl".into(), "on".into()),
        ("ssl_cert_file".into(), files.certificate().display().to_string()),
        ("ssl_key_file".into(), files.key().display().to_string()),
        ("ssl_ca_file".into(), files.authority().display().to_string()),
        ("ssl_min_protocol_version".into(), "TLSv1.2".into()),
    ]
}

/// The conninfo part of this instance's connections to its peers: the peer's certificate must
/// be the database CA's and name the host.
pub fn client_conninfo(files: &TlsFiles) -> String {
    format!(
        "sslmode=verify-full sslrootcert='{}'",
        files.authority().display().to_string().replace('\\', "\\\\").replace('\'', "\\'")
    )
}

const HBA_BEGIN: &str = "# BEGIN dbservice-operator tls";
const HBA_END: &str = "# END dbservice-operator tls";

/// `hba` with the TLS block first (every network connection without TLS rejected, replication
/// included; after the superuser block when that leads, so that both rewrites are stable), or
/// without it when `tls` is false; idempotent.
pub fn with_transport_rule(hba: &str, tls: bool) -> String {
    use crate::instance::roles::{HBA_BEGIN as SUPERUSER_BEGIN, HBA_END as SUPERUSER_END};
    let mut kept = without_block(hba, HBA_BEGIN, HBA_END);
    let position = match kept.first() {
        Some(&SUPERUSER_BEGIN) => kept.iter().position(|line| *line == SUPERUSER_END).map_or(0, |end| end + 1),
        _ => 0,
    };
    let block = [HBA_BEGIN, "hostnossl\tall\tall\tall\treject", "hostnossl\treplication\tall\tall\treject", HBA_END];
    if tls {
        kept.splice(position..position, block);
    }
    joined(&kept)
}

/// Writes the TLS block into the data directory's pg_hba.conf (before every start: a clone or
/// a rewind copies the source's file, and a database made before TLS has none).
pub fn write_transport_rule(config: &InstanceConfig) -> std::io::Result<()> {
    crate::instance::hba::rewrite(config, |hba| with_transport_rule(hba, config.tls.is_some()))
}

/// Notices when the certificate files change (the kubelet swaps a renewed Secret in atomically).
#[derive(Debug, Default)]
pub struct CertificateWatch {
    loaded: Option<u64>,
}

fn fingerprint(paths: &[&Path]) -> Option<u64> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for path in paths {
        std::fs::read(path).ok()?.hash(&mut hasher);
    }
    Some(hasher.finish())
}

impl CertificateWatch {
    /// Remembers the files as the server loads them now (at its start).
    pub fn loaded(&mut self, files: &TlsFiles) {
        self.loaded = fingerprint(&[&files.certificate(), &files.key(), &files.authority()]);
    }

    /// Whether the files differ from what the server loaded; remembers them as loaded (the caller
    /// reloads the server). Unreadable files change nothing.
    pub fn changed(&mut self, files: &TlsFiles) -> bool {
        let now = fingerprint(&[&files.certificate(), &files.key(), &files.authority()]);
        if now.is_none() || now == self.loaded {
            return false;
        }
        self.loaded = now;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HBA: &str = "local all all trust\nhost all all all scram-sha-256\n";

    #[test]
    fn connections_without_tls_are_rejected_before_any_other_rule() {
        let hba = with_transport_rule(HBA, true);
        let lines: Vec<&str> = hba.lines().collect();
        assert_eq!(lines[1], "hostnossl\tall\tall\tall\treject");
        assert_eq!(lines[2], "hostnossl\treplication\tall\tall\treject");
        assert!(hba.ends_with(HBA), "{hba}");
        assert_eq!(with_transport_rule(&hba, true), hba, "idempotent");
        assert_eq!(with_transport_rule(&hba, false), HBA);
    }

    #[test]
    fn the_superuser_and_tls_rewrites_leave_each_other_alone() {
        let superuser_first = crate::instance::roles::with_superuser_rule(HBA, "postgres", false);
        let both = with_transport_rule(&superuser_first, true);
        assert!(both.starts_with(crate::instance::roles::HBA_BEGIN), "{both}");
        assert_eq!(crate::instance::roles::with_superuser_rule(&both, "postgres", false), both);
        assert_eq!(with_transport_rule(&both, true), both);
    }

    #[test]
    fn settings_name_the_mounted_files() {
        let files = TlsFiles { directory: "/dbservice/tls".into() };
        let settings = server_settings(&files);
        assert!(settings.contains(&("ssl".into(), "on".into())));
        assert!(settings.contains(&("ssl_key_file".into(), "/dbservice/tls/tls.key".into())));
        assert_eq!(client_conninfo(&files), "sslmode=verify-full sslrootcert='/dbservice/tls/ca.crt'");
    }

    #[test]
    fn a_swapped_certificate_is_noticed_once() {
        let directory = tempfile::tempdir().unwrap();
        let files = TlsFiles { directory: directory.path().into() };
        for name in ["tls.crt", "tls.key", "ca.crt"] {
            std::fs::write(directory.path().join(name), "one").unwrap();
        }
        let mut watch = CertificateWatch::default();
        watch.loaded(&files);
        assert!(!watch.changed(&files));
        std::fs::write(files.certificate(), "two").unwrap();
        assert!(watch.changed(&files));
        assert!(!watch.changed(&files));
        std::fs::remove_file(files.key()).unwrap();
        assert!(!watch.changed(&files), "unreadable files change nothing");
    }
}
