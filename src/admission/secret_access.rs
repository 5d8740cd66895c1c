//! Admission may not make the operator a proxy for Secrets its requester cannot read: a
//! DatabaseService names Secrets (object store credentials, CA certificates) that the operator
//! reads at admission (to check a recovery source against its store) and hands to the database's
//! pods, which send signed requests to the endpoint the spec names. So every Secret a CREATE names,
//! and every Secret an UPDATE newly names, must be readable by the requesting user: the webhook asks
//! the apiserver with a SubjectAccessReview carrying the request's user info, before any Secret is
//! read or any store contacted, and denies otherwise. The same holds for the server certificate
//! Secret (`spec.tls.serverCertificateSecret`): the pods mount it; for the password Secrets of
//! `spec.roles`: the agents read them; and for the ConfigMaps of `spec.monitoring.customQueries`:
//! the agents run what they hold and publish the answers as metrics.

use crate::admission::field_error::{FieldError, FieldErrorKind};
use crate::admission::review::UserInfo;
use crate::api::backup::ObjectStore;
use crate::api::database_service::DatabaseServiceSpec;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// Longest wait for the apiserver's answers about one request.
pub const ACCESS_REVIEW_TIMEOUT: Duration = Duration::from_secs(2);

/// What a reference names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReferencedKind {
    /// A Secret.
    Secret,
    /// A ConfigMap.
    ConfigMap,
}

impl ReferencedKind {
    /// The API resource (for the SubjectAccessReview).
    pub fn resource(self) -> &'static str {
        match self {
            ReferencedKind::Secret => "secrets",
            ReferencedKind::ConfigMap => "configmaps",
        }
    }

    /// The kind, for messages.
    pub fn kind(self) -> &'static str {
        match self {
            ReferencedKind::Secret => "Secret",
            ReferencedKind::ConfigMap => "ConfigMap",
        }
    }
}

/// A Secret or ConfigMap the spec names, and the field naming it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretReference {
    /// JSON path of the field, for the denial message.
    pub field: String,
    /// The object's name (in the DatabaseService's namespace).
    pub name: String,
    /// A Secret or a ConfigMap.
    pub kind: ReferencedKind,
}

impl SecretReference {
    fn secret(field: String, name: &str) -> SecretReference {
        SecretReference { field, name: name.to_string(), kind: ReferencedKind::Secret }
    }
}

fn store_references(store: &ObjectStore, path: &str, into: &mut Vec<SecretReference>) {
    into.push(SecretReference::secret(format!("{path}.credentialsSecret.name"), &store.credentials_secret.name));
    if let Some(ca) = &store.ca_secret {
        into.push(SecretReference::secret(format!("{path}.caSecret.name"), &ca.name));
    }
}

/// Every Secret and ConfigMap `spec` names (pure).
pub fn referenced_secrets(spec: &DatabaseServiceSpec) -> Vec<SecretReference> {
    let mut references = Vec::new();
    if let Some(backup) = &spec.backup {
        store_references(&backup.object_store, "spec.backup.objectStore", &mut references);
    }
    if let Some(recovery) = spec.bootstrap.as_ref().and_then(|bootstrap| bootstrap.recovery.as_ref()) {
        store_references(&recovery.source, "spec.bootstrap.recovery.source", &mut references);
    }
    // The first primary's agent reads it to connect to the import's source.
    if let Some(import) = spec.bootstrap.as_ref().and_then(|bootstrap| bootstrap.import.as_ref()) {
        references.push(SecretReference::secret(
            "spec.bootstrap.import.source.passwordSecret.name".into(),
            &import.source.password_secret.name,
        ));
    }
    // The pods mount it, so whoever runs the database's image could read its key.
    if let Some(secret) = spec.user_server_certificate() {
        references.push(SecretReference::secret("spec.tls.serverCertificateSecret".into(), secret));
    }
    // The agents read it and set it as a role's password.
    for (index, role) in spec.roles.iter().enumerate() {
        if let Some(secret) = &role.password_secret {
            references.push(SecretReference::secret(format!("spec.roles[{index}].passwordSecret.name"), &secret.name));
        }
    }
    // The agents run its queries and publish their answers.
    for (index, reference) in spec.monitoring.iter().flat_map(|monitoring| &monitoring.custom_queries).enumerate() {
        references.push(SecretReference {
            field: format!("spec.monitoring.customQueries[{index}].name"),
            name: reference.name.clone(),
            kind: ReferencedKind::ConfigMap,
        });
    }
    references
}

