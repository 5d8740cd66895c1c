//! The database's certificates against the real apiserver: a CA of its own, a server
//! certificate it signed for the Services' names, the CA published for applications, and a
//! deleted server certificate issued again by the same CA (the way to rotate by hand).

use crate::controller::wait_for_phase;
use crate::support::operator::shared;
use crate::support::{client_for, cluster_or_skip, eventually, sample_database, TestNamespace};
use dbservice_operator::api::database_service::{DatabaseService, Phase};
use dbservice_operator::certificates::bundle_trusts;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use std::time::Duration;

fn text(secret: &Secret, key: &str) -> String {
    String::from_utf8(
        secret.data.as_ref().and_then(|data| data.get(key)).map(|value| value.0.clone()).unwrap_or_default(),
    )
    .unwrap()
}

#[tokio::test]
async fn the_server_certificate_is_signed_by_the_published_ca_and_issued_again_when_deleted() {
    let Some(kubeconfig) =
        cluster_or_skip("the_server_certificate_is_signed_by_the_published_ca_and_issued_again_when_deleted")
    else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "certificates").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &sample_database("ledger")).await.unwrap();
    wait_for_phase(&api, "ledger", Phase::Running, Duration::from_secs(120)).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let server = secrets.get("ledger-tls").await.expect("the server certificate Secret exists");
    assert_eq!(server.type_.as_deref(), Some("kubernetes.io/tls"));
    let published = config_maps.get("ledger-ca").await.expect("the CA is published");
    let authority = published.data.unwrap_or_default().get("ca.crt").cloned().expect("ca.crt published");
    assert!(!authority.contains("PRIVATE KEY"), "the published CA holds no key");
    let certificate = text(&server, "tls.crt");
    assert!(
        bundle_trusts(authority.as_bytes(), certificate.as_bytes()),
        "the published CA signed the server certificate"
    );
    assert_eq!(text(&server, "ca.crt"), authority, "the Secret's ca.crt is the published CA");
    let (_, parsed) = x509_parser::pem::parse_x509_pem(certificate.as_bytes()).unwrap();
    let parsed = parsed.parse_x509().unwrap();
    let names: Vec<String> = parsed
        .subject_alternative_name()
        .unwrap()
        .map(|extension| extension.value.general_names.iter().map(|name| name.to_string()).collect())
        .unwrap_or_default();
    for name in [format!("ledger.{ns}.svc"), format!("ledger-replicas.{ns}.svc"), format!("*.ledger-headless.{ns}.svc")]
    {
        assert!(names.iter().any(|candidate| candidate.contains(&name)), "{name} missing from {names:?}");
    }
    let authority_secret = secrets.get("ledger-ca").await.expect("the CA Secret exists");
    assert_eq!(text(&authority_secret, "ca.crt"), authority);

    // Deleted: issued again by the same CA, with a new key.
    secrets.delete("ledger-tls", &DeleteParams::default()).await.unwrap();
    let reissued = eventually("the server certificate issued again", Duration::from_secs(60), || async {
        let secret = secrets.get_opt("ledger-tls").await.ok().flatten()?;
        (text(&secret, "tls.crt") != certificate).then_some(secret)
    })
    .await;
    assert_ne!(text(&reissued, "tls.key"), text(&server, "tls.key"), "a new key");
    assert!(bundle_trusts(authority.as_bytes(), text(&reissued, "tls.crt").as_bytes()), "signed by the same CA");
    let published_after = config_maps.get("ledger-ca").await.unwrap();
    assert_eq!(published_after.data.unwrap_or_default().get("ca.crt"), Some(&authority), "the CA did not change");
}

/// With spec.tls.serverCertificateSecret the pods serve the user's Secret (cert-manager's) and
/// the operator issues nothing.
#[tokio::test]
async fn a_users_certificate_secret_is_served_and_nothing_is_issued() {
    let Some(kubeconfig) = cluster_or_skip("a_users_certificate_secret_is_served_and_nothing_is_issued") else {
        return;
    };
    shared();
    let client = client_for(&kubeconfig).await;
    let namespace = TestNamespace::create(&client, "user-certificate").await;
    let ns = namespace.name.as_str();
    let api: Api<DatabaseService> = Api::namespaced(client.clone(), ns);
    let mut database = sample_database("managed");
    database.spec.tls = Some(dbservice_operator::api::database_service::TlsSpec {
        server_certificate_secret: Some("managed-cert-manager".into()),
    });
    api.create(&PostParams::default(), &database).await.unwrap();
    wait_for_phase(&api, "managed", Phase::Running, Duration::from_secs(120)).await;
    let stateful_sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(client.clone(), ns);
    let pod = stateful_sets.get("managed").await.unwrap().spec.template.spec.unwrap();
    let served: Vec<String> = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .filter(|volume| volume.name == "tls")
        .filter_map(|volume| volume.secret?.secret_name)
        .collect();
    assert_eq!(served, ["managed-cert-manager"], "the pods serve the user's Secret");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    assert!(secrets.get_opt("managed-tls").await.unwrap().is_none(), "no certificate issued");
    assert!(secrets.get_opt("managed-ca").await.unwrap().is_none(), "no CA made");
}
