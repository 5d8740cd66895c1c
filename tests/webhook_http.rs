//! The admission and probe routers over HTTP, in process (tower `oneshot`, no socket, no TLS):
//! what the apiserver and the kubelet see.

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use base64::Engine;
use dbservice_operator::admission::webhook::{
    admission_router, probe_router, AdmissionState, Readiness, RequestLimits, BODY_LIMIT_BYTES,
};
use dbservice_operator::metrics::Metrics;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

const REQUEST_UID: &str = "705ab4f5-6393-11e8-b7cc-42010a800002";

fn router(metrics: &Arc<Metrics>) -> Router {
    admission_router(AdmissionState::new("1Gi", metrics.clone()).expect("1Gi is a quantity"))
}

/// A DatabaseService as the apiserver sends it; `spec` replaces the whole spec.
fn database(spec: Value) -> Value {
    json!({
        "apiVersion": "dbservice.dev/v1",
        "kind": "DatabaseService",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "0b8e4c2d-6f1a-4e3b-9c5d-7a8b9c0d1e2f"},
        "spec": spec,
    })
}

fn valid_spec() -> Value {
    json!({"version": "16.4", "storageSize": "10Gi", "databaseName": "app", "username": "app_user"})
}

fn complete_spec() -> Value {
    json!({
        "version": "16.4", "storageSize": "10Gi", "databaseName": "app", "username": "app_user",
        "replicas": 1, "image": "postgres:16.4", "deletionPolicy": "Retain",
    })
}

/// An AdmissionReview (admission.k8s.io/v1) request for a DatabaseService.
fn review(operation: &str, object: Option<Value>, old_object: Option<Value>) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": REQUEST_UID,
            "kind": {"group": "dbservice.dev", "version": "v1", "kind": "DatabaseService"},
            "resource": {"group": "dbservice.dev", "version": "v1", "resource": "databaseservices"},
            "requestKind": {"group": "dbservice.dev", "version": "v1", "kind": "DatabaseService"},
            "requestResource": {"group": "dbservice.dev", "version": "v1", "resource": "databaseservices"},
            "name": "orders",
            "namespace": "shop",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old_object,
            "dryRun": false,
        }
    })
}

async fn post(router: Router, path: &str, body: impl Into<Body>) -> (StatusCode, Vec<u8>) {
    let request = Request::post(path).header(header::CONTENT_TYPE, "application/json").body(body.into()).unwrap();
    let response = router.oneshot(request).await.expect("the router is infallible");
    let status = response.status();
    let bytes = response.into_body().collect().await.expect("the body is readable").to_bytes().to_vec();
    (status, bytes)
}

/// POSTs a review that must be answered with 200 and returns its `response`.
async fn admit(router: Router, path: &str, review: &Value) -> Value {
    let (status, body) = post(router, path, serde_json::to_vec(review).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "body: {}", String::from_utf8_lossy(&body));
    let answer: Value = serde_json::from_slice(&body).expect("the answer is JSON");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1", "{answer}");
    assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
    answer["response"].clone()
}

async fn get(router: Router, path: &str) -> (StatusCode, Option<String>, String) {
    let response = router.oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).map(|value| value.to_str().unwrap().to_string());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, content_type, String::from_utf8(body.to_vec()).unwrap())
}

/// The JSONPatch of a mutate response. `patch` is Go's []byte, whose canonical JSON form is a
/// base64 string (what the Go reference webhook sends; an array of numbers is ~2.6x larger).
fn decoded_patch(response: &Value) -> Value {
    let bytes = match &response["patch"] {
        Value::String(encoded) => base64::engine::general_purpose::STANDARD.decode(encoded).expect("base64 patch"),
        other => panic!("no base64 patch in {response}: {other}"),
    };
    serde_json::from_slice(&bytes).expect("the patch is JSON")
}

async fn bad_request_body(path: &str, body: Vec<u8>) -> String {
    let metrics = Arc::new(Metrics::new());
    let (status, body) = post(router(&metrics), path, body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "body: {}", String::from_utf8_lossy(&body));
    let text = String::from_utf8(body).expect("UTF-8 reason");
    // One line: kube-apiserver logs the body of a failed webhook call.
    assert!(text.ends_with('\n') && !text.trim_end().contains('\n'), "not one line: {text:?}");
    text
}