/// Where a store's Secrets are sent: its endpoint and bucket.
fn destination(store: Option<&ObjectStore>) -> Option<(&str, &str)> {
    store.map(|store| (store.endpoint.as_str(), store.bucket.as_str()))
}

/// The stores of `spec`, by the path of their fields.
fn store_at<'a>(spec: &'a DatabaseServiceSpec, field: &str) -> Option<&'a ObjectStore> {
    if field.starts_with("spec.backup.objectStore.") {
        return spec.backup.as_ref().map(|backup| &backup.object_store);
    }
    if field.starts_with("spec.bootstrap.recovery.source.") {
        return spec.bootstrap.as_ref()?.recovery.as_ref().map(|recovery| &recovery.source);
    }
    None
}

/// The objects a request must be allowed to read: all that the new spec names, less those the
/// old spec named already (an UPDATE by someone else of an unrelated field keeps working). A store
/// whose endpoint or bucket changes has its Secrets reviewed again: the keys would be sent
/// somewhere new, and an author who may not read them must not choose where.
pub fn to_review(new: &DatabaseServiceSpec, old: Option<&DatabaseServiceSpec>) -> Vec<SecretReference> {
    let before: Vec<(ReferencedKind, String)> = old
        .map(referenced_secrets)
        .unwrap_or_default()
        .into_iter()
        .map(|reference| (reference.kind, reference.name))
        .collect();
    let moved =
        |field: &str| old.is_some_and(|old| destination(store_at(new, field)) != destination(store_at(old, field)));
    let mut wanted: Vec<SecretReference> = referenced_secrets(new)
        .into_iter()
        .filter(|reference| !before.contains(&(reference.kind, reference.name.clone())) || moved(&reference.field))
        .collect();
    wanted.dedup_by(|left, right| left.name == right.name && left.field == right.field);
    wanted
}

/// A boxed answer (the reviewer is a trait object in the admission state).
pub type AccessFuture<'a> = Pin<Box<dyn Future<Output = Result<bool, String>> + Send + 'a>>;

/// Asks whether a user may read a Secret or ConfigMap.
pub trait SecretAccessReviewer: Send + Sync {
    /// Whether `user` may `get` the `resource` ("secrets", "configmaps") `name` in `namespace`;
    /// Err with a one-line reason.
    fn may_read<'a>(
        &'a self,
        user: &'a UserInfo,
        namespace: &'a str,
        resource: &'a str,
        name: &'a str,
    ) -> AccessFuture<'a>;
}

/// The denials for `references` given `user`'s access, each naming its field. An unanswered
/// review denies too: without the answer the operator would have to trust the request.
pub async fn check(
    reviewer: &dyn SecretAccessReviewer,
    user: &UserInfo,
    namespace: &str,
    references: &[SecretReference],
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for reference in references {
        let kind = reference.kind.kind();
        let asked = reviewer.may_read(user, namespace, reference.kind.resource(), &reference.name);
        let answer = tokio::time::timeout(ACCESS_REVIEW_TIMEOUT, asked)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} s", ACCESS_REVIEW_TIMEOUT.as_secs())));
        let detail = match answer {
            Ok(true) => continue,
            Ok(false) => format!(
                "{} may not read {kind} {:?} in namespace {namespace}: a DatabaseService may name only {kind}s its author can read",
                user.describe(),
                reference.name
            ),
            Err(reason) => {
                format!("could not check whether {} may read {kind} {:?}: {reason}", user.describe(), reference.name)
            }
        };
        errors.push(FieldError { path: reference.field.clone(), kind: FieldErrorKind::Forbidden, detail });
    }
    errors
}

/// The operator's reviewer: SubjectAccessReviews with the request's user info.
pub struct KubeSecretAccessReviewer {
    client: kube::Client,
}

