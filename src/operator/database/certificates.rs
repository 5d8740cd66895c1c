//! The database's TLS certificates: decide (pure, from cached metadata) whether the CA must be
//! made, the server certificate issued or renewed, the CA published; then do it (the CA Secret
//! is read only then, to sign). With `spec.tls.serverCertificateSecret` the user's Secret is
//! served and nothing is issued.

use crate::api::database_service::DatabaseService;
use crate::api::database_service::FIELD_MANAGER;
use crate::api::names::ChildNames;
use crate::certificates::{generate_ca_named, generate_serving_certificate, not_after, GenerateCertificatesError};
use crate::operator::caches::Compact;
use crate::operator::context::PassContext;
use crate::operator::database::build::tls::{
    authority_config_map, authority_secret, server_certificate_secret, server_names, ServerCertificate,
    AUTHORITY_ANNOTATION, NAMES_ANNOTATION, NOT_AFTER_ANNOTATION,
};
use crate::operator::server_side_apply;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::PostParams;
use kube::core::PartialObjectMeta;
use kube::{Api, ResourceExt};
use std::sync::Arc;

/// The cluster's DNS domain, in the fully qualified names the certificate covers.
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// Validity of the database's CA.
pub const AUTHORITY_VALIDITY_DAYS: i64 = 3650;
/// Validity of a server certificate.
pub const SERVER_VALIDITY_DAYS: i64 = 90;
/// A server certificate is renewed when it expires within this many days.
pub const RENEW_BEFORE_DAYS: i64 = 30;

/// Why a server certificate is issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IssueReason {
    /// There is none (a new database, or the Secret was deleted: the way to rotate by hand).
    Missing,
    /// It expires within [`RENEW_BEFORE_DAYS`].
    Expiring,
    /// Signed by another CA than the one in NAME-ca.
    AuthorityChanged,
    /// It does not cover the names the database has now.
    NamesChanged,
}

impl IssueReason {
    /// Lowercase, for events and the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            IssueReason::Missing => "missing",
            IssueReason::Expiring => "expiring",
            IssueReason::AuthorityChanged => "signed by another authority",
            IssueReason::NamesChanged => "names changed",
        }
    }
}

/// What to do about certificates in this pass (all false/None: nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertificateWork {
    /// Make the CA (there is no NAME-ca Secret).
    pub create_authority: bool,
    /// Issue the server certificate.
    pub issue_server: Option<IssueReason>,
    /// Write the ConfigMap NAME-ca with the CA's certificate.
    pub publish_authority: bool,
}

impl CertificateWork {
    /// Whether anything is to be written.
    pub fn is_empty(&self) -> bool {
        *self == CertificateWork::default()
    }
}

/// What the caches show of the certificates.
#[derive(Clone, Copy, Debug, Default)]
pub struct ObservedCertificates<'a> {
    /// Secret NAME-ca (metadata).
    pub authority: Option<&'a PartialObjectMeta<Secret>>,
    /// Secret NAME-tls (metadata).
    pub server: Option<&'a PartialObjectMeta<Secret>>,
    /// ConfigMap NAME-ca.
    pub published: Option<&'a Compact<ConfigMap>>,
}

/// Decides from the cached metadata alone; `now` judges expiry.
pub fn decide_certificates(
    database: &DatabaseService,
    observed: ObservedCertificates<'_>,
    now: DateTime<Utc>,
) -> CertificateWork {
    if database.spec.user_server_certificate().is_some() {
        return CertificateWork::default();
    }
    let Some(authority_uid) = observed.authority.and_then(|authority| authority.metadata.uid.as_deref()) else {
        return CertificateWork {
            create_authority: true,
            issue_server: Some(IssueReason::Missing),
            publish_authority: true,
        };
    };
    let issue_server = match observed.server {
        None => Some(IssueReason::Missing),
        Some(server) => {
            let annotation = |key: &str| server.metadata.annotations.as_ref().and_then(|map| map.get(key)).cloned();
            let expires = annotation(NOT_AFTER_ANNOTATION).and_then(|text| DateTime::parse_from_rfc3339(&text).ok());
            let names = server_names(database, CLUSTER_DOMAIN).join(",");
            if annotation(AUTHORITY_ANNOTATION).as_deref() != Some(authority_uid) {
                Some(IssueReason::AuthorityChanged)
            } else if expires.is_none_or(|expires| expires < now + chrono::Duration::days(RENEW_BEFORE_DAYS)) {
                Some(IssueReason::Expiring)
            } else if annotation(NAMES_ANNOTATION) != Some(names) {
                Some(IssueReason::NamesChanged)
            } else {
                None
            }
        }
    };
    let published_by = observed
        .published
        .and_then(|published| published.expand())
        .and_then(|config_map| config_map.annotations().get(AUTHORITY_ANNOTATION).cloned());
    CertificateWork {
        create_authority: false,
        issue_server,
        publish_authority: published_by.as_deref() != Some(authority_uid),
    }
}

