//! The admission webhook server: `/validate` and `/mutate` over HTTPS, and the probe and
//! metrics endpoints on a separate plain-HTTP port so that kubelet probes never need TLS.

use crate::admission::connections::ConnectionMarks;
pub use crate::admission::limits::{RequestLimits, BODY_LIMIT_BYTES};
use crate::admission::mutation::default_patch;
use crate::admission::review::{parse_request, Admission, Operation, Refusal};
use crate::admission::validation::{validate, ValidationSettings};
use crate::admission::{review, secret_access};
use crate::metrics::{AdmissionLabels, DenialLabels, Metrics, WebhookLabels};
use crate::quantity::parse_bytes;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::OwnedSemaphorePermit;

/// State shared by the admission handlers.
#[derive(Clone)]
pub struct AdmissionState {
    /// Minimum storage size as written in the flag.
    pub min_storage_size: String,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// Size, time and concurrency bounds.
    pub limits: RequestLimits,
    /// Image prefixes `spec.image` and `spec.pooler.image` must start with (empty: any).
    pub allowed_image_prefixes: Vec<String>,
    /// Whether `spec.bootstrap.import.roles: true` is allowed.
    pub allow_import_with_source_roles: bool,
    /// Asks whether the requesting user may read the Secrets a DatabaseService names; without it
    /// (a webhook without Kubernetes access) nothing is asked.
    ///
    /// This is the webhook's only call out, and it is a question, not a read: the review's
    /// `userInfo` is believed because only the apiserver's reviews have any effect (it stores the
    /// object only on its own, authenticated request); a forged review gets an answer nobody acts
    /// on. Nothing else admission does reads a Secret or contacts a store (see the manual's
    /// security page, docs/manual/src/security.md): admission has no side effects but its answer.
    pub secret_access: Option<Arc<dyn secret_access::SecretAccessReviewer>>,
}

impl AdmissionState {
    /// State with the given minimum storage size and the default limits; fails when it is not a quantity.
    pub fn new(min_storage_size: &str, metrics: Arc<Metrics>) -> Result<Self, crate::quantity::ParseQuantityError> {
        parse_bytes(min_storage_size)?;
        Ok(Self {
            min_storage_size: min_storage_size.to_string(),
            metrics,
            limits: RequestLimits::default(),
            allowed_image_prefixes: Vec::new(),
            allow_import_with_source_roles: false,
            secret_access: None,
        })
    }

    /// The same state allowing `spec.bootstrap.import.roles: true` or not.
    pub fn with_import_with_source_roles(self, allowed: bool) -> Self {
        Self { allow_import_with_source_roles: allowed, ..self }
    }

    /// The same state allowing only images that start with one of `prefixes` (none: any).
    pub fn with_allowed_image_prefixes(self, prefixes: Vec<String>) -> Self {
        Self { allowed_image_prefixes: prefixes, ..self }
    }

    /// The same state asking `reviewer` whether a requester may read the Secrets they name.
    pub fn with_secret_access(self, reviewer: Arc<dyn secret_access::SecretAccessReviewer>) -> Self {
        Self { secret_access: Some(reviewer), ..self }
    }

    /// The same state with other limits.
    pub fn with_limits(self, limits: RequestLimits) -> Self {
        Self { limits, ..self }
    }

    fn settings(&self) -> ValidationSettings {
        ValidationSettings::new(&self.min_storage_size)
            .expect("checked in AdmissionState::new")
            .with_allowed_image_prefixes(self.allowed_image_prefixes.clone())
            .with_import_with_source_roles(self.allow_import_with_source_roles)
    }
}

/// Routes of the HTTPS admission server. Each handler reads its own body within the limits of
/// the state (no axum body limit layer: the early 413 and the budget need the raw body).
pub fn admission_router(state: AdmissionState) -> Router {
    Router::new().route("/validate", post(validate_handler)).route("/mutate", post(mutate_handler)).with_state(state)
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

/// A request the server cannot process: answered with a status and a one-line reason (the
/// apiserver logs the body of a failed webhook call).
struct Rejection(StatusCode, String);

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        (self.0, format!("{}\n", self.1)).into_response()
    }
}

fn plain(status: StatusCode, reason: impl Into<String>) -> Rejection {
    Rejection(status, reason.into())
}