impl KubeSecretAccessReviewer {
    /// A reviewer asking through `client`.
    pub fn new(client: kube::Client) -> Self {
        KubeSecretAccessReviewer { client }
    }

    async fn review(&self, user: &UserInfo, namespace: &str, resource: &str, name: &str) -> Result<bool, String> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.to_string()),
                    verb: Some("get".into()),
                    resource: Some(resource.to_string()),
                    name: Some(name.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviews: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let answered = reviews
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(|error| format!("SubjectAccessReview: {error}"))?;
        Ok(answered.status.is_some_and(|status| status.allowed && status.denied != Some(true)))
    }
}

impl SecretAccessReviewer for KubeSecretAccessReviewer {
    fn may_read<'a>(
        &'a self,
        user: &'a UserInfo,
        namespace: &'a str,
        resource: &'a str,
        name: &'a str,
    ) -> AccessFuture<'a> {
        Box::pin(self.review(user, namespace, resource, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::backup::{BackupSpec, BootstrapSpec, CredentialsSecret, RecoverySpec, SecretKey};

    fn store(secret: &str, ca: Option<&str>) -> ObjectStore {
        ObjectStore {
            endpoint: "https://store.example".into(),
            bucket: "backups".into(),
            credentials_secret: CredentialsSecret { name: secret.into(), ..Default::default() },
            ca_secret: ca.map(|name| SecretKey { name: name.into(), key: "ca.crt".into() }),
            ..Default::default()
        }
    }

    fn spec(backup: Option<ObjectStore>, recovery: Option<ObjectStore>) -> DatabaseServiceSpec {
        DatabaseServiceSpec {
            backup: backup.map(|object_store| BackupSpec { object_store, ..Default::default() }),
            bootstrap: recovery.map(|source| BootstrapSpec {
                initdb: None,
                import: None,
                recovery: Some(RecoverySpec { source, backup_id: None, target: None, allow_non_empty_archive: None }),
            }),
            ..Default::default()
        }
    }

    fn names(references: &[SecretReference]) -> Vec<(&str, &str)> {
        references.iter().map(|reference| (reference.field.as_str(), reference.name.as_str())).collect()
    }

    #[test]
    fn every_secret_the_spec_names_is_found_with_its_field() {
        let mut spec = spec(Some(store("own", Some("own-ca"))), Some(store("source", None)));
        spec.tls = Some(crate::api::database_service::TlsSpec { server_certificate_secret: Some("cert".into()) });
        assert_eq!(
            names(&referenced_secrets(&spec)),
            [
                ("spec.backup.objectStore.credentialsSecret.name", "own"),
                ("spec.backup.objectStore.caSecret.name", "own-ca"),
                ("spec.bootstrap.recovery.source.credentialsSecret.name", "source"),
                ("spec.tls.serverCertificateSecret", "cert"),
            ]
        );
        assert!(referenced_secrets(&DatabaseServiceSpec::default()).is_empty());
    }

    #[test]
    fn the_import_sources_password_secret_is_reviewed() {
        let mut spec = spec(None, None);
        spec.bootstrap = Some(BootstrapSpec {
            import: Some(crate::api::import::ImportSpec {
                source: crate::api::import::ImportSource {
                    host: "legacy".into(),
                    username: "app".into(),
                    password_secret: crate::api::roles::PasswordSecret { name: "legacy-credentials".into(), key: None },
                    ..Default::default()
                },
                databases: vec!["app".into()],
                roles: None,
            }),
            ..Default::default()
        });
        assert_eq!(
            names(&referenced_secrets(&spec)),
            [("spec.bootstrap.import.source.passwordSecret.name", "legacy-credentials")]
        );
    }

    #[test]
    fn custom_query_config_maps_are_reviewed_as_config_maps() {
        let mut spec = spec(None, None);
        spec.monitoring = Some(crate::api::monitoring::MonitoringSpec {
            custom_queries: vec![crate::api::monitoring::ConfigMapKeyReference { name: "queries".into(), key: None }],
        });
        let references = referenced_secrets(&spec);
        assert_eq!(names(&references), [("spec.monitoring.customQueries[0].name", "queries")]);
        assert_eq!(references[0].kind.resource(), "configmaps");
        // A Secret of the same name is another object: naming it is reviewed on its own.
        let mut with_secret = spec.clone();
        with_secret.tls =
            Some(crate::api::database_service::TlsSpec { server_certificate_secret: Some("queries".into()) });
        assert_eq!(names(&to_review(&with_secret, Some(&spec))), [("spec.tls.serverCertificateSecret", "queries")]);
    }

    #[tokio::test]
    async fn a_config_map_the_user_may_not_read_is_forbidden_by_its_kind() {
        let mut spec = spec(None, None);
        spec.monitoring = Some(crate::api::monitoring::MonitoringSpec {
            custom_queries: vec![crate::api::monitoring::ConfigMapKeyReference { name: "queries".into(), key: None }],
        });
        let denied = check(&Answers(Ok(false)), &author(), "team", &referenced_secrets(&spec)).await;
        assert_eq!(
            denied[0].to_string(),
            "spec.monitoring.customQueries[0].name: Forbidden: User \"author@example.com\" may not read ConfigMap \"queries\" \
             in namespace team: a DatabaseService may name only ConfigMaps its author can read"
        );
    }

    #[test]
    fn an_update_reviews_only_the_secrets_it_newly_names() {
        let old = spec(Some(store("own", None)), None);
        assert!(to_review(&old, Some(&old)).is_empty(), "an unrelated change reviews nothing");
        let new = spec(Some(store("other", None)), None);
        assert_eq!(names(&to_review(&new, Some(&old))), [("spec.backup.objectStore.credentialsSecret.name", "other")]);
        assert_eq!(to_review(&new, None).len(), 1, "a create reviews every Secret");
        // The same Secret sent to another endpoint is reviewed again.
        let mut moved = old.clone();
        moved.backup.as_mut().unwrap().object_store.endpoint = "https://collector.evil.example".into();
        assert_eq!(names(&to_review(&moved, Some(&old))), [("spec.backup.objectStore.credentialsSecret.name", "own")]);
    }

    struct Answers(Result<bool, String>);
    impl SecretAccessReviewer for Answers {
        fn may_read<'a>(&'a self, _: &'a UserInfo, _: &'a str, _: &'a str, _: &'a str) -> AccessFuture<'a> {
            Box::pin(async move { self.0.clone() })
        }
    }

    struct Silent;
    impl SecretAccessReviewer for Silent {
        fn may_read<'a>(&'a self, _: &'a UserInfo, _: &'a str, _: &'a str, _: &'a str) -> AccessFuture<'a> {
            Box::pin(std::future::pending())
        }
    }

    fn author() -> UserInfo {
        UserInfo { username: "author@example.com".into(), ..Default::default() }
    }

    #[tokio::test]
    async fn a_secret_the_user_may_not_read_is_forbidden_and_so_is_an_unanswered_review() {
        let references = referenced_secrets(&spec(None, Some(store("s3", None))));
        assert!(check(&Answers(Ok(true)), &author(), "team", &references).await.is_empty());
        let denied = check(&Answers(Ok(false)), &author(), "team", &references).await;
        assert_eq!(
            denied[0].to_string(),
            "spec.bootstrap.recovery.source.credentialsSecret.name: Forbidden: User \"author@example.com\" may not \
             read Secret \"s3\" in namespace team: a DatabaseService may name only Secrets its author can read"
        );
        let failed = check(&Answers(Err("connection refused".into())), &author(), "team", &references).await;
        assert!(
            failed[0].to_string().contains(
                "could not check whether User \"author@example.com\" may read Secret \"s3\": connection refused"
            ),
            "{failed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_review_without_answer_denies_after_its_timeout() {
        let references = referenced_secrets(&spec(None, Some(store("s3", None))));
        let started = tokio::time::Instant::now();
        let denied = check(&Silent, &author(), "team", &references).await;
        assert_eq!(started.elapsed(), ACCESS_REVIEW_TIMEOUT);
        assert!(denied[0].detail.contains("no answer within 2 s"), "{denied:?}");
    }
}
