//! HTTPS, with ring as the TLS crypto provider (the workspace manifest says why not aws-lc-rs):
//! a real handshake with the test kit's HTTP server behind a TLS front (the conformance suite
//! read through it), a certificate that verifies only when trusted through `ca_certificate`,
//! and clear errors when it is not.
//!
//! `tests/tls/` holds a private CA (`ca.pem`, its key thrown away) and a server certificate it
//! signed for `127.0.0.1` and `localhost` (`cert.pem`, `key.pem`), P-256, valid for a century:
//! `openssl req -x509` for the CA, then `openssl x509 -req -CA ca.pem` with
//! `subjectAltName=IP:127.0.0.1,DNS:localhost`, `basicConstraints=critical,CA:FALSE` and
//! `extendedKeyUsage=serverAuth`.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use common::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use stoker::{ErrorKind, Sample};
use stoker_testkit::http::{self, HttpConfig};
use tokio::net::{TcpListener, TcpStream};

const CERT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tls/cert.pem");
const KEY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tls/key.pem");
const CA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tls/ca.pem");

/// A TLS front on `ip` for `backend` with the test certificate: each connection's handshake,
/// then its bytes to and from the backend. Returns its address and the count of handshakes
/// completed.
async fn tls_front(ip: &str, backend: SocketAddr) -> (SocketAddr, Arc<AtomicU64>) {
    let cert = CertificateDer::from_pem_file(CERT).unwrap();
    let key = PrivateKeyDer::from_pem_file(KEY).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handshakes = Arc::new(AtomicU64::new(0));
    let counted = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let (acceptor, counted) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake: nothing to serve.
                let Ok(mut tls) = acceptor.accept(socket).await else { return };
                counted.fetch_add(1, Relaxed);
                let Ok(mut plain) = TcpStream::connect(backend).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (addr, handshakes)
}

/// The error that opening `uri`, or else reading its first sample, ends in.
async fn refusal(uri: &str) -> String {
    match stoker::open(uri, Default::default()).await {
        Err(e) => e.to_string(),
        Ok(src) => src.get(0).await.expect_err("the certificate was accepted").to_string(),
    }
}

fn files(root: &Path) {
    for i in 0..4 {
        std::fs::write(root.join(format!("f{i}.bin")), payload(i, 5000 + i * 700)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_reads_the_files_bytes_when_the_servers_ca_is_trusted_and_refuses_clearly_when_not() {
    let root = tempfile::tempdir().unwrap();
    files(root.path());
    let server = http::serve(HttpConfig::new(root.path())).await.unwrap();
    let (front, handshakes) = tls_front("127.0.0.1", server.server.addr()).await;
    let local = open(&format!("{}/f{{0..3}}.bin", root.path().display())).await;
    let mut want: Vec<Sample> = Vec::new();
    for i in 0..local.len() {
        want.push(local.get(i).await.unwrap());
    }

    // Trusted through the option, by the IP address the certificate names: every byte arrives.
    let uri = format!("https://127.0.0.1:{}/f{{0..3}}.bin?disk_cache=false&ca_certificate={CA}", front.port());
    let src = open(&uri).await;
    assert_eq!(src.len(), want.len());
    for (i, w) in want.iter().enumerate() {
        assert!(src.get(i).await.unwrap() == *w, "sample {i} over HTTPS is not the file's bytes");
    }
    assert!(handshakes.load(Relaxed) > 0, "the reads did not go through the TLS front");
    stoker::conformance::run_all(src, &want, "https://127.0.0.1", &[]).await;

    // The system's roots only: the handshake fails at the first attempt (another meets the same
    // certificate), and the error says it is the certificate and what to do. A front of its own
    // counts only this client's handshakes (the trusted source's connections may still be
    // finishing theirs on the first one).
    let (untrusted_front, untrusted_handshakes) = tls_front("127.0.0.1", server.server.addr()).await;
    let untrusted = format!("https://127.0.0.1:{}/f{{0..3}}.bin?disk_cache=false", untrusted_front.port());
    let text = refusal(&untrusted).await;
    assert!(text.contains("TLS: invalid peer certificate: UnknownIssuer"), "{text}");
    assert!(text.contains("1 attempt(s)") && text.contains("ca_certificate=PATH"), "{text}");
    assert_eq!(untrusted_handshakes.load(Relaxed), 0, "a handshake with an untrusted certificate completed");

    // An address the certificate does not name (127.0.0.2, loopback too on Linux) is refused
    // even with the CA trusted.
    let (elsewhere, elsewhere_handshakes) = tls_front("127.0.0.2", server.server.addr()).await;
    let other = format!("https://127.0.0.2:{}/f{{0..3}}.bin?disk_cache=false&ca_certificate={CA}", elsewhere.port());
    let text = refusal(&other).await;
    assert!(text.contains("TLS: invalid peer certificate: certificate not valid for name \"127.0.0.2\""), "{text}");
    assert_eq!(elsewhere_handshakes.load(Relaxed), 0, "a certificate for another name was accepted");
    server.server.shutdown().await;
}

#[tokio::test]
async fn a_ca_certificate_that_is_missing_or_not_pem_is_an_invalid_option_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("ca.pem");
    std::fs::write(&not_pem, b"these are not certificates").unwrap();
    let missing = dir.path().join("missing.pem");
    for path in [&not_pem, &missing] {
        let uri = format!("https://127.0.0.1:1/f.bin?ca_certificate={}", path.display());
        let Err(err) = stoker::open(&uri, Default::default()).await else {
            panic!("a bad ca_certificate was accepted")
        };
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        let text = err.to_string();
        assert!(text.contains("ca_certificate") && text.contains(&path.display().to_string()), "{text}");
    }
}
