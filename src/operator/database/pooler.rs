//! The pooler (issue 25), operator side: its children applied when the live Deployment differs
//! from the built one (one read per pass, no write when nothing changed), removed when
//! `spec.pooler` goes, and its read-write pools paused before a switchover is published, so that
//! the old primary stops only once no transaction runs through the pooler. The pooler agents
//! resume by themselves once they see the switchover end (see `crate::pooler`). The pause call
//! is HTTPS: the agent serves the database's server certificate, and the operator verifies it by
//! the database's CA for the pooler Service's name before it sends the control token.

use crate::api::database_service::DatabaseService;
use crate::api::names::ChildNames;
use crate::api::pooler::{PoolerStatus, CONTROL_TOKEN_KEY, POOLER_CONTROL_PORT};
use crate::operator::caches::diff::contains;
use crate::operator::context::PassContext;
use crate::operator::database::build::generate_password;
use crate::operator::database::build::pooler::{pooler_children, pooler_pod_labels, PoolerChildren, PoolerSecrets};
use crate::operator::server_side_apply;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use std::time::Duration;

/// How long the operator waits for every pooler pod to pause (in-flight transactions finish
/// first); a pod that has not paused by then is resumed by its agent and the switchover goes on.
pub const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);

fn live_holds(live: &Deployment, desired: &Deployment) -> bool {
    let mut wanted = serde_json::to_value(desired).expect("objects serialize");
    if let Some(object) = wanted.as_object_mut() {
        object.remove("apiVersion");
        object.remove("kind");
    }
    contains(&serde_json::to_value(live).expect("objects serialize"), &wanted)
}

async fn apply_one<K>(api: Api<K>, object: &K, context: &PassContext) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
{
    server_side_apply::apply(&api, object).await?;
    context.shared.metrics.count_write(&K::kind(&()), "apply");
    Ok(())
}

async fn apply_children(namespace: &str, children: PoolerChildren, context: &PassContext) -> Result<(), kube::Error> {
    let client = &context.shared.client;
    fn api<K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>>(
        client: &kube::Client,
        namespace: &str,
    ) -> Api<K> {
        Api::namespaced(client.clone(), namespace)
    }
    if let Some(secret) = &children.secret {
        let secrets: Api<Secret> = api(client, namespace);
        match secrets.create(&PostParams::default(), secret).await {
            Ok(_) => context.shared.metrics.count_write("Secret", "create"),
            // Made by an earlier pass whose Deployment write failed: never overwritten.
            Err(kube::Error::Api(response)) if response.code == 409 => {}
            Err(error) => return Err(error),
        }
    }
    let (account, role, binding) = &children.account;
    let services: Api<Service> = api(client, namespace);
    tokio::try_join!(
        apply_one::<ConfigMap>(api(client, namespace), &children.config_map, context),
        apply_one::<ServiceAccount>(api(client, namespace), account, context),
        apply_one::<Role>(api(client, namespace), role, context),
        apply_one::<PodDisruptionBudget>(api(client, namespace), &children.disruption_budget, context),
        futures::future::try_join_all(children.services.iter().map(|service| apply_one(
            services.clone(),
            service,
            context
        ))),
    )?;
    // After the Role: the operator may bind only what the apiserver sees it holds.
    apply_one::<RoleBinding>(api(client, namespace), binding, context).await?;
    apply_one::<Deployment>(api(client, namespace), &children.deployment, context).await
}

async fn delete_named<K>(api: Api<K>, name: &str, context: &PassContext) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            context.shared.metrics.count_write(&K::kind(&()), "delete");
            Ok(())
        }
        Err(kube::Error::Api(response)) if response.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

/// Removes the pooler's children (the Deployment first: its pods stop taking clients). Its
/// ServiceAccount, Role and RoleBinding stay until the DatabaseService goes (owner references):
/// the operator holds no right to delete Roles, and they grant only a read of this
/// DatabaseService.
async fn remove_children(database: &DatabaseService, context: &PassContext) -> Result<(), kube::Error> {
    let namespace = database.namespace().unwrap_or_default();
    let name = ChildNames::pooler(&database.name_any());
    let client = &context.shared.client;
    delete_named::<Deployment>(Api::namespaced(client.clone(), &namespace), &name, context).await?;
    let replicas = ChildNames::pooler_replicas_service(&database.name_any());
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    tokio::try_join!(
        delete_named(services.clone(), &name, context),
        delete_named(services.clone(), &replicas, context),
        delete_named::<ConfigMap>(Api::namespaced(client.clone(), &namespace), &name, context),
        delete_named::<Secret>(Api::namespaced(client.clone(), &namespace), &name, context),
        delete_named::<PodDisruptionBudget>(Api::namespaced(client.clone(), &namespace), &name, context),
    )?;
    Ok(())
}

