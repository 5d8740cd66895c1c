//! Size, time and connection bounds of the HTTPS admission server, over real TLS in process
//! (`webhook::server::serve_tls`): slow and idle clients are cut off, the connection cap holds,
//! and a legitimate request is answered while slow clients hold connections.

use dbservice_operator::admission::limits::ServerLimits;
use dbservice_operator::admission::server::serve_tls;
use dbservice_operator::admission::tls::{install_crypto_provider, ReloadingCertificate};
use dbservice_operator::admission::webhook::{admission_router, AdmissionState};
use dbservice_operator::certificates::{generate_bundle, write_bundle};
use dbservice_operator::metrics::Metrics;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Upper bound of every wait; each test's own bound is much shorter.
const DEADLINE: Duration = Duration::from_secs(20);

struct Server {
    address: SocketAddr,
    connector: TlsConnector,
    _shutdown: watch::Sender<bool>,
    _directory: tempfile::TempDir,
}

async fn start(limits: ServerLimits) -> Server {
    install_crypto_provider();
    let directory = tempfile::tempdir().unwrap();
    let bundle = generate_bundle(&["localhost".into()], &["127.0.0.1".parse().unwrap()]).unwrap();
    write_bundle(&bundle, directory.path()).unwrap();
    let certificate =
        ReloadingCertificate::load(&directory.path().join("tls.crt"), &directory.path().join("tls.key")).unwrap();
    let router = admission_router(AdmissionState::new("1Gi", Arc::new(Metrics::new())).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (shutdown, stop) = watch::channel(false);
    tokio::spawn(serve_tls(listener, router, certificate, limits, stop));
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls::pki_types::pem::PemObject::from_pem_slice(bundle.ca_certificate.as_bytes()).unwrap();
    roots.add(CertificateDer::into_owned(ca)).unwrap();
    let mut config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Server { address, connector: TlsConnector::from(Arc::new(config)), _shutdown: shutdown, _directory: directory }
}

impl Server {
    async fn connect(&self) -> TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.address).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        tokio::time::timeout(DEADLINE, self.connector.connect(name, tcp)).await.expect("handshake in time").unwrap()
    }
}

fn review_request() -> Vec<u8> {
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "3a0c7e1e-0d7b-4c57-9f55-2f0b8f1d9e11",
            "kind": {"group": "dbservice.dev", "version": "v1", "kind": "DatabaseService"},
            "resource": {"group": "dbservice.dev", "version": "v1", "resource": "databaseservices"},
            "operation": "CREATE",
            "object": {
                "apiVersion": "dbservice.dev/v1", "kind": "DatabaseService",
                "metadata": {"name": "orders", "namespace": "shop"},
                "spec": {"version": "16.4", "storageSize": "10Gi", "databaseName": "app", "username": "app_user"}
            }
        }
    }))
    .unwrap();
    let mut request = format!(
        "POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend(body);
    request
}

/// Sends one review on `stream` and returns the status line.
async fn exchange(stream: &mut TlsStream<TcpStream>) -> String {
    stream.write_all(&review_request()).await.unwrap();
    let mut buffer = vec![0u8; 16 * 1024];
    let read = stream.read(&mut buffer).await.unwrap();
    String::from_utf8_lossy(&buffer[..read]).lines().next().unwrap_or_default().to_string()
}

/// Waits until the server closes `stream` (EOF or error); returns how long that took.
async fn closed_after(stream: &mut (impl AsyncReadExt + Unpin)) -> Duration {
    let started = Instant::now();
    let mut buffer = [0u8; 1024];
    tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    })
    .await
    .expect("the server closed the connection");
    started.elapsed()
}

fn short_limits() -> ServerLimits {
    ServerLimits {
        max_connections: 64,
        handshake_timeout: Duration::from_millis(500),
        header_read_timeout: Duration::from_millis(500),
        kept_idle_timeout: Duration::from_secs(1),
    }
}

#[tokio::test]
async fn a_client_that_never_handshakes_is_disconnected() {
    let server = start(short_limits()).await;
    let mut tcp = TcpStream::connect(server.address).await.unwrap();
    let waited = closed_after(&mut tcp).await;
    assert!(waited < Duration::from_secs(3), "closed after {waited:?}");
}

#[tokio::test]
async fn an_idle_tls_connection_is_disconnected() {
    let server = start(short_limits()).await;
    let mut stream = server.connect().await;
    let waited = closed_after(&mut stream).await;
    assert!(waited < Duration::from_secs(3), "closed after {waited:?}");
}