#[tokio::test]
async fn valid_create_is_allowed_and_echoes_the_uid() {
    let metrics = Arc::new(Metrics::new());
    let response = admit(router(&metrics), "/validate", &review("CREATE", Some(database(valid_spec())), None)).await;
    assert_eq!(response["uid"], REQUEST_UID);
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("warnings").is_none(), "no warning expected: {response}");
}

#[tokio::test]
async fn invalid_create_is_denied_with_422_and_every_field_error() {
    let metrics = Arc::new(Metrics::new());
    let spec = json!({"version": "latest", "storageSize": "100Mi", "databaseName": "app", "username": "postgres"});
    let response = admit(router(&metrics), "/validate", &review("CREATE", Some(database(spec)), None)).await;
    assert_eq!(response["uid"], REQUEST_UID);
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 422, "{response}");
    assert_eq!(response["status"]["reason"], "Invalid", "{response}");
    let message = response["status"]["message"].as_str().expect("a message");
    for expected in [
        "spec.version: Invalid value: \"latest\"",
        "spec.storageSize: Invalid value: \"100Mi\": must be at least 1Gi",
        "spec.username: Forbidden: \"postgres\" is reserved",
    ] {
        assert!(message.contains(expected), "{expected:?} missing from {message:?}");
    }
}

#[tokio::test]
async fn invalid_update_is_denied_with_the_update_rule() {
    let metrics = Arc::new(Metrics::new());
    let old = database(complete_spec());
    let mut new_spec = complete_spec();
    new_spec["storageSize"] = json!("5Gi");
    let response = admit(router(&metrics), "/validate", &review("UPDATE", Some(database(new_spec)), Some(old))).await;
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 422);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("may grow but never shrink"), "{message}");
}

#[tokio::test]
async fn a_scale_down_past_the_primary_named_in_the_old_status_is_denied() {
    let metrics = Arc::new(Metrics::new());
    let mut old_spec = complete_spec();
    old_spec["replicas"] = json!(3);
    old_spec["resources"] = json!({"requests": {"cpu": "100m"}});
    let mut old = database(old_spec.clone());
    old["status"] = json!({"currentPrimary": "orders-2", "targetPrimary": "orders-2", "timeline": 3,
                           "instances": [{"name": "orders-2", "role": "primary", "ready": true}], "phase": "Running"});
    let mut new_spec = old_spec;
    new_spec["replicas"] = json!(2);
    let response =
        admit(router(&metrics), "/validate", &review("UPDATE", Some(database(new_spec.clone())), Some(old.clone())))
            .await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("would remove orders-2, the primary"), "{message}");
    // With the primary on a kept ordinal, the same scale-down is allowed.
    old["status"]["currentPrimary"] = json!("orders-1");
    old["status"]["targetPrimary"] = json!("orders-1");
    let response = admit(router(&metrics), "/validate", &review("UPDATE", Some(database(new_spec)), Some(old))).await;
    assert_eq!(response["allowed"], true, "{response}");
}

#[tokio::test]
async fn warnings_are_returned_with_an_allowed_answer() {
    let metrics = Arc::new(Metrics::new());
    let mut spec = complete_spec();
    spec["replicas"] = json!(3);
    spec["deletionPolicy"] = json!("Delete");
    let response = admit(router(&metrics), "/validate", &review("CREATE", Some(database(spec)), None)).await;
    assert_eq!(response["allowed"], true, "{response}");
    let warnings: Vec<&str> =
        response["warnings"].as_array().expect("warnings").iter().map(|warning| warning.as_str().unwrap()).collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains("replicas > 1 without resources"), "{warnings:?}");
    assert!(warnings[1].contains("deletionPolicy: Delete"), "{warnings:?}");
}

#[tokio::test]
async fn malformed_json_is_a_400_with_a_one_line_reason() {
    let text = bad_request_body("/validate", b"{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": ".to_vec()).await;
    assert!(text.starts_with("malformed AdmissionReview"), "{text:?}");
    let text = bad_request_body("/mutate", b"not json at all".to_vec()).await;
    assert!(text.starts_with("malformed AdmissionReview"), "{text:?}");
}

/// A review for anything but a DatabaseService is denied with its uid (the webhook configuration
/// should never send one; if it does, nothing the webhook does not understand gets through).
#[tokio::test]
async fn review_of_a_pod_is_denied_as_not_understood() {
    let mut pod_review =
        review("CREATE", Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})), None);
    pod_review["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
    pod_review["request"]["resource"] = json!({"group": "", "version": "v1", "resource": "pods"});
    for path in ["/validate", "/mutate"] {
        let response = admit(router(&Arc::new(Metrics::new())), path, &pod_review).await;
        assert_eq!(response["uid"], REQUEST_UID, "{path}");
        assert_eq!(response["allowed"], false, "{path}: {response}");
        assert_eq!(response["status"]["code"], 400, "{path}: {response}");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(message.contains("only admits dbservice.dev/v1 DatabaseService"), "{path}: {message}");
        assert!(message.contains("Pod"), "{path}: {message}");
    }
}

