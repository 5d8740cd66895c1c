use dbservice_operator::certificates::{generate_bundle, write_bundle};
use dbservice_operator::metrics::Metrics;
use dbservice_operator::webhook::server::serve_tls;
use dbservice_operator::webhook::tls::{install_crypto_provider, ReloadingCertificate};
use dbservice_operator::webhook::{admission_router, AdmissionState};
use rustls::pki_types::{CertificateDer, ServerName};
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
#[tokio::test]
async fn show() {
    install_crypto_provider();
    let ip = "127.0.0.1".parse().unwrap();
    let b = generate_bundle(&["localhost".into()], &[ip]).unwrap();
    let d = tempfile::tempdir().unwrap();
    write_bundle(&b, d.path()).unwrap();
    let c = ReloadingCertificate::load(&d.path().join("tls.crt"), &d.path().join("tls.key")).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    let (_tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve_tls(l, admission_router(AdmissionState::new("1Gi", Arc::new(Metrics::new())).unwrap()), c, rx));
    for v in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(rustls_pemfile::certs(&mut b.ca_certificate.as_bytes()).next().unwrap().unwrap()))
            .unwrap();
        let cfg = Arc::new(
            rustls::ClientConfig::builder_with_protocol_versions(&[v])
                .with_root_certificates(roots)
                .with_no_client_auth(),
        );
        let mut times = vec![];
        for _ in 0..10 {
            let t = Instant::now();
            let tcp = TcpStream::connect(a).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let mut s = tokio_rustls::TlsConnector::from(cfg.clone())
                .connect(ServerName::IpAddress(ip.into()), tcp)
                .await
                .unwrap();
            s.write_all(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                .await
                .unwrap();
            let mut buf = vec![];
            let _ = s.read_to_end(&mut buf).await;
            times.push(t.elapsed().as_millis());
        }
        eprintln!("{v:?}: {times:?}");
    }
}
