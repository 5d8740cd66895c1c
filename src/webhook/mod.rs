//! The admission webhook server: `/validate` and `/mutate` over HTTPS, and the probe and
//! metrics endpoints on a separate plain-HTTP port so that kubelet probes never need TLS.

pub mod server;
pub mod tls;

use crate::api::{DatabaseService, GROUP};
use crate::metrics::{AdmissionLabels, DenialLabels, Metrics, WebhookLabels};
use crate::mutation::default_patch;
use crate::quantity::parse_bytes;
use crate::validation::{validate, ValidationSettings};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::DynamicObject;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Largest AdmissionReview accepted; the apiserver caps objects at about 3 MiB, so this is generous.
pub const BODY_LIMIT_BYTES: usize = 8 * 1024 * 1024;

/// State shared by the admission handlers.
#[derive(Clone)]
pub struct AdmissionState {
    /// Minimum storage size as written in the flag.
    pub min_storage_size: String,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
}

impl AdmissionState {
    /// State with the given minimum storage size; fails when it is not a quantity.
    pub fn new(min_storage_size: &str, metrics: Arc<Metrics>) -> Result<Self, crate::quantity::ParseQuantityError> {
        parse_bytes(min_storage_size)?;
        Ok(Self { min_storage_size: min_storage_size.to_string(), metrics })
    }

    fn settings(&self) -> ValidationSettings {
        ValidationSettings::new(&self.min_storage_size).expect("checked in AdmissionState::new")
    }
}

/// Routes of the HTTPS admission server.
pub fn admission_router(state: AdmissionState) -> Router {
    Router::new()
        .route("/validate", post(validate_handler))
        .route("/mutate", post(mutate_handler))
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        .with_state(state)
}

/// Readiness of the process, flipped by the server once it listens and on shutdown.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process ready or not ready.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    /// Whether the process is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Routes of the plain-HTTP probe and metrics server.
pub fn probe_router(metrics: Arc<Metrics>, readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = readiness.get();
                async move {
                    if ready {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let body = metrics.encode();
                async move { ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body) }
            }),
        )
}

/// A request the server cannot process: answered with 400 and a one-line reason.
fn bad_request(reason: impl Into<String>) -> Response {
    (StatusCode::BAD_REQUEST, format!("{}\n", reason.into())).into_response()
}

/// Parses the body into a request for a DatabaseService, or explains in one line why not.
fn parse_request(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, String> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(|error| format!("malformed AdmissionReview: {error}"))?;
    if review.types.kind != "AdmissionReview" || review.types.api_version != "admission.k8s.io/v1" {
        return Err(format!(
            "expected kind AdmissionReview in admission.k8s.io/v1, got kind {:?} in {:?}",
            review.types.kind, review.types.api_version
        ));
    }
    let request: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| "AdmissionReview has no request".to_string())?;
    if request.kind.group != GROUP || request.kind.kind != "DatabaseService" {
        return Err(format!(
            "this webhook only admits {GROUP} DatabaseService, got {}/{} {}",
            request.kind.group, request.kind.version, request.kind.kind
        ));
    }
    Ok(request)
}

/// A denial for an object whose fields have the wrong types (possible before schema validation,
/// in the mutating webhook): 422 like a schema error, not the apiserver's default 403.
fn malformed(response: AdmissionResponse, message: String) -> Decision {
    let mut response = response.deny(message);
    response.result.reason = "Invalid".into();
    response.result.code = 422;
    Decision { response, result: "denied", denial_reasons: vec!["MalformedObject"] }
}

/// Converts the raw object into the typed one; a malformed spec becomes a denial, not a 400.
fn typed(object: Option<&DynamicObject>) -> Result<Option<DatabaseService>, String> {
    object
        .map(|object| {
            let value = serde_json::to_value(object).map_err(|error| error.to_string())?;
            serde_json::from_value::<DatabaseService>(value).map_err(|error| format!("spec: Invalid value: {error}"))
        })
        .transpose()
}