/// Every request the webhook does not understand is denied, never allowed by default.
#[tokio::test]
async fn requests_the_webhook_does_not_understand_are_denied() {
    let object = database(complete_spec());
    let mut other_resource = review("CREATE", Some(object.clone()), None);
    other_resource["request"]["resource"]["resource"] = json!("secrets");
    let mut sub_resource = review("UPDATE", Some(object.clone()), Some(object.clone()));
    sub_resource["request"]["subResource"] = json!("status");
    let mut other_version = review("CREATE", Some(object.clone()), None);
    other_version["request"]["kind"]["version"] = json!("v2");
    let cases = [
        ("CREATE without an object", review("CREATE", None, None), "CREATE without an object"),
        ("UPDATE without an object", review("UPDATE", None, Some(object.clone())), "UPDATE without an object"),
        ("UPDATE without an old object", review("UPDATE", Some(object.clone()), None), "without an oldObject"),
        ("CONNECT", review("CONNECT", Some(object.clone()), None), "operation \"CONNECT\""),
        ("an unknown operation", review("PURGE", Some(object.clone()), None), "operation \"PURGE\""),
        ("another resource", other_resource, "secrets.dbservice.dev"),
        ("a subresource", sub_resource, "subresource \"status\""),
        ("another version", other_version, "dbservice.dev/v2"),
    ];
    for (name, case, expected) in cases {
        for path in ["/validate", "/mutate"] {
            let response = admit(router(&Arc::new(Metrics::new())), path, &case).await;
            assert_eq!(response["allowed"], false, "{name} on {path}: {response}");
            assert_eq!(response["status"]["code"], 400, "{name} on {path}: {response}");
            let message = response["status"]["message"].as_str().unwrap();
            assert!(message.contains(expected), "{name} on {path}: {message}");
        }
    }
}

/// An attacker-chosen operation name must not become a metrics label (unbounded series).
#[tokio::test]
async fn unknown_operations_are_counted_under_one_label() {
    let metrics = Arc::new(Metrics::new());
    for operation in ["PURGE-1", "PURGE-2", "PURGE-3"] {
        admit(router(&metrics), "/validate", &review(operation, Some(database(valid_spec())), None)).await;
    }
    let text = metrics.encode();
    assert!(!text.contains("PURGE"), "{text}");
    assert!(text.contains("operation=\"UNKNOWN\",result=\"denied\"} 3"), "{text}");
}

#[tokio::test]
async fn review_without_a_request_is_a_400() {
    let empty = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
    let text = bad_request_body("/validate", serde_json::to_vec(&empty).unwrap()).await;
    assert!(text.contains("no request"), "{text:?}");
}

