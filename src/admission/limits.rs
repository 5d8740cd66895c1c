//! Size, time and concurrency bounds of the admission server.
//!
//! The webhook shares one process and one memory limit (256 MiB in the chart) with the
//! controller, so every request is bounded before any byte of it is buffered.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Largest AdmissionReview accepted: 1 MiB.
///
/// etcd refuses requests over 1.5 MiB (`--max-request-bytes`), so no stored object is bigger
/// than that, and a DatabaseService is a few hundred bytes plus what users add to metadata
/// (annotations are capped at 256 KiB in total). The review wraps at most two objects (object and
/// oldObject); a review near 1 MiB already means an object of ~500 KiB, far beyond anything
/// this operator's CRD (with its size caps) describes, so larger bodies are refused with 413.
pub const BODY_LIMIT_BYTES: usize = 1024 * 1024;

/// Bytes of request bodies buffered at once over all connections: 16 full-size bodies.
/// A slow sender holds only what it has sent; once the budget is spent, readers wait.
pub const BODY_BUDGET_BYTES: usize = 16 * BODY_LIMIT_BYTES;

/// How long a client has to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection may wait without a request, or after a refused one, before it is
/// closed: a new client has this long for its handshake, request line and headers. The apiserver
/// sends a request in one go.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection kept after a successful answer may stay idle. Longer than the
/// apiserver's own idle timeout (Go's 90 s, `IdleConnTimeout` of client-go's transports), so that
/// the apiserver closes its idle connections first: when the server closes one just as the
/// apiserver reuses it, the apiserver's write fails (`write: broken pipe`, not retried for a
/// POST) and the user's request fails with it. Seen in CI with a 10 s idle timeout.
pub const KEPT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long reading the body and deciding may take. The apiserver gives up after the webhook's
/// timeoutSeconds (5 s in the chart, 30 s at most), so later answers are useless.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Default cap on open connections to the admission port.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// Default number of requests parsed and decided at once (the CPU- and memory-heavy part).
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 8;

/// Shared bounds of the admission handlers.
#[derive(Clone, Debug)]
pub struct RequestLimits {
    /// Largest body accepted.
    pub body_limit: usize,
    /// Bytes of bodies buffered at once over all requests.
    body_budget: Arc<Semaphore>,
    /// Requests parsed and decided at once.
    decisions: Arc<Semaphore>,
    /// Time for body and decision.
    pub request_timeout: Duration,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_CONCURRENT_REQUESTS)
    }
}

impl RequestLimits {
    /// Default sizes with `max_concurrent_requests` decisions at once.
    pub fn new(max_concurrent_requests: usize) -> Self {
        Self {
            body_limit: BODY_LIMIT_BYTES,
            body_budget: Arc::new(Semaphore::new(BODY_BUDGET_BYTES)),
            decisions: Arc::new(Semaphore::new(max_concurrent_requests.max(1))),
            request_timeout: REQUEST_TIMEOUT,
        }
    }

    /// Reserves `bytes` of the body budget, waiting while other bodies hold it.
    pub async fn reserve_body(&self, bytes: usize) -> OwnedSemaphorePermit {
        let bytes = u32::try_from(bytes).expect("body reservations are at most BODY_LIMIT_BYTES");
        self.body_budget.clone().acquire_many_owned(bytes).await.expect("the body budget is never closed")
    }

    /// Waits for a decision slot.
    pub async fn decision_slot(&self) -> OwnedSemaphorePermit {
        self.decisions.clone().acquire_owned().await.expect("the decision semaphore is never closed")
    }
}

/// Bounds of the connection layer.
#[derive(Clone, Copy, Debug)]
pub struct ServerLimits {
    /// Connections open at once; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// TLS handshake deadline.
    pub handshake_timeout: Duration,
    /// Deadline of a connection waiting for its first request, or after a refused one.
    pub header_read_timeout: Duration,
    /// Deadline of a connection idle after a successful answer (see [`KEPT_IDLE_TIMEOUT`]).
    pub kept_idle_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            kept_idle_timeout: KEPT_IDLE_TIMEOUT,
        }
    }
}
