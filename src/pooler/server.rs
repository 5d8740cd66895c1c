//! The pooler agent's HTTP servers. Plain HTTP ([`router`]): GET /healthz (ready once the
//! read-write PgBouncer runs and a login through it reached the primary) and GET /metrics (one
//! scrape at a time, each PgBouncer asked within a bound), nothing secret. HTTPS
//! ([`control_router`], on its own port with the database's server certificate): POST /pause
//! (the operator, with the bearer token; a body of at most 1 KiB), so that the token never
//! crosses the pod network in clear.

use crate::pooler::admin::{self, Pool};
use crate::pooler::metrics::{families, PoolRows};
use crate::pooler::{PauseRequest, Shared, READ_ONLY, READ_WRITE};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Largest /pause body.
const MAX_BODY: usize = 1024;
/// How long /pause waits for the agent's answer.
const PAUSE_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// What the handlers share.
#[derive(Clone)]
pub struct ServerState {
    /// The agent's shared state.
    pub shared: Arc<Mutex<Shared>>,
    /// Pause requests to the agent's loop.
    pub requests: mpsc::Sender<PauseRequest>,
    /// The bearer token /pause needs.
    pub token: String,
    /// PgBouncer's admin password (for SHOW).
    pub admin_password: String,
    /// One scrape at a time.
    pub scrapes: Arc<Semaphore>,
}

/// The router of the agent's plain HTTP server (probes and scrapes; no /pause).
pub fn router(state: ServerState) -> Router {
    Router::new().route("/healthz", get(healthz)).route("/metrics", get(metrics)).with_state(state)
}

/// The router of the agent's HTTPS server: /pause only.
pub fn control_router(state: ServerState) -> Router {
    Router::new().route("/pause", post(pause)).layer(DefaultBodyLimit::max(MAX_BODY)).with_state(state)
}