#[tokio::test]
async fn headers_sent_slowly_are_cut_off() {
    let server = start(short_limits()).await;
    let mut stream = server.connect().await;
    let started = Instant::now();
    // One header byte every 100 ms: never finishes within the header timeout.
    for byte in b"POST /validate HTTP/1.1\r\nhost: localhost\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
        if stream.write_all(&[*byte]).await.is_err() || stream.flush().await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if started.elapsed() > Duration::from_secs(4) {
            break;
        }
    }
    let waited = started.elapsed() + closed_after(&mut stream).await;
    assert!(waited < Duration::from_secs(4), "closed after {waited:?}");
}

#[tokio::test]
async fn a_kept_alive_connection_is_closed_once_idle() {
    let server = start(short_limits()).await;
    let mut stream = server.connect().await;
    assert_eq!(exchange(&mut stream).await, "HTTP/1.1 200 OK");
    let waited = closed_after(&mut stream).await;
    assert!(waited < Duration::from_secs(3), "closed after {waited:?}");
}

/// A connection kept after a success stays open well past the waiting limit (the apiserver's
/// idle connections must not be closed under it as it reuses them), then closes once idle for
/// the kept limit; a connection whose request was refused gets only the waiting limit.
#[tokio::test]
async fn a_kept_connection_outlives_the_waiting_limit_and_a_refused_one_does_not() {
    let limits = ServerLimits { kept_idle_timeout: Duration::from_secs(3), ..short_limits() };
    let server = start(limits).await;
    let mut kept = server.connect().await;
    assert_eq!(exchange(&mut kept).await, "HTTP/1.1 200 OK");
    tokio::time::sleep(limits.header_read_timeout * 3).await;
    assert_eq!(exchange(&mut kept).await, "HTTP/1.1 200 OK", "the kept connection was closed while idle");
    let waited = closed_after(&mut kept).await;
    assert!(waited > Duration::from_secs(2) && waited < Duration::from_secs(5), "kept one closed after {waited:?}");

    let mut refused = server.connect().await;
    let malformed = b"POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-length: 2\r\n\r\n{}";
    refused.write_all(malformed).await.unwrap();
    refused.flush().await.unwrap();
    let mut head = [0u8; 12];
    refused.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 400", "a made-up review is refused");
    let waited = closed_after(&mut refused).await;
    assert!(waited < Duration::from_secs(2), "the refused one closed after {waited:?}");
}

/// With every slot held by connections that have been answered, a new client is served at once in
/// the slot of the one idle longest (issue 37: clients re-sending made-up reviews could otherwise
/// hold every slot); the cap holds, and the other kept connection stays open.
#[tokio::test]
async fn the_connection_cap_holds_and_the_idlest_kept_connection_makes_room() {
    let limits = ServerLimits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(30),
        kept_idle_timeout: Duration::from_secs(30),
        ..short_limits()
    };
    let server = start(limits).await;
    let mut first = server.connect().await;
    let mut second = server.connect().await;
    assert_eq!(exchange(&mut first).await, "HTTP/1.1 200 OK");
    assert_eq!(exchange(&mut second).await, "HTTP/1.1 200 OK");
    let started = Instant::now();
    let mut third = server.connect().await;
    assert_eq!(exchange(&mut third).await, "HTTP/1.1 200 OK");
    assert!(started.elapsed() < Duration::from_secs(1), "the newcomer waited {:?}", started.elapsed());
    let closed = closed_after(&mut first).await;
    assert!(closed < Duration::from_secs(2), "the idlest kept connection was not closed ({closed:?})");
    assert_eq!(exchange(&mut second).await, "HTTP/1.1 200 OK", "the other kept connection stays open");
}

/// At the cap, a newcomer takes the slot of the oldest connection that never completed a request,
/// at once, instead of waiting for that connection's timeout.
#[tokio::test]
async fn a_newcomer_at_the_cap_replaces_the_oldest_connection_that_never_sent_a_request() {
    let limits = ServerLimits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(30),
        kept_idle_timeout: Duration::from_secs(30),
        ..short_limits()
    };
    let server = start(limits).await;
    let mut idle = server.connect().await;
    let mut served = server.connect().await;
    assert_eq!(exchange(&mut served).await, "HTTP/1.1 200 OK");
    let started = Instant::now();
    let mut newcomer = server.connect().await;
    assert_eq!(exchange(&mut newcomer).await, "HTTP/1.1 200 OK");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "the newcomer waited {took:?}");
    let closed = closed_after(&mut idle).await;
    assert!(closed < Duration::from_secs(2), "the idle connection was not closed for the newcomer ({closed:?})");
    assert_eq!(exchange(&mut served).await, "HTTP/1.1 200 OK", "the served connection stays open");
}