/// Keeps the pooler of `database` as its spec says; the pooler's status (None without one).
/// Without the operator's own image (no agents) there is no pooler: it needs its agent.
pub async fn keep_pooler(
    database: &DatabaseService,
    context: &PassContext,
) -> Result<Option<PoolerStatus>, kube::Error> {
    let had_one = database.status.as_ref().is_some_and(|status| status.pooler.is_some());
    let settings = &context.shared.settings;
    let (Some(pooler), Some(agent_image)) = (&database.spec.pooler, settings.instance_image.as_deref()) else {
        if had_one {
            remove_children(database, context).await?;
        }
        return Ok(None);
    };
    let namespace = database.namespace().unwrap_or_default();
    let deployments: Api<Deployment> = Api::namespaced(context.shared.client.clone(), &namespace);
    let live = deployments.get_opt(&ChildNames::pooler(&database.name_any())).await?;
    let built = pooler_children(database, pooler, &settings.pooler_image, agent_image, None);
    if !live.as_ref().is_some_and(|live| live_holds(live, &built.deployment)) {
        let new_secrets = PoolerSecrets {
            auth_password: generate_password(),
            admin_password: generate_password(),
            control_token: generate_password(),
        };
        let secrets: Api<Secret> = Api::namespaced(context.shared.client.clone(), &namespace);
        let exists = secrets.get_metadata_opt(&ChildNames::pooler(&database.name_any())).await?.is_some();
        let secret = (!exists).then_some(&new_secrets);
        let children = pooler_children(database, pooler, &settings.pooler_image, agent_image, secret);
        apply_children(&namespace, children, context).await?;
    }
    let ready = live.as_ref().and_then(|live| live.status.as_ref()).and_then(|status| status.ready_replicas);
    Ok(Some(PoolerStatus { instances: pooler.instances_or_default(), ready_instances: ready.unwrap_or(0) }))
}

/// Asking the pooler pods to pause failed before any pod was asked.
#[derive(Debug, thiserror::Error)]
pub enum PausePoolersError {
    /// Secret NAME-pooler could not be read, or holds no token.
    #[error("read the control token of secret {secret}: {detail}")]
    Token {
        /// The Secret.
        secret: String,
        /// Why.
        detail: String,
    },
    /// The CA to verify the agents by could not be read, or holds no certificate.
    #[error("read the database's certificate authority from {source_name}: {detail}")]
    Authority {
        /// The ConfigMap or Secret.
        source_name: String,
        /// Why.
        detail: String,
    },
    /// The pooler pods could not be listed.
    #[error("list the pooler pods: {0}")]
    List(kube::Error),
}

/// Asks every ready pooler pod of `database` to pause its read-write pool for the switchover to
/// `target`, all at once, each within [`PAUSE_TIMEOUT`]; the pods that paused. A pod that cannot
/// is no reason to hold the switchover: its clients see the errors they would without a pooler.
pub async fn pause_for_switchover(database: &DatabaseService, target: &str, context: &PassContext) -> PauseOutcome {
    let prepared = async {
        let token = control_token(database, context).await?;
        let tls = control_tls(database, context).await?;
        let addresses = ready_pooler_addresses(database, context).await?;
        Ok::<_, PausePoolersError>((token, tls, addresses))
    };
    let (token, tls, addresses) = match prepared.await {
        Ok(prepared) => prepared,
        Err(error) => return PauseOutcome { paused: 0, failures: vec![error.to_string()] },
    };
    let calls = addresses.iter().map(|address| pause_one(address, POOLER_CONTROL_PORT as u16, target, &token, &tls));
    let results = futures::future::join_all(calls).await;
    let mut outcome = PauseOutcome::default();
    for (address, result) in addresses.iter().zip(results) {
        match result {
            Ok(()) => outcome.paused += 1,
            Err(error) => outcome.failures.push(format!("{address}: {error}")),
        }
    }
    outcome
}

async fn control_token(database: &DatabaseService, context: &PassContext) -> Result<String, PausePoolersError> {
    let namespace = database.namespace().unwrap_or_default();
    let name = ChildNames::pooler(&database.name_any());
    let secrets: Api<Secret> = Api::namespaced(context.shared.client.clone(), &namespace);
    let failed = |detail: String| PausePoolersError::Token { secret: name.clone(), detail };
    let secret = secrets.get(&name).await.map_err(|error| failed(error.to_string()))?;
    let token = secret.data.and_then(|mut data| data.remove(CONTROL_TOKEN_KEY)).map(|token| token.0);
    token.and_then(|token| String::from_utf8(token).ok()).ok_or_else(|| failed("no control token".into()))
}

