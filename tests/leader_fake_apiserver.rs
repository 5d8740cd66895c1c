//! Leader election against a fake apiserver that serves only the Lease and can be switched to
//! fail: 500 errors, 503 errors (which kube's default client retries for minutes) and requests
//! that hang. In every mode the holder must stop leading before the Lease could be free for
//! anyone else: before the last successful renewal + the lease duration.
//!
//! Also the write gate of the controller's client: writes are refused when not leading, and a
//! write in flight is cancelled the moment leadership is lost.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use dbservice_operator::client::{client, NOT_LEADER};
use dbservice_operator::metrics::Metrics;
use dbservice_operator::operator::leader::LeaderElection;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const LEASE_DURATION: Duration = Duration::from_secs(3);
const NAMESPACE: &str = "operators";
const LEASE: &str = "dbservice-operator-leader";
/// Bound of every wait; the expected events happen within a few seconds.
const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Healthy,
    Error500,
    Error503,
    Hang,
}

#[derive(Default)]
struct Store {
    lease: Option<Value>,
    version: u64,
    /// When the last write of the Lease was committed.
    last_write: Option<Instant>,
}

#[derive(Clone)]
struct FakeApiserver {
    mode: Arc<Mutex<Mode>>,
    store: Arc<Mutex<Store>>,
}

impl FakeApiserver {
    fn failure(&self) -> Option<Response> {
        match *self.mode.lock().unwrap() {
            Mode::Healthy | Mode::Hang => None,
            Mode::Error500 => Some(status_response(500, "InternalError")),
            // Retry-After makes kube's default client retry, as a real overloaded apiserver would.
            Mode::Error503 => {
                let mut response = status_response(503, "ServiceUnavailable");
                response.headers_mut().insert("retry-after", "1".parse().unwrap());
                Some(response)
            }
        }
    }

    async fn hang_if_asked(&self) {
        if *self.mode.lock().unwrap() == Mode::Hang {
            std::future::pending::<()>().await;
        }
    }

    fn commit(&self, mut lease: Value) -> Value {
        let mut store = self.store.lock().unwrap();
        store.version += 1;
        lease["metadata"]["resourceVersion"] = json!(store.version.to_string());
        lease["metadata"]["namespace"] = json!(NAMESPACE);
        lease["apiVersion"] = json!("coordination.k8s.io/v1");
        lease["kind"] = json!("Lease");
        store.lease = Some(lease.clone());
        store.last_write = Some(Instant::now());
        lease
    }
}

fn status_response(code: u16, reason: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": reason, "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap(), Json(body)).into_response()
}

async fn get_lease(State(server): State<FakeApiserver>, Path((_, _)): Path<(String, String)>) -> Response {
    server.hang_if_asked().await;
    if let Some(failure) = server.failure() {
        return failure;
    }
    match server.store.lock().unwrap().lease.clone() {
        Some(lease) => Json(lease).into_response(),
        None => status_response(404, "NotFound"),
    }
}

async fn create_lease(State(server): State<FakeApiserver>, Json(lease): Json<Value>) -> Response {
    server.hang_if_asked().await;
    if let Some(failure) = server.failure() {
        return failure;
    }
    if server.store.lock().unwrap().lease.is_some() {
        return status_response(409, "AlreadyExists");
    }
    (StatusCode::CREATED, Json(server.commit(lease))).into_response()
}

async fn replace_lease(
    State(server): State<FakeApiserver>,
    Path((_, _)): Path<(String, String)>,
    Json(lease): Json<Value>,
) -> Response {
    server.hang_if_asked().await;
    if let Some(failure) = server.failure() {
        return failure;
    }
    let current = server.store.lock().unwrap().version.to_string();
    if lease["metadata"]["resourceVersion"] != json!(current) {
        return status_response(409, "Conflict");
    }
    Json(server.commit(lease)).into_response()
}

/// Anything else (the write-gate test's ConfigMap patch) hangs until the client gives up.
async fn hang_forever() -> Response {
    std::future::pending::<()>().await;
    StatusCode::OK.into_response()
}

async fn start_fake() -> (FakeApiserver, kube::Config) {
    let server = FakeApiserver { mode: Arc::new(Mutex::new(Mode::Healthy)), store: Arc::default() };
    let router = Router::new()
        .route("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases", post(create_lease))
        .route("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}", get(get_lease).put(replace_lease))
        .fallback(any(hang_forever))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let mut config = kube::Config::new(format!("http://{address}").parse().unwrap());
    config.default_namespace = NAMESPACE.into();
    (server, config)
}

