//! Prometheus metrics of both halves of the binary, served on the plain-HTTP probe port.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use tower::util::MapRequestLayer;

/// Labels of one admission request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// "validate" or "mutate".
    pub webhook: String,
    /// CREATE, UPDATE, DELETE or CONNECT.
    pub operation: String,
    /// allowed, denied, patched or error.
    pub result: String,
}

/// Labels of one admission denial.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DenialLabels {
    /// "validate" or "mutate".
    pub webhook: String,
    /// Kubernetes field error reason, such as FieldValueInvalid.
    pub reason: String,
}

/// Labels of one webhook for the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    /// "validate" or "mutate".
    pub webhook: String,
}

/// Labels of one write to the Kubernetes API.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// Kind written, such as StatefulSet.
    pub kind: String,
    /// apply, patch, create, delete or status.
    pub verb: String,
}

/// Labels of one request to the Kubernetes API.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRequestLabels {
    /// get, list, watch, create, update, patch, delete or deletecollection.
    pub verb: String,
    /// Resource, with the subresource after a slash (databaseservices/status).
    pub resource: String,
}

/// Labels of one reconciliation outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// success or error.
    pub result: String,
    /// The step that failed (observe, apply, publish, cleanup, finalizer, step_down), or none.
    pub step: String,
}

/// Labels of one DatabaseService.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DatabaseLabels {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// Every metric the operator exposes.
pub struct Metrics {
    registry: Registry,
    /// Admission requests by webhook, operation and result.
    pub admission_requests: Family<AdmissionLabels, Counter>,
    /// Admission handling latency in seconds.
    pub admission_duration: Family<WebhookLabels, Histogram>,
    /// Admission denials by reason.
    pub admission_denials: Family<DenialLabels, Counter>,
    /// Seconds until the served certificate expires.
    pub certificate_expiry_seconds: Gauge<f64, AtomicU64>,
    /// Reconciliations by result.
    pub reconciliations: Family<ReconcileLabels, Counter>,
    /// Writes the controller made, by kind and verb (a converged cluster sees none).
    pub writes: Family<WriteLabels, Counter>,
    /// Requests this process sent to the Kubernetes API, by verb and resource.
    pub api_requests: Family<ApiRequestLabels, Counter>,
    /// 1 while this process holds the leader Lease.
    pub leader: Gauge,
    /// Times this process gained or lost leadership.
    pub leadership_changes: Counter,
    /// 1 while the primary's WAL archiving fails, 0 while it works (databases with spec.backup).
    pub wal_archiving_failing: Family<DatabaseLabels, Gauge>,
    /// Unix time the current failing streak of WAL archiving began (only while failing).
    pub wal_archiving_failing_since: Family<DatabaseLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("dbservice");
        let admission_requests = Family::<AdmissionLabels, Counter>::default();
        let admission_duration = Family::<WebhookLabels, Histogram>::new_with_constructor(|| {
            // Sub-millisecond buckets: an in-memory admission decision takes microseconds.
            Histogram::new([0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0])
        });
        let admission_denials = Family::<DenialLabels, Counter>::default();
        let certificate_expiry_seconds = Gauge::<f64, AtomicU64>::default();
        let reconciliations = Family::<ReconcileLabels, Counter>::default();
        let writes = Family::<WriteLabels, Counter>::default();
        let api_requests = Family::<ApiRequestLabels, Counter>::default();
        let leader = Gauge::default();
        let leadership_changes = Counter::default();
        let wal_archiving_failing = Family::<DatabaseLabels, Gauge>::default();
        let wal_archiving_failing_since = Family::<DatabaseLabels, Gauge>::default();
        registry.register(
            "admission_requests",
            "Admission requests by webhook, operation and result",
            admission_requests.clone(),
        );
        registry.register("admission_duration_seconds", "Admission handling latency", admission_duration.clone());
        registry.register("admission_denials", "Admission denials by reason", admission_denials.clone());
        registry.register(
            "certificate_expiry_seconds",
            "Seconds until the served webhook certificate expires",
            certificate_expiry_seconds.clone(),
        );
        registry.register("reconciliations", "Reconciliations by result", reconciliations.clone());
        registry.register("controller_writes", "Writes to the Kubernetes API made by the controller", writes.clone());
        registry.register(
            "api_requests",
            "Requests sent to the Kubernetes API by verb and resource",
            api_requests.clone(),
        );
        registry.register("leader", "1 while this process holds the leader Lease", leader.clone());
        registry.register("leadership_changes", "Leadership gained or lost", leadership_changes.clone());
        registry.register(
            "wal_archiving_failing",
            "1 while the primary's WAL archiving fails, 0 while it works",
            wal_archiving_failing.clone(),
        );
        registry.register(
            "wal_archiving_failing_since_timestamp_seconds",
            "Unix time the current failing streak of WAL archiving began",
            wal_archiving_failing_since.clone(),
        );
        Self {
            registry,
            admission_requests,
            admission_duration,
            admission_denials,
            certificate_expiry_seconds,
            reconciliations,
            writes,
            api_requests,
            leader,
            leadership_changes,
            wal_archiving_failing,
            wal_archiving_failing_since,
        }
    }

    /// Sets the WAL archiving series of one database: `failing_since` when failing, None when
    /// archiving works.
    pub fn set_wal_archiving(&self, namespace: &str, name: &str, failing_since: Option<chrono::DateTime<chrono::Utc>>) {
        let labels = DatabaseLabels { namespace: namespace.into(), name: name.into() };
        self.wal_archiving_failing.get_or_create(&labels).set(i64::from(failing_since.is_some()));
        match failing_since {
            Some(since) => {
                self.wal_archiving_failing_since.get_or_create(&labels).set(since.timestamp());
            }
            None => {
                self.wal_archiving_failing_since.remove(&labels);
            }
        }
    }

    /// Removes the WAL archiving series of one database (no spec.backup, or deleted).
    pub fn forget_wal_archiving(&self, namespace: &str, name: &str) {
        let labels = DatabaseLabels { namespace: namespace.into(), name: name.into() };
        self.wal_archiving_failing.remove(&labels);
        self.wal_archiving_failing_since.remove(&labels);
    }

    /// Counts one write of the controller.
    pub fn count_write(&self, kind: &str, verb: &str) {
        self.writes.get_or_create(&WriteLabels { kind: kind.into(), verb: verb.into() }).inc();
    }

    /// Counts one request to the Kubernetes API.
    pub fn count_request(&self, method: &http::Method, path: &str, query: Option<&str>) {
        let (verb, resource) = classify_request(method, path, query);
        self.api_requests.get_or_create(&ApiRequestLabels { verb: verb.into(), resource }).inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut output = String::new();
        prometheus_client::encoding::text::encode(&mut output, &self.registry)
            .expect("writing to a String cannot fail");
        output
    }
}

