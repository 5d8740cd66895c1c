//! Serving the admission router over tokio-rustls and the probe router over plain HTTP.

use super::tls::{server_config, ReloadingCertificate};
use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight requests get to finish after shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Serves `router` over HTTPS on `listener` until `shutdown` turns true, then drains.
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    certificate: Arc<ReloadingCertificate>,
    mut shutdown: watch::Receiver<bool>,
) {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(certificate)));
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    continue;
                }
            },
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        // Without TCP_NODELAY, Nagle's algorithm holds the first response written after the TLS
        // handshake until the client's delayed ACK: measured ~45 ms per new connection from a
        // client without session resumption (as the apiserver's), see tests/tls_reload.rs.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%peer, %error, "cannot set TCP_NODELAY");
        }
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(router.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => return tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drain(graceful).await;
}

/// Serves `router` over plain HTTP until `shutdown` turns true.
pub async fn serve_plain(listener: TcpListener, router: Router, mut shutdown: watch::Receiver<bool>) {
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(_) => continue,
            },
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            let _ = watcher.watch(connection).await;
        });
    }
    drain(graceful).await;
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