/// Making or writing a certificate failed.
#[derive(Debug, thiserror::Error)]
pub enum IssueCertificateError {
    /// Key or certificate generation failed.
    #[error("generate: {0}")]
    Generate(#[from] GenerateCertificatesError),
    /// The CA Secret lacks ca.crt or ca.key, or they are not PEM text.
    #[error("secret {0} holds no usable ca.crt and ca.key")]
    UnusableAuthority(String),
    /// The CA Secret's name is taken by a Secret that is not ours.
    #[error("secret {0} exists and is not this database's")]
    AuthorityTaken(String),
    /// A request to the apiserver failed.
    #[error("{0}")]
    Api(#[from] kube::Error),
}

impl From<IssueCertificateError> for kube::Error {
    fn from(error: IssueCertificateError) -> Self {
        match error {
            IssueCertificateError::Api(error) => error,
            other => kube::Error::Service(Box::new(other)),
        }
    }
}

/// The CA: certificate, key and the uid of its Secret.
struct Authority {
    certificate: String,
    key: String,
    uid: String,
}

/// Does `work`; returns what was issued (for the event), None when nothing was.
pub async fn apply_certificates(
    database: &DatabaseService,
    work: &CertificateWork,
    context: &PassContext,
    key: &str,
) -> Result<Option<String>, IssueCertificateError> {
    if work.is_empty() {
        return Ok(None);
    }
    let namespace = database.namespace().unwrap_or_default();
    let name = database.name_any();
    let secrets: Api<Secret> = Api::namespaced(context.shared.client.clone(), &namespace);
    let authority = match work.create_authority {
        true => create_authority(database, &secrets, context, key).await?,
        false => read_authority(&secrets, &ChildNames::certificate_authority(&name)).await?,
    };
    let metrics = &context.shared.metrics;
    if work.publish_authority {
        let config_map = authority_config_map(database, &authority.uid, &authority.certificate);
        let config_maps: Api<ConfigMap> = Api::namespaced(context.shared.client.clone(), &namespace);
        let written = server_side_apply::apply(&config_maps, &config_map).await?;
        metrics.count_write("ConfigMap", "apply");
        context.expectations.expect(key, "ConfigMap", &config_map.name_any(), written.resource_version());
    }
    let Some(reason) = work.issue_server else { return Ok(None) };
    let names = server_names(database, CLUSTER_DOMAIN);
    let validity = time::Duration::days(SERVER_VALIDITY_DAYS);
    let (certificate, server_key) =
        generate_serving_certificate(&authority.certificate, &authority.key, &names, &[], validity)?;
    let expires = not_after(&certificate).unwrap_or_default();
    let server = ServerCertificate {
        certificate,
        key: server_key,
        authority_certificate: authority.certificate,
        authority_uid: authority.uid,
        not_after: expires.clone(),
        names,
    };
    let secret = server_certificate_secret(database, &server);
    let written = server_side_apply::apply(&secrets, &secret).await?;
    metrics.count_write("Secret", "apply");
    context.expectations.expect(key, "Secret", &secret.name_any(), written.resource_version());
    Ok(Some(format!(
        "server certificate Secret {} issued ({}), valid until {expires}",
        secret.name_any(),
        reason.as_str()
    )))
}

async fn create_authority(
    database: &DatabaseService,
    secrets: &Api<Secret>,
    context: &PassContext,
    key: &str,
) -> Result<Authority, IssueCertificateError> {
    let name = database.name_any();
    let common_name = format!("dbservice-operator {}/{name} CA", database.namespace().unwrap_or_default());
    let (certificate, ca_key) = generate_ca_named(&common_name, time::Duration::days(AUTHORITY_VALIDITY_DAYS))?;
    let secret = authority_secret(database, &certificate, &ca_key);
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    match secrets.create(&params, &secret).await {
        Ok(created) => {
            context.shared.metrics.count_write("Secret", "create");
            context.expectations.expect(key, "Secret", &secret.name_any(), created.resource_version());
            Ok(Authority { certificate, key: ca_key, uid: created.uid().unwrap_or_default() })
        }
        // Made by an earlier pass and not cached yet (or someone else's): use it if it is ours.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = secrets.get(&secret.name_any()).await?;
            if !crate::api::names::is_labelled_child_of(&existing, &name) {
                return Err(IssueCertificateError::AuthorityTaken(secret.name_any()));
            }
            authority_of(&existing)
        }
        Err(error) => Err(error.into()),
    }
}

async fn read_authority(secrets: &Api<Secret>, name: &str) -> Result<Authority, IssueCertificateError> {
    authority_of(&secrets.get(name).await?)
}

fn authority_of(secret: &Secret) -> Result<Authority, IssueCertificateError> {
    let text = |key: &str| secret.data.as_ref()?.get(key).and_then(|value| String::from_utf8(value.0.clone()).ok());
    match (text("ca.crt"), text("ca.key")) {
        (Some(certificate), Some(key)) => Ok(Authority { certificate, key, uid: secret.uid().unwrap_or_default() }),
        _ => Err(IssueCertificateError::UnusableAuthority(secret.name_any())),
    }
}

/// Observed certificate children, as [`decide_certificates`] reads them.
pub fn observed_certificates<'a>(
    authority: Option<&'a Arc<PartialObjectMeta<Secret>>>,
    server: Option<&'a Arc<PartialObjectMeta<Secret>>>,
    published: Option<&'a Arc<Compact<ConfigMap>>>,
) -> ObservedCertificates<'a> {
    ObservedCertificates {
        authority: authority.map(AsRef::as_ref),
        server: server.map(AsRef::as_ref),
        published: published.map(AsRef::as_ref),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn database(extra: serde_json::Value) -> DatabaseService {
        crate::operator::database::build::test_database(extra)
    }

    fn secret_meta(uid: &str, annotations: &[(&str, String)]) -> PartialObjectMeta<Secret> {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                annotations: Some(annotations.iter().map(|(key, value)| (key.to_string(), value.clone())).collect()),
                ..Default::default()
            },
            _phantom: Default::default(),
        }
    }

    fn now() -> DateTime<Utc> {
        "2026-12-03T00:00:00Z".parse().unwrap()
    }

    fn server(database: &DatabaseService, authority: &str, expires: &str) -> PartialObjectMeta<Secret> {
        secret_meta(
            "server-uid",
            &[
                (AUTHORITY_ANNOTATION, authority.into()),
                (NOT_AFTER_ANNOTATION, expires.into()),
                (NAMES_ANNOTATION, server_names(database, CLUSTER_DOMAIN).join(",")),
            ],
        )
    }

    #[test]
    fn a_new_database_gets_a_ca_a_server_certificate_and_a_published_ca() {
        let work = decide_certificates(&database(serde_json::json!({})), ObservedCertificates::default(), now());
        assert_eq!(
            work,
            CertificateWork {
                create_authority: true,
                issue_server: Some(IssueReason::Missing),
                publish_authority: true
            }
        );
    }

    #[test]
    fn a_valid_certificate_costs_nothing_and_one_expiring_within_30_days_is_renewed() {
        let database = database(serde_json::json!({}));
        let authority = secret_meta("ca-uid", &[]);
        let published: Compact<ConfigMap> = Compact::from_object(&authority_config_map(&database, "ca-uid", "CA"));
        let fresh = server(&database, "ca-uid", "2027-02-01T00:00:00Z");
        let observed =
            ObservedCertificates { authority: Some(&authority), server: Some(&fresh), published: Some(&published) };
        assert!(decide_certificates(&database, observed, now()).is_empty());
        let expiring = server(&database, "ca-uid", "2026-12-20T00:00:00Z");
        let observed = ObservedCertificates { server: Some(&expiring), ..observed };
        assert_eq!(decide_certificates(&database, observed, now()).issue_server, Some(IssueReason::Expiring));
    }

    #[test]
    fn a_certificate_of_another_ca_or_for_other_names_is_reissued() {
        let database = database(serde_json::json!({}));
        let authority = secret_meta("ca-uid", &[]);
        let other = server(&database, "old-ca", "2027-02-01T00:00:00Z");
        let observed = ObservedCertificates { authority: Some(&authority), server: Some(&other), published: None };
        let work = decide_certificates(&database, observed, now());
        assert_eq!(work.issue_server, Some(IssueReason::AuthorityChanged));
        assert!(work.publish_authority && !work.create_authority);
        let mut renamed = server(&database, "ca-uid", "2027-02-01T00:00:00Z");
        renamed.metadata.annotations.as_mut().unwrap().insert(NAMES_ANNOTATION.into(), "orders".into());
        let observed = ObservedCertificates { server: Some(&renamed), ..observed };
        assert_eq!(decide_certificates(&database, observed, now()).issue_server, Some(IssueReason::NamesChanged));
    }

    #[test]
    fn a_users_certificate_secret_is_served_and_nothing_is_issued() {
        let database = database(serde_json::json!({"tls": {"serverCertificateSecret": "mine"}}));
        assert!(decide_certificates(&database, ObservedCertificates::default(), now()).is_empty());
    }
}
