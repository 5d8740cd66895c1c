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
use tokio::sync::{watch, Semaphore};
use tower::{BoxError, Layer, Service};

/// Time for the response headers of a non-watch call (the apiserver's own limit for
/// non-long-running requests is 60 s; anything slower is better retried).
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Time to establish a connection to the apiserver.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Calls other than watches in flight at once per client. Each needs its own HTTP/1.1 connection
/// (TLS state and read buffers, then 90 s idle in the pool): 16 concurrent passes writing several
/// children at once opened about 200 connections during a burst of 1,000 new databases.
pub const MAX_CALLS_IN_FLIGHT: usize = 32;
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
        .with_layer(&CallGuardLayer::new(leader))
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
///   writing after a successor may have started. Reads, watches included, pass through;
/// - at most [`MAX_CALLS_IN_FLIGHT`] calls other than watches are sent at once (watches are
///   long-running and few, and must never wait behind a burst).
#[derive(Clone, Debug)]
pub struct CallGuardLayer {
    /// True while this process leads (from [`crate::operator::leader::LeaderElection::spawn`]); None for a
    /// client that never writes on a leader's behalf.
    leader: Option<watch::Receiver<bool>>,
    calls_in_flight: Arc<Semaphore>,
}

impl CallGuardLayer {
    /// The guard of one client; `leader` as described above.
    pub fn new(leader: Option<watch::Receiver<bool>>) -> Self {
        Self { leader, calls_in_flight: Arc::new(Semaphore::new(MAX_CALLS_IN_FLIGHT)) }
    }
}

impl<S> Layer<S> for CallGuardLayer {
    type Service = CallGuard<S>;
    fn layer(&self, inner: S) -> Self::Service {
        CallGuard { inner, leader: self.leader.clone(), calls_in_flight: self.calls_in_flight.clone() }
    }
}

/// See [`CallGuardLayer`].
#[derive(Clone, Debug)]
pub struct CallGuard<S> {
    inner: S,
    leader: Option<watch::Receiver<bool>>,
    calls_in_flight: Arc<Semaphore>,
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
        // The inner future is lazy (hyper checks out a connection when first polled), so waiting
        // for a slot before polling it bounds the connections in use.
        let slots = (!watch).then(|| self.calls_in_flight.clone());
        let call = self.inner.call(request);
        let call = async move {
            let _slot = match slots {
                Some(slots) => Some(slots.acquire_owned().await.map_err(BoxError::from)?),
                None => None,
            };
            call.await
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    // Paused time: the timers advance only when every task waits, so the overlap is deterministic.
    #[tokio::test(start_paused = true)]
    async fn calls_in_flight_are_bounded_and_watches_never_wait() {
        let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let inner = {
            let (in_flight, most) = (in_flight.clone(), most.clone());
            tower::service_fn(move |request: Request<Body>| {
                let (in_flight, most) = (in_flight.clone(), most.clone());
                async move {
                    // Counted from the first poll, when a real client would take a connection.
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    if !is_watch(&request) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(())
                }
            })
        };
        let guard = CallGuardLayer::new(None).layer(inner);
        let get = |uri: &str| Request::get(uri).body(Body::empty()).unwrap();
        let calls: Vec<_> = (0..4 * MAX_CALLS_IN_FLIGHT).map(|_| guard.clone().call(get("/api/v1/pods"))).collect();
        let first = tokio::spawn(futures::future::join_all(calls));
        tokio::time::sleep(Duration::from_millis(5)).await;
        // A watch goes through while every slot is taken.
        tokio::time::timeout(Duration::from_millis(10), guard.clone().call(get("/api/v1/pods?watch=true")))
            .await
            .expect("a watch does not wait for a slot")
            .unwrap();
        assert!(first.await.unwrap().iter().all(Result::is_ok));
        assert_eq!(most.load(Ordering::SeqCst), MAX_CALLS_IN_FLIGHT + 1, "the slots were all taken, plus the watch");
    }
}