/// Slow clients hold connections, yet a legitimate client is answered within 100 ms.
#[tokio::test]
async fn a_legitimate_request_is_answered_quickly_while_slow_clients_hold_connections() {
    let limits = ServerLimits { header_read_timeout: Duration::from_secs(10), max_connections: 512, ..short_limits() };
    let server = start(limits).await;
    let mut slow = Vec::new();
    for _ in 0..100 {
        let mut stream = server.connect().await;
        stream.write_all(b"POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-length: 1000\r\n\r\n{").await.unwrap();
        stream.flush().await.unwrap();
        slow.push(stream);
    }
    let mut legitimate = server.connect().await;
    let started = Instant::now();
    assert_eq!(exchange(&mut legitimate).await, "HTTP/1.1 200 OK");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(100), "took {took:?}");
}

/// Issue 37: clients that were answered once and then trickle their next body (or were answered
/// 408 for a trickled one) used to keep their slots for good; at the cap, a new connection (the
/// apiserver's) waited for a timeout. Now a connection busy without an answer is closed for a
/// newcomer, however it began.
#[tokio::test]
async fn a_new_connection_is_answered_while_clients_answered_once_trickle_their_next_body() {
    let limits = ServerLimits {
        max_connections: 32,
        header_read_timeout: Duration::from_secs(30),
        kept_idle_timeout: Duration::from_secs(30),
        ..short_limits()
    };
    let server = start(limits).await;
    // Every slot: a client answered once, now trickling its next body.
    let mut tricklers = Vec::new();
    for _ in 0..32 {
        let mut stream = server.connect().await;
        assert_eq!(exchange(&mut stream).await, "HTTP/1.1 200 OK");
        stream.write_all(b"POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-length: 1000\r\n\r\n{").await.unwrap();
        stream.flush().await.unwrap();
        tricklers.push(stream);
    }
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        let mut fresh = tokio::time::timeout(Duration::from_secs(3), server.connect()).await.expect("a slot in time");
        assert_eq!(exchange(&mut fresh).await, "HTTP/1.1 200 OK");
        slowest = slowest.max(started.elapsed());
    }
    assert!(slowest < Duration::from_secs(1), "a fresh connection waited {slowest:?} behind trickling clients");
}

/// Issue 37: a thousand pod-network clients each hold a connection open, trickling a request body
/// a byte a second (the chart's cap is 512: every one past it takes the slot of the longest
/// waiting one). The apiserver's fresh requests are all answered, none after a timeout (before
/// the newcomer rule, 1 of 27 waited 5 s under 1000 such clients).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_trickling_clients_leave_the_webhook_available() {
    const CLIENTS: usize = 1000;
    let limits = ServerLimits {
        max_connections: 512,
        header_read_timeout: Duration::from_secs(30),
        kept_idle_timeout: Duration::from_secs(30),
        ..short_limits()
    };
    let server = Arc::new(start(limits).await);
    let (stop, stopped) = watch::channel(false);
    let (connected, mut connections) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..CLIENTS {
        let (server, connected, mut stopped) = (server.clone(), connected.clone(), stopped.clone());
        tokio::spawn(async move {
            let mut stream = server.connect().await;
            let partial = b"POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-length: 1000\r\n\r\n{";
            let _ = stream.write_all(partial).await;
            let _ = stream.flush().await;
            let _ = connected.send(());
            // A byte a second until the server closes the connection or the test ends.
            loop {
                tokio::select! {
                    _ = stopped.changed() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                if stream.write_all(b" ").await.is_err() || stream.flush().await.is_err() {
                    return;
                }
            }
        });
    }
    for _ in 0..CLIENTS {
        tokio::time::timeout(DEADLINE * 3, connections.recv()).await.expect("every client connected in time");
    }
    let mut waits = Vec::new();
    for _ in 0..27 {
        let started = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(5), async {
            let mut fresh = server.connect().await;
            exchange(&mut fresh).await
        })
        .await
        .expect("a fresh request answered within 5 s");
        assert_eq!(answer, "HTTP/1.1 200 OK");
        waits.push(started.elapsed());
    }
    let _ = stop.send(true);
    waits.sort();
    let slowest = *waits.last().unwrap();
    eprintln!("[figure] {CLIENTS} trickling clients: 27 fresh requests, median {:?}, slowest {slowest:?}", waits[13]);
    assert!(slowest < Duration::from_secs(2), "a fresh request waited {slowest:?} behind trickling clients");
}
