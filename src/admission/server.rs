//! Serving the admission router over tokio-rustls and the probe router over plain HTTP, with a
//! connection cap (see [`crate::admission::connections`]), handshake/header/idle timeouts and a backed-off
//! accept loop.

use crate::admission::connections::{ConnectionMarks, ConnectionSlot, ConnectionSlots};
use crate::admission::limits::ServerLimits;
use crate::admission::tls::{server_config, ReloadingCertificate};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// How long in-flight requests get to finish after shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// First pause after a failed accept; doubles up to [`ACCEPT_BACKOFF_CAP`].
const ACCEPT_BACKOFF_START: Duration = Duration::from_millis(5);
/// Longest pause between accepts while they keep failing (e.g. out of file descriptors).
const ACCEPT_BACKOFF_CAP: Duration = Duration::from_secs(1);
/// At most one accept-failure log line per this interval.
const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Largest buffer hyper keeps per connection for reading: headers are small and the body is
/// copied out frame by frame, so 64 KiB is plenty (hyper's default grows to ~400 KiB).
const MAX_READ_BUFFER: usize = 64 * 1024;
/// Connections to the probe port (kubelet and Prometheus need a handful).
const MAX_PROBE_CONNECTIONS: usize = 64;

/// Accepts connections and gives each a slot; on errors (EMFILE, ENFILE, ENOBUFS…) backs off
/// exponentially instead of spinning, and logs at most once per interval.
struct Acceptor {
    listener: TcpListener,
    slots: Arc<ConnectionSlots>,
    backoff: Duration,
    failures_since_log: u64,
    last_log: Option<Instant>,
    name: &'static str,
}

impl Acceptor {
    fn new(listener: TcpListener, max_connections: usize, name: &'static str) -> Self {
        Self {
            listener,
            slots: ConnectionSlots::new(max_connections),
            backoff: ACCEPT_BACKOFF_START,
            failures_since_log: 0,
            last_log: None,
            name,
        }
    }

    /// The next connection with its slot (released when the connection task ends). While served
    /// connections hold every slot, the next clients wait in the kernel's listen backlog.
    async fn accept(&mut self) -> (TcpStream, SocketAddr, ConnectionSlot) {
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    self.backoff = ACCEPT_BACKOFF_START;
                    let slot = self.slots.claim().await;
                    return (stream, peer, slot);
                }
                Err(error) => {
                    self.failures_since_log += 1;
                    if self.last_log.is_none_or(|last| last.elapsed() >= ACCEPT_LOG_INTERVAL) {
                        tracing::warn!(
                            server = self.name,
                            %error,
                            failures = self.failures_since_log,
                            retry_in_ms = self.backoff.as_millis() as u64,
                            "accept failed; backing off"
                        );
                        self.last_log = Some(Instant::now());
                        self.failures_since_log = 0;
                    }
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(ACCEPT_BACKOFF_CAP);
                }
            }
        }
    }
}

fn http1(limits: &ServerLimits) -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The timer is what makes hyper enforce the header read timeout (without one it silently
    // has none); hyper restarts it when a keep-alive connection goes idle, so it is the kept
    // connections' idle timeout. Waiting ones are closed sooner by `until_evicted`.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.kept_idle_timeout.max(limits.header_read_timeout))
        .max_buf_size(MAX_READ_BUFFER)
        .keep_alive(true);
    builder
}