async fn healthz(State(state): State<ServerState>) -> StatusCode {
    let shared = state.shared.lock().expect("not poisoned");
    if shared.pointed_once && shared.server_path_proven {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn rows_of(pool: Pool, password: &str) -> PoolRows {
    let pools = admin::run(pool, password, "SHOW POOLS", admin::COMMAND_TIMEOUT).await.ok();
    let stats = match pools {
        Some(_) => admin::run(pool, password, "SHOW STATS", admin::COMMAND_TIMEOUT).await.ok(),
        None => None,
    };
    PoolRows { pool: pool.name, pools, stats }
}

async fn metrics(State(state): State<ServerState>) -> Response {
    let Ok(_permit) = state.scrapes.try_acquire() else {
        return (StatusCode::TOO_MANY_REQUESTS, "a scrape is running\n").into_response();
    };
    let (read_write, read_only) =
        tokio::join!(rows_of(READ_WRITE, &state.admin_password), rows_of(READ_ONLY, &state.admin_password));
    let mut rows = vec![read_write];
    // Without the read-only pool its PgBouncer does not run: no series claims it is down.
    if read_only.pools.is_some() || std::path::Path::new(crate::api::pooler::RUN_DIRECTORY).join("ro").exists() {
        rows.push(read_only);
    }
    let counters = state.shared.lock().expect("not poisoned").counters.clone();
    let text = crate::instance::openmetrics::render(&families(&rows, &counters));
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

/// Compares without stopping at the first difference (no timing hint about the token).
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |differ, (a, b)| differ | (a ^ b)) == 0
}

/// The body of POST /pause.
#[derive(serde::Deserialize)]
struct PauseBody {
    /// The instance the operator switches over to.
    target: String,
}

async fn pause(State(state): State<ServerState>, headers: HeaderMap, body: Option<Json<PauseBody>>) -> Response {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or_default();
    if !same_secret(given.as_bytes(), state.token.as_bytes()) {
        return (StatusCode::UNAUTHORIZED, "a bearer token of Secret NAME-pooler is required\n").into_response();
    }
    let Some(Json(body)) = body else {
        return (StatusCode::BAD_REQUEST, "the body must be {\"target\": \"<instance>\"}\n").into_response();
    };
    if body.target.is_empty() || body.target.len() > 63 {
        return (StatusCode::BAD_REQUEST, "target must name an instance\n").into_response();
    }
    let (reply, answer) = oneshot::channel();
    if state.requests.try_send((body.target, reply)).is_err() {
        return (StatusCode::SERVICE_UNAVAILABLE, "busy\n").into_response();
    }
    match tokio::time::timeout(PAUSE_ANSWER_TIMEOUT, answer).await {
        Ok(Ok(Ok(()))) => (StatusCode::OK, "paused\n").into_response(),
        Ok(Ok(Err(error))) => (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response(),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "no answer from the agent\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn state() -> (ServerState, mpsc::Receiver<PauseRequest>) {
        let (requests, receiver) = mpsc::channel(4);
        let state = ServerState {
            shared: Arc::new(Mutex::new(Shared::default())),
            requests,
            token: "secret-token".into(),
            admin_password: "x".into(),
            scrapes: Arc::new(Semaphore::new(1)),
        };
        (state, receiver)
    }

    fn pause_request(token: Option<&str>, body: &str) -> axum::http::Request<Body> {
        let mut request = axum::http::Request::post("/pause").header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        request.body(Body::from(body.to_string())).unwrap()
    }

    #[tokio::test]
    async fn pause_needs_the_token_and_a_target_and_answers_what_the_agent_says() {
        let (state, mut receiver) = state();
        let app = control_router(state.clone());
        let near_miss = app.clone().oneshot(pause_request(Some("secret-tokeN"), r#"{"target":"db-1"}"#)).await;
        assert_eq!(near_miss.unwrap().status(), StatusCode::UNAUTHORIZED);
        let prefix = app.clone().oneshot(pause_request(Some("secret-toke"), r#"{"target":"db-1"}"#)).await;
        assert_eq!(prefix.unwrap().status(), StatusCode::UNAUTHORIZED);
        let empty = app.clone().oneshot(pause_request(Some(""), r#"{"target":"db-1"}"#)).await;
        assert_eq!(empty.unwrap().status(), StatusCode::UNAUTHORIZED);
        let refused = app.clone().oneshot(pause_request(Some("wrong"), r#"{"target":"db-1"}"#)).await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        let anonymous = app.clone().oneshot(pause_request(None, r#"{"target":"db-1"}"#)).await.unwrap();
        assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
        let malformed = app.clone().oneshot(pause_request(Some("secret-token"), "{")).await.unwrap();
        assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
        let oversized = format!(r#"{{"target":"{}"}}"#, "x".repeat(2000));
        let large = app.clone().oneshot(pause_request(Some("secret-token"), &oversized)).await.unwrap();
        assert_eq!(large.status(), StatusCode::PAYLOAD_TOO_LARGE);
        tokio::spawn(async move {
            let (target, reply) = receiver.recv().await.unwrap();
            assert_eq!(target, "db-1");
            reply.send(Ok(())).unwrap();
        });
        let paused = app.oneshot(pause_request(Some("secret-token"), r#"{"target":"db-1"}"#)).await.unwrap();
        assert_eq!(paused.status(), StatusCode::OK);
        let body = paused.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"paused\n");
    }

    #[tokio::test]
    async fn the_plain_server_has_no_pause() {
        let (state, mut receiver) = state();
        let plain = router(state).oneshot(pause_request(Some("secret-token"), r#"{"target":"db-1"}"#)).await;
        assert_eq!(plain.unwrap().status(), StatusCode::NOT_FOUND);
        assert!(receiver.try_recv().is_err(), "nothing reached the agent");
    }

    #[test]
    fn the_token_comparison_wants_every_byte() {
        assert!(same_secret(b"token", b"token"));
        assert!(!same_secret(b"token", b"tokem") && !same_secret(b"toke", b"token") && !same_secret(b"", b"token"));
    }

    #[tokio::test]
    async fn healthz_waits_for_the_first_pointing_and_a_server_login() {
        let (state, _receiver) = state();
        let app = router(state.clone());
        let request = || axum::http::Request::get("/healthz").body(Body::empty()).unwrap();
        assert_eq!(app.clone().oneshot(request()).await.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
        state.shared.lock().unwrap().pointed_once = true;
        assert_eq!(app.clone().oneshot(request()).await.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
        state.shared.lock().unwrap().server_path_proven = true;
        assert_eq!(app.oneshot(request()).await.unwrap().status(), StatusCode::OK);
    }
}
