//! Admission latency benchmark: N in-process `oneshot` calls of the admission router (no socket,
//! no TLS), timed one by one. Prints p50/p99/max latency, requests per second and the peak RSS.
//!
//!     cargo bench --bench admission            # N = 20000 per scenario
//!     ADMISSION_BENCH_REQUESTS=5000 cargo bench --bench admission

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use dbservice_operator::admission::webhook::{admission_router, AdmissionState};
use dbservice_operator::metrics::Metrics;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

const DEFAULT_REQUESTS: usize = 20_000;
const WARMUP_REQUESTS: usize = 1_000;

fn review(spec: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "dbservice.dev", "version": "v1", "kind": "DatabaseService"},
            "resource": {"group": "dbservice.dev", "version": "v1", "resource": "databaseservices"},
            "name": "orders",
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": {
                "apiVersion": "dbservice.dev/v1",
                "kind": "DatabaseService",
                "metadata": {"name": "orders", "namespace": "shop", "labels": {"team": "payments"}},
                "spec": spec
            },
            "dryRun": false
        }
    }))
    .expect("reviews serialize")
}

/// Peak resident set size of this process in KiB (VmHWM), when /proc is available.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    let index = ((sorted.len() as f64 * fraction).ceil() as usize).saturating_sub(1).min(sorted.len() - 1);
    sorted[index]
}

async fn call(router: &axum::Router, path: &str, body: &[u8]) {
    let request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_vec()))
        .expect("requests build");
    let response = router.clone().oneshot(request).await.expect("the router is infallible");
    assert_eq!(response.status(), StatusCode::OK, "{path} did not answer 200");
    // Read the whole answer: serializing it is part of the work.
    let _ = response.into_body().collect().await.expect("bodies are readable");
}

async fn scenario(router: &axum::Router, name: &str, path: &str, body: &[u8], requests: usize) {
    for _ in 0..WARMUP_REQUESTS {
        call(router, path, body).await;
    }
    let mut latencies = Vec::with_capacity(requests);
    let started = Instant::now();
    for _ in 0..requests {
        let request_started = Instant::now();
        call(router, path, body).await;
        latencies.push(request_started.elapsed());
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    println!(
        "{name:<34} n={requests:<6} p50={:>8.1?} p99={:>8.1?} max={:>8.1?} {:>9.0} req/s",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1],
        requests as f64 / elapsed.as_secs_f64()
    );
}

fn main() {
    let requests: usize =
        std::env::var("ADMISSION_BENCH_REQUESTS").ok().and_then(|value| value.parse().ok()).unwrap_or(DEFAULT_REQUESTS);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let valid =
        review(json!({"version": "16.4", "storageSize": "10Gi", "databaseName": "app", "username": "app_user"}));
    let invalid =
        review(json!({"version": "latest", "storageSize": "100Mi", "databaseName": "App", "username": "postgres"}));
    println!("admission router, in-process oneshot, one request at a time, {WARMUP_REQUESTS} warm-up requests each");
    runtime.block_on(async {
        let router = admission_router(AdmissionState::new("1Gi", Arc::new(Metrics::new())).expect("1Gi parses"));
        scenario(&router, "validate (valid CREATE, allowed)", "/validate", &valid, requests).await;
        scenario(&router, "validate (invalid CREATE, denied)", "/validate", &invalid, requests).await;
        scenario(&router, "mutate (minimal CREATE, patched)", "/mutate", &valid, requests).await;
    });
    match peak_rss_kib() {
        Some(kib) => println!("peak RSS (VmHWM): {kib} KiB ({:.1} MiB)", kib as f64 / 1024.0),
        None => println!("peak RSS: unavailable (no /proc/self/status)"),
    }
}