#[tokio::test]
async fn review_of_another_api_version_is_a_400() {
    let mut old_version = review("CREATE", Some(database(valid_spec())), None);
    old_version["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let text = bad_request_body("/validate", serde_json::to_vec(&old_version).unwrap()).await;
    assert!(text.contains("admission.k8s.io/v1beta1"), "{text:?}");
    let mut wrong_kind = review("CREATE", Some(database(valid_spec())), None);
    wrong_kind["kind"] = json!("TokenReview");
    let text = bad_request_body("/validate", serde_json::to_vec(&wrong_kind).unwrap()).await;
    assert!(text.contains("TokenReview"), "{text:?}");
}

#[tokio::test]
async fn body_over_1_mib_is_rejected_with_413() {
    assert_eq!(BODY_LIMIT_BYTES, 1024 * 1024);
    let metrics = Arc::new(Metrics::new());
    let oversized = vec![b' '; BODY_LIMIT_BYTES + 1];
    for path in ["/validate", "/mutate"] {
        // Without Content-Length (chunked): refused once the limit is crossed.
        let stream = futures::stream::iter(
            oversized.chunks(64 * 1024).map(|chunk| Ok::<_, std::io::Error>(chunk.to_vec())).collect::<Vec<_>>(),
        );
        let (status, _) = post(router(&metrics), path, Body::from_stream(stream)).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{path}");
        let (status, _) = post(router(&metrics), path, oversized.clone()).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{path}");
    }
}

/// A declared 20 MiB body is refused from its Content-Length, before any byte of it arrives:
/// the body here never sends anything, so only an early answer can pass.
#[tokio::test]
async fn declared_oversized_body_is_refused_before_it_is_read() {
    let metrics = Arc::new(Metrics::new());
    let never = futures::stream::pending::<Result<Vec<u8>, std::io::Error>>();
    let request = Request::post("/validate")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, 20 * 1024 * 1024)
        .body(Body::from_stream(never))
        .unwrap();
    let response = tokio::time::timeout(std::time::Duration::from_secs(5), router(&metrics).oneshot(request))
        .await
        .expect("answered without waiting for the body")
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

/// A body that stops arriving is answered 408 after the request timeout instead of being held.
#[tokio::test]
async fn stalled_body_is_answered_408_after_the_request_timeout() {
    let metrics = Arc::new(Metrics::new());
    let mut limits = RequestLimits::new(4);
    limits.request_timeout = std::time::Duration::from_millis(300);
    let router = admission_router(AdmissionState::new("1Gi", metrics).unwrap().with_limits(limits));
    let first = futures::stream::iter([Ok::<_, std::io::Error>(b"{\"apiVersion\":".to_vec())]);
    let stalled = first.chain(futures::stream::pending());
    let started = std::time::Instant::now();
    let (status, _) = post(router, "/validate", Body::from_stream(stalled)).await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "took {:?}", started.elapsed());
}

