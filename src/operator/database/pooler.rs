//! The pooler (issue 25), operator side: its children applied when the live Deployment differs
//! from the built one (one read per pass, no write when nothing changed), removed when
//! `spec.pooler` goes, and its read-write pools paused before a switchover is published, so that
//! the old primary stops only once no transaction runs through the pooler. The pooler agents
//! resume by themselves once they see the switchover end (see `crate::pooler`).

use crate::api::database_service::DatabaseService;
use crate::api::names::ChildNames;
use crate::api::pooler::{PoolerStatus, CONTROL_TOKEN_KEY, POOLER_AGENT_PORT};
use crate::operator::caches::diff::contains;
use crate::operator::context::PassContext;
use crate::operator::database::build::generate_password;
use crate::operator::database::build::pooler::{pooler_children, pooler_pod_labels, PoolerChildren, PoolerSecrets};
use crate::operator::server_side_apply;
use http_body_util::{BodyExt, Full};
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

/// Asks every ready pooler pod of `database` to pause its read-write pool for the switchover to
/// `target`, all at once, each within [`PAUSE_TIMEOUT`]; the pods that paused. A pod that cannot
/// is no reason to hold the switchover: its clients see the errors they would without a pooler.
pub async fn pause_for_switchover(database: &DatabaseService, target: &str, context: &PassContext) -> PauseOutcome {
    let namespace = database.namespace().unwrap_or_default();
    let client = &context.shared.client;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let token = match secrets.get(&ChildNames::pooler(&database.name_any())).await {
        Ok(secret) => secret.data.and_then(|mut data| data.remove(CONTROL_TOKEN_KEY)).map(|token| token.0),
        Err(error) => return PauseOutcome { paused: 0, failures: vec![format!("reading the control token: {error}")] },
    };
    let Some(token) = token.and_then(|token| String::from_utf8(token).ok()) else {
        return PauseOutcome { paused: 0, failures: vec!["no control token".into()] };
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let selector = pooler_pod_labels(&database.name_any())
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",");
    let listed = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(listed) => listed.items,
        Err(error) => return PauseOutcome { paused: 0, failures: vec![format!("listing the pooler pods: {error}")] },
    };
    let addresses: Vec<String> = listed
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none() && pod_ready(pod))
        .filter_map(|pod| pod.status.as_ref()?.pod_ip.clone())
        .collect();
    let results = futures::future::join_all(addresses.iter().map(|address| pause_one(address, target, &token))).await;
    let mut outcome = PauseOutcome::default();
    for (address, result) in addresses.iter().zip(results) {
        match result {
            Ok(()) => outcome.paused += 1,
            Err(error) => outcome.failures.push(format!("{address}: {error}")),
        }
    }
    outcome
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

async fn pause_one(address: &str, target: &str, token: &str) -> Result<(), String> {
    let client: hyper_util::client::legacy::Client<_, Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let body = serde_json::json!({"target": target}).to_string();
    let request = http::Request::post(format!("http://{address}:{POOLER_AGENT_PORT}/pause"))
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(bytes::Bytes::from(body)))
        .map_err(|error| error.to_string())?;
    let response = tokio::time::timeout(PAUSE_TIMEOUT, client.request(request))
        .await
        .map_err(|_| format!("no answer within {PAUSE_TIMEOUT:?}"))?
        .map_err(|error| error.to_string())?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let text = tokio::time::timeout(Duration::from_secs(1), response.into_body().collect())
        .await
        .ok()
        .and_then(Result::ok)
        .map(|body| String::from_utf8_lossy(&body.to_bytes()).chars().take(200).collect::<String>())
        .unwrap_or_default();
    Err(format!("{status}: {text}"))
}
