//! Certificate rotation of the HTTPS admission server (`webhook::server::serve_tls` with
//! `webhook::tls::ReloadingCertificate`): while clients keep calling /validate, the files are
//! replaced by a bundle from another CA; no request may fail, new connections must get the new
//! certificate, and established connections keep working.

use dbservice_operator::admission::server::serve_tls;
use dbservice_operator::admission::tls::{install_crypto_provider, ReloadingCertificate};
use dbservice_operator::admission::webhook::{admission_router, AdmissionState};
use dbservice_operator::certificates::{generate_bundle, write_bundle, CertificateBundle};
use dbservice_operator::metrics::Metrics;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Upper bound for every wait in this file; the happy path takes well under a second.
const DEADLINE: Duration = Duration::from_secs(20);
/// How often the certificate watcher polls the files.
const WATCH_INTERVAL: Duration = Duration::from_millis(25);

fn loopback() -> IpAddr {
    "127.0.0.1".parse().unwrap()
}

fn bundle() -> CertificateBundle {
    generate_bundle(&["localhost".to_string()], &[loopback()]).expect("certificates generate")
}

fn review_body() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "3a0c7e1e-0d7b-4c57-9f55-2f0b8f1d9e11",
            "kind": {"group": "dbservice.dev", "version": "v1", "kind": "DatabaseService"},
            "resource": {"group": "dbservice.dev", "version": "v1", "resource": "databaseservices"},
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:test"},
            "object": {
                "apiVersion": "dbservice.dev/v1",
                "kind": "DatabaseService",
                "metadata": {"name": "orders", "namespace": "shop"},
                "spec": {"version": "16.4", "storageSize": "10Gi", "databaseName": "app", "username": "app_user"}
            }
        }
    }))
    .unwrap()
}

/// A running HTTPS admission server serving the certificate files in `directory`.
struct Server {
    address: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    certificate: Arc<ReloadingCertificate>,
    metrics: Arc<Metrics>,
}

impl Server {
    async fn start(directory: &Path) -> Self {
        install_crypto_provider();
        let certificate =
            ReloadingCertificate::load(&directory.join("tls.crt"), &directory.join("tls.key")).expect("bundle A loads");
        let metrics = Arc::new(Metrics::new());
        let router = admission_router(AdmissionState::new("1Gi", metrics.clone()).unwrap());
        let listener = TcpListener::bind((loopback(), 0)).await.unwrap();
        let address = listener.local_addr().unwrap();
        let (shutdown, stop) = watch::channel(false);
        let task = tokio::spawn(serve_tls(listener, router, certificate.clone(), Default::default(), stop));
        Self { address, shutdown, task, certificate, metrics }
    }

    fn url(&self) -> String {
        format!("https://{}/validate", self.address)
    }

    async fn stop(self) {
        self.shutdown.send(true).unwrap();
        tokio::time::timeout(DEADLINE, self.task).await.expect("the server drains in time").unwrap();
    }
}

/// A rustls client configuration trusting only the given CAs, without session resumption: a
/// resumed session skips the certificate, and every new connection here must really handshake.
fn client_config(cas: &[&str]) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots.add(CertificateDer::from(der(ca))).unwrap();
    }
    let mut config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// A reqwest client trusting only the given CAs (no public roots), reporting the peer certificate.
fn client_trusting(cas: &[&str], keep_alive: bool) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .use_preconfigured_tls(client_config(cas))
        .tls_info(true)
        .timeout(Duration::from_secs(5));
    if !keep_alive {
        // No idle connection is kept: every request makes a new TLS handshake.
        builder = builder.pool_max_idle_per_host(0);
    }
    builder.build().unwrap()
}

/// Which bundle a served certificate (DER) belongs to, so that failures read "A" or "B", not bytes.
fn label(certificate: &[u8], a: &CertificateBundle, b: &CertificateBundle) -> &'static str {
    if certificate == der(&a.certificate) {
        "A"
    } else if certificate == der(&b.certificate) {
        "B"
    } else {
        "unknown"
    }
}