/// A body arriving one byte per frame (one byte per TLS record) is reassembled correctly.
#[tokio::test]
async fn body_sent_one_byte_per_frame_is_answered() {
    let metrics = Arc::new(Metrics::new());
    let bytes = serde_json::to_vec(&review("CREATE", Some(database(valid_spec())), None)).unwrap();
    let frames = futures::stream::iter(bytes.into_iter().map(|byte| Ok::<_, std::io::Error>(vec![byte])));
    let (status, body) = post(router(&metrics), "/validate", Body::from_stream(frames)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

/// The largest review a real object produces gets through the body limit.
#[tokio::test]
async fn review_of_a_900_kib_object_is_answered() {
    let metrics = Arc::new(Metrics::new());
    let mut object = database(complete_spec());
    object["metadata"]["annotations"] = json!({"example.com/blob": "x".repeat(900 * 1024)});
    let response = admit(router(&metrics), "/validate", &review("CREATE", Some(object), None)).await;
    assert_eq!(response["allowed"], true, "{}", response["status"]);
}

/// A spec the types cannot represent is the user's mistake: a denial they can read, not a 400
/// (which the apiserver would report as a webhook failure).
#[tokio::test]
async fn spec_with_wrong_types_is_denied_not_rejected() {
    let metrics = Arc::new(Metrics::new());
    let mut spec = valid_spec();
    spec["replicas"] = json!("three");
    for path in ["/validate", "/mutate"] {
        let response = admit(router(&metrics), path, &review("CREATE", Some(database(spec.clone())), None)).await;
        assert_eq!(response["uid"], REQUEST_UID, "{path}");
        assert_eq!(response["allowed"], false, "{path}: {response}");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(message.contains("three"), "{path}: {message}");
    }
}

#[tokio::test]
async fn mutate_returns_a_json_patch_with_the_defaults() {
    let metrics = Arc::new(Metrics::new());
    let response = admit(router(&metrics), "/mutate", &review("CREATE", Some(database(valid_spec())), None)).await;
    assert_eq!(response["uid"], REQUEST_UID);
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(response["patchType"], "JSONPatch", "{response}");
    assert_eq!(
        decoded_patch(&response),
        json!([
            {"op": "add", "path": "/spec/replicas", "value": 1},
            {"op": "add", "path": "/spec/deletionPolicy", "value": "Retain"},
            {"op": "add", "path": "/spec/image", "value": "postgres:16.4"},
            {"op": "add", "path": "/metadata/finalizers", "value": ["dbservice.dev/cleanup"]},
        ])
    );
}

/// The patch must apply to the object exactly as sent, even one without `metadata` (the
/// mutating webhook runs before schema validation): a valid JSON Patch adds the parent first.
#[tokio::test]
async fn mutate_patch_applies_to_an_object_without_metadata() {
    let metrics = Arc::new(Metrics::new());
    let object = json!({"apiVersion": "dbservice.dev/v1", "kind": "DatabaseService", "spec": complete_spec()});
    let response = admit(router(&metrics), "/mutate", &review("CREATE", Some(object.clone()), None)).await;
    assert_eq!(response["patchType"], "JSONPatch", "{response}");
    let patch: json_patch::Patch = serde_json::from_value(decoded_patch(&response)).unwrap();
    let mut patched = object;
    json_patch::patch(&mut patched, &patch).expect("the patch applies to the object as sent");
    assert_eq!(patched["metadata"]["finalizers"], json!(["dbservice.dev/cleanup"]), "{patched}");
}

#[tokio::test]
async fn mutate_of_a_complete_object_returns_no_patch() {
    let metrics = Arc::new(Metrics::new());
    let mut object = database(complete_spec());
    object["metadata"]["finalizers"] = json!(["dbservice.dev/cleanup"]);
    let response = admit(router(&metrics), "/mutate", &review("CREATE", Some(object), None)).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("patch").is_none(), "{response}");
    assert!(response.get("patchType").is_none(), "{response}");
}

/// dryRun requests (kubectl apply --dry-run=server) get the same answers; the webhooks have no
/// side effects (sideEffects: None) so nothing changes.
#[tokio::test]
async fn dry_run_requests_are_answered_normally() {
    let metrics = Arc::new(Metrics::new());
    let mut valid = review("CREATE", Some(database(valid_spec())), None);
    valid["request"]["dryRun"] = json!(true);
    assert_eq!(admit(router(&metrics), "/validate", &valid).await["allowed"], true);
    let mutated = admit(router(&metrics), "/mutate", &valid).await;
    assert_eq!(mutated["patchType"], "JSONPatch", "{mutated}");
    let mut invalid = review(
        "CREATE",
        Some(database(json!({"version": "12", "storageSize": "10Gi", "databaseName": "app", "username": "app"}))),
        None,
    );
    invalid["request"]["dryRun"] = json!(true);
    let denied = admit(router(&metrics), "/validate", &invalid).await;
    assert_eq!(denied["allowed"], false, "{denied}");
    assert_eq!(denied["status"]["code"], 422);
}

/// DELETE carries only the old object, which may be invalid by today's rules: never blocked.
#[tokio::test]
async fn delete_is_allowed() {
    let metrics = Arc::new(Metrics::new());
    let stored =
        database(json!({"version": "12", "storageSize": "100Mi", "databaseName": "app", "username": "postgres"}));
    for path in ["/validate", "/mutate"] {
        let response = admit(router(&metrics), path, &review("DELETE", None, Some(stored.clone()))).await;
        assert_eq!(response["uid"], REQUEST_UID, "{path}");
        assert_eq!(response["allowed"], true, "{path}: {response}");
        assert!(response.get("patch").is_none(), "{path}: {response}");
    }
}

#[tokio::test]
async fn healthz_answers_200() {
    let (status, _, body) = get(probe_router(Arc::new(Metrics::new()), Readiness::default()), "/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "ok");
}

#[tokio::test]
async fn readyz_is_503_until_ready_then_200() {
    let metrics = Arc::new(Metrics::new());
    let readiness = Readiness::default();
    let probes = probe_router(metrics, readiness.clone());
    let (status, _, _) = get(probes.clone(), "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    readiness.set(true);
    let (status, _, _) = get(probes.clone(), "/readyz").await;
    assert_eq!(status, StatusCode::OK);
    // On shutdown the server flips readiness back so the Service stops routing to it.
    readiness.set(false);
    let (status, _, _) = get(probes, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn metrics_count_requests_by_webhook_operation_result_and_denials_by_reason() {
    let metrics = Arc::new(Metrics::new());
    let probes = probe_router(metrics.clone(), Readiness::default());
    let (_, _, before) = get(probes.clone(), "/metrics").await;
    assert!(!before.contains("dbservice_admission_requests_total{"), "counted before any request:\n{before}");

    admit(router(&metrics), "/validate", &review("CREATE", Some(database(valid_spec())), None)).await;
    admit(router(&metrics), "/mutate", &review("CREATE", Some(database(valid_spec())), None)).await;
    // Two invalid values (version, storageSize) and one forbidden value (username).
    let invalid = json!({"version": "latest", "storageSize": "100Mi", "databaseName": "app", "username": "postgres"});
    admit(router(&metrics), "/validate", &review("CREATE", Some(database(invalid)), None)).await;

    let (status, content_type, text) = get(probes, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.unwrap_or_default().starts_with("application/openmetrics-text"));
    for expected in [
        "dbservice_admission_requests_total{webhook=\"validate\",operation=\"CREATE\",result=\"allowed\"} 1",
        "dbservice_admission_requests_total{webhook=\"validate\",operation=\"CREATE\",result=\"denied\"} 1",
        "dbservice_admission_requests_total{webhook=\"mutate\",operation=\"CREATE\",result=\"patched\"} 1",
        "dbservice_admission_denials_total{webhook=\"validate\",reason=\"FieldValueInvalid\"} 2",
        "dbservice_admission_denials_total{webhook=\"validate\",reason=\"FieldValueForbidden\"} 1",
        "dbservice_admission_duration_seconds_count{webhook=\"validate\"} 2",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
    }
}

fn recovering_spec(time: &str, endpoint: &str) -> Value {
    let mut spec = valid_spec();
    spec["bootstrap"] = json!({"recovery": {
        "source": {"endpoint": endpoint, "bucket": "backups", "serverName": "orders",
                   "credentialsSecret": {"name": "s3"}},
        "target": {"time": time},
    }});
    spec
}

/// Admission has no side effects but its answer: a recovering CREATE naming a store endpoint is
/// decided without a connection to it (the controller checks the target, issue 37).
#[tokio::test]
async fn a_recovering_create_is_decided_without_contacting_its_store() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let reviewer = Arc::new(Reviewer { allowed: true, asked: Default::default() });
    let state = AdmissionState::new("1Gi", Arc::new(Metrics::new())).unwrap().with_secret_access(reviewer.clone());
    let request = review("CREATE", Some(database(recovering_spec("2026-12-01T01:30:00Z", &endpoint))), None);
    let response = admit(admission_router(state), "/validate", &request).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("warnings").is_none(), "nothing was checked against a store: {response}");
    let accepted = tokio::time::timeout(std::time::Duration::from_millis(500), listener.accept()).await;
    assert!(accepted.is_err(), "admission connected to the store endpoint the review named");
}

/// Answers every access review with `allowed` and records who asked about what.
struct Reviewer {
    allowed: bool,
    asked: std::sync::Mutex<Vec<(String, String, String)>>,
}

impl dbservice_operator::admission::secret_access::SecretAccessReviewer for Reviewer {
    fn may_read<'a>(
        &'a self,
        user: &'a dbservice_operator::admission::review::UserInfo,
        namespace: &'a str,
        resource: &'a str,
        name: &'a str,
    ) -> dbservice_operator::admission::secret_access::AccessFuture<'a> {
        assert_eq!(resource, "secrets");
        self.asked.lock().unwrap().push((user.username.clone(), namespace.to_string(), name.to_string()));
        Box::pin(async move { Ok(self.allowed) })
    }
}

#[tokio::test]
async fn a_secret_the_requester_may_not_read_is_denied() {
    for allowed in [false, true] {
        let reviewer = Arc::new(Reviewer { allowed, asked: Default::default() });
        let state = AdmissionState::new("1Gi", Arc::new(Metrics::new())).unwrap().with_secret_access(reviewer.clone());
        let spec = recovering_spec("2026-12-01T00:30:00Z", "http://10.85.0.1:9000");
        let request = review("CREATE", Some(database(spec)), None);
        let response = admit(admission_router(state), "/validate", &request).await;
        assert_eq!(*reviewer.asked.lock().unwrap(), [("alice".to_string(), "shop".to_string(), "s3".to_string())]);
        assert_eq!(response["allowed"], allowed, "{response}");
        if !allowed {
            assert_eq!(response["status"]["code"], 403, "{response}");
            let message = response["status"]["message"].as_str().unwrap();
            assert!(
                message.contains(
                    "spec.bootstrap.recovery.source.credentialsSecret.name: Forbidden: User \"alice\" may not read Secret \"s3\""
                ),
                "{message}"
            );
        }
    }
}