/// The CA the agents' certificate chains to: the operator's (ConfigMap NAME-ca), or the `ca.crt`
/// of the user's server certificate Secret (`spec.tls.serverCertificateSecret`).
async fn control_tls(database: &DatabaseService, context: &PassContext) -> Result<ControlTls, PausePoolersError> {
    let namespace = database.namespace().unwrap_or_default();
    let client = &context.shared.client;
    let (source_name, pem) = match database.spec.user_server_certificate() {
        Some(secret) => {
            let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
            let read = secrets.get(secret).await;
            let pem = read.map(|secret| secret.data.and_then(|mut data| data.remove("ca.crt")).map(|pem| pem.0));
            (format!("secret {secret}"), pem)
        }
        None => {
            let name = ChildNames::certificate_authority(&database.name_any());
            let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
            let read = config_maps.get(&name).await;
            let pem = read.map(|map| map.data.and_then(|mut data| data.remove("ca.crt")).map(String::into_bytes));
            (format!("configmap {name}"), pem)
        }
    };
    let failed = |detail: String| PausePoolersError::Authority { source_name: source_name.clone(), detail };
    let pem = pem.map_err(|error| failed(error.to_string()))?.ok_or_else(|| failed("no ca.crt".into()))?;
    ControlTls::new(&pem, &pooler_server_name(database)).ok_or_else(|| failed("no usable certificate in ca.crt".into()))
}

/// The name the agents' certificate is verified for: the pooler Service's (the operator's
/// server certificate covers it with `spec.pooler`; the pods are dialled by IP, which it does not).
pub fn pooler_server_name(database: &DatabaseService) -> String {
    format!("{}.{}.svc", ChildNames::pooler(&database.name_any()), database.namespace().unwrap_or_default())
}

async fn ready_pooler_addresses(
    database: &DatabaseService,
    context: &PassContext,
) -> Result<Vec<String>, PausePoolersError> {
    let pods: Api<Pod> = Api::namespaced(context.shared.client.clone(), &database.namespace().unwrap_or_default());
    let selector = pooler_pod_labels(&database.name_any())
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",");
    let listed = pods.list(&ListParams::default().labels(&selector)).await.map_err(PausePoolersError::List)?;
    Ok(listed
        .items
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none() && pod_ready(pod))
        .filter_map(|pod| pod.status.as_ref()?.pod_ip.clone())
        .collect())
}

fn pod_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|status| status.conditions.as_ref());
    conditions.is_some_and(|conditions| {
        conditions.iter().any(|condition| condition.type_ == "Ready" && condition.status == "True")
    })
}

/// What [`pause_for_switchover`] achieved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PauseOutcome {
    /// Pooler pods paused.
    pub paused: usize,
    /// Why the others did not.
    pub failures: Vec<String>,
}

/// TLS to a pooler agent's control server: only the database's CA is trusted, for one name.
#[derive(Clone)]
pub struct ControlTls {
    connector: tokio_rustls::TlsConnector,
    server_name: rustls::pki_types::ServerName<'static>,
}

impl ControlTls {
    /// Trusts the CAs of `authority_pem` for `server_name`; None without a certificate in it or
    /// with a name that is no DNS name.
    pub fn new(authority_pem: &[u8], server_name: &str) -> Option<Self> {
        let config = crate::postgres_tls::verifying_client_config(authority_pem)?;
        let server_name = rustls::pki_types::ServerName::try_from(server_name.to_string()).ok()?;
        Some(Self { connector: tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)), server_name })
    }
}

/// Asking one pooler agent to pause failed.
#[derive(Debug, thiserror::Error)]
pub enum PausePoolerError {
    /// No TCP connection.
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// The TLS handshake failed: the server is not verified, and the token was not sent.
    #[error("tls handshake: {0}")]
    Handshake(std::io::Error),
    /// The HTTP exchange failed.
    #[error("request: {0}")]
    Request(String),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The agent answered with an error.
    #[error("{status}: {text}")]
    Refused {
        /// The HTTP status.
        status: http::StatusCode,
        /// The start of the body.
        text: String,
    },
}