/// Serves `router` over HTTPS on `listener` until `shutdown` turns true, then drains.
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    certificate: Arc<ReloadingCertificate>,
    limits: ServerLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(certificate)));
    let graceful = GracefulShutdown::new();
    let builder = http1(&limits);
    let mut connections = Acceptor::new(listener, limits.max_connections, "admission");
    loop {
        let (stream, peer, slot) = tokio::select! {
            accepted = connections.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        // Without TCP_NODELAY, Nagle's algorithm holds the first response written after the TLS
        // handshake until the client's delayed ACK: measured ~45 ms per new connection from a
        // client without session resumption (as the apiserver's), see tests/tls_reload.rs.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%peer, %error, "cannot set TCP_NODELAY");
        }
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(marks_served(router.clone(), &slot));
        let watcher = graceful.watcher();
        let builder = builder.clone();
        let handshake_timeout = limits.handshake_timeout;
        let mut stopping = shutdown.clone();
        let waiting_limit = limits.header_read_timeout;
        tokio::spawn(until_evicted(slot, peer, waiting_limit, async move {
            // A connection still in its handshake at shutdown has no request to finish: it is
            // dropped, so that the drain (which waits for every watcher) does not wait for it.
            let handshake = tokio::time::timeout(handshake_timeout, acceptor.accept(stream));
            let stream = tokio::select! {
                handshake = handshake => match handshake {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(error)) => return tracing::debug!(%peer, %error, "TLS handshake failed"),
                    Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                },
                _ = stopping.wait_for(|stop| *stop) => return tracing::debug!(%peer, "shutting down: handshake dropped"),
            };
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        }));
    }
    drain(graceful).await;
}

/// Serves `router` over plain HTTP until `shutdown` turns true.
pub async fn serve_plain(listener: TcpListener, router: Router, mut shutdown: watch::Receiver<bool>) {
    let graceful = GracefulShutdown::new();
    let limits = ServerLimits::default();
    let builder = http1(&limits);
    let mut connections = Acceptor::new(listener, MAX_PROBE_CONNECTIONS, "probe");
    loop {
        let (stream, peer, slot) = tokio::select! {
            accepted = connections.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        let service = TowerToHyperService::new(marks_served(router.clone(), &slot));
        let watcher = graceful.watcher();
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(until_evicted(slot, peer, limits.header_read_timeout, async move {
            let _ = watcher.watch(connection).await;
        }));
    }
    drain(graceful).await;
}

/// `router`, marking the connection of `slot` reading when a request begins and kept once it is
/// answered with success (a 400, 408 or 413 keeps nothing: the apiserver never earns them).
fn marks_served(router: Router, slot: &ConnectionSlot) -> Router {
    let on_request = slot.marks.clone();
    let on_response = slot.marks.clone();
    router
        .layer(tower::util::MapResponseLayer::new(move |response: axum::response::Response| {
            on_response.answered(response.status().is_success());
            response
        }))
        .layer(tower::util::MapRequestLayer::new(move |mut request: axum::extract::Request| {
            on_request.request_started();
            // The handler says when the body is read (from then on the request is never cut).
            request.extensions_mut().insert(on_request.clone());
            request
        }))
}

/// Runs a connection's task until it ends, its slot is claimed for a newcomer, or it has been
/// waiting (no request yet, or its last one refused) for `waiting_limit`; the last two close the
/// connection by dropping it. The slot is released when this returns.
async fn until_evicted(
    slot: ConnectionSlot,
    peer: SocketAddr,
    waiting_limit: Duration,
    connection: impl Future<Output = ()>,
) {
    tokio::select! {
        () = connection => {}
        () = slot.evicted.notified() => {
            tracing::debug!(%peer, "closed to make room: no request answered while every slot was taken");
        }
        () = waited_too_long(&slot.marks, waiting_limit) => {
            tracing::debug!(%peer, "closed: waiting for a request for too long");
        }
    }
}

/// Resolves once the connection of `marks` has been waiting for `limit`.
async fn waited_too_long(marks: &ConnectionMarks, limit: Duration) {
    loop {
        match marks.waiting_for() {
            Some(waited) if waited >= limit => return,
            Some(waited) => tokio::time::sleep(limit - waited).await,
            // Kept or busy: looked at again soon, as it may be refused and start waiting.
            None => tokio::time::sleep(limit / 4).await,
        }
    }
}

async fn drain(graceful: GracefulShutdown) {
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await.is_err() {
        tracing::warn!("some connections did not finish within the drain timeout");
    }
}

/// Binds a TCP listener with a one-line error naming the address.
pub async fn bind(address: SocketAddr, flag: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(address).await.map_err(|error| anyhow::anyhow!("{flag} {address}: cannot listen: {error}"))
}