/// A client layer counting every request in [`Metrics::api_requests`]: the operator's own
/// request counter, used by the benchmark and by the test that a steady pass reads nothing.
pub fn count_requests(
    metrics: Arc<Metrics>,
) -> MapRequestLayer<impl Fn(http::Request<kube::client::Body>) -> http::Request<kube::client::Body> + Clone> {
    MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
        metrics.count_request(request.method(), request.uri().path(), request.uri().query());
        request
    })
}

/// The Kubernetes verb and resource of a request, from its method, path and query.
pub fn classify_request(method: &http::Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/... or /apis/GROUP/VERSION/...
    let rest: &[&str] = match segments.first() {
        Some(&"api") => segments.get(2..).unwrap_or_default(),
        Some(&"apis") => segments.get(3..).unwrap_or_default(),
        _ => &[],
    };
    let rest = match rest {
        ["namespaces", _namespace, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    let resource = match rest {
        [] => path.to_string(),
        [resource] | [resource, _] => resource.to_string(),
        [resource, _, subresource, ..] => format!("{resource}/{subresource}"),
    };
    let named = rest.len() >= 2;
    let watching = query.is_some_and(|query| query.split('&').any(|pair| pair == "watch=true" || pair == "watch=1"));
    let verb = match *method {
        http::Method::GET if watching => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

#[cfg(test)]
mod tests {
    use super::{classify_request, Metrics};

    #[test]
    fn wal_archiving_series_follow_the_state() {
        let metrics = Metrics::new();
        let since = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        metrics.set_wal_archiving("shop", "orders", Some(since));
        let text = metrics.encode();
        assert!(text.contains(r#"dbservice_wal_archiving_failing{namespace="shop",name="orders"} 1"#), "{text}");
        assert!(
            text.contains(
                r#"dbservice_wal_archiving_failing_since_timestamp_seconds{namespace="shop",name="orders"} 1800000000"#
            ),
            "{text}"
        );
        metrics.set_wal_archiving("shop", "orders", None);
        let text = metrics.encode();
        assert!(text.contains(r#"dbservice_wal_archiving_failing{namespace="shop",name="orders"} 0"#), "{text}");
        assert!(!text.contains("failing_since_timestamp_seconds{"), "{text}");
        metrics.forget_wal_archiving("shop", "orders");
        assert!(!metrics.encode().contains(r#"name="orders""#));
    }
    use http::Method;

    #[test]
    fn requests_are_classified_by_verb_and_resource() {
        let cases = [
            (Method::GET, "/api/v1/namespaces/a/pods", Some("labelSelector=x"), "list", "pods"),
            (Method::GET, "/api/v1/pods", Some("watch=true&resourceVersion=1"), "watch", "pods"),
            (Method::GET, "/apis/apps/v1/namespaces/a/statefulsets/db", None, "get", "statefulsets"),
            (
                Method::PATCH,
                "/apis/dbservice.dev/v1/namespaces/a/databaseservices/db/status",
                None,
                "patch",
                "databaseservices/status",
            ),
            (Method::POST, "/api/v1/namespaces/a/secrets", None, "create", "secrets"),
            (Method::PUT, "/api/v1/namespaces/a/configmaps/db-ledger", None, "update", "configmaps"),
            (Method::DELETE, "/api/v1/namespaces/a/pods/db-0", None, "delete", "pods"),
            (Method::GET, "/api/v1/namespaces/a", None, "get", "namespaces"),
            (Method::GET, "/apis/storage.k8s.io/v1/storageclasses/fast", None, "get", "storageclasses"),
        ];
        for (method, path, query, verb, resource) in cases {
            assert_eq!(classify_request(&method, path, query), (verb, resource.to_string()), "{method} {path}");
        }
    }
}