/// POSTs /pause to the agent at `address`:`port` over TLS verified by `tls`, with the token.
pub async fn pause_one(
    address: &str,
    port: u16,
    target: &str,
    token: &str,
    tls: &ControlTls,
) -> Result<(), PausePoolerError> {
    let call = async {
        let stream = tokio::net::TcpStream::connect((address, port)).await.map_err(PausePoolerError::Connect)?;
        // The token goes only into a connection whose server proved the certificate.
        let stream =
            tls.connector.connect(tls.server_name.clone(), stream).await.map_err(PausePoolerError::Handshake)?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| PausePoolerError::Request(error.to_string()))?;
        tokio::spawn(connection);
        let body = serde_json::json!({"target": target}).to_string();
        let request = http::Request::post("/pause")
            .header(http::header::HOST, tls.server_name.to_str().as_ref())
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(bytes::Bytes::from(body)))
            .map_err(|error| PausePoolerError::Request(error.to_string()))?;
        let response =
            sender.send_request(request).await.map_err(|error| PausePoolerError::Request(error.to_string()))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let body = response.into_body().collect().await.map(|body| body.to_bytes()).unwrap_or_default();
        let text = String::from_utf8_lossy(&body).trim_end().chars().take(200).collect();
        Err(PausePoolerError::Refused { status, text })
    };
    tokio::time::timeout(PAUSE_TIMEOUT, call).await.map_err(|_| PausePoolerError::Timeout(PAUSE_TIMEOUT))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::limits::ServerLimits;
    use crate::admission::tls::{install_crypto_provider, ReloadingCertificate};
    use crate::certificates::{generate_ca_named, generate_serving_certificate};
    use axum::http::{HeaderMap, StatusCode};
    use std::sync::{Arc, Mutex};

    const NAME: &str = "orders-pooler.shop.svc";

    fn authority() -> (String, String) {
        generate_ca_named("test CA", time::Duration::days(1)).unwrap()
    }

    /// A control server on loopback serving a certificate of `authority` for `names`; its port,
    /// and the bearer tokens it was sent.
    async fn agent(authority: &(String, String), names: &[&str]) -> (u16, Arc<Mutex<Vec<String>>>) {
        install_crypto_provider();
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        let (certificate, key) =
            generate_serving_certificate(&authority.0, &authority.1, &names, &[], time::Duration::days(1)).unwrap();
        let directory = tempfile::tempdir().unwrap();
        std::fs::write(directory.path().join("tls.crt"), certificate).unwrap();
        std::fs::write(directory.path().join("tls.key"), key).unwrap();
        let loaded =
            ReloadingCertificate::load(&directory.path().join("tls.crt"), &directory.path().join("tls.key")).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = seen.clone();
        let router = axum::Router::new().route(
            "/pause",
            axum::routing::post(move |headers: HeaderMap| async move {
                let token = headers.get("authorization").and_then(|value| value.to_str().ok()).unwrap_or_default();
                recorder.lock().unwrap().push(token.to_string());
                match token == "Bearer token" {
                    true => (StatusCode::OK, "paused\n"),
                    false => (StatusCode::UNAUTHORIZED, "no\n"),
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let _directory = directory;
            let (_stop, never) = tokio::sync::watch::channel(false);
            crate::admission::server::serve_tls(listener, router, loaded, ServerLimits::default(), never).await;
        });
        (port, seen)
    }

    #[tokio::test]
    async fn the_pause_goes_over_tls_to_a_server_of_the_databases_ca_only() {
        let database_authority = authority();
        let tls = ControlTls::new(database_authority.0.as_bytes(), NAME).unwrap();
        let (port, seen) = agent(&database_authority, &[NAME]).await;
        pause_one("127.0.0.1", port, "orders-1", "token", &tls).await.unwrap();
        assert_eq!(*seen.lock().unwrap(), ["Bearer token"]);
        let refused = pause_one("127.0.0.1", port, "orders-1", "wrong", &tls).await.unwrap_err();
        assert!(matches!(refused, PausePoolerError::Refused { status: StatusCode::UNAUTHORIZED, .. }), "{refused}");

        // Another CA's certificate for the right name: no handshake, and the token never sent.
        let (port, seen) = agent(&authority(), &[NAME]).await;
        let error = pause_one("127.0.0.1", port, "orders-1", "token", &tls).await.unwrap_err();
        assert!(matches!(error, PausePoolerError::Handshake(_)), "{error}");
        assert!(seen.lock().unwrap().is_empty(), "the token reached an unverified server");

        // The database's CA, but for another name.
        let (port, seen) = agent(&database_authority, &["other-pooler.shop.svc"]).await;
        let error = pause_one("127.0.0.1", port, "orders-1", "token", &tls).await.unwrap_err();
        assert!(matches!(error, PausePoolerError::Handshake(_)), "{error}");
        assert!(seen.lock().unwrap().is_empty());
    }

    #[test]
    fn the_agents_are_verified_for_the_pooler_services_name_which_the_certificate_covers() {
        let database = crate::operator::database::build::test_database(serde_json::json!({"pooler": {}}));
        let name = pooler_server_name(&database);
        assert_eq!(name, NAME);
        let names = crate::operator::database::build::tls::server_names(&database, "cluster.local");
        assert!(names.contains(&name), "{names:?}");
        assert!(ControlTls::new(b"not a certificate", NAME).is_none());
    }
}