fn operation_name(request: &AdmissionRequest<DynamicObject>) -> String {
    serde_json::to_value(&request.operation)
        .ok()
        .and_then(|value| value.as_str().map(str::to_string))
        .unwrap_or_else(|| "UNKNOWN".into())
}

struct Decision {
    response: AdmissionResponse,
    result: &'static str,
    denial_reasons: Vec<&'static str>,
}

fn respond(state: &AdmissionState, webhook: &str, started: Instant, operation: String, decision: Decision) -> Response {
    let metrics = &state.metrics;
    metrics
        .admission_requests
        .get_or_create(&AdmissionLabels { webhook: webhook.into(), operation, result: decision.result.into() })
        .inc();
    for reason in decision.denial_reasons {
        metrics.admission_denials.get_or_create(&DenialLabels { webhook: webhook.into(), reason: reason.into() }).inc();
    }
    metrics
        .admission_duration
        .get_or_create(&WebhookLabels { webhook: webhook.into() })
        .observe(started.elapsed().as_secs_f64());
    Json(decision.response.into_review()).into_response()
}

async fn validate_handler(State(state): State<AdmissionState>, body: Bytes) -> Response {
    let started = Instant::now();
    let request = match parse_request(&body) {
        Ok(request) => request,
        Err(reason) => return bad_request(reason),
    };
    let operation = operation_name(&request);
    let decision = decide_validation(&state, &request);
    respond(&state, "validate", started, operation, decision)
}

fn decide_validation(state: &AdmissionState, request: &AdmissionRequest<DynamicObject>) -> Decision {
    let response = AdmissionResponse::from(request);
    let (object, old) = match (typed(request.object.as_ref()), typed(request.old_object.as_ref())) {
        (Ok(object), Ok(old)) => (object, old),
        (Err(message), _) | (_, Err(message)) => {
            return malformed(response, message);
        }
    };
    // DELETE and CONNECT carry no new object: nothing to validate.
    let Some(object) = object else {
        return Decision { response, result: "allowed", denial_reasons: vec![] };
    };
    let outcome = validate(&object, old.as_ref(), &state.settings());
    let mut response = response;
    if !outcome.warnings.is_empty() {
        response.warnings = Some(outcome.warnings.clone());
    }
    if outcome.is_allowed() {
        Decision { response, result: "allowed", denial_reasons: vec![] }
    } else {
        let reasons = outcome.errors.iter().map(|error| error.reason()).collect();
        let mut response = response.deny(outcome.message());
        response.result.reason = "Invalid".into();
        response.result.code = 422;
        Decision { response, result: "denied", denial_reasons: reasons }
    }
}

async fn mutate_handler(State(state): State<AdmissionState>, body: Bytes) -> Response {
    let started = Instant::now();
    let request = match parse_request(&body) {
        Ok(request) => request,
        Err(reason) => return bad_request(reason),
    };
    let operation = operation_name(&request);
    let decision = decide_mutation(&request);
    respond(&state, "mutate", started, operation, decision)
}

fn decide_mutation(request: &AdmissionRequest<DynamicObject>) -> Decision {
    let response = AdmissionResponse::from(request);
    let (object, old) = match (typed(request.object.as_ref()), typed(request.old_object.as_ref())) {
        (Ok(Some(object)), Ok(old)) => (object, old),
        (Ok(None), _) => return Decision { response, result: "allowed", denial_reasons: vec![] },
        (Err(message), _) | (_, Err(message)) => {
            return malformed(response, message);
        }
    };
    match default_patch(&object, old.as_ref()) {
        None => Decision { response, result: "allowed", denial_reasons: vec![] },
        Some(patch) => match response.clone().with_patch(patch) {
            Ok(response) => Decision { response, result: "patched", denial_reasons: vec![] },
            Err(error) => Decision {
                response: response.deny(format!("could not serialize the patch: {error}")),
                result: "error",
                denial_reasons: vec!["InternalError"],
            },
        },
    }
}
