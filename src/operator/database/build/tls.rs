//! Build (pure): the database's certificate authority (a Secret the operator keeps, a ConfigMap
//! the applications mount), the server certificate Secret the pods serve, and the names the
//! certificate must cover. Generating keys is the caller's part (`operator::database::certificates`).

use crate::api::database_service::DatabaseService;
use crate::api::names::ChildNames;
use crate::operator::database::build::metadata;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::ByteString;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// Annotation of the server certificate Secret and the CA ConfigMap: the uid of the CA Secret
/// that signed (or published) them, so that a replaced CA is noticed.
pub const AUTHORITY_ANNOTATION: &str = "dbservice.dev/certificate-authority";
/// Annotation of the server certificate Secret: its notAfter (RFC 3339), so that renewal is
/// decided from the cached metadata without reading the Secret.
pub const NOT_AFTER_ANNOTATION: &str = "dbservice.dev/certificate-not-after";
/// Key of ConfigMap NAME-ca that holds the CA's certificate.
pub const CA_CONFIG_MAP_KEY: &str = "ca.crt";
/// Annotation of the server certificate Secret: the names it covers, comma-separated.
pub const NAMES_ANNOTATION: &str = "dbservice.dev/certificate-names";

/// The DNS names the server certificate covers: the primary and standby Services (and the
/// pooler's, with `spec.pooler`) and every instance through the headless Service, short and fully
/// qualified (clients resolve any).
pub fn server_names(database: &DatabaseService, cluster_domain: &str) -> Vec<String> {
    let name = database.name_any();
    let namespace = database.namespace().unwrap_or_default();
    let mut names = Vec::new();
    let mut services = vec![name.clone(), ChildNames::replicas_service(&name)];
    // The pooler serves the same certificate to its clients.
    if database.spec.pooler.is_some() {
        services.extend([ChildNames::pooler(&name), ChildNames::pooler_replicas_service(&name)]);
    }
    for service in services {
        names.push(service.clone());
        names.push(format!("{service}.{namespace}"));
        names.push(format!("{service}.{namespace}.svc"));
        names.push(format!("{service}.{namespace}.svc.{cluster_domain}"));
    }
    let headless = ChildNames::headless_service(&name);
    names.push(format!("*.{headless}.{namespace}.svc"));
    names.push(format!("*.{headless}.{namespace}.svc.{cluster_domain}"));
    names
}

fn secret_data(entries: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
    entries.iter().map(|(key, value)| (key.to_string(), ByteString(value.as_bytes().to_vec()))).collect()
}

/// Secret NAME-ca: the CA's certificate and private key (never mounted anywhere).
pub fn authority_secret(database: &DatabaseService, certificate: &str, key: &str) -> Secret {
    Secret {
        metadata: metadata(database, ChildNames::certificate_authority(&database.name_any())),
        type_: Some("Opaque".into()),
        data: Some(secret_data(&[("ca.crt", certificate), ("ca.key", key)])),
        ..Default::default()
    }
}

/// ConfigMap NAME-ca: the CA's certificate, what an application mounts to verify the server
/// (`sslmode=verify-full sslrootcert=.../ca.crt`).
pub fn authority_config_map(database: &DatabaseService, authority_uid: &str, certificate: &str) -> ConfigMap {
    let mut metadata = metadata(database, ChildNames::certificate_authority(&database.name_any()));
    metadata.annotations = Some([(AUTHORITY_ANNOTATION.to_string(), authority_uid.to_string())].into());
    ConfigMap {
        metadata,
        data: Some([(CA_CONFIG_MAP_KEY.to_string(), certificate.to_string())].into()),
        ..Default::default()
    }
}

/// A server certificate and what it was made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerCertificate {
    /// Certificate (PEM).
    pub certificate: String,
    /// Private key (PEM).
    pub key: String,
    /// The signing CA's certificate (PEM).
    pub authority_certificate: String,
    /// The uid of the CA Secret.
    pub authority_uid: String,
    /// notAfter, RFC 3339.
    pub not_after: String,
    /// The names it covers.
    pub names: Vec<String>,
}

/// Secret NAME-tls (kubernetes.io/tls), annotated with what renewal is decided by.
pub fn server_certificate_secret(database: &DatabaseService, server: &ServerCertificate) -> Secret {
    let mut metadata = metadata(database, ChildNames::server_certificate(&database.name_any()));
    metadata.annotations = Some(
        [
            (AUTHORITY_ANNOTATION.to_string(), server.authority_uid.clone()),
            (NOT_AFTER_ANNOTATION.to_string(), server.not_after.clone()),
            (NAMES_ANNOTATION.to_string(), server.names.join(",")),
        ]
        .into(),
    );
    Secret {
        metadata,
        type_: Some("kubernetes.io/tls".into()),
        data: Some(secret_data(&[
            ("tls.crt", &server.certificate),
            ("tls.key", &server.key),
            ("ca.crt", &server.authority_certificate),
        ])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database() -> DatabaseService {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
            "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"},
            "spec": {"version": "16", "storageSize": "1Gi", "databaseName": "app", "username": "app_user"}
        }))
        .unwrap()
    }

    #[test]
    fn the_certificate_covers_both_services_and_every_instance() {
        let names = server_names(&database(), "cluster.local");
        for expected in [
            "orders",
            "orders.shop.svc",
            "orders.shop.svc.cluster.local",
            "orders-replicas.shop",
            "*.orders-headless.shop.svc",
            "*.orders-headless.shop.svc.cluster.local",
        ] {
            assert!(names.iter().any(|name| name == expected), "{expected} missing from {names:?}");
        }
    }

    #[test]
    fn the_server_secret_is_a_tls_secret_annotated_for_renewal() {
        let server = ServerCertificate {
            certificate: "CERT".into(),
            key: "KEY".into(),
            authority_certificate: "CA".into(),
            authority_uid: "ca-uid".into(),
            not_after: "2027-03-01T00:00:00Z".into(),
            names: vec!["a".into(), "b".into()],
        };
        let secret = server_certificate_secret(&database(), &server);
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(secret.metadata.name.as_deref(), Some("orders-tls"));
        let data = secret.data.unwrap();
        assert_eq!(data.keys().collect::<Vec<_>>(), ["ca.crt", "tls.crt", "tls.key"]);
        let annotations = secret.metadata.annotations.unwrap();
        assert_eq!(annotations[NAMES_ANNOTATION], "a,b");
        assert_eq!(annotations[AUTHORITY_ANNOTATION], "ca-uid");
        assert_eq!(annotations[NOT_AFTER_ANNOTATION], "2027-03-01T00:00:00Z");
        // Owned by the database: not user data, it goes with it.
        assert_eq!(secret.metadata.owner_references.unwrap()[0].uid, "u-1");
    }

    #[test]
    fn the_published_authority_holds_only_the_certificate() {
        let config_map = authority_config_map(&database(), "ca-uid", "CA");
        assert_eq!(config_map.metadata.name.as_deref(), Some("orders-ca"));
        assert_eq!(config_map.data.unwrap().keys().collect::<Vec<_>>(), ["ca.crt"]);
        let secret = authority_secret(&database(), "CA", "CAKEY");
        assert_eq!(secret.metadata.name.as_deref(), Some("orders-ca"));
    }
}