async fn wait_until(what: &str, leader: &mut watch::Receiver<bool>, leading: bool) -> Instant {
    tokio::time::timeout(DEADLINE, leader.wait_for(|value| *value == leading))
        .await
        .unwrap_or_else(|_| panic!("{what} within {DEADLINE:?}"))
        .expect("the elector is running");
    Instant::now()
}

/// Leads, then the apiserver turns to `mode`: returns how long before the Lease could be taken
/// by someone else the holder stopped leading (negative would be split brain).
async fn margin_before_lease_is_free(mode: Mode) -> Duration {
    dbservice_operator::admission::tls::install_crypto_provider();
    let (server, config) = start_fake().await;
    let election = LeaderElection {
        namespace: NAMESPACE.into(),
        lease_name: LEASE.into(),
        identity: format!("holder-{mode:?}"),
        lease_duration: LEASE_DURATION,
    };
    let (_shutdown, stop) = watch::channel(false);
    let (mut leader, _task) = election.spawn(&config, Arc::new(Metrics::new()), stop).unwrap();
    wait_until("leading", &mut leader, true).await;
    // Let a few renewals happen, then break the apiserver.
    tokio::time::sleep(LEASE_DURATION / 2).await;
    *server.mode.lock().unwrap() = mode;
    let stepped_down = wait_until("stepping down", &mut leader, false).await;
    let last_write = server.store.lock().unwrap().last_write.expect("the Lease was written");
    let free_at = last_write + LEASE_DURATION;
    assert!(
        stepped_down < free_at,
        "{mode:?}: still leading {:?} after the Lease became free",
        stepped_down.duration_since(free_at)
    );
    let margin = free_at.duration_since(stepped_down);
    println!("{mode:?}: stopped leading {margin:?} before the Lease could be taken over");
    margin
}

/// Every mode several times: the holder must stop in time *every* time.
async fn check_mode(mode: Mode) {
    let runs: Vec<_> = (0..3).map(|_| tokio::spawn(margin_before_lease_is_free(mode))).collect();
    for run in runs {
        let margin = run.await.expect("the run passed");
        // The deadline is 70% of the duration after the renewal was sent: ~0.9 s of margin here.
        assert!(margin >= Duration::from_millis(300), "{mode:?}: margin only {margin:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_steps_down_before_the_lease_is_free_when_renewals_get_500() {
    check_mode(Mode::Error500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_steps_down_before_the_lease_is_free_when_renewals_get_503() {
    check_mode(Mode::Error503).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_steps_down_before_the_lease_is_free_when_renewals_hang() {
    check_mode(Mode::Hang).await;
}

/// A healthy apiserver keeps the holder leading (the failure tests are not passing because
/// leadership never lasts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_keeps_leading_while_renewals_succeed() {
    dbservice_operator::admission::tls::install_crypto_provider();
    let (_server, config) = start_fake().await;
    let election = LeaderElection {
        namespace: NAMESPACE.into(),
        lease_name: LEASE.into(),
        identity: "steady".into(),
        lease_duration: LEASE_DURATION,
    };
    let (_shutdown, stop) = watch::channel(false);
    let (mut leader, _task) = election.spawn(&config, Arc::new(Metrics::new()), stop).unwrap();
    wait_until("leading", &mut leader, true).await;
    let lost = tokio::time::timeout(LEASE_DURATION * 3, leader.wait_for(|leading| !*leading)).await;
    assert!(lost.is_err(), "lost leadership with a healthy apiserver");
}

#[tokio::test]
async fn writes_are_refused_when_not_leading_and_cancelled_on_step_down() {
    dbservice_operator::admission::tls::install_crypto_provider();
    let (_server, config) = start_fake().await;
    let (leading, leader) = watch::channel(false);
    let gated =
        client(&config, Some(leader), &std::sync::Arc::new(dbservice_operator::metrics::Metrics::new())).unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(gated, NAMESPACE);
    let patch = Patch::Merge(json!({"data": {"k": "v"}}));
    let refused = config_maps.patch("c", &PatchParams::default(), &patch).await.unwrap_err();
    assert!(refused.to_string().contains(NOT_LEADER), "{refused}");
    // Leading: the write goes out (and hangs on the fake); stepping down cancels it at once.
    leading.send(true).unwrap();
    let write = tokio::spawn(async move { config_maps.patch("c", &PatchParams::default(), &patch).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!write.is_finished(), "the write should be in flight");
    let stepped_down = Instant::now();
    leading.send(false).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(2), write).await.expect("cancelled promptly").unwrap();
    let error = result.unwrap_err();
    assert!(error.to_string().contains(NOT_LEADER), "{error}");
    println!("in-flight write cancelled {:?} after stepping down", stepped_down.elapsed());
}