/// DER of the first certificate of a PEM chain.
fn der(pem: &str) -> Vec<u8> {
    <CertificateDer as rustls::pki_types::pem::PemObject>::pem_slice_iter(pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .as_ref()
        .to_vec()
}

/// POSTs one valid review; Ok with the DER of the certificate the connection presented.
async fn validate_once(client: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let response =
        client.post(url).header("content-type", "application/json").body(review_body()).send().await.map_err(
            |error| {
                let mut message = error.to_string();
                let mut source = std::error::Error::source(&error);
                while let Some(cause) = source {
                    message.push_str(&format!(": {cause}"));
                    source = cause.source();
                }
                message
            },
        )?;
    let peer = response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate().map(<[u8]>::to_vec))
        .ok_or("no TLS info")?;
    let status = response.status();
    let answer: Value = response.json().await.map_err(|error| error.to_string())?;
    if status != reqwest::StatusCode::OK || answer["response"]["allowed"] != true {
        return Err(format!("{status}: {answer}"));
    }
    Ok(peer)
}

/// Counters of one client loop.
#[derive(Default)]
struct Tally {
    successes: AtomicUsize,
    failures: Mutex<Vec<String>>,
    /// Certificates (DER) seen, in order of first appearance.
    certificates: Mutex<Vec<Vec<u8>>>,
}

fn spawn_client_loop(
    client: reqwest::Client,
    url: String,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            match validate_once(&client, &url).await {
                Ok(certificate) => {
                    tally.successes.fetch_add(1, Ordering::SeqCst);
                    let mut seen = tally.certificates.lock().unwrap();
                    if !seen.contains(&certificate) {
                        seen.push(certificate);
                    }
                }
                Err(error) => tally.failures.lock().unwrap().push(error),
            }
        }
    })
}

/// Polls `condition` until it holds, failing with `what` after [`DEADLINE`].
async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < DEADLINE, "timed out after {DEADLINE:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One HTTP/1.1 connection held open by hand, to prove that a connection established before
/// a rotation keeps its certificate and keeps serving requests after it.
struct PersistentConnection {
    stream: TlsStream<TcpStream>,
}

impl PersistentConnection {
    async fn open(address: SocketAddr, cas: &[&str]) -> Result<Self, std::io::Error> {
        let connector = TlsConnector::from(Arc::new(client_config(cas)));
        let tcp = TcpStream::connect(address).await?;
        let stream = connector.connect(ServerName::IpAddress(loopback().into()), tcp).await?;
        Ok(Self { stream })
    }

    fn peer_certificate(&self) -> Vec<u8> {
        self.stream.get_ref().1.peer_certificates().unwrap()[0].as_ref().to_vec()
    }