fn too_large(limit: usize) -> Rejection {
    plain(StatusCode::PAYLOAD_TOO_LARGE, format!("request body is larger than {limit} bytes"))
}

/// The declared body length; an unparsable header is a 400 (hyper rejects most of them first).
fn content_length(headers: &HeaderMap) -> Result<Option<usize>, Rejection> {
    let Some(value) = headers.get(header::CONTENT_LENGTH) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .map(|length| Some(usize::try_from(length).unwrap_or(usize::MAX)))
        .ok_or_else(|| plain(StatusCode::BAD_REQUEST, "invalid Content-Length"))
}

/// Reads the body into one buffer within the size limit and the shared body budget.
///
/// Frames are copied and dropped at once: holding hyper's frames would pin a read-buffer
/// allocation per frame (a body sent one byte per TLS record held ~4 KB per byte).
async fn read_body(
    body: Body,
    declared: Option<usize>,
    limits: &RequestLimits,
) -> Result<(Vec<u8>, Option<OwnedSemaphorePermit>), Rejection> {
    let mut body = body;
    let mut buffer: Vec<u8> = Vec::new();
    let mut reserved: Option<OwnedSemaphorePermit> = None;
    let reserve = |buffer: &mut Vec<u8>, needed: usize| {
        let wanted = if buffer.capacity() >= needed {
            None
        } else {
            // Grow to the declared length at once, otherwise by doubling, never past the limit.
            let target = declared.unwrap_or(0).max(needed).max(buffer.capacity() * 2).max(4096);
            Some(target.min(limits.body_limit))
        };
        wanted.map(|capacity| capacity - buffer.capacity())
    };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| plain(StatusCode::BAD_REQUEST, format!("cannot read the body: {error}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let needed = buffer.len() + data.len();
        if needed > limits.body_limit {
            return Err(too_large(limits.body_limit));
        }
        if let Some(extra) = reserve(&mut buffer, needed) {
            let permit = limits.reserve_body(extra).await;
            match &mut reserved {
                Some(held) => held.merge(permit),
                None => reserved = Some(permit),
            }
            buffer.reserve_exact(extra);
        }
        buffer.extend_from_slice(&data);
    }
    Ok((buffer, reserved))
}

/// A denial for an object whose fields have the wrong types (possible before schema validation,
/// in the mutating webhook): 422 like a schema error, not the apiserver's default 403.
fn malformed(uid: &str, message: String) -> Decision {
    Decision {
        response: review::Response::deny(uid, "Invalid", 422, message),
        result: "denied",
        denial_reasons: vec!["MalformedObject"],
    }
}

struct Decision {
    response: review::Response,
    result: &'static str,
    denial_reasons: Vec<&'static str>,
}

impl Decision {
    fn allow(uid: &str) -> Self {
        Self { response: review::Response::allow(uid), result: "allowed", denial_reasons: vec![] }
    }
}

fn record(state: &AdmissionState, webhook: &str, started: Instant, operation: &str, decision: &Decision) {
    let metrics = &state.metrics;
    metrics
        .admission_requests
        .get_or_create(&AdmissionLabels {
            webhook: webhook.into(),
            operation: operation.into(),
            result: decision.result.into(),
        })
        .inc();
    for reason in &decision.denial_reasons {
        metrics
            .admission_denials
            .get_or_create(&DenialLabels { webhook: webhook.into(), reason: (*reason).into() })
            .inc();
    }
    metrics
        .admission_duration
        .get_or_create(&WebhookLabels { webhook: webhook.into() })
        .observe(started.elapsed().as_secs_f64());
}

type Decide = fn(&AdmissionState, &str, &Admission) -> Decision;

/// Reads, parses and decides one review within the request's size, time and concurrency bounds.
async fn handle(state: AdmissionState, webhook: &'static str, request: Request, decide: Decide) -> Response {
    let started = Instant::now();
    let declared = match content_length(request.headers()) {
        Ok(declared) => declared,
        Err(rejection) => return rejection.into_response(),
    };
    // Refused before a byte of the body is read.
    if declared.is_some_and(|length| length > state.limits.body_limit) {
        return too_large(state.limits.body_limit).into_response();
    }
    let marks = request.extensions().get::<ConnectionMarks>().cloned();
    let work = async {
        let (body, _budget) = read_body(request.into_body(), declared, &state.limits).await?;
        if let Some(marks) = &marks {
            marks.body_read();
        }
        let _slot = state.limits.decision_slot().await;
        let parsed = parse_request(&body).map_err(|reason| plain(StatusCode::BAD_REQUEST, reason))?;
        let (operation, decision) = match parsed.admission() {
            Ok(admission) => {
                let mut decision = decide(&state, &parsed.uid, &admission);
                if webhook == "validate" {
                    check_secret_access(&state, &admission, &mut decision).await;
                }
                (admission.operation.as_str(), decision)
            }
            Err(Refusal::Malformed(message)) => ("UNKNOWN", malformed(&parsed.uid, message)),
            Err(Refusal::NotUnderstood(message)) => (
                "UNKNOWN",
                Decision {
                    response: review::Response::deny(&parsed.uid, "BadRequest", 400, message),
                    result: "denied",
                    denial_reasons: vec!["NotUnderstood"],
                },
            ),
        };
        record(&state, webhook, started, operation, &decision);
        Ok::<_, Rejection>(
            ([(header::CONTENT_TYPE, "application/json")], decision.response.into_review_json()).into_response(),
        )
    };
    match tokio::time::timeout(state.limits.request_timeout, work).await {
        Ok(Ok(response)) => response,
        Ok(Err(rejection)) => rejection.into_response(),
        Err(_) => {
            plain(StatusCode::REQUEST_TIMEOUT, "the request was not received and decided in time").into_response()
        }
    }
}

/// The Secrets an allowed CREATE or UPDATE newly names must be readable by its requester
/// ([`secret_access`]); otherwise a denial (403).
async fn check_secret_access(state: &AdmissionState, admission: &Admission, decision: &mut Decision) {
    let (Some(reviewer), Some(object)) = (&state.secret_access, admission.object.as_ref()) else { return };
    if !decision.response.allowed {
        return;
    }
    let references = secret_access::to_review(&object.spec, admission.old_object.as_ref().map(|old| &old.spec));
    if references.is_empty() {
        return;
    }
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let errors = secret_access::check(reviewer.as_ref(), &admission.user, &namespace, &references).await;
    if errors.is_empty() {
        return;
    }
    let outcome = crate::admission::validation::ValidationOutcome { errors, warnings: Vec::new() };
    let warnings = std::mem::take(&mut decision.response.warnings);
    decision.response = review::Response::deny(&decision.response.uid, "Forbidden", 403, outcome.message());
    decision.response.warnings = warnings;
    decision.result = "denied";
    decision.denial_reasons = vec!["FieldValueForbidden"];
}

async fn validate_handler(State(state): State<AdmissionState>, request: Request) -> Response {
    handle(state, "validate", request, decide_validation).await
}

async fn mutate_handler(State(state): State<AdmissionState>, request: Request) -> Response {
    handle(state, "mutate", request, decide_mutation).await
}

fn decide_validation(state: &AdmissionState, uid: &str, admission: &Admission) -> Decision {
    // DELETE carries no new object: nothing to validate.
    let Some(object) = admission.object.as_ref() else {
        return Decision::allow(uid);
    };
    let old = match admission.operation {
        Operation::Update => admission.old_object.as_ref(),
        _ => None,
    };
    let outcome = validate(object, old, &state.settings());
    if outcome.is_allowed() {
        let mut decision = Decision::allow(uid);
        decision.response.warnings = outcome.warnings;
        return decision;
    }
    let reasons = outcome.errors.iter().map(|error| error.reason()).collect();
    let mut response = review::Response::deny(uid, "Invalid", 422, outcome.message());
    response.warnings = outcome.warnings;
    Decision { response, result: "denied", denial_reasons: reasons }
}

fn decide_mutation(_state: &AdmissionState, uid: &str, admission: &Admission) -> Decision {
    let Some(object) = admission.object.as_ref() else {
        return Decision::allow(uid);
    };
    let old = match admission.operation {
        Operation::Update => admission.old_object.as_ref(),
        _ => None,
    };
    match default_patch(object, old) {
        None => Decision::allow(uid),
        Some(patch) => Decision {
            response: review::Response::allow(uid).with_patch(&patch),
            result: "patched",
            denial_reasons: vec![],
        },
    }
}
