//! Kubernetes clients: every call has a timeout, and the controller's client only writes while
//! this process leads.

use crate::metrics::{count_requests, Metrics};
use futures::future::BoxFuture;
use http::{Method, Request};
use kube::client::{Body, ClientBuilder};
use kube::Client;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;
use tower::{BoxError, Layer, Service};

/// Time for the response headers of a non-watch call (the apiserver's own limit for
/// non-long-running requests is 60 s; anything slower is better retried).
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Time to establish a connection to the apiserver.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest silence while reading a response; above the watchers' server-side timeout (290 s),
/// so a quiet watch ends on the server's terms, but a stalled body does not hang forever.
pub const READ_TIMEOUT: Duration = Duration::from_secs(300);

/// A client whose calls all time out: connect, write and read at the connection, and the
/// response of every non-watch call within [`API_CALL_TIMEOUT`]. With `leader`, writes are
/// refused unless this process leads, and cancelled when leadership is lost (see [`CallGuardLayer`]).
/// Every request is counted in `metrics` by verb and resource.
pub fn client(
    config: &kube::Config,
    leader: Option<watch::Receiver<bool>>,
    metrics: &Arc<Metrics>,
) -> Result<Client, kube::Error> {
    let mut config = config.clone();
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    config.reset_reader_on_write = true;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&count_requests(metrics.clone()))
        .with_layer(&CallGuardLayer { leader })
        .build())
}

fn is_watch(request: &Request<Body>) -> bool {
    request.uri().query().is_some_and(|query| query.split('&').any(|pair| pair == "watch=true"))
}

/// Message of the error a write gets when the process does not lead.
pub const NOT_LEADER: &str = "not the leader: write refused";

/// Guards every call of a client:
/// - the time to the response headers of every call but watches (long-running by design, ended
///   by the server's timeoutSeconds and the watcher's own idle timeout) is bounded by
///   [`API_CALL_TIMEOUT`];
/// - with `leader`, writes (anything but GET and HEAD) are refused while `leader` is false, and a
///   write in flight is cancelled the moment leadership is lost: a reconcile that was running
///   when the process stepped down gets an error from its next (or current) write instead of
///   writing after a successor may have started. Reads, watches included, pass through.
#[derive(Clone, Debug, Default)]
pub struct CallGuardLayer {
    /// True while this process leads (from [`crate::leader::LeaderElection::spawn`]); None for a
    /// client that never writes on a leader's behalf.
    pub leader: Option<watch::Receiver<bool>>,
}

impl<S> Layer<S> for CallGuardLayer {
    type Service = CallGuard<S>;
    fn layer(&self, inner: S) -> Self::Service {
        CallGuard { inner, leader: self.leader.clone() }
    }
}

/// See [`CallGuardLayer`].
#[derive(Clone, Debug)]
pub struct CallGuard<S> {
    inner: S,
    leader: Option<watch::Receiver<bool>>,
}

impl<S> Service<Request<Body>> for CallGuard<S>
where
    S: Service<Request<Body>, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let watch = is_watch(&request);
        let write = !matches!(*request.method(), Method::GET | Method::HEAD);
        let mut leader = self.leader.clone().filter(|_| write);
        if let Some(leader) = leader.as_mut() {
            if !*leader.borrow_and_update() {
                return Box::pin(async { Err(BoxError::from(NOT_LEADER)) });
            }
        }
        let call = self.inner.call(request);
        Box::pin(async move {
            let lost = async move {
                match leader {
                    Some(mut leader) => {
                        let _ = leader.wait_for(|leading| !*leading).await;
                    }
                    None => std::future::pending().await,
                }
            };
            let timeout = async move {
                if watch {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(API_CALL_TIMEOUT).await;
            };
            tokio::select! {
                response = call => response,
                _ = lost => Err(BoxError::from(NOT_LEADER)),
                _ = timeout => Err(BoxError::from(format!("no response from the apiserver within {API_CALL_TIMEOUT:?}"))),
            }
        })
    }
}