    /// Sends one request and reads exactly one response (status and JSON body).
    async fn validate(&mut self) -> (u16, Value) {
        let body = review_body();
        let head = format!(
            "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        self.stream.write_all(head.as_bytes()).await.unwrap();
        self.stream.write_all(&body).await.unwrap();
        self.stream.flush().await.unwrap();
        let mut received = Vec::new();
        let header_end = loop {
            if let Some(position) = received.windows(4).position(|window| window == b"\r\n\r\n") {
                break position + 4;
            }
            let mut chunk = [0u8; 4096];
            let read = self.stream.read(&mut chunk).await.unwrap();
            assert!(read > 0, "the server closed the connection");
            received.extend_from_slice(&chunk[..read]);
        };
        let headers = String::from_utf8(received[..header_end].to_vec()).unwrap();
        let status: u16 = headers.split(' ').nth(1).unwrap().parse().unwrap();
        let length: usize = headers
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse().unwrap())
            })
            .expect("a Content-Length");
        while received.len() < header_end + length {
            let mut chunk = [0u8; 4096];
            let read = self.stream.read(&mut chunk).await.unwrap();
            assert!(read > 0, "the server closed the connection mid-body");
            received.extend_from_slice(&chunk[..read]);
        }
        (status, serde_json::from_slice(&received[header_end..header_end + length]).unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_the_certificate_under_load_loses_no_request() {
    let (bundle_a, bundle_b) = (bundle(), bundle());
    assert_ne!(bundle_a.ca_certificate, bundle_b.ca_certificate, "two different CAs");
    let directory = tempfile::tempdir().unwrap();
    write_bundle(&bundle_a, directory.path()).unwrap();
    let server = Server::start(directory.path()).await;
    let watcher = tokio::spawn(server.certificate.clone().watch(WATCH_INTERVAL, server.metrics.clone()));
    let both_cas = [bundle_a.ca_certificate.as_str(), bundle_b.ca_certificate.as_str()];

    // Opened before the rotation: must keep certificate A and keep working afterwards.
    let mut established = PersistentConnection::open(server.address, &both_cas).await.unwrap();
    let label = |certificate: &[u8]| label(certificate, &bundle_a, &bundle_b);
    assert_eq!(label(&established.peer_certificate()), "A");
    assert_eq!(established.validate().await.0, 200);

    let stop = Arc::new(AtomicBool::new(false));
    let keep_alive = Arc::new(Tally::default());
    let reconnecting = Arc::new(Tally::default());
    let loops = [
        spawn_client_loop(client_trusting(&both_cas, true), server.url(), stop.clone(), keep_alive.clone()),
        spawn_client_loop(client_trusting(&both_cas, false), server.url(), stop.clone(), reconnecting.clone()),
    ];
    let busy = |tally: &Tally, at_least: usize| tally.successes.load(Ordering::SeqCst) >= at_least;
    wait_for("both client loops to be running", || busy(&keep_alive, 20) && busy(&reconnecting, 20)).await;

    write_bundle(&bundle_b, directory.path()).unwrap();
    let only_b = client_trusting(&[&bundle_b.ca_certificate], false);
    let started = Instant::now();
    loop {
        if validate_once(&only_b, &server.url()).await.is_ok() {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "certificate B was not served within {DEADLINE:?}");
        tokio::time::sleep(WATCH_INTERVAL).await;
    }
    // Keep both loops running a while on the new certificate.
    let (after_keep_alive, after_reconnecting) =
        (keep_alive.successes.load(Ordering::SeqCst), reconnecting.successes.load(Ordering::SeqCst));
    wait_for("more requests after the rotation", || {
        busy(&keep_alive, after_keep_alive + 20) && busy(&reconnecting, after_reconnecting + 20)
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for client_loop in loops {
        client_loop.await.unwrap();
    }

    for (name, tally) in [("keep-alive", &keep_alive), ("reconnecting", &reconnecting)] {
        eprintln!("{name} client: {} requests succeeded", tally.successes.load(Ordering::SeqCst));
        let failures = tally.failures.lock().unwrap();
        assert!(
            failures.is_empty(),
            "{name} client: {} of {} requests failed during the rotation; first: {:?}",
            failures.len(),
            failures.len() + tally.successes.load(Ordering::SeqCst),
            failures.first()
        );
    }
    // The reconnecting client handshook before and after the rotation: it saw A, then B.
    let seen: Vec<&str> =
        reconnecting.certificates.lock().unwrap().iter().map(|certificate| label(certificate)).collect();
    assert_eq!(seen, vec!["A", "B"], "certificates seen by new connections, in order");

    // The connection established before the rotation still works, still on certificate A.
    let (status, answer) = established.validate().await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(label(&established.peer_certificate()), "A");

    // New connections: trusted with CA B only, refused with CA A only.
    let with_b_only = validate_once(&client_trusting(&[&bundle_b.ca_certificate], false), &server.url()).await;
    assert_eq!(with_b_only.as_deref().map(label), Ok("B"));
    let with_a_only = validate_once(&client_trusting(&[&bundle_a.ca_certificate], false), &server.url()).await;
    assert!(with_a_only.is_err(), "a client trusting only the old CA still connected");
    assert!(
        PersistentConnection::open(server.address, &[&bundle_a.ca_certificate]).await.is_err(),
        "a TLS handshake trusting only the old CA succeeded"
    );

    watcher.abort();
    server.stop().await;
}

/// A key that does not match the certificate (a writer caught halfway) is refused; the server
/// keeps serving the pair it has.
#[tokio::test]
async fn mismatched_certificate_and_key_are_not_installed() {
    let (bundle_a, bundle_b) = (bundle(), bundle());
    let directory = tempfile::tempdir().unwrap();
    write_bundle(&bundle_a, directory.path()).unwrap();
    let server = Server::start(directory.path()).await;
    // Certificate B with key A, as between write_bundle's rename of tls.crt and of tls.key.
    dbservice_operator::certificates::write_atomically(
        &directory.path().join("tls.crt"),
        bundle_b.certificate.as_bytes(),
        false,
    )
    .unwrap();
    assert!(server.certificate.reload().is_err(), "a mismatched pair was accepted");
    let both = client_trusting(&[&bundle_a.ca_certificate, &bundle_b.ca_certificate], false);
    let label = |certificate: Vec<u8>| label(&certificate, &bundle_a, &bundle_b);
    assert_eq!(validate_once(&both, &server.url()).await.map(label), Ok("A"), "the old pair is still served");
    // Once the key follows, the pair is installed.
    write_bundle(&bundle_b, directory.path()).unwrap();
    assert!(server.certificate.reload().unwrap(), "the matching pair was not installed");
    assert_eq!(validate_once(&both, &server.url()).await.map(label), Ok("B"), "the new pair is served");
    // Unchanged files: nothing to do.
    assert!(!server.certificate.reload().unwrap());
    server.stop().await;
}

/// Reads the first TLS record the server answers a handshake attempt with.
async fn first_record(address: SocketAddr, client_hello: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect(address).await.unwrap();
    tcp.write_all(client_hello).await.unwrap();
    let mut answer = vec![0u8; 7];
    tokio::time::timeout(DEADLINE, tcp.read_exact(&mut answer)).await.expect("the server answers").unwrap();
    answer
}

/// A TLS 1.2-style ClientHello (no supported_versions extension) whose only variable is the
/// protocol version: an ECDHE-ECDSA-AES128-GCM suite and the extensions it needs, which the
/// server's ECDSA certificate supports, so a refusal can only be about the version.
fn client_hello(version: [u8; 2]) -> Vec<u8> {
    let extensions: &[u8] = &[
        0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x1d, 0x00, 0x17, // supported_groups: x25519, secp256r1
        0x00, 0x0b, 0x00, 0x02, 0x01, 0x00, // ec_point_formats: uncompressed
        0x00, 0x0d, 0x00, 0x06, 0x00, 0x04, 0x04, 0x03, 0x08, 0x04, // signature_algorithms
        0x00, 0x17, 0x00, 0x00, // extended_master_secret
    ];
    let mut body = Vec::new();
    body.extend_from_slice(&version);
    body.extend_from_slice(&[0x42; 32]); // random
    body.push(0); // no session id
    body.extend_from_slice(&[0x00, 0x02, 0xc0, 0x2b]); // TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
    body.extend_from_slice(&[0x01, 0x00]); // null compression
    body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    body.extend_from_slice(extensions);
    let mut handshake = vec![0x01, 0x00];
    handshake.extend_from_slice(&(body.len() as u16).to_be_bytes());
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

#[tokio::test]
async fn tls_1_0_and_1_1_are_refused_and_1_2_is_accepted() {
    let bundle_a = bundle();
    let directory = tempfile::tempdir().unwrap();
    write_bundle(&bundle_a, directory.path()).unwrap();
    let server = Server::start(directory.path()).await;
    // Control: the same hello offering TLS 1.2 gets a handshake record (type 22, ServerHello).
    let answer = first_record(server.address, &client_hello([0x03, 0x03])).await;
    assert_eq!((answer[0], answer[5]), (22, 2), "TLS 1.2 hello answered {answer:?}");
    for (name, version) in [("TLS 1.0", [0x03, 0x01]), ("TLS 1.1", [0x03, 0x02])] {
        let answer = first_record(server.address, &client_hello(version)).await;
        // Record type 21 (alert), level 2 (fatal), description 70 (protocol_version).
        assert_eq!((answer[0], answer[5], answer[6]), (21, 2, 70), "{name}: answered {answer:?}");
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(der(&bundle_a.ca_certificate))).unwrap();
    let tls12_only = rustls::ClientConfig::builder_with_protocol_versions(&[&rustls::version::TLS12])
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(server.address).await.unwrap();
    let stream = TlsConnector::from(Arc::new(tls12_only))
        .connect(ServerName::IpAddress(loopback().into()), tcp)
        .await
        .expect("TLS 1.2 is accepted");
    assert_eq!(stream.get_ref().1.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_2));
    drop(stream);
    server.stop().await;
}
